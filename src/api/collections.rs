//! /v1/collections

use axum::{Json, extract::State, http::StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{
    AppState,
    error::{ApiResult, ErrorBody},
    extract::{ApiJson, Caller, CollectionPath},
};
use crate::service::{CollectionName, CollectionRow, CollectionSettings, TextField};

// The schema of `TextField`, which reads and writes itself (jointspace_core::text_field).
/// A text field: a metadata path (weight 1), or a path with the weight its sentences carry by meaning.
#[derive(ToSchema)]
#[schema(as = TextField)]
#[allow(dead_code)]
#[serde(untagged)]
enum TextFieldWire {
    /// A dotted metadata path, e.g. "title" or "brand.name".
    Path(String),
    Weighted(WeightedTextField),
}

#[derive(ToSchema)]
#[allow(dead_code)]
#[serde(deny_unknown_fields)]
struct WeightedTextField {
    /// A dotted metadata path.
    #[schema(example = "description")]
    field: String,
    /// The factor on its sentences' similarity in the words-by-meaning channel, 0 to 10 (default 1); 0 reads
    /// the field as keywords only, and its sentences are not embedded. Keywords read every field alike.
    #[schema(nullable = false, minimum = 0, maximum = 10, example = 0.5)]
    weight: Option<f32>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCollection {
    /// 1-64 lower-case letters, digits, '-' or '_'.
    #[schema(example = "products")]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Metadata fields (dotted paths, e.g. "title" or "brand.name") whose words a sentence search finds by
    /// meaning and as keywords, beside captions and external ids; a field may carry a weight for its sentences
    /// by meaning (`{"field": "description", "weight": 0.5}`). Given (even `[]`), sentence searches default to
    /// hybrid mode (docs/api.md, "Hybrid search"); absent, to vector mode.
    #[schema(value_type = Option<Vec<TextFieldWire>>, example = json!(["title", "brand.name", {"field": "description", "weight": 0.5}]))]
    pub text_fields: Option<Vec<TextField>>,
    /// A metadata field (a dotted path) whose value names each image's product, e.g. "product_id": images
    /// sharing a value are one product's photos, and an image search returns each product once, scored by its
    /// best photo and its words (docs/api.md, "Products with several photos"). Absent: every image stands
    /// alone.
    #[schema(example = "product_id")]
    pub group_by: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Collection {
    pub name: String,
    pub description: String,
    pub created_at: String,
    /// The metadata fields searched by meaning and as keywords, as created (a field of weight 1 as its bare
    /// path); null: the collection did not ask for them.
    #[schema(value_type = Option<Vec<TextFieldWire>>)]
    pub text_fields: Option<Vec<TextField>>,
    /// The metadata field naming each image's product; null: every image stands alone.
    pub group_by: Option<String>,
    pub images: i64,
    pub captions: i64,
}

impl From<CollectionRow> for Collection {
    fn from(c: CollectionRow) -> Self {
        Collection {
            name: c.name,
            description: c.description,
            created_at: c.created_at,
            text_fields: c.text_fields,
            group_by: c.group_by,
            images: c.images,
            captions: c.captions,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CollectionList {
    pub collections: Vec<Collection>,
}

#[utoipa::path(post, path = "/v1/collections", tag = "collections", operation_id = "create_collection", request_body = CreateCollection,
    responses((status = 201, body = Collection), (status = 409, description = "name taken", body = ErrorBody),
              (status = 422, description = "bad name", body = ErrorBody)))]
pub async fn create(
    State(s): State<AppState>,
    ApiJson(req): ApiJson<CreateCollection>,
) -> ApiResult<(StatusCode, Json<Collection>)> {
    let name = CollectionName::parse(&req.name)?;
    let c = s
        .service
        .create_collection_with(
            &name,
            &req.description,
            &CollectionSettings {
                text_fields: req.text_fields,
                group_by: req.group_by,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(c.into())))
}

#[utoipa::path(get, path = "/v1/collections", tag = "collections", operation_id = "list_collections", responses((status = 200, body = CollectionList)))]
pub async fn list(State(s): State<AppState>, caller: Caller) -> ApiResult<Json<CollectionList>> {
    let rows = s.service.list_collections().await?;
    // A key limited to some collections sees only those.
    Ok(Json(CollectionList {
        collections: rows
            .into_iter()
            .filter(|c| caller.may_touch(&c.name))
            .map(Into::into)
            .collect(),
    }))
}

#[utoipa::path(get, path = "/v1/collections/{collection}", tag = "collections", operation_id = "get_collection",
    params(("collection" = String, Path, description = "collection name")),
    responses((status = 200, body = Collection), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(s): State<AppState>,
    CollectionPath(name): CollectionPath,
) -> ApiResult<Json<Collection>> {
    Ok(Json(s.service.collection(&name).await?.into()))
}

#[utoipa::path(delete, path = "/v1/collections/{collection}", tag = "collections", operation_id = "delete_collection",
    params(("collection" = String, Path, description = "collection name")),
    responses((status = 204, description = "deleted with all its images and captions"), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(s): State<AppState>,
    CollectionPath(name): CollectionPath,
) -> ApiResult<StatusCode> {
    s.service.delete_collection(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/collections/{collection}/export", tag = "collections", operation_id = "export_collection",
    params(("collection" = String, Path, description = "collection name")),
    responses(
        (status = 200, description = "the collection as JSON lines, read at one point in time and streamed: a `header`, one \
            `image` per image (external id, metadata, captions, packed ternary code, vision model and bundle ids, thumbnail), \
            one `caption` per caption without an image, and an `end` counting them (a file without it was cut short). \
            `jointspace import` restores it without the CNN (docs/api.md, \"Export and import\").",
         content_type = "application/x-ndjson", body = String),
        (status = 404, body = ErrorBody)))]
pub async fn export(
    State(s): State<AppState>,
    CollectionPath(name): CollectionPath,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    use futures::TryStreamExt;
    let lines = s
        .service
        .export(&name)
        .await?
        // Past the first chunk the status is sent: an error can only cut the stream, which the missing
        // `end` line then tells.
        .map_err(|e| std::io::Error::other(e.to_string()));
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                "application/x-ndjson; charset=utf-8",
            ),
            (axum::http::header::CONTENT_DISPOSITION, "attachment"),
        ],
        axum::body::Body::from_stream(lines),
    )
        .into_response())
}
