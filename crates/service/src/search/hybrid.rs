//! Keyword and hybrid image search for a sentence. Hybrid asks three channels: the photo (the sentence's
//! vector against the images', from the index as in vector mode), the words by meaning (against the vectors of
//! each image's captions and text-field sentences: `items::fields`), and the words as keywords (the database's
//! full-text index over captions, external id and text fields: the store's keywords.rs). Each channel's scores
//! are standardised over the query's candidates and summed by weight (`fusion`), so a product word the text
//! model has never seen ("espadrille", "sku-4411") still finds its product, a paraphrase with no word in
//! common finds it by meaning, and a channel sure of its answer counts for more than one that is not.

use std::collections::HashMap;

use crate::{
    CollectionRef, Result, Service, ServiceError,
    search::{
        Matches, Query, QueryVector, Ranked, SearchMode, SearchParams,
        fusion::{Channel, ChannelScores, ChannelValues, KeywordWeight, fuse},
        groups,
    },
};
use crate::{modality::Modality, store::KeywordQuery};

/// The channels' shares of the fused score when the photo is fully trusted and the text model knows every
/// word of the sentence: the best weighting on a 0.1 grid of Flickr8k's dev split (vector 0.5, text 0.3,
/// keyword 0.2: R@1 54.45 against 46.95 for the best channel alone; docs/results.md, "Products and their
/// words").
const PHOTO_SHARE: f32 = 0.5;
const KEYWORD_SHARE: f32 = 0.2;

/// The weights of a hybrid search's channels. The photo gets `PHOTO_SHARE` times its trust in the collection
/// (`search::trust`), the words the rest, text and keywords in their tuned proportion. The keyword channel's
/// is then as asked, or by default raised towards 1 as far as the sentence's vector is blind (a sentence all
/// of whose words the text model does not know has a vector that says nothing, and ranks by its words alone);
/// the photo and the words by meaning share what is left in their proportion.
pub(super) fn weights(p: &SearchParams, qv: &QueryVector, photo_trust: f32) -> [(Channel, f32); 3] {
    let unknown = qv.unknown_share.clamp(0.0, 1.0);
    let photo = PHOTO_SHARE * photo_trust.clamp(0.0, 1.0);
    let words = 1.0 - photo;
    let keyword = words * KEYWORD_SHARE / (1.0 - PHOTO_SHARE);
    let text = words - keyword;
    let kw = p
        .keyword_weight
        .map_or(keyword + (1.0 - keyword) * unknown, KeywordWeight::get);
    let vector_share = photo / (photo + text);
    let mut w = [
        (Channel::Vector, (1.0 - kw) * vector_share),
        (Channel::Text, (1.0 - kw) * (1.0 - vector_share)),
        (Channel::Keyword, kw),
    ];
    for (c, x) in &mut w {
        if !p.asks(*c) {
            *x = 0.0;
        }
    }
    // The channels asked share the whole weight; when all of theirs is 0 (the vector channels alone asked
    // for a sentence the model does not know), they share it equally, as asked.
    let total: f32 = w.iter().map(|(_, x)| x).sum();
    let n = w.iter().filter(|(c, _)| p.asks(*c)).count() as f32;
    for (c, x) in &mut w {
        *x = if total > 0.0 {
            *x / total
        } else if p.asks(*c) {
            1.0 / n
        } else {
            0.0
        };
    }
    w
}

/// A keyword or hybrid page: the ranked images, how many the filter admits, and each one's channel scores.
pub(super) type Fused = (Vec<Ranked>, Option<Matches>, HashMap<i64, ChannelValues>);

/// A sentence search's candidates (ascending ids), their vector similarity (in the same order), and the
/// channels' views of them: vector (score as vector mode ranks), text (nearest sentence's similarity),
/// keyword (relevance), in `Channel::ALL` order.
pub struct Candidates {
    pub ids: Vec<i64>,
    pub similarity: Vec<f32>,
    pub channels: [ChannelScores; 3],
    pub matches: Option<Matches>,
}

/// The page `p` asks for of candidates ranked by `scores` (ties by similarity, then id), with their channels'
/// values.
fn page(
    ids: Vec<i64>,
    scores: Vec<f32>,
    similarity: Vec<f32>,
    channels: [ChannelScores; 3],
    mode: SearchMode,
    p: &SearchParams,
    matches: Option<Matches>,
) -> Fused {
    let mut ranked: Vec<Ranked> = ids
        .into_iter()
        .zip(scores)
        .zip(similarity)
        .map(|((id, s), sim)| (id, s, sim))
        .collect();
    ranked.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then(b.2.total_cmp(&a.2))
            .then(a.0.cmp(&b.0))
    });
    let page: Vec<Ranked> = ranked.into_iter().skip(p.offset).take(p.k).collect();
    let [vector, text, keyword] = &channels;
    let values = page
        .iter()
        .map(|(id, _, _)| {
            let v = ChannelValues {
                vector: (mode == SearchMode::Hybrid)
                    .then(|| vector.values.get(id).copied())
                    .flatten(),
                text: text.values.get(id).copied(),
                keyword: keyword.values.get(id).copied(),
            };
            (*id, v)
        })
        .collect();
    (page, matches, values)
}

impl Service {
    /// The mode a search runs in: as asked (keyword and hybrid need a sentence; channels mean hybrid), or by
    /// default hybrid for a sentence in a collection with words to match (`text_fields`, or captions), vector
    /// otherwise.
    pub(crate) async fn resolve_mode(
        &self,
        c: &CollectionRef,
        q: &Query,
        p: &SearchParams,
    ) -> Result<SearchMode> {
        let asked = match (p.mode, &p.channels) {
            (Some(SearchMode::Hybrid) | None, Some(_)) => Some(SearchMode::Hybrid),
            (Some(m), Some(_)) => {
                return Err(ServiceError::Invalid(format!(
                    "`channels` choose what hybrid mode fuses; mode \"{}\" has one channel (leave out \
                     `mode`, or set it to \"hybrid\")",
                    m.as_str()
                )));
            }
            (m, None) => m,
        };
        match (asked, q) {
            (Some(SearchMode::Vector), _) => Ok(SearchMode::Vector),
            (Some(m), Query::Text(_)) => Ok(m),
            (Some(m), _) => Err(ServiceError::Invalid(format!(
                "mode \"{}\" needs a `text` query: keyword search ranks images by the words of a sentence",
                m.as_str()
            ))),
            (None, Query::Text(_)) if c.text_fields.is_some() || self.has_captions(c)? => {
                Ok(SearchMode::Hybrid)
            }
            (None, _) => Ok(SearchMode::Vector),
        }
    }

    /// Whether the collection holds captions: from the caption index where it is in memory, else as the
    /// database said when the request resolved the collection.
    fn has_captions(&self, c: &CollectionRef) -> Result<bool> {
        Ok(match self.memory_indexes(c.id)? {
            Some(idx) => !idx.captions.is_empty(),
            None => c.has_captions,
        })
    }

    /// The page of a keyword or hybrid search, ranked by the fused score (keyword: the engine's relevance),
    /// each hit with its vector similarity and its channels' scores; and how many images the filter admits.
    pub(crate) async fn fused(
        &self,
        c: &CollectionRef,
        qv: &QueryVector,
        text: &str,
        mode: SearchMode,
        weights: &[(Channel, f32); 3],
        p: &SearchParams,
    ) -> Result<Fused> {
        // A filter's images are reached by the photo's filtered walk even where the photo weighs nothing (a
        // collection that does not trust it): the words by meaning read sentences unfiltered and may reach none
        // of the few images a filter admits.
        let on = |ch: Channel| {
            mode == SearchMode::Hybrid
                && (weights.iter().any(|(c, w)| *c == ch && *w > 0.0)
                    || (ch == Channel::Vector && p.asks(ch) && !p.filter.is_all()))
        };
        let mut cands = self
            .candidates(c, qv, text, mode == SearchMode::Keyword, on, p)
            .await?;
        if let Some(path) = groups::grouping(c, p) {
            let keys = self.group_keys(c, path, &cands.ids).await?;
            cands = groups::collapse(cands, &keys, None);
            cands.matches = self.count_products(c, path, &p.filter).await?;
        }
        let mut channels = cands.channels;
        let scores: Vec<f32> = if mode == SearchMode::Keyword {
            cands.ids.iter().map(|id| channels[2].values[id]).collect()
        } else {
            for (ch, (_, w)) in channels.iter_mut().zip(weights) {
                ch.weight = *w;
            }
            fuse(&cands.ids, &channels, p.fusion)
        };
        Ok(page(
            cands.ids,
            scores,
            cands.similarity,
            channels,
            mode,
            p,
            cands.matches,
        ))
    }

    /// A sentence's candidates in a collection and what each channel says of them, all three channels asked
    /// (their weights 0): what `eval --hybrid` fuses under other weights and methods.
    pub async fn channel_scores(
        &self,
        collection: &crate::CollectionName,
        text: &str,
    ) -> Result<Candidates> {
        let c = self.collection_ref(collection).await?;
        let qv = self.query_vector(&c, Query::Text(text.to_string())).await?;
        let p = SearchParams::page(10, 0);
        self.candidates(&c, &qv, text, false, |_| true, &p).await
    }

    /// Every image a channel reached, each with its vector similarity, and the channels' views of them.
    async fn candidates(
        &self,
        c: &CollectionRef,
        qv: &QueryVector,
        text: &str,
        keyword_mode: bool,
        on: impl Fn(Channel) -> bool,
        p: &SearchParams,
    ) -> Result<Candidates> {
        // Deep enough that a result ranked low by one side and high by another is seen by both.
        let depth = ((p.offset + p.k) * 2).clamp(100, self.opts.max_k.max(100));
        let keyword = if keyword_mode || on(Channel::Keyword) {
            let query = KeywordQuery::parse(text);
            self.timed_db(
                "keyword_search",
                self.store.keyword_search(c.id, &query, &p.filter, depth),
            )
            .await?
        } else {
            vec![]
        };
        let deep = SearchParams {
            k: depth,
            offset: 0,
            min_score: None,
            ..p.clone()
        };
        let (vector, matches) = if on(Channel::Vector) {
            self.search_ids(c, Modality::Images, qv, &deep).await?
        } else {
            (vec![], self.matches(c, p).await?)
        };
        let words = if on(Channel::Text) {
            self.text_channel(c, qv, &deep).await?
        } else {
            vec![]
        };
        let others = keyword.iter().map(|h| h.0).chain(words.iter().map(|h| h.0));
        let vec_of = self.vector_side(c, qv, &vector, others).await?;
        // An image this server's index does not hold yet (just written on another replica) waits for the
        // follower; one below `min_score` is left out.
        let mut ids: Vec<i64> = vec_of
            .iter()
            .filter(|(_, (_, sim))| p.min_score.is_none_or(|m| *sim >= m))
            .map(|(i, _)| *i)
            .collect();
        ids.sort_unstable();
        let floor = words.iter().map(|h| h.1).fold(f32::INFINITY, f32::min);
        Ok(Candidates {
            similarity: ids.iter().map(|id| vec_of[id].1).collect(),
            channels: [
                ChannelScores {
                    weight: 0.0,
                    values: ids.iter().map(|id| (*id, vec_of[id].0)).collect(),
                    floor: 0.0,
                },
                ChannelScores {
                    weight: 0.0,
                    // An image none of whose sentences came near ranks at most as the farthest that did.
                    values: words.into_iter().collect(),
                    floor,
                },
                ChannelScores {
                    weight: 0.0,
                    values: keyword.into_iter().collect(),
                    floor: 0.0,
                },
            ],
            ids,
            matches,
        })
    }

    /// How many images the filter admits (None without one), for a page the vector side did not rank.
    async fn matches(&self, c: &CollectionRef, p: &SearchParams) -> Result<Option<Matches>> {
        if p.filter.is_all() {
            return Ok(None);
        }
        Ok(Some(
            self.count_matches(c.id, &p.filter, p.exact_matches).await?,
        ))
    }

    /// The words by meaning: images ranked by the nearest of their captions and text-field sentences to the
    /// sentence (the caption index, deep enough for a few sentences an image), under the filter; a field's
    /// sentence counts its similarity times the field's weight (a written caption's, once).
    async fn text_channel(
        &self,
        c: &CollectionRef,
        qv: &QueryVector,
        deep: &SearchParams,
    ) -> Result<Vec<(i64, f32)>> {
        let sentences = SearchParams {
            k: self.sentence_depth(c, deep.k).await?,
            filter: crate::filter::Filter::all(),
            ..deep.clone()
        };
        let (near, _) = self
            .search_ids(c, Modality::Captions, qv, &sentences)
            .await?;
        let ids: Vec<i64> = near.iter().map(|h| h.0).collect();
        let rows = self
            .timed_db("fetch_sentences", self.store.captions_by_ids(c.id, &ids))
            .await?;
        let weight_of = |field: Option<&str>| {
            c.text_fields
                .iter()
                .flatten()
                .find(|f| Some(f.path.as_str()) == field)
                .map_or(1.0, |f| f.weight)
        };
        let image_of: HashMap<i64, (i64, f32)> = rows
            .iter()
            .filter_map(|r| {
                r.image_id
                    .map(|i| (r.id, (i, weight_of(r.field.as_deref()))))
            })
            .collect();
        let mut best: HashMap<i64, f32> = HashMap::new();
        for (cid, _, sim) in &near {
            if let Some((img, w)) = image_of.get(cid) {
                let b = best.entry(*img).or_insert(f32::NEG_INFINITY);
                *b = b.max(sim * w);
            }
        }
        if !deep.filter.is_all() {
            let images: Vec<i64> = best.keys().copied().collect();
            let allowed = self.admitted_among(c.id, &deep.filter, &images).await?;
            best.retain(|id, _| allowed.contains(id));
        }
        let mut out: Vec<(i64, f32)> = best.into_iter().collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(out)
    }

    /// How many sentences the text channel reads to reach about `images` images: as many times more as the
    /// collection holds sentences an image (captions and text-field sentences), from 1 to 3. Each sentence
    /// walked past the first `images` widens the walk (`ef_search` is at least k): a titled collection read
    /// three a product spent two thirds of the text channel's walk on images it never reached.
    async fn sentence_depth(&self, c: &CollectionRef, images: usize) -> Result<usize> {
        let (sentences, photos) = match self.memory_indexes(c.id)? {
            Some(idx) => (idx.captions.len(), idx.images.len()),
            None => (
                self.collection_size(c.id, Modality::Captions).await?,
                self.collection_size(c.id, Modality::Images).await?,
            ),
        };
        let per_image = (sentences as f64 / photos.max(1) as f64).clamp(1.0, 3.0);
        Ok((images as f64 * per_image).ceil() as usize)
    }

    /// The vector side's score and similarity of each candidate: those it did not reach (among `others`,
    /// the other channels' candidates) read from the index's vectors, or under --index database from their
    /// rows (one read for all of them).
    async fn vector_side(
        &self,
        c: &CollectionRef,
        qv: &QueryVector,
        vector: &[Ranked],
        others: impl Iterator<Item = i64>,
    ) -> Result<HashMap<i64, (f32, f32)>> {
        let mut vec_of: HashMap<i64, (f32, f32)> =
            vector.iter().map(|(i, s, sim)| (*i, (*s, *sim))).collect();
        let mut missing: Vec<i64> = others.filter(|id| !vec_of.contains_key(id)).collect();
        missing.sort_unstable();
        missing.dedup();
        vec_of.extend(self.vector_scores(c, qv, &missing).await?);
        Ok(vec_of)
    }

    /// The vector channel's (score, similarity) of images it did not rank: from the index's vectors and
    /// offsets, or under --index database from their rows (one read for all of them).
    async fn vector_scores(
        &self,
        c: &CollectionRef,
        qv: &QueryVector,
        ids: &[i64],
    ) -> Result<Vec<(i64, (f32, f32))>> {
        let score = self.score(qv.modality, Modality::Images);
        let with_offset = |sim: f32, offset: f32| {
            let s = if score.uses_offsets() {
                sim + offset
            } else {
                sim
            };
            (s, sim)
        };
        Ok(match self.memory_indexes(c.id)? {
            Some(idx) => ids
                .iter()
                .filter_map(|id| {
                    let v = idx.images.vector(*id)?;
                    Some((
                        *id,
                        with_offset(score.eval(&qv.vector, &v), idx.images.offset(*id)),
                    ))
                })
                .collect(),
            None => self
                .store
                .vectors_by_ids(c.id, Modality::Images, ids)
                .await?
                .into_iter()
                .map(|s| {
                    (
                        s.id,
                        with_offset(score.eval(&qv.vector, &s.vector), s.offset),
                    )
                })
                .collect(),
        })
    }
}
