//! Tenants: named keys from a keys file beside the environment's admin key. Each key's role decides what it
//! may do, a key limited to collections sees and touches only those, and per-key token buckets (requests and
//! inference rows) answer 429 with Retry-After; `/metrics` counts by key name and never shows a secret.

use crate::common;

use std::time::Duration;

use common::{TestApp, b64, fixture_image};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const ADMIN: &str = "tenants-admin-key-0001";
const SHOP_A: &str = "shop-a-secret-000001";
const SHOP_B: &str = "shop-b-secret-000002";
const VIEWER: &str = "viewer-secret-000003";
const LIMITED: &str = "limited-secret-00004";
const ROWSY: &str = "rowsy-secret-0000005";

struct Answer {
    status: StatusCode,
    body: Value,
    retry_after: Option<u64>,
}

async fn call(app: &TestApp, method: Method, path: &str, key: &str, body: Option<Value>) -> Answer {
    let mut r = app.client.request(method, app.url(path)).bearer_auth(key);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let res = r.send().await.expect("request");
    let status = res.status();
    let retry_after = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let body = res.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        body,
        retry_after,
    }
}

fn images(n: usize) -> Value {
    let imgs: Vec<Value> = (0..n)
        .map(|i| json!({"data": b64(&fixture_image(i % 8))}))
        .collect();
    json!({ "images": imgs })
}

#[tokio::test]
async fn keys_are_held_to_their_roles_collections_and_rates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = dir.path().join("keys.toml");
    // The viewer's secret is given as its digest: the file need not hold it in clear.
    let viewer_digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(VIEWER.as_bytes()))
    };
    std::fs::write(
        &keys,
        format!(
            r#"
[[key]]
name = "shop-a"
key = "{SHOP_A}"
role = "write"
collections = ["a"]

[[key]]
name = "shop-b"
key = "{SHOP_B}"
role = "write"
collections = ["b"]

[[key]]
name = "viewer"
sha256 = "{viewer_digest}"
role = "read"
collections = ["a"]

[[key]]
name = "limited"
key = "{LIMITED}"
role = "read"
requests_per_second = 0.5
burst = 2

[[key]]
name = "rowsy"
key = "{ROWSY}"
role = "write"
collections = ["a"]
rows_per_second = 0.1
rows_burst = 2
"#
        ),
    )
    .expect("keys file");
    let app = TestApp::start(
        &dir.path().join("t.db"),
        &[
            "--admin-key",
            ADMIN,
            "--keys-file",
            keys.to_str().expect("path"),
        ],
    )
    .await;
    for c in ["a", "b"] {
        let r = call(
            &app,
            Method::POST,
            "/v1/collections",
            ADMIN,
            Some(json!({"name": c})),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.body);
    }

    // A write key: its own collection only, and no collection management.
    let r = call(
        &app,
        Method::POST,
        "/v1/collections/a/images",
        SHOP_A,
        Some(images(1)),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = call(
        &app,
        Method::POST,
        "/v1/collections/b/images",
        SHOP_A,
        Some(images(1)),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("may not use collection \"b\"")
    );
    let r = call(&app, Method::GET, "/v1/collections/b/images", SHOP_A, None).await;
    assert_eq!(r.status, 403);
    let r = call(&app, Method::DELETE, "/v1/collections/a", SHOP_A, None).await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("needs an admin key")
    );
    let listed = |r: &Answer| -> Vec<String> {
        r.body["collections"]
            .as_array()
            .expect("collections")
            .iter()
            .map(|c| c["name"].as_str().expect("name").to_string())
            .collect()
    };
    assert_eq!(
        listed(&call(&app, Method::GET, "/v1/collections", SHOP_B, None).await),
        ["b"]
    );
    assert_eq!(
        listed(&call(&app, Method::GET, "/v1/collections", ADMIN, None).await),
        ["a", "b"]
    );
    let r = call(
        &app,
        Method::POST,
        "/v1/collections/b/images",
        SHOP_B,
        Some(images(1)),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);

    // A read key (known by its digest): searches its collection, writes nothing, sees no other.
    let r = call(
        &app,
        Method::POST,
        "/v1/collections/a/images/search",
        VIEWER,
        Some(json!({"text": "a dog", "k": 1})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = call(
        &app,
        Method::POST,
        "/v1/collections/a/images",
        VIEWER,
        Some(images(1)),
    )
    .await;
    assert_eq!(r.status, 403);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("needs a write or admin key")
    );
    assert_eq!(
        call(&app, Method::GET, "/v1/collections/b", VIEWER, None)
            .await
            .status,
        403
    );

    // Requests: a burst of 2, then 429 with Retry-After (a token every 2 s), then back after it. The rates
    // are slow so that a stalled CI machine cannot refill a bucket between two requests.
    for _ in 0..2 {
        assert_eq!(
            call(&app, Method::GET, "/v1/collections", LIMITED, None)
                .await
                .status,
            200
        );
    }
    let r = call(&app, Method::GET, "/v1/collections", LIMITED, None).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "rate_limited");
    assert_eq!(r.retry_after, Some(2));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        call(&app, Method::GET, "/v1/collections", LIMITED, None)
            .await
            .status,
        200
    );

    // Rows: a batch over the burst can never pass; within it, the bucket then refills at a row per 10 s.
    let r = call(
        &app,
        Method::POST,
        "/v1/collections/a/images",
        ROWSY,
        Some(images(3)),
    )
    .await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("at most 2 rows at once")
    );
    let r = call(
        &app,
        Method::POST,
        "/v1/collections/a/images",
        ROWSY,
        Some(images(2)),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = call(
        &app,
        Method::POST,
        "/v1/collections/a/images",
        ROWSY,
        Some(images(1)),
    )
    .await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.retry_after.is_some_and(|s| s >= 1));

    // Metrics by key name; no secret anywhere.
    let m = app.metrics().await;
    assert!(
        m.contains(r#"jointspace_key_requests_total{key="shop-a"}"#),
        "{m}"
    );
    assert!(
        m.contains(r#"jointspace_rate_limited_total{key="limited",limit="requests"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"jointspace_rate_limited_total{key="rowsy",limit="rows"} 2"#),
        "{m}"
    );
    for secret in [ADMIN, SHOP_A, SHOP_B, VIEWER, LIMITED, ROWSY] {
        assert!(!m.contains(secret));
    }
    app.stop().await;
}

#[tokio::test]
async fn a_keys_file_without_an_admin_or_with_a_clash_stops_the_start() {
    use jointspace::app::Application;
    use jointspace::config::ServeArgs;
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = dir.path().join("keys.toml");
    let start = |extra: Vec<&str>| {
        let mut flags = vec![
            "--addr",
            "127.0.0.1:0",
            "--bundle",
            common::BUNDLE,
            "--database-url",
            "sqlite::memory:",
            "--keys-file",
            keys.to_str().expect("path"),
        ];
        flags.extend(extra);
        ServeArgs::try_from_flags(flags).expect("flags")
    };
    std::fs::write(
        &keys,
        format!("[[key]]\nname = \"v\"\nkey = \"{VIEWER}\"\nrole = \"read\"\n"),
    )
    .expect("write");
    let e = Application::build(start(vec![]))
        .await
        .err()
        .expect("no admin key");
    assert!(format!("{e:#}").contains("none is an admin key"), "{e:#}");
    // The environment's admin key is named "admin": a file key of that name clashes.
    std::fs::write(
        &keys,
        format!("[[key]]\nname = \"admin\"\nkey = \"{VIEWER}\"\nrole = \"read\"\n"),
    )
    .expect("write");
    let e = Application::build(start(vec!["--admin-key", ADMIN]))
        .await
        .err()
        .expect("clash");
    assert!(
        format!("{e:#}").contains("two keys are named \"admin\""),
        "{e:#}"
    );
}
