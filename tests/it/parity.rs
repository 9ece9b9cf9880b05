//! The server's image and text paths against the trainer's reference outputs (models/fixture-tiny/parity.json):
//! identical ternary codes, joint vectors and hubness offsets within 1e-5. Real ONNX Runtime on the fixture bundle.

use crate::common;

use base64::Engine;
use jointspace::{app::load_pipeline, config::ServeArgs, pipeline::ImageUse};
use serde_json::Value;

fn parity() -> Value {
    serde_json::from_slice(
        &std::fs::read(format!("{}/parity.json", common::BUNDLE)).expect("parity.json"),
    )
    .expect("json")
}

fn pipeline(crop_mode: &str) -> std::sync::Arc<jointspace::pipeline::Pipeline> {
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

#[tokio::test]
async fn image_codes_and_vectors_match_the_trainer() {
    let p = parity();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(p["images_dir"].as_str().expect("images_dir"));
    let (ten, center) = (pipeline("ten"), pipeline("center"));
    let mut checked = 0;
    for case in p["images"].as_array().expect("images") {
        let name = case["image"].as_str().expect("image");
        let bytes = std::fs::read(dir.join(name)).expect("fixture image");
        let pl = match case["crop_mode"].as_str() {
            Some("ten") => &ten,
            Some("center") => &center,
            other => panic!("unknown crop mode {other:?}"),
        };
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
        // The hubness offset (the fixture has a bank); a bundle without one would give 0 and fail this.
        let want = case["offset"].as_f64().expect("offset") as f32;
        assert!(
            (e.offset - want).abs() <= 1e-5 && want != 0.0,
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
        checked += 1;
    }
    assert!(checked >= 8, "parity.json should cover the fixture images");
}

#[tokio::test]
async fn text_ids_and_vectors_match_the_trainer() {
    let p = parity();
    let pl = pipeline("center");
    let cases = p["texts"].as_array().expect("texts");
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
    // And one at a time.
    for case in cases {
        let v = pl
            .embed_text(case["text"].as_str().expect("text"))
            .await
            .expect("embeds");
        assert!(max_diff(&v, case["vector"].as_array().expect("vector")) <= 1e-5);
    }
}
