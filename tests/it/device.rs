//! No silent device fallback: `--device cuda` runs on CUDA or refuses to start saying why; `--device auto`
//! falls back to the CPU; the provider that runs is in `/metrics` (and `/readyz`, `/v1/bundle`).

use crate::common;

use common::TestApp;
use jointspace::app::Application;
use jointspace::config::ServeArgs;

/// The provider label of `jointspace_execution_provider` series at 1 (there must be exactly one).
fn provider_gauge(metrics: &str) -> String {
    let on: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("jointspace_execution_provider{") && l.ends_with(" 1"))
        .collect();
    assert_eq!(on.len(), 1, "one provider at 1: {metrics}");
    on[0]
        .split("provider=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("provider label")
        .to_string()
}

#[tokio::test]
async fn cuda_runs_on_cuda_or_refuses_to_start_and_auto_says_what_it_got() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("js.db").display());
    let flags = [
        "--addr",
        "127.0.0.1:0",
        "--bundle",
        common::BUNDLE,
        "--database-url",
        &url,
        "--device",
        "cuda",
    ];
    let cfg = ServeArgs::try_from_flags(flags).expect("flags");
    // Without CUDA (this project's machines: the CPU-only onnxruntime wheel) the start fails, naming the
    // setting and the ways out; with it, the server runs on CUDA. Never CUDA asked and the CPU given.
    let cuda = match Application::build(cfg).await {
        Ok(app) => {
            drop(app);
            true
        }
        Err(e) => {
            let msg = format!("{e:#}");
            for want in [
                "--device cuda",
                "cannot use the CUDA execution provider",
                "--device auto",
            ] {
                assert!(msg.contains(want), "{want:?} missing from: {msg}");
            }
            false
        }
    };
    let app = TestApp::start(&dir.path().join("js.db"), &["--device", "auto"]).await;
    let want = if cuda { "cuda" } else { "cpu" };
    assert_eq!(provider_gauge(&app.metrics().await), want);
    let (s, b) = app.get_json("/v1/bundle").await;
    assert_eq!(s, 200);
    let ort_name = if cuda {
        "CUDAExecutionProvider"
    } else {
        "CPUExecutionProvider"
    };
    assert_eq!(b["provider"], ort_name, "{b}");
    app.stop().await;
}

#[tokio::test]
async fn cpu_says_cpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("js.db"), &["--device", "cpu"]).await;
    assert_eq!(provider_gauge(&app.metrics().await), "cpu");
    app.stop().await;
}

#[test]
fn cudnn_search_is_heuristic_unless_asked_and_a_wrong_value_is_refused_naming_the_choices() {
    use jointspace_embed::runtime::ConvSearch;
    let cfg = ServeArgs::try_from_flags(["--addr", "127.0.0.1:0"]).expect("flags");
    assert_eq!(
        cfg.model.runtime.options().conv_search,
        ConvSearch::Heuristic
    );
    let cfg = ServeArgs::try_from_flags(["--cudnn-conv-search", "exhaustive"]).expect("flags");
    assert_eq!(
        cfg.model.runtime.options().conv_search,
        ConvSearch::Exhaustive
    );
    let e = ServeArgs::try_from_flags(["--cudnn-conv-search", "fastest"])
        .expect_err("not a choice")
        .to_string();
    for want in ["fastest", "heuristic", "exhaustive", "default"] {
        assert!(e.contains(want), "{want:?} missing from: {e}");
    }
}

/// Each photo's code and vector through `POST /v1/embed/image`, `copies` requests of every photo at once.
async fn embed_together(app: &TestApp, copies: usize) -> Vec<(String, Vec<f64>)> {
    let bodies: Vec<serde_json::Value> = (0..4)
        .flat_map(|i| {
            let image = common::b64(&common::fixture_image(i));
            (0..copies).map(move |_| serde_json::json!({ "image": image.clone() }))
        })
        .collect();
    let answers = futures::future::join_all(
        bodies
            .into_iter()
            .map(|b| async move { app.post_json("/v1/embed/image", b).await }),
    )
    .await;
    answers
        .into_iter()
        .map(|(s, b)| {
            assert_eq!(s, 200, "{b}");
            let vector = b["embedding"]
                .as_array()
                .expect("embedding")
                .iter()
                .map(|x| x.as_f64().expect("number"))
                .collect();
            (
                b["code"]["packed"].as_str().expect("code").to_string(),
                vector,
            )
        })
        .collect()
}

type Embedded = Vec<(String, Vec<f64>)>;

/// The photos' codes and vectors from a server with the defaults (each photo once), then from one started
/// with `flags` (`copies` requests of each photo at once), which is handed back still running.
async fn plain_then(
    dir: &std::path::Path,
    flags: &[&str],
    copies: usize,
) -> (Embedded, Embedded, TestApp) {
    let plain = TestApp::start(&dir.join("a.db"), &[]).await;
    let want = embed_together(&plain, 1).await;
    plain.stop().await;
    let app = TestApp::start(&dir.join("b.db"), flags).await;
    let got = embed_together(&app, copies).await;
    (want, got, app)
}

#[tokio::test]
async fn padded_batches_and_two_sessions_give_each_photo_the_codes_of_one_unpadded_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Three requests of each photo at once, batched up to 64 crops (ten a photo, padded to a power of two:
    // 16, 32 or 64 rows of which some are black) on two sessions.
    let flags = [
        "--vision-sessions",
        "2",
        "--pad-batches",
        "on",
        "--max-batch-crops",
        "64",
        // Long enough for the twelve requests to meet in a batch on a loaded machine.
        "--batch-wait-ms",
        "200",
    ];
    let (want, got, app) = plain_then(dir.path(), &flags, 3).await;
    for (i, (code, vector)) in got.iter().enumerate() {
        let (want_code, want_vector) = &want[i / 3];
        assert_eq!(code, want_code, "photo {}: another code", i / 3);
        let dot: f64 = vector.iter().zip(want_vector).map(|(a, b)| a * b).sum();
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let cos = dot / (norm(vector) * norm(want_vector));
        assert!(cos > 0.99999, "photo {}: cosine {cos}", i / 3);
    }
    // The runs were batched: fewer vision calls than requests.
    let m = app.metrics().await;
    let calls: f64 = m
        .lines()
        .find(|l| {
            l.starts_with("jointspace_inference_batch_rows_count{")
                && l.contains("model=\"vision\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("vision calls in /metrics");
    assert!(
        calls < 12.0,
        "{calls} vision calls for 12 requests: nothing was batched"
    );
    app.stop().await;
}

#[test]
fn sessions_padding_tf32_and_nhwc_have_device_defaults_and_bad_values_are_refused() {
    let cfg = ServeArgs::try_from_flags(["--addr", "127.0.0.1:0"]).expect("flags");
    let o = cfg.model.runtime.options();
    assert_eq!(o.vision_sessions, None, "decided by the provider that runs");
    assert!(o.tf32 && !o.nhwc);
    assert_eq!(
        cfg.model.pad_batches, None,
        "decided by the provider that runs"
    );
    let cfg = ServeArgs::try_from_flags([
        "--vision-sessions",
        "3",
        "--pad-batches",
        "off",
        "--cuda-tf32",
        "off",
        "--cuda-nhwc",
        "on",
    ])
    .expect("flags");
    let o = cfg.model.runtime.options();
    assert_eq!(o.vision_sessions, Some(3));
    assert!(!o.tf32 && o.nhwc);
    assert_eq!(cfg.model.pad_batches, Some(false));
    for bad in [["--vision-sessions", "0"], ["--pad-batches", "sometimes"]] {
        let e = ServeArgs::try_from_flags(bad)
            .expect_err("refused")
            .to_string();
        assert!(e.contains(bad[1]), "{bad:?}: {e}");
    }
}

#[test]
fn warming_runs_every_padded_shape_and_nothing_unpadded() {
    let cfg = |pad: &str| {
        ServeArgs::try_from_flags([
            "--bundle",
            common::BUNDLE,
            "--pad-batches",
            pad,
            "--max-batch-crops",
            "40",
        ])
        .expect("flags")
    };
    let pipeline = jointspace::app::load_pipeline(&cfg("on").model).expect("pipeline");
    // The fixture takes ten crops: 1, 2, 3 or 4 photos a call pad to 16, 32, 32 and 40 rows, and the
    // readiness probe sends one crop.
    assert_eq!(
        pipeline.warm_shapes().expect("warmed"),
        vec![vec![1, 16, 32, 40]]
    );
    let pipeline = jointspace::app::load_pipeline(&cfg("off").model).expect("pipeline");
    assert!(pipeline.warm_shapes().expect("nothing to warm").is_empty());
}

#[tokio::test]
async fn a_server_that_warms_its_shapes_serves_the_same_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = [
        "--pad-batches",
        "on",
        "--warm-batch-shapes",
        "on",
        "--max-batch-crops",
        "40",
    ];
    let (want, got, app) = plain_then(dir.path(), &flags, 1).await;
    for ((code, _), (want_code, _)) in got.iter().zip(&want) {
        assert_eq!(code, want_code);
    }
    app.stop().await;
}
