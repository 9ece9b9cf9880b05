//! Search under `--index database`: the candidates come from the HNSW index inside Postgres (pgvector, the
//! store's pgvector.rs), walked under the metadata filter in one SQL query; their exact f32 vectors and offsets
//! come back with them and are re-ranked here exactly as the memory index re-ranks its graph's candidates
//! (`index::rank_candidates`), so the two backends score and order alike and differ only in which candidates
//! the graph walk finds.

use crate::{
    Result, Service,
    filter::Filter,
    index::{Hit, Score, rank_candidates},
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

    /// The page of hits: the graph walk for `score.candidates(offset + k)` rows, re-ranked exactly. A filter
    /// that admits at most `--exact-below` rows scans them exactly instead (cheaper than a walk that skips
    /// nearly everything, and exact); a walk that comes back short (pgvector's iterative scan stops after
    /// `hnsw.max_scan_tuples` visits, and a small collection is a narrow filter on the shared table) is
    /// replaced by the exact scan, so a page is never short while rows remain.
    pub(crate) async fn nearest_in_database(&self, q: DbQuery<'_>) -> Result<Vec<Hit>> {
        let score = self.score(q.query_modality, q.target);
        let limit = score.candidates(q.offset + q.k);
        let mut n = Nearest {
            collection_id: q.collection_id,
            modality: q.target,
            query: q.vector,
            metric: metric_of(score),
            limit,
            filter: q.filter,
            exclude: q.exclude,
            ef_search: self.opts.index.ef_search.max(limit),
            exact: q.matches.is_some_and(|m| m <= self.opts.index.exact_below),
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
