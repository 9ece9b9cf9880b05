//! Step 8: one vector index per collection and modality: HNSW (USearch, bfloat16) for candidates, exact f32
//! scores for the final order. Deletes leave holes that USearch skips; the graph is rebuilt in the background
//! once too many accumulate. Small or heavily filtered searches skip the graph and scan exactly (faster
//! there, and exact).

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex, RwLock},
};

use serde::{Deserialize, Serialize};
use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

use crate::{bundle::Similarity, store::Modality};

#[derive(Debug, Clone, Copy)]
pub struct IndexParams {
    pub max_connections: usize,
    pub ef_construction: usize,
    pub ef_search: usize,
    /// Below this many live vectors (or allowed ids, under a filter), search scans exactly.
    pub exact_below: usize,
    /// Rebuild once deleted points exceed this fraction of the graph (and at least 64 of them): USearch
    /// unlinks a deleted point lazily, so a graph with many holes searches worse until rebuilt.
    pub rebuild_fraction: f32,
    /// Threads that build a graph (0: one per core). Concurrent adds make each build a slightly different
    /// graph; the unit tests build on one thread so that their exact-hit checks do not depend on the
    /// interleaving (two threads: 1 self-lookup miss in 18,000; one thread: none).
    pub build_threads: usize,
}

impl Default for IndexParams {
    fn default() -> Self {
        IndexParams {
            max_connections: 24,
            ef_construction: 200,
            ef_search: 128,
            exact_below: 2000,
            rebuild_fraction: 0.2,
            build_threads: 0,
        }
    }
}

/// Searches (and adds) that may run in one graph at once: USearch keeps a scratch context per concurrent
/// caller and fails a call that finds none free, so callers beyond this wait on `Slots`.
const CONTEXTS: usize = 64;

/// A counting semaphore over the graph's scratch contexts (blocking: searches run on blocking threads).
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn new() -> Slots {
        Slots {
            free: Mutex::new(CONTEXTS),
            freed: Condvar::new(),
        }
    }

    fn hold<T>(&self, f: impl FnOnce() -> T) -> T {
        {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            while *free == 0 {
                free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
            }
            *free -= 1;
        }
        struct Release<'a>(&'a Slots);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                *self.0.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                self.0.freed.notify_one();
            }
        }
        let _release = Release(self);
        f()
    }
}

/// The HNSW graph (USearch). It stores vectors as bfloat16: half the memory traffic of f32 per distance,
/// which is what a 1,024-d search at 100k points is bound by; the final order comes from the exact f32
/// scores, so the rounding can only cost a candidate, never misorder the results.
struct Graph {
    index: Index,
    slots: Slots,
}

impl Graph {
    fn new(params: &IndexParams, dim: usize, capacity: usize) -> anyhow::Result<Graph> {
        let index = usearch::new_index(&IndexOptions {
            dimensions: dim,
            metric: MetricKind::L2sq,
            quantization: ScalarKind::BF16,
            connectivity: params.max_connections,
            expansion_add: params.ef_construction,
            expansion_search: params.ef_search,
            multi: false,
        })?;
        index.reserve_capacity_and_threads(capacity.max(1024), CONTEXTS)?;
        Ok(Graph {
            index,
            slots: Slots::new(),
        })
    }

    /// Adds from `threads` threads at once, 0: every core (the build at start and the background rebuild).
    fn add_all(&self, items: &[(i64, Arc<[f32]>)], threads: usize) -> anyhow::Result<()> {
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || -> anyhow::Result<()> {
                        for (id, v) in items.iter().skip(t).step_by(threads) {
                            self.add(*id, v)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            workers
                .into_iter()
                .try_for_each(|w| w.join().expect("index build thread panicked"))
        })
    }

    fn add(&self, id: i64, v: &[f32]) -> anyhow::Result<()> {
        self.slots.hold(|| self.index.add(id as u64, v))?;
        Ok(())
    }

    /// Adds one point after the build, growing the capacity when full. Callers hold the index's write lock:
    /// USearch's reserve must not race a search.
    fn push(&self, id: i64, v: &[f32]) {
        let (size, capacity) = (self.index.size(), self.index.capacity());
        if size + 1 > capacity {
            self.index
                .reserve_capacity_and_threads((capacity * 2).max(1024), CONTEXTS)
                .unwrap_or_else(|e| panic!("growing the graph past {capacity} points: {e}"));
        }
        self.add(id, v)
            .unwrap_or_else(|e| panic!("adding point {id} to the graph: {e}"));
    }

    fn remove(&self, id: i64) {
        // Fails only for an id the graph lacks, which the callers' `live` rules out.
        let _ = self.slots.hold(|| self.index.remove(id as u64));
    }

    fn search(
        &self,
        q: &[f32],
        count: usize,
        allowed: Option<&HashSet<i64>>,
    ) -> anyhow::Result<Vec<i64>> {
        let found = self.slots.hold(|| match allowed {
            None => self.index.search(q, count),
            Some(a) => self
                .index
                .filtered_search(q, count, |key| a.contains(&(key as i64))),
        })?;
        Ok(found.keys.into_iter().map(|k| k as i64).collect())
    }
}

struct Inner {
    /// None only while no point is live (the first vector's length gives the graph its dimension).
    graph: Option<Arc<Graph>>,
    /// Every live vector by database id: the exact scores and rebuilds read these.
    live: HashMap<i64, Arc<[f32]>>,
    /// Search offsets of live images that have one (docs/bundle.md, "The hubness section"): added to the score
    /// of a caption query (`Score::CosineOffset`), absent means 0.
    offsets: HashMap<i64, f32>,
    /// Deleted since the graph was built (removed from it, but still holes in it).
    deleted: usize,
    rebuilding: bool,
}

/// How a query and a stored vector are compared (higher is better).
#[derive(Debug, Clone, Copy)]
pub enum Score {
    /// Dot product of unit vectors.
    Cosine,
    /// Cosine plus the stored image's offset: a caption query on images under a bundle with a hubness bank.
    CosineOffset,
    /// Order embeddings, `-‖max(0, c - i)‖²`; `query_is_caption` says which side the query is.
    Order { query_is_caption: bool },
    /// Negative squared distance (image to image under an order bundle, where S is not symmetric).
    NegL2,
}

impl Score {
    /// `offsets`: whether the bundle has a hubness bank (only caption queries on images use it).
    pub fn new(sim: Similarity, query: Modality, target: Modality, offsets: bool) -> Score {
        match (sim, query, target) {
            (Similarity::Cosine, Modality::Captions, Modality::Images) if offsets => {
                Score::CosineOffset
            }
            (Similarity::Cosine, _, _) => Score::Cosine,
            (Similarity::Order, Modality::Captions, Modality::Images) => Score::Order {
                query_is_caption: true,
            },
            (Similarity::Order, Modality::Images, Modality::Captions) => Score::Order {
                query_is_caption: false,
            },
            (Similarity::Order, _, _) => Score::NegL2,
        }
    }

    /// The score without the offset (`VectorIndex::search` adds it).
    pub fn eval(self, q: &[f32], x: &[f32]) -> f32 {
        match self {
            Score::Cosine | Score::CosineOffset => q.iter().zip(x).map(|(a, b)| a * b).sum(),
            Score::Order { query_is_caption } => {
                let (c, i) = if query_is_caption { (q, x) } else { (x, q) };
                -c.iter()
                    .zip(i)
                    .map(|(c, i)| (c - i).max(0.0).powi(2))
                    .sum::<f32>()
            }
            Score::NegL2 => -q.iter().zip(x).map(|(a, b)| (a - b).powi(2)).sum::<f32>(),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct SnapshotMeta {
    format: u32,
    generation: i64,
    bundle_id: String,
    points: usize,
    /// The graph's file, relative to the snapshot folder (absent from format 1, which is then stale).
    #[serde(default)]
    file: String,
}

/// Snapshot manifests of this format hold a USearch graph; format 1 (hnsw_rs) is rebuilt from the database.
const SNAPSHOT_FORMAT: u32 = 2;

pub struct VectorIndex {
    inner: RwLock<Inner>,
    params: IndexParams,
}

fn build_graph(params: &IndexParams, items: &[(i64, Arc<[f32]>)]) -> Option<Arc<Graph>> {
    let dim = items.first()?.1.len();
    let graph = Graph::new(params, dim, items.len())
        .and_then(|g| g.add_all(items, params.build_threads).map(|()| g))
        // Only out of memory gets here (the vectors are finite and of one length, the ids unique).
        .unwrap_or_else(|e| panic!("building a {dim}-d graph of {} points: {e}", items.len()));
    Some(Arc::new(graph))
}

impl VectorIndex {
    /// Builds from (id, vector) pairs; the vectors must be finite, of one length (unit vectors here).
    pub fn build(params: IndexParams, vectors: Vec<(i64, Vec<f32>)>) -> VectorIndex {
        let items: Vec<(i64, Arc<[f32]>)> = vectors
            .into_iter()
            .map(|(id, v)| (id, Arc::from(v)))
            .collect();
        let graph = build_graph(&params, &items);
        VectorIndex {
            inner: RwLock::new(Inner {
                graph,
                live: items.into_iter().collect(),
                offsets: HashMap::new(),
                deleted: 0,
                rebuilding: false,
            }),
            params,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.read().live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Points deleted since the graph was built.
    pub fn deleted(&self) -> usize {
        self.read().deleted
    }

    pub fn vector(&self, id: i64) -> Option<Arc<[f32]>> {
        self.read().live.get(&id).cloned()
    }

    /// Sets the search offsets of live points (after a build from the database); others are ignored.
    pub fn set_offsets(&self, offsets: impl IntoIterator<Item = (i64, f32)>) {
        let mut inner = self.write();
        for (id, o) in offsets {
            if o != 0.0 && inner.live.contains_key(&id) {
                inner.offsets.insert(id, o);
            }
        }
    }

    /// Adds a vector and its search offset; an id already live is left as it is (a replica may learn of its
    /// own write twice: from the request and from the change sequence), so a point is never in the graph twice.
    pub fn insert(&self, id: i64, v: Vec<f32>, offset: f32) {
        let mut inner = self.write();
        if inner.live.contains_key(&id) {
            return;
        }
        if offset != 0.0 {
            inner.offsets.insert(id, offset);
        }
        let v: Arc<[f32]> = Arc::from(v);
        match &inner.graph {
            Some(g) => g.push(id, &v),
            // No graph means no live point (see `Inner::graph`): this one is the first.
            None => inner.graph = build_graph(&self.params, &[(id, v.clone())]),
        }
        inner.live.insert(id, v);
    }

    /// Deletes an id; returns true when the caller should start a rebuild.
    pub fn remove(&self, id: i64) -> bool {
        let mut inner = self.write();
        if inner.live.remove(&id).is_none() {
            return false;
        }
        inner.offsets.remove(&id);
        if let Some(g) = &inner.graph {
            g.remove(id);
        }
        inner.deleted += 1;
        let points = inner.live.len() + inner.deleted;
        let due = inner.deleted >= 64
            && inner.deleted as f32 > self.params.rebuild_fraction * points as f32;
        if due && !inner.rebuilding {
            inner.rebuilding = true;
            return true;
        }
        false
    }

    /// Rebuilds the graph from the live vectors without blocking searches or writes for long: the build runs
    /// on a copy, then what was written or deleted meanwhile is replayed into the new graph before the swap.
    pub fn rebuild(&self) {
        let snapshot: Vec<(i64, Arc<[f32]>)> = self
            .read()
            .live
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let graph = build_graph(&self.params, &snapshot);
        let mut inner = self.write();
        let graph = match graph {
            Some(g) => {
                let built: HashSet<i64> = snapshot.iter().map(|(id, _)| *id).collect();
                for (id, v) in inner.live.iter().filter(|(id, _)| !built.contains(id)) {
                    g.push(*id, v);
                }
                for id in built.iter().filter(|id| !inner.live.contains_key(id)) {
                    g.remove(*id);
                }
                Some(g)
            }
            // Nothing was live when the rebuild began; whatever was added since gets a graph now.
            None => {
                let added: Vec<(i64, Arc<[f32]>)> =
                    inner.live.iter().map(|(k, v)| (*k, v.clone())).collect();
                build_graph(&self.params, &added)
            }
        };
        inner.graph = graph;
        inner.deleted = 0;
        inner.rebuilding = false;
        tracing::info!(points = inner.live.len(), "index rebuilt");
    }

    /// The best `k` ids after skipping `offset`, by `score`, among `allowed` ids if given.
    pub fn search(
        &self,
        q: &[f32],
        score: Score,
        offset: usize,
        k: usize,
        allowed: Option<&HashSet<i64>>,
    ) -> Vec<(i64, f32)> {
        let want = offset + k;
        let inner = self.read();
        let pool = allowed.map_or(inner.live.len(), |a| a.len());
        let offsets = matches!(score, Score::CosineOffset);
        let eval = |inner: &Inner, id: i64, v: &[f32]| -> f32 {
            let s = score.eval(q, v);
            if offsets {
                s + inner.offsets.get(&id).copied().unwrap_or(0.0)
            } else {
                s
            }
        };
        let exact = |inner: &Inner| -> Vec<(i64, f32)> {
            match allowed {
                Some(a) => a
                    .iter()
                    .filter_map(|id| inner.live.get(id).map(|v| (*id, eval(inner, *id, v))))
                    .collect(),
                None => inner
                    .live
                    .iter()
                    .map(|(id, v)| (*id, eval(inner, *id, v)))
                    .collect(),
            }
        };
        let mut hits: Vec<(i64, f32)> = match &inner.graph {
            Some(graph) if pool > self.params.exact_below && want < pool => {
                // Candidates by L2 (equivalent to cosine on unit vectors) in bfloat16, then exact scores:
                // twice the wanted count absorbs the rounding; order similarity, and cosine with offsets (which
                // can lift an image the cosine alone ranks lower), re-rank more of them.
                let cands = match score {
                    Score::Cosine => want * 2,
                    _ => (want * 4).max(100),
                };
                match graph.search(q, cands, allowed) {
                    Ok(ids) => ids
                        .into_iter()
                        .filter_map(|id| inner.live.get(&id).map(|v| (id, eval(&inner, id, v))))
                        .collect(),
                    Err(e) => {
                        tracing::warn!(error = %e, "graph search failed; scanning exactly");
                        exact(&inner)
                    }
                }
            }
            _ => exact(&inner),
        };
        let cmp = |a: &(i64, f32), b: &(i64, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if hits.len() > want {
            hits.select_nth_unstable_by(want, cmp);
            hits.truncate(want);
        }
        hits.sort_by(cmp);
        hits.into_iter().skip(offset).collect()
    }

    /// Writes the graph, then a small manifest naming it: a torn snapshot is never loaded.
    pub fn save(
        &self,
        dir: &Path,
        basename: &str,
        generation: i64,
        bundle_id: &str,
    ) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        let meta_path = dir.join(format!("{basename}.json"));
        let _ = std::fs::remove_file(&meta_path);
        let file = format!("{basename}.usearch");
        // Under the read lock: no add or delete runs while the graph is written (searches go on).
        let inner = self.read();
        let tmp = dir.join(format!("{file}.tmp"));
        match &inner.graph {
            Some(g) => g.slots.hold(|| g.index.save(&tmp.to_string_lossy()))?,
            None => std::fs::write(&tmp, b"")?,
        }
        std::fs::rename(&tmp, dir.join(&file))?;
        let meta = SnapshotMeta {
            format: SNAPSHOT_FORMAT,
            generation,
            bundle_id: bundle_id.to_string(),
            points: inner.live.len(),
            file,
        };
        drop(inner);
        let tmp = dir.join(format!("{basename}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(&meta)?)?;
        std::fs::rename(tmp, meta_path)?;
        remove_hnsw_rs_dumps(dir, basename);
        Ok(())
    }

    /// Loads a snapshot if it matches `generation` and `bundle_id`; `live` are the database's vectors.
    pub fn load(
        params: IndexParams,
        dir: &Path,
        basename: &str,
        generation: i64,
        bundle_id: &str,
        live: Vec<(i64, Vec<f32>)>,
    ) -> Result<VectorIndex, NotLoaded> {
        let meta: SnapshotMeta = match std::fs::read(dir.join(format!("{basename}.json")))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
        {
            Some(m) => m,
            None => return Err(("no snapshot".into(), live)),
        };
        if meta.format != SNAPSHOT_FORMAT
            || meta.generation != generation
            || meta.bundle_id != bundle_id
        {
            return Err(("snapshot is stale".into(), live));
        }
        if meta.points != live.len() {
            return Err(("snapshot disagrees with the database".into(), live));
        }
        let Some(dim) = live.first().map(|(_, v)| v.len()) else {
            return Ok(VectorIndex::build(params, live));
        };
        let graph = match Graph::new(&params, dim, live.len()).and_then(|g| {
            g.index.load(&dir.join(&meta.file).to_string_lossy())?;
            // The file carries the build's search expansion; the server's setting wins.
            g.index.change_expansion_search(params.ef_search);
            Ok(g)
        }) {
            Ok(g) => g,
            Err(e) => return Err((format!("snapshot unreadable: {e}"), live)),
        };
        // The graph must hold exactly the live ids: a snapshot taken between a commit and its index insert
        // would otherwise miss a point forever.
        if graph.index.size() != live.len()
            || graph.index.dimensions() != dim
            || !live.iter().all(|(id, _)| graph.index.contains(*id as u64))
        {
            return Err(("snapshot holds other ids than the database".into(), live));
        }
        Ok(VectorIndex {
            inner: RwLock::new(Inner {
                graph: Some(Arc::new(graph)),
                live: live.into_iter().map(|(id, v)| (id, Arc::from(v))).collect(),
                offsets: HashMap::new(),
                deleted: 0,
                rebuilding: false,
            }),
            params,
        })
    }
}

/// Removes an index's snapshot (its collection was deleted).
pub fn remove_snapshot(dir: &Path, basename: &str) {
    for ext in ["json", "usearch"] {
        let _ = std::fs::remove_file(dir.join(format!("{basename}.{ext}")));
    }
    remove_hnsw_rs_dumps(dir, basename);
}

/// Snapshots before format 2 were hnsw_rs dumps, which never overwrote a file (`<basename>.hnsw.*`, then
/// `<basename>-<random>.hnsw.*` on every later save: 490 MB more per save at 100k). They are dead weight now.
fn remove_hnsw_rs_dumps(dir: &Path, basename: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name
            .strip_suffix(".hnsw.data")
            .or_else(|| name.strip_suffix(".hnsw.graph"))
        else {
            continue;
        };
        let ours = stem == basename
            || stem
                .strip_prefix(basename)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if ours {
            if let Err(e) = std::fs::remove_file(entry.path()) {
                tracing::warn!(file = %entry.path().display(), error = %e, "could not remove an old index dump");
            }
        }
    }
}

/// Why a snapshot was not used, and the vectors handed back to build from instead.
pub type NotLoaded = (String, Vec<(i64, Vec<f32>)>);

/// Where the snapshot of one index lives.
pub fn snapshot_name(collection_id: i64, modality: Modality) -> String {
    format!("c{collection_id}-{}", modality.as_str())
}

pub fn snapshot_dir(base: &Path) -> PathBuf {
    base.to_path_buf()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    fn vectors(n: usize, dim: usize, seed: u64) -> Vec<(i64, Vec<f32>)> {
        let mut s = seed;
        (1..=n as i64)
            .map(|id| {
                let mut v: Vec<f32> = (0..dim)
                    .map(|_| {
                        s = s
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
                    })
                    .collect();
                crate::projection::normalise(&mut v, false);
                (id, v)
            })
            .collect()
    }

    fn graph_params() -> IndexParams {
        IndexParams {
            exact_below: 0,
            build_threads: 1,
            ..IndexParams::default()
        }
    }

    #[test]
    fn finds_itself_hides_deleted_and_rebuilds() {
        let data = vectors(600, 32, 7);
        let idx = VectorIndex::build(graph_params(), data.clone());
        for (id, v) in data.iter().step_by(37) {
            let hits = idx.search(v, Score::Cosine, 0, 3, None);
            assert_eq!(hits[0].0, *id);
            assert!(hits[0].1 > 0.999);
        }
        // Delete a third: gone from every search at once, and a rebuild drops their holes.
        let mut due = false;
        for (id, _) in data.iter().filter(|(id, _)| id % 3 == 0) {
            due |= idx.remove(*id);
        }
        assert!(due, "a rebuild is due past the threshold");
        for (id, v) in data.iter().filter(|(id, _)| id % 3 == 0).step_by(11) {
            let hits = idx.search(v, Score::Cosine, 0, 10, None);
            assert!(
                hits.iter().all(|(h, _)| h % 3 != 0),
                "deleted {id} came back"
            );
        }
        idx.insert(10_000, data[0].1.clone(), 0.0);
        assert_eq!(idx.deleted(), 200);
        idx.rebuild();
        assert_eq!(idx.deleted(), 0);
        assert_eq!(idx.len(), 401);
        let hits = idx.search(&data[0].1, Score::Cosine, 0, 2, None);
        let got: HashSet<i64> = hits.iter().map(|h| h.0).collect();
        assert_eq!(
            got,
            HashSet::from([1, 10_000]),
            "the point added after the build is found"
        );
        let hits = idx.search(&data[1].1, Score::Cosine, 0, 1, None);
        assert_eq!(hits[0].0, 2);
        // Filters and paging.
        let allowed: HashSet<i64> = [5, 7, 11].into_iter().collect();
        let hits = idx.search(&data[6].1, Score::Cosine, 0, 10, Some(&allowed));
        assert_eq!(hits.len(), 3);
        assert_eq!(hits[0].0, 7);
        let all = idx.search(&data[1].1, Score::Cosine, 0, 6, None);
        let page = idx.search(&data[1].1, Score::Cosine, 3, 3, None);
        assert_eq!(&all[3..], &page[..]);
    }

    #[test]
    fn grows_past_its_first_capacity_one_insert_at_a_time() {
        let idx = VectorIndex::build(graph_params(), vec![]);
        let data = vectors(2_500, 16, 11);
        for (id, v) in &data {
            idx.insert(*id, v.clone(), 0.0);
        }
        assert_eq!(idx.len(), 2_500);
        for (id, v) in data.iter().step_by(97) {
            let hits = idx.search(v, Score::Cosine, 0, 1, None);
            assert_eq!(hits[0].0, *id);
        }
    }

    #[test]
    fn concurrent_searches_get_what_a_lone_search_gets() {
        // On the graph itself (the index would hide a failed graph search behind its exact fallback): twice
        // as many threads as scratch contexts, started at once, each get what a lone search gets.
        let data = vectors(3_000, 16, 5);
        let params = IndexParams {
            build_threads: 0,
            ..graph_params()
        };
        let idx = VectorIndex::build(params, data.clone());
        let graph = idx.read().graph.clone().expect("a graph");
        let queries: Vec<Vec<f32>> = data.iter().step_by(13).map(|(_, v)| v.clone()).collect();
        let alone: Vec<Vec<i64>> = queries
            .iter()
            .map(|q| graph.search(q, 5, None).expect("search"))
            .collect();
        let (queries, alone) = (Arc::new(queries), Arc::new(alone));
        let start = Arc::new(std::sync::Barrier::new(CONTEXTS * 2));
        let threads: Vec<_> = (0..CONTEXTS * 2)
            .map(|t| {
                let (graph, queries, alone, start) =
                    (graph.clone(), queries.clone(), alone.clone(), start.clone());
                std::thread::spawn(move || -> Result<(), String> {
                    start.wait();
                    for i in 0..queries.len() {
                        let i = (i + t) % queries.len();
                        let got = graph
                            .search(&queries[i], 5, None)
                            .map_err(|e| e.to_string())?;
                        if got != alone[i] {
                            return Err(format!("query {i}: {got:?}, alone {:?}", alone[i]));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join()
                .expect("search thread")
                .expect("every search succeeds");
        }
    }

    #[test]
    fn slots_admit_at_most_one_caller_per_graph_context() {
        let slots = Arc::new(Slots::new());
        let (inside, most) = (
            Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        );
        let threads: Vec<_> = (0..CONTEXTS * 3)
            .map(|_| {
                let (slots, inside, most) = (slots.clone(), inside.clone(), most.clone());
                std::thread::spawn(move || {
                    slots.hold(|| {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        inside.fetch_sub(1, Ordering::SeqCst);
                    })
                })
            })
            .collect();
        for t in threads {
            t.join().expect("holder");
        }
        let most = most.load(Ordering::SeqCst);
        assert!(most <= CONTEXTS, "{most} callers inside at once");
        assert!(most > 1, "callers ran one at a time");
    }

    #[test]
    fn snapshot_roundtrip_and_staleness() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = vectors(300, 16, 3);
        let idx = VectorIndex::build(graph_params(), data.clone());
        idx.remove(5);
        idx.save(dir.path(), "t", 42, "b@1").expect("save");
        let live: Vec<_> = data.iter().filter(|(id, _)| *id != 5).cloned().collect();
        let loaded = VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@1", live.clone())
            .unwrap_or_else(|(why, _)| panic!("loads: {why}"));
        assert_eq!(loaded.len(), 299);
        let hits = loaded.search(&data[4].1, Score::Cosine, 0, 5, None);
        assert!(hits.iter().all(|(id, _)| *id != 5));
        let hits = loaded.search(&data[9].1, Score::Cosine, 0, 1, None);
        assert_eq!(hits[0].0, 10);
        assert!(
            VectorIndex::load(graph_params(), dir.path(), "t", 43, "b@1", live.clone()).is_err(),
            "other generation"
        );
        assert!(
            VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@2", live.clone()).is_err(),
            "other bundle"
        );
        // Saving replaces the last snapshot, clears the hnsw_rs dumps of earlier versions (which were never
        // overwritten), and leaves other indexes' files alone.
        for f in [
            "t.hnsw.data",
            "t.hnsw.graph",
            "t-123.hnsw.data",
            "t-123.hnsw.graph",
            "t1.hnsw.data",
        ] {
            std::fs::write(dir.path().join(f), b"old dump").expect("write");
        }
        idx.save(dir.path(), "t", 42, "b@1").expect("save again");
        let mut files: Vec<String> = std::fs::read_dir(dir.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        files.sort();
        assert_eq!(files, ["t.json", "t.usearch", "t1.hnsw.data"]);
        assert!(
            VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@1", live.clone()).is_ok()
        );
        // A format-1 manifest (hnsw_rs) is stale, not an error.
        std::fs::write(
            dir.path().join("t.json"),
            br#"{"format":1,"generation":42,"bundle_id":"b@1","points":299,"hidden":[5],"basename":"t"}"#,
        )
        .expect("write");
        let (why, back) =
            VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@1", live.clone())
                .err()
                .expect("an old snapshot is not loaded");
        assert!(why.contains("stale"), "{why}");
        assert_eq!(back.len(), 299, "the vectors come back for the build");
        idx.save(dir.path(), "t", 42, "b@1").expect("save");
        let mut swapped = live;
        swapped[0].0 = 9_999;
        assert!(
            VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@1", swapped).is_err(),
            "other ids"
        );
    }

    #[test]
    fn caption_queries_on_images_add_each_images_offset_through_the_graph_too() {
        let data = vectors(3_000, 16, 9);
        let q = data[0].1.clone();
        for exact_below in [0, 1_000_000] {
            let params = IndexParams {
                exact_below,
                ..graph_params()
            };
            let idx = VectorIndex::build(params, data.clone());
            let plain = idx.search(&q, Score::CosineOffset, 0, 5, None);
            assert_eq!(plain[0].0, 1, "no offsets yet: the point itself");
            // A large offset lifts a point that the cosine alone ranks far down (it is found among the
            // re-ranked candidates) and sinks the query's own point; Cosine ignores the offsets.
            let far = idx.search(&q, Score::Cosine, 0, 60, None)[50].0;
            idx.set_offsets([(far, 0.5), (1, -0.5), (999_999, 1.0)]);
            let hits = idx.search(&q, Score::CosineOffset, 0, 5, None);
            assert_eq!(hits[0].0, far, "exact_below {exact_below}");
            assert!(
                hits.iter().all(|h| h.0 != 1),
                "the sunk point stays out of the top 5"
            );
            assert_eq!(idx.search(&q, Score::Cosine, 0, 1, None)[0].0, 1);
            // A deleted point's offset goes with it; a re-inserted id gets its new one.
            idx.remove(far);
            idx.insert(far, data[(far - 1) as usize].1.clone(), 0.0);
            assert_ne!(idx.search(&q, Score::CosineOffset, 0, 1, None)[0].0, far);
        }
    }

    #[test]
    fn order_score() {
        let s = Score::Order {
            query_is_caption: true,
        };
        assert_eq!(s.eval(&[0.5, 0.1], &[0.6, 0.0]), -0.010000001);
        let t = Score::Order {
            query_is_caption: false,
        };
        assert_eq!(t.eval(&[0.6, 0.0], &[0.5, 0.1]), -0.010000001);
    }
}
