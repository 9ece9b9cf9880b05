//! The operations of the product, shared by the HTTP API and the CLI (`ingest`, `eval`, `reindex`):
//! pipeline -> store -> index, in that order, so that a write acknowledged here is committed in the
//! database before it becomes searchable.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, RwLock},
};

use bytes::Bytes;
use serde_json::Value;

mod follow;
pub use follow::{CHANGE_RETENTION, FollowReport};

use crate::{
    decode::DecodeError,
    fne::TernaryCode,
    index::{IndexParams, Score, VectorIndex, snapshot_name},
    metrics::Metrics,
    pipeline::{EmbedError, ImageEmbedding, ImageUse, Pipeline},
    runtime::RuntimeError,
    store::{
        CaptionRow, CollectionRow, ImageRow, Modality, NewCaption, NewImage, Provenance, Store,
        StoreError,
    },
    text::TextError,
};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{}{source}", at(*.index))]
    Decode {
        index: Option<usize>,
        source: DecodeError,
    },
    #[error("{}{source}", at(*.index))]
    Text {
        index: Option<usize>,
        source: TextError,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Well-formed but unacceptable input (422).
    #[error("{0}")]
    Invalid(String),
    /// Not ready to serve this yet (503).
    #[error("{0}")]
    Unavailable(String),
}

fn at(index: Option<usize>) -> String {
    index.map(|i| format!("item {i}: ")).unwrap_or_default()
}

impl ServiceError {
    fn embed(index: Option<usize>, e: EmbedError) -> ServiceError {
        match e {
            EmbedError::Decode(source) => ServiceError::Decode { index, source },
            EmbedError::Text(source) => ServiceError::Text { index, source },
            EmbedError::Runtime(e) => ServiceError::Runtime(e),
        }
    }
}

pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

pub struct ImageInput {
    pub bytes: Bytes,
    pub external_id: Option<String>,
    pub metadata: Option<Value>,
    pub captions: Vec<String>,
}

pub struct AddedImage {
    pub id: i64,
    pub external_id: Option<String>,
    pub caption_ids: Vec<i64>,
    pub width: u32,
    pub height: u32,
}

/// A search query: a sentence, an uploaded image, or an image already stored in the collection.
pub enum Query {
    Text(String),
    Image(Bytes),
    ImageId(i64),
}

pub struct SearchParams {
    pub k: usize,
    pub offset: usize,
    pub filter: BTreeMap<String, Value>,
}

pub struct ImageHit {
    pub score: f32,
    pub image: ImageRow,
}

pub struct CaptionHit {
    pub score: f32,
    pub caption: CaptionRow,
}

#[derive(Clone)]
struct CollectionIndexes {
    images: Arc<VectorIndex>,
    captions: Arc<VectorIndex>,
}

impl CollectionIndexes {
    fn get(&self, m: Modality) -> &Arc<VectorIndex> {
        match m {
            Modality::Images => &self.images,
            Modality::Captions => &self.captions,
        }
    }
}

pub struct ServiceOptions {
    pub index: IndexParams,
    /// Where index snapshots go; none for an in-memory database.
    pub snapshot_dir: Option<PathBuf>,
    pub max_k: usize,
    pub max_batch: usize,
}

/// A collection resolved by name, for the operations that need only its id.
struct CollectionRef {
    id: i64,
}

pub struct Service {
    pub pipeline: Arc<Pipeline>,
    pub store: Store,
    pub metrics: Arc<Metrics>,
    pub opts: ServiceOptions,
    indexes: RwLock<HashMap<i64, CollectionIndexes>>,
    /// Where this process stands in the database's change sequence (src/service/follow.rs).
    follow: tokio::sync::Mutex<follow::FollowState>,
}

pub fn validate_collection_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(ServiceError::Invalid(format!(
            "collection name \"{}\" is not allowed: use 1-64 lower-case letters, digits, '-' or '_', starting with a letter or digit",
            name.chars().take(80).collect::<String>()
        )))
    }
}

impl Service {
    /// Opens every collection's indexes: from the snapshot when it is current, else rebuilt from the database.
    pub async fn open(
        pipeline: Arc<Pipeline>,
        store: Store,
        metrics: Arc<Metrics>,
        opts: ServiceOptions,
    ) -> Result<Service> {
        // Before reading any vector: whatever commits from here on is replayed by the follower.
        let cursor = store.change_cursor().await?;
        let svc = Service {
            pipeline,
            store,
            metrics,
            opts,
            indexes: RwLock::new(HashMap::new()),
            follow: tokio::sync::Mutex::new(follow::FollowState::new(cursor)),
        };
        svc.check_provenance().await?;
        for c in svc.store.list_collections().await? {
            let idx = svc.load_indexes(&c).await?;
            svc.indexes
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(c.id, idx);
        }
        svc.update_gauges();
        Ok(svc)
    }

    /// Vectors from another bundle would be silently wrong: say so, and say how to fix it.
    async fn check_provenance(&self) -> Result<()> {
        let b = &self.pipeline.bundle;
        for (bundle_id, vision_id, n) in self.store.image_provenance().await? {
            if bundle_id != b.id {
                let fix = if vision_id == b.vision_id {
                    "run `jointspace reindex` (or POST /v1/admin/reindex) to recompute them from the stored codes"
                } else {
                    "their codes come from another vision model: re-ingest the images"
                };
                tracing::warn!(count = n, stored = %bundle_id, loaded = %b.id, "images were embedded with another bundle; {fix}");
            }
        }
        for (bundle_id, n) in self.store.caption_provenance().await? {
            if bundle_id != b.id {
                tracing::warn!(count = n, stored = %bundle_id, loaded = %b.id, "captions were embedded with another bundle; run `jointspace reindex`");
            }
        }
        Ok(())
    }

    async fn load_indexes(&self, c: &CollectionRow) -> Result<CollectionIndexes> {
        let mut out = Vec::with_capacity(2);
        for m in [Modality::Images, Modality::Captions] {
            let vectors = self.store.vectors(c.id, m).await?;
            let params = self.opts.index;
            let bundle_id = self.pipeline.bundle.id.clone();
            let (dir, gen_) = (self.opts.snapshot_dir.clone(), c.generation);
            let name = snapshot_name(c.id, m);
            let idx = tokio::task::spawn_blocking(move || match dir {
                Some(dir) => match VectorIndex::load(params, &dir, &name, gen_, &bundle_id, vectors) {
                    Ok(idx) => {
                        tracing::info!(index = %name, points = idx.len(), "index loaded from snapshot");
                        idx
                    }
                    Err((why, vectors)) => {
                        tracing::info!(index = %name, points = vectors.len(), reason = %why, "index rebuilt from the database");
                        VectorIndex::build(params, vectors)
                    }
                },
                None => VectorIndex::build(params, vectors),
            })
            .await
            .map_err(|e| ServiceError::Unavailable(format!("index build failed: {e}")))?;
            if m == Modality::Images {
                // Read after the vectors: every image built above has its row (or was deleted since).
                idx.set_offsets(self.store.image_offsets(c.id).await?);
            }
            out.push(Arc::new(idx));
        }
        let captions = out.pop().expect("two indexes");
        let images = out.pop().expect("two indexes");
        Ok(CollectionIndexes { images, captions })
    }

    fn indexes_of(&self, collection_id: i64) -> Result<CollectionIndexes> {
        self.indexes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&collection_id)
            .cloned()
            .ok_or_else(|| {
                ServiceError::Unavailable(
                    "this collection's index is not loaded yet; retry in a moment".into(),
                )
            })
    }

    fn update_gauges(&self) {
        let map = self.indexes.read().unwrap_or_else(|p| p.into_inner());
        let (mut i, mut c) = (0, 0);
        for idx in map.values() {
            i += idx.images.len();
            c += idx.captions.len();
        }
        self.metrics.set_index_sizes(i as i64, c as i64);
    }

    /// Writes a snapshot of every index (at shutdown, and on demand).
    pub async fn snapshot(&self) -> Result<usize> {
        let Some(dir) = self.opts.snapshot_dir.clone() else {
            return Ok(0);
        };
        let mut n = 0;
        for c in self.store.list_collections().await? {
            let Ok(idx) = self.indexes_of(c.id) else {
                continue;
            };
            for m in [Modality::Images, Modality::Captions] {
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

    // ---- collections ----

    pub async fn create_collection(&self, name: &str, description: &str) -> Result<CollectionRow> {
        validate_collection_name(name)?;
        let row = self.store.create_collection(name, description).await?;
        let params = self.opts.index;
        let idx = CollectionIndexes {
            images: Arc::new(VectorIndex::build(params, vec![])),
            captions: Arc::new(VectorIndex::build(params, vec![])),
        };
        // The follower may have loaded it already (and items added elsewhere since): keep that one.
        self.indexes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(row.id)
            .or_insert(idx);
        Ok(row)
    }

    pub async fn collection(&self, name: &str) -> Result<CollectionRow> {
        validate_collection_name(name)?;
        Ok(self
            .timed_db("collection", self.store.collection(name))
            .await?)
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
    async fn collection_ref(&self, name: &str) -> Result<CollectionRef> {
        validate_collection_name(name)?;
        Ok(CollectionRef {
            id: self.store.collection_id(name).await?,
        })
    }

    pub async fn delete_collection(&self, name: &str) -> Result<()> {
        validate_collection_name(name)?;
        let id = self.store.delete_collection(name).await?;
        self.indexes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some(dir) = &self.opts.snapshot_dir {
            for m in [Modality::Images, Modality::Captions] {
                crate::index::remove_snapshot(dir, &snapshot_name(id, m));
            }
        }
        self.update_gauges();
        Ok(())
    }

    // ---- images ----

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

    pub async fn add_images(
        &self,
        collection: &str,
        inputs: Vec<ImageInput>,
    ) -> Result<Vec<AddedImage>> {
        let c = self.collection_ref(collection).await?;
        if inputs.is_empty() {
            return Err(ServiceError::Invalid("no images in the request".into()));
        }
        if inputs.len() > self.opts.max_batch {
            return Err(ServiceError::Invalid(format!(
                "{} images in one request; the limit is {}",
                inputs.len(),
                self.opts.max_batch
            )));
        }
        let mut seen = HashSet::new();
        for (i, inp) in inputs.iter().enumerate() {
            if let Some(e) = &inp.external_id {
                if e.is_empty() || e.len() > 256 {
                    return Err(ServiceError::Invalid(format!(
                        "image {i}: external_id must be 1-256 characters"
                    )));
                }
                if !seen.insert(e.as_str()) {
                    return Err(ServiceError::Store(StoreError::Conflict(format!(
                        "image {i}: external_id \"{e}\" appears twice in the request"
                    ))));
                }
            }
            if let Some(m) = &inp.metadata {
                if !m.is_object() {
                    return Err(ServiceError::Invalid(format!(
                        "image {i}: metadata must be a JSON object"
                    )));
                }
            }
        }
        // Captions are checked (tokenised) before the expensive image path runs.
        let texts: Vec<String> = inputs
            .iter()
            .flat_map(|i| i.captions.iter().cloned())
            .collect();
        if texts.len() > self.opts.max_batch * 10 {
            return Err(ServiceError::Invalid(format!(
                "{} captions in one request; the limit is {}",
                texts.len(),
                self.opts.max_batch * 10
            )));
        }
        self.pipeline
            .tokenize(&texts)
            .map_err(|(i, e)| ServiceError::Text {
                index: Some(i),
                source: e,
            })?;
        let (bytes, rest): (Vec<Bytes>, Vec<_>) = inputs
            .into_iter()
            .map(|i| (i.bytes, (i.external_id, i.metadata, i.captions)))
            .unzip();
        let embeddings = self.embed_images(bytes, ImageUse::Store).await?;
        let text_vecs = self.embed_texts(&texts).await?;
        let mut tv = text_vecs.into_iter();
        let rows: Vec<NewImage> = embeddings
            .into_iter()
            .zip(rest)
            .map(|(e, (external_id, metadata, captions))| NewImage {
                external_id,
                metadata: metadata.unwrap_or_else(|| Value::Object(Default::default())),
                width: e.width,
                height: e.height,
                code: e.code.packed().to_vec(),
                vector: e.vector,
                offset: e.offset,
                captions: captions
                    .into_iter()
                    .map(|t| (t, tv.next().unwrap_or_default()))
                    .collect(),
            })
            .collect();
        let b = &self.pipeline.bundle;
        let ids = self
            .timed_db(
                "insert_images",
                self.store.insert_images(
                    c.id,
                    &rows,
                    Provenance {
                        bundle_id: &b.id,
                        vision_id: &b.vision_id,
                    },
                ),
            )
            .await?;
        // Committed: now make them searchable.
        let idx = self.indexes_of(c.id)?;
        let mut out = Vec::with_capacity(rows.len());
        for (row, (id, cap_ids)) in rows.into_iter().zip(ids) {
            idx.images.insert(id, row.vector, row.offset);
            for ((_, v), cid) in row.captions.into_iter().zip(&cap_ids) {
                idx.captions.insert(*cid, v, 0.0);
            }
            out.push(AddedImage {
                id,
                external_id: row.external_id,
                caption_ids: cap_ids,
                width: row.width,
                height: row.height,
            });
        }
        self.update_gauges();
        Ok(out)
    }

    pub async fn image(&self, collection: &str, id: i64) -> Result<(ImageRow, Vec<CaptionRow>)> {
        let c = self.collection_ref(collection).await?;
        let img = self.store.image(c.id, id).await?;
        let caps = self.store.list_captions(c.id, Some(id), 0, 1000).await?;
        Ok((img, caps))
    }

    pub async fn image_code(&self, collection: &str, id: i64) -> Result<TernaryCode> {
        let c = self.collection_ref(collection).await?;
        let raw = self.store.image_code(c.id, id).await?;
        TernaryCode::from_packed(self.pipeline.projection().fne_dim(), raw).map_err(|e| {
            ServiceError::Unavailable(format!("stored code of image {id} is unusable: {e}"))
        })
    }

    pub async fn delete_image(&self, collection: &str, id: i64) -> Result<()> {
        let c = self.collection_ref(collection).await?;
        let caps = self.store.delete_image(c.id, id).await?;
        let idx = self.indexes_of(c.id)?;
        self.hide(&idx.images, id);
        for cid in caps {
            self.hide(&idx.captions, cid);
        }
        self.update_gauges();
        Ok(())
    }

    fn hide(&self, idx: &Arc<VectorIndex>, id: i64) {
        if idx.remove(id) {
            let idx = idx.clone();
            tokio::task::spawn_blocking(move || idx.rebuild());
        }
    }

    pub async fn list_images(
        &self,
        collection: &str,
        filter: &BTreeMap<String, Value>,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<ImageRow>> {
        let c = self.collection_ref(collection).await?;
        Ok(self.store.list_images(c.id, filter, offset, limit).await?)
    }

    // ---- captions ----

    pub async fn add_captions(
        &self,
        collection: &str,
        caps: Vec<(Option<i64>, String)>,
    ) -> Result<Vec<i64>> {
        let c = self.collection_ref(collection).await?;
        if caps.is_empty() {
            return Err(ServiceError::Invalid("no captions in the request".into()));
        }
        if caps.len() > self.opts.max_batch * 10 {
            return Err(ServiceError::Invalid(format!(
                "{} captions in one request; the limit is {}",
                caps.len(),
                self.opts.max_batch * 10
            )));
        }
        let texts: Vec<String> = caps.iter().map(|(_, t)| t.clone()).collect();
        let vecs = self.embed_texts(&texts).await?;
        let rows: Vec<NewCaption> = caps
            .into_iter()
            .zip(vecs)
            .map(|((image_id, text), vector)| NewCaption {
                image_id,
                text,
                vector,
            })
            .collect();
        let ids = self
            .store
            .insert_captions(c.id, &rows, &self.pipeline.bundle.id)
            .await?;
        let idx = self.indexes_of(c.id)?;
        for (row, id) in rows.into_iter().zip(&ids) {
            idx.captions.insert(*id, row.vector, 0.0);
        }
        self.update_gauges();
        Ok(ids)
    }

    pub async fn list_captions(
        &self,
        collection: &str,
        image_id: Option<i64>,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<CaptionRow>> {
        let c = self.collection_ref(collection).await?;
        Ok(self
            .store
            .list_captions(c.id, image_id, offset, limit)
            .await?)
    }

    pub async fn delete_caption(&self, collection: &str, id: i64) -> Result<()> {
        let c = self.collection_ref(collection).await?;
        self.store.delete_caption(c.id, id).await?;
        let idx = self.indexes_of(c.id)?;
        self.hide(&idx.captions, id);
        self.update_gauges();
        Ok(())
    }

    // ---- search ----

    fn check_window(&self, p: &SearchParams) -> Result<()> {
        if p.k == 0 || p.k > self.opts.max_k {
            return Err(ServiceError::Invalid(format!(
                "k is {}; it must be between 1 and {}",
                p.k, self.opts.max_k
            )));
        }
        if p.offset > 10 * self.opts.max_k {
            return Err(ServiceError::Invalid(format!(
                "offset is {}; the largest offset is {}",
                p.offset,
                10 * self.opts.max_k
            )));
        }
        Ok(())
    }

    /// The query's vector and modality; for a stored image, also its id (excluded from image results).
    async fn query_vector(
        &self,
        c: &CollectionRef,
        q: Query,
    ) -> Result<(Vec<f32>, Modality, Option<i64>)> {
        Ok(match q {
            Query::Text(t) => (
                self.embed_texts(&[t]).await?.remove(0),
                Modality::Captions,
                None,
            ),
            Query::Image(b) => (
                self.embed_images(vec![b], ImageUse::Query)
                    .await?
                    .remove(0)
                    .vector,
                Modality::Images,
                None,
            ),
            Query::ImageId(id) => {
                let v = match self.indexes_of(c.id)?.images.vector(id) {
                    Some(v) => v.to_vec(),
                    None => self.store.image_vector(c.id, id).await?,
                };
                (v, Modality::Images, Some(id))
            }
        })
    }

    /// How a query of modality `qm` scores stored items of `target` under the loaded bundle.
    fn score(&self, qm: Modality, target: Modality) -> Score {
        Score::new(
            self.pipeline.similarity(),
            qm,
            target,
            self.pipeline.bundle.hubness.is_some(),
        )
    }

    /// Internal search without the HTTP limits (for `eval`, which ranks against the whole split).
    pub async fn rank(
        &self,
        collection_id: i64,
        target: Modality,
        q: &[f32],
        qm: Modality,
        k: usize,
    ) -> Result<Vec<(i64, f32)>> {
        let idx = self.indexes_of(collection_id)?.get(target).clone();
        let score = self.score(qm, target);
        Ok(idx.search(q, score, 0, k, None))
    }

    pub async fn search_images(
        &self,
        collection: &str,
        q: Query,
        p: SearchParams,
    ) -> Result<Vec<ImageHit>> {
        self.check_window(&p)?;
        let t = std::time::Instant::now();
        let c = self.collection_ref(collection).await?;
        let (v, qm, exclude) = self.query_vector(&c, q).await?;
        let mut allowed: Option<HashSet<i64>> = if p.filter.is_empty() {
            None
        } else {
            Some(
                self.store
                    .filter_image_ids(c.id, &p.filter)
                    .await?
                    .into_iter()
                    .collect(),
            )
        };
        if let (Some(x), Some(a)) = (exclude, allowed.as_mut()) {
            a.remove(&x);
        }
        let idx = self.indexes_of(c.id)?.images;
        let score = self.score(qm, Modality::Images);
        // The query image itself is left out before paging, so pages neither skip nor repeat a result.
        let (offset, k) = (p.offset, p.k);
        let hits = tokio::task::spawn_blocking(move || {
            let extra = usize::from(exclude.is_some());
            idx.search(&v, score, 0, offset + k + extra, allowed.as_ref())
        })
        .await
        .map_err(|e| ServiceError::Unavailable(e.to_string()))?;
        let hits: Vec<(i64, f32)> = hits
            .into_iter()
            .filter(|(id, _)| Some(*id) != exclude)
            .skip(offset)
            .take(k)
            .collect();
        let ids: Vec<i64> = hits.iter().map(|h| h.0).collect();
        let mut rows: HashMap<i64, ImageRow> = self
            .timed_db("fetch_hits", self.store.images_by_ids(c.id, &ids))
            .await?
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        self.metrics.observe_search("images", t.elapsed());
        // An id deleted between the index read and the row fetch simply drops out.
        Ok(hits
            .into_iter()
            .filter_map(|(id, score)| rows.remove(&id).map(|image| ImageHit { score, image }))
            .collect())
    }

    pub async fn search_captions(
        &self,
        collection: &str,
        q: Query,
        p: SearchParams,
    ) -> Result<Vec<CaptionHit>> {
        self.check_window(&p)?;
        if !p.filter.is_empty() {
            return Err(ServiceError::Invalid(
                "filters apply to image metadata; caption search takes none".into(),
            ));
        }
        let t = std::time::Instant::now();
        let c = self.collection_ref(collection).await?;
        let (v, qm, _) = self.query_vector(&c, q).await?;
        let idx = self.indexes_of(c.id)?.captions;
        let score = self.score(qm, Modality::Captions);
        let (offset, k) = (p.offset, p.k);
        let hits = tokio::task::spawn_blocking(move || idx.search(&v, score, offset, k, None))
            .await
            .map_err(|e| ServiceError::Unavailable(e.to_string()))?;
        let ids: Vec<i64> = hits.iter().map(|h| h.0).collect();
        let mut rows: HashMap<i64, CaptionRow> = self
            .timed_db("fetch_hits", self.store.captions_by_ids(c.id, &ids))
            .await?
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        self.metrics.observe_search("captions", t.elapsed());
        Ok(hits
            .into_iter()
            .filter_map(|(id, score)| {
                rows.remove(&id)
                    .map(|caption| CaptionHit { score, caption })
            })
            .collect())
    }

    // ---- reindex ----

    /// Recomputes every image vector from its stored code with the loaded W (no CNN), and every caption
    /// vector with the loaded text model, then rebuilds the indexes. Refuses codes from another vision model.
    pub async fn reindex(&self) -> Result<(usize, usize)> {
        let b = self.pipeline.bundle.clone();
        let dim = self.pipeline.projection().fne_dim();
        let mut after = 0;
        let mut images = 0;
        loop {
            let page = self.store.codes_page(after, 1000).await?;
            let Some(last) = page.last() else { break };
            after = last.0;
            let (mut ids, mut codes) = (
                Vec::with_capacity(page.len()),
                Vec::with_capacity(page.len()),
            );
            for (id, code, vision_id) in page {
                if vision_id != b.vision_id {
                    return Err(ServiceError::Invalid(format!(
                        "image {id} was coded by another vision model ({vision_id}, loaded {}); its code cannot be reused: re-ingest it",
                        b.vision_id
                    )));
                }
                let code = TernaryCode::from_packed(dim, code).map_err(|e| {
                    ServiceError::Invalid(format!("image {id}: stored code is invalid: {e}"))
                })?;
                ids.push(id);
                codes.push(code);
            }
            let (vectors, offsets) = self
                .pipeline
                .project_codes(codes)
                .await
                .map_err(|e| ServiceError::embed(None, e))?;
            let rows: Vec<(i64, Vec<f32>)> = ids.into_iter().zip(vectors).collect();
            images += rows.len();
            self.store
                .update_vectors(Modality::Images, &rows, &offsets, &b.id)
                .await?;
        }
        let (mut after, mut captions) = (0, 0);
        loop {
            let page = self.store.captions_page(after, 512).await?;
            let Some(last) = page.last() else { break };
            after = last.0;
            let (ids, texts): (Vec<i64>, Vec<String>) = page.into_iter().unzip();
            let vecs = self.embed_texts(&texts).await?;
            captions += ids.len();
            self.store
                .update_vectors(
                    Modality::Captions,
                    &ids.into_iter().zip(vecs).collect::<Vec<_>>(),
                    &[],
                    &b.id,
                )
                .await?;
        }
        // Other replicas reload too when they read this.
        self.store.log_reload().await?;
        for c in self.store.list_collections().await? {
            let idx = self.load_indexes(&c).await?;
            self.indexes
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(c.id, idx);
        }
        self.update_gauges();
        Ok((images, captions))
    }
}
