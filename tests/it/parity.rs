//! The server's image and text paths against the trainer's reference outputs (models/fixture-tiny/parity.json):
//! identical ternary codes, joint vectors and hubness offsets within 1e-5. Real ONNX Runtime on the fixture bundle.

use crate::common;

use base64::Engine;
use std::sync::Arc;

use jointspace::app::load_pipeline;
use jointspace::config::ServeArgs;
use jointspace_embed::decode;
use jointspace_embed::pipeline::{ImageUse, Pipeline};
use jointspace_embed::prepare;
use serde_json::Value;
use sha2::Digest;

fn parity() -> Value {
    common::parity_of(common::BUNDLE)
}

fn pipeline(crop_mode: &str) -> std::sync::Arc<jointspace_embed::pipeline::Pipeline> {
    let cfg = ServeArgs::try_from_flags(["--bundle", common::BUNDLE, "--crop-mode", crop_mode])
        .expect("flags");
    load_pipeline(&cfg.model).expect("fixture bundle loads")
}

fn max_diff(a: &[f32], b: &[Value]) -> f32 {
    assert_eq!(a.len(), b.len(), "vector length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y.as_f64().expect("number") as f32).abs())
        .fold(0.0, f32::max)
}

/// Checks one parity case: the photo's prepared pixels, its code, vector and offset against the trainer's.
/// Returns whether the photo was squashed (it was not of the prepared size).
async fn check_case(
    pipelines: &[(&str, &Arc<Pipeline>)],
    name: &str,
    bytes: Vec<u8>,
    case: &Value,
) -> bool {
    let pl = pipelines
        .iter()
        .find(|(mode, _)| case["crop_mode"].as_str() == Some(*mode))
        .map(|(_, p)| *p)
        .unwrap_or_else(|| panic!("unknown crop mode {}", case["crop_mode"]));
    // The preparation (a squash to 224x224, PIL's 8-bit bilinear) gives the trainer's bytes exactly.
    let prep = &case["prepared"];
    let spec = pl.bundle.manifest.vision.prepare;
    assert!(spec.is_some(), "the fixture records a preparation");
    let decoded = decode::decode(&bytes, &decode::DecodeLimits::default()).expect("decodes");
    let (w, h) = decoded.dimensions();
    let prepared = prepare::apply(spec.as_ref(), decoded);
    assert_eq!(
        (
            u64::from(prepared.width()),
            u64::from(prepared.height()),
            hex::encode(sha2::Sha256::digest(prepared.as_raw()))
        ),
        (
            prep[0].as_u64().expect("width"),
            prep[1].as_u64().expect("height"),
            prep[2].as_str().expect("sha256").to_string()
        ),
        "{name} ({w}x{h}): prepared pixels differ from PIL's"
    );
    let bytes = bytes::Bytes::from(bytes);
    let e = pl
        .embed_image(bytes.clone(), ImageUse::Store)
        .await
        .expect("embeds");
    let want = base64::engine::general_purpose::STANDARD
        .decode(case["code"].as_str().expect("code"))
        .expect("base64");
    assert_eq!(
        e.code.packed(),
        &want[..],
        "{name} ({}): ternary code differs from the trainer's",
        case["crop_mode"]
    );
    let (plus, minus) = e.code.counts();
    assert_eq!(
        (plus + minus) as u64,
        case["nonzero"].as_u64().expect("nonzero"),
        "{name}: nonzero count"
    );
    let d = max_diff(&e.vector, case["vector"].as_array().expect("vector"));
    assert!(
        d <= 1e-5,
        "{name} ({}): joint vector differs by {d}",
        case["crop_mode"]
    );
    // The hubness offset: never 0 under a bank (the fixtures with one), always 0 without.
    let want = case["offset"].as_f64().expect("offset") as f32;
    assert!(
        (e.offset - want).abs() <= 1e-5 && (want != 0.0) == pl.bundle.hubness.is_some(),
        "{name} ({}): offset {} against the trainer's {want}",
        case["crop_mode"],
        e.offset
    );
    // A query image needs no offset and skips the bank; its code and vector are the stored image's.
    let q = pl
        .embed_image(bytes, ImageUse::Query)
        .await
        .expect("embeds");
    assert_eq!(
        (q.offset, &q.vector, q.code.packed()),
        (0.0, &e.vector, e.code.packed())
    );
    (w, h) != (224, 224)
}

#[tokio::test]
async fn image_codes_and_vectors_match_the_trainer() {
    let p = parity();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(p["images_dir"].as_str().expect("images_dir"));
    let (ten, center) = (pipeline("ten"), pipeline("center"));
    let modes = [("ten", &ten), ("center", &center)];
    let (mut checked, mut squashed) = (0, 0);
    for case in p["images"].as_array().expect("images") {
        let name = case["image"].as_str().expect("image");
        let bytes = std::fs::read(dir.join(name)).expect("fixture image");
        squashed += usize::from(check_case(&modes, name, bytes, case).await);
        checked += 1;
    }
    assert!(checked >= 8, "parity.json should cover the fixture images");
    // Photos larger and smaller than 224x224 (fixtures 1-5 and 7), in both crop modes, were squashed.
    assert_eq!(
        squashed, 12,
        "the cases of photos of another size than the prepared one"
    );
}

/// Real camera-size photos (scikit-image's samples, 451x300 to 640x427, a JPEG among them) go through the
/// preparation and the whole image path exactly as the trainer's reference takes them.
#[tokio::test]
async fn real_photos_larger_than_224_are_squashed_as_the_trainer_squashes_them() {
    let p = parity();
    let photos = &p["photos"];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(photos["dir"].as_str().expect("photos dir"));
    let ten = pipeline("ten");
    let cases = photos["cases"].as_array().expect("photo cases");
    assert!(cases.len() >= 4, "parity.json should cover the real photos");
    for case in cases {
        let name = case["image"].as_str().expect("image");
        let bytes = std::fs::read(dir.join(name)).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; scripts/test.sh fetches the photos ({}) with \
                 `python -m jointspace_train photos`",
                dir.join(name).display(),
                photos["source"]
            )
        });
        assert!(
            check_case(&[("ten", &ten)], name, bytes, case).await,
            "{name} is larger than 224x224, so it must have been squashed"
        );
    }
}

#[tokio::test]
async fn text_ids_and_vectors_match_the_trainer() {
    check_texts(&parity(), &pipeline("center")).await;
}

/// Each parity sentence's token ids and vector, in one padded batch and one at a time.
async fn check_texts(p: &Value, pl: &Pipeline) {
    let cases = p["texts"].as_array().expect("texts");
    assert!(!cases.is_empty(), "parity.json should cover sentences");
    let texts: Vec<String> = cases
        .iter()
        .map(|c| c["text"].as_str().expect("text").to_string())
        .collect();
    let ids = pl.tokenize(&texts).expect("tokenizes");
    // One batch for all of them: padding must not change any sentence's vector.
    let vecs = pl.embed_texts(&texts).await.expect("embeds");
    for ((case, ids), v) in cases.iter().zip(ids).zip(vecs) {
        let want: Vec<i64> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_i64().expect("id"))
            .collect();
        assert_eq!(ids, want, "token ids of {:?}", case["text"]);
        let d = max_diff(&v, case["vector"].as_array().expect("vector"));
        assert!(d <= 1e-5, "text {:?}: vector differs by {d}", case["text"]);
    }
    // A stored sentence's offset against the annotation bank: never 0 under one, always 0 without (a parity
    // file written before the annotation side has none: 0).
    let (_, offsets) = pl
        .caption_offsets(pl.embed_texts(&texts).await.expect("embeds"))
        .await
        .expect("offsets");
    for (case, got) in cases.iter().zip(offsets) {
        let want = case["offset"].as_f64().unwrap_or(0.0) as f32;
        assert!(
            (got - want).abs() <= 1e-5 && (want != 0.0) == pl.bundle.annotation_hubness.is_some(),
            "text {:?}: offset {got} against the trainer's {want}",
            case["text"]
        );
    }
    // And one at a time.
    for case in cases {
        let v = pl
            .embed_text(case["text"].as_str().expect("text"))
            .await
            .expect("embeds");
        assert!(max_diff(&v, case["vector"].as_array().expect("vector")) <= 1e-5);
    }
}

/// The order-embedding fixture (models/fixture-tiny-order: fixture-tiny's network with `similarity: order`,
/// `abs: true`, the centre crop, no bank): codes, |unit| vectors and sentence vectors are the trainer's, for
/// the fixture images and the real photos. (Its scores: similarity.rs.)
#[tokio::test]
async fn an_order_bundle_embeds_as_the_trainer_does() {
    let bundle = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fixture-tiny-order");
    let p = common::parity_of(bundle);
    let cfg = ServeArgs::try_from_flags(["--bundle", bundle]).expect("flags");
    let pl = load_pipeline(&cfg.model).expect("the order fixture loads");
    assert_eq!(pl.similarity(), jointspace_embed::bundle::Similarity::Order);
    for case in check_every_case(&p, "center", &pl).await {
        let v = case["vector"].as_array().expect("vector");
        assert!(
            v.iter().all(|x| x.as_f64() >= Some(0.0)),
            "{}: |.| in the trainer's vector",
            case["image"]
        );
    }
    check_texts(&p, &pl).await;
}

/// Every image case of a parity file (8 fixture images, 4 real photos), all in the crop mode `mode` names,
/// through `pl`; returns the cases.
async fn check_every_case(p: &Value, mode: &str, pl: &Arc<Pipeline>) -> Vec<Value> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = vec![];
    for (dir, cases) in [
        (&p["images_dir"], &p["images"]),
        (&p["photos"]["dir"], &p["photos"]["cases"]),
    ] {
        let dir = root.join(dir.as_str().expect("dir"));
        for case in cases.as_array().expect("cases") {
            let name = case["image"].as_str().expect("image");
            let bytes = std::fs::read(dir.join(name)).expect("image file");
            check_case(&[(mode, pl)], name, bytes, case).await;
            checked.push(case.clone());
        }
    }
    assert_eq!(checked.len(), 12, "8 fixture images and 4 photos");
    checked
}

/// The `windowed` crop mode (the ten crops read off two whole-image passes) on the fixture's weights
/// (models/fixture-tiny-windowed, written by `python -m jointspace_train fixture`): the same codes, vectors
/// and offsets as the trainer's reference, for the fixture images and the real photos; and a crop mode that
/// needs the other kind of graph is refused at start.
#[tokio::test]
async fn the_windowed_crop_mode_matches_the_trainer() {
    let bundle = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fixture-tiny-windowed");
    check_windowed_fixture(bundle).await;

    for (bundle, mode) in [(bundle, "ten"), (common::BUNDLE, "windowed")] {
        let cfg =
            ServeArgs::try_from_flags(["--bundle", bundle, "--crop-mode", mode]).expect("flags");
        let e = load_pipeline(&cfg.model)
            .err()
            .unwrap_or_else(|| panic!("--crop-mode {mode} on {bundle} must be refused"));
        assert!(format!("{e:#}").contains("windowed needs its own"), "{e:#}");
    }
}

/// An EfficientNet-Lite-shaped graph (models/fixture-tiny-effnet: depthwise convolutions, ReLU6, TensorFlow's
/// after-padding at stride 2, RGB scaled to [-1, 1]) under the windowed crop mode at strides up to 32: the
/// server needs nothing backbone-specific, and its codes, vectors and offsets are the trainer's.
#[tokio::test]
async fn an_efficientnet_graph_matches_the_trainer() {
    check_windowed_fixture(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/models/fixture-tiny-effnet"
    ))
    .await;
}

/// The same graph with a labels section (models/fixture-tiny-labels: five random classes read off the head's
/// codes, their name vectors fused in under a gate that lowers the weight of the images near its captions):
/// the server's vectors and offsets are the trainer's, for the images the gate leaves whole and those it lowers.
#[tokio::test]
async fn labels_fused_into_image_vectors_match_the_trainer() {
    check_windowed_fixture(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/models/fixture-tiny-labels"
    ))
    .await;
}

/// Every parity case of a windowed fixture bundle (8 fixture images, 4 real photos) through the server's path.
async fn check_windowed_fixture(bundle: &str) {
    let p = common::parity_of(bundle);
    let cfg = ServeArgs::try_from_flags(["--bundle", bundle]).expect("flags");
    let pl = load_pipeline(&cfg.model).expect("the fixture loads");
    assert_eq!(pl.crop_mode, jointspace_embed::bundle::CropMode::Windowed);
    check_every_case(&p, "windowed", &pl).await;
}

/// Two backbones (models/fixture-tiny-two: fixture-tiny's VGG16-shaped graph under ten crops of 224, BGR, then
/// fixture-tiny-effnet's EfficientNet-Lite-shaped one under the windowed mode at 128, RGB, each with its own
/// statistics, one W over both codes): the photo decoded once, each backbone's crops through its own graph,
/// and the concatenated code, its vector and its offsets are the trainer's, key for key; the sentences too.
/// `--crop-mode` is refused unless every backbone has that mode.
#[tokio::test]
async fn a_two_backbone_bundle_matches_the_trainer() {
    use jointspace_embed::bundle::CropMode;
    let bundle = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fixture-tiny-two");
    let p = common::parity_of(bundle);
    let cfg = ServeArgs::try_from_flags(["--bundle", bundle]).expect("flags");
    let pl = load_pipeline(&cfg.model).expect("the two-backbone fixture loads");
    assert_eq!(pl.crop_modes(), [CropMode::Ten, CropMode::Windowed]);
    let m = &pl.bundle.manifest;
    assert_eq!((m.extra_backbones.len(), m.code_dim()), (1, 144 + 248));
    let cases = check_every_case(&p, "ten+windowed", &pl).await;
    // Both backbones' parts of the code carry set features (the second is not left empty).
    for case in &cases {
        let code = base64::engine::general_purpose::STANDARD
            .decode(case["code"].as_str().expect("code"))
            .expect("base64");
        let packed = jointspace_embed::fne::TernaryCode::from_packed(392, code).expect("code");
        let values = packed.values();
        assert!(
            values[..144].iter().any(|&x| x != 0) && values[144..].iter().any(|&x| x != 0),
            "{}: both backbones' features",
            case["image"]
        );
    }
    check_texts(&p, &pl).await;

    for mode in ["ten", "windowed", "center"] {
        let cfg =
            ServeArgs::try_from_flags(["--bundle", bundle, "--crop-mode", mode]).expect("flags");
        let e = load_pipeline(&cfg.model)
            .err()
            .unwrap_or_else(|| panic!("--crop-mode {mode} on two backbones must be refused"));
        assert!(
            format!("{e:#}").contains("each in its own crop mode (ten, windowed)"),
            "{e:#}"
        );
    }
}
