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
    extract::CollectionPath,
    images::Image,
    upload::{self, Body},
};
use crate::{
    filter::Filter,
    service::{Query, SearchParams},
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
}

/// multipart/form-data search: an `image` file part, optional `k`, `offset` and `filter` (JSON) parts.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SearchMultipart {
    #[schema(value_type = String, format = Binary)]
    pub image: Vec<u8>,
    pub k: Option<usize>,
    pub offset: Option<usize>,
    pub filter: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ImageResult {
    /// Higher is more similar: cosine similarity, the order-embedding score (<= 0), or under a euclidean
    /// bundle the negative squared distance (<= 0). For a sentence query
    /// under a bundle with a hubness bank, the cosine plus the image's offset (<= 0 for an image close to many
    /// training captions), which demotes images that match many sentences loosely.
    pub score: f32,
    pub image: Image,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ImageResults {
    pub results: Vec<ImageResult>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CaptionResult {
    pub score: f32,
    pub caption: Caption,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CaptionResults {
    pub results: Vec<CaptionResult>,
}

async fn parse(req: Request) -> ApiResult<(Query, SearchParams)> {
    let mut r = match upload::read::<SearchRequest>(req).await? {
        Body::Json(r) => r,
        Body::Multipart(parts) => {
            let mut r = SearchRequest {
                text: None,
                image: None,
                image_id: None,
                k: None,
                offset: None,
                filter: None,
            };
            let mut file = None;
            for p in parts {
                let num = |p: &upload::Part| -> ApiResult<usize> {
                    p.text()?.trim().parse().map_err(|_| {
                        ApiError::bad_request(format!(
                            "form field \"{}\" must be a whole number",
                            p.name
                        ))
                    })
                };
                match p.name.as_str() {
                    "image" => file = Some(p.data),
                    "text" => r.text = Some(p.text()?.to_string()),
                    "k" => r.k = Some(num(&p)?),
                    "offset" => r.offset = Some(num(&p)?),
                    "filter" => r.filter = Some(upload::json_field(&p)?),
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "unknown form field \"{other}\"; expected image, k, offset or filter"
                        )));
                    }
                }
            }
            let q = match (file, r.text.take()) {
                (Some(f), None) => Query::Image(f),
                (None, Some(t)) => Query::Text(t),
                _ => {
                    return Err(ApiError::bad_request(
                        "send exactly one `image` file part (or a `text` field)",
                    ));
                }
            };
            return Ok((q, params(&r)?));
        }
    };
    let p = params(&r)?;
    let q = match (r.text.take(), r.image.take(), r.image_id) {
        (Some(t), None, None) => Query::Text(t),
        (None, Some(b), None) => Query::Image(upload::base64_image("image", &b)?),
        (None, None, Some(id)) => Query::ImageId(id),
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of `text`, `image` (base64) and `image_id`",
            ));
        }
    };
    Ok((q, p))
}

fn params(r: &SearchRequest) -> ApiResult<SearchParams> {
    Ok(SearchParams {
        k: r.k.unwrap_or(10),
        offset: r.offset.unwrap_or(0),
        filter: match &r.filter {
            Some(f) => Filter::parse(f)?,
            None => Filter::all(),
        },
    })
}

#[utoipa::path(post, path = "/v1/collections/{collection}/images/search", tag = "search",
    params(("collection" = String, Path, description = "collection name")),
    request_body(description = "a sentence, an image or a stored image id", content(
        (SearchRequest = "application/json"), (SearchMultipart = "multipart/form-data"))),
    responses((status = 200, body = ImageResults), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn images(
    State(s): State<AppState>,
    CollectionPath(collection): CollectionPath,
    req: Request,
) -> ApiResult<Json<ImageResults>> {
    let (q, p) = parse(req).await?;
    let hits = s.service.search_images(&collection, q, p).await?;
    Ok(Json(ImageResults {
        results: hits
            .into_iter()
            .map(|h| ImageResult {
                score: h.score,
                image: h.image.into(),
            })
            .collect(),
    }))
}

#[utoipa::path(post, path = "/v1/collections/{collection}/captions/search", tag = "search",
    params(("collection" = String, Path, description = "collection name")),
    request_body(description = "an image (annotation), a stored image id, or a sentence", content(
        (SearchRequest = "application/json"), (SearchMultipart = "multipart/form-data"))),
    responses((status = 200, body = CaptionResults), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn captions(
    State(s): State<AppState>,
    CollectionPath(collection): CollectionPath,
    req: Request,
) -> ApiResult<Json<CaptionResults>> {
    let (q, p) = parse(req).await?;
    let hits = s.service.search_captions(&collection, q, p).await?;
    Ok(Json(CaptionResults {
        results: hits
            .into_iter()
            .map(|h| CaptionResult {
                score: h.score,
                caption: h.caption.into(),
            })
            .collect(),
    }))
}
