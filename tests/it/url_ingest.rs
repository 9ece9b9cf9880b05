//! URL ingest (`{"url": ...}` in place of `data`) against a real HTTP server started by the test: images,
//! slow, huge, redirecting and non-image answers; the address guard's refusals (loopback, private,
//! link-local, metadata; literal, resolved, and behind a redirect) before any connection; per-item errors,
//! all or nothing, and the bound on fetches in flight.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::{Path, Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::{TestApp, b64, fixture_image};

/// What the image server saw: requests in all, and the most in flight at once.
#[derive(Default)]
struct Seen {
    hits: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// The image server (`origin`); sync.rs fetches a feed's photos from it too.
pub(crate) struct Origin {
    addr: SocketAddr,
    seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Origin {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn png(i: usize) -> Response {
    ([(header::CONTENT_TYPE, "image/png")], fixture_image(i)).into_response()
}

fn redirect(to: &str) -> Response {
    (StatusCode::FOUND, [(header::LOCATION, to.to_string())]).into_response()
}

/// A body of `n` bytes sent in 10 KB chunks, with no Content-Length.
fn streamed(n: usize, pause: Duration) -> Body {
    let chunks = (0..n.div_ceil(10_000)).map(move |i| (i, (n - i * 10_000).min(10_000)));
    Body::from_stream(
        futures::stream::iter(chunks).then(move |(i, len)| async move {
            if i > 0 {
                tokio::time::sleep(pause).await;
            }
            Ok::<_, std::io::Error>(vec![0x89u8; len])
        }),
    )
}

/// The image server, on `ip` port 0.
pub(crate) async fn origin(ip: &str) -> Origin {
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route(
            "/img/{n}",
            get(|Path(n): Path<String>| async move {
                png(n.trim_end_matches(".png").parse().unwrap_or(0))
            }),
        )
        .route("/untyped", get(|| async { fixture_image(2) }))
        .route(
            "/page.html",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    "<html><img src=\"/img/0.png\"></html>",
                )
            }),
        )
        .route(
            "/fake.png",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "image/png")],
                    "this is not a picture at all",
                )
            }),
        )
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, "no such image") }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                png(0)
            }),
        )
        // Headers at once, then a body that trickles for longer than the limit.
        .route(
            "/slow-body",
            get(|| async {
                Response::builder()
                    .header(header::CONTENT_TYPE, "image/png")
                    .body(streamed(50_000, Duration::from_millis(600)))
                    .expect("response")
            }),
        )
        .route(
            "/a-bit-slow/{n}",
            get(|Path(n): Path<usize>| async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                png(n)
            }),
        )
        .route(
            "/huge",
            get(|| async { ([(header::CONTENT_TYPE, "image/png")], vec![0u8; 300_000]) }),
        )
        .route(
            "/huge-stream",
            get(|| async {
                Response::builder()
                    .header(header::CONTENT_TYPE, "image/png")
                    .body(streamed(300_000, Duration::ZERO))
                    .expect("response")
            }),
        )
        .route(
            "/hops/{n}",
            get(|Path(n): Path<usize>| async move {
                if n == 0 {
                    png(1)
                } else {
                    redirect(&format!("/hops/{}", n - 1))
                }
            }),
        )
        .route(
            "/to",
            get(|Query(q): Query<HashMap<String, String>>| async move {
                redirect(q.get("u").map(String::as_str).unwrap_or("/"))
            }),
        )
        .layer(axum::middleware::from_fn_with_state(
            seen.clone(),
            |State(seen): State<Arc<Seen>>,
             req: axum::extract::Request,
             next: axum::middleware::Next| async move {
                seen.hits.fetch_add(1, Ordering::SeqCst);
                let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
                let r = next.run(req).await;
                seen.in_flight.fetch_sub(1, Ordering::SeqCst);
                r
            },
        ));
    let listener = tokio::net::TcpListener::bind(format!("{ip}:0"))
        .await
        .expect("bind the image server");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Origin { addr, seen, task }
}

async fn start(extra: &[&str]) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("js.db"), extra).await;
    app.create_collection("web").await;
    (app, dir)
}

async fn add(app: &TestApp, body: Value) -> (u16, Value) {
    app.post_json("/v1/collections/web/images", body).await
}

async fn add_urls(app: &TestApp, urls: &[String]) -> (u16, Value) {
    let images: Vec<Value> = urls.iter().map(|u| json!({ "url": u })).collect();
    add(app, json!({ "images": images })).await
}

async fn stored(app: &TestApp) -> i64 {
    let (s, r) = app.get_json("/v1/collections/web/images").await;
    assert_eq!(s, 200, "{r}");
    r["total"].as_i64().expect("total")
}

/// The outcome counts of `jointspace_url_fetches_total`.
async fn fetches(app: &TestApp, outcome: &str) -> i64 {
    let prefix = format!("jointspace_url_fetches_total{{outcome=\"{outcome}\"}} ");
    app.metrics()
        .await
        .lines()
        .find_map(|l| {
            l.strip_prefix(prefix.as_str())
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn is_off_by_default_and_says_how_to_turn_it_on() {
    let site = origin("127.0.0.1").await;
    let (app, _dir) = start(&[]).await;
    let (s, r) = add_urls(&app, &[site.url("/img/0.png")]).await;
    assert_eq!(s, 422, "{r}");
    assert_eq!(r["error"]["code"], "url_ingest_off");
    let msg = r["error"]["message"].as_str().expect("message");
    assert!(
        msg.contains("--url-ingest") && msg.contains("`data`"),
        "{msg}"
    );
    assert_eq!(site.seen.hits.load(Ordering::SeqCst), 0);
    // A password in the URL is not repeated back.
    let with_secret = site
        .url("/img/0.png")
        .replace("http://", "http://shop:s3cret@");
    let (s, r) = add_urls(&app, &[with_secret]).await;
    assert_eq!(s, 422, "{r}");
    let msg = r["error"]["message"].as_str().expect("message");
    assert!(
        msg.contains("shop:***@") && !msg.contains("s3cret"),
        "{msg}"
    );

    // Exactly one of data and url.
    let (s, r) = add(&app, json!({"images": [{"external_id": "x"}]})).await;
    assert_eq!(s, 422, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .expect("m")
            .contains("give `data`"),
        "{r}"
    );
    let (s, r) = add(
        &app,
        json!({"images": [{"data": b64(&fixture_image(0)), "url": site.url("/img/0.png")}]}),
    )
    .await;
    assert_eq!(s, 422, "{r}");
    assert!(
        r["error"]["message"].as_str().expect("m").contains("both"),
        "{r}"
    );
    assert_eq!(stored(&app).await, 0);
    app.stop().await;
}

#[tokio::test]
async fn ssrf_cases_are_refused_before_any_connection() {
    let site = origin("127.0.0.1").await;
    let port = site.addr.port();
    let (app, _dir) = start(&["--url-ingest", "--url-ingest-timeout-ms", "5000"]).await;
    let cases = [
        (
            format!("http://127.0.0.1:{port}/img/0.png"),
            "127.0.0.1 is a loopback address",
        ),
        (
            format!("http://localhost:{port}/img/0.png"),
            "localhost resolves to",
        ),
        (
            format!("http://[::1]:{port}/img/0.png"),
            "::1 is a loopback address",
        ),
        (
            format!("http://[::ffff:127.0.0.1]:{port}/img/0.png"),
            "is a loopback address",
        ),
        (
            format!("http://0x7f.1:{port}/img/0.png"),
            "127.0.0.1 is a loopback address",
        ),
        (format!("http://0.0.0.0:{port}/img/0.png"), "unspecified"),
        (
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "the cloud metadata address",
        ),
        (
            "http://[fd00:ec2::254]/latest/meta-data/".to_string(),
            "unique local",
        ),
        (
            "http://10.0.0.1/img.png".to_string(),
            "10.0.0.1 is a private address",
        ),
        (
            "https://192.168.1.1/img.png".to_string(),
            "a private address",
        ),
        ("http://100.64.0.1/img.png".to_string(), "carrier-grade NAT"),
        ("http://[fe80::1]/img.png".to_string(), "link-local"),
    ];
    for (url, why) in &cases {
        let t = std::time::Instant::now();
        let (s, r) = add_urls(&app, std::slice::from_ref(url)).await;
        assert_eq!(s, 422, "{url}: {r}");
        assert_eq!(r["error"]["code"], "url_forbidden", "{url}: {r}");
        let msg = r["error"]["message"].as_str().expect("message");
        assert!(
            msg.contains(why) && msg.contains("--url-ingest-allow"),
            "{url}: {msg}"
        );
        // Refused, not timed out: no connection was tried (10.0.0.1 and 169.254.169.254 would hang).
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "{url} took {:?}",
            t.elapsed()
        );
    }
    assert_eq!(
        site.seen.hits.load(Ordering::SeqCst),
        0,
        "the guard let a request through"
    );
    assert_eq!(fetches(&app, "forbidden").await, cases.len() as i64);

    // Not http(s), or not a URL: refused as such.
    for (url, code) in [
        ("file:///etc/passwd", "invalid_url"),
        ("gopher://example.com/", "invalid_url"),
        ("not a url", "invalid_url"),
    ] {
        let (s, r) = add_urls(&app, &[url.to_string()]).await;
        assert_eq!(
            (s, r["error"]["code"].as_str()),
            (422, Some(code)),
            "{url}: {r}"
        );
    }

    // A batch of them: nothing stored, every failure named in one answer.
    let urls: Vec<String> = cases.iter().take(3).map(|(u, _)| u.clone()).collect();
    let (s, r) = add_urls(&app, &urls).await;
    assert_eq!(s, 422, "{r}");
    let msg = r["error"]["message"].as_str().expect("message");
    assert!(
        msg.starts_with("no image was added (3 of 3 failed)"),
        "{msg}"
    );
    assert!(
        msg.contains("image 0:") && msg.contains("image 2:"),
        "{msg}"
    );
    assert_eq!(stored(&app).await, 0);
    app.stop().await;
}

#[tokio::test]
async fn fetches_through_the_allow_list_failing_one_by_one() {
    let site = origin("127.0.0.1").await;
    let port = site.addr.port();
    let (app, _dir) = start(&[
        "--url-ingest",
        "--url-ingest-allow",
        "127.0.0.0/8",
        "--url-ingest-timeout-ms",
        "1000",
        "--url-ingest-max-bytes",
        "100000",
    ])
    .await;
    let u = |p: &str| site.url(p);
    let batch = json!({"images": [
        {"url": u("/img/0.png"), "external_id": "web-0", "metadata": {"from": "web"}, "captions": ["a photo from the web"]},
        {"url": u("/page.html")},
        {"url": u("/missing")},
        {"url": u("/slow")},
        {"url": u("/slow-body")},
        {"url": u("/huge")},
        {"url": u("/huge-stream")},
        {"url": u("/fake.png")},
        {"url": u("/hops/3"), "external_id": "three-hops"},
        {"url": u("/hops/4")},
        {"url": u("/to?u=http://169.254.169.254/latest/meta-data/")},
        {"url": u(&format!("/to?u=http://[::1]:{port}/img/1.png"))},
        {"url": u("/to?u=http://10.0.0.1/img.png")},
        {"url": format!("http://localhost:{port}/untyped"), "external_id": "untyped"},
        {"data": b64(&fixture_image(3)), "external_id": "inline"},
    ]});
    let (s, r) = add(&app, batch).await;
    assert_eq!(s, 201, "{r}");
    // Fetched side by side (up to --url-ingest-concurrency, 8), not one after the other.
    assert!(site.seen.max_in_flight.load(Ordering::SeqCst) > 1);
    let added: Vec<(u64, &str)> = r["images"]
        .as_array()
        .expect("images")
        .iter()
        .map(|i| {
            (
                i["index"].as_u64().expect("index"),
                i["external_id"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        added,
        [
            (0, "web-0"),
            (8, "three-hops"),
            (13, "untyped"),
            (14, "inline")
        ]
    );
    let errors: Vec<(u64, &str)> = r["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| {
            (
                e["index"].as_u64().expect("index"),
                e["code"].as_str().expect("code"),
            )
        })
        .collect();
    assert_eq!(
        errors,
        [
            (1, "url_not_image"),
            (2, "url_status"),
            (3, "url_timeout"),
            (4, "url_timeout"),
            (5, "url_too_large"),
            (6, "url_too_large"),
            (7, "invalid_image"),
            (9, "url_redirects"),
            (10, "url_forbidden"),
            (11, "url_forbidden"),
            (12, "url_forbidden"),
        ]
    );
    let error = |i: usize| {
        r["errors"]
            .as_array()
            .expect("errors")
            .iter()
            .find(|e| e["index"] == i)
            .cloned()
            .expect("error")
    };
    assert_eq!(error(2)["url"], u("/missing"));
    let msg = |i: usize| error(i)["message"].as_str().expect("message").to_string();
    assert!(
        msg(1).contains("text/html") && msg(1).contains("not an image"),
        "{}",
        msg(1)
    );
    assert!(msg(2).contains("404"), "{}", msg(2));
    assert!(
        msg(3).contains("1000 ms") && msg(3).contains("--url-ingest-timeout-ms"),
        "{}",
        msg(3)
    );
    assert!(
        msg(5).contains("100000 bytes") && msg(5).contains("300000"),
        "{}",
        msg(5)
    );
    assert!(msg(6).contains("100000 bytes"), "{}", msg(6));
    assert!(msg(9).contains("more than 3 redirects"), "{}", msg(9));
    assert!(
        msg(10).contains("refused: a redirect to http://169.254.169.254/latest/meta-data/: 169.254.169.254 is the cloud metadata address"),
        "{}",
        msg(10)
    );
    assert!(msg(11).contains("::1 is a loopback address"), "{}", msg(11));
    // The allow-list lifted 127.0.0.0/8 only.
    assert!(
        msg(12).contains("10.0.0.1 is a private address"),
        "{}",
        msg(12)
    );

    // What was stored is searchable like any upload: the same picture comes first.
    assert_eq!(stored(&app).await, 4);
    let (s, found) = app
        .post_multipart(
            "/v1/collections/web/images/search",
            vec![("q.png".into(), fixture_image(0))],
            &[("k", "1".into())],
        )
        .await;
    assert_eq!(s, 200, "{found}");
    assert_eq!(found["results"][0]["image"]["external_id"], "web-0");
    assert!(found["results"][0]["score"].as_f64().expect("score") > 0.999);
    let (_, img) = app
        .get_json("/v1/collections/web/images?external_id=web-0")
        .await;
    assert_eq!(img["images"][0]["metadata"]["from"], "web");
    assert_eq!(
        fetches(&app, "ok").await,
        4,
        "web-0, fake.png, three-hops, untyped"
    );
    assert_eq!(fetches(&app, "timeout").await, 2);

    // All or nothing: one failure and nothing is stored.
    let (s, r) = add(
        &app,
        json!({"all_or_nothing": true, "images": [{"url": u("/img/4.png")}, {"url": u("/page.html")}]}),
    )
    .await;
    assert_eq!(s, 422, "{r}");
    assert_eq!(r["error"]["code"], "url_not_image");
    let m = r["error"]["message"].as_str().expect("message");
    assert!(
        m.starts_with("no image was added (all_or_nothing, and 1 of 2 failed): image 1: "),
        "{m}"
    );
    // Bytes that do not decode count as a failure too.
    let (s, r) = add(
        &app,
        json!({"all_or_nothing": true, "images": [{"url": u("/img/4.png")}, {"url": u("/fake.png")}]}),
    )
    .await;
    assert_eq!(
        (s, r["error"]["code"].as_str()),
        (422, Some("invalid_image")),
        "{r}"
    );
    assert_eq!(stored(&app).await, 4);

    // Every image failing is an error, not an empty 201.
    let (s, r) = add_urls(&app, &[u("/missing")]).await;
    assert_eq!(s, 422, "{r}");
    assert_eq!(r["error"]["code"], "url_status");
    assert!(
        r["error"]["message"]
            .as_str()
            .expect("m")
            .starts_with("image 0: http://"),
        "{r}"
    );

    // A bad `data` image still fails the whole request, naming its position.
    let (s, r) = add(
        &app,
        json!({"images": [{"url": u("/img/5.png")}, {"data": b64(b"not an image")}]}),
    )
    .await;
    assert_eq!(s, 415, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .expect("m")
            .starts_with("image 1: "),
        "{r}"
    );
    // As does a request-level fault, before anything is fetched.
    let hits = site.seen.hits.load(Ordering::SeqCst);
    let (s, r) = add(
        &app,
        json!({"images": [{"url": u("/img/5.png"), "external_id": "web-0"}, {"url": u("/img/6.png"), "external_id": "web-0"}]}),
    )
    .await;
    assert_eq!(s, 409, "{r}");
    assert_eq!(site.seen.hits.load(Ordering::SeqCst), hits);
    assert_eq!(stored(&app).await, 4);
    app.stop().await;
}

#[tokio::test]
async fn a_name_is_checked_after_resolution_on_every_hop_and_fetches_are_bounded() {
    // The image server on 127.0.0.2, the only range allowed: `localhost` (127.0.0.1, ::1) stays forbidden.
    let site = origin("127.0.0.2").await;
    let port = site.addr.port();
    let (app, _dir) = start(&[
        "--url-ingest",
        "--url-ingest-allow",
        "127.0.0.2/32",
        "--url-ingest-concurrency",
        "1",
    ])
    .await;
    let (s, r) = add_urls(&app, &[site.url("/img/0.png")]).await;
    assert_eq!(s, 201, "{r}");
    // A redirect to a name that resolves to a forbidden address.
    let (s, r) = add_urls(
        &app,
        &[site.url(&format!("/to?u=http://localhost:{port}/img/1.png"))],
    )
    .await;
    assert_eq!(s, 422, "{r}");
    assert_eq!(r["error"]["code"], "url_forbidden");
    let msg = r["error"]["message"].as_str().expect("message");
    assert!(msg.contains("localhost resolves to"), "{msg}");
    assert_eq!(
        site.seen.hits.load(Ordering::SeqCst),
        2,
        "the image, then the redirect only"
    );

    // One fetch in flight at a time across the server, whatever the batch.
    let urls: Vec<String> = (1..5)
        .map(|i| site.url(&format!("/a-bit-slow/{i}")))
        .collect();
    let (s, r) = add_urls(&app, &urls).await;
    assert_eq!(s, 201, "{r}");
    assert_eq!(r["images"].as_array().map(Vec::len), Some(4));
    assert_eq!(site.seen.max_in_flight.load(Ordering::SeqCst), 1);
    app.stop().await;
}

/// `jointspace import` of a catalogue (files and URLs) into `db`, run beside the image server.
async fn import(db: &str, file: &std::path::Path, extra: &[&str]) -> (bool, String) {
    let mut c = crate::common::jointspace(db);
    c.args(["import", "--collection", "shop", "--batch", "2"])
        .args(extra)
        .arg(file);
    let out = tokio::task::spawn_blocking(move || c.output().expect("runs"))
        .await
        .expect("joins");
    crate::common::outcome(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalogue_of_urls_imports_stops_at_a_dead_one_and_resumes() {
    let site = origin("127.0.0.1").await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("local.png"), fixture_image(1)).expect("write");
    let lines = [
        json!({"url": site.url("/img/0.png"), "external_id": "u0", "captions": ["a red dog"]}),
        json!({"path": "local.png", "external_id": "p1"}),
        json!({"url": site.url("/missing"), "external_id": "gone"}),
        json!({"url": site.url("/img/2.png"), "external_id": "u2", "metadata": {"from": "web"}}),
    ];
    let file = dir.path().join("catalogue.jsonl");
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&file, text.join("\n")).expect("write");
    let db = format!("sqlite://{}", dir.path().join("js.db").display());
    let allow = ["--url-ingest", "--url-ingest-allow", "127.0.0.0/8"];

    // URLs are fetched only when asked for, and loopback only when allowed.
    let (ok, out) = import(&db, &file, &[]).await;
    assert!(!ok && out.contains("--url-ingest"), "{out}");
    assert_eq!(site.seen.hits.load(Ordering::SeqCst), 0);
    let (ok, out) = import(&db, &file, &["--url-ingest"]).await;
    assert!(!ok && out.contains("catalogue.jsonl:1:"), "{out}");
    assert_eq!(site.seen.hits.load(Ordering::SeqCst), 0);

    // The first batch (lines 1-2) commits; the second stops at the dead URL, naming its line, and writes
    // nothing of that batch.
    let (ok, out) = import(&db, &file, &allow).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("catalogue.jsonl:3:") && out.contains("404"),
        "{out}"
    );
    let stored = |app: TestApp| async move {
        let (_, list) = app.get_json("/v1/collections/shop/images?limit=10").await;
        let mut ids: Vec<String> = list["images"]
            .as_array()
            .expect("images")
            .iter()
            .map(|i| i["external_id"].as_str().unwrap_or("").to_string())
            .collect();
        ids.sort();
        app.stop().await;
        ids
    };
    let app = TestApp::start(&dir.path().join("js.db"), &[]).await;
    assert_eq!(stored(app).await, ["p1", "u0"]);

    // Rerun with --skip-failed: resumes at the second batch, leaves the dead URL out and says so.
    let (ok, out) = import(&db, &file, &[&allow[..], &["--skip-failed"]].concat()).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("imported 1 images") && out.contains("1 photos given by URL were left out"),
        "{out}"
    );
    assert!(out.contains("catalogue.jsonl:3:"), "{out}");
    let app = TestApp::start(&dir.path().join("js.db"), &[]).await;
    let (_, hit) = app
        .get_json("/v1/collections/shop/images/by-external-id/u2")
        .await;
    assert_eq!(hit["metadata"]["from"], "web", "{hit}");
    assert_eq!(stored(app).await, ["p1", "u0", "u2"]);
}
