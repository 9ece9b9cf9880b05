//! What production needs around the API: keys, limits, backpressure, request ids, CORS, metrics and a
//! graceful stop, on the real application (fixture bundle, ONNX Runtime, SQLite).

use crate::common;

use std::time::{Duration, Instant};

use common::{TestApp, b64, fixture_image};
use serde_json::json;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

const ADMIN: &str = "admin-key-for-tests-0001";
const READ: &str = "read-key-for-tests-00001";

async fn call(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    body: Option<serde_json::Value>,
) -> reqwest::Response {
    let mut r = app.client.request(method, app.url(path));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    r.send().await.expect("request")
}

async fn error_of(r: reqwest::Response) -> (u16, String, String) {
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.expect("error body is JSON");
    assert_eq!(body["error"]["status"], status, "{body}");
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_string(),
        body["error"]["message"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn keys_separate_admin_from_read_and_probes_stay_open() {
    use reqwest::Method;
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("admin.key");
    std::fs::write(&key_file, format!("{ADMIN}\n")).expect("key file");
    let kf = key_file.display().to_string();
    let app = TestApp::start(
        &dir.path().join("js.db"),
        &["--admin-key-file", &kf, "--read-key", READ],
    )
    .await;
    let coll = Some(json!({"name": "k"}));

    // No key, a wrong key, a malformed header: 401 with a Bearer challenge.
    let r = call(&app, Method::POST, "/v1/collections", None, coll.clone()).await;
    assert_eq!(
        r.headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap()),
        Some("Bearer")
    );
    assert_eq!(error_of(r).await.0, 401);
    let r = call(
        &app,
        Method::GET,
        "/v1/collections",
        Some("not-the-key-000000000"),
        None,
    )
    .await;
    assert_eq!(error_of(r).await.1, "unauthorized");
    let r = app
        .client
        .get(app.url("/v1/collections"))
        .header("authorization", format!("Basic {READ}"))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 401);

    // The read key reads but does not write: 403.
    let r = call(
        &app,
        Method::POST,
        "/v1/collections",
        Some(READ),
        coll.clone(),
    )
    .await;
    let (s, code, msg) = error_of(r).await;
    assert_eq!((s, code.as_str()), (403, "forbidden"), "{msg}");
    // The admin key (from the file, newline trimmed) writes.
    let r = call(&app, Method::POST, "/v1/collections", Some(ADMIN), coll).await;
    assert_eq!(r.status().as_u16(), 201);
    // Who may do what: the admin key writes, the read key reads (GET, search, embed) and nothing else.
    let img = json!({"images": [{"data": b64(&fixture_image(0)), "captions": ["a red square"]}]});
    let search = json!({"text": "a red square", "k": 1});
    let cases = [
        (
            Method::POST,
            "/v1/collections/k/images",
            ADMIN,
            Some(img.clone()),
            201,
        ),
        (
            Method::POST,
            "/v1/collections/k/images",
            READ,
            Some(img),
            403,
        ),
        (
            Method::POST,
            "/v1/collections/k/images/search",
            READ,
            Some(search),
            200,
        ),
        (
            Method::POST,
            "/v1/embed/text",
            READ,
            Some(json!({"texts": ["a dog"]})),
            200,
        ),
        (Method::GET, "/v1/collections/k/images", READ, None, 200),
        (Method::DELETE, "/v1/collections/k", READ, None, 403),
        (Method::POST, "/v1/admin/snapshot", READ, None, 403),
    ];
    for (method, path, key, body, want) in cases {
        let what = format!(
            "{method} {path} with the {} key",
            if key == ADMIN { "admin" } else { "read" }
        );
        let r = call(&app, method, path, Some(key), body).await;
        assert_eq!(r.status().as_u16(), want, "{what}");
    }

    // Probes, metrics and the spec need no key.
    for p in ["/healthz", "/readyz", "/metrics", "/openapi.yaml"] {
        let r = call(&app, Method::GET, p, None, None).await;
        assert_eq!(r.status().as_u16(), 200, "{p}");
    }
    app.stop().await;
}

#[tokio::test]
async fn bad_key_settings_refuse_to_start() {
    use jointspace::app::Application;
    use jointspace::config::ServeArgs;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("js.db").display());
    let base = [
        "--addr",
        "127.0.0.1:0",
        "--bundle",
        common::BUNDLE,
        "--database-url",
        &url,
    ];
    let cases: [(&[&str], &str); 4] = [
        (&["--admin-key", "short"], "at least 16"),
        (&["--read-key", READ], "none is an admin key"),
        (&["--admin-key", ADMIN, "--read-key", ADMIN], "the same"),
        (&["--admin-key-file", "/nonexistent/key"], "key file"),
    ];
    for (flags, want) in cases {
        let cfg =
            ServeArgs::try_from_flags(base.iter().chain(flags.iter()).copied()).expect("flags");
        let err = match Application::build(cfg).await {
            Ok(_) => panic!("{flags:?} started"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(want), "{flags:?}: {err}");
    }
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_stating_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("js.db"), &["--max-request-bytes", "4096"]).await;
    let big = json!({"texts": ["x".repeat(5000)]});
    let r = call(
        &app,
        reqwest::Method::POST,
        "/v1/embed/text",
        None,
        Some(big),
    )
    .await;
    let (s, code, msg) = error_of(r).await;
    assert_eq!((s, code.as_str()), (413, "payload_too_large"));
    assert!(msg.contains("the limit is 4096 bytes"), "{msg}");
    // Without a Content-Length (chunked), the extractor states it too.
    let port: u16 = app.base.rsplit(':').next().unwrap().parse().unwrap();
    let mut conn = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let payload = format!("{{\"texts\": [\"{}\"]}}", "y".repeat(5000));
    let req = format!(
        "POST /v1/embed/text HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{payload}\r\n0\r\n\r\n",
        payload.len()
    );
    conn.write_all(req.as_bytes()).await.expect("write");
    let res = read_response(&mut conn).await;
    assert!(res.starts_with("HTTP/1.1 413"), "{res}");
    assert!(res.contains("the limit is 4096 bytes"), "{res}");
    app.assert_alive().await;
    app.stop().await;
}

/// A body a little over the limit is read to its end before the 413, so a client still writing it gets the
/// answer rather than a reset connection (and may not retry a connection error), and the connection stays
/// open; one far over the limit is refused at once and its connection closed.
#[tokio::test]
async fn a_refused_body_is_read_so_the_413_arrives_and_the_connection_survives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("js.db"), &["--max-request-bytes", "4096"]).await;
    let port: u16 = app.base.rsplit(':').next().unwrap().parse().unwrap();
    let mut conn = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let body = "z".repeat(300_000);
    let head = format!(
        "POST /v1/embed/text HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("write head");
    // Long enough for a server that answers on the headers alone to have answered and closed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    conn.write_all(body.as_bytes())
        .await
        .expect("the whole body is taken");
    let res = read_response(&mut conn).await;
    assert!(res.starts_with("HTTP/1.1 413"), "{res}");
    assert!(res.contains("the limit is 4096 bytes"), "{res}");
    conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .expect("write the next request");
    let next = read_response(&mut conn).await;
    assert!(
        next.starts_with("HTTP/1.1 200"),
        "the same connection answers: {next}"
    );

    let mut far = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    far.write_all(
        b"POST /v1/embed/text HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
          content-length: 1000000000\r\n\r\n",
    )
    .await
    .expect("write head");
    let res = read_response(&mut far).await;
    assert!(res.starts_with("HTTP/1.1 413"), "{res}");
    assert!(
        res.to_ascii_lowercase().contains("connection: close"),
        "{res}"
    );
    app.assert_alive().await;
    app.stop().await;
}

/// A full inference queue answers 429 with Retry-After at once; nothing else fails, and it recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_inference_queue_is_a_429_with_retry_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Ten crops per image, one image per runtime call, and room for one image in the queue.
    let flags = [
        "--crop-mode",
        "ten",
        "--max-batch-crops",
        "10",
        "--inference-queue",
        "10",
    ];
    let app = std::sync::Arc::new(TestApp::start(&dir.path().join("js.db"), &flags).await);
    let files: Vec<String> = (0..8).map(|i| b64(&fixture_image(i))).collect();
    let mut seen_429 = false;
    for _attempt in 0..5 {
        let tasks: Vec<_> = (0..12)
            .map(|_| {
                let (app, files) = (app.clone(), files.clone());
                tokio::spawn(async move {
                    let t = Instant::now();
                    let r = app
                        .client
                        .post(app.url("/v1/embed/image"))
                        .json(&json!({"image": files[0]}))
                        .send()
                        .await
                        .expect("request");
                    let (s, retry) = (r.status().as_u16(), r.headers().get("retry-after").cloned());
                    (s, retry, t.elapsed(), r.text().await.unwrap_or_default())
                })
            })
            .collect();
        for t in tasks {
            let (s, retry, took, body) = t.await.expect("task");
            match s {
                200 => {}
                429 => {
                    seen_429 = true;
                    assert_eq!(
                        retry.as_ref().map(|v| v.to_str().unwrap()),
                        Some("1"),
                        "{body}"
                    );
                    assert!(body.contains("\"overloaded\""), "{body}");
                    assert!(
                        took < Duration::from_secs(5),
                        "a 429 must come at once, took {took:?}"
                    );
                }
                other => panic!("status {other}: {body}"),
            }
        }
        if seen_429 {
            break;
        }
    }
    assert!(
        seen_429,
        "12 concurrent ten-crop requests never filled a 10-crop queue"
    );
    let (s, r) = app
        .post_json("/v1/embed/image", json!({"image": files[1]}))
        .await;
    assert_eq!(s, 200, "after the burst: {r}");
    let metrics = app.metrics().await;
    let rejected: f64 = metrics
        .lines()
        .find(|l| l.starts_with("jointspace_inference_rejected_total{model=\"vision\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("rejected counter");
    assert!(rejected >= 1.0, "{metrics}");
    for name in [
        "jointspace_inference_batch_rows_bucket{le=\"16.0\",model=\"vision\"}",
        "jointspace_inference_queue_depth{model=\"vision\"}",
        "jointspace_http_requests_in_flight",
        "jointspace_http_requests_total{method=\"POST\",route=\"/v1/embed/image\",status=\"429\"}",
    ] {
        assert!(metrics.contains(name), "{name} missing from\n{metrics}");
    }
}

/// Sends the head of a request and part of its body on a raw connection, so the request is in flight.
async fn start_slow_request(port: u16, path: &str, body: &[u8], first: usize) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    s.write_all(&body[..first]).await.expect("write");
    s.flush().await.expect("flush");
    s
}

/// Reads one response (head and a Content-Length body), without waiting for the connection to close.
async fn read_response(s: &mut (impl AsyncRead + Unpin)) -> String {
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&out).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_string())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if out.len() >= end + 4 + len {
                    return;
                }
            }
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(20), read).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_request_past_the_timeout_is_a_503_and_the_server_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("js.db"), &["--request-timeout", "1"]).await;
    let port: u16 = app.base.rsplit(':').next().unwrap().parse().unwrap();
    let body = br#"{"texts": ["a dog on the beach"]}"#;
    // The body never completes: the handler waits for it until the timeout answers.
    let t = Instant::now();
    let mut s = start_slow_request(port, "/v1/embed/text", body, 5).await;
    let res = read_response(&mut s).await;
    assert!(res.starts_with("HTTP/1.1 503"), "{res}");
    assert!(
        res.contains("\"timeout\"") && res.contains("1s limit"),
        "{res}"
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    let (st, _) = app
        .post_json("/v1/embed/text", json!({"texts": ["a dog"]}))
        .await;
    assert_eq!(st, 200);
    app.stop().await;
}

#[tokio::test]
async fn a_body_that_stalls_or_trickles_is_a_408_and_the_server_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(
        &dir.path().join("js.db"),
        &["--body-read-timeout-ms", "300"],
    )
    .await;
    let port: u16 = app.base.rsplit(':').next().unwrap().parse().unwrap();
    let body = br#"{"texts": ["a dog runs along the beach with a ball in its mouth"]}"#;

    // Stalls: the head and five bytes, then nothing.
    let t = Instant::now();
    let mut s = start_slow_request(port, "/v1/embed/text", body, 5).await;
    let res = read_response(&mut s).await;
    assert!(res.starts_with("HTTP/1.1 408"), "{res}");
    assert!(
        res.contains("\"request_timeout\"") && res.contains("within 0.3s of its headers"),
        "{res}"
    );
    assert!(
        res.to_ascii_lowercase().contains("connection: close"),
        "{res}"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    // Trickles: a byte every 50 ms never leaves a gap of 300 ms, but the whole body would take 3 s.
    let t = Instant::now();
    let s = start_slow_request(port, "/v1/embed/text", body, 1).await;
    let (mut rd, mut wr) = s.into_split();
    let rest = body[1..].to_vec();
    let trickle = tokio::spawn(async move {
        for b in rest {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if wr.write_all(&[b]).await.is_err() {
                break;
            }
        }
    });
    let res = read_response(&mut rd).await;
    assert!(res.starts_with("HTTP/1.1 408"), "{res}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "answered after {:?}: the deadline is for the whole body",
        t.elapsed()
    );
    trickle.abort();

    // The server goes on, and a body that arrives in time is served.
    app.assert_alive().await;
    let (st, _) = app
        .post_json("/v1/embed/text", json!({"texts": ["a dog"]}))
        .await;
    assert_eq!(st, 200);
    assert!(
        app.metrics().await.contains(
            "jointspace_http_requests_total{method=\"POST\",route=\"/v1/embed/text\",status=\"408\"} 2"
        ),
        "both refusals are counted"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_write_whose_body_stops_arriving_is_let_go_and_stores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("js.db"), &["--request-timeout", "1"]).await;
    let port: u16 = app.base.rsplit(':').next().unwrap().parse().unwrap();
    // A write runs on past the 503 (it may be applying); one whose body never completes must not.
    let mut s = start_slow_request(port, "/v1/collections", br#"{"name": "half-sent"}"#, 5).await;
    let res = read_response(&mut s).await;
    assert!(res.starts_with("HTTP/1.1 503"), "{res}");
    // The client is still "sending": only the server ending the request's task closes the connection.
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 256];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the server still holds a write whose body stopped arriving"
    );
    let (st, _) = app.get_json("/v1/collections/half-sent").await;
    assert_eq!(st, 404);
    app.stop().await;
}

#[tokio::test]
async fn shutdown_drains_a_request_in_flight() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("js.db"), &[]).await;
    let (port, base) = (
        app.base.rsplit(':').next().unwrap().parse::<u16>().unwrap(),
        app.base.clone(),
    );
    let body = br#"{"name": "drained"}"#;
    let mut s = start_slow_request(port, "/v1/collections", body, 4).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // the server is reading the body
    let stopping = tokio::spawn(app.stop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !stopping.is_finished(),
        "the server stopped with a request in flight"
    );
    // New connections are refused while the old request finishes.
    assert!(
        reqwest::get(format!("{base}/healthz")).await.is_err(),
        "a new request was accepted after shutdown began"
    );
    s.write_all(&body[4..]).await.expect("rest of the body");
    let res = read_response(&mut s).await;
    assert!(res.starts_with("HTTP/1.1 201"), "{res}");
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("server stops after draining")
        .expect("stop task");
    // The drained write was committed.
    let url = format!("sqlite://{}", dir.path().join("js.db").display());
    let store = jointspace_store::Store::connect(&url).await.expect("db");
    assert!(store.collection("drained").await.is_ok());
}

#[tokio::test]
async fn request_ids_and_cors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(
        &dir.path().join("js.db"),
        &[
            "--cors-origins",
            "https://photos.example,https://admin.example",
        ],
    )
    .await;
    // A fresh id on every response, the client's own id echoed.
    let r = app
        .client
        .get(app.url("/v1/collections"))
        .send()
        .await
        .expect("r");
    let id = r
        .headers()
        .get("x-request-id")
        .expect("x-request-id")
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(id.len(), 36, "{id}");
    let r = app
        .client
        .get(app.url("/v1/collections"))
        .header("x-request-id", "trace-me-42")
        .send()
        .await
        .expect("r");
    assert_eq!(r.headers()["x-request-id"], "trace-me-42");
    // Preflight from an allowed origin, and from one that is not.
    let preflight = |origin: &'static str| {
        app.client
            .request(
                reqwest::Method::OPTIONS,
                app.url("/v1/collections/c/images/search"),
            )
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type",
            )
            .send()
    };
    let r = preflight("https://photos.example")
        .await
        .expect("preflight");
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://photos.example"
    );
    let r = preflight("https://evil.example").await.expect("preflight");
    assert!(r.headers().get("access-control-allow-origin").is_none());
    app.stop().await;
}

/// The server warms up before it listens (else the first searches after a start are the slow ones): its
/// text graph has run on every common query shape, one to four sentences of one to twenty words, before the
/// first request arrives.
#[tokio::test]
async fn the_text_graph_is_warm_before_the_first_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("js.db"), &[]).await;
    let m = common::metrics_text(&app.client, &app.base).await;
    let warmed: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("jointspace_embedded_items_total{kind=\"text\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no text embeddings counted before any request:\n{m}"));
    assert_eq!(
        warmed,
        4 * 20,
        "20 sentences in batches of one, two, three and four"
    );
    app.stop().await;
}

/// The memory index's graph settings are the operator's (`--hnsw-m`, `--hnsw-ef-construction`), the index's own
/// defaults otherwise, and a value out of range is refused at start, naming the range.
#[test]
fn the_graph_settings_are_the_operators() {
    use jointspace::{app::index_params, config::ServeArgs};
    let default = ServeArgs::try_from_flags(std::iter::empty::<&str>()).expect("flags");
    let p = index_params(&default.store);
    assert_eq!(
        (p.max_connections, p.ef_construction),
        (
            jointspace_service::DEFAULT_MAX_CONNECTIONS,
            jointspace_service::DEFAULT_EF_CONSTRUCTION
        )
    );
    let set = ServeArgs::try_from_flags(["--hnsw-m", "8", "--hnsw-ef-construction", "40"])
        .expect("flags");
    let p = index_params(&set.store);
    assert_eq!((p.max_connections, p.ef_construction), (8, 40));
    let err = ServeArgs::try_from_flags(["--hnsw-m", "1"])
        .expect_err("one link a point is refused")
        .to_string();
    assert!(err.contains("--hnsw-m") && err.contains("2..=128"), "{err}");
}
