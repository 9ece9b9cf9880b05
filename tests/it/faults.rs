//! Faults. (1) kill -9 of the real server binary during sustained concurrent ingest, then a restart: every
//! image acknowledged with a 2xx is in the database and found by search, and the index holds exactly the
//! database's images; on SQLite and on Postgres. (2) Postgres stopped under load, with the index in memory
//! and in the database: requests fail cleanly with 503 and Retry-After while it is down (no hang, no 500),
//! the service recovers by itself once it is back, and every acknowledged write is found.
//! `cargo test --release --test it faults:: -- --nocapture` prints the counts.

use crate::common;

use std::{
    collections::BTreeMap,
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use common::{
    BUNDLE, TestApp, b64, fixture_image, gauge,
    load::{Load, assert_clean_answers, assert_found_by_own_photo, statuses},
    metrics_text,
    pg::{DATABASE_INDEX, PgCluster},
};
use serde_json::{Value, json};

struct Server {
    child: Child,
    base: String,
    client: reqwest::Client,
}

impl Server {
    /// Starts `jointspace serve` and waits until it answers.
    async fn start(url: &str, index_dir: &std::path::Path, log: &std::path::Path) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_jointspace"))
            .args([
                "serve",
                "--addr",
                &addr,
                "--bundle",
                BUNDLE,
                "--database-url",
                url,
            ])
            .args(["--index-dir", index_dir.to_str().expect("path")])
            // Snapshots every second: the kill also lands during (or between) snapshot writes.
            .args(["--snapshot-interval", "1"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn jointspace");
        let s = Server {
            child,
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
        };
        let t = Instant::now();
        while s
            .client
            .get(format!("{}/healthz", s.base))
            .send()
            .await
            .is_err()
        {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "server did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        s
    }

    async fn post(&self, path: &str, body: Value) -> Result<(u16, Value), reqwest::Error> {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await?;
        let s = r.status().as_u16();
        Ok((s, r.json().await.unwrap_or(Value::Null)))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("request");
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    async fn metric(&self, name: &str) -> i64 {
        gauge(&metrics_text(&self.client, &self.base).await, name)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn kill9_loses_nothing(url: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (index, log) = (dir.path().join("index"), dir.path().join("server.log"));
    let mut server = Server::start(url, &index, &log).await;
    let (s, r) = server
        .post("/v1/collections", json!({"name": "c"}))
        .await
        .expect("create");
    assert_eq!(s, 201, "{r}");

    // Workers keep ingesting while the process is killed: acknowledgements are collected until the kill.
    let acked = Arc::new(Mutex::new(BTreeMap::<String, i64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..6usize {
        let (acked, stop) = (acked.clone(), stop.clone());
        let (base, client) = (server.base.clone(), server.client.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<Value> = (0..2)
                    .map(|j| {
                        let ext = format!("w{w}-{n}-{j}");
                        json!({"data": b64(&fixture_image((w + n + j) % 8)), "external_id": ext,
                               "metadata": {"ext": ext}, "captions": [format!("caption of {ext}")]})
                    })
                    .collect();
                n += 1;
                let Ok(r) = client
                    .post(format!("{base}/v1/collections/c/images"))
                    .json(&json!({ "images": batch }))
                    .send()
                    .await
                else {
                    continue;
                };
                if !r.status().is_success() {
                    continue;
                }
                // Only a complete 2xx answer is an acknowledgement.
                let Ok(body) = r.json::<Value>().await else {
                    continue;
                };
                let mut a = acked.lock().expect("lock");
                for img in body["images"].as_array().into_iter().flatten() {
                    a.insert(
                        img["external_id"].as_str().expect("ext").to_string(),
                        img["id"].as_i64().expect("id"),
                    );
                }
            }
        }));
    }
    let t = Instant::now();
    while acked.lock().expect("lock").len() < 120 {
        assert!(t.elapsed() < Duration::from_secs(90), "ingest too slow");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A varying moment, so that over runs the kill lands at every stage of a request (embedding, commit,
    // index insert, answer).
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos() as u64
        % 700;
    tokio::time::sleep(Duration::from_millis(jitter)).await;
    // SIGKILL mid-stream (requests are in flight on every worker).
    server.child.kill().expect("kill -9");
    server.child.wait().expect("wait");
    let killed_at = t.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("worker");
    }
    let acked = acked.lock().expect("lock").clone();
    drop(server);

    let server = Server::start(url, &index, &log).await;
    let (s, c) = server.get("/v1/collections/c").await;
    assert_eq!(s, 200, "{c}");
    let in_db = c["images"].as_i64().expect("count");
    let mut found = 0;
    for (ext, id) in &acked {
        let (s, img) = server.get(&format!("/v1/collections/c/images/{id}")).await;
        assert_eq!(
            s, 200,
            "acknowledged image {ext} (id {id}) is not in the database: {img}"
        );
        assert_eq!(img["external_id"], ext.as_str());
        // Found by search: the filter picks the row in the database, the hit must come from the index.
        let (s, r) = server
            .post(
                "/v1/collections/c/images/search",
                json!({"text": "a picture", "k": 1, "filter": {"ext": ext}}),
            )
            .await
            .expect("search");
        assert_eq!(s, 200, "{r}");
        assert_eq!(
            r["results"][0]["image"]["id"].as_i64(),
            Some(*id),
            "acknowledged image {ext} (id {id}) is not in the index"
        );
        found += 1;
    }
    // The index holds exactly the database's rows (acknowledged or not: a commit whose answer was lost counts).
    let (index_images, index_captions) = (
        server.metric("jointspace_index_images").await,
        server.metric("jointspace_index_captions").await,
    );
    assert_eq!(index_images, in_db, "index vs database, images");
    assert_eq!(
        index_captions,
        c["captions"].as_i64().expect("count"),
        "index vs database, captions"
    );
    eprintln!(
        "kill -9 after {killed_at:?}: acknowledged {}, found {found} (by id and by search), lost {}; \
         database {in_db} images (so {} committed without an answer), index {index_images}",
        acked.len(),
        acked.len() - found,
        in_db - acked.len() as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_ingest_loses_nothing_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    kill9_loses_nothing(&format!("sqlite://{}", dir.path().join("js.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_ingest_loses_nothing_on_postgres() {
    let pg = PgCluster::start();
    let url = pg.create_db("kill9").await;
    kill9_loses_nothing(&url).await;
}

/// Postgres stopped for four seconds under a steady load of writes and searches, on two replicas (`flags`:
/// the index mode): every answer is a 2xx or a 503 `unavailable` naming the database with a Retry-After, in
/// bounded time; requests succeed again without a restart; every acknowledged image is stored and found by a
/// search; the other replica follows again.
async fn postgres_restart_under_load(pg: PgCluster, flags: &[&str]) {
    let url = pg.create_db("restart").await;
    let mut flags = flags.to_vec();
    flags.extend(["--database-timeout", "2", "--follow-interval-ms", "200"]);
    // Two replicas: B must also pick up A's writes again after the restart, by itself.
    let a = Arc::new(TestApp::start_url(BUNDLE, &url, &flags).await);
    let b = TestApp::start_url(BUNDLE, &url, &flags).await;
    a.create_collection("c").await;

    let load = Load::start(a.clone(), "c", 4, 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let down_at = load.elapsed();
    tokio::task::block_in_place(|| pg.stop_server());
    let stopped = load.elapsed();
    assert_eq!(
        a.get_json("/readyz").await.0,
        503,
        "not ready while the database is down"
    );
    a.assert_alive().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let up_at = load.elapsed();
    tokio::task::block_in_place(|| pg.start_server());
    let started = load.elapsed();
    // Recovery without restarting jointspace: the first success after the restart.
    let recovered = loop {
        let (s, _) = a
            .post_json(
                "/v1/collections/c/images/search",
                json!({"text": "a dog", "k": 3}),
            )
            .await;
        if s == 200 {
            break load.elapsed();
        }
        assert!(
            load.elapsed() - started < Duration::from_secs(30),
            "no recovery"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (outcomes, acked) = load.finish().await;
    let during = statuses(&outcomes, |o| o.at > stopped && o.done_by(up_at));
    let after = statuses(&outcomes, |o| o.at > recovered);
    let slowest = outcomes.iter().map(|o| o.took).max().unwrap_or_default();
    eprintln!(
        "{flags:?}: postgres down {down_at:?}..{up_at:?} (stopped at {stopped:?}, started at {started:?}, first \
         success {recovered:?}, {:?} after the start); statuses while down {during:?}, after recovery {after:?}, \
         slowest request {slowest:?}; before: {:?}",
        recovered - started,
        statuses(&outcomes, |o| o.done_by(down_at))
    );
    assert_clean_answers(&outcomes, "database");
    assert!(
        during.get(&503).copied().unwrap_or(0) > 0,
        "requests while down: {during:?}"
    );
    assert!(during.keys().all(|s| *s == 503), "while down: {during:?}");
    assert!(
        after.keys().all(|s| *s == 200 || *s == 201),
        "after recovery: {after:?}"
    );
    // No hang: bounded by the database timeout (2 s) plus the work itself.
    assert!(
        slowest < Duration::from_secs(6),
        "a request took {slowest:?}"
    );
    assert!(
        recovered - started < Duration::from_secs(10),
        "recovery took {:?}",
        recovered - started
    );

    // Every acknowledged write survived and is found, and the other replica follows again.
    assert_found_by_own_photo(&a, "c", &acked).await;
    let id = a.add_tagged("c", 1, "after").await;
    let t = Instant::now();
    loop {
        if b.tagged_hits("c", "after").await == [id] {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "replica B stopped following"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "{flags:?}: acknowledged during the test {}, each stored and the first hit of its own photo; replica B \
         caught up",
        acked.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_under_load_fails_cleanly_and_recovers() {
    postgres_restart_under_load(PgCluster::start(), &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_under_load_fails_cleanly_and_recovers_with_the_database_index() {
    postgres_restart_under_load(PgCluster::start_pgvector(), &DATABASE_INDEX).await;
}
