//! Every kind of bad input gets a clear 4xx in the one error shape, and the server keeps answering.

use crate::common;

use common::{TestApp, b64, fixture_image};
use serde_json::{Value, json};

/// A raw request body case: path, content type, body, expected status, what it checks.
type BodyCase = (
    &'static str,
    Option<&'static str>,
    Vec<u8>,
    u16,
    &'static str,
);

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
}

/// A PNG whose header says 20000x20000: a decompression bomb (400 MP) in a few dozen bytes.
fn bomb_png() -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&20000u32.to_be_bytes());
    ihdr.extend_from_slice(&20000u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    chunk(&mut png, b"IHDR", &ihdr);
    chunk(
        &mut png,
        b"IDAT",
        &[0x78, 0x9c, 0x63, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01],
    );
    chunk(&mut png, b"IEND", &[]);
    png
}

fn tiny_png() -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    image::RgbImage::new(1, 1)
        .write_to(&mut out, image::ImageFormat::Png)
        .expect("encode");
    out.into_inner()
}

fn assert_error(status: u16, body: &Value, want: u16, what: &str) {
    assert_eq!(status, want, "{what}: {body}");
    assert_eq!(
        body["error"]["status"].as_u64(),
        Some(u64::from(want)),
        "{what}: error shape {body}"
    );
    let msg = body["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.len() > 10,
        "{what}: the message should say what to do: {body}"
    );
}

/// A server with a small request limit (so that "too large" is cheap to provoke), collection "c" and one
/// image "a" in it.
async fn server() -> (tempfile::TempDir, TestApp) {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(
        &dir.path().join("js.db"),
        &["--max-request-bytes", "200000"],
    )
    .await;
    app.create_collection("c").await;
    let (s, _) = app
        .post_json(
            "/v1/collections/c/images",
            json!({"images": [{"data": b64(&fixture_image(0)), "external_id": "a"}]}),
        )
        .await;
    assert_eq!(s, 201);

    (dir, app)
}

/// After the abuse: still serving, and still right.
async fn still_right(app: TestApp) {
    // Still serving, and still right.
    app.assert_alive().await;
    let (s, r) = app
        .post_multipart(
            "/v1/collections/c/images/search",
            vec![("q.png".into(), fixture_image(0))],
            &[],
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"][0]["image"]["external_id"], "a");
    app.stop().await;
}

/// Empty, truncated, non-image, too small and too large photos: upload, JSON upload, search and embed.
#[tokio::test]
async fn bad_images_are_refused_the_same_way_on_every_route() {
    let (_dir, app) = server().await;
    let png = fixture_image(1);
    let jpg = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/jpeg/fixture_4_q90.jpg"
    ))
    .expect("jpeg");
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("zero-byte", vec![], 400),
        ("truncated PNG", png[..png.len() / 2].to_vec(), 422),
        ("truncated JPEG", jpg[..jpg.len() / 2].to_vec(), 422),
        (
            "non-image",
            b"this is not an image, it is a sentence".to_vec(),
            415,
        ),
        ("1x1", tiny_png(), 422),
        ("20000x20000 PNG", bomb_png(), 413),
    ];
    for (what, bytes, want) in cases {
        let (s, body) = app
            .post_multipart(
                "/v1/collections/c/images",
                vec![("x.png".into(), bytes.clone())],
                &[],
            )
            .await;
        assert_error(s, &body, want, &format!("upload {what}"));
        let (s, body) = app
            .post_json(
                "/v1/collections/c/images",
                json!({"images": [{"data": b64(&bytes)}]}),
            )
            .await;
        assert_error(s, &body, want, &format!("JSON upload {what}"));
        let (s, body) = app
            .post_multipart(
                "/v1/collections/c/images/search",
                vec![("x.png".into(), bytes.clone())],
                &[],
            )
            .await;
        assert_error(s, &body, want, &format!("search by {what}"));
        let (s, body) = app
            .post_json("/v1/embed/image", json!({"image": b64(&bytes)}))
            .await;
        assert_error(s, &body, want, &format!("embed {what}"));
        app.assert_alive().await;
    }

    still_right(app).await;
}

/// A body over `--max-request-bytes`, by multipart and by JSON.
#[tokio::test]
async fn bodies_over_the_request_limit_are_413() {
    let (_dir, app) = server().await;
    // Bodies over the request limit.
    let big = vec![7u8; 300_000];
    let (s, body) = app
        .post_multipart(
            "/v1/collections/c/images",
            vec![("big.png".into(), big.clone())],
            &[],
        )
        .await;
    assert_error(s, &body, 413, "multipart body over the limit");
    let (s, body) = app
        .post_json(
            "/v1/collections/c/images",
            json!({"images": [{"data": b64(&big)}]}),
        )
        .await;
    assert_error(s, &body, 413, "JSON body over the limit");
    app.assert_alive().await;

    still_right(app).await;
}

/// Bodies of a type the route does not read, and base64 that does not decode.
#[tokio::test]
async fn wrong_content_types_and_bad_base64_are_refused() {
    let (_dir, app) = server().await;
    // Wrong content types.
    let cases: [BodyCase; 4] = [
        (
            "/v1/collections/c/images",
            Some("text/plain"),
            b"hello".to_vec(),
            415,
            "text/plain upload",
        ),
        (
            "/v1/collections/c/images",
            Some("image/png"),
            fixture_image(0),
            415,
            "raw image/png upload",
        ),
        (
            "/v1/collections",
            None,
            br#"{"name":"x"}"#.to_vec(),
            415,
            "JSON without a content type",
        ),
        (
            "/v1/collections",
            Some("application/json"),
            b"{not json".to_vec(),
            400,
            "malformed JSON",
        ),
    ];
    for (path, content_type, body, status, what) in cases {
        let (s, r) = app.post_raw(path, content_type, body).await;
        assert_error(s, &r, status, what);
    }
    let (s, body) = app
        .post_json(
            "/v1/collections/c/images",
            json!({"images": [{"data": "@@@not base64@@@"}]}),
        )
        .await;
    assert_error(s, &body, 400, "bad base64");

    still_right(app).await;
}

/// Empty and overlong sentences, k out of range, two queries at once, bad filter keys, unknown image ids.
#[tokio::test]
async fn bad_queries_are_422_or_404() {
    let (_dir, app) = server().await;
    // Queries.
    let long = "dog ".repeat(2500);
    for (what, text) in [
        ("empty", ""),
        ("whitespace", "   \t\n "),
        ("10,000 characters", long.as_str()),
    ] {
        let (s, body) = app
            .post_json("/v1/collections/c/images/search", json!({ "text": text }))
            .await;
        assert_error(s, &body, 422, &format!("{what} query"));
        let (s, body) = app
            .post_json("/v1/embed/text", json!({ "texts": [text] }))
            .await;
        assert_error(s, &body, 422, &format!("{what} text to embed"));
        let (s, body) = app
            .post_json(
                "/v1/collections/c/captions",
                json!({ "captions": [{"text": text}] }),
            )
            .await;
        assert_error(s, &body, 422, &format!("{what} caption"));
    }
    for k in [0, 100_000] {
        let (s, body) = app
            .post_json(
                "/v1/collections/c/images/search",
                json!({"text": "a dog", "k": k}),
            )
            .await;
        assert_error(s, &body, 422, &format!("k = {k}"));
    }
    let (s, body) = app
        .post_json(
            "/v1/collections/c/images/search",
            json!({"text": "a dog", "k": -1}),
        )
        .await;
    assert_error(s, &body, 422, "k = -1");
    let (s, body) = app
        .post_json(
            "/v1/collections/c/images/search",
            json!({"text": "a dog", "image_id": 1}),
        )
        .await;
    assert_error(s, &body, 422, "two queries at once");
    let (s, body) = app
        .post_json(
            "/v1/collections/c/images/search",
            json!({"text": "a dog", "filter": {"bad key!": 1}}),
        )
        .await;
    assert_error(s, &body, 422, "bad filter key");
    let (s, body) = app
        .post_json(
            "/v1/collections/c/images/search",
            json!({"image_id": 999_999}),
        )
        .await;
    assert_error(s, &body, 404, "unknown image id");

    still_right(app).await;
}

/// What does not exist, or cannot be parsed, or is not an allowed name.
#[tokio::test]
async fn unknown_collections_routes_and_ids_are_404_or_400() {
    let (_dir, app) = server().await;
    // Unknown things.
    let (s, body) = app
        .post_json(
            "/v1/collections/nope/images/search",
            json!({"text": "a dog"}),
        )
        .await;
    assert_error(s, &body, 404, "unknown collection");
    let (s, body) = app
        .post_multipart(
            "/v1/collections/nope/images",
            vec![("x.png".into(), fixture_image(0))],
            &[],
        )
        .await;
    assert_error(s, &body, 404, "upload to an unknown collection");
    let (s, body) = app.get_json("/v1/collections/c/images/abc").await;
    assert_error(s, &body, 400, "non-numeric id");
    let (s, body) = app.get_json("/v1/no/such/route").await;
    assert_error(s, &body, 404, "unknown route");
    let (s, body) = app
        .post_json("/v1/collections", json!({"name": "Bad Name!"}))
        .await;
    assert_error(s, &body, 422, "bad collection name");

    still_right(app).await;
}

/// Duplicate names and external ids, and a batch with one bad image.
#[tokio::test]
async fn conflicts_are_409_and_a_failed_batch_stores_nothing() {
    let (_dir, app) = server().await;
    // Conflicts.
    let (s, body) = app.post_json("/v1/collections", json!({"name": "c"})).await;
    assert_error(s, &body, 409, "duplicate collection");
    let (s, body) = app
        .post_json(
            "/v1/collections/c/images",
            json!({"images": [{"data": b64(&fixture_image(2)), "external_id": "a"}]}),
        )
        .await;
    assert_error(s, &body, 409, "duplicate external id");
    let (s, body) = app
        .post_json("/v1/collections/c/images", json!({"images": [
            {"data": b64(&fixture_image(2)), "external_id": "b"}, {"data": b64(&fixture_image(3)), "external_id": "b"}]}))
        .await;
    assert_error(s, &body, 409, "duplicate external id within a batch");

    // A batch with one bad image stores nothing.
    let (s, body) = app
        .post_json("/v1/collections/c/images", json!({"images": [{"data": b64(&fixture_image(4)), "external_id": "ok"}, {"data": b64(b"junk")}]}))
        .await;
    assert_error(s, &body, 415, "batch with a bad image");
    let (_, c) = app.get_json("/v1/collections/c").await;
    assert_eq!(
        c["images"].as_i64(),
        Some(1),
        "nothing of the failed batch was stored"
    );

    still_right(app).await;
}
