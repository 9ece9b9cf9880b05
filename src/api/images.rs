//! /v1/collections/{collection}/images

use axum::{
    Json,
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};

use super::{
    AppState,
    captions::Caption,
    error::{self, ApiError, ApiResult, ErrorBody},
    extract::{ApiQuery, Caller, CollectionPath, ItemPath, page},
    upload::{self, Body, Kind, field},
};
use crate::{
    filter::Filter,
    service::{ImageInput, ImageItem, ImageRow, ImageSource},
};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewImageJson {
    /// The image file (JPEG, PNG, WebP, GIF, BMP), base64 (a `data:` URL is accepted too). Give `data` or
    /// `url`, not both.
    pub data: Option<String>,
    /// An http(s) URL the server fetches the image from, on servers started with `--url-ingest` (docs/api.md,
    /// "URL ingest"). Addresses the server alone can reach (loopback, private, link-local) are refused.
    pub url: Option<String>,
    /// Your id for the image, unique in the collection.
    pub external_id: Option<String>,
    /// A JSON object (nested objects allowed); searches and lists filter on it (docs/api.md, "Filters").
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// Captions to add with the image.
    #[serde(default)]
    pub captions: Vec<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddImagesJson {
    pub images: Vec<NewImageJson>,
    /// For images given by URL: when one cannot be fetched or decoded, store none and answer with its error.
    /// By default the others are stored and the failures listed in `errors`. Images given as `data` always
    /// fail the whole request.
    #[serde(default)]
    pub all_or_nothing: bool,
}

/// Per-file fields of a multipart batch, in file order (the `items` form field).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemFields {
    pub external_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub captions: Vec<String>,
}

/// multipart/form-data upload: one or more `image` file parts; for one image, optional `external_id`,
/// `metadata` (JSON object) and `caption` (repeatable) parts; for several, an `items` part (JSON array).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct AddImagesMultipart {
    #[schema(value_type = Vec<String>, format = Binary)]
    pub image: Vec<Vec<u8>>,
    pub external_id: Option<String>,
    pub metadata: Option<String>,
    pub caption: Option<Vec<String>>,
    pub items: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AddedImage {
    /// The image's position in the request (0-based).
    pub index: usize,
    pub id: i64,
    pub external_id: Option<String>,
    pub width: u32,
    pub height: u32,
    pub caption_ids: Vec<i64>,
}

/// An image given by URL that was not added (the others were).
#[derive(Debug, Serialize, ToSchema)]
pub struct ItemError {
    /// The image's position in the request (0-based).
    pub index: usize,
    pub url: String,
    /// As in ErrorBody: `url_forbidden`, `url_timeout`, `url_too_large`, `url_not_image`, `invalid_image`, ...
    pub code: String,
    pub message: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AddedImages {
    pub images: Vec<AddedImage>,
    /// Images given by URL that could not be added; present only when some failed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ItemError>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Image {
    pub id: i64,
    pub external_id: Option<String>,
    #[schema(value_type = Object)]
    pub metadata: Value,
    pub width: i64,
    pub height: i64,
    /// The bundle whose W produced the stored vector.
    pub bundle_id: String,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captions: Option<Vec<Caption>>,
}

impl From<ImageRow> for Image {
    fn from(r: ImageRow) -> Self {
        Image {
            id: r.id,
            external_id: r.external_id,
            metadata: r.metadata,
            width: r.width,
            height: r.height,
            bundle_id: r.bundle_id,
            created_at: r.created_at,
            captions: None,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ImageList {
    pub images: Vec<Image>,
    /// How many images match (the filter, or the external id) in all, not only on this page.
    pub total: i64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListImagesQuery {
    /// Find the image with this external id.
    pub external_id: Option<String>,
    /// A metadata filter as JSON (URL-encoded), e.g. `{"color":"red"}` or `{"price":{"$lt":50}}` (docs/api.md,
    /// "Filters").
    pub filter: Option<String>,
    #[param(default = 0)]
    pub offset: Option<i64>,
    #[param(default = 100, maximum = 1000)]
    pub limit: Option<i64>,
}

/// The upload form: image file parts, and the fields of one image or the `items` of several.
const FORM: &[upload::Field] = &[
    field(&["image", "image[]", "images"], "image", Kind::File),
    field(&["external_id"], "external_id", Kind::Text),
    field(&["metadata"], "metadata", Kind::Json),
    field(&["caption", "captions"], "captions", Kind::Texts),
    field(&["items"], "items", Kind::Json),
];

/// An upload form's fields: one image's, or `items` (one entry per file part, in order).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImagesForm {
    external_id: Option<String>,
    metadata: Option<Value>,
    #[serde(default)]
    captions: Vec<String>,
    items: Option<Vec<ItemFields>>,
}

/// The images of a request, and whether it is all or nothing for those given by URL.
fn items_from(body: Body<AddImagesJson, ImagesForm>) -> ApiResult<(Vec<ImageItem>, bool)> {
    let j = match body {
        Body::Json(j) => j,
        // Files only: nothing to fetch, so nothing to fail one by one.
        Body::Form(form, files) => {
            let items = inputs_from_form(form, files)?
                .into_iter()
                .map(|i| ImageItem {
                    source: ImageSource::Bytes(i.bytes),
                    external_id: i.external_id,
                    metadata: i.metadata,
                    captions: i.captions,
                })
                .collect();
            return Ok((items, true));
        }
    };
    let all_or_nothing = j.all_or_nothing;
    let items = j
        .images
        .into_iter()
        .enumerate()
        .map(|(i, it)| {
            let source = match (it.data, it.url) {
                (Some(data), None) => {
                    ImageSource::Bytes(upload::base64_image(&format!("images[{i}].data"), &data)?)
                }
                (None, Some(url)) => ImageSource::Url(url),
                (Some(_), Some(_)) => {
                    return Err(ApiError::invalid(format!(
                        "images[{i}] has both `data` and `url`; give one: the image as base64, or a URL to fetch it from"
                    )));
                }
                (None, None) => {
                    return Err(ApiError::invalid(format!(
                        "images[{i}] has no image: give `data` (the file, base64) or `url` (http or https)"
                    )));
                }
            };
            Ok(ImageItem {
                source,
                external_id: it.external_id,
                metadata: it.metadata,
                captions: it.captions,
            })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    Ok((items, all_or_nothing))
}

fn inputs_from_form(form: ImagesForm, mut files: Vec<Bytes>) -> ApiResult<Vec<ImageInput>> {
    let ImagesForm {
        external_id,
        metadata,
        captions,
        items,
    } = form;
    if files.is_empty() {
        return Err(ApiError::bad_request("no `image` file part in the form"));
    }
    match items {
        Some(items) => {
            if items.len() != files.len() {
                return Err(ApiError::invalid(format!(
                    "`items` has {} entries for {} images",
                    items.len(),
                    files.len()
                )));
            }
            Ok(files
                .into_iter()
                .zip(items)
                .map(|(bytes, it)| ImageInput {
                    bytes,
                    external_id: it.external_id,
                    metadata: it.metadata,
                    captions: it.captions,
                })
                .collect())
        }
        None if files.len() == 1 => Ok(vec![ImageInput {
            bytes: files.remove(0),
            external_id,
            metadata,
            captions,
        }]),
        None => {
            if external_id.is_some() || metadata.is_some() || !captions.is_empty() {
                return Err(ApiError::invalid(
                    "several images: give their fields in an `items` JSON array",
                ));
            }
            Ok(files
                .into_iter()
                .map(|bytes| ImageInput {
                    bytes,
                    external_id: None,
                    metadata: None,
                    captions: vec![],
                })
                .collect())
        }
    }
}

#[utoipa::path(post, path = "/v1/collections/{collection}/images", tag = "images", operation_id = "add_images",
    params(("collection" = String, Path, description = "collection name")),
    request_body(description = "one image or a batch, stored all or nothing; images given by URL (JSON only) may fail one by one \
        (listed in `errors`, the others stored) unless `all_or_nothing` is set", content(
        (AddImagesJson = "application/json"), (AddImagesMultipart = "multipart/form-data"))),
    responses((status = 201, description = "stored; images given by URL that failed are listed in `errors`", body = AddedImages),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, description = "external_id taken", body = ErrorBody), (status = 413, body = ErrorBody),
              (status = 415, body = ErrorBody),
              (status = 422, description = "well-formed but not acceptable; or nothing was added because images given by URL \
                failed (all of them, or one with `all_or_nothing`): the first one's code (url_ingest_off, invalid_url, \
                url_forbidden, url_unreachable, url_timeout, url_status, url_redirects, url_too_large, url_not_image, \
                invalid_image) and every failure in the message", body = ErrorBody)))]
pub async fn add(
    State(s): State<AppState>,
    CollectionPath(collection): CollectionPath,
    caller: Caller,
    req: Request,
) -> ApiResult<(StatusCode, Json<AddedImages>)> {
    let (items, all_or_nothing) = items_from(upload::read(req, FORM).await?)?;
    caller.charge_rows(items.len())?;
    let total = items.len();
    let report = s
        .service
        .add_image_items(&collection, items, all_or_nothing, None)
        .await?;
    if report.added.is_empty() {
        return Err(error::items_failed(total, all_or_nothing, report.failed));
    }
    Ok((
        StatusCode::CREATED,
        Json(AddedImages {
            images: report
                .added
                .into_iter()
                .map(|(index, a)| AddedImage {
                    index,
                    id: a.id,
                    external_id: a.external_id,
                    width: a.width,
                    height: a.height,
                    caption_ids: a.caption_ids,
                })
                .collect(),
            errors: report
                .failed
                .into_iter()
                .map(|f| {
                    let e = ApiError::from(f.error);
                    ItemError {
                        index: f.index,
                        url: crate::fetch::redacted(&f.url),
                        code: e.code.to_string(),
                        message: e.message,
                    }
                })
                .collect(),
        }),
    ))
}

pub fn parse_filter(f: Option<&str>) -> ApiResult<Filter> {
    match f {
        None | Some("") => Ok(Filter::all()),
        Some(s) => {
            let v: Value = serde_json::from_str(s)
                .map_err(|e| ApiError::bad_request(format!("filter must be a JSON object: {e}")))?;
            Ok(Filter::parse(&v)?)
        }
    }
}

#[utoipa::path(get, path = "/v1/collections/{collection}/images", tag = "images", operation_id = "list_images",
    params(("collection" = String, Path, description = "collection name"), ListImagesQuery),
    responses((status = 200, body = ImageList), (status = 404, body = ErrorBody)))]
pub async fn list(
    State(s): State<AppState>,
    CollectionPath(collection): CollectionPath,
    ApiQuery(q): ApiQuery<ListImagesQuery>,
) -> ApiResult<Json<ImageList>> {
    if let Some(ext) = q.external_id {
        let img = s.service.image_by_external_id(&collection, &ext).await?;
        return Ok(Json(ImageList {
            images: vec![img.into()],
            total: 1,
        }));
    }
    let filter = parse_filter(q.filter.as_deref())?;
    let (offset, limit) = page(q.offset, q.limit)?;
    let (rows, total) = s
        .service
        .list_images(&collection, &filter, offset, limit)
        .await?;
    Ok(Json(ImageList {
        images: rows.into_iter().map(Into::into).collect(),
        total,
    }))
}

#[utoipa::path(get, path = "/v1/collections/{collection}/images/{id}", tag = "images", operation_id = "get_image",
    params(("collection" = String, Path, description = "collection name"), ("id" = i64, Path, description = "image id")),
    responses((status = 200, body = Image), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(s): State<AppState>,
    ItemPath(collection, id): ItemPath<i64>,
) -> ApiResult<Json<Image>> {
    let (img, caps) = s.service.image(&collection, id).await?;
    let mut img: Image = img.into();
    img.captions = Some(caps.into_iter().map(Into::into).collect());
    Ok(Json(img))
}

#[utoipa::path(delete, path = "/v1/collections/{collection}/images/{id}", tag = "images", operation_id = "delete_image",
    params(("collection" = String, Path, description = "collection name"), ("id" = i64, Path, description = "image id")),
    responses((status = 204, description = "deleted, with its captions"), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(s): State<AppState>,
    ItemPath(collection, id): ItemPath<i64>,
) -> ApiResult<StatusCode> {
    s.service.delete_image(&collection, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

// For the OpenAPI document: a binary string, not an array of numbers.
/// A JPEG file.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct Jpeg(#[allow(dead_code)] Vec<u8>);

/// A thumbnail never changes for its image id (ids are never reused, and a thumbnail is written once with its
/// image): browsers may keep it a year without asking again. `private`: it is read with an API key.
const THUMBNAIL_CACHE: &str = "private, max-age=31536000, immutable";

/// The thumbnail's entity tag: the image id and a digest of the bytes, so that a database rebuilt from
/// scratch (where ids start again) never passes a stale copy as current.
fn thumbnail_etag(id: i64, bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    format!("\"{id}-{}\"", hex::encode(&digest[..8]))
}

/// Whether `If-None-Match` names this tag (or `*`); weak and strong forms compare alike (RFC 9110 13.1.2).
fn none_match(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || t == etag)
}

#[utoipa::path(get, path = "/v1/collections/{collection}/images/{id}/thumbnail", tag = "images", operation_id = "thumbnail",
    params(("collection" = String, Path, description = "collection name"), ("id" = i64, Path, description = "image id"),
           ("If-None-Match" = Option<String>, Header, description = "an ETag from an earlier answer: 304 when it is still current")),
    responses(
        (status = 200, description = "the image's thumbnail: a JPEG whose longest side is at most 256 pixels, kept at ingest (`--thumbnails`, on by default)",
         body = inline(Jpeg), content_type = "image/jpeg",
         headers(("ETag" = String, description = "the image id and a digest of the bytes"),
                 ("Cache-Control" = String, description = "`private, max-age=31536000, immutable`: a thumbnail never changes for its id"))),
        (status = 304, description = "the If-None-Match tag is current; no body",
         headers(("ETag" = String), ("Cache-Control" = String))),
        (status = 404, description = "no such collection or image, or the image has none (added with thumbnails off)", body = ErrorBody)))]
pub async fn thumbnail(
    State(s): State<AppState>,
    ItemPath(collection, id): ItemPath<i64>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let bytes = s.service.thumbnail(&collection, id).await?;
    let etag = thumbnail_etag(id, &bytes);
    let tag = HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("\"0\""));
    let cache = [
        (header::ETAG, tag),
        (
            header::CACHE_CONTROL,
            HeaderValue::from_static(THUMBNAIL_CACHE),
        ),
    ];
    if none_match(&headers, &etag) {
        return Ok((StatusCode::NOT_MODIFIED, cache).into_response());
    }
    Ok((
        cache,
        [(header::CONTENT_TYPE, HeaderValue::from_static("image/jpeg"))],
        bytes,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_none_match_compares_tags_in_lists_weak_or_strong() {
        let etag = thumbnail_etag(7, b"jpeg");
        assert!(etag.starts_with("\"7-") && etag.ends_with('"') && etag.len() == 20);
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                header::IF_NONE_MATCH,
                HeaderValue::from_str(v).expect("header"),
            );
            h
        };
        assert!(none_match(&with(&etag), &etag));
        assert!(none_match(&with(&format!("\"x\", W/{etag}")), &etag));
        assert!(none_match(&with("*"), &etag));
        assert!(!none_match(&with("\"7-0000000000000000\""), &etag));
        assert!(!none_match(&HeaderMap::new(), &etag));
        assert_ne!(
            etag,
            thumbnail_etag(7, b"other"),
            "the bytes are part of the tag"
        );
    }
}
