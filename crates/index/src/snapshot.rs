//! Index snapshots: the graph file plus a small manifest naming it, the collection's generation, the bundle
//! and the graph's ids. A start loads a snapshot of the loaded bundle and brings it up to the database: the
//! points written since are added and those deleted since removed (the manifest's ids against the
//! database's), so a snapshot that is behind costs a few inserts, not a rebuild of the whole graph.
//!
//! This relies on one invariant: under one bundle a stored id's vector never changes (an image's vector is
//! a function of its code, a caption's of its text, and neither is ever rewritten in place; a reindex
//! changes the bundle id, and a snapshot of another bundle is never loaded).

use std::{
    collections::{HashMap, HashSet},
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
    /// The graph's points, sorted (absent from manifests written before the catch-up: those load only when
    /// they hold exactly the database's ids).
    #[serde(default)]
    ids: Vec<i64>,
}

/// Snapshot manifests of this format hold a USearch graph; format 1 (hnsw_rs) is rebuilt from the database.
const SNAPSHOT_FORMAT: u32 = 2;

/// Why a snapshot was not used, and the vectors handed back to build from instead.
pub type NotLoaded = (String, Vec<(i64, Vec<f32>)>);

/// The snapshot's graph file, for `n` points of `dim` dimensions, searched with the server's `ef_search`.
fn read_graph(
    params: &IndexParams,
    dir: &Path,
    file: &str,
    dim: usize,
    n: usize,
) -> Result<Graph, super::IndexError> {
    Graph::new(params, dim, n).and_then(|g| {
        g.index
            .load(&dir.join(file).to_string_lossy())
            .map_err(|e| super::IndexError::Graph(e.to_string()))?;
        // The file carries the build's search expansion; the server's setting (or this size's) wins.
        g.fit_expansion(params, n);
        Ok(g)
    })
}

/// Brings a loaded graph up to the database: removes the snapshot's `ids` no longer `live` and adds the live
/// points it lacks. Returns how many were removed and added; refused (why) when too many were deleted since
/// for removal to be worth it, or when the result would not hold the database's ids.
fn bring_up_to_date(
    graph: &Graph,
    ids: &[i64],
    live: &[(i64, Vec<f32>)],
    rebuild_fraction: f32,
) -> Result<(usize, usize), String> {
    let in_db: HashSet<i64> = live.iter().map(|(id, _)| *id).collect();
    let gone: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| !in_db.contains(id))
        .collect();
    let points = graph.index.size();
    if gone.len() >= 64 && gone.len() as f32 > rebuild_fraction * points as f32 {
        return Err(format!(
            "{} of the snapshot's {points} points were deleted since",
            gone.len()
        ));
    }
    for id in &gone {
        graph.remove(*id);
    }
    // Points written after the snapshot, and (old manifests) any the graph lacks.
    let mut added = 0;
    for (id, v) in live
        .iter()
        .filter(|(id, _)| !graph.index.contains(*id as u64))
    {
        if let Err(e) = graph.push(*id, v) {
            return Err(format!("snapshot could not be brought up to date: {e}"));
        }
        added += 1;
    }
    if graph.index.size() != live.len() {
        return Err("snapshot holds other ids than the database".into());
    }
    Ok((gone.len(), added))
}

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
        let mut ids: Vec<i64> = inner.live.keys().copied().collect();
        ids.sort_unstable();
        let meta = SnapshotMeta {
            format: SNAPSHOT_FORMAT,
            generation,
            bundle_id: bundle_id.to_string(),
            points: inner.live.len(),
            file,
            ids,
        };
        drop(inner);
        let tmp = dir.join(format!("{basename}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(&meta)?)?;
        std::fs::rename(tmp, meta_path)?;
        remove_hnsw_rs_dumps(dir, basename);
        Ok(())
    }

    /// Loads a snapshot of `bundle_id` and brings it up to `live`, the database's vectors: what was added
    /// since is inserted and what was deleted since removed. A snapshot with more deletes since than a
    /// rebuild would tolerate is not used (the graph would be mostly holes); nor is one of another bundle.
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
        if meta.format != SNAPSHOT_FORMAT || meta.bundle_id != bundle_id {
            return Err(("snapshot is stale".into(), live));
        }
        let Some(dim) = live.first().map(|(_, v)| v.len()) else {
            return VectorIndex::build(params, live).map_err(|e| (e.to_string(), vec![]));
        };
        // Without its ids a manifest can only be trusted when nothing was written since.
        let listed = !meta.ids.is_empty() || meta.points == 0;
        if !listed && (meta.generation != generation || meta.points != live.len()) {
            return Err(("snapshot is stale".into(), live));
        }
        let graph = match read_graph(&params, dir, &meta.file, dim, live.len()) {
            Ok(g) => g,
            Err(e) => return Err((format!("snapshot unreadable: {e}"), live)),
        };
        if graph.index.dimensions() != dim || (listed && graph.index.size() != meta.ids.len()) {
            return Err(("snapshot disagrees with its manifest".into(), live));
        }
        let (gone, added) =
            match bring_up_to_date(&graph, &meta.ids, &live, params.rebuild_fraction) {
                Ok(changed) => changed,
                Err(why) => return Err((why, live)),
            };
        if added > 0 || gone > 0 {
            tracing::info!(
                index = basename,
                added,
                removed = gone,
                snapshot_generation = meta.generation,
                generation,
                "snapshot brought up to the database"
            );
        }
        Ok(VectorIndex {
            inner: RwLock::new(Inner {
                graph: Some(Arc::new(graph)),
                live: live.into_iter().map(|(id, v)| (id, Arc::from(v))).collect(),
                offsets: HashMap::new(),
                deleted: gone,
                rebuilding: false,
            }),
            params,
        })
    }
}
