//! `POST /v1/collections/{name}/sync` on SQLite, Postgres and the database index, one catalogue's life over
//! HTTP: the first feed (JSON lines, photos as data: URLs), a rerun that changes nothing, a text-only change
//! written without a CNN pass (the same image id, the server's own counter of photos embedded unmoved), a new
//! photo, a feed that withdraws too much refused with nothing written, its dry run, its real run, bad lines,
//! a path and a wrong type refused before any job is queued, a CSV feed fetched by URL with its photos at
//! URLs, a second job refused while one runs, a server stopped mid-job handing it back to the queue, and a
//! server killed mid-job: another start runs the job again from its feed and it ends with every item once.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::{
    Router,
    extract::{Path, State},
    http::header,
    routing::get,
};
use jointspace_store::{JobState, Store};
use serde_json::{Value, json};

use crate::common::{BUNDLE, TestApp, b64, fixture_image, gauge, pg::PgCluster};

/// The feed server: photos at `/img/{n}.png` (each after `delay`) and the CSV feed at `/feed.csv`.
async fn origin(csv: String, delay: Duration) -> String {
    let state = Arc::new((csv, delay));
    let app = Router::new()
        .route(
            "/img/{n}",
            get(
                |State(s): State<Arc<(String, Duration)>>, Path(n): Path<String>| async move {
                    tokio::time::sleep(s.1).await;
                    let n: usize = n.trim_end_matches(".png").parse().unwrap_or(0);
                    ([(header::CONTENT_TYPE, "image/png")], fixture_image(n % 8))
                },
            ),
        )
        .route(
            "/feed.csv",
            get(|State(s): State<Arc<(String, Duration)>>| async move {
                ([(header::CONTENT_TYPE, "text/csv")], s.0.clone())
            }),
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

const FLAGS: &[&str] = &[
    "--url-ingest",
    "--url-ingest-allow",
    "127.0.0.1/32",
    "--sync-job-lease-ms",
    "1200",
];

/// Posts a feed: (status, body, the job's Location).
async fn post_feed(
    app: &TestApp,
    query: &str,
    content_type: &str,
    body: String,
) -> (u16, Value, Option<String>) {
    let r = app
        .client
        .post(app.url(&format!("/v1/collections/shop/sync{query}")))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let location = r
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    (status, r.json().await.unwrap_or(Value::Null), location)
}

/// Waits for the job at `location` to finish; its last state.
async fn finished(app: &TestApp, location: &str) -> Value {
    for _ in 0..600 {
        let (s, job) = app.get_json(location).await;
        assert_eq!(s, 200, "{job}");
        if job["state"] == "succeeded" || job["state"] == "failed" {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the job at {location} did not finish in 60 s");
}

/// Waits until the running job at `location` has handled at least 4 items.
async fn midway(app: &TestApp, location: &str) {
    for _ in 0..300 {
        let (_, j) = app.get_json(location).await;
        if j["state"] == "running" && j["done"].as_i64().unwrap_or(0) >= 4 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, j) = app.get_json(location).await;
    panic!("the job did not get 4 items in: {j}");
}

/// Posts a feed and waits for its job: the finished job.
async fn sync(app: &TestApp, query: &str, content_type: &str, body: String) -> Value {
    let (s, job, location) = post_feed(app, query, content_type, body).await;
    assert_eq!(s, 202, "{job}");
    assert!(
        job["state"] == "queued" || job["state"] == "running",
        "{job}"
    );
    finished(app, &location.expect("a Location")).await
}

/// A finished job's report counts (as the command's: `sync::counts`).
fn counts(job: &Value) -> [i64; 7] {
    crate::sync::counts(&job["report"])
}

/// What the collection holds: external id -> (image id, metadata).
async fn state(app: &TestApp) -> BTreeMap<String, (i64, Value)> {
    let (s, list) = app.get_json("/v1/collections/shop/images?limit=1000").await;
    assert_eq!(s, 200, "{list}");
    list["images"]
        .as_array()
        .expect("images")
        .iter()
        .map(|i| {
            let ext = i["external_id"].as_str().expect("synced").to_string();
            (ext, (i["id"].as_i64().expect("id"), i["metadata"].clone()))
        })
        .collect()
}

/// The server's own count of photos its vision model embedded (no sample before the first).
async fn photos_embedded(app: &TestApp) -> i64 {
    let metrics = app.metrics().await;
    let name = "jointspace_embedded_items_total{kind=\"image\"}";
    if metrics.lines().any(|l| l.starts_with(name)) {
        gauge(&metrics, name)
    } else {
        0
    }
}

/// A JSON-lines feed: (id, title, photo) per product, photos as data: URLs of the fixture images.
fn jsonl(items: &[(&str, &str, usize)]) -> String {
    items
        .iter()
        .map(|(id, title, photo)| {
            json!({"id": id, "title": title, "price": 10,
                   "image": format!("data:image/png;base64,{}", b64(&fixture_image(*photo))),
                   "captions": [format!("a photo of {title}")]})
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const NDJSON: &str = "application/x-ndjson";

async fn feed_life(url: &str, extra: &[&str]) {
    let flags = [FLAGS, extra].concat();
    let app = TestApp::start_url(BUNDLE, url, &flags).await;
    app.create_collection("shop").await;
    let five = [
        ("sku-1", "Red shoe", 0),
        ("sku-2", "Blue bag", 1),
        ("sku-3", "Straw hat", 2),
        ("sku-4", "Scarf", 3),
        ("sku-5", "Gloves", 4),
    ];

    // The first feed: every photo embedded once.
    let before = photos_embedded(&app).await;
    let job = sync(&app, "", NDJSON, jsonl(&five)).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(counts(&job), [5, 0, 0, 0, 0, 0, 5], "{job}");
    assert_eq!(
        (job["items"].as_i64(), job["done"].as_i64()),
        (Some(5), Some(5))
    );
    assert_eq!(job["attempts"], 1);
    assert_eq!(photos_embedded(&app).await - before, 5);
    let first = state(&app).await;
    assert_eq!(first.len(), 5);
    assert_eq!(first["sku-1"].1["title"], "Red shoe");

    // Again: nothing written, nothing embedded.
    let job = sync(&app, "", NDJSON, jsonl(&five)).await;
    assert_eq!(counts(&job), [0, 0, 0, 5, 0, 0, 0], "{job}");
    assert_eq!(job["report"]["sentences_embedded"], 0, "{job}");
    assert_eq!(state(&app).await, first);

    // Text only: written without the CNN, the image keeps its id.
    let before = photos_embedded(&app).await;
    let mut renamed = five;
    renamed[0].1 = "Crimson shoe";
    let job = sync(&app, "", NDJSON, jsonl(&renamed)).await;
    assert_eq!(counts(&job), [0, 0, 1, 4, 0, 0, 0], "{job}");
    assert_eq!(
        photos_embedded(&app).await,
        before,
        "no CNN pass for a text change"
    );
    assert_eq!(
        job["report"]["sentences_embedded"], 1,
        "only the changed caption is embedded: {job}"
    );
    let second = state(&app).await;
    assert_eq!(second["sku-1"].0, first["sku-1"].0, "same photo, same id");
    assert_eq!(second["sku-1"].1["title"], "Crimson shoe");

    // A new photo: embedded, under a new id.
    renamed[1].2 = 5;
    let job = sync(&app, "", NDJSON, jsonl(&renamed)).await;
    assert_eq!(counts(&job), [0, 1, 0, 4, 0, 0, 1], "{job}");
    let third = state(&app).await;
    assert_ne!(third["sku-2"].0, second["sku-2"].0);

    // Withdrawing 2 of 5 (40%) passes the default share: the job fails, nothing is written.
    let three = &renamed[..3];
    let job = sync(&app, "", NDJSON, jsonl(three)).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert!(
        job["error"].as_str().is_some_and(|e| e.contains("(40.0%)")),
        "{job}"
    );
    assert!(job["report"]["refused"].is_string(), "{job}");
    assert_eq!(state(&app).await, third);

    // Its dry run with the share raised says what it would do and does nothing; then the real run.
    let job = sync(
        &app,
        "?max_delete_share=0.4&dry_run=true",
        NDJSON,
        jsonl(three),
    )
    .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["dry_run"], true);
    assert_eq!(counts(&job), [0, 0, 0, 3, 2, 0, 0], "{job}");
    assert_eq!(state(&app).await, third);
    let job = sync(&app, "?max_delete_share=0.4", NDJSON, jsonl(three)).await;
    assert_eq!(counts(&job), [0, 0, 0, 3, 2, 0, 0], "{job}");
    let fourth = state(&app).await;
    assert_eq!(
        fourth.keys().collect::<Vec<_>>(),
        ["sku-1", "sku-2", "sku-3"]
    );

    // Refused before a job is queued: bad lines (each named), a file path, a type that is no feed.
    let bad = format!(
        "{}\n{}\n{{\"id\": \"sku-9\", \"image\": \n{}",
        json!({"id": "sku-7"}),
        json!({"id": "sku-8", "image": "photos/p1.png"}),
        jsonl(&five[..1]),
    );
    let (s, body, _) = post_feed(&app, "", NDJSON, bad).await;
    assert_eq!(s, 422, "{body}");
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    for want in [
        "line 1: no `image`",
        "line 2: \"photos/p1.png\" is a file path",
        "line 3: not JSON",
        "3 bad line(s)",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    let (s, body, _) = post_feed(&app, "", "text/plain", "id,image\n".into()).await;
    assert_eq!(s, 415, "{body}");
    let (s, body, _) = post_feed(&app, "?max_delete_share=2", NDJSON, jsonl(three)).await;
    assert_eq!(s, 422, "{body}");
    let (s, _) = app.get_json("/v1/collections/shop/sync/999999").await;
    assert_eq!(s, 404);
    assert_eq!(state(&app).await, fourth);

    // A CSV feed by URL, its photos at URLs: sku-3's photo is the one stored (fixture 2), sku-6 is new.
    let csv_feed = "id,title,image,price\n\
                    sku-1,Crimson shoe,{o}/img/0.png,10\n\
                    sku-2,Blue bag,{o}/img/5.png,10\n\
                    sku-3,Straw hat,{o}/img/2.png,10\n\
                    sku-6,Belt,{o}/img/6.png,15\n";
    let images = origin(String::new(), Duration::ZERO).await;
    let o = origin(csv_feed.replace("{o}", &images), Duration::ZERO).await;
    let job = sync(
        &app,
        "?number_fields=price",
        "application/json",
        json!({"url": format!("{o}/feed.csv")}).to_string(),
    )
    .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    // Captions went (the CSV has none): sku-1..3 updated, sku-6 added.
    assert_eq!(counts(&job), [1, 0, 3, 0, 0, 0, 1], "{job}");
    assert_eq!(
        state(&app).await["sku-6"].1,
        json!({"title": "Belt", "price": 15})
    );

    // A slow feed (each photo 300 ms away): a second job is refused while it runs, and a server killed
    // mid-job leaves it to the next start, which runs it again to the end.
    let slow = origin(String::new(), Duration::from_millis(300)).await;
    let slow_feed: String = std::iter::once("id,title,image\n".to_string())
        .chain((0..24).map(|n| format!("p-{n},Product {n},{slow}/img/{n}.png\n")))
        .collect();
    let (s, job, location) = post_feed(&app, "?max_delete_share=1", "text/csv", slow_feed).await;
    assert_eq!(s, 202, "{job}");
    let location = location.expect("a Location");
    let (s, body, _) = post_feed(&app, "", NDJSON, jsonl(three)).await;
    assert_eq!(s, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("sync job {}", job["id"]))),
        "{body}"
    );
    // Stopped gracefully mid-job, the server hands the job back to the queue.
    midway(&app, &location).await;
    app.stop().await;
    let store = Store::connect(url).await.expect("store");
    let shop = store.collection("shop").await.expect("shop").id;
    let id = job["id"].as_i64().expect("id");
    let back = store.job(shop, id).await.expect("the job");
    assert_eq!(back.state, JobState::Queued, "handed back at shutdown");
    store.close().await;
    // Killed mid-job (no handing back), its lease runs out and the next start runs it again.
    let app = TestApp::start_url(BUNDLE, url, &flags).await;
    midway(&app, &location).await;
    app.kill().await;
    let app = TestApp::start_url(BUNDLE, url, &flags).await;
    let job = finished(&app, &location).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["attempts"], 3, "run again after each stop: {job}");
    let last = state(&app).await;
    assert_eq!(last.len(), 24, "every item once: {:?}", last.keys());
    assert!(last.keys().all(|k| k.starts_with("p-")));
    let r = &job["report"];
    assert_eq!(
        r["added"].as_i64().unwrap_or(0) + r["unchanged"].as_i64().unwrap_or(0),
        24,
        "{job}"
    );
    assert_eq!(r["deleted"], 4, "{job}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_over_http_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    feed_life(
        &format!("sqlite://{}", dir.path().join("js.db").display()),
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_over_http_on_postgres() {
    let pg = PgCluster::start();
    feed_life(&pg.create_db("sync_api").await, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_over_http_on_the_database_index() {
    let pg = PgCluster::start_pgvector();
    feed_life(&pg.create_db("sync_api_db").await, &["--index", "database"]).await;
}
