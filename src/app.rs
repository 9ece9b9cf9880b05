//! Wiring: bundle -> runtime -> pipeline -> database -> service -> router. `Application::build` is what `main`
//! and the integration tests (on port 0) both start.

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use tokio::net::TcpListener;

use crate::{
    api::{self, ApiKeys, RouterOptions},
    bundle::Bundle,
    config::{IndexMode, ModelArgs, ServeArgs, StoreArgs, UrlIngestArgs},
    decode::DecodeLimits,
    fetch::{Cidr, FetchOptions, Fetcher},
    metrics::Metrics,
    pipeline::{Pipeline, PipelineOptions},
    runtime::{self, Backend, OrtBackend, Provider},
    service::{Database, IndexBackend, IndexParams, ReadyOptions, Service, ServiceOptions},
    vision::{self, VisionRuns},
};

/// Loads and verifies the bundle and opens ONNX Runtime on it.
pub fn load_pipeline(model: &ModelArgs) -> anyhow::Result<Arc<Pipeline>> {
    load_pipeline_with(model, &Metrics::new())
}

/// As `load_pipeline`, with the batchers reporting to `metrics`.
pub fn load_pipeline_with(model: &ModelArgs, metrics: &Metrics) -> anyhow::Result<Arc<Pipeline>> {
    load_wrapped(model, metrics, |b| b)
}

/// As `load_pipeline_with`, the runtime seen through `wrap`.
fn load_wrapped(
    model: &ModelArgs,
    metrics: &Metrics,
    wrap: impl FnOnce(Arc<dyn Backend>) -> Arc<dyn Backend>,
) -> anyhow::Result<Arc<Pipeline>> {
    let bundle = Arc::new(Bundle::load(&model.bundle)?);
    let dylib = runtime::locate_dylib(model.runtime.ort_dylib.as_deref())?;
    let backend: Arc<dyn Backend> = wrap(Arc::new(OrtBackend::new(
        &bundle,
        &dylib,
        model.runtime.options(),
    )?));
    let provider = backend.provider();
    tracing::info!(
        bundle = %bundle.id, similarity = ?bundle.manifest.similarity, device = ?model.runtime.device,
        provider = provider.as_str(), onnxruntime = %dylib.display(), "model bundle loaded"
    );
    metrics.set_provider(provider);
    let default_batch_wait_ms = match provider {
        Provider::Cuda => 2,
        Provider::Cpu => 0,
    };
    let opts = PipelineOptions {
        limits: DecodeLimits {
            max_bytes: model.max_image_bytes,
            max_pixels: model.max_image_pixels,
            min_side: model.min_image_side,
        },
        crop_mode: model.crop_mode,
        max_text_chars: model.max_text_chars,
        thumbnails: model.thumbnails,
        max_batch_crops: model.max_batch_crops(),
        max_batch_texts: 256,
        queue: model.inference_queue,
        max_wait: Duration::from_millis(model.batch_wait_ms.unwrap_or(default_batch_wait_ms)),
        max_queue_wait: Duration::from_millis(model.max_queue_wait_ms),
        vision_stats: (0..bundle.manifest.backbones().count())
            .map(|graph| metrics.batch_stats(&vision::worker_name(graph)))
            .collect(),
        text_stats: metrics.batch_stats("text"),
        vision_runs: VisionRuns {
            workers: backend.vision_sessions(),
            pad_rows: model.pad_batches.unwrap_or(provider == Provider::Cuda),
        },
    };
    let pipeline = Pipeline::new(bundle, backend, opts)?;
    if model.warm_batch_shapes {
        let t = std::time::Instant::now();
        let shapes = pipeline.warm_shapes()?;
        if shapes.is_empty() {
            tracing::warn!(
                "--warm-batch-shapes has nothing to warm: the vision calls are not padded (--pad-batches)"
            );
        } else {
            tracing::info!(shapes = ?shapes, seconds = t.elapsed().as_secs_f64(), "vision batch shapes warmed");
        }
    }
    Ok(Arc::new(pipeline))
}

/// The database, migrated, with advice in the error when it cannot be opened.
pub async fn open_database(store_args: &StoreArgs) -> anyhow::Result<Database> {
    let timeout = Duration::from_secs(store_args.database_timeout.max(1));
    let connections = store_args.database_connections.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
        (2 * cores).max(4)
    });
    Database::open(&store_args.database_url, timeout, connections).await
}

/// What a command opens the service for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Searches (the server, `eval`, `reindex`): the index as `--index` says.
    Search,
    /// Writes only (`import`, `ingest`, `sync`): under `--index memory` a graph is kept only where its snapshot
    /// can be written; otherwise the rows alone are written, and the server builds its graph from them at start.
    Write,
}

pub async fn open_service(
    pipeline: Arc<Pipeline>,
    store_args: &StoreArgs,
    metrics: Arc<Metrics>,
    url_fetcher: Option<Arc<Fetcher>>,
    purpose: Purpose,
) -> anyhow::Result<Arc<Service>> {
    let db = open_database(store_args).await?;
    let snapshot_dir: Option<PathBuf> = store_args.index_dir.clone().or_else(|| {
        Database::file_path(&store_args.database_url).map(|f| {
            f.parent()
                .map(|p| p.join("index"))
                .unwrap_or_else(|| "index".into())
        })
    });
    let opts = ServiceOptions {
        backend: match store_args.index {
            IndexMode::Memory if purpose == Purpose::Write && snapshot_dir.is_none() => {
                IndexBackend::RowsOnly
            }
            IndexMode::Memory => IndexBackend::Memory,
            IndexMode::Database => IndexBackend::Database,
        },
        index: index_params(store_args),
        snapshot_dir,
        max_k: store_args.max_k,
        max_batch: store_args.max_batch,
        url_fetcher,
    };
    Ok(Arc::new(Service::open(pipeline, db, metrics, opts).await?))
}

/// The index's settings from the operator's flags.
pub fn index_params(store_args: &StoreArgs) -> IndexParams {
    IndexParams {
        ef_search: store_args.ef_search.map(|v| v as usize),
        exact_below: store_args.exact_below,
        max_connections: store_args.hnsw_m as usize,
        ef_construction: store_args.hnsw_ef_construction as usize,
        ..IndexParams::default()
    }
}

/// URL ingest's fetcher, when it is on (the server's, and `import`'s for a catalogue's URLs).
pub fn url_fetcher(
    args: &UrlIngestArgs,
    max_image_bytes: usize,
) -> anyhow::Result<Option<Arc<Fetcher>>> {
    // An empty JOINTSPACE_URL_INGEST_ALLOW (as a ConfigMap may carry) means none.
    let allow = args
        .url_ingest_allow
        .iter()
        .filter(|c| !c.trim().is_empty())
        .map(|c| {
            c.parse::<Cidr>()
                .map_err(|e| anyhow::anyhow!("--url-ingest-allow: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if !args.url_ingest {
        if !allow.is_empty() {
            tracing::warn!("--url-ingest-allow is set but URL ingest is off (--url-ingest)");
        }
        return Ok(None);
    }
    let opts = FetchOptions {
        timeout: Duration::from_millis(args.url_ingest_timeout_ms.max(1)),
        max_bytes: args.url_ingest_max_bytes.unwrap_or(max_image_bytes),
        max_in_flight: args.url_ingest_concurrency.max(1),
        allow,
    };
    tracing::info!(
        timeout_ms = opts.timeout.as_millis() as u64, max_bytes = opts.max_bytes, concurrency = opts.max_in_flight,
        allow = %opts.allow.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
        "URL ingest on: images may be given by URL (loopback, private and link-local addresses refused)"
    );
    Ok(Some(Arc::new(
        Fetcher::new(opts).context("cannot set up URL ingest's HTTP client")?,
    )))
}

pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    service: Arc<Service>,
    snapshot_interval: u64,
    follow_interval: Duration,
    sync_job_lease: Duration,
}

impl Application {
    pub async fn build(cfg: ServeArgs) -> anyhow::Result<Application> {
        Self::build_with(cfg, |b| b).await
    }

    /// As `build`, with the runtime seen through `wrap`: the seam where the tests put a backend that wedges
    /// or dies, and where an embedder could instrument inference.
    pub async fn build_with(
        cfg: ServeArgs,
        wrap: impl FnOnce(Arc<dyn Backend>) -> Arc<dyn Backend>,
    ) -> anyhow::Result<Application> {
        if cfg.follow_interval_ms > 0 && cfg.ready_max_lag_ms <= cfg.follow_interval_ms {
            anyhow::bail!(
                "--ready-max-lag-ms ({}) must be longer than --follow-interval-ms ({}): the indexes catch up \
                 with the database only once per interval",
                cfg.ready_max_lag_ms,
                cfg.follow_interval_ms
            );
        }
        let metrics = Arc::new(Metrics::new());
        let keys = api_keys(&cfg)?;
        let test_leak = api::middleware::test_leak::from_env()?;
        if test_leak > 0 {
            tracing::warn!(
                bytes_per_request = test_leak,
                "TEST HOOK {} IS SET: every request leaks memory on purpose (for the soak's own test); \
                 never set it outside a test",
                api::middleware::test_leak::ENV
            );
        }
        let url_fetcher = url_fetcher(&cfg.url_ingest, cfg.model.max_image_bytes)?;
        let pipeline = load_wrapped(&cfg.model, &metrics, wrap)?;
        let service = open_service(
            pipeline,
            &cfg.store,
            metrics.clone(),
            url_fetcher,
            Purpose::Search,
        )
        .await?;
        // Before the listener: the first requests find the runtime's buffers sized and the pages warm.
        match service.warm_up().await {
            Ok(took) => tracing::info!(ms = took.as_millis() as u64, "warmed up"),
            Err(e) => {
                tracing::warn!(error = %e, "warming up failed; the first requests will be slower")
            }
        }
        let listener = TcpListener::bind(cfg.addr)
            .await
            .with_context(|| format!("cannot listen on {}", cfg.addr))?;
        let router = api::router_with(
            service.clone(),
            metrics,
            RouterOptions {
                max_request_bytes: cfg.max_request_bytes,
                keys,
                request_timeout: (cfg.http.request_timeout > 0)
                    .then(|| Duration::from_secs(cfg.http.request_timeout)),
                body_read_timeout: (cfg.http.body_read_timeout_ms > 0)
                    .then(|| Duration::from_millis(cfg.http.body_read_timeout_ms)),
                cors_origins: cfg.http.cors_origins.clone(),
                ready: ReadyOptions {
                    probe_timeout: Duration::from_millis(cfg.ready_probe_timeout_ms.max(1)),
                    max_lag: (cfg.follow_interval_ms > 0)
                        .then(|| Duration::from_millis(cfg.ready_max_lag_ms)),
                },
                test_leak_bytes_per_request: test_leak,
            },
        )?;
        Ok(Application {
            listener,
            router,
            service,
            snapshot_interval: cfg.snapshot_interval,
            follow_interval: Duration::from_millis(cfg.follow_interval_ms),
            sync_job_lease: Duration::from_millis(cfg.sync_job_lease_ms.max(1000)),
        })
    }

    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    pub fn service(&self) -> Arc<Service> {
        self.service.clone()
    }

    /// Serves until `shutdown` resolves, then drains requests, snapshots the indexes and closes the database.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let svc = self.service.clone();
        if self.snapshot_interval > 0 {
            let (svc, every) = (svc.clone(), Duration::from_secs(self.snapshot_interval));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    if let Err(e) = svc.snapshot().await {
                        tracing::warn!(error = %e, "periodic index snapshot failed");
                    }
                }
            });
        }
        // Other replicas' writes reach this process's indexes through the database's change sequence.
        // Aborted when serving ends, or when this future is dropped (a test's simulated crash).
        let follower = (!self.follow_interval.is_zero()).then(|| {
            let (svc, every) = (svc.clone(), self.follow_interval);
            AbortOnDrop(tokio::spawn(async move { svc.follow_forever(every).await }))
        });
        // Catalogue feeds sent over HTTP, queued in the database: this server runs its share of them.
        let jobs = AbortOnDrop(tokio::spawn(
            svc.clone()
                .run_sync_jobs(self.sync_job_lease, Duration::from_secs(1)),
        ));
        tracing::info!(addr = %self.listener.local_addr()?, "listening");
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await?;
        drop(follower);
        drop(jobs);
        svc.release_sync_job().await;
        match svc.snapshot().await {
            Ok(n) => tracing::info!(indexes = n, "index snapshots written"),
            Err(e) => tracing::warn!(error = %e, "index snapshot at shutdown failed"),
        }
        svc.close().await;
        Ok(())
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.run_until(shutdown_signal()).await
    }
}

/// The API keys, and a line saying whether the API is open.
fn api_keys(cfg: &ServeArgs) -> anyhow::Result<ApiKeys> {
    let keys = ApiKeys::from_args(&cfg.http)?;
    if keys.is_open() {
        tracing::warn!(
            "no API key configured: the API is open to anyone who can reach it \
             (set JOINTSPACE_ADMIN_KEY and JOINTSPACE_READ_KEY, or their _FILE variants, or JOINTSPACE_KEYS_FILE)"
        );
    } else {
        tracing::info!(
            keys = %keys.summary(),
            "API keys required (Authorization: Bearer)"
        );
    }
    Ok(keys)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}
