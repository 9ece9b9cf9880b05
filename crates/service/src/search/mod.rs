//! Search: a query (sentence, photo, or stored photo) becomes a vector, the collection's index of the
//! target modality ranks its points, and the hits come back with their rows. One path for both targets;
//! `hybrid` adds the keyword ranking and fuses the two. The index is searched where it lives (the service's
//! `index_backend` decides): `graphs` (this process's HNSW graphs) or `database` (pgvector in Postgres).

pub(crate) mod database;
pub mod fusion;
mod graphs;
mod groups;
mod hybrid;
pub(crate) mod trust;

pub use groups::Product;
pub use hybrid::Candidates;

use std::{collections::HashMap, sync::Arc};

use bytes::Bytes;

use super::{CollectionName, CollectionRef, Result, Service, ServiceError};
use crate::{
    filter::Filter,
    index::Score,
    modality::Modality,
    pipeline::ImageUse,
    store::{CaptionRow, ImageRow, Store, StoreError},
};

/// A search query: a sentence, an uploaded image, or an image already stored in the collection.
pub enum Query {
    Text(String),
    Image(Bytes),
    ImageId(i64),
}

/// How a sentence finds images: by its vector, by its words in the images' text, or both fused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchMode {
    Vector,
    Keyword,
    Hybrid,
}

impl SearchMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SearchMode::Vector => "vector",
            SearchMode::Keyword => "keyword",
            SearchMode::Hybrid => "hybrid",
        }
    }
}

#[derive(Clone)]
pub struct SearchParams {
    pub k: usize,
    pub offset: usize,
    pub filter: Filter,
    /// Leave out results whose `score` (vector mode) or `similarity` (keyword and hybrid) is below this.
    pub min_score: Option<f32>,
    /// None: hybrid for a sentence on images in a collection that asked for keyword search, else vector.
    pub mode: Option<SearchMode>,
    /// Hybrid: the keyword channel's share of the fused score (by default `hybrid::weights`' own).
    pub keyword_weight: Option<fusion::KeywordWeight>,
    /// Hybrid: the channels fused (None: all of them).
    pub channels: Option<Vec<fusion::Channel>>,
    /// Hybrid: how the channels' scores are combined.
    pub fusion: fusion::Fusion,
    /// Image searches in a collection with a product key (`group_by`): each product once (`groups`).
    pub group: bool,
    /// Count every image a filter admits, however many (else the database index may stop at a bound).
    pub exact_matches: bool,
}

impl SearchParams {
    /// Whether a hybrid search asks for the channel (every channel when it names none).
    pub(crate) fn asks(&self, channel: fusion::Channel) -> bool {
        self.channels
            .as_ref()
            .is_none_or(|cs| cs.contains(&channel))
    }

    /// k results from `offset`, nothing else asked.
    pub fn page(k: usize, offset: usize) -> SearchParams {
        SearchParams {
            k,
            offset,
            filter: Filter::all(),
            min_score: None,
            mode: None,
            keyword_weight: None,
            channels: None,
            fusion: fusion::Fusion::default(),
            group: true,
            exact_matches: false,
        }
    }
}

/// How many images a filter admits: counted exactly, or (`exact` false) at least `count`, where counting them
/// all would cost more than the search (the database index stops at `MATCHES_COUNTED_TO`, or where the scan or
/// walk choice is settled, unless the search asks for the exact count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matches {
    pub count: usize,
    pub exact: bool,
}

impl Matches {
    pub fn exact(count: usize) -> Matches {
        Matches { count, exact: true }
    }
}

/// One page of results, how many images the filter admits (a filtered image search only), the mode an
/// image search ran in, and the words of a sentence query the text model does not know.
pub struct Hits<H> {
    pub hits: Vec<H>,
    pub matches: Option<Matches>,
    pub mode: Option<SearchMode>,
    /// Hybrid: the channels' weights this search used (the keyword channel's is `keyword_weight`).
    pub weights: Option<[(fusion::Channel, f32); 3]>,
    pub unknown_words: Vec<String>,
}

/// A found row. `score` orders the results; `similarity` is the bundle's similarity alone: the same,
/// except for a query from the other modality on points with hubness offsets, where `score` adds the
/// point's offset.
pub struct Scored<R> {
    pub score: f32,
    pub similarity: f32,
    /// Keyword and hybrid searches: what each channel said of it.
    pub channels: Option<fusion::ChannelValues>,
    /// A grouped image search: the product the row is the best photo of.
    pub product: Option<Product>,
    pub row: R,
}

pub type ImageHit = Scored<ImageRow>;
pub type CaptionHit = Scored<CaptionRow>;

/// A ranked point: (id, score, similarity).
pub(super) type Ranked = (i64, f32, f32);

/// A query turned into what the index needs.
pub(super) struct QueryVector {
    pub vector: Vec<f32>,
    pub modality: Modality,
    /// A stored image used as the query: left out of image results.
    pub exclude: Option<i64>,
    /// A sentence's words the text model does not know (read in the same pass as its tokens).
    pub unknown_words: Vec<String>,
    /// The share of its tokens they are (0 for an image).
    pub unknown_share: f32,
}

impl Service {
    fn check_window(&self, p: &SearchParams) -> Result<()> {
        if p.k == 0 || p.k > self.opts.max_k {
            return Err(ServiceError::Invalid(format!(
                "k is {}; it must be between 1 and {}",
                p.k, self.opts.max_k
            )));
        }
        if p.offset > 10 * self.opts.max_k {
            return Err(ServiceError::Invalid(format!(
                "offset is {}; the largest offset is {}",
                p.offset,
                10 * self.opts.max_k
            )));
        }
        Ok(())
    }

    async fn query_vector(&self, c: &CollectionRef, q: Query) -> Result<QueryVector> {
        Ok(match q {
            Query::Text(t) => {
                let sentence = self
                    .pipeline
                    .sentence(&t)
                    .map_err(|source| ServiceError::Text {
                        index: None,
                        source,
                    })?;
                QueryVector {
                    vector: self.embed_tokens(vec![sentence.ids]).await?.remove(0),
                    modality: Modality::Captions,
                    exclude: None,
                    unknown_words: sentence.unknown_words,
                    unknown_share: sentence.unknown_share,
                }
            }
            Query::Image(b) => QueryVector {
                vector: self
                    .embed_images(vec![b], ImageUse::Query)
                    .await?
                    .remove(0)
                    .vector,
                modality: Modality::Images,
                exclude: None,
                unknown_words: vec![],
                unknown_share: 0.0,
            },
            Query::ImageId(id) => {
                let held = match self.memory_indexes(c.id)? {
                    Some(idx) => idx.images.vector(id),
                    None => None,
                };
                let vector = match held {
                    Some(v) => v.to_vec(),
                    None => self.store.image_vector(c.id, id).await?,
                };
                QueryVector {
                    vector,
                    modality: Modality::Images,
                    exclude: Some(id),
                    unknown_words: vec![],
                    unknown_share: 0.0,
                }
            }
        })
    }

    /// How a query of modality `qm` scores stored items of `target` under the loaded bundle.
    pub(super) fn score(&self, qm: Modality, target: Modality) -> Score {
        Score::new(
            self.pipeline.similarity(),
            qm,
            target,
            self.pipeline.bundle.offsets_bank(target).is_some(),
        )
    }

    pub async fn search_images(
        self: &Arc<Self>,
        collection: &CollectionName,
        q: Query,
        p: SearchParams,
    ) -> Result<Hits<ImageHit>> {
        let t = std::time::Instant::now();
        self.check_window(&p)?;
        let c = self.collection_ref(collection).await?;
        let mode = self.resolve_mode(&c, &q, &p).await?;
        let text = match &q {
            Query::Text(t) => Some(t.clone()),
            _ => None,
        };
        let qv = self.query_vector(&c, q).await?;
        // Only a hybrid sentence search that asks the photo weighs it by its trust in the collection.
        let trust =
            if mode == SearchMode::Hybrid && text.is_some() && p.asks(fusion::Channel::Vector) {
                self.photo_trust(&c).await?
            } else {
                1.0
            };
        let weights = hybrid::weights(&p, &qv, trust);
        let group = groups::grouping(&c, &p);
        let (found, channels) = match (mode, text, group) {
            (SearchMode::Keyword | SearchMode::Hybrid, Some(text), _) => {
                let (page, matches, channels) =
                    self.fused(&c, &qv, &text, mode, &weights, &p).await?;
                ((page, matches), Some(channels))
            }
            (_, _, Some(path)) => (self.grouped_ids(&c, path, &qv, &p).await?, None),
            _ => (self.search_ids(&c, Modality::Images, &qv, &p).await?, None),
        };
        let mut hits: Hits<ImageHit> = self.answer(t, &c, found, Some(mode), qv).await?;
        if let Some(mut channels) = channels {
            for h in &mut hits.hits {
                h.channels = channels.remove(&h.row.id);
            }
        }
        if let Some(path) = group {
            let ids: Vec<i64> = hits.hits.iter().map(|h| h.row.id).collect();
            let products = self.products(&c, path, &ids).await?;
            for (h, product) in hits.hits.iter_mut().zip(products) {
                h.product = Some(product);
            }
        }
        hits.weights = (mode == SearchMode::Hybrid).then_some(weights);
        Ok(hits)
    }

    pub async fn search_captions(
        &self,
        collection: &CollectionName,
        q: Query,
        p: SearchParams,
    ) -> Result<Hits<CaptionHit>> {
        let t = std::time::Instant::now();
        self.check_window(&p)?;
        if !p.filter.is_all() {
            return Err(ServiceError::Invalid(
                "filters apply to image metadata; caption search takes none".into(),
            ));
        }
        if p.channels.is_some() {
            return Err(ServiceError::Invalid(
                "channels choose what an image search fuses; caption search is by vector".into(),
            ));
        }
        if p.mode.is_some_and(|m| m != SearchMode::Vector) {
            return Err(ServiceError::Invalid(
                "keyword and hybrid modes search images; caption search is by vector".into(),
            ));
        }
        let c = self.collection_ref(collection).await?;
        let qv = self.query_vector(&c, q).await?;
        let found = self.search_ids(&c, Modality::Captions, &qv, &p).await?;
        self.answer(t, &c, found, None, qv).await
    }

    /// The page: the ranked points' rows fetched and joined in rank order, the search's time observed.
    async fn answer<R: Found>(
        &self,
        t: std::time::Instant,
        c: &CollectionRef,
        (hits, matches): (Vec<Ranked>, Option<Matches>),
        mode: Option<SearchMode>,
        qv: QueryVector,
    ) -> Result<Hits<Scored<R>>> {
        let ids: Vec<i64> = hits.iter().map(|h| h.0).collect();
        let rows = self
            .timed_db("fetch_hits", R::fetch(&self.store, c.id, &ids))
            .await?;
        self.metrics.observe_search(R::WHAT, t.elapsed());
        Ok(Hits {
            hits: join(hits, rows),
            matches,
            mode,
            weights: None,
            unknown_words: qv.unknown_words,
        })
    }
}

type Rows<R> = std::result::Result<Vec<R>, StoreError>;

/// A kind of row a search finds.
trait Found: Sized {
    /// The metrics' label.
    const WHAT: &'static str;
    fn id(&self) -> i64;
    fn fetch(
        store: &Store,
        collection: i64,
        ids: &[i64],
    ) -> impl Future<Output = Rows<Self>> + Send;
}

/// Images and captions: their label and the store's fetch by ids.
macro_rules! found {
    ($row:ty, $what:literal, $fetch:ident) => {
        impl Found for $row {
            const WHAT: &'static str = $what;
            fn id(&self) -> i64 {
                self.id
            }
            fn fetch(
                store: &Store,
                collection: i64,
                ids: &[i64],
            ) -> impl Future<Output = Rows<Self>> + Send {
                store.$fetch(collection, ids)
            }
        }
    };
}
found!(ImageRow, "images", images_by_ids);
found!(CaptionRow, "captions", captions_by_ids);

/// Hits in rank order with their rows; an id deleted between the index read and the row fetch drops out.
fn join<R: Found>(hits: Vec<Ranked>, rows: Vec<R>) -> Vec<Scored<R>> {
    let mut rows: HashMap<i64, R> = rows.into_iter().map(|r| (r.id(), r)).collect();
    hits.into_iter()
        .filter_map(|(i, score, similarity)| {
            let row = rows.remove(&i)?;
            Some(Scored {
                score,
                similarity,
                channels: None,
                product: None,
                row,
            })
        })
        .collect()
}
