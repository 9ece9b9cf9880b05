//! Products with several photos, on both engines and both index modes: a collection grouped by a product key
//! returns each product once in every mode (vector, keyword, hybrid, by a stored photo), its best photo
//! standing for it with all its photos listed, pages and counts by product, and finds a product by the words
//! of one photo and the look of another.

use std::collections::HashSet;

use crate::common;

use common::{
    BUNDLE, TestApp, b64, fixture_image,
    pg::{DATABASE_INDEX, PgCluster},
};
use serde_json::{Value, json};

async fn search(app: &TestApp, body: Value) -> Value {
    let (s, r) = app
        .post_json("/v1/collections/shop/images/search", body.clone())
        .await;
    assert_eq!(s, 200, "{body}: {r}");
    r
}

fn results(r: &Value) -> &Vec<Value> {
    r["results"].as_array().expect("results")
}

/// Each result's product key ("-" for an image that stands alone).
fn keys(r: &Value) -> Vec<String> {
    results(r)
        .iter()
        .map(|h| h["product"]["key"].as_str().unwrap_or("-").to_string())
        .collect()
}

fn ids(r: &Value) -> Vec<i64> {
    results(r)
        .iter()
        .map(|h| h["image"]["id"].as_i64().expect("id"))
        .collect()
}

async fn grouped(url: &str, flags: &[&str]) {
    let app = TestApp::start_url(BUNDLE, url, flags).await;
    let (s, e) = app
        .post_json(
            "/v1/collections",
            json!({"name": "bad", "group_by": "product id"}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .expect("message")
            .contains("group_by"),
        "{e}"
    );
    let (s, c) = app
        .post_json(
            "/v1/collections",
            json!({"name": "shop", "text_fields": ["title"], "group_by": "product_id"}),
        )
        .await;
    assert_eq!(s, 201, "{c}");
    assert_eq!(c["group_by"], "product_id");
    // p1: two photos, its words on the first only; p2: three photos; 7: a numeric key, one photo; and one
    // photo without a key, a product of its own.
    let photo = |i: usize, ext: &str, meta: Value| json!({"data": b64(&fixture_image(i)), "external_id": ext, "metadata": meta});
    let items = json!({"images": [
        photo(0, "p1", json!({"product_id": "p1", "title": "Espadrille canvas", "price": 40})),
        photo(1, "p1~2", json!({"product_id": "p1", "price": 40})),
        photo(2, "p2", json!({"product_id": "p2", "title": "Loafer", "price": 90})),
        photo(3, "p2~2", json!({"product_id": "p2", "price": 90})),
        photo(4, "p2~3", json!({"product_id": "p2", "price": 90})),
        photo(5, "n7", json!({"product_id": 7, "title": "Boot", "price": 120})),
        photo(6, "alone", json!({"price": 10})),
    ]});
    let (s, r) = app.post_json("/v1/collections/shop/images", items).await;
    assert_eq!(s, 201, "{r}");
    let id: Vec<i64> = r["images"]
        .as_array()
        .expect("images")
        .iter()
        .map(|i| i["id"].as_i64().expect("id"))
        .collect();

    for mode in ["vector", "hybrid", "keyword"] {
        let text = if mode == "keyword" {
            "espadrille loafer boot"
        } else {
            "a photo"
        };
        let r = search(&app, json!({"text": text, "k": 10, "mode": mode})).await;
        let k = keys(&r);
        let distinct: HashSet<&String> = k.iter().collect();
        assert_eq!(distinct.len(), k.len(), "{mode}: a product twice: {r}");
        if mode != "keyword" {
            assert_eq!(k.len(), 4, "{mode}: {r}");
        }
        for h in results(&r) {
            let photos: Vec<i64> = h["product"]["photos"]
                .as_array()
                .expect("photos")
                .iter()
                .map(|p| p.as_i64().expect("photo id"))
                .collect();
            assert_eq!(photos[0], h["image"]["id"].as_i64().expect("id"), "{r}");
            let want = match h["product"]["key"].as_str() {
                Some("p1") => 2,
                Some("p2") => 3,
                Some("7") => 1,
                None => 1,
                Some(other) => panic!("unknown product {other}: {r}"),
            };
            assert_eq!(photos.len(), want, "{mode}: {r}");
        }
    }

    // In vector mode the product is its best photo: the first of its photos in the ungrouped ranking, in
    // the same order.
    let body = |group: bool| json!({"text": "a photo", "k": 10, "mode": "vector", "group": group});
    let photos = search(&app, body(false)).await;
    assert_eq!(results(&photos).len(), 7);
    assert!(results(&photos).iter().all(|h| h.get("product").is_none()));
    let product_of = |h: &Value| match &h["image"]["metadata"]["product_id"] {
        Value::Null => format!("image {}", h["image"]["id"]),
        key => key.to_string(),
    };
    let mut seen = HashSet::new();
    let firsts: Vec<i64> = results(&photos)
        .iter()
        .filter(|h| seen.insert(product_of(h)))
        .map(|h| h["image"]["id"].as_i64().expect("id"))
        .collect();
    let products = search(&app, body(true)).await;
    assert_eq!(ids(&products), firsts, "{photos}\n{products}");

    // Pages are of products: the second page of two is the third and fourth product.
    let page = search(
        &app,
        json!({"text": "a photo", "k": 2, "offset": 2, "mode": "vector"}),
    )
    .await;
    assert_eq!(ids(&page), firsts[2..4].to_vec());
    // Counts are of products: p1 (2 photos) and the lone photo are under 50.
    let cheap = search(
        &app,
        json!({"text": "a photo", "filter": {"price": {"$lt": 50}}, "mode": "vector"}),
    )
    .await;
    assert_eq!(cheap["matches"], 2, "{cheap}");
    let cheap = search(
        &app,
        json!({"text": "espadrille", "filter": {"price": {"$lt": 100}}}),
    )
    .await;
    assert_eq!(cheap["matches"], 3, "{cheap}");

    // The words of p1's first photo find p1; the hit is whichever of its photos looks best, and the keyword
    // channel's score is the product's.
    let r = search(&app, json!({"text": "espadrille", "k": 3})).await;
    assert_eq!(r["mode"], "hybrid");
    assert_eq!(keys(&r)[0], "p1", "{r}");
    assert!(
        r["results"][0]["channels"]["keyword"]
            .as_f64()
            .expect("keyword")
            > 0.0,
        "{r}"
    );

    // More like a photo of p2: p2 itself is left out, each other product once.
    let r = search(&app, json!({"image_id": id[3], "k": 10})).await;
    let k = keys(&r);
    assert!(!k.contains(&"p2".to_string()), "{r}");
    assert_eq!(k.len(), 3, "{r}");

    // A photo moved to another product by its metadata moves in search.
    let s = app
        .client
        .patch(app.url(&format!("/v1/collections/shop/images/{}", id[1])))
        .json(&json!({"metadata": {"product_id": "p2", "price": 90}}))
        .send()
        .await
        .expect("patch")
        .status();
    assert_eq!(s, 200);
    let r = search(&app, json!({"text": "a photo", "k": 10, "mode": "vector"})).await;
    let p1 = results(&r)
        .iter()
        .find(|h| h["product"]["key"] == "p1")
        .expect("p1");
    assert_eq!(p1["product"]["photos"], json!([id[0]]), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn products_are_found_once_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("g.db").display());
    grouped(&url, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn products_are_found_once_on_postgres() {
    let pg = PgCluster::start();
    let url = pg.create_db("groups").await;
    grouped(&url, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn products_are_found_once_with_the_database_index() {
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("groups").await;
    grouped(&url, &DATABASE_INDEX).await;
}
