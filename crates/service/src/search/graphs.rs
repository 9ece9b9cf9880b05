//! Search under `--index memory`: the collection's HNSW graph of the target modality, held in this process
//! (`registry`), walked under the filter's allowed set (read from the metadata held beside the vectors) off the
//! async threads.

use std::collections::HashSet;

use crate::{
    CollectionIndexes, Result, Service, ServiceError,
    filter::Filter,
    modality::Modality,
    search::{Matches, QueryVector, Ranked, SearchParams},
};

impl Service {
    /// `search_ids` in this process's graphs.
    pub(crate) async fn search_in_graphs(
        &self,
        collection_id: i64,
        target: Modality,
        q: &QueryVector,
        p: &SearchParams,
    ) -> Result<(Vec<Ranked>, Option<Matches>)> {
        // A stored query image is left out of image results before paging, so pages neither skip nor repeat.
        let exclude = q.exclude.filter(|_| target == Modality::Images);
        let indexes = self.indexes_of(collection_id)?;
        let mut allowed: Option<HashSet<i64>> = if p.filter.is_all() {
            None
        } else {
            Some(self.allowed_images(&indexes, &p.filter).await?)
        };
        if let (Some(x), Some(a)) = (exclude, allowed.as_mut()) {
            a.remove(&x);
        }
        let matches = allowed.as_ref().map(|a| Matches::exact(a.len()));
        let idx = indexes.get(target).clone();
        let score = self.score(q.modality, target);
        let (offset, k, extra) = (p.offset, p.k, usize::from(exclude.is_some()));
        let (vector, min_score) = (q.vector.clone(), p.min_score);
        let hits = tokio::task::spawn_blocking(move || {
            let page = match exclude {
                None => idx.search(&vector, score, offset, k, allowed.as_ref()),
                Some(x) => idx
                    .search(&vector, score, 0, offset + k + extra, allowed.as_ref())
                    .into_iter()
                    .filter(|h| h.id != x)
                    .skip(offset)
                    .take(k)
                    .collect(),
            };
            // Ranked by score, so the cut keeps a prefix of the page.
            page.into_iter()
                .filter(|h| min_score.is_none_or(|m| h.score >= m))
                .map(|h| (h.id, h.score, h.similarity))
                .collect::<Vec<Ranked>>()
        })
        .await
        .map_err(|e| ServiceError::Unavailable(e.to_string()))?;
        Ok((hits, matches))
    }

    /// `rank` in this process's graphs.
    pub(crate) fn rank_in_graphs(
        &self,
        collection_id: i64,
        target: Modality,
        q: &[f32],
        qm: Modality,
        k: usize,
    ) -> Result<Vec<(i64, f32)>> {
        let idx = self.indexes_of(collection_id)?.get(target).clone();
        let score = self.score(qm, target);
        Ok(idx
            .search(q, score, 0, k, None)
            .into_iter()
            .map(|h| (h.id, h.score))
            .collect())
    }

    /// How many images `filter` admits, from the metadata held beside the graphs.
    pub(crate) async fn matches_in_graphs(
        &self,
        collection_id: i64,
        filter: &Filter,
    ) -> Result<usize> {
        let indexes = self.indexes_of(collection_id)?;
        Ok(self.allowed_images(&indexes, filter).await?.len())
    }

    /// The images `filter` admits, from the metadata held beside the vectors (the index's attributes.rs), off
    /// the async threads as the search itself.
    pub(crate) async fn allowed_images(
        &self,
        indexes: &CollectionIndexes,
        filter: &Filter,
    ) -> Result<HashSet<i64>> {
        let (attributes, filter) = (indexes.attributes.clone(), filter.clone());
        tokio::task::spawn_blocking(move || attributes.matching(&filter))
            .await
            .map_err(|e| ServiceError::Unavailable(e.to_string()))
    }
}
