//! Prometheus metrics: embedding and search latency, inference batching and queueing, database latency, index
//! sizes, URL fetches, the execution provider. One registry for the process: the HTTP layer registers its own
//! families (traffic, keys) into it (`register`), so `/metrics` is one exposition.

use std::{sync::Mutex, time::Duration};

use crate::{batch::BatchStats, runtime::Provider};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Metric, Registry},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: String,
}

fn batch_rows() -> Histogram {
    BatchStats::default().batch_rows
}

/// Latency buckets, 1 ms to 30 s.
pub fn latency() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

/// Registers `metric` and hands it back: a metric is a shared handle, so the copy kept is the one registered.
pub fn registered<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

pub fn latency_family<L: Clone + std::hash::Hash + Eq>() -> Family<L, Histogram> {
    Family::new_with_constructor(latency)
}

pub struct Metrics {
    registry: Mutex<Registry>,
    embed_seconds: Family<KindLabels, Histogram>,
    embed_items: Family<KindLabels, Counter>,
    search_seconds: Family<KindLabels, Histogram>,
    index_images: Gauge,
    index_captions: Gauge,
    queue_depth: Family<ModelLabels, Gauge>,
    batch_rows: Family<ModelLabels, Histogram>,
    rejected: Family<ModelLabels, Counter>,
    db_seconds: Family<OpLabels, Histogram>,
    provider: Family<ProviderLabels, Gauge>,
    index_loads: Family<SourceLabels, Counter>,
    url_fetches: Family<OutcomeLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("jointspace");
        // Fields in registration order: the text exposition lists metrics in that order.
        Metrics {
            embed_seconds: registered(
                &mut r,
                "embed_duration_seconds",
                "Time to embed one request's images or texts",
                latency_family(),
            ),
            embed_items: registered(
                &mut r,
                "embedded_items",
                "Images and texts embedded",
                Family::default(),
            ),
            search_seconds: registered(
                &mut r,
                "search_duration_seconds",
                "Search latency including the query embedding",
                latency_family(),
            ),
            index_images: registered(
                &mut r,
                "index_images",
                "Live image vectors in all indexes",
                Gauge::default(),
            ),
            index_captions: registered(
                &mut r,
                "index_captions",
                "Live caption vectors in all indexes",
                Gauge::default(),
            ),
            queue_depth: registered(
                &mut r,
                "inference_queue_depth",
                "Crops (vision) or sentences (text) waiting for the inference worker",
                Family::default(),
            ),
            batch_rows: registered(
                &mut r,
                "inference_batch_rows",
                "Rows (crops or sentences) in each runtime call; above 1 when concurrent requests are batched",
                Family::new_with_constructor(batch_rows as fn() -> Histogram),
            ),
            rejected: registered(
                &mut r,
                "inference_rejected",
                "Requests refused because the inference queue was full (429)",
                Family::default(),
            ),
            db_seconds: registered(
                &mut r,
                "db_duration_seconds",
                "Database call latency by operation",
                latency_family(),
            ),
            provider: registered(
                &mut r,
                "execution_provider",
                "1 for the ONNX Runtime execution provider that runs the graphs (cpu, cuda)",
                Family::default(),
            ),
            index_loads: registered(
                &mut r,
                "index_loads",
                "Indexes loaded at start or reload: source=snapshot (a snapshot, brought up to the database) or \
                 database (built from every stored vector)",
                Family::default(),
            ),
            url_fetches: registered(
                &mut r,
                "url_fetches",
                "Images fetched for URL ingest, by outcome: ok, or why not (forbidden, timeout, too_large, not_image, \
                 status, redirects, unreachable, invalid_url, off)",
                Family::default(),
            ),
            registry: Mutex::new(r),
        }
    }

    pub fn observe_embed(&self, kind: &str, n: usize, d: Duration) {
        let l = KindLabels {
            kind: kind.to_string(),
        };
        self.embed_seconds
            .get_or_create(&l)
            .observe(d.as_secs_f64());
        self.embed_items.get_or_create(&l).inc_by(n as u64);
    }

    /// Images or texts (`kind`) embedded so far: what a batch job reports of its model work.
    pub fn embedded(&self, kind: &str) -> u64 {
        self.embed_items
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .get()
    }

    /// The instruments a batcher for `model` (vision, text) updates.
    pub fn batch_stats(&self, model: &str) -> BatchStats {
        let l = ModelLabels {
            model: model.to_string(),
        };
        BatchStats {
            queue_depth: self.queue_depth.get_or_create(&l).clone(),
            batch_rows: self.batch_rows.get_or_create(&l).clone(),
            rejected: self.rejected.get_or_create(&l).clone(),
        }
    }

    pub fn observe_db(&self, op: &str, d: Duration) {
        self.db_seconds
            .get_or_create(&OpLabels { op: op.to_string() })
            .observe(d.as_secs_f64());
    }

    pub fn observe_search(&self, kind: &str, d: Duration) {
        self.search_seconds
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .observe(d.as_secs_f64());
    }

    pub fn set_index_sizes(&self, images: i64, captions: i64) {
        self.index_images.set(images);
        self.index_captions.set(captions);
    }

    /// Counts a URL ingest fetch by outcome: "ok" or the refusal's kind.
    pub fn url_fetched(&self, outcome: &str) {
        self.url_fetches
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Counts an index load by where its graph came from: "snapshot" or "database".
    pub fn index_loaded(&self, source: &str) {
        self.index_loads
            .get_or_create(&SourceLabels {
                source: source.to_string(),
            })
            .inc();
    }

    /// Marks the execution provider in use: one series, at 1 (an info-style gauge, its label the value).
    pub fn set_provider(&self, p: Provider) {
        self.provider
            .get_or_create(&ProviderLabels {
                provider: p.as_str().to_string(),
            })
            .set(1);
    }

    /// Registers more metric families (the HTTP layer's) into the one registry: `f` registers them and
    /// answers their handles.
    pub fn register<T>(&self, f: impl FnOnce(&mut Registry) -> T) -> T {
        let mut r = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut r)
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let r = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = encode(&mut s, &r);
        s
    }
}
