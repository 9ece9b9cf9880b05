//! Changing stored images, on both engines: PATCH merges metadata and moves the external id; PUT by external
//! id creates, updates (same bytes: no CNN pass) or replaces (a new photo under a new id, the old one gone
//! from the database, the index and, on Postgres, a replica's index), and embeds the stored bytes again under
//! a bundle of another vision model; an `Idempotency-Key` makes a retried POST answer the first answer instead
//! of storing twice.

use crate::common;

use std::time::Duration;

use common::{
    BUNDLE, TestApp, b64, fixture_image, gauge,
    pg::{DATABASE_INDEX, PgCluster},
};
use serde_json::{Value, json};

const SKU: &str = "/v1/collections/shop/images/by-external-id/sku-1";

async fn put(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let r = app
        .client
        .put(app.url(path))
        .json(&body)
        .send()
        .await
        .expect("put");
    (r.status().as_u16(), r.json().await.expect("json"))
}

async fn patch(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let r = app
        .client
        .patch(app.url(path))
        .json(&body)
        .send()
        .await
        .expect("patch");
    (r.status().as_u16(), r.json().await.expect("json"))
}

/// Images embedded so far (the counter appears with the first).
fn embedded_images(metrics: &str) -> i64 {
    let name = "jointspace_embedded_items_total{kind=\"image\"}";
    if metrics.contains(name) {
        gauge(metrics, name)
    } else {
        0
    }
}

/// The image ids a sentence search over the whole collection returns.
async fn searchable(app: &TestApp) -> Vec<i64> {
    filtered(app, Value::Null).await
}

/// The image ids a sentence search under a metadata filter returns (the filter runs on the server's
/// in-memory copy of the metadata, which writes here and on other replicas must keep in step).
async fn filtered(app: &TestApp, filter: Value) -> Vec<i64> {
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/images/search",
            json!({"text": "a picture", "k": 50, "filter": filter}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|h| h["image"]["id"].as_i64())
        .collect()
}

async fn upserts_and_patches(url: &str, replica_url: Option<&str>, flags: &[&str]) {
    let app = TestApp::start_url(BUNDLE, url, flags).await;
    app.create_collection("shop").await;
    let embedded = embedded_images(&app.metrics().await);

    // Created.
    let (s, made) = put(
        &app,
        SKU,
        json!({"data": b64(&fixture_image(0)), "metadata": {"price": 10}, "captions": ["a red shoe"]}),
    )
    .await;
    assert_eq!(s, 201, "{made}");
    assert_eq!(made["outcome"], "created");
    let id1 = made["id"].as_i64().expect("id");
    assert_eq!(embedded_images(&app.metrics().await), embedded + 1);

    // The same bytes: updated in place, no CNN pass, the kept caption keeps its id.
    let (s, same) = put(
        &app,
        SKU,
        json!({"data": b64(&fixture_image(0)), "metadata": {"price": 12}, "captions": ["a red shoe", "on sale"]}),
    )
    .await;
    assert_eq!(s, 200, "{same}");
    assert_eq!(same["outcome"], "updated");
    assert_eq!(same["id"].as_i64(), Some(id1));
    assert_eq!(same["caption_ids"][0], made["caption_ids"][0]);
    assert_eq!(
        embedded_images(&app.metrics().await),
        embedded + 1,
        "the same photo was embedded again"
    );
    let (_, got) = app.get_json(SKU).await;
    assert_eq!(got["metadata"], json!({"price": 12}));
    assert_eq!(got["captions"].as_array().map(Vec::len), Some(2));
    assert_eq!(filtered(&app, json!({"price": 12})).await, vec![id1]);
    assert_eq!(
        filtered(&app, json!({"price": 10})).await,
        Vec::<i64>::new()
    );

    // A new photo: replaced under a new id; the old id is gone everywhere.
    let (s, new) = put(
        &app,
        SKU,
        json!({"data": b64(&fixture_image(1)), "metadata": {"price": 12}, "captions": ["a red shoe", "on sale"]}),
    )
    .await;
    assert_eq!(s, 200, "{new}");
    assert_eq!(new["outcome"], "replaced");
    let id2 = new["id"].as_i64().expect("id");
    assert!(id2 > id1);
    assert_eq!(new["previous_id"].as_i64(), Some(id1));
    assert_eq!(new["caption_ids"], same["caption_ids"]);
    assert_eq!(embedded_images(&app.metrics().await), embedded + 2);
    assert_eq!(
        app.get_json(&format!("/v1/collections/shop/images/{id1}"))
            .await
            .0,
        404
    );
    let (_, got) = app.get_json(SKU).await;
    assert_eq!(got["id"].as_i64(), Some(id2));
    assert_eq!(got["captions"].as_array().map(Vec::len), Some(2));
    assert_eq!(searchable(&app).await, vec![id2]);
    let thumb = app
        .client
        .get(app.url(&format!("/v1/collections/shop/images/{id2}/thumbnail")))
        .send()
        .await
        .expect("thumbnail");
    assert_eq!(thumb.status(), 200);

    // Another server on the same database follows the replacement.
    if let Some(replica_url) = replica_url {
        let replica = TestApp::start_url(BUNDLE, replica_url, flags).await;
        let mut seen = vec![];
        for _ in 0..50 {
            seen = searchable(&replica).await;
            if seen == vec![id2] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(seen, vec![id2], "the replica at start");
        let (s, third) = put(&app, SKU, json!({"data": b64(&fixture_image(2))})).await;
        assert_eq!((s, third["outcome"].as_str()), (200, Some("replaced")));
        let id3 = third["id"].as_i64().expect("id");
        for _ in 0..50 {
            seen = searchable(&replica).await;
            if seen == vec![id3] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(seen, vec![id3], "the replica follows a replacement");
        // A metadata change in place reaches the replica's filters.
        let (s, p) = patch(
            &app,
            &format!("/v1/collections/shop/images/{id3}"),
            json!({"metadata": {"color": "blue"}}),
        )
        .await;
        assert_eq!(s, 200, "{p}");
        for _ in 0..50 {
            seen = filtered(&replica, json!({"color": "blue"})).await;
            if seen == vec![id3] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(seen, vec![id3], "the replica follows a PATCH");
        assert_eq!(
            third["caption_ids"],
            json!([]),
            "captions not sent are removed"
        );
        replica.stop().await;
        let (s, back) = put(
            &app,
            SKU,
            json!({"data": b64(&fixture_image(1)), "metadata": {"price": 12}, "captions": ["a red shoe", "on sale"]}),
        )
        .await;
        assert_eq!((s, back["outcome"].as_str()), (200, Some("replaced")));
        return check_patch(&app, back["id"].as_i64().expect("id")).await;
    }
    check_patch(&app, id2).await;
}

async fn check_patch(app: &TestApp, id: i64) {
    let path = format!("/v1/collections/shop/images/{id}");
    let (s, p) = patch(
        app,
        &path,
        json!({"metadata": {"price": null, "color": "red", "size": {"eu": 40}}, "external_id": "sku-1b"}),
    )
    .await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(p["metadata"], json!({"color": "red", "size": {"eu": 40}}));
    assert_eq!(p["external_id"], "sku-1b");
    assert_eq!(app.get_json(SKU).await.0, 404);
    let (s, p) = patch(app, &path, json!({"metadata": {"size": {"us": 7}}})).await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(
        p["metadata"],
        json!({"color": "red", "size": {"eu": 40, "us": 7}}),
        "nested objects merge"
    );
    let (s, listed) = app
        .get_json("/v1/collections/shop/images?filter=%7B%22size.us%22%3A7%7D")
        .await;
    assert_eq!(
        (s, listed["images"][0]["id"].as_i64()),
        (200, Some(id)),
        "{listed}"
    );
    assert_eq!(filtered(app, json!({"size.us": 7})).await, vec![id]);
    assert_eq!(
        filtered(app, json!({"price": {"$exists": true}})).await,
        Vec::<i64>::new(),
        "the PATCH removed price"
    );
    // Another image takes sku-2; moving sku-1b onto it is a conflict.
    let (s, _) = put(
        app,
        "/v1/collections/shop/images/by-external-id/sku-2",
        json!({"data": b64(&fixture_image(3))}),
    )
    .await;
    assert_eq!(s, 201);
    let (s, e) = patch(app, &path, json!({"external_id": "sku-2"})).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{e}"
    );
    // Bad input names what is wrong.
    let (s, e) = patch(app, &path, json!({"metadata": 5})).await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .expect("message")
            .contains("metadata")
    );
    let (s, _) = patch(app, &path, json!({"colour": "red"})).await;
    assert!(s == 400 || s == 422, "an unknown field: {s}");
    let (s, _) = patch(app, "/v1/collections/shop/images/999999", json!({})).await;
    assert_eq!(s, 404);
    let (s, e) = put(
        app,
        "/v1/collections/shop/images/by-external-id/sku-3",
        json!({"data": "bm90IGFuIGltYWdl"}),
    )
    .await;
    assert_eq!(s, 415, "not an image: {e}");
    // An external id with a slash travels percent-encoded.
    let (s, slash) = put(
        app,
        "/v1/collections/shop/images/by-external-id/shoes%2Fsku-9",
        json!({"data": b64(&fixture_image(4))}),
    )
    .await;
    assert_eq!(
        (s, slash["external_id"].as_str()),
        (201, Some("shoes/sku-9"))
    );
    // Deleted by external id.
    assert_eq!(
        app.delete("/v1/collections/shop/images/by-external-id/sku-1b")
            .await,
        204
    );
    assert_eq!(app.get_json(&path).await.0, 404);
    assert_eq!(
        app.delete("/v1/collections/shop/images/by-external-id/sku-1b")
            .await,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserts_and_patches_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("w.db").display());
    upserts_and_patches(&url, None, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserts_and_patches_on_postgres_with_a_replica() {
    let pg = PgCluster::start();
    let url = pg.create_db("writes").await;
    upserts_and_patches(&url, Some(&url), &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserts_and_patches_with_the_database_index_and_a_replica() {
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("writes").await;
    upserts_and_patches(&url, Some(&url), &DATABASE_INDEX).await;
}

/// A photo stored under the fixture bundle, sent again (the same bytes) under a bundle of another vision
/// model: the stored code is the other model's, so the photo is embedded again and replaces the image (a new
/// id, its caption embedded again too); sent once more, it is the stored photo (no CNN pass).
async fn the_same_bytes_under_another_vision_model(url: &str) {
    let body = json!({"data": b64(&fixture_image(0)), "metadata": {"price": 10}, "captions": ["a red shoe"]});
    let app = TestApp::start_url(BUNDLE, url, &[]).await;
    app.create_collection("shop").await;
    let (s, made) = put(&app, SKU, body.clone()).await;
    assert_eq!(s, 201, "{made}");
    app.stop().await;

    let windowed = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fixture-tiny-windowed");
    let app = TestApp::start_url(windowed, url, &[]).await;
    let embedded = embedded_images(&app.metrics().await);
    let (s, again) = put(&app, SKU, body.clone()).await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["outcome"], "replaced");
    assert_eq!(again["previous_id"], made["id"]);
    assert_ne!(
        again["caption_ids"], made["caption_ids"],
        "the caption embedded again"
    );
    assert_eq!(embedded_images(&app.metrics().await), embedded + 1);
    let id = again["id"].as_i64().expect("id");
    let (_, got) = app.get_json(SKU).await;
    assert_eq!(got["id"].as_i64(), Some(id));
    assert!(
        got["bundle_id"]
            .as_str()
            .is_some_and(|b| b.starts_with("fixture-tiny-windowed@")),
        "{got}"
    );
    assert_eq!(searchable(&app).await, vec![id]);

    let (s, same) = put(&app, SKU, body).await;
    assert_eq!(s, 200, "{same}");
    assert_eq!(same["outcome"], "updated");
    assert_eq!(same["id"].as_i64(), Some(id));
    assert_eq!(same["caption_ids"], again["caption_ids"]);
    assert_eq!(embedded_images(&app.metrics().await), embedded + 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_bytes_under_another_vision_model_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("w.db").display());
    the_same_bytes_under_another_vision_model(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_bytes_under_another_vision_model_on_postgres() {
    let pg = PgCluster::start();
    let url = pg.create_db("writes").await;
    the_same_bytes_under_another_vision_model(&url).await;
}

async fn post_with_key(app: &TestApp, path: &str, key: &str, body: &Value) -> (u16, bool, Value) {
    let r = app
        .client
        .post(app.url(path))
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .expect("post");
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (
        r.status().as_u16(),
        replayed,
        r.json().await.unwrap_or(Value::Null),
    )
}

async fn total(app: &TestApp) -> i64 {
    let (_, r) = app.get_json("/v1/collections/shop/images?limit=1").await;
    r["total"].as_i64().expect("total")
}

async fn retries_with_an_idempotency_key(url: &str, flags: &[&str]) {
    let app = TestApp::start_url(BUNDLE, url, flags).await;
    app.create_collection("shop").await;
    let images = "/v1/collections/shop/images";
    let body = json!({"images": [{"data": b64(&fixture_image(0)), "captions": ["a dog"]}]});
    let (s, replayed, first) = post_with_key(&app, images, "k-1", &body).await;
    assert_eq!((s, replayed), (201, false), "{first}");
    let (s, replayed, again) = post_with_key(&app, images, "k-1", &body).await;
    assert_eq!((s, replayed), (201, true), "{again}");
    assert_eq!(again, first, "the same answer, ids included");
    assert_eq!(total(&app).await, 1, "stored once");

    // The key with another request: refused, nothing stored.
    let other = json!({"images": [{"data": b64(&fixture_image(1))}]});
    let (s, _, e) = post_with_key(&app, images, "k-1", &other).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (422, Some("idempotency_key_reused")),
        "{e}"
    );
    assert_eq!(total(&app).await, 1);

    // A failed request keeps nothing: the same key then runs the corrected request.
    let bad = json!({"images": [{"data": "bm90IGFuIGltYWdl"}]});
    let (s, _, _) = post_with_key(&app, images, "k-2", &bad).await;
    assert_eq!(s, 415);
    let (s, replayed, _) = post_with_key(&app, images, "k-2", &other).await;
    assert_eq!((s, replayed), (201, false));
    assert_eq!(total(&app).await, 2);

    // Multipart: a client's retry has a new boundary, and is still the same request.
    let send_form = || async {
        let form = reqwest::multipart::Form::new()
            .part(
                "image",
                reqwest::multipart::Part::bytes(fixture_image(2)).file_name("a.png"),
            )
            .text("caption", "a beach");
        let r = app
            .client
            .post(app.url(images))
            .header("idempotency-key", "k-form")
            .multipart(form)
            .send()
            .await
            .expect("post");
        let replayed = r.headers().get("idempotent-replayed").is_some();
        (r.status().as_u16(), replayed, r.text().await.expect("body"))
    };
    let (s1, r1, b1) = send_form().await;
    let (s2, r2, b2) = send_form().await;
    assert_eq!((s1, r1, s2, r2), (201, false, 201, true));
    assert_eq!(b1, b2);
    assert_eq!(total(&app).await, 3);

    // Keys are per route: the same key on another POST is another key.
    let (s, replayed, _) =
        post_with_key(&app, "/v1/collections", "k-1", &json!({"name": "other"})).await;
    assert_eq!((s, replayed), (201, false));

    // Concurrent retries of one batch: stored once; each answer is the first answer or "still running".
    let batch = json!({"images": (0..8).map(|i| json!({"data": b64(&fixture_image(i))})).collect::<Vec<_>>()});
    let (a, b) = tokio::join!(
        post_with_key(&app, images, "k-batch", &batch),
        post_with_key(&app, images, "k-batch", &batch)
    );
    let mut statuses = [(a.0, a.1), (b.0, b.1)];
    statuses.sort();
    assert!(
        statuses == [(201, false), (201, true)] || statuses == [(201, false), (409, false)],
        "{statuses:?}: {} / {}",
        a.2,
        b.2
    );
    assert_eq!(total(&app).await, 11);

    // A request whose server stopped while running it: its claim has no answer and no heartbeat for longer
    // than the lease (made here from a finished one, as if its server had died before keeping the answer).
    // A retry is told so, once and for all (no Retry-After), and nothing runs twice.
    let one = json!({"images": [{"data": b64(&fixture_image(3))}]});
    let (s, _, _) = post_with_key(&app, images, "k-dead", &one).await;
    assert_eq!(s, 201);
    sqlx::any::install_default_drivers();
    let db = sqlx::AnyPool::connect(url).await.expect("the database");
    let cut = sqlx::query(
        "UPDATE idempotency SET status = NULL, body = NULL, heartbeat_at = '2000-01-01T00:00:00Z' \
         WHERE key = 'k-dead'",
    )
    .execute(&db)
    .await
    .expect("cut the claim off");
    assert_eq!(cut.rows_affected(), 1);
    db.close().await;
    let r = app
        .client
        .post(app.url(images))
        .header("idempotency-key", "k-dead")
        .json(&one)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 409);
    assert!(
        r.headers().get("retry-after").is_none(),
        "retrying cannot help"
    );
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["code"], "idempotency_abandoned", "{e}");
    let m = e["error"]["message"].as_str().expect("message");
    assert!(
        m.contains("last seen 2000-01-01T00:00:00Z") && m.contains("new key"),
        "{m}"
    );
    assert_eq!(total(&app).await, 12, "not run again");

    // A malformed key is a 400, and a key on a read is ignored.
    let (s, _, e) = post_with_key(&app, images, "has space", &body).await;
    assert_eq!(s, 400, "{e}");
    let search = json!({"text": "a dog", "k": 3});
    let (s, replayed, _) =
        post_with_key(&app, "/v1/collections/shop/images/search", "k-1", &search).await;
    assert_eq!((s, replayed), (200, false));
    let (s, replayed, _) =
        post_with_key(&app, "/v1/collections/shop/images/search", "k-1", &search).await;
    assert_eq!((s, replayed), (200, false), "searches are not replayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_with_an_idempotency_key_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("i.db").display());
    retries_with_an_idempotency_key(&url, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_with_an_idempotency_key_on_postgres() {
    let pg = PgCluster::start();
    let url = pg.create_db("idempotency").await;
    retries_with_an_idempotency_key(&url, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_with_an_idempotency_key_with_the_database_index() {
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("idempotency").await;
    retries_with_an_idempotency_key(&url, &DATABASE_INDEX).await;
}

/// A replica that has not loaded a collection's index yet (here: one that follows nothing) refuses a write to
/// it before storing anything, with a Retry-After: a write stored and then refused would release its
/// idempotency key, and the client's retry would store the photo twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_a_collection_whose_index_is_not_loaded_stores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("r.db").display());
    let a = TestApp::start_url(BUNDLE, &url, &[]).await;
    let b = TestApp::start_url(BUNDLE, &url, &["--follow-interval-ms", "0"]).await;
    a.create_collection("shop").await;
    let images = "/v1/collections/shop/images";
    let body = json!({"images": [{"data": b64(&fixture_image(0)), "captions": ["a dog"]}]});
    for key in ["k-1", "k-1"] {
        let r = b
            .client
            .post(b.url(images))
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .expect("post");
        assert_eq!(r.status().as_u16(), 503);
        assert_eq!(
            r.headers().get("retry-after").map(|v| v.as_bytes()),
            Some(&b"1"[..]),
            "a 503 says when to retry"
        );
        let e: Value = r.json().await.expect("json");
        assert_eq!(e["error"]["code"], "unavailable", "{e}");
    }
    let caption = json!({"captions": [{"text": "a free caption"}]});
    let (s, e) = b.post_json("/v1/collections/shop/captions", caption).await;
    assert_eq!(s, 503, "{e}");
    assert_eq!(
        total(&a).await,
        0,
        "nothing was stored by the refused writes"
    );
    let (_, caps) = a.get_json("/v1/collections/shop/captions?limit=1").await;
    assert_eq!(caps["total"], 0, "{caps}");
}
