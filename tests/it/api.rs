//! The HTTP API end to end on the fixture bundle: real ONNX Runtime, HNSW, and each database engine
//! (SQLite, and a real Postgres server started for the test), app on port 0. Every test runs on both engines
//! (`<test>::sqlite`, `<test>::postgres`), each on a shop of 8 images and 16 captions of its own, and once
//! more on Postgres with the vector index in the database (`<test>::database_index`: pgvector, no graph).

use std::path::PathBuf;

use serde_json::json;

use crate::common::{
    BUNDLE, TestApp, b64, fixture_image, gauge,
    pg::{DATABASE_INDEX, PgCluster},
};

/// A database of the engine under test and an index folder beside it, both gone when the test ends.
struct Db {
    url: String,
    index_dir: PathBuf,
    _dir: tempfile::TempDir,
    _pg: Option<PgCluster>,
    /// `--index database`: the vectors and their HNSW indexes in Postgres (pgvector).
    database_index: bool,
}

impl Db {
    async fn sqlite() -> Db {
        let dir = tempfile::tempdir().expect("tempdir");
        Db {
            // The folder does not exist yet: the server creates it.
            url: format!("sqlite://{}", dir.path().join("data/js.db").display()),
            index_dir: dir.path().join("data/index"),
            _dir: dir,
            _pg: None,
            database_index: false,
        }
    }

    async fn postgres() -> Db {
        Self::on(PgCluster::start(), false).await
    }

    async fn database_index() -> Db {
        Self::on(PgCluster::start_pgvector(), true).await
    }

    async fn on(pg: PgCluster, database_index: bool) -> Db {
        let dir = tempfile::tempdir().expect("tempdir");
        Db {
            url: pg.create_db("api").await,
            index_dir: dir.path().join("index"),
            _dir: dir,
            _pg: Some(pg),
            database_index,
        }
    }

    /// exact-below 0: every search goes through HNSW, the path large collections take.
    fn flags(&self) -> Vec<&str> {
        let mut f = vec![
            "--exact-below",
            "0",
            "--index-dir",
            self.index_dir.to_str().expect("path"),
        ];
        if self.database_index {
            f.extend(DATABASE_INDEX);
        }
        f
    }

    async fn start(&self) -> TestApp {
        TestApp::start_url(BUNDLE, &self.url, &self.flags()).await
    }
}

/// Each test, once per engine.
macro_rules! on_both_engines {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test]
            async fn sqlite() {
                super::$test(super::Db::sqlite().await).await;
            }

            #[tokio::test]
            async fn postgres() {
                super::$test(super::Db::postgres().await).await;
            }

            #[tokio::test]
            async fn database_index() {
                super::$test(super::Db::database_index().await).await;
            }
        }
    )*};
}

on_both_engines!(
    adds_images_by_multipart_and_json_and_free_captions,
    searches_images_by_photo_stored_image_and_sentence,
    annotates_photos_and_embeds,
    a_deleted_image_leaves_every_answer,
    serves_its_contract_metrics_and_readiness,
    survives_restarts_a_crash_a_lost_snapshot_and_a_reindex,
);

/// The image ids of a search answer, in rank order.
fn image_ids(answer: &serde_json::Value) -> Vec<i64> {
    answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|h| h["image"]["id"].as_i64().expect("id"))
        .collect()
}

/// The shop: collection "shop", img-0 by multipart (red, one caption), img-1..7 by JSON (red when even,
/// two captions each), and one free caption. Returns the server and the ids of img-1..7.
async fn shop(db: &Db) -> (TestApp, Vec<i64>) {
    let app = db.start().await;
    let (s, body) = app
        .post_json(
            "/v1/collections",
            json!({"name": "shop", "description": "fixtures"}),
        )
        .await;
    assert_eq!(s, 201, "{body}");

    // One image by multipart, with fields.
    let (s, body) = app
        .post_multipart(
            "/v1/collections/shop/images",
            vec![("fixture_0.png".into(), fixture_image(0))],
            &[
                ("external_id", "img-0".into()),
                ("metadata", r#"{"color":"red","n":0}"#.into()),
                ("caption", "a red square on a table".into()),
            ],
        )
        .await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(body["images"][0]["external_id"], "img-0");
    assert_eq!(
        body["images"][0]["caption_ids"].as_array().map(Vec::len),
        Some(1)
    );

    // A batch by JSON/base64.
    let images: Vec<_> = (1..8)
        .map(|i| {
            json!({"data": b64(&fixture_image(i)), "external_id": format!("img-{i}"),
                   "metadata": {"color": if i % 2 == 0 { "red" } else { "blue" }, "n": i},
                   "captions": [format!("picture number {i} with a dog"), format!("a man on the beach {i}")]})
        })
        .collect();
    let (s, body) = app
        .post_json("/v1/collections/shop/images", json!({ "images": images }))
        .await;
    assert_eq!(s, 201, "{body}");
    let ids: Vec<i64> = body["images"]
        .as_array()
        .expect("images")
        .iter()
        .map(|i| i["id"].as_i64().expect("id"))
        .collect();
    assert_eq!(ids.len(), 7);

    // A stand-alone caption (annotation candidate).
    let (s, body) = app
        .post_json(
            "/v1/collections/shop/captions",
            json!({"captions": [{"text": "a dog running on the beach"}]}),
        )
        .await;
    assert_eq!(s, 201, "{body}");

    (app, ids)
}

async fn adds_images_by_multipart_and_json_and_free_captions(db: Db) {
    let (app, _) = shop(&db).await;
    let (s, c) = app.get_json("/v1/collections/shop").await;
    assert_eq!(s, 200);
    assert_eq!(
        (c["images"].as_i64(), c["captions"].as_i64()),
        (Some(8), Some(16))
    );

    app.stop().await;
}

async fn searches_images_by_photo_stored_image_and_sentence(db: Db) {
    let (app, ids) = shop(&db).await;
    // Search images by an uploaded image: the same picture comes first, with cosine ~1.
    let (s, r) = app
        .post_multipart(
            "/v1/collections/shop/images/search",
            vec![("q.png".into(), fixture_image(3))],
            &[("k", "3".into())],
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"].as_array().map(Vec::len), Some(3));
    assert_eq!(r["results"][0]["image"]["external_id"], "img-3");
    assert!(r["results"][0]["score"].as_f64().expect("score") > 0.999);

    // By a stored image id: itself excluded, k results.
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/images/search",
            json!({"image_id": ids[0], "k": 4}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let got = image_ids(&r);
    assert_eq!(got.len(), 4);
    assert!(!got.contains(&ids[0]));
    // Paging by a stored image neither skips nor repeats.
    let (_, p2) = app
        .post_json(
            "/v1/collections/shop/images/search",
            json!({"image_id": ids[0], "k": 2, "offset": 2}),
        )
        .await;
    let page2 = image_ids(&p2);
    assert_eq!(page2, got[2..4].to_vec());

    // By text, with a metadata filter and paging.
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/images/search",
            json!({"text": "a dog running on the beach", "k": 10, "filter": {"color": "red"}}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let hits = r["results"].as_array().expect("results");
    assert_eq!(hits.len(), 4, "img-0, 2, 4, 6 are red");
    assert!(
        hits.iter()
            .all(|h| h["image"]["metadata"]["color"] == "red")
    );
    let scores: Vec<f64> = hits
        .iter()
        .map(|h| h["score"].as_f64().expect("score"))
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "sorted by score");
    let (_, page2) = app.post_json("/v1/collections/shop/images/search", json!({"text": "a dog running on the beach", "k": 2, "offset": 2, "filter": {"color": "red"}})).await;
    assert_eq!(page2["results"][0]["image"]["id"], hits[2]["image"]["id"]);

    app.stop().await;
}

async fn annotates_photos_and_embeds(db: Db) {
    let (app, ids) = shop(&db).await;
    // Annotation: captions for an uploaded image and for a stored one.
    let (s, r) = app
        .post_multipart(
            "/v1/collections/shop/captions/search",
            vec![("q.png".into(), fixture_image(5))],
            &[("k", "5".into())],
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"].as_array().map(Vec::len), Some(5));
    let (s, r) = app
        .post_json(
            "/v1/collections/shop/captions/search",
            json!({"image_id": ids[4], "k": 16}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"].as_array().map(Vec::len), Some(16));

    // Embeddings.
    let (s, r) = app
        .post_json("/v1/embed/text", json!({"texts": ["a dog", "two cats"]}))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["embeddings"].as_array().map(Vec::len), Some(2));
    let (s, r) = app
        .post_json("/v1/embed/image", json!({"image": b64(&fixture_image(2))}))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["code"]["dim"], 144);

    app.stop().await;
}

async fn a_deleted_image_leaves_every_answer(db: Db) {
    let (app, ids) = shop(&db).await;
    // Delete an image: gone from get, list and every search.
    let victim = ids[2]; // img-3
    assert_eq!(
        app.delete(&format!("/v1/collections/shop/images/{victim}"))
            .await,
        204
    );
    assert_eq!(
        app.get_json(&format!("/v1/collections/shop/images/{victim}"))
            .await
            .0,
        404
    );
    assert_eq!(
        app.delete(&format!("/v1/collections/shop/images/{victim}"))
            .await,
        404
    );
    let (_, r) = app
        .post_multipart(
            "/v1/collections/shop/images/search",
            vec![("q.png".into(), fixture_image(3))],
            &[("k", "10".into())],
        )
        .await;
    let after = image_ids(&r);
    assert_eq!(after.len(), 7);
    assert!(!after.contains(&victim));
    let (_, caps) = app
        .get_json(&format!("/v1/collections/shop/captions?image_id={victim}"))
        .await;
    assert_eq!(
        caps["captions"].as_array().map(Vec::len),
        Some(0),
        "its captions went with it"
    );

    app.stop().await;
}

async fn serves_its_contract_metrics_and_readiness(db: Db) {
    let (app, _) = shop(&db).await;
    // The served API description is the committed one.
    let served = app
        .client
        .get(app.url("/openapi.yaml"))
        .send()
        .await
        .expect("openapi")
        .text()
        .await
        .expect("text");
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml"))
        .expect("openapi.yaml");
    assert_eq!(
        served, committed,
        "served /openapi.yaml differs from the committed openapi.yaml"
    );

    let metrics = crate::common::metrics_text(&app.client, &app.base).await;
    assert!(
        metrics.contains("jointspace_http_requests_total"),
        "{metrics}"
    );
    assert_eq!(app.get_json("/readyz").await.0, 200);

    app.stop().await;
}

async fn survives_restarts_a_crash_a_lost_snapshot_and_a_reindex(db: Db) {
    let (app, ids) = shop(&db).await;
    // img-3 deleted first: the restarts below must not bring it back.
    assert_eq!(
        app.delete(&format!("/v1/collections/shop/images/{}", ids[2]))
            .await,
        204
    );
    // Restart on the same database: everything is still there and found (graceful stop writes snapshots).
    app.stop().await;
    let app = db.start().await;
    let (_, c) = app.get_json("/v1/collections/shop").await;
    assert_eq!(
        (c["images"].as_i64(), c["captions"].as_i64()),
        (Some(7), Some(14))
    );
    let (s, r) = app
        .post_multipart(
            "/v1/collections/shop/images/search",
            vec![("q.png".into(), fixture_image(6))],
            &[("k", "10".into())],
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"][0]["image"]["external_id"], "img-6");
    assert_eq!(r["results"].as_array().map(Vec::len), Some(7));
    let (_, r) = app
        .post_json(
            "/v1/collections/shop/captions/search",
            json!({"text": "a dog running on the beach", "k": 1}),
        )
        .await;
    assert_eq!(
        r["results"][0]["caption"]["text"],
        "a dog running on the beach"
    );

    // A write and a delete after the last snapshot, then a crash: the snapshot is loaded and brought up to the
    // database (the new image added, the deleted one removed), not rebuilt.
    let (s, body) = app
        .post_json(
            "/v1/collections/shop/images",
            json!({"images": [{"data": b64(&fixture_image(3)), "external_id": "img-3b"}]}),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(
        app.delete(&format!("/v1/collections/shop/images/{}", ids[4]))
            .await,
        204
    );
    app.kill().await;
    let app = db.start().await;
    let m = app.metrics().await;
    if db.database_index {
        assert!(
            !m.contains("source=\"snapshot\"") && !m.contains("source=\"database\""),
            "under the database index no graph is loaded or built"
        );
    } else {
        assert_eq!(
            (
                gauge(&m, r#"jointspace_index_loads_total{source="snapshot"}"#),
                m.contains(r#"source="database""#)
            ),
            (2, false),
            "both indexes of the collection come from the snapshot"
        );
    }
    let (_, r) = app
        .post_multipart(
            "/v1/collections/shop/images/search",
            vec![("q.png".into(), fixture_image(5))],
            &[("k", "10".into())],
        )
        .await;
    assert!(
        r["results"]
            .as_array()
            .expect("results")
            .iter()
            .all(|h| h["image"]["external_id"] != "img-5"),
        "an image deleted after the snapshot is not found: {r}"
    );
    let (_, r) = app
        .post_multipart(
            "/v1/collections/shop/images/search",
            vec![("q.png".into(), fixture_image(3))],
            &[("k", "1".into())],
        )
        .await;
    assert_eq!(
        r["results"][0]["image"]["external_id"], "img-3b",
        "the write acknowledged before the crash is found"
    );
    let (s, _) = app
        .post_json(
            "/v1/collections/shop/images/search",
            json!({"text": "a dog", "k": 100}),
        )
        .await;
    assert_eq!(s, 200);

    // A restart without a snapshot (deleted) rebuilds from the database and finds the same.
    app.stop().await;
    if db.database_index {
        assert!(
            !db.index_dir.exists(),
            "a server without a graph writes no snapshot"
        );
    } else {
        std::fs::remove_dir_all(&db.index_dir).expect("snapshot dir exists");
    }
    let app = db.start().await;
    let (_, r) = app
        .post_multipart(
            "/v1/collections/shop/images/search",
            vec![("q.png".into(), fixture_image(6))],
            &[("k", "1".into())],
        )
        .await;
    assert_eq!(r["results"][0]["image"]["external_id"], "img-6");

    // A reindex under the bundle that made every vector has nothing to recompute, and changes no answer.
    let (s, r) = app.post_json("/v1/admin/reindex", json!({})).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (r["images"].as_i64(), r["captions"].as_i64()),
        (Some(0), Some(0))
    );
    let (_, r) = app
        .post_multipart(
            "/v1/collections/shop/images/search",
            vec![("q.png".into(), fixture_image(6))],
            &[("k", "1".into())],
        )
        .await;
    assert_eq!(r["results"][0]["image"]["external_id"], "img-6");
    assert!(r["results"][0]["score"].as_f64().expect("score") > 0.999);

    assert_eq!(app.delete("/v1/collections/shop").await, 204);
    assert_eq!(app.get_json("/v1/collections/shop").await.0, 404);
    app.stop().await;
}
