//! Reindex without the CNN: a bundle upgrade that keeps the vision part recomputes image vectors from the
//! stored ternary codes and the new W; one that changes the vision part is refused with a clear message.

use crate::common;

use common::{TestApp, b64, fixture_image, fixture_w, variant_bundle};
use serde_json::json;

#[tokio::test]
async fn new_w_is_applied_to_stored_codes_and_a_new_vision_part_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("js.db");
    let app = TestApp::start(&db, &[]).await;
    assert_eq!(
        app.post_json("/v1/collections", json!({"name": "c"}))
            .await
            .0,
        201
    );
    let images: Vec<_> = (0..6).map(|i| json!({"data": b64(&fixture_image(i)), "external_id": format!("i{i}"), "captions": [format!("caption {i}")]})).collect();
    let (s, body) = app
        .post_json("/v1/collections/c/images", json!({ "images": images }))
        .await;
    assert_eq!(s, 201, "{body}");
    app.stop().await;

    // Upgrade: same vision part, a different W (rows permuted and one negated).
    let w = fixture_w();
    let (j, d) = (16, w.len() / 16);
    let mut w2 = vec![0f32; w.len()];
    for r in 0..j {
        let src = (r + 5) % j;
        for c in 0..d {
            w2[r * d + c] = if r == 0 {
                -w[src * d + c]
            } else {
                w[src * d + c]
            };
        }
    }
    let upgraded = variant_bundle(
        &dir.path().join("upgraded"),
        |m| m["name"] = "fixture-tiny-v2".into(),
        Some(w2),
    );
    let app = TestApp::start_with(upgraded.to_str().expect("path"), &db, &[]).await;
    let (s, r) = app.post_json("/v1/admin/reindex", json!({})).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (r["images"].as_i64(), r["captions"].as_i64()),
        (Some(6), Some(6))
    );
    // Every stored vector now equals what the new bundle computes from the pixels (through the CNN).
    for i in [1usize, 4] {
        let (_, e) = app
            .post_json("/v1/embed/image", json!({"image": b64(&fixture_image(i))}))
            .await;
        let (s, hits) = app
            .post_json(
                "/v1/collections/c/images/search",
                json!({"image": b64(&fixture_image(i)), "k": 1}),
            )
            .await;
        assert_eq!(s, 200, "{hits}");
        assert_eq!(hits["results"][0]["image"]["external_id"], format!("i{i}"));
        assert!(
            hits["results"][0]["score"].as_f64().expect("score") > 0.9999,
            "{hits} vs {e}"
        );
        let bid = hits["results"][0]["image"]["bundle_id"]
            .as_str()
            .expect("bundle id");
        assert!(bid.starts_with("fixture-tiny-v2@"), "{bid}");
    }
    app.stop().await;

    // Another vision part (other thresholds): the codes cannot be reused.
    let other = variant_bundle(
        &dir.path().join("other"),
        |m| m["fne"]["thresholds"] = json!([-0.3, 0.2]),
        None,
    );
    let app = TestApp::start_with(other.to_str().expect("path"), &db, &[]).await;
    let (s, r) = app.post_json("/v1/admin/reindex", json!({})).await;
    assert_eq!(s, 422, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .expect("message")
            .contains("re-ingest"),
        "{r}"
    );
    app.assert_alive().await;
    app.stop().await;
}

#[tokio::test]
async fn a_bundle_with_a_bad_checksum_or_shape_does_not_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = variant_bundle(
        &dir.path().join("sum"),
        |m| m["files"]["text.onnx"] = "00".repeat(32).into(),
        None,
    );
    let e = jointspace::bundle::Bundle::load(&bad).expect_err("bad checksum");
    assert!(
        e.to_string().contains("text.onnx") && e.to_string().contains("sha256"),
        "{e}"
    );
    let bad = variant_bundle(
        &dir.path().join("shape"),
        |m| m["projection"]["joint_dim"] = 32.into(),
        None,
    );
    let e = jointspace::bundle::Bundle::load(&bad).expect_err("bad shape");
    assert!(
        e.to_string().contains("projection.safetensors") && e.to_string().contains("shape"),
        "{e}"
    );
    let bad = variant_bundle(&dir.path().join("missing"), |_| {}, None);
    std::fs::remove_file(bad.join("vision.onnx")).expect("rm");
    let e = jointspace::bundle::Bundle::load(&bad).expect_err("missing file");
    assert!(e.to_string().contains("vision.onnx is missing"), "{e}");
    // There but unreadable is not "missing". A 0600 file of another user is what the server in a container
    // meets; the tests may run as root, who reads anything, so a symlink to itself stands in (it fails to
    // open for root too).
    let bad = variant_bundle(&dir.path().join("unreadable"), |_| {}, None);
    std::fs::remove_file(bad.join("fne.safetensors")).expect("rm");
    std::os::unix::fs::symlink("fne.safetensors", bad.join("fne.safetensors")).expect("symlink");
    let e = jointspace::bundle::Bundle::load(&bad).expect_err("unreadable file");
    assert!(
        e.to_string().contains("cannot read fne.safetensors")
            && e.to_string().contains("permissions"),
        "{e}"
    );
    let bad = variant_bundle(
        &dir.path().join("hubness"),
        |m| {
            m["hubness"] = serde_json::json!({"bank": "hubness.safetensors", "captions": 6, "k": 7, "alpha": 0.5})
        },
        None,
    );
    let e = jointspace::bundle::Bundle::load(&bad).expect_err("hubness");
    assert!(
        e.to_string()
            .contains("hubness.k 7 must be in 1..=hubness.captions (6)"),
        "{e}"
    );
    let bad = variant_bundle(&dir.path().join("format"), |m| m["format"] = 2.into(), None);
    assert!(
        jointspace::bundle::Bundle::load(&bad)
            .expect_err("format")
            .to_string()
            .contains("format 2")
    );
}
