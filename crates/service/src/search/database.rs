//! Search under `--index database`: the candidates come from the HNSW index inside Postgres (pgvector, the
//! store's pgvector.rs), walked under the metadata filter in one SQL query; their exact f32 vectors and offsets
//! come back with them and are re-ranked here exactly as the memory index re-ranks its graph's candidates
//! (`index::rank_candidates`), so the two backends score and order alike and differ only in which candidates
//! the graph walk finds.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::{
    Result, Service,
    filter::Filter,
    index::{Hit, Score, largest_scanned, rank_candidates, walk_beats_scan},
    modality::Modality,
    search::{Matches, QueryVector, Ranked, SearchParams},
    store::{HALF_ERROR, Nearest, Similar, Store, VectorMetric},
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

/// Links per node of the HNSW indexes Postgres builds: pgvector's own default, fewer than the memory index's 24.
/// A search's cost there is its walk (85-90% of its Postgres time at 100k), each visited node a buffer read
/// and a halfvec distance; at 100k 16 links walked 20% faster at `ef_search` 128 for recall@10 0.975 against
/// 0.983 (docs/benchmarks.md, "The index in the database at the speed of the index in memory").
pub(crate) const HNSW_M: usize = 16;

/// A filter's matches are counted exactly up to this many (or as far as the scan-or-walk choice needs); past it
/// a search says "at least" unless it asks for the exact count: at 1M the count of a 50% filter's 500,000
/// matches was 650 ms of an 850 ms search.
pub(crate) const MATCHES_COUNTED_TO: usize = 10_000;

/// How long a collection's counted size serves unquestioned; past it the size still serves while one count in
/// the background replaces it. The breadth and the scan-or-walk choice need its order of magnitude only, and a
/// count is a pass over the collection's rows: 160 ms at 100k, which a search that waited for it added to its
/// own latency (the 200-a-second load's p99 went from 30 ms to 200 in the 10 s that held one).
const SIZE_TTL: Duration = Duration::from_secs(60);

/// Collections' sizes by modality as last counted, and when; shared with the background counts.
#[derive(Default, Clone)]
pub(crate) struct CollectionSizes(Arc<Mutex<HashMap<(i64, Modality), Size>>>);

struct Size {
    counted: Instant,
    n: usize,
    /// A background count is under way: one at a time.
    counting: bool,
}

/// What the cache holds for a collection.
#[derive(Debug, PartialEq, Eq)]
enum Cached {
    /// Nothing yet: the caller counts, and waits.
    Missing,
    /// A size to use; `recount` asks the caller to start the one background count that replaces it.
    Size { n: usize, recount: bool },
}

impl CollectionSizes {
    fn get(&self, key: (i64, Modality), now: Instant) -> Cached {
        let mut sizes = self.0.lock().expect("sizes");
        match sizes.get_mut(&key) {
            None => Cached::Missing,
            Some(s) => {
                let recount = !s.counting && now.saturating_duration_since(s.counted) >= SIZE_TTL;
                s.counting |= recount;
                Cached::Size { n: s.n, recount }
            }
        }
    }

    /// A count's result (None: it failed, and the old size serves until the next one).
    fn counted(&self, key: (i64, Modality), at: Instant, n: Option<usize>) {
        let mut sizes = self.0.lock().expect("sizes");
        match n {
            Some(n) => {
                let size = Size {
                    counted: at,
                    n,
                    counting: false,
                };
                sizes.insert(key, size);
            }
            None => {
                if let Some(s) = sizes.get_mut(&key) {
                    s.counting = false;
                }
            }
        }
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
    pub matches: Option<Matches>,
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
    ) -> Result<(Vec<Ranked>, Option<Matches>)> {
        let exclude = q.exclude.filter(|_| target == Modality::Images);
        let matches = if p.filter.is_all() {
            None
        } else {
            // Counted as far as the choice between scan and walk needs (a filter that admits more is walked
            // whatever its exact count), and at least to MATCHES_COUNTED_TO.
            let limit = self.score(q.modality, target).candidates(p.offset + p.k);
            let live = self
                .collection_size(collection_id, Modality::Images)
                .await?;
            let bound = (!p.exact_matches).then(|| {
                largest_scanned(WALK_COST, live, limit)
                    .max(self.opts.index.exact_below)
                    .max(MATCHES_COUNTED_TO)
            });
            Some(
                self.matches_in_database(collection_id, &p.filter, exclude, bound)
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

    /// How many of the collection's images `filter` admits (`exclude` left out), counted up to `bound` (None:
    /// all of them): past it the answer is "at least `bound`".
    pub(crate) async fn matches_in_database(
        &self,
        collection_id: i64,
        filter: &Filter,
        exclude: Option<i64>,
        bound: Option<usize>,
    ) -> Result<Matches> {
        let n = self
            .timed_db(
                "count_matching",
                self.store
                    .count_matching(collection_id, filter, exclude, bound.map(|b| b + 1)),
            )
            .await?;
        Ok(match bound {
            Some(b) if n > b => Matches {
                count: b,
                exact: false,
            },
            _ => Matches::exact(n),
        })
    }

    /// How many rows one modality's index of a collection holds (images, or sentences: written captions and
    /// text-field sentences): it sets the walk's breadth and chooses between scan and walk. Counted when first
    /// asked; then counted again in the background once `SIZE_TTL` has passed, the last count serving meanwhile.
    pub(crate) async fn collection_size(
        &self,
        collection_id: i64,
        modality: Modality,
    ) -> Result<usize> {
        let key = (collection_id, modality);
        match self.sizes.get(key, Instant::now()) {
            Cached::Size { n, recount } => {
                if recount {
                    let (store, metrics, sizes) =
                        (self.store.clone(), self.metrics.clone(), self.sizes.clone());
                    tokio::spawn(async move {
                        let at = Instant::now();
                        let n = count_rows(&store, collection_id, modality).await;
                        metrics.observe_db(count_op(modality), at.elapsed());
                        if let Err(e) = &n {
                            tracing::warn!(collection_id, error = %e, "counting a collection's rows failed; the last count serves");
                        }
                        sizes.counted(key, at, n.ok());
                    });
                }
                Ok(n)
            }
            Cached::Missing => {
                let at = Instant::now();
                let n = self
                    .timed_db(
                        count_op(modality),
                        count_rows(&self.store, collection_id, modality),
                    )
                    .await?;
                self.sizes.counted(key, at, Some(n));
                Ok(n)
            }
        }
    }

    /// Whether a filter admitting `matches` rows is scanned exactly rather than walked: at most
    /// `--exact-below` rows, or whenever the scan costs less than pgvector's walk (`index::walk_beats_scan` at
    /// this WALK_COST). A count that stopped at its bound is past both.
    async fn scans(
        &self,
        collection_id: i64,
        matches: Option<Matches>,
        limit: usize,
    ) -> Result<bool> {
        Ok(match matches {
            None | Some(Matches { exact: false, .. }) => false,
            Some(Matches { count: m, .. }) if m <= self.opts.index.exact_below => true,
            Some(Matches { count: m, .. }) => {
                let live = self
                    .collection_size(collection_id, Modality::Images)
                    .await?;
                !walk_beats_scan(WALK_COST, m, live, limit)
            }
        })
    }

    /// The page of hits: the graph walk for `score.candidates(offset + k)` rows, re-ranked exactly. A filter
    /// narrow enough (`scans`) is scanned exactly instead (cheaper than a walk that skips nearly everything,
    /// and exact); a walk that comes back short (pgvector's iterative scan stops after `hnsw.max_scan_tuples`
    /// visits, and a small collection is a narrow filter on the shared table) is replaced by the exact scan,
    /// so a page is never short while rows remain. Cosine searches get each candidate's similarity from
    /// Postgres (halfvec) and read the f32 vectors of only those that may make the page (`within_reach`);
    /// other similarities read every candidate's vector.
    pub(crate) async fn nearest_in_database(&self, q: DbQuery<'_>) -> Result<Vec<Hit>> {
        let score = self.score(q.query_modality, q.target);
        let limit = score.candidates(q.offset + q.k);
        let exact = self.scans(q.collection_id, q.matches, limit).await?;
        let ef_search = match self.opts.index.ef_search {
            Some(ef) => ef,
            None => self
                .opts
                .index
                .ef_search_for(self.collection_size(q.collection_id, q.target).await?),
        };
        let mut n = Nearest {
            collection_id: q.collection_id,
            modality: q.target,
            query: q.vector,
            metric: metric_of(score),
            limit,
            filter: q.filter,
            exclude: q.exclude,
            ef_search: ef_search.max(limit),
            exact,
        };
        let found = match n.metric {
            VectorMetric::InnerProduct => {
                let nearest = self.store.nearest_similarities(&n);
                let mut similar = self.timed_db("nearest", nearest).await?;
                if walked_short(&n, similar.len(), q.matches) {
                    n.exact = true;
                    let nearest = self.store.nearest_similarities(&n);
                    similar = self.timed_db("nearest", nearest).await?;
                }
                let ids = within_reach(&similar, score.uses_offsets(), q.offset + q.k);
                let vectors = self.store.vectors_by_ids(q.collection_id, q.target, &ids);
                self.timed_db("nearest_vectors", vectors).await?
            }
            VectorMetric::L2 => {
                let mut found = self.timed_db("nearest", self.store.nearest(&n)).await?;
                if walked_short(&n, found.len(), q.matches) {
                    n.exact = true;
                    found = self.timed_db("nearest", self.store.nearest(&n)).await?;
                }
                found
            }
        };
        Ok(rank_candidates(
            q.vector,
            score,
            found.into_iter().map(|s| (s.id, s.vector, s.offset)),
            q.offset,
            q.k,
        ))
    }
}

/// The metric name of a size count.
fn count_op(modality: Modality) -> &'static str {
    match modality {
        Modality::Images => "count_images",
        Modality::Captions => "count_sentences",
    }
}

/// The rows of one modality's index of a collection.
async fn count_rows(store: &Store, collection_id: i64, modality: Modality) -> Result<usize> {
    let n = match modality {
        Modality::Images => store.count_images(collection_id, &Filter::all()).await?,
        Modality::Captions => store.count_sentences(collection_id).await?,
    };
    Ok(n.max(0) as usize)
}

/// Whether a walk found fewer rows than it asked for while the filter admits more: pgvector's iterative scan
/// gave up (`hnsw.max_scan_tuples`), and the exact scan must give the page.
fn walked_short(n: &Nearest<'_>, found: usize, matches: Option<Matches>) -> bool {
    !n.exact && found < n.limit && matches.is_none_or(|m| found < m.count)
}

/// The candidates whose exact score may place them among the first `want`: each one's score from the halfvec
/// similarity is within HALF_ERROR of its exact score, so any of the exact first `want` scores at least the
/// `want`-th best approximate score less twice that. Their f32 vectors then give the exact order, the same
/// as re-ranking every candidate.
fn within_reach(similar: &[Similar], offsets: bool, want: usize) -> Vec<i64> {
    let approx = |s: &Similar| s.similarity + if offsets { s.offset } else { 0.0 };
    let mut scores: Vec<f32> = similar.iter().map(approx).collect();
    if scores.len() <= want {
        return similar.iter().map(|s| s.id).collect();
    }
    let (_, nth, _) = scores.select_nth_unstable_by(want.max(1) - 1, |a, b| b.total_cmp(a));
    let floor = *nth - 2.0 * HALF_ERROR;
    similar
        .iter()
        .filter(|s| approx(s) >= floor)
        .map(|s| s.id)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{
        Cached, CollectionSizes, HALF_ERROR, SIZE_TTL, Similar, WALK_COST, largest_scanned,
        walk_beats_scan, within_reach,
    };
    use crate::modality::Modality;

    #[test]
    fn a_stale_size_serves_while_one_count_replaces_it() {
        let sizes = CollectionSizes::default();
        let key = (7, Modality::Images);
        let t0 = Instant::now();
        assert_eq!(sizes.get(key, t0), Cached::Missing);
        sizes.counted(key, t0, Some(100));
        let fresh = Cached::Size {
            n: 100,
            recount: false,
        };
        assert_eq!(sizes.get(key, t0 + Duration::from_secs(1)), fresh);
        // Past the TTL the old size serves, and only the first caller is asked to count.
        let late = t0 + SIZE_TTL + Duration::from_secs(1);
        assert_eq!(
            sizes.get(key, late),
            Cached::Size {
                n: 100,
                recount: true
            }
        );
        assert_eq!(sizes.get(key, late), fresh);
        // A failed count keeps the old size and lets the next caller try again.
        sizes.counted(key, late, None);
        assert_eq!(
            sizes.get(key, late),
            Cached::Size {
                n: 100,
                recount: true
            }
        );
        sizes.counted(key, late, Some(250));
        assert_eq!(
            sizes.get(key, late + Duration::from_secs(1)),
            Cached::Size {
                n: 250,
                recount: false
            }
        );
        // Other collections and modalities are their own entries.
        assert_eq!(sizes.get((7, Modality::Captions), late), Cached::Missing);
    }

    #[test]
    fn rows_that_may_make_the_page_are_kept_and_the_rest_left() {
        let s = |id, similarity, offset| Similar {
            id,
            similarity,
            offset,
        };
        let found = [
            s(1, 0.50, 0.0),
            s(2, 0.40, 0.0),
            s(3, 0.40 - 1.9 * HALF_ERROR, 0.0),
            s(4, 0.40 - 2.1 * HALF_ERROR, 0.0),
            s(5, 0.10, 0.35),
            s(6, 0.20, 0.0),
        ];
        // The second best is 0.40: 3 is within reach of it, 4 just beyond.
        assert_eq!(within_reach(&found, false, 2), vec![1, 2, 3]);
        // With offsets 5 scores 0.45 and becomes the second best.
        assert_eq!(within_reach(&found, true, 2), vec![1, 5]);
        // A page as long as the candidates keeps them all.
        assert_eq!(within_reach(&found, false, 6).len(), 6);
        assert_eq!(within_reach(&found, false, 9).len(), 6);
    }

    #[test]
    fn narrow_filters_are_scanned_and_broad_ones_walked() {
        // 1M images, 100 candidates (hubness offsets at k 10): the scan wins up to 34,641 matches (3.5%).
        assert!(
            !walk_beats_scan(WALK_COST, 10_000, 1_000_000, 100),
            "1%: scan"
        );
        assert!(!walk_beats_scan(WALK_COST, 34_641, 1_000_000, 100));
        assert!(walk_beats_scan(WALK_COST, 34_642, 1_000_000, 100));
        // The bound a filter's count goes to is that same edge.
        assert_eq!(largest_scanned(WALK_COST, 1_000_000, 100), 34_641);
        assert_eq!(largest_scanned(WALK_COST, 10_000, 100), 3_464);
        assert!(!walk_beats_scan(WALK_COST, 3_464, 10_000, 100));
        assert!(walk_beats_scan(WALK_COST, 3_465, 10_000, 100));
        assert!(
            walk_beats_scan(WALK_COST, 50_000, 1_000_000, 100),
            "5%: walk"
        );
        // In a collection of 10,000 a filter keeping 30% is still scanned, half of it walked.
        assert!(!walk_beats_scan(WALK_COST, 3_000, 10_000, 100));
        assert!(walk_beats_scan(WALK_COST, 5_000, 10_000, 100));
    }
}
