//! Products with several photos. A collection's `group_by` field names each image's product; an image search
//! in it returns each product once, scored by its best photo and its words, and pages, filters and counts by
//! product. The photos stay points of their own and are collapsed when ranked (as Qdrant's search groups do),
//! rather than held as one item with several photos: each photo keeps its vector, thumbnail, captions and
//! hubness offset, a photo is added or removed by the same writes as any image, both index modes and the
//! feed's rows stay as they are, and a collection can be grouped by any field its metadata already has.

use std::collections::{HashMap, HashSet};

use super::{Candidates, Matches, QueryVector, Ranked, SearchParams};
use crate::{
    CollectionRef, Result, Service,
    filter::{FieldPath, Filter, GroupKey},
    modality::Modality,
};

/// The most photos a grouped vector search reads to fill its page of products.
const MAX_DEPTH: usize = 20_000;

/// A found product: the value of its key, and its photos (the hit's own first, then the others by id).
#[derive(Debug, Clone, PartialEq)]
pub struct Product {
    pub key: Option<String>,
    pub photos: Vec<i64>,
}

/// The product key an image search groups by: the collection's, unless the request asked for photos one by one.
pub(super) fn grouping<'a>(c: &'a CollectionRef, p: &SearchParams) -> Option<&'a FieldPath> {
    c.group_by.as_ref().filter(|_| p.group)
}

/// The first (best ranked) photo of each product in rank order, leaving out the product `drop` (the query
/// photo's own, in a search by a stored photo).
fn first_of_each(
    ranked: &[Ranked],
    keys: &HashMap<i64, GroupKey>,
    drop: Option<&GroupKey>,
) -> Vec<Ranked> {
    let mut seen: HashSet<&GroupKey> = HashSet::new();
    ranked
        .iter()
        .filter(|(id, ..)| match keys.get(id) {
            Some(k) => Some(k) != drop && seen.insert(k),
            None => true,
        })
        .copied()
        .collect()
}

/// A sentence search's candidates, one per product: the photo the vector channel scores highest stands for
/// it, and each channel's value is the best of the product's candidate photos', so a product is found by its
/// best photo and by the words of whichever photo carries them.
pub(super) fn collapse(
    cands: Candidates,
    keys: &HashMap<i64, GroupKey>,
    drop: Option<&GroupKey>,
) -> Candidates {
    let Candidates {
        ids,
        similarity,
        channels,
        matches,
    } = cands;
    let vector = &channels[0].values;
    let score = |id: &i64, sim: f32| vector.get(id).copied().unwrap_or(sim);
    let mut best: HashMap<&GroupKey, (i64, f32)> = HashMap::new();
    for (id, sim) in ids.iter().zip(&similarity) {
        if let Some(k) = keys.get(id).filter(|k| Some(*k) != drop) {
            let s = score(id, *sim);
            let b = best.entry(k).or_insert((*id, s));
            if s > b.1 || (s == b.1 && *id < b.0) {
                *b = (*id, s);
            }
        }
    }
    let stands_for = |id: &i64| -> Option<i64> {
        match keys.get(id) {
            Some(k) if Some(k) == drop => None,
            Some(k) => Some(best[k].0),
            None => Some(*id),
        }
    };
    let candidate: HashSet<i64> = ids.iter().copied().collect();
    let channels = channels.map(|mut ch| {
        let mut values: HashMap<i64, f32> = HashMap::new();
        for (id, v) in &ch.values {
            if let Some(r) = candidate.contains(id).then(|| stands_for(id)).flatten() {
                let e = values.entry(r).or_insert(*v);
                *e = e.max(*v);
            }
        }
        ch.values = values;
        ch
    });
    let (ids, similarity) = ids
        .into_iter()
        .zip(similarity)
        .filter(|(id, _)| stands_for(id) == Some(*id))
        .unzip();
    Candidates {
        ids,
        similarity,
        channels,
        matches,
    }
}

impl Service {
    /// The product key of each of `ids` that has one: from the metadata held beside the vectors, or under
    /// --index database from the rows.
    pub(super) async fn group_keys(
        &self,
        c: &CollectionRef,
        path: &FieldPath,
        ids: &[i64],
    ) -> Result<HashMap<i64, GroupKey>> {
        Ok(match self.memory_indexes(c.id)? {
            Some(idx) => ids
                .iter()
                .zip(idx.attributes.keys(path, ids))
                .filter_map(|(id, k)| Some((*id, k?)))
                .collect(),
            None => self
                .timed_db("group_keys", self.store.image_metadata(c.id, Some(ids)))
                .await?
                .into_iter()
                .filter_map(|(id, m)| Some((id, GroupKey::in_metadata(path, &m)?)))
                .collect(),
        })
    }

    /// The ranked page of products for a vector search: photos read deeper until the page is full of
    /// distinct products (or the collection, or `MAX_DEPTH`, runs out), the first of each kept.
    pub(super) async fn grouped_ids(
        &self,
        c: &CollectionRef,
        path: &FieldPath,
        q: &QueryVector,
        p: &SearchParams,
    ) -> Result<(Vec<Ranked>, Option<Matches>)> {
        let want = p.offset + p.k;
        let drop = self.dropped_product(c, path, q).await?;
        let mut depth = (want * 4).max(64);
        loop {
            let deep = SearchParams {
                k: depth,
                offset: 0,
                ..p.clone()
            };
            let (ranked, _) = self.search_ids(c, Modality::Images, q, &deep).await?;
            let ids: Vec<i64> = ranked.iter().map(|h| h.0).collect();
            let keys = self.group_keys(c, path, &ids).await?;
            let firsts = first_of_each(&ranked, &keys, drop.as_ref());
            if firsts.len() >= want || ranked.len() < depth || depth >= MAX_DEPTH {
                let page = firsts.into_iter().skip(p.offset).take(p.k).collect();
                return Ok((page, self.count_products(c, path, &p.filter).await?));
            }
            depth = (depth * 4).min(MAX_DEPTH);
        }
    }

    /// The product of the stored photo a search is by, left out of its results.
    pub(super) async fn dropped_product(
        &self,
        c: &CollectionRef,
        path: &FieldPath,
        q: &QueryVector,
    ) -> Result<Option<GroupKey>> {
        Ok(match q.exclude {
            Some(id) => self.group_keys(c, path, &[id]).await?.remove(&id),
            None => None,
        })
    }

    /// How many products the filter admits (None without a filter, as for images).
    pub(super) async fn count_products(
        &self,
        c: &CollectionRef,
        path: &FieldPath,
        filter: &Filter,
    ) -> Result<Option<Matches>> {
        if filter.is_all() {
            return Ok(None);
        }
        Ok(Some(Matches::exact(match self.memory_indexes(c.id)? {
            Some(idx) => {
                let allowed = self.allowed_images(&idx, filter).await?;
                let attributes = idx.attributes.clone();
                let path = path.clone();
                tokio::task::spawn_blocking(move || attributes.count_products(&path, &allowed))
                    .await
                    .map_err(|e| crate::ServiceError::Unavailable(e.to_string()))?
            }
            None => {
                self.timed_db(
                    "count_products",
                    self.store.count_products(c.id, filter, path),
                )
                .await?
            }
        })))
    }

    /// Each found product's key and photos, in the order of `ids` (the page's photos).
    pub(super) async fn products(
        &self,
        c: &CollectionRef,
        path: &FieldPath,
        ids: &[i64],
    ) -> Result<Vec<Product>> {
        let keys = self.group_keys(c, path, ids).await?;
        let wanted: HashSet<GroupKey> = keys.values().cloned().collect();
        let members: Vec<(i64, GroupKey)> = if wanted.is_empty() {
            vec![]
        } else {
            match self.memory_indexes(c.id)? {
                Some(idx) => idx.attributes.members(path, &wanted),
                None => {
                    let f = Filter::In(
                        path.clone(),
                        wanted.iter().map(GroupKey::scalar).collect(),
                        false,
                    );
                    self.timed_db(
                        "product_photos",
                        self.store.image_metadata_matching(c.id, &f),
                    )
                    .await?
                    .into_iter()
                    .filter_map(|(id, m)| Some((id, GroupKey::in_metadata(path, &m)?)))
                    .collect()
                }
            }
        };
        let mut photos: HashMap<&GroupKey, Vec<i64>> = HashMap::new();
        for (id, k) in &members {
            photos.entry(k).or_default().push(*id);
        }
        Ok(ids
            .iter()
            .map(|id| match keys.get(id) {
                Some(k) => {
                    let mut all = photos.get(k).cloned().unwrap_or_default();
                    all.sort_unstable_by_key(|p| (p != id, *p));
                    if all.first() != Some(id) {
                        all.insert(0, *id);
                    }
                    Product {
                        key: Some(k.to_string()),
                        photos: all,
                    }
                }
                None => Product {
                    key: None,
                    photos: vec![*id],
                },
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::fusion::ChannelScores;

    fn key(s: &str) -> GroupKey {
        GroupKey::Str(s.into())
    }

    #[test]
    fn the_first_photo_of_each_product_in_rank_order() {
        let ranked = vec![
            (5, 0.9, 0.9),
            (3, 0.8, 0.8),
            (7, 0.7, 0.7),
            (1, 0.6, 0.6),
            (2, 0.5, 0.5),
        ];
        let keys = HashMap::from([(5, key("a")), (7, key("a")), (1, key("b")), (2, key("c"))]);
        let ids = |r: Vec<Ranked>| r.into_iter().map(|h| h.0).collect::<Vec<_>>();
        // 3 has no key: a product of its own.
        assert_eq!(ids(first_of_each(&ranked, &keys, None)), vec![5, 3, 1, 2]);
        assert_eq!(
            ids(first_of_each(&ranked, &keys, Some(&key("a")))),
            vec![3, 1, 2]
        );
    }

    #[test]
    fn a_product_takes_each_channel_at_its_best_photo() {
        let ch = |pairs: &[(i64, f32)]| ChannelScores {
            weight: 0.0,
            values: pairs.iter().copied().collect(),
            floor: 0.0,
        };
        // Photos 1 and 2 are product "a": 2 is the better photo, 1 carries the words.
        let cands = Candidates {
            ids: vec![1, 2, 3, 4],
            similarity: vec![0.1, 0.5, 0.3, 0.2],
            channels: [
                ch(&[(1, 0.1), (2, 0.5), (3, 0.3), (4, 0.2)]),
                ch(&[(1, 0.8), (3, 0.4), (9, 0.99)]),
                ch(&[(1, 2.0), (4, 1.0)]),
            ],
            matches: Some(Matches::exact(7)),
        };
        let keys = HashMap::from([(1, key("a")), (2, key("a")), (4, key("b"))]);
        let c = collapse(cands, &keys, None);
        assert_eq!(c.ids, vec![2, 3, 4]);
        assert_eq!(c.similarity, vec![0.5, 0.3, 0.2]);
        assert_eq!(
            c.channels[0].values,
            HashMap::from([(2, 0.5), (3, 0.3), (4, 0.2)])
        );
        // Photo 9 is no candidate (below min_score): its words do not count.
        assert_eq!(c.channels[1].values, HashMap::from([(2, 0.8), (3, 0.4)]));
        assert_eq!(c.channels[2].values, HashMap::from([(2, 2.0), (4, 1.0)]));
        assert_eq!(c.matches, Some(Matches::exact(7)));
        // Searching by a photo of "a": the product is left out.
        let again = Candidates {
            ids: vec![1, 2, 3],
            similarity: vec![0.1, 0.5, 0.3],
            channels: [ch(&[]), ch(&[]), ch(&[])],
            matches: None,
        };
        assert_eq!(collapse(again, &keys, Some(&key("a"))).ids, vec![3]);
    }
}
