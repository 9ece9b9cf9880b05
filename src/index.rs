//! Step 8: one vector index per collection and modality: HNSW (hnsw_rs) for candidates, exact scores for
//! the final order. hnsw_rs cannot delete, so deleted ids are hidden through its filtered search and the
//! graph is rebuilt in the background once too many are hidden. Small or heavily filtered searches skip
//! the graph and scan exactly (faster there, and exact).

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use hnsw_rs::prelude::{AnnT, DistL2, Hnsw, HnswIo};
use serde::{Deserialize, Serialize};

use crate::{bundle::Similarity, store::Modality};

/// hnsw_rs' file_dump reloads only graphs made with its maximal layer count.
const MAX_LAYER: usize = 16;

#[derive(Debug, Clone, Copy)]
pub struct IndexParams {
    pub max_connections: usize,
    pub ef_construction: usize,
    pub ef_search: usize,
    /// Below this many live vectors (or allowed ids, under a filter), search scans exactly.
    pub exact_below: usize,
    /// Rebuild once hidden (deleted) points exceed this fraction of the graph (and at least 64 of them).
    pub rebuild_fraction: f32,
}

impl Default for IndexParams {
    fn default() -> Self {
        IndexParams {
            max_connections: 24,
            ef_construction: 200,
            ef_search: 128,
            exact_below: 2000,
            rebuild_fraction: 0.2,
        }
    }
}

type Graph = Hnsw<'static, f32, DistL2>;

struct Inner {
    graph: Arc<Graph>,
    /// Every live vector by database id: the exact scores and rebuilds read these.
    live: HashMap<i64, Arc<[f32]>>,
    /// In the graph but deleted.
    hidden: HashSet<usize>,
    rebuilding: bool,
}

/// How a query and a stored vector are compared (higher is better).
#[derive(Debug, Clone, Copy)]
pub enum Score {
    /// Dot product of unit vectors.
    Cosine,
    /// Order embeddings, `-‖max(0, c - i)‖²`; `query_is_caption` says which side the query is.
    Order { query_is_caption: bool },
    /// Negative squared distance (image to image under an order bundle, where S is not symmetric).
    NegL2,
}

impl Score {
    pub fn new(sim: Similarity, query: Modality, target: Modality) -> Score {
        match (sim, query, target) {
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

    pub fn eval(self, q: &[f32], x: &[f32]) -> f32 {
        match self {
            Score::Cosine => q.iter().zip(x).map(|(a, b)| a * b).sum(),
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
    hidden: Vec<usize>,
    basename: String,
}

pub struct VectorIndex {
    inner: RwLock<Inner>,
    params: IndexParams,
}

fn new_graph(params: &IndexParams, capacity: usize) -> Graph {
    Hnsw::new(
        params.max_connections,
        capacity.max(1024),
        MAX_LAYER,
        params.ef_construction,
        DistL2 {},
    )
}

impl VectorIndex {
    /// Builds from (id, vector) pairs; the vectors must be finite (they are unit vectors here).
    pub fn build(params: IndexParams, vectors: Vec<(i64, Vec<f32>)>) -> VectorIndex {
        let graph = new_graph(&params, vectors.len());
        let live: HashMap<i64, Arc<[f32]>> = vectors
            .into_iter()
            .map(|(id, v)| (id, Arc::from(v)))
            .collect();
        let items: Vec<(&[f32], usize)> =
            live.iter().map(|(id, v)| (&v[..], *id as usize)).collect();
        if !items.is_empty() {
            graph.parallel_insert_slice(&items);
        }
        VectorIndex {
            inner: RwLock::new(Inner {
                graph: Arc::new(graph),
                live,
                hidden: HashSet::new(),
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

    pub fn hidden(&self) -> usize {
        self.read().hidden.len()
    }

    pub fn vector(&self, id: i64) -> Option<Arc<[f32]>> {
        self.read().live.get(&id).cloned()
    }

    /// Adds a vector; an id already live is left as it is (a replica may learn of its own write twice:
    /// from the request and from the change sequence), so a point is never in the graph twice.
    pub fn insert(&self, id: i64, v: Vec<f32>) {
        let mut inner = self.write();
        if inner.live.contains_key(&id) {
            return;
        }
        let v: Arc<[f32]> = Arc::from(v);
        inner.graph.insert_slice((&v[..], id as usize));
        inner.hidden.remove(&(id as usize));
        inner.live.insert(id, v);
    }

    /// Hides a deleted id; returns true when the caller should start a rebuild.
    pub fn remove(&self, id: i64) -> bool {
        let mut inner = self.write();
        if inner.live.remove(&id).is_some() {
            inner.hidden.insert(id as usize);
        }
        let points = inner.graph.get_nb_point();
        let due = inner.hidden.len() >= 64
            && inner.hidden.len() as f32 > self.params.rebuild_fraction * points as f32;
        if due && !inner.rebuilding {
            inner.rebuilding = true;
            return true;
        }
        false
    }

    /// Rebuilds the graph from the live vectors without blocking searches or writes for long: the build runs
    /// on a copy, then ids written meanwhile are replayed into the new graph before the swap.
    pub fn rebuild(&self) {
        let snapshot: Vec<(i64, Arc<[f32]>)> = self
            .read()
            .live
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let graph = new_graph(&self.params, snapshot.len());
        let items: Vec<(&[f32], usize)> = snapshot
            .iter()
            .map(|(id, v)| (&v[..], *id as usize))
            .collect();
        if !items.is_empty() {
            graph.parallel_insert_slice(&items);
        }
        let built: HashSet<i64> = snapshot.iter().map(|(id, _)| *id).collect();
        let mut inner = self.write();
        for (id, v) in inner.live.iter() {
            if !built.contains(id) {
                graph.insert_slice((&v[..], *id as usize));
            }
        }
        inner.hidden = built
            .iter()
            .filter(|id| !inner.live.contains_key(id))
            .map(|id| *id as usize)
            .collect();
        inner.graph = Arc::new(graph);
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
        let mut hits: Vec<(i64, f32)> = if pool <= self.params.exact_below || want >= pool {
            match allowed {
                Some(a) => a
                    .iter()
                    .filter_map(|id| inner.live.get(id).map(|v| (*id, score.eval(q, v))))
                    .collect(),
                None => inner
                    .live
                    .iter()
                    .map(|(id, v)| (*id, score.eval(q, v)))
                    .collect(),
            }
        } else {
            // Candidates by L2 (equivalent to cosine on unit vectors); order similarity re-ranks more of them.
            let cands = match score {
                Score::Cosine => want,
                _ => (want * 4).max(100),
            };
            let ef = self.params.ef_search.max(cands);
            let hidden = &inner.hidden;
            let filter = |id: &usize| {
                !hidden.contains(id) && allowed.is_none_or(|a| a.contains(&(*id as i64)))
            };
            let found = inner.graph.search_filter(q, cands, ef, Some(&filter));
            // An id is in a graph once (database ids are never reused), but stay safe against repeats.
            let mut seen = HashSet::with_capacity(found.len());
            found
                .iter()
                .filter_map(|n| {
                    let id = n.d_id as i64;
                    if !seen.insert(id) {
                        return None;
                    }
                    inner.live.get(&id).map(|v| (id, score.eval(q, v)))
                })
                .collect()
        };
        let cmp = |a: &(i64, f32), b: &(i64, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if hits.len() > want {
            hits.select_nth_unstable_by(want, cmp);
            hits.truncate(want);
        }
        hits.sort_by(cmp);
        hits.into_iter().skip(offset).collect()
    }

    /// Writes the graph and a small manifest; the manifest goes last, so a torn snapshot is never loaded.
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
        let inner = self.read();
        let written = inner.graph.file_dump(dir, basename)?;
        let meta = SnapshotMeta {
            format: 1,
            generation,
            bundle_id: bundle_id.to_string(),
            points: inner.graph.get_nb_point(),
            hidden: inner.hidden.iter().copied().collect(),
            basename: written,
        };
        let tmp = dir.join(format!("{basename}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(&meta)?)?;
        std::fs::rename(tmp, meta_path)?;
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
        if meta.format != 1 || meta.generation != generation || meta.bundle_id != bundle_id {
            return Err(("snapshot is stale".into(), live));
        }
        if meta.points != live.len() + meta.hidden.len() {
            return Err(("snapshot disagrees with the database".into(), live));
        }
        // A reloaded hnsw_rs graph borrows its loader. The loader is small (paths and options; the graph
        // data is copied, not mapped), and this happens once per index at start, so it is leaked on purpose
        // to give the graph a 'static lifetime.
        let loader: &'static mut HnswIo = Box::leak(Box::new(HnswIo::new(dir, &meta.basename)));
        let graph: Graph = match loader.load_hnsw::<f32, DistL2>() {
            Ok(g) => g,
            Err(e) => return Err((format!("snapshot unreadable: {e}"), live)),
        };
        if graph.get_nb_point() != meta.points {
            return Err(("snapshot point count differs".into(), live));
        }
        // The graph must hold exactly the live ids and the hidden ones: a snapshot taken between a commit and
        // its index insert would otherwise miss a point forever.
        let in_graph: HashSet<usize> = graph
            .get_point_indexation()
            .into_iter()
            .map(|p| p.get_origin_id())
            .collect();
        let hidden: HashSet<usize> = meta.hidden.into_iter().collect();
        let expected = live.len() + hidden.len();
        if in_graph.len() != expected
            || !hidden.iter().all(|h| in_graph.contains(h))
            || !live
                .iter()
                .all(|(id, _)| in_graph.contains(&(*id as usize)))
        {
            return Err(("snapshot holds other ids than the database".into(), live));
        }
        let live: HashMap<i64, Arc<[f32]>> =
            live.into_iter().map(|(id, v)| (id, Arc::from(v))).collect();
        Ok(VectorIndex {
            inner: RwLock::new(Inner {
                graph: Arc::new(graph),
                live,
                hidden,
                rebuilding: false,
            }),
            params,
        })
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
        // Delete a third: hidden from every search, then a rebuild drops them for good.
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
        idx.insert(10_000, data[0].1.clone());
        idx.rebuild();
        assert_eq!(idx.hidden(), 0);
        assert_eq!(idx.len(), 401);
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
        let mut swapped = live;
        swapped[0].0 = 9_999;
        assert!(
            VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@1", swapped).is_err(),
            "other ids"
        );
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

/// Recall of the HNSW path against the exact scan: `cargo test --release --lib recall -- --ignored --nocapture`.
#[cfg(test)]
mod recall {
    use super::*;

    #[test]
    #[ignore = "a measurement, not a check: a few seconds in release mode"]
    fn recall_at_10() {
        let (n, dim, queries) = (20_000, 256, 200);
        // Clustered data, like real embeddings: 100 centres plus noise.
        let mut s = 11u64;
        let mut rnd = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let centres: Vec<Vec<f32>> = (0..100)
            .map(|_| (0..dim).map(|_| rnd()).collect())
            .collect();
        let data: Vec<(i64, Vec<f32>)> = (0..n)
            .map(|i| {
                let c = &centres[i % 100];
                let mut v: Vec<f32> = c.iter().map(|x| x + 0.5 * rnd()).collect();
                crate::projection::normalise(&mut v, false);
                (i as i64 + 1, v)
            })
            .collect();
        let t = std::time::Instant::now();
        let graph = VectorIndex::build(
            IndexParams {
                exact_below: 0,
                ..IndexParams::default()
            },
            data.clone(),
        );
        let build = t.elapsed();
        let mut hit = 0;
        let t = std::time::Instant::now();
        for (_, q) in data.iter().step_by(n / queries) {
            let got: HashSet<i64> = graph
                .search(q, Score::Cosine, 0, 10, None)
                .into_iter()
                .map(|h| h.0)
                .collect();
            let mut all: Vec<(i64, f32)> = data
                .iter()
                .map(|(id, v)| (*id, Score::Cosine.eval(q, v)))
                .collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1));
            hit += all[..10].iter().filter(|(id, _)| got.contains(id)).count();
        }
        println!(
            "n {n} dim {dim}: build {build:?}, recall@10 {:.3}, {:?} per query (with exact check)",
            hit as f64 / (10 * queries) as f64,
            t.elapsed() / queries as u32
        );
    }
}
