//! A search: through the graph for candidates and exact scores for their order, or an exact scan where the
//! graph does not pay (few points, a narrow filter, or asking for nearly everything).

use std::collections::HashSet;

use super::{Hit, Inner, Score, VectorIndex, exact};

/// The most a filter may widen the graph search's candidate list (see `search`).
const MAX_FILTER_WIDENING: usize = 8;

impl VectorIndex {
    /// The best `k` ids after skipping `offset`, by `score` (plus each image's offset when the score takes
    /// it), among `allowed` ids if given; each with its plain similarity too.
    pub fn search(
        &self,
        q: &[f32],
        score: Score,
        offset: usize,
        k: usize,
        allowed: Option<&HashSet<i64>>,
    ) -> Vec<Hit> {
        let want = offset + k;
        let inner = self.read();
        let pool = allowed.map_or(inner.live.len(), |a| a.len());
        let eval = |inner: &Inner, id: i64, v: &[f32]| -> Hit {
            let similarity = score.eval(q, v);
            let score = if score.uses_offsets() {
                similarity + inner.offsets.get(&id).copied().unwrap_or(0.0)
            } else {
                similarity
            };
            Hit {
                id,
                score,
                similarity,
            }
        };
        let scan = |inner: &Inner| exact::scan(inner, allowed, |id, v| eval(inner, id, v));
        // Under a filter, USearch's filtered walk does not step through the points the filter leaves out, so a
        // broad filter cuts the graph's paths (at 50%, recall@10 at 100k fell to 0.92). A filter that keeps at
        // least 1/MAX_FILTER_WIDENING of the points therefore walks the whole graph for proportionally more
        // candidates and keeps those it allows; a narrower one uses the filtered walk, with its candidate list
        // widened the same way; one narrow enough that scanning its points costs less is scanned.
        let (count, filter) = match allowed {
            Some(a) => {
                let thinned = inner.live.len().div_ceil(pool.max(1));
                let count = score.candidates(want) * thinned.clamp(1, MAX_FILTER_WIDENING);
                (count, (thinned > MAX_FILTER_WIDENING).then_some(a))
            }
            None => (score.candidates(want), None),
        };
        let walk_pays =
            allowed.is_none() || walk_beats_scan(WALK_COST, pool, inner.live.len(), count);
        let hits = match &inner.graph {
            Some(graph) if pool > self.params.exact_below && want < pool && walk_pays => {
                let walk = |count: usize, filter: Option<&HashSet<i64>>| {
                    graph.search(q, count, filter).map(|ids| match allowed {
                        Some(a) => ids
                            .into_iter()
                            .filter(|id| a.contains(id))
                            .collect::<Vec<_>>(),
                        None => ids,
                    })
                };
                let mut found = walk(count, filter);
                // A broad filter whose ids all sit away from the query (a cluster left out whole) leaves the
                // unfiltered walk's candidates short: the filtered walk, widened, goes on to the allowed ones
                // before the scan is needed (at 1M, 50%: the scan of 500,000 ids was the 1.1 s p99).
                if let (Ok(ids), None, Some(a)) = (&found, filter, allowed) {
                    if ids.len() < want {
                        found = walk(count * MAX_FILTER_WIDENING, Some(a));
                    }
                }
                match found {
                    // A filter that clusters away from the query can leave too few of the walk's candidates:
                    // the exact scan of the allowed ids is then the answer (never a short page).
                    Ok(ids) if allowed.is_some() && ids.len() < want => scan(&inner),
                    Ok(ids) => ids
                        .into_iter()
                        .filter_map(|id| inner.live.get(&id).map(|v| eval(&inner, id, v)))
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

/// A walk through a filter that keeps 1 point in `t` costs about `WALK_COST x count x t` vector comparisons of an
/// exact scan. Measured at 1M (1,024-d, m 24, 800 candidates; docs/benchmarks.md): the filtered walk took 260,
/// 74-98 and 55 ms at 1%, 5% and 10%, the scan of the allowed ids 24, 94 and 176 ms: they meet near 5%.
pub(crate) const WALK_COST: f64 = 3.0;

/// Whether a walk through a graph for `count` candidates among the `pool` ids a filter allows (of `live`)
/// costs less than scoring the pool exactly, a walked point costing `walk_cost` scanned ones: the scan costs
/// `pool`, the walk `walk_cost x count x live / pool`, so the scan wins while pool^2 <= walk_cost x count x live
/// (here, WALK_COST: about 49,000 of 1M at k 10; pgvector's walk has its own cost, the service's database.rs).
pub fn walk_beats_scan(walk_cost: f64, pool: usize, live: usize, count: usize) -> bool {
    let pool = pool as f64;
    pool * pool > walk_cost * count as f64 * live as f64
}

/// The largest pool `walk_beats_scan` still scans: a count of a filter's matches that reaches past it settles
/// the choice (a walk) without counting further.
pub fn largest_scanned(walk_cost: f64, live: usize, count: usize) -> usize {
    (walk_cost * count as f64 * live as f64).sqrt() as usize
}
