//! Metadata filters on both engines, through the API: every operator, dotted paths, logic, and type
//! strictness, each checked against the same predicate evaluated here on the metadata the test stored; the
//! filtered vector search returns exactly the matching images; a malformed filter is a 422 naming its path.

use crate::common;

use std::collections::BTreeSet;

use common::{
    BUNDLE, TestApp, b64, fixture_image,
    pg::{DATABASE_INDEX, PgCluster},
};
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
    // A dotted path names object keys, never array positions: "tags.0" is not the first tag, on either
    // engine or in the in-memory columns; "dims.0" is the key "0".
    if i % 3 == 0 {
        m["tags"] = json!(["red", "big"]);
        m["dims"] = json!({"0": "w"});
    }
    m
}

const N: usize = 16;

async fn seeded(url: &str, flags: &[&str]) -> TestApp {
    let app = TestApp::start_url(BUNDLE, url, flags).await;
    app.create_collection("shop").await;
    let images: Vec<Value> = (0..N)
        .map(|i| {
            // Every other image has a caption (the counts below).
            let captions: Vec<String> = (i % 2 == 0).then(|| format!("product {i}")).into_iter().collect();
            json!({"data": b64(&fixture_image(i % 8)), "external_id": format!("p{i}"), "metadata": metadata(i), "captions": captions})
        })
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
    // The total counts every match; a page of 2 holds at most 2 of them and reports the same total.
    let total = body["total"].as_i64().expect("total");
    assert_eq!(
        total as usize,
        body["images"].as_array().map_or(0, Vec::len),
        "{body}"
    );
    let (_, page) = app
        .get_json(&format!(
            "/v1/collections/shop/images?limit=2&offset=1&filter={q}"
        ))
        .await;
    assert_eq!(page["total"].as_i64(), Some(total), "{page}");
    assert_eq!(
        page["images"].as_array().map(Vec::len),
        Some((total as usize).saturating_sub(1).min(2))
    );
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

async fn every_operator_matches_what_it_says(url: &str, flags: &[&str]) {
    let app = seeded(url, flags).await;
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
        (json!({"tags.0": "red"}), BTreeSet::new()),
        (json!({"tags.0": {"$exists": true}}), BTreeSet::new()),
        (json!({"tags.1": {"$in": ["big"]}}), BTreeSet::new()),
        (json!({"tags.0": {"$gte": "a"}}), BTreeSet::new()),
        (json!({"tags.0": {"$ne": "red"}}), expected(|_| true)),
        (
            json!({"dims.0": "w"}),
            expected(|m| m.get("dims").is_some()),
        ),
        (
            json!({"dims.0": {"$exists": true}}),
            expected(|m| m.get("dims").is_some()),
        ),
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
    every_operator_matches_what_it_says(
        &format!("sqlite://{}", dir.path().join("f.db").display()),
        &[],
    )
    .await;
}

#[tokio::test]
async fn every_operator_matches_what_it_says_on_postgres() {
    let pg = PgCluster::start();
    every_operator_matches_what_it_says(&pg.create_db("filters").await, &[]).await;
}

#[tokio::test]
async fn every_operator_matches_what_it_says_with_the_database_index() {
    let pg = PgCluster::start_pgvector();
    every_operator_matches_what_it_says(&pg.create_db("filters").await, &DATABASE_INDEX).await;
}

#[tokio::test]
async fn score_orders_similarity_is_the_bundles_min_score_cuts_and_matches_counts_the_filter() {
    let dir = tempfile::tempdir().expect("tempdir");
    scores_and_matches(
        &format!("sqlite://{}", dir.path().join("s.db").display()),
        &[],
    )
    .await;
}

#[tokio::test]
async fn score_orders_similarity_is_the_bundles_min_score_cuts_and_matches_counts_the_filter_with_the_database_index()
 {
    let pg = PgCluster::start_pgvector();
    scores_and_matches(&pg.create_db("scores").await, &DATABASE_INDEX).await;
}

async fn scores_and_matches(url: &str, flags: &[&str]) {
    let app = seeded(url, flags).await;
    let search = |body: Value| {
        let app = &app;
        async move {
            let (s, r) = app
                .post_json("/v1/collections/shop/images/search", body)
                .await;
            assert_eq!(s, 200, "{r}");
            r
        }
    };
    let f = |h: &Value, k: &str| h[k].as_f64().expect(k);
    // A sentence under the fixture's hubness bank: score = similarity + the image's offset (<= 0).
    // By vector (the collection holds captions, so a sentence would otherwise search in hybrid mode).
    let r = search(json!({"text": "a dog runs", "k": N, "mode": "vector"})).await;
    let hits = r["results"].as_array().expect("results");
    assert_eq!(hits.len(), N);
    assert!(r.get("matches").is_none(), "no filter, no count: {r}");
    assert!(
        hits.windows(2)
            .all(|w| f(&w[0], "score") >= f(&w[1], "score"))
    );
    assert!(
        hits.iter()
            .all(|h| (-1.0..=1.0).contains(&f(h, "similarity")))
    );
    // The difference is the image's own offset: the same for another sentence, and not 0 everywhere.
    let offsets = |hits: &[Value]| -> std::collections::BTreeMap<i64, f64> {
        hits.iter()
            .map(|h| {
                (
                    h["image"]["id"].as_i64().expect("id"),
                    f(h, "score") - f(h, "similarity"),
                )
            })
            .collect()
    };
    let first = offsets(hits);
    let other = search(json!({"text": "two people on a red boat", "k": N, "mode": "vector"})).await;
    let second = offsets(other["results"].as_array().expect("results"));
    assert_eq!(first.len(), second.len());
    for (id, o) in &first {
        assert!(
            (o - second[id]).abs() < 1e-5,
            "image {id}: {o} vs {}",
            second[id]
        );
    }
    assert!(
        first.values().any(|o| o.abs() > 1e-4),
        "the bank's offsets show: {r}"
    );
    // A photo query on images takes no offset.
    let r = search(json!({"image_id": hits[0]["image"]["id"], "k": 5})).await;
    for h in r["results"].as_array().expect("results") {
        assert_eq!(f(h, "score"), f(h, "similarity"), "{h}");
    }
    // Annotation under the fixture's annotation bank: a photo query on captions scores each caption by
    // similarity + the caption's own offset (the same for another photo, not 0 everywhere); a sentence query
    // on captions takes none.
    let captions = |body: Value| {
        let app = &app;
        async move {
            let (s, r) = app
                .post_json("/v1/collections/shop/captions/search", body)
                .await;
            assert_eq!(s, 200, "{r}");
            r["results"].as_array().expect("results").clone()
        }
    };
    let caption_offsets = |hits: &[Value]| -> std::collections::BTreeMap<i64, f64> {
        hits.iter()
            .map(|h| {
                (
                    h["caption"]["id"].as_i64().expect("id"),
                    f(h, "score") - f(h, "similarity"),
                )
            })
            .collect()
    };
    let a = captions(json!({"image_id": hits[0]["image"]["id"], "k": 8})).await;
    let b = captions(json!({"image_id": hits[1]["image"]["id"], "k": 8})).await;
    assert!(a.windows(2).all(|w| f(&w[0], "score") >= f(&w[1], "score")));
    let (oa, ob) = (caption_offsets(&a), caption_offsets(&b));
    assert_eq!((oa.len(), ob.len()), (8, 8));
    for (id, o) in &oa {
        assert!(
            *o <= 0.0 && (o - ob[id]).abs() < 1e-5,
            "caption {id}: {o} vs {}",
            ob[id]
        );
    }
    assert!(
        oa.values().any(|o| o.abs() > 1e-4),
        "the annotation bank's offsets show: {a:?}"
    );
    for h in captions(json!({"text": "a dog runs", "k": 8})).await {
        assert_eq!(f(&h, "score"), f(&h, "similarity"), "{h}");
    }
    // min_score keeps the results at or above it: here the first five.
    let fifth = f(&hits[4], "score");
    let r =
        search(json!({"text": "a dog runs", "k": N, "min_score": fifth, "mode": "vector"})).await;
    let kept = r["results"].as_array().expect("results");
    assert!(kept.len() >= 5 && kept.len() < N, "{r}");
    assert!(kept.iter().all(|h| f(h, "score") >= fifth));
    // Lists count everything, whatever the page: 8 captions, one of them on p0.
    let (_, caps) = app.get_json("/v1/collections/shop/captions?limit=3").await;
    assert_eq!(
        (
            caps["total"].as_i64(),
            caps["captions"].as_array().map(Vec::len)
        ),
        (Some(8), Some(3))
    );
    let (_, p0) = app
        .get_json("/v1/collections/shop/images?external_id=p0")
        .await;
    let p0 = p0["images"][0]["id"].as_i64().expect("p0");
    let (_, caps) = app
        .get_json(&format!("/v1/collections/shop/captions?image_id={p0}"))
        .await;
    assert_eq!(caps["total"].as_i64(), Some(1), "{caps}");
    // A filter reports how many images it admits, whatever the page size.
    let r = search(
        json!({"text": "a dog", "k": 2, "filter": {"price": {"$gte": 100}}, "mode": "vector"}),
    )
    .await;
    assert_eq!(r["matches"], json!(N - 10), "{r}");
    assert_eq!(r["results"].as_array().map(Vec::len), Some(2));
    app.stop().await;
}
