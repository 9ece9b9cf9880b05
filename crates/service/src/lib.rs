//! The operations of the product, shared by the HTTP API and the CLI (`ingest`, `eval`, `reindex`):
//! pipeline -> store -> index, in that order, so that a write acknowledged here is committed in the
//! database before it becomes searchable. The service is the only way up to the store: callers above it
//! (api, cli) see rows and hits, never the store itself.
//!
//! One module per area a reader can name: `collections`; `items` (adding, reading, changing, deleting, export
//! and import, catalogue feeds); `search` (by vector, keyword or both); `admin` (reindex, following other
//! replicas, readiness, warm-up, idempotency keys). Beside them: `index_backend` (where the vectors live, chosen
//! once at open: the one place `--index` is matched), `registry` (the only holder of the index map's lock), `database`
//! (the opaque handle to the store), `fetch` (images by URL, behind an address guard), `metrics` (the
//! Prometheus registry the service records into, and the HTTP layer registers its own families in) and `error`.

pub mod fetch;
pub mod metrics;

mod admin;
mod collections;
mod database;
mod error;
mod index_backend;
mod items;
mod registry;
mod search;

use std::{
    path::PathBuf,
    sync::{Arc, atomic::AtomicU64},
    time::Instant,
};

use bytes::Bytes;
// The layers below under the paths the modules use (`crate::store`, `crate::pipeline`, ...): the service is the
// one crate that sees the store, the index and the model together.
use jointspace_core::{filter, modality};
use jointspace_embed::{batch, decode, fne, pipeline, runtime, text};
use jointspace_index as index;
use jointspace_store as store;

/// The index's settings, given at open, and the graph's defaults.
pub use crate::index::{DEFAULT_EF_CONSTRUCTION, DEFAULT_MAX_CONNECTIONS, IndexParams};
/// The rows the service answers with and the values it takes (the store's, handed up as they are).
pub use crate::store::{
    CaptionRow, Claim, CollectionRow, CollectionSettings, IDEMPOTENCY_HEARTBEAT, IdempotencyKey,
    ImagePatch, ImageRow, ImportMark, JobState, SyncedImage, Upserted,
};
pub use admin::follow::{CHANGE_RETENTION, FollowReport};
pub use admin::readiness::{ReadinessReport, ReadyOptions};
pub use admin::reindex::{REINDEX_PAGE_ROWS, Reindexed};
pub use collections::{CollectionName, validate_collection_name};
pub use database::Database;
pub use error::{Result, ServiceError};
pub use index_backend::IndexBackend;
pub use items::feed::{
    Catalogue, DEFAULT_MAX_DELETE_SHARE, FeedChange, FeedFormat, FeedItem, FeedMapping, FeedPhoto,
    FeedSource, SyncAction, SyncFailure, SyncJob, SyncOptions, SyncProgress, SyncReport,
    SyncRequest, read_feed,
};
pub use items::ingest::{AddedImage, ImageInput};
pub use items::transfer::{
    CaptionLine, EXPORT_FORMAT, EndLine, ExportHeader, ExportLine, ImageLine, export_collection,
};
pub use items::updates::{UpsertInput, UpsertOutcome, UpsertedImage, content_hash};
pub use items::url_ingest::{AddReport, ImageItem, ImageSource, ItemFailure};
pub use jointspace_core::TextField;
pub use search::{
    Candidates, CaptionHit, Hits, ImageHit, Product, Query, SearchMode, SearchParams,
    fusion::{Channel, ChannelScores, ChannelValues, Fusion, KeywordWeight, fuse},
};

use crate::{
    filter::FieldPath,
    index::{Attributes, VectorIndex, snapshot_name},
    metrics::Metrics,
    modality::Modality,
    pipeline::{ImageEmbedding, ImageUse, Pipeline},
    store::Store,
};
use registry::{CollectionIndexes, IndexRegistry};

/// The loaded model as callers see it.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub bundle_id: String,
    /// Bundles with the same vision id produce the same codes (a new W applies to stored codes).
    pub vision_id: String,
    pub name: String,
    pub created: String,
    pub similarity: jointspace_core::Similarity,
    pub joint_dim: usize,
    /// Features in the ternary code: every backbone's together.
    pub fne_dim: usize,
    /// The first backbone's crop mode, as it runs (`backbones` has every backbone's).
    pub crop_mode: jointspace_embed::bundle::CropMode,
    /// Each backbone, in code order.
    pub backbones: Vec<BackboneInfo>,
    /// ONNX Runtime's name of the execution provider that runs the graphs.
    pub provider: &'static str,
    /// The trainer's provenance and test metrics, as in bundle.json.
    pub training: serde_json::Value,
}

/// One backbone of the loaded bundle, as `/v1/bundle` reports it.
#[derive(Debug, Clone)]
pub struct BackboneInfo {
    /// What the bundle calls it (`vision.backbone`).
    pub backbone: String,
    pub crop_mode: jointspace_embed::bundle::CropMode,
    /// Its share of the code (`fne.dim`).
    pub fne_dim: usize,
}

pub struct ServiceOptions {
    pub index: IndexParams,
    pub backend: IndexBackend,
    /// Where index snapshots go; none for an in-memory database.
    pub snapshot_dir: Option<PathBuf>,
    pub max_k: usize,
    pub max_batch: usize,
    /// URL ingest's fetcher (`--url-ingest`); none: images given by URL are refused.
    pub url_fetcher: Option<Arc<fetch::Fetcher>>,
}

/// A collection resolved by name, for the operations that need only its id (and, for searches, whether
/// it asked for keyword search).
struct CollectionRef {
    id: i64,
    text_fields: Option<Vec<TextField>>,
    /// The product key: images sharing its value are one product's photos (`search::groups`).
    group_by: Option<FieldPath>,
    /// Whether it held any caption when resolved (a sentence search's default mode).
    has_captions: bool,
}

pub struct Service {
    pipeline: Arc<Pipeline>,
    store: Store,
    metrics: Arc<Metrics>,
    opts: ServiceOptions,
    indexes: IndexRegistry,
    /// Where this process stands in the database's change sequence (jointspace-service, admin/follow.rs).
    follow: tokio::sync::Mutex<admin::follow::FollowState>,
    /// When this service opened; `followed_at_ms` counts from it.
    started: Instant,
    /// When the indexes last held everything committed (the open, then each follow step that succeeded).
    followed_at_ms: AtomicU64,
    probes: admin::readiness::ProbeCache,
    /// Under `--index database`, collections' sizes for the scan-or-walk choice of a filtered search.
    sizes: search::database::CollectionSizes,
    /// How far hybrid searches trust each collection's photos (`search::trust`).
    trust: search::trust::PhotoTrust,
    /// The sync job this process is running, as (job id, attempt), for `release_sync_job` at shutdown.
    running_job: std::sync::Mutex<Option<(i64, i64)>>,
}

impl Service {
    /// Opens every collection's indexes: from the snapshot when it is current, else rebuilt from the database.
    pub async fn open(
        pipeline: Arc<Pipeline>,
        Database(store): Database,
        metrics: Arc<Metrics>,
        opts: ServiceOptions,
    ) -> Result<Service> {
        // Before reading any vector: whatever commits from here on is replayed by the follower.
        let started = Instant::now();
        let cursor = store.change_cursor().await?;
        let svc = Service {
            pipeline,
            store,
            metrics,
            opts,
            indexes: IndexRegistry::default(),
            follow: tokio::sync::Mutex::new(admin::follow::FollowState::new(cursor)),
            started,
            followed_at_ms: AtomicU64::new(0),
            probes: Default::default(),
            sizes: Default::default(),
            trust: Default::default(),
            running_job: Default::default(),
        };
        svc.check_provenance().await?;
        svc.open_indexes().await?;
        svc.update_gauges();
        Ok(svc)
    }

    /// The loaded model, as `/v1/bundle` and the CLI report it.
    pub fn model(&self) -> ModelInfo {
        let (p, b) = (&self.pipeline, &self.pipeline.bundle);
        let m = &b.manifest;
        ModelInfo {
            bundle_id: b.id.clone(),
            vision_id: b.vision_id.clone(),
            name: m.name.clone(),
            created: m.created.clone(),
            similarity: m.similarity,
            joint_dim: p.joint_dim(),
            fne_dim: m.code_dim(),
            crop_mode: p.crop_mode,
            backbones: m
                .backbones()
                .zip(p.crop_modes())
                .map(|(b, crop_mode)| BackboneInfo {
                    backbone: b.vision.backbone.clone(),
                    crop_mode,
                    fne_dim: b.fne.dim,
                })
                .collect(),
            provider: p.provider().ort_name(),
            training: m.training.clone(),
        }
    }

    /// The joint space's dimension (what `model` says, without copying the rest).
    pub fn joint_dim(&self) -> usize {
        self.pipeline.joint_dim()
    }

    /// The inference worker that has stopped for good (the process must be restarted), if one has.
    pub fn stopped_worker(&self) -> Option<&'static str> {
        self.pipeline.stopped_worker()
    }

    /// Vectors from another bundle would be silently wrong: say so, and say how to fix it.
    async fn check_provenance(&self) -> Result<()> {
        let b = &self.pipeline.bundle;
        let mut other_vision = false;
        for (bundle_id, vision_id, n) in self.store.image_provenance().await? {
            other_vision |= vision_id != b.vision_id;
            if bundle_id != b.id {
                let fix = if vision_id == b.vision_id {
                    "run `jointspace reindex` (or POST /v1/admin/reindex) to recompute them from the stored codes"
                        .to_string()
                } else {
                    // The preparation is part of the vision id: the same model with another one codes otherwise.
                    let prepared = b.manifest.backbones().any(|bb| bb.vision.prepare.is_some());
                    let other = if prepared {
                        "another vision model or another preparation of the photos (docs/bundle.md, \"The \
                         preparation\")"
                    } else {
                        "another vision model"
                    };
                    format!(
                        "their codes come from {other}, so `jointspace reindex` cannot recompute them. Send the \
                         photos again: `jointspace sync --collection <name> --feed <your catalogue feed>` re-embeds \
                         every item whose photo another vision model coded, or re-ingest them with `jointspace \
                         ingest --images DIR` into a new collection"
                    )
                };
                tracing::warn!(count = n, stored = %bundle_id, loaded = %b.id, "images were embedded with another bundle; {fix}");
            }
        }
        // A reindex refuses while images of another vision model are stored: then the sync comes first.
        let captions_fix = if other_vision {
            "the sync that re-embeds the images re-embeds their captions, then `jointspace reindex` the rest"
        } else {
            "run `jointspace reindex`"
        };
        for (bundle_id, n) in self.store.caption_provenance().await? {
            if bundle_id != b.id {
                tracing::warn!(count = n, stored = %bundle_id, loaded = %b.id, "captions were embedded with another bundle; {captions_fix}");
            }
        }
        let staged = self.store.staged_rows(&b.id).await?;
        if staged > 0 {
            tracing::warn!(
                staged,
                "a reindex under this bundle was interrupted (the old vectors are still in use); run `jointspace reindex` to finish it: it reuses what was staged"
            );
        }
        Ok(())
    }

    async fn load_indexes(&self, c: &CollectionRow) -> Result<CollectionIndexes> {
        let mut out = Vec::with_capacity(2);
        for m in Modality::BOTH {
            let vectors = self.store.vectors(c.id, m).await?;
            let params = self.opts.index;
            let bundle_id = self.pipeline.bundle.id.clone();
            let (dir, gen_) = (self.opts.snapshot_dir.clone(), c.generation);
            let name = snapshot_name(c.id, m);
            let (idx, source) = tokio::task::spawn_blocking(move || match dir {
                Some(dir) => match VectorIndex::load(params, &dir, &name, gen_, &bundle_id, vectors) {
                    Ok(idx) => {
                        tracing::info!(index = %name, points = idx.len(), "index loaded from snapshot");
                        Ok((idx, "snapshot"))
                    }
                    Err((why, vectors)) => {
                        tracing::info!(index = %name, points = vectors.len(), reason = %why, "index rebuilt from the database");
                        VectorIndex::build(params, vectors).map(|i| (i, "database"))
                    }
                },
                None => VectorIndex::build(params, vectors).map(|i| (i, "database")),
            })
            .await
            .map_err(|e| ServiceError::Unavailable(format!("index build failed: {e}")))??;
            self.metrics.index_loaded(source);
            if self.pipeline.bundle.offsets_bank(m).is_some() {
                // Read after the vectors: every point built above has its row (or was deleted since).
                idx.set_offsets(self.store.offsets(c.id, m).await?);
            }
            out.push(Arc::new(idx));
        }
        let [images, captions]: [Arc<VectorIndex>; 2] = out
            .try_into()
            .map_err(|_| ServiceError::Unavailable("index build failed".into()))?;
        // Read after the vectors, as the offsets: an image added since has its row, and the follower its
        // change.
        let attributes = Arc::new(Attributes::new(
            self.store.image_metadata(c.id, None).await?,
        ));
        Ok(CollectionIndexes {
            images,
            captions,
            attributes,
        })
    }

    /// `collection_ref` for a write: also requires the collection's index loaded here (`--index memory`) before
    /// anything is stored. A write committed and then refused for want of an index would release its
    /// idempotency key (a failed request wrote nothing), so its retry would store it twice.
    async fn writable_ref(&self, name: &CollectionName) -> Result<CollectionRef> {
        let c = self.collection_ref(name).await?;
        self.memory_indexes(c.id)?;
        Ok(c)
    }

    fn indexes_of(&self, collection_id: i64) -> Result<CollectionIndexes> {
        self.indexes.get(collection_id).ok_or_else(|| {
            ServiceError::Unavailable(
                "this collection's index is not loaded yet; retry in a moment".into(),
            )
        })
    }

    fn update_gauges(&self) {
        let (i, c) = self.indexes.sizes();
        self.metrics.set_index_sizes(i as i64, c as i64);
    }

    /// Closes the database when this process is done with it (after serving, at the end of a command).
    pub async fn close(&self) {
        self.store.close().await;
    }

    /// Writes a snapshot of every index (at shutdown, and on demand).
    pub async fn snapshot(&self) -> Result<usize> {
        let Some(dir) = self
            .opts
            .snapshot_dir
            .clone()
            .filter(|_| self.graphs().is_some())
        else {
            return Ok(0);
        };
        let mut n = 0;
        for c in self.store.list_collections().await? {
            let Ok(idx) = self.indexes_of(c.id) else {
                continue;
            };
            for m in Modality::BOTH {
                let (idx, dir, name, bid) = (
                    idx.get(m).clone(),
                    dir.clone(),
                    snapshot_name(c.id, m),
                    self.pipeline.bundle.id.clone(),
                );
                let gen_ = c.generation;
                let res =
                    tokio::task::spawn_blocking(move || idx.save(&dir, &name, gen_, &bid)).await;
                match res {
                    Ok(Ok(())) => n += 1,
                    Ok(Err(e)) => tracing::warn!(error = %e, "index snapshot failed"),
                    Err(e) => tracing::warn!(error = %e, "index snapshot failed"),
                }
            }
        }
        Ok(n)
    }

    /// Runs one database call and records its latency (`jointspace_db_duration_seconds{op}`).
    async fn timed_db<T>(&self, op: &str, f: impl Future<Output = T>) -> T {
        let t = std::time::Instant::now();
        let r = f.await;
        self.metrics.observe_db(op, t.elapsed());
        r
    }

    /// The collection's id by name, without `collection`'s row counts: every request resolves its collection,
    /// and counting 100k rows twice per search cost more than the search (docs/benchmarks.md).
    async fn collection_ref(&self, name: &CollectionName) -> Result<CollectionRef> {
        let key = self.store.collection_key(name.as_str()).await?;
        // Checked when the collection was created.
        let group_by = key
            .settings
            .group_by
            .as_deref()
            .and_then(|g| FieldPath::parse(g).ok());
        Ok(CollectionRef {
            id: key.id,
            text_fields: key.settings.text_fields,
            group_by,
            has_captions: key.has_captions,
        })
    }

    // ---- the pipeline, timed ----

    pub async fn embed_images(
        &self,
        images: Vec<Bytes>,
        purpose: ImageUse,
    ) -> Result<Vec<ImageEmbedding>> {
        let t = std::time::Instant::now();
        let n = images.len();
        let r = self
            .pipeline
            .embed_images(images, purpose)
            .await
            .map_err(|(i, e)| ServiceError::embed((n > 1).then_some(i), e));
        self.metrics.observe_embed("image", n, t.elapsed());
        r
    }

    pub async fn embed_texts(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let t = std::time::Instant::now();
        let r = self
            .pipeline
            .embed_texts(texts)
            .await
            .map_err(|(i, e)| ServiceError::embed((texts.len() > 1).then_some(i), e));
        self.metrics.observe_embed("text", texts.len(), t.elapsed());
        r
    }

    /// The joint vectors of sentences to store, each with its search offset (docs/bundle.md, "The annotation
    /// side"; 0 without an annotation bank).
    async fn with_caption_offsets(&self, vectors: Vec<Vec<f32>>) -> Result<Vec<(Vec<f32>, f32)>> {
        let (vectors, offsets) = self
            .pipeline
            .caption_offsets(vectors)
            .await
            .map_err(|e| ServiceError::embed(None, e))?;
        Ok(vectors.into_iter().zip(offsets).collect())
    }

    /// Sentences already tokenised (by `Pipeline::tokenize`, which reported bad input, or a search's
    /// `Pipeline::sentence`), embedded and timed.
    async fn embed_tokens(&self, ids: Vec<Vec<i64>>) -> Result<Vec<Vec<f32>>> {
        let t = std::time::Instant::now();
        let n = ids.len();
        let r = self
            .pipeline
            .embed_tokens(ids)
            .await
            .map_err(|e| ServiceError::embed(None, e));
        self.metrics.observe_embed("text", n, t.elapsed());
        r
    }
}
