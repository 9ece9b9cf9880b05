//! The annotation side of the hubness correction through the server, on both engines: every way a caption is
//! stored (with its image, alone, by an upsert) gives it the offset the bundle's image bank gives its vector,
//! a photo query on captions adds it (a sentence query does not), and it is read back after a restart.

use crate::common;

use std::collections::BTreeMap;

use common::{BUNDLE, TestApp, b64, fixture_image, pg::PgCluster};
use jointspace::app::load_pipeline;
use jointspace::config::ServeArgs;
use serde_json::{Value, json};

/// Each caption's offset as the server reports it (score minus similarity) for a photo query on captions.
async fn reported(app: &TestApp, image_id: i64) -> BTreeMap<String, f64> {
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/captions/search",
            json!({"image_id": image_id, "k": 20}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let f = |h: &Value, k: &str| h[k].as_f64().expect(k);
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|h| {
            (
                h["caption"]["text"].as_str().expect("text").to_string(),
                f(h, "score") - f(h, "similarity"),
            )
        })
        .collect()
}

fn check(got: &BTreeMap<String, f64>, want: &BTreeMap<String, f64>, when: &str) {
    assert_eq!(got.len(), want.len(), "{when}: {got:?}");
    for (t, o) in want {
        assert!(
            (got[t] - o).abs() < 1e-5,
            "{when}: {t:?} offset {} against the bank's {o}",
            got[t]
        );
    }
}

async fn captions_carry_their_offsets(url: &str) {
    let texts = [
        "a red shoe",
        "a dog runs on the beach",
        "two people on a boat",
    ];
    // What the bundle's own arithmetic gives each sentence: its vector, then the image bank's offset.
    let cfg = ServeArgs::try_from_flags(["--bundle", BUNDLE]).expect("flags");
    let pl = load_pipeline(&cfg.model).expect("fixture bundle loads");
    assert!(
        pl.bundle.annotation_hubness.is_some(),
        "the fixture has an image bank"
    );
    let vectors = pl
        .embed_texts(&texts.map(String::from))
        .await
        .expect("embeds");
    let (_, offsets) = pl.caption_offsets(vectors).await.expect("offsets");
    let want: BTreeMap<String, f64> = texts
        .iter()
        .zip(offsets)
        .map(|(t, o)| (t.to_string(), f64::from(o)))
        .collect();
    assert!(want.values().all(|o| *o < 0.0), "{want:?}");

    let app = TestApp::start_url(BUNDLE, url, &[]).await;
    app.create_collection("shop").await;
    // With its image (ingest), alone, and by an upsert.
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/images",
            json!({"images": [{"data": b64(&fixture_image(0)), "captions": [texts[0]]}]}),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    let image = r["images"][0]["id"].as_i64().expect("id");
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/captions",
            json!({"captions": [{"text": texts[1]}]}),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    let r = app
        .client
        .put(app.url("/v1/collections/shop/images/by-external-id/sku-1"))
        .json(&json!({"data": b64(&fixture_image(1)), "captions": [texts[2]]}))
        .send()
        .await
        .expect("put");
    assert_eq!(r.status().as_u16(), 201);

    check(&reported(&app, image).await, &want, "as stored");
    // A sentence query on captions takes none.
    let (_, r) = app
        .post_json(
            "/v1/collections/shop/captions/search",
            json!({"text": "a shoe", "k": 3}),
        )
        .await;
    for h in r["results"].as_array().expect("results") {
        assert_eq!(h["score"], h["similarity"], "{h}");
    }
    // The index is rebuilt at start; the offsets come back from the database.
    app.stop().await;
    let app = TestApp::start_url(BUNDLE, url, &[]).await;
    check(&reported(&app, image).await, &want, "after a restart");
    app.stop().await;
}

#[tokio::test]
async fn captions_carry_their_offsets_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    captions_carry_their_offsets(&format!("sqlite://{}", dir.path().join("a.db").display())).await;
}

#[tokio::test]
async fn captions_carry_their_offsets_on_postgres() {
    let pg = PgCluster::start();
    captions_carry_their_offsets(&pg.create_db("annotation").await).await;
}
