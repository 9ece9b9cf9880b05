//! Search: images by text, by an uploaded image or by a stored image; captions for an image (annotation).

use axum::{
    Json,
    extract::{Request, State},
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{
    AppState,
    captions::Caption,
    error::{ApiError, ApiResult, ErrorBody},
    extract::{Caller, CollectionPath},
    images::Image,
    upload::{self, Body, Kind, field},
};
use crate::{
    filter::Filter,
    service::{CaptionHit, Channel, ImageHit, KeywordWeight, Query, SearchMode, SearchParams},
};

/// Exactly one of `text`, `image` and `image_id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    /// A sentence, e.g. "a dog running on the beach".
    pub text: Option<String>,
    /// An image file, base64.
    pub image: Option<String>,
    /// An image stored in this collection.
    pub image_id: Option<i64>,
    /// Number of results (1..=max, default 10).
    #[schema(default = 10, minimum = 1)]
    pub k: Option<usize>,
    /// Results to skip first (paging).
    #[schema(default = 0)]
    pub offset: Option<usize>,
    /// Image searches only: a metadata filter (docs/api.md, "Filters"), e.g.
    /// {"price": {"$lt": 50}, "size": {"$in": ["M", "L"]}, "brand.name": "acme"}.
    #[schema(value_type = Option<Object>)]
    pub filter: Option<Value>,
    /// Leave out results below this: in vector mode their `score` (the results are ordered by it, so this
    /// shortens the page; what a score means depends on the bundle's similarity: see `score` in the
    /// results); in keyword and hybrid modes their `similarity`.
    pub min_score: Option<f32>,
    /// Image searches by `text` only: `vector` (the sentence's vector against the photos'), `keyword` (its
    /// words in each image's captions, external id and the collection's `text_fields`, full-text ranked), or
    /// `hybrid` (the channels fused by calibrated scores: the photo, the words by meaning, the words as
    /// keywords). Default: `hybrid` in a collection with `text_fields` or captions, else `vector`.
    pub mode: Option<Mode>,
    /// Hybrid mode: the keyword channel's weight in the fusion, 0..=1 (the photo and the words by meaning
    /// share the rest, the photo 5/8 of it where the collection's own sentences find their photos, less
    /// where they do not: `weights` in the answer). Default 0.2 (0.4 where the photo gets no weight), raised
    /// towards 1 by the share of the sentence's words the text model does not know.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub keyword_weight: Option<f32>,
    /// Hybrid mode: the channels to fuse, any of `vector` (the photo), `text` (the image's captions and
    /// text fields by meaning) and `keyword` (its words as keywords). Default: all three. Implies hybrid.
    pub channels: Option<Vec<ChannelName>>,
    /// Image searches in a collection with a product key (`group_by`): true (the default) returns each
    /// product once, its best photo standing for it, and pages and counts by product; false returns photos
    /// one by one.
    #[schema(default = true)]
    pub group: Option<bool>,
    /// Image searches with a filter: count every image it admits for `matches`, however many. By default the
    /// database index (`--index database`) stops counting at 10,000 or more and says `matches_exact: false`;
    /// the memory index always counts them all.
    #[schema(default = false)]
    pub exact_matches: Option<bool>,
}

/// A channel of hybrid search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChannelName {
    Vector,
    Text,
    Keyword,
}

impl From<ChannelName> for Channel {
    fn from(c: ChannelName) -> Self {
        match c {
            ChannelName::Vector => Channel::Vector,
            ChannelName::Text => Channel::Text,
            ChannelName::Keyword => Channel::Keyword,
        }
    }
}

/// What each channel said of a hybrid or keyword result.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChannelScores {
    /// Hybrid: the photo's score as vector mode ranks it (`similarity`, plus the image's offset under a
    /// bundle with a hubness bank).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vector: Option<f32>,
    /// The similarity of the image's caption or text-field sentence nearest to the sentence, by meaning;
    /// absent when none came near.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<f32>,
    /// The database's text relevance of its words (as `score` in keyword mode); absent when none matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyword: Option<f32>,
}

/// The weights a hybrid search gave its channels (0 for a channel not asked): the photo's follows its trust in
/// the collection, how often the collection's own sentences find their image by the photo alone (docs/api.md).
#[derive(Debug, Serialize, ToSchema)]
pub struct ChannelWeights {
    pub vector: f32,
    pub text: f32,
    pub keyword: f32,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Vector,
    Keyword,
    Hybrid,
}

impl From<Mode> for SearchMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Vector => SearchMode::Vector,
            Mode::Keyword => SearchMode::Keyword,
            Mode::Hybrid => SearchMode::Hybrid,
        }
    }
}

impl From<SearchMode> for Mode {
    fn from(m: SearchMode) -> Self {
        match m {
            SearchMode::Vector => Mode::Vector,
            SearchMode::Keyword => Mode::Keyword,
            SearchMode::Hybrid => Mode::Hybrid,
        }
    }
}

/// multipart/form-data search: the JSON body's fields as form fields (`filter` as JSON text), with the image as
/// an `image` file part instead of base64.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SearchMultipart {
    #[schema(value_type = Option<String>, format = Binary)]
    pub image: Option<Vec<u8>>,
    pub text: Option<String>,
    pub image_id: Option<i64>,
    pub k: Option<usize>,
    pub offset: Option<usize>,
    pub filter: Option<String>,
    pub min_score: Option<f32>,
    pub mode: Option<Mode>,
    pub keyword_weight: Option<f32>,
    /// A JSON array, e.g. ["vector", "text"].
    pub channels: Option<String>,
    pub group: Option<bool>,
    pub exact_matches: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ImageResult {
    /// What the results are ordered by, higher first. Vector mode: `similarity`, except for a sentence query
    /// under a bundle with a hubness bank, where it is `similarity` plus the image's offset (<= 0 for an
    /// image close to many training captions, which demotes images that match many sentences loosely);
    /// comparable within one bundle only. Hybrid mode: the fused score, the weighted sum over the channels of
    /// each one's score standardised over the query's candidates (0 is a candidate of average standing;
    /// comparable within one query only). Keyword mode: the database's text relevance (SQLite: -bm25;
    /// Postgres: ts_rank_cd), comparable within one engine only.
    pub score: f32,
    /// The bundle's similarity of query and image: the cosine (-1..1) for `cosine` bundles, the
    /// order-embedding score -||max(0, c - i)||^2 (<= 0) for `order` ones, the negative squared distance
    /// (<= 0) for `euclidean` ones.
    pub similarity: f32,
    /// Keyword and hybrid modes: what each channel said of this image, so a caller can see why it was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<ChannelScores>,
    /// A search grouped by the collection's product key: the product this image is the best photo of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub product: Option<Product>,
    pub image: Image,
}

/// A product found: its key and its photos.
#[derive(Debug, Serialize, ToSchema)]
pub struct Product {
    /// The value of the collection's `group_by` field (a number or boolean as JSON writes it); absent for an
    /// image without one, which is a product of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The ids of the product's photos in the collection: this result's image first, then the others by id.
    pub photos: Vec<i64>,
}

impl From<ImageHit> for ImageResult {
    fn from(h: ImageHit) -> Self {
        ImageResult {
            score: h.score,
            similarity: h.similarity,
            channels: h.channels.map(|c| ChannelScores {
                vector: c.vector,
                text: c.text,
                keyword: c.keyword,
            }),
            product: h.product.map(|p| Product {
                key: p.key,
                photos: p.photos,
            }),
            image: h.row.into(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ImageResults {
    pub results: Vec<ImageResult>,
    /// With a filter: how many images of the collection it admits (all of them, not only this page); in a
    /// grouped search, how many products. At least this many when `matches_exact` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matches: Option<usize>,
    /// With `matches`: true when every admitted image was counted; false when counting stopped there (the
    /// database index past 10,000 or more, unless the search asked `exact_matches`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matches_exact: Option<bool>,
    /// The mode the search ran in.
    pub mode: Mode,
    /// Hybrid: the keyword channel's share of the fused score, as asked, or by default 0.2 raised towards 1 by
    /// the share of the sentence's words the text model does not know (`unknown_words`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyword_weight: Option<f32>,
    /// Hybrid: every channel's weight in the fusion.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights: Option<ChannelWeights>,
    /// The words of a `text` query the text model does not know (it reads each as "unknown"): the vector
    /// ranking ignores them; keyword and hybrid modes still match them in the images' text.
    pub unknown_words: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CaptionResult {
    /// What the results are ordered by, higher first: `similarity`, except for an image query under a
    /// bundle with an annotation bank (docs/bundle.md, "The annotation side"), where it is `similarity` plus
    /// the caption's offset (<= 0 for a caption close to many training images, which demotes sentences that
    /// match many photos loosely); comparable within one bundle only.
    pub score: f32,
    /// The bundle's similarity of query and caption (cosine, order score or negative squared distance).
    pub similarity: f32,
    pub caption: Caption,
}

impl From<CaptionHit> for CaptionResult {
    fn from(h: CaptionHit) -> Self {
        CaptionResult {
            score: h.score,
            similarity: h.similarity,
            caption: h.row.into(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CaptionResults {
    pub results: Vec<CaptionResult>,
    /// The words of a `text` query the text model does not know (it reads each as "unknown").
    pub unknown_words: Vec<String>,
}

/// The search form: the JSON body's fields, with the image as a file part.
const FORM: &[upload::Field] = &[
    field(&["image"], "image", Kind::File),
    field(&["text"], "text", Kind::Text),
    field(&["image_id"], "image_id", Kind::Json),
    field(&["k"], "k", Kind::Json),
    field(&["offset"], "offset", Kind::Json),
    field(&["filter"], "filter", Kind::Json),
    field(&["min_score"], "min_score", Kind::Json),
    field(&["mode"], "mode", Kind::Text),
    field(&["keyword_weight"], "keyword_weight", Kind::Json),
    field(&["channels"], "channels", Kind::Json),
    field(&["group"], "group", Kind::Json),
    field(&["exact_matches"], "exact_matches", Kind::Json),
];

async fn parse(req: Request) -> ApiResult<(Query, SearchParams)> {
    let (mut r, files) = match upload::read::<SearchRequest, SearchRequest>(req, FORM).await? {
        Body::Json(r) => (r, vec![]),
        Body::Form(r, files) => (r, files),
    };
    let p = params(&r)?;
    let mut files = files.into_iter();
    let q = match (
        r.text.take(),
        r.image.take(),
        r.image_id,
        files.next(),
        files.next(),
    ) {
        (Some(t), None, None, None, None) => Query::Text(t),
        (None, Some(b), None, None, None) => Query::Image(upload::base64_image("image", &b)?),
        (None, None, Some(id), None, None) => Query::ImageId(id),
        (None, None, None, Some(f), None) => Query::Image(f),
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of `text`, `image` (base64 in JSON, one file part in a form) and `image_id`",
            ));
        }
    };
    Ok((q, p))
}

fn params(r: &SearchRequest) -> ApiResult<SearchParams> {
    if r.min_score.is_some_and(|m| !m.is_finite()) {
        return Err(ApiError::invalid("min_score must be a finite number"));
    }
    if r.channels.as_ref().is_some_and(Vec::is_empty) {
        return Err(ApiError::invalid(
            "channels is empty: name at least one of \"vector\", \"text\" and \"keyword\" (or leave it out for all)",
        ));
    }
    Ok(SearchParams {
        mode: r.mode.map(Into::into),
        keyword_weight: r
            .keyword_weight
            .map(KeywordWeight::parse)
            .transpose()
            .map_err(ApiError::invalid)?,
        channels: r
            .channels
            .as_ref()
            .map(|cs| cs.iter().map(|c| (*c).into()).collect()),
        fusion: Default::default(),
        group: r.group.unwrap_or(true),
        exact_matches: r.exact_matches.unwrap_or(false),
        min_score: r.min_score,
        k: r.k.unwrap_or(10),
        offset: r.offset.unwrap_or(0),
        filter: match &r.filter {
            Some(f) => Filter::parse(f)?,
            None => Filter::all(),
        },
    })
}

#[utoipa::path(post, path = "/v1/collections/{collection}/images/search", tag = "search", operation_id = "search_images",
    params(("collection" = String, Path, description = "collection name")),
    request_body(description = "a sentence, an image or a stored image id", content(
        (SearchRequest = "application/json"), (SearchMultipart = "multipart/form-data"))),
    responses((status = 200, body = ImageResults), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn images(
    State(s): State<AppState>,
    CollectionPath(collection): CollectionPath,
    caller: Caller,
    req: Request,
) -> ApiResult<Json<ImageResults>> {
    let (q, p) = parse(req).await?;
    caller.charge_rows(1)?;
    let found = s.service.search_images(&collection, q, p).await?;
    Ok(Json(ImageResults {
        results: found.hits.into_iter().map(Into::into).collect(),
        matches: found.matches.map(|m| m.count),
        matches_exact: found.matches.map(|m| m.exact),
        mode: found.mode.unwrap_or(SearchMode::Vector).into(),
        keyword_weight: found.weights.map(|w| w[2].1),
        weights: found.weights.map(|w| ChannelWeights {
            vector: w[0].1,
            text: w[1].1,
            keyword: w[2].1,
        }),
        unknown_words: found.unknown_words,
    }))
}

#[utoipa::path(post, path = "/v1/collections/{collection}/captions/search", tag = "search", operation_id = "search_captions",
    params(("collection" = String, Path, description = "collection name")),
    request_body(description = "an image (annotation), a stored image id, or a sentence", content(
        (SearchRequest = "application/json"), (SearchMultipart = "multipart/form-data"))),
    responses((status = 200, body = CaptionResults), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn captions(
    State(s): State<AppState>,
    CollectionPath(collection): CollectionPath,
    caller: Caller,
    req: Request,
) -> ApiResult<Json<CaptionResults>> {
    let (q, p) = parse(req).await?;
    caller.charge_rows(1)?;
    let found = s.service.search_captions(&collection, q, p).await?;
    Ok(Json(CaptionResults {
        results: found.hits.into_iter().map(Into::into).collect(),
        unknown_words: found.unknown_words,
    }))
}
