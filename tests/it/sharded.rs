//! The index in the database, sharded as far as one machine allows: three local PostgreSQL 18 servers
//! with pgvector, a coordinator whose `images` table is hash-partitioned by id into postgres_fdw foreign tables
//! on two shard servers (each shard with its own HNSW index), and `jointspace serve --index database` on the
//! coordinator. The same search SQL Citus would run fans out to both shards; the top k equals an exact scan of
//! every image; a shard that goes down turns searches and writes that need it into 503s naming it, and once it
//! is back every image acknowledged before is there and found. Then the same with one shard stopped and started
//! under a steady load of writes and searches: only 2xx or 503 with Retry-After, success again once it is back,
//! and every image acknowledged under the load is the first hit of its own photo.

use std::{collections::HashMap, sync::Arc, time::Duration};

use serde_json::{Value, json};
use sqlx::{Connection, Executor};

use crate::common::{
    BUNDLE, TestApp, b64, fixture_image, id_scores,
    load::{Load, assert_clean_answers, assert_found_by_own_photo, statuses},
    pg::{DATABASE_INDEX, PgCluster},
};

/// The fixture bundle's joint dimension (the halfvec columns' size).
fn joint_dim() -> usize {
    let b = jointspace_embed::bundle::Bundle::load(std::path::Path::new(BUNDLE)).expect("fixture");
    b.manifest.projection.joint_dim
}

/// The images table's columns, as the migrations leave them, with the pgvector column.
fn images_columns(dim: usize) -> String {
    format!(
        "id BIGINT NOT NULL, collection_id BIGINT NOT NULL, external_id TEXT, metadata JSONB NOT NULL DEFAULT '{{}}', \
         width BIGINT NOT NULL, height BIGINT NOT NULL, code BYTEA NOT NULL, vector BYTEA NOT NULL, \
         bundle_id TEXT NOT NULL, vision_id TEXT NOT NULL, created_at TEXT NOT NULL, \
         hub_offset DOUBLE PRECISION NOT NULL DEFAULT 0, content_hash TEXT, embedding halfvec({dim})"
    )
}

async fn exec(url: &str, sql: &str) {
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    c.execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// (id, score) of a search's results, in order; or the status and message of a refusal.
async fn search(app: &TestApp, body: Value) -> Result<Vec<(i64, f64)>, (u16, String)> {
    let (s, r) = app.post_json("/v1/collections/c/images/search", body).await;
    if s != 200 {
        return Err((
            s,
            r["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ));
    }
    Ok(id_scores(&r))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn top_k_across_postgres_fdw_shards_equals_an_exact_scan_and_a_shard_down_is_a_503_naming_it()
{
    let dim = joint_dim();
    let shards = [PgCluster::start_pgvector(), PgCluster::start_pgvector()];
    let coord = PgCluster::start_pgvector();
    for s in &shards {
        let url = s.create_db("shard").await;
        exec(
            &url,
            &format!(
                "CREATE TABLE images ({}, PRIMARY KEY (id))",
                images_columns(dim)
            ),
        )
        .await;
        exec(
            &url,
            "CREATE INDEX images_embedding_ip ON images USING hnsw (embedding halfvec_ip_ops)",
        )
        .await;
    }
    let url = coord.create_db("coordinator").await;
    // The coordinator's schema from the migrations (a memory-mode start), then its images table replaced by
    // one partitioned over the shards (the tables that referenced it keep their rows, without the foreign key:
    // a partitioned table with foreign partitions has no unique index to reference).
    TestApp::start_url(BUNDLE, &url, &[]).await.stop().await;
    let mut setup = vec![
        "CREATE EXTENSION postgres_fdw".to_string(),
        "DROP TABLE images CASCADE".to_string(),
        "CREATE SEQUENCE images_id_seq".to_string(),
        format!(
            "CREATE TABLE images ({}) PARTITION BY HASH (id)",
            images_columns(dim)
        ),
        "ALTER TABLE images ALTER COLUMN id SET DEFAULT nextval('images_id_seq')".to_string(),
    ];
    for (i, s) in shards.iter().enumerate() {
        setup.push(format!(
            "CREATE SERVER shard{i} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '{}', \
             dbname 'shard', extensions 'vector')",
            s.port
        ));
        setup.push(format!(
            "CREATE USER MAPPING FOR CURRENT_USER SERVER shard{i} OPTIONS (user 'postgres')"
        ));
        setup.push(format!(
            "CREATE FOREIGN TABLE images_shard{i} PARTITION OF images FOR VALUES WITH (MODULUS 2, REMAINDER {i}) \
             SERVER shard{i} OPTIONS (table_name 'images')"
        ));
    }
    for sql in &setup {
        exec(&url, sql).await;
    }

    // The database timeout bounds how long a request waits under the load below.
    let flags = [DATABASE_INDEX.as_slice(), &["--database-timeout", "2"]].concat();
    let app = TestApp::start_url(BUNDLE, &url, &flags).await;
    app.create_collection("c").await;
    let mut acknowledged: Vec<i64> = vec![];
    for batch in 0..4 {
        let images: Vec<Value> = (0..8)
            .map(|i| json!({"data": b64(&fixture_image(i)), "metadata": {"batch": batch, "i": i}}))
            .collect();
        let (s, r) = app
            .post_json("/v1/collections/c/images", json!({ "images": images }))
            .await;
        assert_eq!(s, 201, "{r}");
        acknowledged.extend(
            r["images"]
                .as_array()
                .expect("images")
                .iter()
                .map(|i| i["id"].as_i64().expect("id")),
        );
    }
    // Both shards hold rows: the search below is a fan-out, not one shard's answer.
    for (i, s) in shards.iter().enumerate() {
        let mut c = sqlx::PgConnection::connect(&s.url("shard"))
            .await
            .expect("shard");
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM images WHERE embedding IS NOT NULL")
            .fetch_one(&mut c)
            .await
            .expect("count");
        assert!(n > 0, "shard{i} holds no image");
    }
    // Top k through the shards against the exact answer (every image scored by the memory index's exact scan
    // on the same database: it reads the partitioned table like any other).
    let exact = TestApp::start_url(
        BUNDLE,
        &url,
        &["--exact-below", "1000000", "--follow-interval-ms", "0"],
    )
    .await;
    for body in [
        json!({"text": "a dog runs on the grass", "k": 10}),
        json!({"text": "a red square", "k": 5, "offset": 3}),
        json!({"image": b64(&fixture_image(4)), "k": 12}),
        json!({"text": "a picture", "k": 10, "filter": {"i": {"$in": [1, 2, 3]}}}),
    ] {
        let got = search(&app, body.clone()).await.expect("sharded search");
        let want = search(&exact, body.clone()).await.expect("exact search");
        let scores: HashMap<i64, f64> = want.iter().copied().collect();
        assert_eq!(got.len(), want.len(), "{body}");
        for ((gid, gs), (wid, ws)) in got.iter().zip(&want) {
            // Equal scores may come in either order (the fixture repeats eight photos).
            assert!((gs - ws).abs() < 1e-5, "{body}: {got:?} against {want:?}");
            assert!(
                gid == wid || scores.contains_key(gid),
                "{body}: {got:?} against {want:?}"
            );
        }
    }
    exact.stop().await;

    // Shard 1 down: a search needs it, so it is a 503 naming the shard, as is a write routed to it.
    shards[1].stop_server();
    let (s, msg) = search(&app, json!({"text": "a dog", "k": 5}))
        .await
        .expect_err("a shard is down");
    assert_eq!(s, 503, "{msg}");
    assert!(msg.contains("shard1"), "the 503 names the shard: {msg}");
    eprintln!("with shard1 down, a search: {s} {msg}");
    let mut refused = 0;
    for i in 0..4 {
        let (s, r) = app
            .post_json(
                "/v1/collections/c/images",
                json!({"images": [{"data": b64(&fixture_image(i))}]}),
            )
            .await;
        match s {
            201 => acknowledged.push(r["images"][0]["id"].as_i64().expect("id")),
            503 => {
                refused += 1;
                assert!(
                    r["error"]["message"]
                        .as_str()
                        .unwrap_or_default()
                        .contains("shard1"),
                    "{r}"
                );
            }
            _ => panic!("a write while a shard is down: {s} {r}"),
        }
    }
    assert!(refused > 0, "no write was routed to the shard that is down");
    eprintln!(
        "with shard1 down, {refused} of 4 writes refused; {} images acknowledged",
        acknowledged.len()
    );
    shards[1].start_server();
    // Back: every acknowledged image is there and found by its own photo's search.
    let all = search(&app, json!({"text": "a picture", "k": 1000}))
        .await
        .expect("search after the shard is back");
    let found: std::collections::HashSet<i64> = all.iter().map(|h| h.0).collect();
    for id in &acknowledged {
        assert!(found.contains(id), "acknowledged image {id} lost");
        assert_eq!(
            app.get_json(&format!("/v1/collections/c/images/{id}"))
                .await
                .0,
            200
        );
    }
    assert_eq!(
        all.len(),
        acknowledged.len(),
        "an image that was refused is not there either"
    );

    // The same under a steady load: four clients write new photos and search while shard 0 is down for
    // four seconds, and nothing restarts jointspace.
    let app = Arc::new(app);
    let load = Load::start(app.clone(), "c", 4, 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let down_at = load.elapsed();
    tokio::task::block_in_place(|| shards[0].stop_server());
    let stopped = load.elapsed();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let up_at = load.elapsed();
    tokio::task::block_in_place(|| shards[0].start_server());
    let started = load.elapsed();
    let recovered = loop {
        if search(&app, json!({"text": "a dog", "k": 5})).await.is_ok() {
            break load.elapsed();
        }
        assert!(
            load.elapsed() - started < Duration::from_secs(10),
            "no recovery after shard0 came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (outcomes, acked) = load.finish().await;
    let during = statuses(&outcomes, |o| o.at > stopped && o.done_by(up_at));
    let after = statuses(&outcomes, |o| o.at > recovered);
    let slowest = outcomes.iter().map(|o| o.took).max().unwrap_or_default();
    eprintln!(
        "under load: shard0 down {down_at:?}..{up_at:?} (stopped at {stopped:?}, started at {started:?}, first \
         search {recovered:?}, {:?} after the start); statuses while down {during:?}, after {after:?}, slowest \
         request {slowest:?}; {} images acknowledged under the load; {} of the 503s name shard0",
        recovered - started,
        acked.len(),
        outcomes
            .iter()
            .filter(|o| o.status == 503 && o.message.contains("shard0"))
            .count()
    );
    assert_clean_answers(&outcomes, "database is unavailable");
    for o in outcomes.iter().filter(|o| o.status == 503) {
        // Sent once the shard was down, a request fails to connect to it and says which; one that the
        // shutdown cut off carries only the shard's own words ("terminating connection due to
        // administrator command").
        assert!(
            o.at < stopped || o.message.contains("shard0"),
            "the 503 names the shard: {o:?}"
        );
    }
    // Every search needs both shards; a write routed to shard 1 may still succeed.
    assert!(
        during.get(&503).copied().unwrap_or(0) > 0 && !during.contains_key(&200),
        "while shard0 was down: {during:?}"
    );
    assert!(
        after.keys().all(|s| *s == 200 || *s == 201),
        "after shard0 came back: {after:?}"
    );
    // Bounded by the database timeout (2 s) plus the work itself.
    assert!(
        slowest < Duration::from_secs(6),
        "a request took {slowest:?}"
    );
    assert_found_by_own_photo(&app, "c", &acked).await;
    let app = Arc::into_inner(app).expect("the load's clients are done");
    app.stop().await;
}
