//! Readiness that tells the truth: `/readyz` is 503, saying why, when an inference worker is wedged or dead,
//! when a collection's index is not loaded, or when the indexes stopped following the database; 200 when
//! every part is well. On the real application with the fixture bundle; the faults come from a backend
//! that wraps the real one and wedges or dies on cue.

use crate::common;

use std::{
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use common::{BUNDLE, TestApp};
use jointspace::app;
use jointspace::config::ServeArgs;
use jointspace_embed::runtime::{Backend, Provider, RuntimeError};
use jointspace_service::ReadyOptions;
use jointspace_service::metrics::Metrics;
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Healthy,
    /// Text runs block until the mode changes (a session stuck in a run).
    Wedged,
    /// The next text run panics: the worker thread ends.
    Dead,
}

/// The real backend, with its text graph wedged or killed on cue.
struct Faulty {
    inner: Arc<dyn Backend>,
    mode: Arc<(Mutex<Mode>, Condvar)>,
}

impl Backend for Faulty {
    fn provider(&self) -> Provider {
        self.inner.provider()
    }

    fn vision(
        &self,
        graph: usize,
        crops: &[f32],
        n: usize,
        side: usize,
    ) -> Result<Vec<f32>, RuntimeError> {
        self.inner.vision(graph, crops, n, side)
    }

    fn vision_sessions(&self) -> usize {
        self.inner.vision_sessions()
    }

    fn text(&self, ids: &[i64], lengths: &[i64]) -> Result<Vec<f32>, RuntimeError> {
        let (lock, changed) = &*self.mode;
        let mut mode = lock.lock().unwrap();
        while *mode == Mode::Wedged {
            mode = changed.wait(mode).unwrap();
        }
        let dead = *mode == Mode::Dead;
        drop(mode);
        assert!(!dead, "the text worker dies here (a test's fault)");
        self.inner.text(ids, lengths)
    }
}

fn set(mode: &(Mutex<Mode>, Condvar), m: Mode) {
    *mode.0.lock().unwrap() = m;
    mode.1.notify_all();
}

/// A server on SQLite in `dir` whose text runs go through `Faulty` (healthy until the test says otherwise),
/// with a 300 ms probe timeout.
async fn start_faulty(dir: &std::path::Path) -> (TestApp, Arc<(Mutex<Mode>, Condvar)>) {
    let url = format!("sqlite://{}", dir.join("js.db").display());
    let mode = Arc::new((Mutex::new(Mode::Healthy), Condvar::new()));
    let m = mode.clone();
    let app = TestApp::start_wrapped(
        BUNDLE,
        &url,
        &["--ready-probe-timeout-ms", "300"],
        move |inner| Arc::new(Faulty { inner, mode: m }),
    )
    .await;
    (app, mode)
}

/// Polls `/readyz` until it answers `status`; returns the body and how long the last call took.
async fn readyz_until(app: &TestApp, status: u16) -> (Value, Duration) {
    let t0 = Instant::now();
    loop {
        let t = Instant::now();
        let (s, body) = app.get_json("/readyz").await;
        if s == status {
            return (body, t.elapsed());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "/readyz never answered {status}; last: {s} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_or_dead_inference_worker_is_not_ready_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (app, mode) = start_faulty(dir.path()).await;

    let (s, body) = app.get_json("/readyz").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["ready"], true);
    assert_eq!(body["execution_provider"], "cpu", "{body}");
    for part in ["vision", "text", "database", "index"] {
        assert_eq!(body["checks"][part]["ok"], true, "{part}: {body}");
    }
    assert!(body.get("message").is_none(), "{body}");

    // Wedged: once the last good run is more than a second old, the probe waits its 300 ms and gives up.
    set(&mode, Mode::Wedged);
    let (body, took) = readyz_until(&app, 503).await;
    assert_eq!(body["ready"], false);
    assert_eq!(body["bundle"], false);
    assert_eq!(body["checks"]["text"]["ok"], false, "{body}");
    let reason = body["checks"]["text"]["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("text graph") && reason.contains("did not answer a probe within 300 ms"),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap_or("").contains(reason),
        "{body}"
    );
    assert_eq!(body["checks"]["vision"]["ok"], true, "{body}");
    assert_eq!(body["checks"]["database"]["ok"], true, "{body}");
    assert!(
        took < Duration::from_secs(2),
        "/readyz must answer within about its probe timeout, took {took:?}"
    );
    app.assert_alive().await;

    // Unwedged: the queued probe comes back and the server is ready again.
    set(&mode, Mode::Healthy);
    readyz_until(&app, 200).await;

    // Dead: the worker thread ends on the next probe; readiness says so and stays off.
    set(&mode, Mode::Dead);
    let (body, _) = readyz_until(&app, 503).await;
    let reason = body["checks"]["text"]["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("the inference worker has stopped"),
        "{body}"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        app.get_json("/readyz").await.0,
        503,
        "a dead worker stays not ready"
    );
    // And the process is no longer alive for its purpose: liveness fails, so an orchestrator restarts it.
    let (status, body) = app.get_json("/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["status"]
            .as_str()
            .unwrap_or("")
            .contains("the text inference worker has stopped"),
        "{body}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reindex_under_way_is_not_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (app, mode) = start_faulty(dir.path()).await;
    app.create_collection("c").await;
    let (s, r) = app
        .post_json(
            "/v1/collections/c/captions",
            json!({"captions": [{"text": "a dog runs on the grass"}]}),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    // As if the caption came from an earlier bundle, so the reindex has it to re-embed.
    sqlx::any::install_default_drivers();
    let db = sqlx::AnyPool::connect(&format!("sqlite://{}", dir.path().join("js.db").display()))
        .await
        .expect("database");
    sqlx::query("UPDATE captions SET bundle_id = 'an-earlier-bundle'")
        .execute(&db)
        .await
        .expect("age the caption");
    // The reindex stops at the caption's text run while the text graph is wedged: not ready until it ends.
    set(&mode, Mode::Wedged);
    let reindex = {
        let (client, url) = (app.client.clone(), app.url("/v1/admin/reindex"));
        tokio::spawn(async move { client.post(url).json(&json!({})).send().await })
    };
    let t0 = Instant::now();
    loop {
        let (s, body) = app.get_json("/readyz").await;
        let reason = body["checks"]["index"]["reason"].as_str().unwrap_or("");
        if reason.contains("being rebuilt") {
            assert_eq!(s, 503, "{body}");
            assert_eq!(body["index"], false, "{body}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the reindex never showed: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    set(&mode, Mode::Healthy);
    let done = reindex.await.expect("task").expect("reindex answered");
    assert_eq!(done.status().as_u16(), 200);
    let (body, _) = readyz_until(&app, 200).await;
    assert_eq!(body["checks"]["index"]["ok"], true, "{body}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_without_its_index_is_not_ready_until_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("js.db");
    // `writer` creates collections the others learn of only through the database.
    let writer = TestApp::start(&db, &[]).await;
    let deaf = TestApp::start(&db, &["--follow-interval-ms", "0"]).await;
    // Follows once at start, then not for a minute: only readiness makes it catch up.
    let slow = TestApp::start(
        &db,
        &[
            "--follow-interval-ms",
            "60000",
            "--ready-max-lag-ms",
            "120000",
        ],
    )
    .await;
    for app in [&deaf, &slow] {
        assert_eq!(app.get_json("/readyz").await.0, 200);
    }
    writer.create_collection("late").await;

    // Not following the database, it never loads `late`: not ready, naming it.
    let (s, body) = deaf.get_json("/readyz").await;
    assert_eq!(s, 503, "{body}");
    assert_eq!(body["index"], false);
    let reason = body["checks"]["index"]["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("without a loaded index") && reason.contains("late"),
        "{body}"
    );

    // Following, readiness catches up at once instead of waiting for the next step, and says ready.
    let (s, body) = slow.get_json("/readyz").await;
    assert_eq!(s, 200, "{body}");
    let (s, r) = slow
        .post_json(
            "/v1/collections/late/images/search",
            json!({"text": "a dog", "k": 1}),
        )
        .await;
    assert_eq!(s, 200, "the collection's index is loaded: {r}");

    for app in [writer, deaf, slow] {
        app.stop().await;
    }
}

#[tokio::test]
async fn indexes_that_stop_following_the_database_are_not_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("js.db").display());
    let cfg = ServeArgs::try_from_flags(["--bundle", BUNDLE, "--database-url", url.as_str()])
        .expect("flags");
    let metrics = Arc::new(Metrics::new());
    let pipeline = app::load_pipeline_with(&cfg.model, &metrics).expect("pipeline");
    // A service whose follower never runs: its indexes are as current as its opening.
    let svc = app::open_service(pipeline, &cfg.store, metrics, None, app::Purpose::Search)
        .await
        .expect("service");
    let opts = ReadyOptions {
        probe_timeout: Duration::from_secs(5),
        max_lag: Some(Duration::from_millis(300)),
    };
    let r = svc.readiness(opts).await;
    assert!(r.ready(), "{r:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = svc.readiness(opts).await;
    assert!(!r.ready());
    let why = r.index.clone().expect_err("stale");
    assert!(
        why.contains("last caught up with the database") && why.contains("the limit is 300 ms"),
        "{why}"
    );
    assert!(
        r.vision.is_ok() && r.text.is_ok() && r.database.is_ok(),
        "{r:?}"
    );
    svc.follow_once().await.expect("follow");
    assert!(svc.readiness(opts).await.ready());

    // Not following at all: no lag to measure.
    let r = svc
        .readiness(ReadyOptions {
            max_lag: None,
            ..opts
        })
        .await;
    assert!(r.ready(), "{r:?}");
}

#[tokio::test]
async fn a_lag_limit_inside_the_follow_interval_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("js.db").display());
    let cfg = ServeArgs::try_from_flags([
        "--addr",
        "127.0.0.1:0",
        "--bundle",
        BUNDLE,
        "--database-url",
        url.as_str(),
        "--follow-interval-ms",
        "1000",
        "--ready-max-lag-ms",
        "1000",
    ])
    .expect("flags");
    let err = match app::Application::build(cfg).await {
        Ok(_) => panic!("started"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("--ready-max-lag-ms"), "{err}");
}
