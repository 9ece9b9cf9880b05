//! Metadata filters on both engines, through the API: every operator, dotted paths, logic, and type
//! strictness, each checked against the same predicate evaluated here on the metadata the test stored; the
//! filtered vector search returns exactly the matching images; a malformed filter is a 422 naming its path.

use crate::common;

use std::collections::BTreeSet;

use common::{BUNDLE, TestApp, b64, fixture_image, pg::PgCluster};
use serde_json::{Value, json};

/// Image `i`'s metadata: numbers, strings, booleans, a nested object, a field only some have, and one field
/// whose type varies.
fn metadata(i: usize) -> Value {
    let brand = ["acme", "zeta", "Acme"][i % 3];
    let name = ["apple", "Banana", "cherry", "b"][i % 4];
    let mut m = json!({
        "price": i * 10,
        "in_stock": i % 2 == 0,
        "brand": {"name": brand, "country": "fr"},
        "name": name,
        "code": if i % 4 == 0 { json!(5) } else { json!("5") },
    });
    if i % 5 != 0 {
        let size = ["S", "M", "L"][i % 3];
        m["size"] = json!(size);
    }
    if i % 4 == 1 {
        m["discontinued"] = json!(true);
    }
    m
}

const N: usize = 16;

async fn seeded(url: &str) -> TestApp {
    let app = TestApp::start_url(BUNDLE, url, &[]).await;
    assert_eq!(
        app.post_json("/v1/collections", json!({"name": "shop"}))
            .await
            .0,
        201
    );
    let images: Vec<Value> = (0..N)
        .map(|i| json!({"data": b64(&fixture_image(i % 8)), "external_id": format!("p{i}"), "metadata": metadata(i)}))
        .collect();
    let (s, body) = app
        .post_json("/v1/collections/shop/images", json!({ "images": images }))
        .await;
    assert_eq!(s, 201, "{body}");
    app
}

async fn listed(app: &TestApp, filter: &Value) -> BTreeSet<String> {
    let q: String = filter
        .to_string()
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (s, body) = app
        .get_json(&format!(
            "/v1/collections/shop/images?limit=1000&filter={q}"
        ))
        .await;
    assert_eq!(s, 200, "{filter}: {body}");
    body["images"]
        .as_array()
        .expect("images")
        .iter()
        .map(|i| i["external_id"].as_str().expect("external id").to_string())
        .collect()
}

async fn searched(app: &TestApp, filter: &Value) -> BTreeSet<String> {
    let (s, body) = app
        .post_json(
            "/v1/collections/shop/images/search",
            json!({"text": "a dog runs", "k": 100, "filter": filter}),
        )
        .await;
    assert_eq!(s, 200, "{filter}: {body}");
    body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|h| {
            h["image"]["external_id"]
                .as_str()
                .expect("external id")
                .to_string()
        })
        .collect()
}

fn expected(pred: impl Fn(&Value) -> bool) -> BTreeSet<String> {
    (0..N)
        .filter(|i| pred(&metadata(*i)))
        .map(|i| format!("p{i}"))
        .collect()
}

async fn every_operator_matches_what_it_says(url: &str) {
    let app = seeded(url).await;
    let price = |m: &Value| m["price"].as_u64().expect("price");
    let cases: Vec<(Value, BTreeSet<String>)> = vec![
        (
            json!({"price": {"$gte": 30, "$lt": 80}}),
            expected(|m| (30..80).contains(&price(m))),
        ),
        (json!({"price": {"$gt": 100}}), expected(|m| price(m) > 100)),
        (
            json!({"price": {"$lte": 20.5}}),
            expected(|m| price(m) <= 20),
        ),
        (json!({"price": {"$ne": 40}}), expected(|m| price(m) != 40)),
        (json!({"size": "M"}), expected(|m| m["size"] == "M")),
        (
            json!({"size": {"$in": ["M", "L"]}}),
            expected(|m| m["size"] == "M" || m["size"] == "L"),
        ),
        // Like MongoDB: $nin and $ne also match images without the field.
        (
            json!({"size": {"$nin": ["M"]}}),
            expected(|m| m["size"] != "M"),
        ),
        (
            json!({"brand.name": "acme"}),
            expected(|m| m["brand"]["name"] == "acme"),
        ),
        (
            json!({"brand.country": {"$in": ["fr", "de"]}}),
            expected(|_| true),
        ),
        (
            json!({"$or": [{"in_stock": true}, {"price": {"$gt": 120}}]}),
            expected(|m| m["in_stock"] == true || price(m) > 120),
        ),
        (
            json!({"$not": {"in_stock": true}}),
            expected(|m| m["in_stock"] != true),
        ),
        (
            json!({"$and": [{"in_stock": false}, {"discontinued": {"$exists": true}}]}),
            expected(|m| m["in_stock"] == false && m.get("discontinued").is_some()),
        ),
        (
            json!({"discontinued": {"$exists": false}}),
            expected(|m| m.get("discontinued").is_none()),
        ),
        // Types are strict: a number is not the string of its digits, a boolean is not 1.
        (json!({"code": 5}), expected(|m| m["code"] == json!(5))),
        (json!({"code": "5"}), expected(|m| m["code"] == json!("5"))),
        (json!({"in_stock": 1}), BTreeSet::new()),
        // Strings order by their bytes on both engines: "Banana" < "apple" < "b" < "cherry".
        (
            json!({"name": {"$gt": "b"}}),
            expected(|m| m["name"].as_str().expect("name") > "b"),
        ),
        (
            json!({"name": {"$lt": "apple"}}),
            expected(|m| m["name"] == "Banana"),
        ),
        (json!({"nothing.here": {"$exists": true}}), BTreeSet::new()),
    ];
    for (filter, want) in &cases {
        assert_eq!(&listed(&app, filter).await, want, "list {filter}");
        // Fewer than --exact-below: the exact scan; the graph path under filters is the index's own test.
        assert_eq!(&searched(&app, filter).await, want, "search {filter}");
    }
    for (bad, names) in [
        (json!({"price": {"$gtx": 1}}), "price.$gtx"),
        (json!({"size": {"$in": "M"}}), "size.$in"),
        (json!({"$or": [{"a": 1}, 3]}), "$or[1]"),
    ] {
        let (s, body) = app
            .post_json(
                "/v1/collections/shop/images/search",
                json!({"text": "a dog", "filter": bad}),
            )
            .await;
        assert_eq!(s, 422, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_filter");
        let m = body["error"]["message"].as_str().expect("message");
        assert!(m.contains(&format!("\"{names}\"")), "{bad}: {m}");
    }
    app.stop().await;
}

#[tokio::test]
async fn every_operator_matches_what_it_says_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    every_operator_matches_what_it_says(&format!("sqlite://{}", dir.path().join("f.db").display()))
        .await;
}

#[tokio::test]
async fn every_operator_matches_what_it_says_on_postgres() {
    let pg = PgCluster::start();
    every_operator_matches_what_it_says(&pg.create_db("filters").await).await;
}
