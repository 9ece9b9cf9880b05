//! Step 8: one vector index per collection and modality: HNSW (USearch, bfloat16) for candidates, exact f32
//! scores for the final order. Deletes leave holes that USearch skips; the graph is rebuilt in the background
//! once too many accumulate. Small or heavily filtered searches skip the graph and scan exactly (faster
//! there, and exact).
//!
//! `graph` wraps USearch, `score` says how a query meets a point, `search` picks graph or `exact` scan,
//! `snapshot` saves and loads, `legacy` clears the files of the old snapshot format; `attributes` holds the
//! images' metadata that filters are evaluated on.

// The shared names under the paths the modules use (`crate::filter`, `crate::modality`).
use jointspace_core::{filter, modality};

mod attributes;
mod exact;
mod graph;
mod legacy;
mod score;
mod search;
mod snapshot;
#[cfg(test)]
mod tests;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, RwLock},
};

pub use attributes::Attributes;
use graph::Graph;
pub use score::Score;
pub use search::{largest_scanned, walk_beats_scan};

/// A point found by a search: what the results are ordered by (`score`: the similarity plus the point's
/// offset when the score takes offsets) and the plain similarity of query and point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    pub id: i64,
    pub score: f32,
    pub similarity: f32,
}
pub use snapshot::{NotLoaded, remove_snapshot, snapshot_name};

#[derive(Debug, Clone, Copy)]
pub struct IndexParams {
    pub max_connections: usize,
    pub ef_construction: usize,
    /// The search breadth the operator set; `None`: the breadth the graph's size needs (`auto_ef_search`).
    pub ef_search: Option<usize>,
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

/// Links per point of a graph, unless the operator sets them (`--hnsw-m`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 24;
/// The build's search breadth, unless the operator sets it (`--hnsw-ef-construction`).
pub const DEFAULT_EF_CONSTRUCTION: usize = 200;

impl Default for IndexParams {
    fn default() -> Self {
        IndexParams {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            ef_construction: DEFAULT_EF_CONSTRUCTION,
            ef_search: None,
            exact_below: 2000,
            rebuild_fraction: 0.2,
            build_threads: 0,
        }
    }
}

impl IndexParams {
    /// The search breadth for a graph (or pgvector index) of `n` points.
    pub fn ef_search_for(&self, n: usize) -> usize {
        self.ef_search.unwrap_or_else(|| auto_ef_search(n))
    }
}

/// The HNSW search breadth that keeps recall@10 at or above 0.95 as a collection grows, measured on photos'
/// codes (docs/benchmarks.md): 112 up to 100,000 points (recall 0.966-0.969 at 100k in both index modes, where 128
/// gave 0.976 for about 8% more of Postgres' CPU a search), then rising as n^0.951 to pgvector's cap of 1000 at 1M
/// (there 128 recalled 0.86, 512 0.94-0.95, 768 and 1000 0.96). A wider walk costs time roughly in proportion,
/// so a smaller collection keeps the narrow one.
pub fn auto_ef_search(n: usize) -> usize {
    const NARROW_UP_TO: f64 = 100_000.0;
    const NARROW: f64 = 112.0;
    if n as f64 <= NARROW_UP_TO {
        return NARROW as usize;
    }
    (NARROW * (n as f64 / NARROW_UP_TO).powf(0.951))
        .round()
        .min(1000.0) as usize
}

/// The graph library refused an operation; only running out of memory gets here (the vectors are finite
/// and of one length, the ids unique).
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("the vector index failed: {0}")]
    Graph(String),
}

struct Inner {
    /// None only while no point is live (the first vector's length gives the graph its dimension).
    graph: Option<Arc<Graph>>,
    /// Every live vector by database id: the exact scores and rebuilds read these.
    live: HashMap<i64, Arc<[f32]>>,
    /// Search offsets of live points that have one (docs/bundle.md, "The hubness section"): added to the score
    /// of a query from the other modality (`Score::CosineOffset`), absent means 0.
    offsets: HashMap<i64, f32>,
    /// Deleted since the graph was built (removed from it, but still holes in it).
    deleted: usize,
    rebuilding: bool,
}

pub struct VectorIndex {
    inner: RwLock<Inner>,
    params: IndexParams,
}

impl VectorIndex {
    /// Builds from (id, vector) pairs; the vectors must be finite, of one length (unit vectors here).
    pub fn build(
        params: IndexParams,
        vectors: Vec<(i64, Vec<f32>)>,
    ) -> Result<VectorIndex, IndexError> {
        let items: Vec<(i64, Arc<[f32]>)> = vectors
            .into_iter()
            .map(|(id, v)| (id, Arc::from(v)))
            .collect();
        let graph = Graph::build(&params, &items)?;
        Ok(VectorIndex {
            inner: RwLock::new(Inner {
                graph,
                live: items.into_iter().collect(),
                offsets: HashMap::new(),
                deleted: 0,
                rebuilding: false,
            }),
            params,
        })
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

    /// A live point's search offset (0 without one).
    pub fn offset(&self, id: i64) -> f32 {
        self.read().offsets.get(&id).copied().unwrap_or(0.0)
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

    /// Adds a point: its vector and its search offset (0 without a bank). An id already live is left as it
    /// is (a replica may learn of its own write twice: from the request and from the change sequence), so a
    /// point is never in the graph twice.
    pub fn insert(&self, id: i64, v: Vec<f32>, offset: f32) -> Result<(), IndexError> {
        let mut inner = self.write();
        if inner.live.contains_key(&id) {
            return Ok(());
        }
        let v: Arc<[f32]> = Arc::from(v);
        match &inner.graph {
            Some(g) => {
                g.push(id, &v)?;
                g.fit_expansion(&self.params, inner.live.len() + 1);
            }
            // No graph means no live point (see `Inner::graph`): this one is the first.
            None => inner.graph = Graph::build(&self.params, &[(id, v.clone())])?,
        }
        if offset != 0.0 {
            inner.offsets.insert(id, offset);
        }
        inner.live.insert(id, v);
        Ok(())
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
    /// On an error the old graph (with its holes) stays in service.
    pub fn rebuild(&self) -> Result<(), IndexError> {
        let snapshot: Vec<(i64, Arc<[f32]>)> = self
            .read()
            .live
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let built = Graph::build(&self.params, &snapshot);
        let mut inner = self.write();
        let swapped = built.and_then(|graph| match graph {
            Some(g) => {
                let built: HashSet<i64> = snapshot.iter().map(|(id, _)| *id).collect();
                for (id, v) in inner.live.iter().filter(|(id, _)| !built.contains(id)) {
                    g.push(*id, v)?;
                }
                for id in built.iter().filter(|id| !inner.live.contains_key(id)) {
                    g.remove(*id);
                }
                Ok(Some(g))
            }
            // Nothing was live when the rebuild began; whatever was added since gets a graph now.
            None => {
                let added: Vec<(i64, Arc<[f32]>)> =
                    inner.live.iter().map(|(k, v)| (*k, v.clone())).collect();
                Graph::build(&self.params, &added)
            }
        });
        inner.rebuilding = false;
        inner.graph = swapped?;
        inner.deleted = 0;
        tracing::info!(points = inner.live.len(), "index rebuilt");
        Ok(())
    }
}

/// The exact re-rank of candidates found elsewhere (the database's HNSW under `--index database`): each
/// (id, vector, offset) scored as `VectorIndex::search` scores its graph's candidates, in f32, the offset added
/// where the score takes it, and paged the same way (ties by id), so both index backends order a candidate
/// set identically.
pub fn rank_candidates(
    q: &[f32],
    score: Score,
    candidates: impl IntoIterator<Item = (i64, Vec<f32>, f32)>,
    offset: usize,
    k: usize,
) -> Vec<Hit> {
    let hits = candidates
        .into_iter()
        .map(|(id, v, off)| {
            let similarity = score.eval(q, &v);
            Hit {
                id,
                score: if score.uses_offsets() {
                    similarity + off
                } else {
                    similarity
                },
                similarity,
            }
        })
        .collect();
    exact::page(hits, offset, k)
}
