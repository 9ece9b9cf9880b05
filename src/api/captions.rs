//! /v1/collections/{collection}/captions

use axum::{Json, extract::State, http::StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{
    AppState,
    error::{ApiResult, ErrorBody},
    extract::{ApiJson, ApiQuery, Caller, CollectionPath, ItemPath, page},
};
use crate::service::CaptionRow;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewCaption {
    #[schema(example = "a dog running on the beach")]
    pub text: String,
    /// The image it describes, if any (a caption may also stand alone, as an annotation candidate).
    pub image_id: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddCaptions {
    pub captions: Vec<NewCaption>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AddedCaptions {
    pub ids: Vec<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Caption {
    pub id: i64,
    pub image_id: Option<i64>,
    pub text: String,
    /// A sentence of the image's text field of this name (the collection's `text_fields`, embedded when the
    /// image was written); absent for a caption someone wrote. Caption search finds both; lists show only
    /// written captions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    pub created_at: String,
}

impl From<CaptionRow> for Caption {
    fn from(r: CaptionRow) -> Self {
        Caption {
            id: r.id,
            image_id: r.image_id,
            text: r.text,
            field: r.field,
            created_at: r.created_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CaptionList {
    pub captions: Vec<Caption>,
    /// How many captions there are in all (of the image, when `image_id` is given), not only on this page.
    pub total: i64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListCaptionsQuery {
    /// Only the captions of this image.
    pub image_id: Option<i64>,
    #[param(default = 0)]
    pub offset: Option<i64>,
    #[param(default = 100, maximum = 1000)]
    pub limit: Option<i64>,
}

#[utoipa::path(post, path = "/v1/collections/{collection}/captions", tag = "captions", operation_id = "add_captions",
    params(("collection" = String, Path, description = "collection name")), request_body = AddCaptions,
    responses((status = 201, body = AddedCaptions), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn add(
    State(s): State<AppState>,
    CollectionPath(collection): CollectionPath,
    caller: Caller,
    ApiJson(req): ApiJson<AddCaptions>,
) -> ApiResult<(StatusCode, Json<AddedCaptions>)> {
    caller.charge_rows(req.captions.len())?;
    let caps = req
        .captions
        .into_iter()
        .map(|c| (c.image_id, c.text))
        .collect();
    let ids = s.service.add_captions(&collection, caps).await?;
    Ok((StatusCode::CREATED, Json(AddedCaptions { ids })))
}

#[utoipa::path(get, path = "/v1/collections/{collection}/captions", tag = "captions", operation_id = "list_captions",
    params(("collection" = String, Path, description = "collection name"), ListCaptionsQuery),
    responses((status = 200, body = CaptionList), (status = 404, body = ErrorBody)))]
pub async fn list(
    State(s): State<AppState>,
    CollectionPath(collection): CollectionPath,
    ApiQuery(q): ApiQuery<ListCaptionsQuery>,
) -> ApiResult<Json<CaptionList>> {
    let (offset, limit) = page(q.offset, q.limit)?;
    let (rows, total) = s
        .service
        .list_captions(&collection, q.image_id, offset, limit)
        .await?;
    Ok(Json(CaptionList {
        captions: rows.into_iter().map(Into::into).collect(),
        total,
    }))
}

#[utoipa::path(delete, path = "/v1/collections/{collection}/captions/{id}", tag = "captions", operation_id = "delete_caption",
    params(("collection" = String, Path, description = "collection name"), ("id" = i64, Path, description = "caption id")),
    responses((status = 204, description = "deleted"), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(s): State<AppState>,
    ItemPath(collection, id): ItemPath<i64>,
) -> ApiResult<StatusCode> {
    s.service.delete_caption(&collection, id).await?;
    Ok(StatusCode::NO_CONTENT)
}
