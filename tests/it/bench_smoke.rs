//! Every bench of docs/benchmarks.md still runs, on tiny inputs and the fixture bundle. Their times are
//! not checked (CI machines vary); what they report is checked where it can be wrong.
#[path = "../../benches/suite/mod.rs"]
mod suite;

use crate::common;

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn projection_bench_runs_and_the_signed_sum_equals_the_dense_product() {
    let r = suite::run(&args(&[
        "projection",
        "--joint",
        "16",
        "--dim",
        "40",
        "--codes",
        "5",
    ]))
    .expect("projection bench");
    assert_eq!(r["bit_equal_to_dense_in_order"], true);
}

#[test]
fn hubness_bench_runs_on_the_fixture_bank() {
    let r = suite::run(&args(&[
        "hubness",
        "--bundle",
        common::BUNDLE,
        "--batches",
        "1,4",
        "--images",
        "6",
    ]))
    .expect("hubness bench");
    assert_eq!(r["bank_rows"], 6, "{r}");
    assert_eq!(r["offsets"].as_array().map(Vec::len), Some(2), "{r}");
    // The annotation side: the fixture's bank of its 8 images.
    let r = suite::run(&args(&[
        "hubness",
        "--bundle",
        common::BUNDLE,
        "--side",
        "captions",
        "--batches",
        "1,8",
        "--images",
        "8",
    ]))
    .expect("hubness bench, captions side");
    assert_eq!(r["bank_rows"], 8, "{r}");
    assert_eq!(r["offsets"].as_array().map(Vec::len), Some(2), "{r}");
}

#[test]
fn index_bench_runs() {
    let r = suite::run(&args(&[
        "index",
        "--n",
        "300",
        "--dim",
        "16",
        "--queries",
        "10",
        "--ef",
        "16,64",
    ]))
    .expect("index bench");
    assert_eq!(r["hnsw"].as_array().map(Vec::len), Some(2));
    assert!(r["hnsw"][1]["recall_at_10"].as_f64().unwrap() > 0.5, "{r}");
}

#[test]
fn ingest_bench_runs() {
    let images = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/images");
    let r = suite::run(&args(&[
        "ingest",
        "--bundle",
        common::BUNDLE,
        "--images",
        images,
        "--n",
        "3",
        "--crop",
        "ten",
        "--threads",
        "1",
        "--batch",
        "2",
    ]))
    .expect("ingest bench");
    assert_eq!(r["images"], 3);
    assert_eq!(r["profile"].as_object().map(|p| p.len()), Some(8));
    assert!(r["profile"].get("hubness").is_some(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_and_load_benches_run_against_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("q.db");
    let seeded = suite::seed::run(&suite::seed::Opts {
        database_url: format!("sqlite://{}", db.display()),
        bundle: common::BUNDLE.into(),
        sizes: vec![50],
    })
    .await
    .expect("seed");
    assert_eq!(seeded["collections"][0]["images"], 50);
    let app = common::TestApp::start(&db, &[]).await;
    let load = |query: &str, path: &str, concurrency: usize, rate: f64| suite::load::Opts {
        fields: Default::default(),
        url: app.url(path),
        query: query.into(),
        image: None,
        texts: vec!["a dog on the beach".into(), "two children".into()],
        ids: 50,
        first_id: 1,
        k: 5,
        concurrency,
        rate,
        duration: std::time::Duration::from_millis(300),
        warmup: std::time::Duration::from_millis(50),
        server_pid: Some(std::process::id()),
    };
    for o in [
        load("text", "/v1/collections/n50/images/search", 2, 0.0),
        load("image_id", "/v1/collections/n50/captions/search", 2, 0.0),
        load("text", "/v1/collections/n50/images/search", 0, 50.0),
    ] {
        let r = suite::load::run(&o).await.expect("load");
        assert!(r["requests"].as_u64().unwrap() > 0, "{r}");
        assert!(r["server_cpu_ms_per_request"].as_f64().is_some(), "{r}");
        assert_eq!(
            r["statuses"]
                .as_object()
                .map(|s| s.keys().cloned().collect::<Vec<_>>()),
            Some(vec!["200".to_string()]),
            "{r}"
        );
    }
    // `--fields` reaches every body: a mode the server does not know is refused each time.
    let mut o = load("text", "/v1/collections/n50/images/search", 2, 0.0);
    o.fields = serde_json::from_str(r#"{"mode": "nonsense"}"#).unwrap();
    let r = suite::load::run(&o).await.expect("load");
    let statuses: Vec<String> = r["statuses"].as_object().unwrap().keys().cloned().collect();
    assert!(
        !statuses.is_empty() && statuses.iter().all(|s| s.starts_with('4')),
        "{r}"
    );
    app.stop().await;
}
