//! Reindex without the CNN: a bundle upgrade that keeps the vision part recomputes image vectors from the
//! stored ternary codes and the new W; one that changes the vision part is refused with a clear message.
//! A reindex killed part-way (kill -9 of `jointspace reindex`) leaves the old vectors everywhere, on SQLite
//! and on Postgres, and the next run resumes from what was staged.

use crate::common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{
    BUNDLE, TestApp, b64, fixture_image, fixture_w,
    pg::{DATABASE_INDEX, PgCluster},
    variant_bundle, variant_of, w_of,
};
use serde_json::json;

/// An upgrade that keeps the vision part: the fixture with another W (rows permuted, one negated).
fn upgraded_bundle(dir: &Path) -> PathBuf {
    variant_bundle(
        &dir.join("upgraded"),
        |m| m["name"] = "fixture-tiny-v2".into(),
        Some(permuted(&fixture_w())),
    )
}

/// W `[16, d]` with its rows permuted and one negated: the same codes project elsewhere.
fn permuted(w: &[f32]) -> Vec<f32> {
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
    w2
}

/// A bundle with two backbones (models/fixture-tiny-two) stores the concatenated code as any code: `/v1/bundle`
/// lists both backbones, a new W is applied to the stored codes by `reindex`, and an export imports into a fresh
/// database with no photo embedded again.
#[tokio::test]
async fn two_backbones_store_reindex_export_and_import_their_whole_code() {
    let two = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fixture-tiny-two");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("js.db");
    let app = TestApp::start_with(two, &db, &[]).await;
    let (s, info) = app.get_json("/v1/bundle").await;
    assert_eq!(s, 200, "{info}");
    assert_eq!(
        (&info["fne_dim"], &info["crop_mode"], &info["backbones"]),
        (
            &json!(392),
            &json!("ten"),
            &json!([
                {"backbone": "vgg16", "crop_mode": "ten", "fne_dim": 144},
                {"backbone": "efficientnet-lite (tiny fixture)", "crop_mode": "windowed", "fne_dim": 248}
            ])
        )
    );
    app.create_collection("c").await;
    let images: Vec<_> = (0..4)
        .map(|i| json!({"data": b64(&fixture_image(i)), "external_id": format!("i{i}")}))
        .collect();
    let (s, body) = app
        .post_json("/v1/collections/c/images", json!({ "images": images }))
        .await;
    assert_eq!(s, 201, "{body}");
    // Each backbone's worker has its own instruments.
    let metrics = app.metrics().await;
    for model in ["vision", "vision-1"] {
        assert!(
            metrics.contains(&format!(
                "jointspace_inference_batch_rows_count{{model=\"{model}\"}} "
            )),
            "{model}: {metrics}"
        );
    }
    app.stop().await;

    let upgraded = variant_of(
        two,
        &dir.path().join("two-v2"),
        |m| m["name"] = "fixture-tiny-two-v2".into(),
        Some((permuted(&w_of(two)), None)),
    );
    let upgraded = upgraded.to_str().expect("path");
    let app = TestApp::start_with(upgraded, &db, &[]).await;
    let (s, r) = app.post_json("/v1/admin/reindex", json!({})).await;
    assert_eq!((s, r["images"].as_i64()), (200, Some(4)), "{r}");
    // Each stored vector is what the new bundle computes from the pixels, through both backbones.
    for i in [1usize, 3] {
        let top = found_again(&app, i).await;
        assert_eq!(top["image"]["external_id"], format!("i{i}"));
        let bid = top["image"]["bundle_id"].as_str().expect("bundle id");
        assert!(bid.starts_with("fixture-tiny-two-v2@"), "{bid}");
    }
    app.stop().await;

    let file = dir.path().join("c.jsonl");
    let cli = |db: &Path| {
        let mut c = common::jointspace(&format!("sqlite://{}", db.display()));
        c.env("JOINTSPACE_BUNDLE", upgraded);
        c
    };
    let (ok, out) = common::outcome(
        &cli(&db)
            .args(["export", "c", "--out"])
            .arg(&file)
            .output()
            .expect("export"),
    );
    assert!(ok, "{out}");
    let (ok, out) = common::outcome(
        &cli(&dir.path().join("fresh.db"))
            .arg("import")
            .arg(&file)
            .output()
            .expect("import"),
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("imported 4 images") && out.contains("(0 photos embedded by the CNN"),
        "{out}"
    );
}

#[tokio::test]
async fn new_w_is_applied_to_stored_codes_and_a_new_vision_part_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("js.db");
    let app = TestApp::start(&db, &[]).await;
    app.create_collection("c").await;
    let images: Vec<_> = (0..6).map(|i| json!({"data": b64(&fixture_image(i)), "external_id": format!("i{i}"), "captions": [format!("caption {i}")]})).collect();
    let (s, body) = app
        .post_json("/v1/collections/c/images", json!({ "images": images }))
        .await;
    assert_eq!(s, 201, "{body}");
    app.stop().await;

    let upgraded = upgraded_bundle(dir.path());
    let app = TestApp::start_with(upgraded.to_str().expect("path"), &db, &[]).await;
    let (s, r) = app.post_json("/v1/admin/reindex", json!({})).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (r["images"].as_i64(), r["captions"].as_i64()),
        (Some(6), Some(6))
    );
    // Every stored vector now equals what the new bundle computes from the pixels (through the CNN).
    for i in [1usize, 4] {
        let top = found_again(&app, i).await;
        assert_eq!(top["image"]["external_id"], format!("i{i}"));
        let bid = top["image"]["bundle_id"].as_str().expect("bundle id");
        assert!(bid.starts_with("fixture-tiny-v2@"), "{bid}");
    }
    // The captions were re-embedded with their offsets against the new bundle's image bank: a photo query on
    // captions still adds a (negative) offset to every one of them.
    let (s, hits) = app
        .post_json(
            "/v1/collections/c/captions/search",
            json!({"image": b64(&fixture_image(2)), "k": 6}),
        )
        .await;
    assert_eq!(s, 200, "{hits}");
    let hits = hits["results"].as_array().expect("results");
    assert_eq!(hits.len(), 6);
    for h in hits {
        let offset =
            h["score"].as_f64().expect("score") - h["similarity"].as_f64().expect("similarity");
        assert!(offset < -1e-4, "caption offset lost by the reindex: {h}");
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
    let e = jointspace_embed::bundle::Bundle::load(&bad).expect_err("bad checksum");
    assert!(
        e.to_string().contains("text.onnx") && e.to_string().contains("sha256"),
        "{e}"
    );
    let bad = variant_bundle(
        &dir.path().join("shape"),
        |m| m["projection"]["joint_dim"] = 32.into(),
        None,
    );
    let e = jointspace_embed::bundle::Bundle::load(&bad).expect_err("bad shape");
    assert!(
        e.to_string().contains("projection.safetensors") && e.to_string().contains("shape"),
        "{e}"
    );
    let bad = variant_bundle(&dir.path().join("missing"), |_| {}, None);
    std::fs::remove_file(bad.join("vision.onnx")).expect("rm");
    let e = jointspace_embed::bundle::Bundle::load(&bad).expect_err("missing file");
    assert!(e.to_string().contains("vision.onnx is missing"), "{e}");
    // There but unreadable is not "missing". A 0600 file of another user is what the server in a container
    // meets; the tests may run as root, who reads anything, so a symlink to itself stands in (it fails to
    // open for root too).
    let bad = variant_bundle(&dir.path().join("unreadable"), |_| {}, None);
    std::fs::remove_file(bad.join("fne.safetensors")).expect("rm");
    std::os::unix::fs::symlink("fne.safetensors", bad.join("fne.safetensors")).expect("symlink");
    let e = jointspace_embed::bundle::Bundle::load(&bad).expect_err("unreadable file");
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
    let e = jointspace_embed::bundle::Bundle::load(&bad).expect_err("hubness");
    assert!(
        e.to_string()
            .contains("hubness.k 7 must be in 1..=hubness.captions (6)"),
        "{e}"
    );
    // The annotation bank is checked as strictly: its k, and its shape against the manifest.
    let bad = variant_bundle(
        &dir.path().join("annotation-k"),
        |m| m["hubness"]["annotation"]["k"] = 9.into(),
        None,
    );
    let e = jointspace_embed::bundle::Bundle::load(&bad).expect_err("annotation k");
    assert!(
        e.to_string()
            .contains("hubness.annotation.k 9 must be in 1..=hubness.annotation.images (8)"),
        "{e}"
    );
    let bad = variant_bundle(
        &dir.path().join("annotation-rows"),
        |m| m["hubness"]["annotation"]["images"] = 7.into(),
        None,
    );
    let e = jointspace_embed::bundle::Bundle::load(&bad).expect_err("annotation rows");
    assert!(e.to_string().contains("hubness-images.safetensors"), "{e}");
    let bad = variant_bundle(&dir.path().join("format"), |m| m["format"] = 2.into(), None);
    assert!(
        jointspace_embed::bundle::Bundle::load(&bad)
            .expect_err("format")
            .to_string()
            .contains("format 2")
    );
}

/// The distinct bundle ids of the stored vectors (images and captions), and the rows staged.
async fn stored_bundles(pool: &sqlx::AnyPool) -> (Vec<String>, i64) {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT bundle_id FROM images UNION SELECT bundle_id FROM captions ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("bundle ids");
    let staged: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM reindex_staging")
        .fetch_one(pool)
        .await
        .expect("staged");
    (ids, staged)
}

fn reindex_cmd(bundle: &Path, url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_jointspace"));
    c.args(["reindex", "--bundle", bundle.to_str().expect("path")])
        .args(["--database-url", url])
        .env("RUST_LOG", "warn");
    c
}

async fn killed_reindex_leaves_one_bundle_and_resumes(url: &str, dir: &Path, flags: &[&str]) {
    const N: usize = 120;
    let app = TestApp::start_url(BUNDLE, url, flags).await;
    app.create_collection("c").await;
    for batch in 0..N / 40 {
        let images: Vec<_> = (0..40)
            .map(|j| {
                let i = batch * 40 + j;
                json!({"data": b64(&fixture_image(i % 8)), "external_id": format!("i{i}"), "captions": [format!("caption number {i}")]})
            })
            .collect();
        let (s, body) = app
            .post_json("/v1/collections/c/images", json!({ "images": images }))
            .await;
        assert_eq!(s, 201, "{body}");
    }
    app.stop().await;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(url).await.expect("pool");
    let (old, _) = stored_bundles(&pool).await;
    assert_eq!(old.len(), 1, "{old:?}");

    // One row per transaction, so that the kill lands with part of the rows staged.
    let upgraded = upgraded_bundle(dir);
    let mut child = reindex_cmd(&upgraded, url)
        .args(["--page-rows", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn reindex");
    let t = Instant::now();
    loop {
        let (_, staged) = stored_bundles(&pool).await;
        if staged as usize >= N / 2 {
            break;
        }
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the reindex ended before half of its rows were staged ({staged})"
        );
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "reindex stalled at {staged}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    child.kill().expect("kill -9");
    child.wait().expect("reap");
    // Old vectors everywhere: nothing of the new bundle is visible, what was staged is kept.
    let (after_kill, staged) = stored_bundles(&pool).await;
    assert_eq!(
        after_kill, old,
        "a killed reindex left vectors of two bundles"
    );
    assert!(staged > 0);

    // Run again: it resumes (reuses the staged rows) and switches everything.
    let out = reindex_cmd(&upgraded, url).output().expect("reindex");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!("reindexed {N} images"))
            && said.contains(&format!("and {N} captions")),
        "{said}"
    );
    let reused: i64 = said
        .split("; ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("reused count");
    assert!(reused >= staged, "{said} (staged {staged})");
    let (now, staged) = stored_bundles(&pool).await;
    assert_eq!(staged, 0);
    assert_eq!(now.len(), 1);
    assert!(now[0].starts_with("fixture-tiny-v2@"), "{now:?}");

    // The switched vectors are the new bundle's: a photo finds its own record with a score of 1.
    if flags.contains(&"database") {
        // The switch rewrote the pgvector column with the vectors, in its transaction: each row's halfvec is
        // its new f32 vector to half precision.
        let rows = sqlx::query("SELECT vector, embedding::text AS e FROM images UNION ALL SELECT vector, embedding::text FROM captions")
            .fetch_all(&pool)
            .await
            .expect("rows");
        assert_eq!(rows.len(), 2 * N);
        for r in &rows {
            use sqlx::Row;
            let v: Vec<f32> = r
                .get::<Vec<u8>, _>("vector")
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect();
            let e: Option<String> = r.get("e");
            let e: Vec<f32> = e
                .expect("an embedding")
                .trim_matches(['[', ']'])
                .split(',')
                .map(|x| x.parse().expect("float"))
                .collect();
            assert_eq!(e.len(), v.len());
            assert!(
                e.iter()
                    .zip(&v)
                    .all(|(a, b)| (a - b).abs() <= 1e-3 * b.abs().max(1e-2)),
                "embedding {e:?} is not vector {v:?}"
            );
        }
    }
    let app = TestApp::start_url(upgraded.to_str().expect("path"), url, flags).await;
    for i in [3usize, 7] {
        found_again(&app, i).await;
    }
    app.stop().await;
}

/// The top hit of fixture photo `i` as the query in collection "c": its stored vector is the one the loaded
/// bundle computes from the pixels (a cosine above 0.9999).
async fn found_again(app: &TestApp, i: usize) -> serde_json::Value {
    let (s, hits) = app
        .post_json(
            "/v1/collections/c/images/search",
            json!({"image": b64(&fixture_image(i)), "k": 1}),
        )
        .await;
    assert_eq!(s, 200, "{hits}");
    let top = &hits["results"][0];
    assert!(top["score"].as_f64().expect("score") > 0.9999, "{hits}");
    top.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reindex_killed_part_way_leaves_the_old_vectors_and_resumes_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("js.db").display());
    killed_reindex_leaves_one_bundle_and_resumes(&url, dir.path(), &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reindex_killed_part_way_leaves_the_old_vectors_and_resumes_on_postgres() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = PgCluster::start();
    let url = pg.create_db("reindex").await;
    killed_reindex_leaves_one_bundle_and_resumes(&url, dir.path(), &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reindex_killed_part_way_leaves_the_old_vectors_and_resumes_with_the_database_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("reindex").await;
    killed_reindex_leaves_one_bundle_and_resumes(&url, dir.path(), &DATABASE_INDEX).await;
}
