//! Thumbnails and the search page: every stored image keeps a small JPEG, served behind the read key with
//! caching headers, from the database (so a replica on the same Postgres serves what another ingested); the
//! page is served at `/` with a policy that allows only this origin. The page's behaviour in a browser is
//! tests/browser/test_page.py's (scripts/browser-test.sh).

use crate::common;

use std::time::Duration;

use common::{BUNDLE, TestApp, b64, fixture_image, pg::PgCluster};
use serde_json::json;

const ADMIN: &str = "admin-key-for-thumbnails-01";
const READ: &str = "read-key-for-thumbnails-001";

/// Adds fixture images (one request each) to `collection` through `app` with the admin key; their ids.
async fn add(app: &TestApp, collection: &str, fixtures: &[usize]) -> Vec<i64> {
    let mut ids = vec![];
    for &i in fixtures {
        let r = app
            .client
            .post(app.url(&format!("/v1/collections/{collection}/images")))
            .bearer_auth(ADMIN)
            .json(&json!({"images": [{"data": b64(&fixture_image(i))}]}))
            .send()
            .await
            .expect("add");
        assert_eq!(r.status(), 201);
        let v: serde_json::Value = r.json().await.expect("json");
        ids.push(v["images"][0]["id"].as_i64().expect("id"));
    }
    ids
}

async fn create(app: &TestApp, name: &str) {
    let r = app
        .client
        .post(app.url("/v1/collections"))
        .bearer_auth(ADMIN)
        .json(&json!({ "name": name }))
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 201);
}

fn keys() -> [&'static str; 4] {
    ["--admin-key", ADMIN, "--read-key", READ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_images_have_small_jpeg_thumbnails_with_caching_headers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("t.db"), &keys()).await;
    create(&app, "thumbs").await;
    let fixtures: Vec<usize> = (0..8).collect();
    let ids = add(&app, "thumbs", &fixtures).await;
    let mut sizes = vec![];
    for (&i, &id) in fixtures.iter().zip(&ids) {
        let url = app.url(&format!("/v1/collections/thumbs/images/{id}/thumbnail"));
        let r = app
            .client
            .get(&url)
            .bearer_auth(READ)
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), 200);
        let h = r.headers().clone();
        assert_eq!(h["content-type"], "image/jpeg");
        assert_eq!(h["cache-control"], "private, max-age=31536000, immutable");
        let etag = h["etag"].to_str().expect("etag").to_string();
        assert!(etag.starts_with(&format!("\"{id}-")), "{etag}");
        let bytes = r.bytes().await.expect("body");
        // The longest side is 256 (or the photo's own, when smaller), proportions kept.
        let original = image::load_from_memory(&fixture_image(i)).expect("fixture");
        let (ow, oh) = (original.width(), original.height());
        let thumb =
            image::load_from_memory_with_format(&bytes, image::ImageFormat::Jpeg).expect("a JPEG");
        let (tw, th) = (thumb.width(), thumb.height());
        assert_eq!(
            tw.max(th),
            ow.max(oh).min(256),
            "fixture {i}: {ow}x{oh} -> {tw}x{th}"
        );
        let ratio = |w: u32, h: u32| f64::from(w) / f64::from(h);
        assert!((ratio(tw, th) - ratio(ow, oh)).abs() < 0.02, "fixture {i}");
        assert!(bytes.len() < 12_000, "fixture {i}: {} bytes", bytes.len());
        sizes.push(format!("{ow}x{oh} -> {tw}x{th} {} B", bytes.len()));

        // The tag it gave answers 304 with no body; another tag gets the image again.
        let again = app
            .client
            .get(&url)
            .bearer_auth(READ)
            .header("if-none-match", &etag)
            .send()
            .await
            .expect("get");
        assert_eq!(again.status(), 304);
        assert_eq!(again.headers()["etag"].to_str().expect("etag"), etag);
        assert!(again.bytes().await.expect("body").is_empty());
        let other = app
            .client
            .get(&url)
            .bearer_auth(READ)
            .header("if-none-match", "\"0-0000000000000000\"")
            .send()
            .await
            .expect("get");
        assert_eq!(other.status(), 200);
    }
    eprintln!("thumbnails of the fixtures: {}", sizes.join("; "));

    let path = format!("/v1/collections/thumbs/images/{}/thumbnail", ids[0]);
    // Behind the read key, like every other GET.
    let open = app.client.get(app.url(&path)).send().await.expect("get");
    assert_eq!(open.status(), 401);
    // Only in its own collection.
    create(&app, "other").await;
    let elsewhere = app
        .client
        .get(app.url(&format!(
            "/v1/collections/other/images/{}/thumbnail",
            ids[0]
        )))
        .bearer_auth(READ)
        .send()
        .await
        .expect("get");
    assert_eq!(elsewhere.status(), 404);
    // Gone with its image.
    let del = app
        .client
        .delete(app.url(&format!("/v1/collections/thumbs/images/{}", ids[0])))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("delete");
    assert_eq!(del.status(), 204);
    let gone = app
        .client
        .get(app.url(&path))
        .bearer_auth(READ)
        .send()
        .await
        .expect("get");
    assert_eq!(gone.status(), 404);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_thumbnails_off_none_is_kept_and_the_404_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("t.db");
    let app = TestApp::start(&db, &["--thumbnails", "off"]).await;
    app.create_collection("c").await;
    let id = app.add_tagged("c", 4, "x").await;
    let (status, body) = app
        .get_json(&format!("/v1/collections/c/images/{id}/thumbnail"))
        .await;
    assert_eq!(status, 404);
    let msg = body["error"]["message"].as_str().expect("message");
    assert!(msg.contains("--thumbnails off"), "{msg}");
    app.stop().await;
    // Turned back on, new images get one; the old one still has none.
    let app = TestApp::start(&db, &[]).await;
    let new = app.add_tagged("c", 4, "y").await;
    let r = app
        .client
        .get(app.url(&format!("/v1/collections/c/images/{new}/thumbnail")))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 200);
    assert_eq!(
        app.get_json(&format!("/v1/collections/c/images/{id}/thumbnail"))
            .await
            .0,
        404
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_serves_the_thumbnail_of_an_image_another_ingested() {
    let pg = PgCluster::start();
    let url = pg.create_db("thumbnails").await;
    let a = TestApp::start_url(BUNDLE, &url, &keys()).await;
    let b = TestApp::start_url(BUNDLE, &url, &keys()).await;
    create(&a, "shared").await;
    let id = add(&a, "shared", &[7]).await[0];
    let get = |app: &TestApp| {
        app.client
            .get(app.url(&format!("/v1/collections/shared/images/{id}/thumbnail")))
            .bearer_auth(READ)
            .send()
    };
    let from_a = get(&a).await.expect("get");
    assert_eq!(from_a.status(), 200);
    let etag_a = from_a.headers()["etag"].clone();
    let bytes_a = from_a.bytes().await.expect("body");
    // Read from the shared database: no waiting for B's index to follow.
    let from_b = get(&b).await.expect("get");
    assert_eq!(from_b.status(), 200);
    assert_eq!(
        from_b.headers()["etag"],
        etag_a,
        "the same tag on every replica"
    );
    assert_eq!(from_b.bytes().await.expect("body"), bytes_a);
    let t = image::load_from_memory(&bytes_a).expect("jpeg");
    assert_eq!((t.width(), t.height()), (256, 192));
    // B's search finds it too once its index follows, and its results can show it.
    let mut found = false;
    for _ in 0..100 {
        let r = b
            .client
            .post(b.url("/v1/collections/shared/images/search"))
            .bearer_auth(READ)
            .json(&json!({"text": "a photo", "k": 1}))
            .send()
            .await
            .expect("search");
        let v: serde_json::Value = r.json().await.expect("json");
        if v["results"][0]["image"]["id"].as_i64() == Some(id) {
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(found, "B's index did not follow A's ingest");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_at_the_root_without_a_key_and_with_a_strict_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("t.db"), &keys()).await;
    let r = app.client.get(app.url("/")).send().await.expect("get");
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    let csp = h["content-security-policy"].to_str().expect("csp");
    assert!(csp.starts_with("default-src 'self';"), "{csp}");
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["cache-control"], "no-cache");
    let html = r.text().await.expect("html");
    assert!(html.contains("<title>jointspace"), "{html}");
    for (path, ct) in [
        ("/page/app.js", "text/javascript; charset=utf-8"),
        ("/page/app.css", "text/css; charset=utf-8"),
        ("/page/icon.svg", "image/svg+xml"),
    ] {
        assert!(html.contains(path), "the page loads {path}");
        let r = app.client.get(app.url(path)).send().await.expect("get");
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-type"], ct, "{path}");
        let etag = r.headers()["etag"].clone();
        let again = app
            .client
            .get(app.url(path))
            .header("if-none-match", etag)
            .send()
            .await
            .expect("get");
        assert_eq!(again.status(), 304, "{path}");
    }
    let (status, body) = app.get_json("/page/secrets.txt").await;
    assert_eq!(status, 404);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("app.js")),
        "{body}"
    );
    // The page is public; what it calls is not.
    assert_eq!(app.get_json("/v1/collections").await.0, 401);
    app.stop().await;
}
