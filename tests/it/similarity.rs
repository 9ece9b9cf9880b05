//! The similarities other than cosine: order embeddings (rank by Vendrov et al.'s S, on the order fixture the
//! trainer writes) and, on bundles derived from the fixture, euclidean with an affine projection (the
//! closed-form systems: `W · code + bias`, never normalised, every pair scored by `-‖a - b‖²`).

use crate::common;

use common::{TestApp, b64, fixture_image, variant_bundle, variant_bundle_affine};
use serde_json::json;

const ORDER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fixture-tiny-order");

/// The order fixture (models/fixture-tiny-order, written by `python -m jointspace_train fixture`:
/// fixture-tiny's network exported with `similarity: order` and `abs: true`): searches and annotations rank
/// by Vendrov et al.'s S through the graph's L2 candidates and the exact re-rank, and every score the server
/// returns is the trainer's (`order_scores` in the fixture's parity.json), for each sentence and image.
#[tokio::test]
async fn order_bundles_rank_by_the_trainers_s() {
    let parity = common::parity_of(ORDER);
    let want = &parity["order_scores"];
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_str().expect("string").to_string())
            .collect()
    };
    let (names, texts) = (strings(&want["images"]), strings(&want["texts"]));
    // S[image][sentence], as the trainer computed it.
    let s: Vec<Vec<f64>> = want["scores"]
        .as_array()
        .expect("scores")
        .iter()
        .map(|row| {
            row.as_array()
                .expect("row")
                .iter()
                .map(|x| x.as_f64().expect("S"))
                .collect()
        })
        .collect();
    assert_eq!((s.len(), s[0].len()), (names.len(), texts.len()));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let photo = |name: &str| {
        std::fs::read(
            root.join(parity["images_dir"].as_str().expect("dir"))
                .join(name),
        )
        .expect("fixture image")
    };

    let dir = tempfile::tempdir().expect("tempdir");
    // Through the graph (no exact scan below any size), as a large collection is searched.
    let app = TestApp::start_with(ORDER, &dir.path().join("js.db"), &["--exact-below", "0"]).await;
    app.create_collection("c").await;
    // The sentences are the first image's captions, so annotation can rank them.
    let images: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(k, n)| {
            let captions = if k == 0 { texts.clone() } else { vec![] };
            json!({"data": b64(&photo(n)), "external_id": n, "captions": captions})
        })
        .collect();
    let (st, r) = app
        .post_json("/v1/collections/c/images", json!({ "images": images }))
        .await;
    assert_eq!(st, 201, "{r}");

    let close = |got: f64, want: f64, what: &str| {
        assert!(
            (got - want).abs() <= 1e-4,
            "{what}: server S {got}, trainer S {want}"
        );
    };
    // Search: each sentence ranks all the images by S(sentence, image), as the trainer does.
    for (j, text) in texts.iter().enumerate() {
        let (st, r) = app
            .post_json(
                "/v1/collections/c/images/search",
                json!({"text": text, "k": names.len(), "mode": "vector"}),
            )
            .await;
        assert_eq!(st, 200, "{r}");
        let hits = r["results"].as_array().expect("results");
        assert_eq!(hits.len(), names.len());
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_by(|&a, &b| s[b][j].total_cmp(&s[a][j]));
        for (hit, &i) in hits.iter().zip(&order) {
            assert_eq!(
                hit["image"]["external_id"], names[i],
                "{text:?}: rank of {}",
                names[i]
            );
            close(hit["score"].as_f64().expect("score"), s[i][j], text);
            assert_eq!(
                hit["score"], hit["similarity"],
                "no offset under an order bundle"
            );
        }
    }
    // Annotation: each image ranks the sentences by S(sentence, image).
    for (i, name) in names.iter().enumerate() {
        let (st, r) = app
            .post_json(
                "/v1/collections/c/captions/search",
                json!({"image": b64(&photo(name)), "k": texts.len()}),
            )
            .await;
        assert_eq!(st, 200, "{r}");
        let hits = r["results"].as_array().expect("results");
        assert_eq!(hits.len(), texts.len());
        for w in hits.windows(2) {
            assert!(w[0]["score"].as_f64() >= w[1]["score"].as_f64());
        }
        for hit in hits {
            let text = hit["caption"]["text"].as_str().expect("text");
            let j = texts
                .iter()
                .position(|t| *t == text)
                .expect("a fixture sentence");
            close(hit["score"].as_f64().expect("score"), s[i][j], name);
        }
    }
    // |.| on both sides; an image query on images ranks by distance, so a stored photo finds itself first.
    let (_, e) = app
        .post_json("/v1/embed/image", json!({"image": b64(&photo(&names[2]))}))
        .await;
    let v = e["embedding"].as_array().expect("vec");
    assert!(
        v.iter().all(|x| x.as_f64().expect("num") >= 0.0),
        "|.| applied: {e}"
    );
    let (st, r) = app
        .post_json(
            "/v1/collections/c/images/search",
            json!({"image": b64(&photo(&names[2])), "k": 1}),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["results"][0]["image"]["external_id"], names[2]);
    app.stop().await;
}

/// Collection "c" with fixture images 0-7 (external ids i0-i7), each with the caption "a dog number i".
async fn seed_dogs(app: &TestApp) {
    app.create_collection("c").await;
    let images: Vec<_> = (0..8).map(|i| json!({"data": b64(&fixture_image(i)), "external_id": format!("i{i}"), "captions": [format!("a dog number {i}")]})).collect();
    assert_eq!(
        app.post_json("/v1/collections/c/images", json!({ "images": images }))
            .await
            .0,
        201
    );
}

/// The scores of a search response's hits, in order.
fn hit_scores(r: &serde_json::Value) -> Vec<f64> {
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|h| h["score"].as_f64().expect("score"))
        .collect()
}

fn fixture() -> jointspace_embed::bundle::Bundle {
    jointspace_embed::bundle::Bundle::load(std::path::Path::new(common::BUNDLE)).expect("fixture")
}

/// The fixture's W with a bias of `b[r] = 0.5 - r / joint` (far from zero, so a missed bias shows).
fn bias(joint: usize) -> Vec<f32> {
    (0..joint).map(|r| 0.5 - r as f32 / joint as f32).collect()
}

fn euclidean(m: &mut serde_json::Value) {
    m["similarity"] = "euclidean".into();
    m["projection"]["abs"] = false.into();
    m.as_object_mut().expect("manifest").remove("hubness");
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// The ternary values of a packed code (docs/bundle.md, "The packed ternary code").
fn unpack(code: &serde_json::Value) -> Vec<f32> {
    use base64::Engine;
    let dim = code["dim"].as_u64().expect("dim") as usize;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(code["packed"].as_str().expect("packed"))
        .expect("base64");
    let plane = dim.div_ceil(8);
    (0..dim)
        .map(|j| {
            let bit = |p: usize| bytes[p * plane + j / 8] >> (j % 8) & 1 == 1;
            f32::from(i8::from(bit(0)) - i8::from(bit(1)))
        })
        .collect()
}

fn neg_sqdist(a: &[f32], b: &[f32]) -> f32 {
    -a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f32>()
}

#[tokio::test]
async fn euclidean_bundles_add_the_bias_keep_the_length_and_rank_by_distance() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = fixture();
    let w = base.projection.clone();
    let (joint, dim) = (base.manifest.projection.joint_dim, base.manifest.code_dim());
    let b = bias(joint);
    let bundle = variant_bundle_affine(
        &dir.path().join("euclidean"),
        euclidean,
        Some((w.clone(), Some((b.clone(), vec![joint])))),
    );
    let app = TestApp::start_with(
        bundle.to_str().expect("path"),
        &dir.path().join("js.db"),
        &["--exact-below", "0"],
    )
    .await;
    let (s, info) = app.get_json("/v1/bundle").await;
    assert_eq!(s, 200, "{info}");
    assert_eq!(info["similarity"], "euclidean");

    // The image side: exactly W · code + bias, not normalised.
    let (s, e) = app
        .post_json("/v1/embed/image", json!({"image": b64(&fixture_image(2))}))
        .await;
    assert_eq!(s, 200, "{e}");
    let got = floats(&e["embedding"]);
    let mut want = jointspace_embed::projection::dense_matvec(&w, joint, dim, &unpack(&e["code"]));
    want.iter_mut().zip(&b).for_each(|(x, b)| *x += b);
    assert_eq!(got, want, "W · code + bias");
    let norm = got.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() > 1e-3, "not normalised, norm {norm}");

    // Scores are -‖q - x‖² on the served vectors, for every pair of modalities.
    seed_dogs(&app).await;
    let mut vectors = Vec::new();
    for i in 0..8 {
        let (_, e) = app
            .post_json("/v1/embed/image", json!({"image": b64(&fixture_image(i))}))
            .await;
        vectors.push(floats(&e["embedding"]));
    }
    let (_, t) = app
        .post_json("/v1/embed/text", json!({"texts": ["a dog"]}))
        .await;
    let text = floats(&t["embeddings"][0]);
    let (s, r) = app
        .post_json(
            "/v1/collections/c/images/search",
            json!({"text": "a dog", "k": 8, "mode": "vector"}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let hits = r["results"].as_array().expect("results");
    assert_eq!(hits.len(), 8);
    let mut want: Vec<(f32, String)> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| (neg_sqdist(&text, v), format!("i{i}")))
        .collect();
    want.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (h, (score, id)) in hits.iter().zip(&want) {
        let got = h["score"].as_f64().expect("score") as f32;
        assert!(
            (got - score).abs() <= 1e-4 * score.abs().max(1.0),
            "{h} against {score}"
        );
        assert_eq!(h["image"]["external_id"], id.as_str(), "ranked by distance");
    }
    let (s, r) = app
        .post_json(
            "/v1/collections/c/images/search",
            json!({"image": b64(&fixture_image(5)), "k": 1}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"][0]["image"]["external_id"], "i5");
    assert_eq!(
        r["results"][0]["score"].as_f64(),
        Some(0.0),
        "distance to itself"
    );
    let (s, r) = app
        .post_json(
            "/v1/collections/c/captions/search",
            json!({"image": b64(&fixture_image(3)), "k": 8}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let scores = hit_scores(&r);
    assert_eq!(scores.len(), 8);
    assert!(scores.iter().all(|s| *s <= 0.0) && scores.windows(2).all(|w| w[0] >= w[1]));
    app.stop().await;
}

#[test]
fn a_bad_bias_or_an_abs_euclidean_bundle_does_not_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = fixture();
    let w = base.projection.clone();
    let joint_dim = base.manifest.projection.joint_dim;
    let short = variant_bundle_affine(
        &dir.path().join("short"),
        euclidean,
        Some((w.clone(), Some((bias(joint_dim - 1), vec![joint_dim - 1])))),
    );
    let e = jointspace_embed::bundle::Bundle::load(&short)
        .expect_err("short bias")
        .to_string();
    assert!(
        e.contains("\"bias\"") && e.contains(&format!("[{joint_dim}]")),
        "{e}"
    );
    let mut nan = bias(joint_dim);
    nan[3] = f32::NAN;
    let nan = variant_bundle_affine(
        &dir.path().join("nan"),
        euclidean,
        Some((w.clone(), Some((nan, vec![joint_dim])))),
    );
    let e = jointspace_embed::bundle::Bundle::load(&nan)
        .expect_err("nan bias")
        .to_string();
    assert!(e.contains("non-finite"), "{e}");
    let abs = variant_bundle(
        &dir.path().join("abs"),
        |m| {
            euclidean(m);
            m["projection"]["abs"] = true.into();
        },
        None,
    );
    let e = jointspace_embed::bundle::Bundle::load(&abs)
        .expect_err("abs")
        .to_string();
    assert!(
        e.contains("projection.abs") && e.contains("euclidean"),
        "{e}"
    );
    let hub = variant_bundle(
        &dir.path().join("hub"),
        |m| m["similarity"] = "euclidean".into(),
        None,
    );
    let e = jointspace_embed::bundle::Bundle::load(&hub)
        .expect_err("hubness")
        .to_string();
    assert!(e.contains("hubness") && e.contains("euclidean"), "{e}");
}
