//! Index snapshots: the graph file plus a small manifest naming it, the collection's generation and the
//! bundle. A start loads a snapshot only when all three still hold and its ids are the database's.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, RwLock},
};

use serde::{Deserialize, Serialize};

use super::{IndexParams, Inner, VectorIndex, graph::Graph, legacy::remove_hnsw_rs_dumps};
use crate::modality::Modality;

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

/// Why a snapshot was not used, and the vectors handed back to build from instead.
pub type NotLoaded = (String, Vec<(i64, Vec<f32>)>);

/// Where the snapshot of one index lives.
pub fn snapshot_name(collection_id: i64, modality: Modality) -> String {
    format!("c{collection_id}-{}", modality.as_str())
}

/// Removes an index's snapshot (its collection was deleted).
pub fn remove_snapshot(dir: &Path, basename: &str) {
    for ext in ["json", "usearch"] {
        let _ = std::fs::remove_file(dir.join(format!("{basename}.{ext}")));
    }
    remove_hnsw_rs_dumps(dir, basename);
}

impl VectorIndex {
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
            return VectorIndex::build(params, live).map_err(|e| (e.to_string(), vec![]));
        };
        let graph = match Graph::new(&params, dim, live.len()).and_then(|g| {
            g.index
                .load(&dir.join(&meta.file).to_string_lossy())
                .map_err(|e| super::IndexError::Graph(e.to_string()))?;
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
