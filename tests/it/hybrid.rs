//! Hybrid search on both engines and both index modes: product words the text model does not know find their
//! products by keyword (in captions, external ids and declared metadata fields), text fields are found by
//! meaning (embedded when written, again after a text-only change without the CNN), the channels fused by
//! calibrated scores with each hit's channel scores in the answer; the response names the unknown words;
//! the keyword index and the fields' sentences follow every write (PATCH, captions added and deleted,
//! upserts, deletes) in the same transaction.

use crate::common;

use common::{
    BUNDLE, TestApp, b64, fixture_image,
    pg::{DATABASE_INDEX, PgCluster},
};
use serde_json::{Value, json};

async fn search(app: &TestApp, collection: &str, body: Value) -> (u16, Value) {
    app.post_json(&format!("/v1/collections/{collection}/images/search"), body)
        .await
}

/// The external ids of a search's results, in order.
async fn found(app: &TestApp, collection: &str, body: Value) -> Vec<String> {
    let (s, r) = search(app, collection, body.clone()).await;
    assert_eq!(s, 200, "{body}: {r}");
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|h| {
            h["image"]["external_id"]
                .as_str()
                .unwrap_or("-")
                .to_string()
        })
        .collect()
}

async fn products(url: &str, flags: &[&str]) {
    let app = TestApp::start_url(BUNDLE, url, flags).await;
    let (s, c) = app
        .post_json(
            "/v1/collections",
            json!({"name": "shop", "text_fields": ["title", "brand.name", "tags"]}),
        )
        .await;
    assert_eq!(s, 201, "{c}");
    assert_eq!(c["text_fields"], json!(["title", "brand.name", "tags"]));
    let items = json!({"images": [
        {"data": b64(&fixture_image(0)), "external_id": "sku-4411",
         "metadata": {"title": "Espadrille canvas", "brand": {"name": "Nike"}, "price": 40},
         "captions": ["a red picture"]},
        {"data": b64(&fixture_image(1)), "external_id": "sku-2000",
         "metadata": {"title": "Loafer", "brand": {"name": "Acme"}, "tags": ["suede", "brown"], "price": 90},
         "captions": ["a dog runs on the beach"]},
        {"data": b64(&fixture_image(2)), "external_id": "sku-3000",
         "metadata": {"title": "a small green sandal", "brand": {"name": "Acme"}, "note": "espadrille style", "price": 20}},
        {"data": b64(&fixture_image(3)), "external_id": "sku-5000",
         "metadata": {"title": "Boot", "brand": {"name": "Zeta"}, "price": 120}}
    ]});
    let (s, r) = app.post_json("/v1/collections/shop/images", items).await;
    assert_eq!(s, 201, "{r}");
    let ids: Vec<i64> = r["images"]
        .as_array()
        .expect("images")
        .iter()
        .map(|i| i["id"].as_i64().expect("id"))
        .collect();

    // An unknown product word: named in the answer, and its product first by default (hybrid).
    let (s, r) = search(&app, "shop", json!({"text": "espadrille", "k": 4})).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["mode"], "hybrid");
    assert_eq!(r["unknown_words"], json!(["espadrille"]));
    assert_eq!(r["results"][0]["image"]["external_id"], "sku-4411", "{r}");
    assert!(
        r["results"][0]["score"]
            .as_f64()
            .expect("score")
            .is_finite()
    );
    assert!(r["results"][0]["similarity"].as_f64().is_some());
    // Each hit says what each channel made of it: the keyword match is there, the photo's score always.
    let why = &r["results"][0]["channels"];
    assert!(why["keyword"].as_f64().expect("keyword") > 0.0, "{r}");
    assert!(why["vector"].as_f64().is_some(), "{r}");
    let w = &r["weights"];
    let sum = ["vector", "text", "keyword"].map(|c| w[c].as_f64().expect("weight"));
    assert!((sum.iter().sum::<f64>() - 1.0).abs() < 1e-6, "{r}");
    // A field not declared searchable is not searched: sku-3000's "note" says espadrille too.
    assert_eq!(
        found(
            &app,
            "shop",
            json!({"text": "espadrille", "mode": "keyword"})
        )
        .await,
        vec!["sku-4411"]
    );
    for (q, want) in [
        ("sku-4411", "sku-4411"),
        ("NIKE shoes", "sku-4411"),
        ("brown suede", "sku-2000"),
        ("dogs running", "sku-2000"),
    ] {
        let got = found(&app, "shop", json!({"text": q, "k": 4})).await;
        assert_eq!(got[0], want, "{q}: {got:?}");
    }
    // Vector mode ranks every image by the sentence's vector; hybrid with the vector channel alone is the
    // vector ranking too.
    let vector = found(
        &app,
        "shop",
        json!({"text": "espadrille", "k": 4, "mode": "vector"}),
    )
    .await;
    assert_eq!(vector.len(), 4);
    let fused_as_vector = found(
        &app,
        "shop",
        json!({"text": "a dog runs", "k": 4, "channels": ["vector"]}),
    )
    .await;
    assert_eq!(
        fused_as_vector,
        found(
            &app,
            "shop",
            json!({"text": "a dog runs", "k": 4, "mode": "vector"})
        )
        .await
    );
    // Filters apply to both rankings.
    let (s, r) = search(
        &app,
        "shop",
        json!({"text": "espadrille", "filter": {"brand.name": "Acme"}}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["matches"], 2);
    assert!(
        r["results"]
            .as_array()
            .expect("results")
            .iter()
            .all(|h| h["image"]["metadata"]["brand"]["name"] == "Acme"),
        "{r}"
    );
    // Bad requests say what is wrong.
    let (s, e) = search(&app, "shop", json!({"image_id": ids[0], "mode": "hybrid"})).await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .expect("message")
            .contains("text")
    );
    let (s, _) = search(&app, "shop", json!({"text": "shoe", "keyword_weight": 2})).await;
    assert_eq!(s, 422);
    let (s, _) = search(&app, "shop", json!({"text": "shoe", "mode": "fuzzy"})).await;
    assert!(s == 400 || s == 422, "{s}");
    let (s, e) = search(&app, "shop", json!({"text": "shoe", "channels": []})).await;
    assert_eq!(s, 422, "{e}");
    let (s, e) = search(
        &app,
        "shop",
        json!({"text": "shoe", "mode": "vector", "channels": ["text"]}),
    )
    .await;
    assert_eq!(s, 422, "{e}");
    let (s, _) = search(
        &app,
        "shop",
        json!({"text": "shoe", "channels": ["colour"]}),
    )
    .await;
    assert!(s == 400 || s == 422, "{s}");

    // The words by meaning: each text field's sentences are embedded by the text model when the image is
    // written, so a sentence equal to one of them finds its image by the text channel alone (its vector is the
    // sentence's own: similarity 1), and no caption list shows them.
    let by_meaning = |r: &Value| {
        (
            r["results"][0]["image"]["external_id"]
                .as_str()
                .map(String::from),
            r["results"][0]["channels"]["text"].as_f64().unwrap_or(0.0),
        )
    };
    let (s, r) = search(
        &app,
        "shop",
        json!({"text": "a small green sandal", "channels": ["text"]}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let (first, sim) = by_meaning(&r);
    assert_eq!(first.as_deref(), Some("sku-3000"), "{r}");
    assert!(sim > 0.999, "{r}");
    assert_eq!(
        r["weights"],
        json!({"vector": 0.0, "text": 1.0, "keyword": 0.0}),
        "{r}"
    );
    let (s, r) = app
        .get_json(&format!("/v1/collections/shop/images/{}", ids[2]))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        r["captions"],
        json!([]),
        "a field's sentences are not captions: {r}"
    );
    // Caption search finds them, tagged with their field.
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/captions/search",
            json!({"text": "a small green sandal", "k": 1}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"][0]["caption"]["field"], "title", "{r}");
    assert_eq!(r["results"][0]["caption"]["image_id"], ids[2], "{r}");

    // The keyword index follows writes: a patched title, a caption added then deleted, a delete. The
    // patched title is embedded again by the text model alone: one sentence, no photo.
    let embedded = |m: &str, kind: &str| {
        let line = format!("jointspace_embedded_items_total{{kind=\"{kind}\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .map_or(0, |v| v.trim().parse::<u64>().expect("a count"))
    };
    let before = app.metrics().await;
    let (s, _) = app
        .client
        .patch(app.url(&format!("/v1/collections/shop/images/{}", ids[3])))
        .json(&json!({"metadata": {"title": "Chelsea boot on a white sofa"}}))
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .expect("patch");
    assert_eq!(s, 200);
    let after = app.metrics().await;
    assert_eq!(embedded(&after, "image"), embedded(&before, "image"));
    assert_eq!(embedded(&after, "text"), embedded(&before, "text") + 1);
    assert_eq!(
        found(&app, "shop", json!({"text": "chelsea", "mode": "keyword"})).await,
        vec!["sku-5000"]
    );
    let (_, r) = search(
        &app,
        "shop",
        json!({"text": "Chelsea boot on a white sofa", "channels": ["text"]}),
    )
    .await;
    assert_eq!(by_meaning(&r).0.as_deref(), Some("sku-5000"), "{r}");
    assert!(by_meaning(&r).1 > 0.999, "{r}");
    // The old title's sentence is gone: caption search (which sees every sentence) no longer has it.
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/captions/search",
            json!({"text": "Boot", "k": 100}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let texts: Vec<&str> = r["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|h| h["caption"]["text"].as_str())
        .collect();
    assert!(texts.contains(&"Chelsea boot on a white sofa"), "{r}");
    assert!(!texts.contains(&"Boot"), "the old title is gone: {r}");
    // A PATCH that leaves the text fields as they were embeds nothing.
    let before = app.metrics().await;
    let (s, _) = app
        .client
        .patch(app.url(&format!("/v1/collections/shop/images/{}", ids[3])))
        .json(&json!({"metadata": {"price": 130}}))
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .expect("patch");
    assert_eq!(s, 200);
    assert_eq!(
        embedded(&app.metrics().await, "text"),
        embedded(&before, "text")
    );
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/captions",
            json!({"captions": [{"text": "waterproof leather", "image_id": ids[2]}]}),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    let caption = r["ids"][0]
        .as_i64()
        .or_else(|| r["captions"][0]["id"].as_i64())
        .unwrap_or_else(|| panic!("caption id in {r}"));
    assert_eq!(
        found(
            &app,
            "shop",
            json!({"text": "waterproof", "mode": "keyword"})
        )
        .await,
        vec!["sku-3000"]
    );
    assert_eq!(
        app.delete(&format!("/v1/collections/shop/captions/{caption}"))
            .await,
        204
    );
    assert!(
        found(
            &app,
            "shop",
            json!({"text": "waterproof", "mode": "keyword"})
        )
        .await
        .is_empty()
    );
    assert_eq!(
        app.delete(&format!("/v1/collections/shop/images/{}", ids[0]))
            .await,
        204
    );
    assert!(
        found(
            &app,
            "shop",
            json!({"text": "espadrille nike", "mode": "keyword"})
        )
        .await
        .is_empty()
    );
    // An upsert that replaces the photo moves the text to the new id.
    let r = app
        .client
        .put(app.url("/v1/collections/shop/images/by-external-id/sku-2000"))
        .json(
            &json!({"data": b64(&fixture_image(5)), "metadata": {"title": "Moccasin in the park"}}),
        )
        .send()
        .await
        .expect("put");
    assert_eq!(r.status(), 200);
    let (s, r) = search(&app, "shop", json!({"text": "moccasin", "mode": "keyword"})).await;
    assert_eq!(s, 200);
    assert_eq!(r["results"].as_array().map(Vec::len), Some(1), "{r}");
    assert_ne!(r["results"][0]["image"]["id"].as_i64(), Some(ids[1]));
    let moccasin = r["results"][0]["image"]["external_id"].clone();
    let (_, r) = search(
        &app,
        "shop",
        json!({"text": "Moccasin in the park", "channels": ["text"]}),
    )
    .await;
    assert_eq!(r["results"][0]["image"]["external_id"], moccasin, "{r}");
    assert!(by_meaning(&r).1 > 0.999, "{r}");
    assert!(
        found(&app, "shop", json!({"text": "loafer", "mode": "keyword"}))
            .await
            .is_empty()
    );

    // A collection created without text_fields and without captions has no words to match: a sentence
    // searches it by vector.
    app.create_collection("plain").await;
    let (s, _) = app
        .post_json(
            "/v1/collections/plain/images",
            json!({"images": [{"data": b64(&fixture_image(2)), "external_id": "x-0"}]}),
        )
        .await;
    assert_eq!(s, 201);
    let (_, r) = search(&app, "plain", json!({"text": "espadrille"})).await;
    assert_eq!(r["mode"], "vector", "{r}");
    assert!(r.get("keyword_weight").is_none(), "{r}");
    // Once it holds captions, a sentence searches it in hybrid mode by default, leaning on the keywords as
    // far as the model does not know the sentence's words: all of them unknown, the keywords alone rank.
    let (s, _) = app
        .post_json(
            "/v1/collections/plain/images",
            json!({"images": [{"data": b64(&fixture_image(4)), "external_id": "x-1", "captions": ["a striped espadrille"]},
                              {"data": b64(&fixture_image(6)), "external_id": "x-2"}]}),
        )
        .await;
    assert_eq!(s, 201);
    let (_, r) = search(&app, "plain", json!({"text": "espadrille"})).await;
    assert_eq!(r["mode"], "hybrid", "{r}");
    assert_eq!(r["keyword_weight"], 1.0, "{r}");
    assert_eq!(r["results"][0]["image"]["external_id"], "x-1", "{r}");
    let weight = |r: &Value| r["keyword_weight"].as_f64().expect("keyword_weight");
    let (_, r) = search(&app, "plain", json!({"text": "a red espadrille"})).await;
    assert!((weight(&r) - (0.2 + 0.8 / 3.0)).abs() < 1e-6, "{r}");
    let (_, r) = search(&app, "plain", json!({"text": "a dog runs"})).await;
    assert_eq!(r["mode"].as_str(), Some("hybrid"), "{r}");
    assert!((weight(&r) - 0.2).abs() < 1e-6, "{r}");
    let w = &r["weights"];
    assert!(
        (w["vector"].as_f64().expect("vector") - 0.5).abs() < 1e-6,
        "{r}"
    );
    assert!(
        (w["text"].as_f64().expect("text") - 0.3).abs() < 1e-6,
        "{r}"
    );
    let (_, r) = search(
        &app,
        "plain",
        json!({"text": "espadrille", "keyword_weight": 0.25}),
    )
    .await;
    assert_eq!(weight(&r), 0.25, "an asked weight is kept: {r}");
    let (_, r) = search(
        &app,
        "plain",
        json!({"text": "espadrille", "mode": "vector"}),
    )
    .await;
    assert_eq!(r["mode"], "vector", "{r}");
    assert_eq!(
        found(
            &app,
            "plain",
            json!({"text": "espadrille", "mode": "hybrid"})
        )
        .await[0],
        "x-1"
    );
    // Caption search names unknown words too, and refuses keyword modes.
    let (s, r) = app
        .post_json(
            "/v1/collections/plain/captions/search",
            json!({"text": "a red espadrille"}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["unknown_words"], json!(["espadrille"]));
    let (s, _) = app
        .post_json(
            "/v1/collections/plain/captions/search",
            json!({"text": "a red espadrille", "mode": "keyword"}),
        )
        .await;
    assert_eq!(s, 422);
    // Deleting a collection takes its keyword rows with it (a new one of the same name starts empty).
    assert_eq!(app.delete("/v1/collections/plain").await, 204);
    assert_eq!(
        app.post_json(
            "/v1/collections",
            json!({"name": "plain", "text_fields": []})
        )
        .await
        .0,
        201
    );
    assert!(
        found(
            &app,
            "plain",
            json!({"text": "espadrille", "mode": "keyword"})
        )
        .await
        .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn product_words_find_their_products_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("h.db").display());
    products(&url, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn product_words_find_their_products_on_postgres() {
    let pg = PgCluster::start();
    let url = pg.create_db("hybrid").await;
    products(&url, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn product_words_find_their_products_with_the_database_index() {
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("hybrid").await;
    products(&url, &DATABASE_INDEX).await;
}

/// Four real photos, each with five sentences about it (or, `shifted`, about the next photo).
fn described_photos(shifted: bool) -> Value {
    let dir = format!("{}/.cache/photos", env!("CARGO_MANIFEST_DIR"));
    let photos: [(&str, [&str; 5]); 4] = [
        (
            "rocket.jpg",
            [
                "a rocket lifting off from its launch pad",
                "a space rocket launching into the sky",
                "smoke and fire under a rocket taking off",
                "a tall white rocket on a launch tower",
                "a rocket launch with a cloud of smoke",
            ],
        ),
        (
            "chelsea.png",
            [
                "a cat sitting and looking at the camera",
                "an orange tabby cat",
                "a cat with green eyes",
                "a kitten resting on the floor",
                "a ginger cat looks up",
            ],
        ),
        (
            "coffee.png",
            [
                "a cup of coffee on a saucer",
                "a white mug of coffee on a table",
                "coffee with foam in a cup",
                "a cup of hot coffee and a spoon",
                "a red cup of coffee",
            ],
        ),
        (
            "astronaut.png",
            [
                "an astronaut in a white space suit",
                "a woman astronaut smiling in front of a flag",
                "a person in a spacesuit holding a helmet",
                "an astronaut posing for a portrait",
                "a smiling woman in a space suit",
            ],
        ),
    ];
    let images: Vec<Value> = (0..4)
        .map(|i| {
            let (file, _) = photos[i];
            let data = std::fs::read(format!("{dir}/{file}")).unwrap_or_else(|e| {
                panic!("{dir}/{file}: {e} (scripts/test.sh fetches the photos: jointspace_train photos)")
            });
            let words = photos[(i + usize::from(shifted)) % 4].1;
            json!({"data": b64(&data), "external_id": file, "captions": words})
        })
        .collect();
    json!({ "images": images })
}

/// The photo's weight in a collection's hybrid searches follows how often its own sentences find it by the
/// photo alone: full where they do (12 of 20 here, chance being 5), none where every photo carries another's
/// sentences, the words then sharing the whole score in their tuned proportion.
async fn photo_trust(url: &str, flags: &[&str], stale: bool) {
    let Some(bundle) = common::shipped_bundle("flickr8k-vgg16-fne") else {
        return;
    };
    let app = TestApp::start_url(&bundle, url, flags).await;
    let weights =
        |r: &Value| ["vector", "text", "keyword"].map(|c| r["weights"][c].as_f64().expect(c));
    let mut described = vec![];
    for (name, shifted, want) in [
        ("described", false, [0.5, 0.3, 0.2]),
        ("swapped", true, [0.0, 0.6, 0.4]),
    ] {
        app.create_collection(name).await;
        let (s, r) = app
            .post_json(
                &format!("/v1/collections/{name}/images"),
                described_photos(shifted),
            )
            .await;
        assert_eq!(s, 201, "{r}");
        if !shifted {
            described = r["images"].as_array().expect("images").clone();
        }
        let (s, r) = search(&app, name, json!({"text": "a cat", "k": 4})).await;
        assert_eq!(s, 200, "{r}");
        assert_eq!(r["mode"], "hybrid", "{r}");
        let got = weights(&r);
        assert!(
            got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6),
            "{name}: {got:?}, want {want:?}"
        );
    }
    // Asked for the photo alone, a search weighs it alone, whatever its trust.
    let (_, r) = search(
        &app,
        "swapped",
        json!({"text": "a cat", "channels": ["vector"]}),
    )
    .await;
    assert_eq!(weights(&r), [1.0, 0.0, 0.0], "{r}");
    if !stale {
        return;
    }
    // A quarter of the described photos gone, its measure is stale: the next search answers at once with
    // it, and one task measures again in the background, however many searches come meanwhile.
    let measures = |m: &str| -> i64 {
        m.lines()
            .find_map(|l| {
                l.strip_prefix("jointspace_db_duration_seconds_count{op=\"sample_captions\"} ")
            })
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no sample_captions timing in {m}"))
    };
    assert_eq!(
        measures(&app.metrics().await),
        2,
        "one measure per collection"
    );
    let gone = described[3]["id"].as_i64().expect("id");
    assert_eq!(
        app.delete(&format!("/v1/collections/described/images/{gone}"))
            .await,
        204
    );
    for _ in 0..3 {
        let (s, r) = search(&app, "described", json!({"text": "a cat", "k": 3})).await;
        assert_eq!(s, 200, "{r}");
        assert_eq!(weights(&r), [0.5, 0.3, 0.2], "{r}");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while measures(&app.metrics().await) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the stale measure was never taken again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    search(&app, "described", json!({"text": "a cat", "k": 3})).await;
    assert_eq!(measures(&app.metrics().await), 3, "the new measure stands");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_photo_counts_as_far_as_its_own_words_find_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    photo_trust(
        &format!("sqlite://{}", dir.path().join("t.db").display()),
        &[],
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_photo_counts_as_far_as_its_own_words_find_it_with_the_database_index() {
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("trust").await;
    // (The database index counts a collection's images at most once a minute: the stale measure is tested
    // on the memory index.)
    photo_trust(&url, &DATABASE_INDEX, false).await;
}

/// A text field's weight scales its sentences' similarity by meaning (one sentence in two fields of two photos:
/// the field of weight 0.25 counts a quarter), 0 reads a field as keywords only (nothing embedded, still found
/// as a keyword), and a bad weight is refused with what a field must be. An export keeps the fields and their
/// weights for the collection an import makes.
async fn field_weights(url: &str, flags: &[&str]) {
    let app = TestApp::start_url(BUNDLE, url, flags).await;
    let (s, e) = app
        .post_json(
            "/v1/collections",
            json!({"name": "bad", "text_fields": [{"field": "name", "weight": 20}]}),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("from 0 to 10")),
        "{e}"
    );
    let fields =
        json!(["name", {"field": "note", "weight": 0.25}, {"field": "sku", "weight": 0.0}]);
    let (s, c) = app
        .post_json(
            "/v1/collections",
            json!({"name": "weighed", "text_fields": fields}),
        )
        .await;
    assert_eq!(s, 201, "{c}");
    assert_eq!(c["text_fields"], fields, "{c}");
    let sentence = "a dog runs on the beach";
    let items = json!({"images": [
        {"data": b64(&fixture_image(0)), "external_id": "named", "metadata": {"name": sentence}},
        {"data": b64(&fixture_image(1)), "external_id": "noted", "metadata": {"note": sentence}},
        {"data": b64(&fixture_image(2)), "external_id": "coded", "metadata": {"sku": "zq-77 boots"}}
    ]});
    let (s, r) = app.post_json("/v1/collections/weighed/images", items).await;
    assert_eq!(s, 201, "{r}");
    let (s, r) = search(
        &app,
        "weighed",
        json!({"text": sentence, "channels": ["text"], "k": 3}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let text_of = |id: &str| {
        r["results"]
            .as_array()
            .expect("results")
            .iter()
            .find(|h| h["image"]["external_id"] == id)
            .and_then(|h| h["channels"]["text"].as_f64())
    };
    let (named, noted) = (
        text_of("named").expect("named"),
        text_of("noted").expect("noted"),
    );
    assert!(named > 0.999, "{r}");
    assert!((noted - 0.25 * named).abs() < 1e-3, "{r}");
    assert_eq!(r["results"][0]["image"]["external_id"], "named", "{r}");
    // The weight-0 field has no sentence to find by meaning, and is a keyword like any other field.
    let (s, r) = app
        .post_json(
            "/v1/collections/weighed/captions/search",
            json!({"text": "zq-77 boots", "k": 10}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert!(
        r["results"]
            .as_array()
            .expect("results")
            .iter()
            .all(|h| h["caption"]["field"] != "sku"),
        "{r}"
    );
    assert_eq!(
        found(&app, "weighed", json!({"text": "zq-77", "mode": "keyword"})).await,
        vec!["coded"]
    );
    // An export carries the fields; imported under another name, the collection weighs them as this one.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("weighed.jsonl");
    let r = app
        .client
        .get(app.url("/v1/collections/weighed/export"))
        .send()
        .await
        .expect("export");
    assert_eq!(r.status(), 200);
    std::fs::write(&file, r.text().await.expect("body")).expect("write the export");
    app.stop().await;
    let (ok, out) = common::outcome(
        &common::jointspace(url)
            .args([
                "import",
                file.to_str().expect("utf-8"),
                "--collection",
                "copy",
            ])
            .output()
            .expect("run import"),
    );
    assert!(ok, "{out}");
    let app = TestApp::start_url(BUNDLE, url, flags).await;
    let (s, c) = app.get_json("/v1/collections/copy").await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["text_fields"], fields, "{c}");
    let (s, r) = search(
        &app,
        "copy",
        json!({"text": sentence, "channels": ["text"], "k": 3}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"][0]["image"]["external_id"], "named", "{r}");
    assert!(
        (r["results"][1]["channels"]["text"].as_f64().unwrap_or(0.0) - 0.25 * named).abs() < 1e-3,
        "{r}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_counts_by_meaning_as_much_as_its_weight_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("w.db").display());
    field_weights(&url, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_counts_by_meaning_as_much_as_its_weight_with_the_database_index() {
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("weights").await;
    field_weights(&url, &DATABASE_INDEX).await;
}

/// Postgres ranks keywords without touching every image that holds a common word: a word the statistics put
/// in more than 1,000 rows matches only where every word of the sentence does, while a rare word finds every
/// image that holds it. (Ranking all 1,200 "red" images for "red boot" is what cost 80 ms a search at 100k.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_common_word_matches_only_with_the_rest_of_the_sentence_on_postgres() {
    use jointspace_core::{TextField, filter::Filter};
    use jointspace_store::{CollectionSettings, KeywordQuery, NewImage, Provenance, Store};
    let pg = PgCluster::start();
    let url = pg.create_db("common_words").await;
    let store = Store::connect(&url).await.expect("connect");
    let c = store
        .create_collection_with(
            "shop",
            "",
            &CollectionSettings {
                text_fields: Some(vec![TextField::new("title")]),
                group_by: None,
            },
        )
        .await
        .expect("collection");
    // The statistics are taken when the test says (autovacuum could take them at any time).
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query("ALTER TABLE image_text SET (autovacuum_enabled = false)")
        .execute(&mut conn)
        .await
        .expect("alter");
    let title = |i: usize| match i {
        0 => "red leather boot".to_string(),
        1 => "blue rubber boot".into(),
        2 => "sku zq-77 sandal".into(),
        _ if i < 1200 => format!("red shoe model {i}"),
        _ => format!("green hat model {i}"),
    };
    let rows: Vec<NewImage> = (0..1300)
        .map(|i| NewImage {
            external_id: Some(format!("p{i}")),
            metadata: json!({"title": title(i)}),
            width: 8,
            height: 8,
            code: vec![0; 4],
            vector: vec![0.0; 4],
            offset: 0.0,
            captions: vec![],
            thumbnail: None,
            content_hash: None,
        })
        .collect();
    let ids: Vec<i64> = store
        .insert_images(
            c.id,
            &rows,
            Provenance {
                bundle_id: "b",
                vision_id: "v",
            },
            None,
        )
        .await
        .expect("insert")
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let search = |q: &str| {
        let (store, q) = (&store, KeywordQuery::parse(q));
        async move {
            store
                .keyword_search(c.id, &q, &Filter::all(), 2000)
                .await
                .expect("keyword search")
                .into_iter()
                .map(|(id, _)| id)
                .collect::<Vec<i64>>()
        }
    };
    // Without statistics every word is rare: "red" matches all 1,198 images that hold it.
    assert_eq!(search("red boot").await.len(), 1199);
    sqlx::query("ANALYZE image_text")
        .execute(&mut conn)
        .await
        .expect("analyze");
    // With them "red" is common: the images holding "boot" (the one that also says red first), and the
    // images holding both; no image for "red" alone.
    let found = search("red boot").await;
    assert_eq!(found[0], ids[0]);
    let mut set = found.clone();
    set.sort_unstable();
    assert_eq!(set, vec![ids[0], ids[1]], "{found:?}");
    // A common word alone still finds what holds it, and a rare code finds its product.
    assert_eq!(search("red").await.len(), 1198);
    assert_eq!(search("zq-77").await, vec![ids[2]]);
    assert_eq!(search("a red shoe model 7").await[0], ids[7]);
}
