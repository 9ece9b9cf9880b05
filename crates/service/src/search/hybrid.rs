//! Keyword and hybrid image search for a sentence. The keyword ranking comes from the database's full-text
//! index over each image's captions, external id and declared metadata fields (the store's keywords.rs); the
//! vector ranking from the index as in vector mode; hybrid fuses the two by reciprocal rank (RRF, k = 60),
//! each weighted, so a product word the text model has never seen ("espadrille", "sku-4411") still finds its
//! product, and a paraphrase with no word in common still finds it by vector.

use std::collections::HashMap;

use crate::{
    CollectionRef, Result, Service, ServiceError,
    search::{Query, QueryVector, Ranked, SearchMode, SearchParams},
};
use crate::{modality::Modality, store::KeywordQuery};

/// RRF's constant: a result's share is weight / (60 + rank), as in Cormack et al. (2009).
const RRF_K: f32 = 60.0;

/// The keyword ranking's share of a hybrid score: as asked, or by default 0.5 leaning towards the keywords as
/// far as the sentence's vector is blind: a sentence all of whose words the text model does not know has a
/// vector that says nothing, and ranks by its words alone (1.0).
pub(super) fn keyword_weight(p: &SearchParams, qv: &QueryVector) -> Result<f32> {
    let w = p
        .keyword_weight
        .unwrap_or(0.5 + 0.5 * qv.unknown_share.clamp(0.0, 1.0));
    if !(0.0..=1.0).contains(&w) {
        return Err(ServiceError::Invalid(format!(
            "keyword_weight is {w}; it must be between 0 and 1"
        )));
    }
    Ok(w)
}

impl Service {
    /// The mode a search runs in: as asked (keyword and hybrid need a sentence), or by default hybrid for a
    /// sentence in a collection with words to match (`text_fields`, or captions), vector otherwise.
    pub(crate) async fn resolve_mode(
        &self,
        c: &CollectionRef,
        q: &Query,
        asked: Option<SearchMode>,
    ) -> Result<SearchMode> {
        match (asked, q) {
            (Some(SearchMode::Vector), _) => Ok(SearchMode::Vector),
            (Some(m), Query::Text(_)) => Ok(m),
            (Some(m), _) => Err(ServiceError::Invalid(format!(
                "mode \"{}\" needs a `text` query: keyword search ranks images by the words of a sentence",
                m.as_str()
            ))),
            (None, Query::Text(_))
                if c.text_fields.is_some() || self.has_captions(c.id).await? =>
            {
                Ok(SearchMode::Hybrid)
            }
            (None, _) => Ok(SearchMode::Vector),
        }
    }

    /// Whether the collection holds captions: from the caption index where it is in memory, else the store.
    async fn has_captions(&self, collection_id: i64) -> Result<bool> {
        Ok(match self.memory_indexes(collection_id)? {
            Some(idx) => !idx.captions.is_empty(),
            None => self.store.has_captions(collection_id).await?,
        })
    }

    /// The page of a keyword or hybrid search, ranked by the fused score (keyword: the engine's relevance),
    /// each hit with its vector similarity; and how many images the filter admits.
    pub(crate) async fn fused(
        &self,
        c: &CollectionRef,
        qv: &QueryVector,
        text: &str,
        mode: SearchMode,
        w: f32,
        p: &SearchParams,
    ) -> Result<(Vec<Ranked>, Option<usize>)> {
        // Deep enough that a result ranked low by one side and high by the other is seen by both.
        let depth = ((p.offset + p.k) * 2).clamp(100, self.opts.max_k.max(100));
        let query = KeywordQuery::parse(text);
        let keyword = self
            .timed_db(
                "keyword_search",
                self.store.keyword_search(c.id, &query, &p.filter, depth),
            )
            .await?;
        let (vector, matches) = if mode == SearchMode::Hybrid {
            let deep = SearchParams {
                k: depth,
                offset: 0,
                min_score: None,
                ..p.clone()
            };
            self.search_ids(c, Modality::Images, qv, &deep).await?
        } else if p.filter.is_all() {
            (vec![], None)
        } else if self.in_database() {
            let n = self.store.count_matching(c.id, &p.filter, None).await?;
            (vec![], Some(n))
        } else {
            let indexes = self.indexes_of(c.id)?;
            (
                vec![],
                Some(self.allowed_images(&indexes, &p.filter).await?.len()),
            )
        };
        let score = self.score(qv.modality, Modality::Images);
        // The similarity of keyword hits the vector side did not reach: from the index's vectors, or under
        // --index database from their rows (one read for all of them).
        let seen: std::collections::HashSet<i64> = vector.iter().map(|h| h.0).collect();
        let missing: Vec<i64> = keyword
            .iter()
            .map(|h| h.0)
            .filter(|id| !seen.contains(id))
            .collect();
        let other_sims: HashMap<i64, f32> = match self.memory_indexes(c.id)? {
            Some(idx) => missing
                .iter()
                .filter_map(|id| {
                    idx.images
                        .vector(*id)
                        .map(|v| (*id, score.eval(&qv.vector, &v)))
                })
                .collect(),
            None => self
                .store
                .vectors_by_ids(c.id, Modality::Images, &missing)
                .await?
                .into_iter()
                .map(|s| (s.id, score.eval(&qv.vector, &s.vector)))
                .collect(),
        };
        // id -> (fused score, similarity)
        let mut fused: HashMap<i64, (f32, Option<f32>)> = HashMap::new();
        for (rank, (id, _, sim)) in vector.iter().enumerate() {
            let e = fused.entry(*id).or_insert((0.0, None));
            e.0 += (1.0 - w) / (RRF_K + rank as f32 + 1.0);
            e.1 = Some(*sim);
        }
        for (rank, (id, relevance)) in keyword.iter().enumerate() {
            let e = fused.entry(*id).or_insert((0.0, None));
            e.0 += match mode {
                SearchMode::Keyword => *relevance,
                _ => w / (RRF_K + rank as f32 + 1.0),
            };
        }
        let mut ranked: Vec<Ranked> = fused
            .into_iter()
            .filter_map(|(id, (s, sim))| {
                // A keyword hit the vector side did not reach: its similarity from the index. One this
                // server's index does not hold yet (just written on another replica) waits for the follower.
                let sim = sim.or_else(|| other_sims.get(&id).copied())?;
                Some((id, s, sim))
            })
            .filter(|(_, _, sim)| p.min_score.is_none_or(|m| *sim >= m))
            .collect();
        ranked.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then(b.2.total_cmp(&a.2))
                .then(a.0.cmp(&b.0))
        });
        Ok((
            ranked.into_iter().skip(p.offset).take(p.k).collect(),
            matches,
        ))
    }
}
