//! Starts the real application (ONNX Runtime, SQLite, HNSW) on the fixture bundle, on port 0.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use jointspace::{app::Application, config::ServeArgs};
use tokio::{sync::oneshot, task::JoinHandle};

pub const BUNDLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fixture-tiny");

pub fn fixture_image(i: usize) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/images/fixture_{i}.png"))).expect("fixture image")
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub db: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestApp {
    /// `extra`: more `serve` flags.
    pub async fn start(db: &Path, extra: &[&str]) -> TestApp {
        let url = format!("sqlite://{}", db.display());
        let mut flags = vec!["--addr", "127.0.0.1:0", "--bundle", BUNDLE, "--database-url", &url, "--snapshot-interval", "0"];
        flags.extend_from_slice(extra);
        let cfg = ServeArgs::try_from_flags(flags).expect("flags");
        let app = Application::build(cfg).await.expect("application starts");
        let base = format!("http://127.0.0.1:{}", app.port());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(app.run_until(async {
            let _ = rx.await;
        }));
        TestApp { base, client: reqwest::Client::new(), db: db.to_path_buf(), stop: Some(tx), task: Some(task) }
    }

    /// Graceful stop (drains, writes index snapshots), as on SIGTERM.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.expect("server task").expect("server stops cleanly");
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn post_json(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let r = self.client.post(self.url(path)).json(&body).send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn get_json(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self.client.get(self.url(path)).send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn delete(&self, path: &str) -> u16 {
        self.client.delete(self.url(path)).send().await.expect("request").status().as_u16()
    }

    /// Multipart upload of files as `image` parts plus text fields.
    pub async fn post_multipart(&self, path: &str, files: Vec<(String, Vec<u8>)>, fields: &[(&str, String)]) -> (u16, serde_json::Value) {
        let mut form = reqwest::multipart::Form::new();
        for (name, data) in files {
            form = form.part("image", reqwest::multipart::Part::bytes(data).file_name(name));
        }
        for (k, v) in fields {
            form = form.text(k.to_string(), v.clone());
        }
        let r = self.client.post(self.url(path)).multipart(form).send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn assert_alive(&self) {
        let r = self.client.get(self.url("/healthz")).send().await.expect("server still answers");
        assert_eq!(r.status().as_u16(), 200);
    }
}

pub fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}
