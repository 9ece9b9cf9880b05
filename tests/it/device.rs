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
