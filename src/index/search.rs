//! A search: through the graph for candidates and exact scores for their order, or an exact scan where the
//! graph does not pay (few points, a narrow filter, or asking for nearly everything).

use std::collections::HashSet;

use super::{Inner, Score, VectorIndex, exact};

impl VectorIndex {
    /// The best `k` ids after skipping `offset`, by `score` (plus each image's offset when the score takes
    /// it), among `allowed` ids if given.
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
        let eval = |inner: &Inner, id: i64, v: &[f32]| -> f32 {
            let s = score.eval(q, v);
            if score.uses_offsets() {
                s + inner.offsets.get(&id).copied().unwrap_or(0.0)
            } else {
                s
            }
        };
        let scan = |inner: &Inner| exact::scan(inner, allowed, |id, v| eval(inner, id, v));
        let hits = match &inner.graph {
            Some(graph) if pool > self.params.exact_below && want < pool => {
                match graph.search(q, score.candidates(want), allowed) {
                    Ok(ids) => ids
                        .into_iter()
                        .filter_map(|id| inner.live.get(&id).map(|v| (id, eval(&inner, id, v))))
                        .collect(),
                    Err(e) => {
                        tracing::warn!(error = %e, "graph search failed; scanning exactly");
                        scan(&inner)
                    }
                }
            }
            _ => scan(&inner),
        };
        exact::page(hits, offset, k)
    }
}
