//! Export and import on both engines: a collection exported (by the API and by the CLI), imported into a
//! fresh database without a CNN pass, answers the same searches with the same scores, thumbnails and
//! metadata; an interrupted import resumes after its last committed batch; a file cut short is refused.

use crate::common;

use std::process::Command;

use common::{BUNDLE, TestApp, b64, fixture_image, jointspace, pg::PgCluster};
use serde_json::{Value, json};

fn run(c: &mut Command) -> (bool, String) {
    common::outcome(&c.output().expect("runs"))
}

/// (external id or the metadata's `n`, score) of a sentence search's results, in order.
async fn search(app: &TestApp, text: &str) -> Vec<(String, f64)> {
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/images/search",
            json!({"text": text, "k": 10}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|h| {
            let img = &h["image"];
            let who = img["external_id"]
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| format!("n{}", img["metadata"]["n"]));
            (who, h["score"].as_f64().expect("score"))
        })
        .collect()
}

/// Everything that must survive a round trip: each image's external id, metadata, captions and thumbnail.
async fn contents(app: &TestApp) -> Vec<(Value, Value, Vec<String>, Vec<u8>)> {
    let (_, list) = app.get_json("/v1/collections/shop/images?limit=100").await;
    let mut out = vec![];
    for img in list["images"].as_array().expect("images") {
        let id = img["id"].as_i64().expect("id");
        let (_, full) = app
            .get_json(&format!("/v1/collections/shop/images/{id}"))
            .await;
        let mut caps: Vec<String> = full["captions"]
            .as_array()
            .expect("captions")
            .iter()
            .map(|c| c["text"].as_str().expect("text").to_string())
            .collect();
        caps.sort();
        let thumb = app
            .client
            .get(app.url(&format!("/v1/collections/shop/images/{id}/thumbnail")))
            .send()
            .await
            .expect("thumbnail")
            .bytes()
            .await
            .expect("bytes")
            .to_vec();
        out.push((
            img["external_id"].clone(),
            img["metadata"].clone(),
            caps,
            thumb,
        ));
    }
    out.sort_by_key(|c| c.1["n"].as_i64());
    out
}

const QUERIES: [&str; 3] = ["a dog runs on the grass", "a picture", "people on a beach"];

async fn round_trip(a_url: &str, b_url: &str, c_url: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = TestApp::start_url(BUNDLE, a_url, &[]).await;
    assert_eq!(
        a.post_json(
            "/v1/collections",
            json!({"name": "shop", "description": "spring catalogue"})
        )
        .await
        .0,
        201
    );
    let images: Vec<Value> = (0..6)
        .map(|i| {
            let mut img = json!({
                "data": b64(&fixture_image(i)),
                "metadata": {"n": i, "brand": {"name": format!("b{}", i % 2)}},
                "captions": (0..i % 3).map(|k| format!("product {i} caption {k}")).collect::<Vec<_>>(),
            });
            if i != 5 {
                img["external_id"] = json!(format!("p{i}"));
            }
            img
        })
        .collect();
    let (s, r) = a
        .post_json("/v1/collections/shop/images", json!({ "images": images }))
        .await;
    assert_eq!(s, 201, "{r}");
    let (s, _) = a
        .post_json(
            "/v1/collections/shop/captions",
            json!({"captions": [{"text": "a caption of no image"}]}),
        )
        .await;
    assert_eq!(s, 201);
    let before: Vec<_> = {
        let mut v = vec![];
        for q in QUERIES {
            v.push(search(&a, q).await);
        }
        v
    };
    let stored = contents(&a).await;

    // The API's export and the CLI's hold the same lines but for the header's time.
    let r = a
        .client
        .get(a.url("/v1/collections/shop/export"))
        .send()
        .await
        .expect("export");
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("type")
            .starts_with("application/x-ndjson")
    );
    let api_export = r.text().await.expect("body");
    let file = dir.path().join("shop.jsonl");
    let (ok, out) = run(jointspace(a_url)
        .args(["export", "shop", "--out"])
        .arg(&file));
    assert!(ok, "{out}");
    let cli_export = std::fs::read_to_string(&file).expect("export file");
    let body = |t: &str| t.lines().skip(1).map(String::from).collect::<Vec<_>>();
    assert_eq!(body(&api_export), body(&cli_export));
    let lines: Vec<Value> = cli_export
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines[0]["header"]["collection"], "shop");
    assert_eq!(lines[0]["header"]["description"], "spring catalogue");
    assert_eq!(lines.len(), 1 + 6 + 1 + 1);
    assert_eq!(
        lines.last().expect("end")["end"],
        json!({"images": 6, "captions": 1})
    );
    assert!(
        lines[1]["image"]["code"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
    );
    a.stop().await;

    // Imported into a fresh database: no photo embedded, the same answers. A graph is built only where its
    // snapshot can be kept (next to a SQLite file; a Postgres database has no such place without
    // --index-dir), so the server's own build is not paid twice.
    let (ok, out) = run(jointspace(b_url).arg("import").arg(&file));
    assert!(ok, "{out}");
    assert!(
        out.contains(
            "imported 6 images and 7 captions into \"shop\" (0 photos embedded by the CNN"
        ),
        "{out}"
    );
    assert_eq!(
        out.contains("rows only: no HNSW graph built here"),
        b_url.starts_with("postgres"),
        "{out}"
    );
    let b = TestApp::start_url(BUNDLE, b_url, &[]).await;
    let (_, c) = b.get_json("/v1/collections/shop").await;
    assert_eq!(
        (c["images"].as_i64(), c["captions"].as_i64()),
        (Some(6), Some(7))
    );
    assert_eq!(c["description"], "spring catalogue");
    for (q, want) in QUERIES.iter().zip(&before) {
        let got = search(&b, q).await;
        assert_eq!(got.len(), want.len(), "{q}");
        for ((gw, gs), (ww, ws)) in got.iter().zip(want) {
            assert_eq!(gw, ww, "{q}: {got:?} vs {want:?}");
            assert!((gs - ws).abs() < 1e-5, "{q}: {got:?} vs {want:?}");
        }
    }
    assert_eq!(contents(&b).await, stored);
    // Run again: the mark says everything is in.
    let (ok, out) = run(jointspace(b_url).arg("import").arg(&file));
    assert!(ok, "{out}");
    assert!(out.contains("imported 0 images and 0 captions"), "{out}");
    b.stop().await;

    // Interrupted: the first batch commits, the second meets an external id already taken and fails.
    let c = TestApp::start_url(BUNDLE, c_url, &[]).await;
    c.create_collection("shop").await;
    let (s, r) = c
        .post_json(
            "/v1/collections/shop/images",
            json!({"images": [{"data": b64(&fixture_image(7)), "external_id": "p3"}]}),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    let squatter = r["images"][0]["id"].as_i64().expect("id");
    let (ok, out) = run(jointspace(c_url)
        .args(["import", "--batch", "2"])
        .arg(&file));
    assert!(!ok && out.contains("p3"), "{out}");
    let (_, listed) = c.get_json("/v1/collections/shop/images?limit=100").await;
    assert_eq!(
        listed["total"], 3,
        "the first batch (p0, p1) and the squatter: {listed}"
    );
    assert_eq!(
        c.delete(&format!("/v1/collections/shop/images/{squatter}"))
            .await,
        204
    );
    c.stop().await;
    // Resumed after the committed batch: p0 and p1 are not added twice (they would conflict).
    let (ok, out) = run(jointspace(c_url)
        .args(["import", "--batch", "2"])
        .arg(&file));
    assert!(ok, "{out}");
    assert!(out.contains("imported 4 images"), "{out}");
    let c = TestApp::start_url(BUNDLE, c_url, &[]).await;
    assert_eq!(contents(&c).await, stored);
    c.stop().await;

    // A file cut short is refused before anything is written.
    let cut = dir.path().join("cut.jsonl");
    let short: Vec<&str> = cli_export.lines().take(4).collect();
    std::fs::write(&cut, short.join("\n")).expect("write");
    let (ok, out) = run(jointspace(c_url)
        .args(["import", "--collection", "other"])
        .arg(&cut));
    assert!(!ok && out.contains("cut short"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_import_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = |n: &str| format!("sqlite://{}", dir.path().join(n).display());
    round_trip(&url("a.db"), &url("b.db"), &url("c.db")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_import_on_postgres() {
    let pg = PgCluster::start();
    let a = pg.create_db("export_a").await;
    let b = pg.create_db("export_b").await;
    let c = pg.create_db("export_c").await;
    round_trip(&a, &b, &c).await;
}
