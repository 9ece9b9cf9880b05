//! Starts the real application (ONNX Runtime, SQLite, HNSW) on the fixture bundle, on port 0.
#![allow(dead_code)]

pub mod load;
pub mod pg;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use jointspace::app::Application;
use jointspace::config::ServeArgs;
use jointspace_embed::runtime::Backend;
use tokio::{sync::oneshot, task::JoinHandle};

pub const BUNDLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fixture-tiny");

/// The `jointspace` binary on the fixture bundle and the database at `db`, logging only warnings.
pub fn jointspace(db: &str) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_jointspace"));
    c.env("JOINTSPACE_BUNDLE", BUNDLE)
        .env("JOINTSPACE_DATABASE_URL", db)
        .env("RUST_LOG", "warn");
    c
}

/// Whether a finished command succeeded, and its stdout then stderr.
pub fn outcome(out: &std::process::Output) -> (bool, String) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

pub fn fixture_image(i: usize) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/images/fixture_{i}.png")),
    )
    .expect("fixture image")
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
        Self::start_with(BUNDLE, db, extra).await
    }

    pub async fn start_with(bundle: &str, db: &Path, extra: &[&str]) -> TestApp {
        let url = format!("sqlite://{}", db.display());
        let mut app = Self::start_url(bundle, &url, extra).await;
        app.db = db.to_path_buf();
        app
    }

    /// On any database URL (`sqlite://...` or `postgres://...`).
    pub async fn start_url(bundle: &str, url: &str, extra: &[&str]) -> TestApp {
        Self::start_wrapped(bundle, url, extra, |b| b).await
    }

    /// As `start_url`, with the runtime seen through `wrap` (a backend that wedges or dies on cue).
    pub async fn start_wrapped(
        bundle: &str,
        url: &str,
        extra: &[&str],
        wrap: impl FnOnce(Arc<dyn Backend>) -> Arc<dyn Backend>,
    ) -> TestApp {
        let mut flags = vec![
            "--addr",
            "127.0.0.1:0",
            "--bundle",
            bundle,
            "--database-url",
            url,
            "--snapshot-interval",
            "0",
        ];
        flags.extend_from_slice(extra);
        let cfg = ServeArgs::try_from_flags(flags).expect("flags");
        let app = Application::build_with(cfg, wrap)
            .await
            .expect("application starts");
        let base = format!("http://127.0.0.1:{}", app.port());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(app.run_until(async {
            let _ = rx.await;
        }));
        TestApp {
            base,
            client: reqwest::Client::new(),
            db: PathBuf::new(),
            stop: Some(tx),
            task: Some(task),
        }
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

    /// Stops without the graceful path (no snapshot), as a crash would.
    pub async fn kill(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn post_json(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let (status, _, body) = self.post_json_retry_after(path, body).await;
        (status, body)
    }

    /// As `post_json`, with the answer's `Retry-After` in seconds (a 503 or 429 must carry one).
    pub async fn post_json_retry_after(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> (u16, Option<u64>, serde_json::Value) {
        let r = self
            .client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        (
            status,
            retry_after,
            r.json().await.unwrap_or(serde_json::Value::Null),
        )
    }

    /// Creates a collection, which every test that stores something starts with: 201 or the test fails.
    pub async fn create_collection(&self, name: &str) {
        let (s, body) = self
            .post_json("/v1/collections", serde_json::json!({ "name": name }))
            .await;
        assert_eq!(s, 201, "creating collection {name}: {body}");
    }

    /// POSTs raw bytes with the given content type (or none), for the wrong-content-type cases.
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> (u16, serde_json::Value) {
        let mut req = self.client.post(self.url(path)).body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let r = req.send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.expect("json"))
    }

    pub async fn get_json(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self
            .client
            .get(self.url(path))
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn delete(&self, path: &str) -> u16 {
        self.client
            .delete(self.url(path))
            .send()
            .await
            .expect("request")
            .status()
            .as_u16()
    }

    /// Multipart upload of files as `image` parts plus text fields.
    pub async fn post_multipart(
        &self,
        path: &str,
        files: Vec<(String, Vec<u8>)>,
        fields: &[(&str, String)],
    ) -> (u16, serde_json::Value) {
        let mut form = reqwest::multipart::Form::new();
        for (name, data) in files {
            form = form.part(
                "image",
                reqwest::multipart::Part::bytes(data).file_name(name),
            );
        }
        for (k, v) in fields {
            form = form.text(k.to_string(), v.clone());
        }
        let r = self
            .client
            .post(self.url(path))
            .multipart(form)
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// The Prometheus text of /metrics.
    pub async fn metrics(&self) -> String {
        metrics_text(&self.client, &self.base).await
    }

    /// Adds one fixture image with metadata `{"tag": tag}` to `collection`; returns its id.
    pub async fn add_tagged(&self, collection: &str, fixture: usize, tag: &str) -> i64 {
        let (s, r) = self
            .post_json(
                &format!("/v1/collections/{collection}/images"),
                serde_json::json!({"images": [{"data": b64(&fixture_image(fixture)), "metadata": {"tag": tag}}]}),
            )
            .await;
        assert_eq!(s, 201, "{r}");
        r["images"][0]["id"].as_i64().expect("id")
    }

    /// The ids a search filtered on `{"tag": tag}` returns. The database answers the filter and the index
    /// the hits, so an image is returned only once this server's index holds it.
    pub async fn tagged_hits(&self, collection: &str, tag: &str) -> Vec<i64> {
        let (s, r) = self
            .post_json(
                &format!("/v1/collections/{collection}/images/search"),
                serde_json::json!({"text": "a picture", "k": 5, "filter": {"tag": tag}}),
            )
            .await;
        if s != 200 {
            return vec![];
        }
        r["results"]
            .as_array()
            .map(|a| a.iter().filter_map(|h| h["image"]["id"].as_i64()).collect())
            .unwrap_or_default()
    }

    pub async fn assert_alive(&self) {
        let r = self
            .client
            .get(self.url("/healthz"))
            .send()
            .await
            .expect("server still answers");
        assert_eq!(r.status().as_u16(), 200);
    }
}

/// The Prometheus text of a server's /metrics.
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// The value of an unlabelled gauge or counter in Prometheus text.
pub fn gauge(metrics: &str, name: &str) -> i64 {
    let prefix = format!("{name} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {metrics}"))
}

/// A shipped bundle's folder, or None (said on stderr) where its vision graph has not been built.
pub fn shipped_bundle(name: &str) -> Option<String> {
    let dir = format!("{}/models/{name}", env!("CARGO_MANIFEST_DIR"));
    if !std::path::Path::new(&dir).join("vision.onnx").exists() {
        eprintln!("skipped: {dir}/vision.onnx is absent (scripts/setup-python.sh builds it)");
        return None;
    }
    Some(dir)
}

/// A fixture bundle's parity.json: what the trainer computed for its images and sentences.
pub fn parity_of(bundle: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(format!("{bundle}/parity.json")).expect("parity.json"))
        .expect("json")
}

/// (image id, score) of an image search's results, in order.
pub fn id_scores(answer: &serde_json::Value) -> Vec<(i64, f64)> {
    answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|h| {
            (
                h["image"]["id"].as_i64().expect("id"),
                h["score"].as_f64().expect("score"),
            )
        })
        .collect()
}

/// A photo that no other `seed` gives: fixture `seed % 8` with blocks of colours drawn from `seed` painted
/// over it, so that a search by its bytes has one best match, the image stored from them (the fixtures alone
/// repeat eight photos, whose copies tie).
pub fn unique_image(seed: u64) -> Vec<u8> {
    let mut img = image::load_from_memory(&fixture_image((seed % 8) as usize))
        .expect("fixture image")
        .to_rgb8();
    let (w, h) = img.dimensions();
    // xorshift64: any spread of the seed's bits will do, and it needs no dependency.
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (bw, bh) = (w / 3, h / 3);
    for _ in 0..6 {
        let (x0, y0) = (
            (next() % u64::from(w - bw)) as u32,
            (next() % u64::from(h - bh)) as u32,
        );
        let c = next().to_le_bytes();
        for y in y0..y0 + bh {
            for x in x0..x0 + bw {
                img.put_pixel(x, y, image::Rgb([c[0], c[1], c[2]]));
            }
        }
    }
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .expect("encode png");
    out.into_inner()
}

pub fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A copy of the fixture bundle in `dir`, with `edit` applied to bundle.json and, if given, a new W
/// (`[joint_dim, code_dim]`, f32) whose checksum is written into bundle.json.
pub fn variant_bundle(
    dir: &Path,
    edit: impl FnOnce(&mut serde_json::Value),
    w: Option<Vec<f32>>,
) -> PathBuf {
    variant_bundle_affine(dir, edit, w.map(|w| (w, None)))
}

/// A tensor "bias" for a variant's projection file: its values and the shape to write (any, to test refusals).
pub type Bias = (Vec<f32>, Vec<usize>);

/// As `variant_bundle`, the new projection file optionally with a tensor "bias" (f32).
pub fn variant_bundle_affine(
    dir: &Path,
    edit: impl FnOnce(&mut serde_json::Value),
    projection: Option<(Vec<f32>, Option<Bias>)>,
) -> PathBuf {
    variant_of(BUNDLE, dir, edit, projection)
}

/// As `variant_bundle_affine`, of the bundle `src`.
pub fn variant_of(
    src: &str,
    dir: &Path,
    edit: impl FnOnce(&mut serde_json::Value),
    projection: Option<(Vec<f32>, Option<Bias>)>,
) -> PathBuf {
    use sha2::{Digest, Sha256};
    std::fs::create_dir_all(dir).expect("dir");
    for e in std::fs::read_dir(src).expect("fixture bundle") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
    }
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("bundle.json")).expect("read"))
            .expect("json");
    if let Some((w, bias)) = projection {
        // The code: the first backbone's features, then any extra backbone's.
        let extra = m["extra_backbones"].as_array().into_iter().flatten();
        let (j, d) = (
            m["projection"]["joint_dim"].as_u64().expect("joint") as usize,
            std::iter::once(&m["fne"])
                .chain(extra.map(|b| &b["fne"]))
                .map(|f| f["dim"].as_u64().expect("dim") as usize)
                .sum(),
        );
        assert_eq!(w.len(), j * d);
        let le = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let bytes = le(&w);
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![j, d], &bytes)
                .expect("view");
        let bias = bias.map(|(b, shape)| (le(&b), shape));
        let mut tensors = vec![("weight", view)];
        if let Some((bytes, shape)) = &bias {
            tensors.push((
                "bias",
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .expect("bias view"),
            ));
        }
        let data = safetensors::serialize(tensors, None).expect("serialize");
        std::fs::write(dir.join("projection.safetensors"), &data).expect("write");
        m["files"]["projection.safetensors"] = hex::encode(Sha256::digest(&data)).into();
    }
    edit(&mut m);
    std::fs::write(
        dir.join("bundle.json"),
        serde_json::to_vec_pretty(&m).expect("json"),
    )
    .expect("write");
    dir.to_path_buf()
}

/// The fixture bundle's W, row-major `[joint_dim, code_dim]`.
pub fn fixture_w() -> Vec<f32> {
    w_of(BUNDLE)
}

/// A bundle's W, row-major `[joint_dim, code_dim]`.
pub fn w_of(bundle: &str) -> Vec<f32> {
    let b = jointspace_embed::bundle::Bundle::load(Path::new(bundle)).expect("fixture bundle");
    b.projection.clone()
}
