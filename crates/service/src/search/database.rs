//! Search under `--index database`: the candidates come from the HNSW index inside Postgres (pgvector, the
//! store's pgvector.rs), walked under the metadata filter in one SQL query; their exact f32 vectors and offsets
//! come back with them and are re-ranked here exactly as the memory index re-ranks its graph's candidates
//! (`index::rank_candidates`), so the two backends score and order alike and differ only in which candidates
//! the graph walk finds.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::{
    Result, Service,
    filter::Filter,
    index::{Hit, Score, rank_candidates, walk_beats_scan},
    modality::Modality,
    search::{QueryVector, Ranked, SearchParams},
    store::{Nearest, VectorMetric},
};

/// Which of pgvector's distances finds the candidates for a score: the inner product for cosine (unit
/// vectors), euclidean distance otherwise (order bundles take L2 candidates, as the memory index does).
pub(crate) fn metric_of(score: Score) -> VectorMetric {
    match score {
        Score::Cosine | Score::CosineOffset => VectorMetric::InnerProduct,
        Score::Order { .. } | Score::NegL2 => VectorMetric::L2,
    }
}

/// A filtered walk through pgvector's index visits about `limit x live / matches` tuples (its iterative scan goes
/// on until `limit` of them pass the filter), each costing about `WALK_COST` times a row of the exact scan, which
/// reads the `matches` rows: the scan costs less while matches^2 <= WALK_COST x limit x live, and is exact.
/// Measured at 1M (docs/benchmarks.md, "1M photos re-drawn"): the scan about 5 us a row (10,000 rows 96 ms, 50,000 308 ms),
/// a visited tuple about 60 us (a heap fetch to test the filter), so about 35,000 rows (3.5%) at 100 candidates.
const WALK_COST: f64 = 12.0;

/// How long a collection's counted size serves the scan-or-walk choice: it needs the order of magnitude only,
/// and a count of 1M rows costs a search's worth of time.
const SIZE_TTL: Duration = Duration::from_secs(60);

/// Collections' sizes as last counted, and when.
#[derive(Default)]
pub(crate) struct CollectionSizes(Mutex<HashMap<i64, (Instant, usize)>>);

/// The one query, its settings and what to ask for.
pub(crate) struct DbQuery<'a> {
    pub collection_id: i64,
    pub target: Modality,
    pub vector: &'a [f32],
    pub query_modality: Modality,
    pub filter: &'a Filter,
    pub exclude: Option<i64>,
    /// How many rows the filter admits, when there is one.
    pub matches: Option<usize>,
    pub offset: usize,
    pub k: usize,
}

impl Service {
    /// `search_ids` under `--index database`.
    pub(crate) async fn search_in_database(
        &self,
        collection_id: i64,
        target: Modality,
        q: &QueryVector,
        p: &SearchParams,
    ) -> Result<(Vec<Ranked>, Option<usize>)> {
        let exclude = q.exclude.filter(|_| target == Modality::Images);
        let matches = if p.filter.is_all() {
            None
        } else {
            Some(
                self.timed_db(
                    "count_matching",
                    self.store.count_matching(collection_id, &p.filter, exclude),
                )
                .await?,
            )
        };
        let hits = self
            .nearest_in_database(DbQuery {
                collection_id,
                target,
                vector: &q.vector,
                query_modality: q.modality,
                filter: &p.filter,
                exclude,
                matches,
                offset: p.offset,
                k: p.k,
            })
            .await?;
        // Ranked by score, so the cut keeps a prefix of the page (as in memory mode).
        let ranked = hits
            .into_iter()
            .filter(|h| p.min_score.is_none_or(|m| h.score >= m))
            .map(|h| (h.id, h.score, h.similarity))
            .collect();
        Ok((ranked, matches))
    }

    /// A collection's image count, counted at most once a `SIZE_TTL`.
    async fn collection_size(&self, collection_id: i64) -> Result<usize> {
        if let Some((at, n)) = self.sizes.0.lock().expect("sizes").get(&collection_id) {
            if at.elapsed() < SIZE_TTL {
                return Ok(*n);
            }
        }
        let n = self
            .timed_db(
                "count_images",
                self.store.count_images(collection_id, &Filter::all()),
            )
            .await?
            .max(0) as usize;
        self.sizes
            .0
            .lock()
            .expect("sizes")
            .insert(collection_id, (Instant::now(), n));
        Ok(n)
    }

    /// Whether a filter admitting `matches` rows is scanned exactly rather than walked: at most
    /// `--exact-below` rows, or whenever the scan costs less than pgvector's walk (`index::walk_beats_scan` at
    /// this WALK_COST).
    async fn scans(
        &self,
        collection_id: i64,
        matches: Option<usize>,
        limit: usize,
    ) -> Result<bool> {
        Ok(match matches {
            None => false,
            Some(m) if m <= self.opts.index.exact_below => true,
            Some(m) => {
                let live = self.collection_size(collection_id).await?;
                !walk_beats_scan(WALK_COST, m, live, limit)
            }
        })
    }

    /// The page of hits: the graph walk for `score.candidates(offset + k)` rows, re-ranked exactly. A filter
    /// narrow enough (`scans`) is scanned exactly instead (cheaper than a walk that skips nearly everything,
    /// and exact); a walk that comes back short (pgvector's iterative scan stops after `hnsw.max_scan_tuples`
    /// visits, and a small collection is a narrow filter on the shared table) is replaced by the exact scan,
    /// so a page is never short while rows remain.
    pub(crate) async fn nearest_in_database(&self, q: DbQuery<'_>) -> Result<Vec<Hit>> {
        let score = self.score(q.query_modality, q.target);
        let limit = score.candidates(q.offset + q.k);
        let exact = self.scans(q.collection_id, q.matches, limit).await?;
        let mut n = Nearest {
            collection_id: q.collection_id,
            modality: q.target,
            query: q.vector,
            metric: metric_of(score),
            limit,
            filter: q.filter,
            exclude: q.exclude,
            ef_search: self.opts.index.ef_search.max(limit),
            exact,
        };
        let mut found = self.timed_db("nearest", self.store.nearest(&n)).await?;
        if !n.exact && found.len() < limit && q.matches.is_none_or(|m| found.len() < m) {
            n.exact = true;
            found = self.timed_db("nearest", self.store.nearest(&n)).await?;
        }
        Ok(rank_candidates(
            q.vector,
            score,
            found.into_iter().map(|s| (s.id, s.vector, s.offset)),
            q.offset,
            q.k,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{WALK_COST, walk_beats_scan};

    #[test]
    fn narrow_filters_are_scanned_and_broad_ones_walked() {
        // 1M images, 100 candidates (hubness offsets at k 10): the scan wins up to 34,641 matches (3.5%).
        assert!(
            !walk_beats_scan(WALK_COST, 10_000, 1_000_000, 100),
            "1%: scan"
        );
        assert!(!walk_beats_scan(WALK_COST, 34_641, 1_000_000, 100));
        assert!(walk_beats_scan(WALK_COST, 34_642, 1_000_000, 100));
        assert!(
            walk_beats_scan(WALK_COST, 50_000, 1_000_000, 100),
            "5%: walk"
        );
        // In a collection of 10,000 a filter keeping 30% is still scanned, half of it walked.
        assert!(!walk_beats_scan(WALK_COST, 3_000, 10_000, 100));
        assert!(walk_beats_scan(WALK_COST, 5_000, 10_000, 100));
    }
}
