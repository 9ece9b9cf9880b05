//! Changing images in place: `PATCH /images/{id}` (metadata merge, external id) and the resource of an image
//! by its external id, `/images/by-external-id/{external_id}` (GET, PUT as an upsert, DELETE), which is how
//! a catalogue keeps its photos in step without remembering our ids.

use axum::{
    Json,
    extract::{Request, State},
    http::StatusCode,
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{
    AppState,
    error::{ApiError, ApiResult, ErrorBody},
    extract::{ApiJson, Caller, ItemPath},
    images::Image,
    upload::{self, Body, Kind, field},
};
use crate::service::{ImagePatch, UpsertInput, UpsertOutcome};

/// A field that may be absent (leave it), null (clear it) or a value.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImagePatchJson {
    /// A JSON merge patch (RFC 7396) of the metadata: keys given replace theirs (objects merge key by key),
    /// a key set to null is removed, keys not given stay.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// The new external id, or null to remove it; absent leaves it as it is.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, nullable)]
    pub external_id: Option<Option<String>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpsertImageJson {
    /// The image file (JPEG, PNG, WebP, GIF, BMP), base64 (a `data:` URL is accepted too).
    pub data: String,
    /// The metadata, replacing the stored metadata whole (absent: none).
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// The image's captions after the upsert (absent: none). Stored captions with the same text keep their
    /// ids; the others are deleted.
    #[serde(default)]
    pub captions: Vec<String>,
}

/// multipart/form-data: one `image` file part, optional `metadata` (JSON object) and `caption` (repeatable).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct UpsertImageMultipart {
    #[schema(value_type = String, format = Binary)]
    pub image: Vec<u8>,
    pub metadata: Option<String>,
    pub caption: Option<Vec<String>>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// No image had the external id: it was added (201).
    Created,
    /// The photo differs from the stored one, or is the stored one coded by another vision model (another
    /// bundle's): it was embedded and replaced the old image under a new id; the old id is gone (200).
    Replaced,
    /// The photo is the stored one (same bytes, coded by the loaded vision model): it was not embedded again;
    /// metadata and captions were updated and the id kept (200).
    Updated,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UpsertedImage {
    pub id: i64,
    pub external_id: String,
    pub outcome: Outcome,
    /// The id of the image this one replaced (outcome `replaced`).
    pub previous_id: Option<i64>,
    pub width: u32,
    pub height: u32,
    /// The image's captions, in the order sent.
    pub caption_ids: Vec<i64>,
}

/// The upsert form: the JSON body's fields, with the image as a file part.
const FORM: &[upload::Field] = &[
    field(&["image"], "image", Kind::File),
    field(&["metadata"], "metadata", Kind::Json),
    field(&["caption", "captions"], "captions", Kind::Texts),
];

/// An upsert form's fields (the image is its file part).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpsertForm {
    metadata: Option<Value>,
    #[serde(default)]
    captions: Vec<String>,
}

fn upsert_input(body: Body<UpsertImageJson, UpsertForm>) -> ApiResult<UpsertInput> {
    match body {
        Body::Json(j) => Ok(UpsertInput {
            bytes: upload::base64_image("data", &j.data)?,
            metadata: j.metadata,
            captions: j.captions,
        }),
        Body::Form(f, files) => {
            let mut files = files.into_iter();
            let bytes = match (files.next(), files.next()) {
                (Some(b), None) => b,
                (None, _) => return Err(ApiError::bad_request("no `image` file part in the form")),
                (Some(_), Some(_)) => {
                    return Err(ApiError::invalid(
                        "one `image` part only: this resource is one image",
                    ));
                }
            };
            Ok(UpsertInput {
                bytes,
                metadata: f.metadata,
                captions: f.captions,
            })
        }
    }
}

#[utoipa::path(patch, path = "/v1/collections/{collection}/images/{id}", tag = "images", operation_id = "patch_image",
    params(("collection" = String, Path, description = "collection name"), ("id" = i64, Path, description = "image id")),
    request_body(content = ImagePatchJson, description = "what to change; the photo, vector and captions stay",
        example = json!({"metadata": {"price": 39.5, "sale": null}, "external_id": "sku-4411"})),
    responses((status = 200, description = "the image as it now is", body = Image), (status = 404, body = ErrorBody),
              (status = 409, description = "the external id belongs to another image", body = ErrorBody)))]
pub async fn patch(
    State(s): State<AppState>,
    ItemPath(collection, id): ItemPath<i64>,
    ApiJson(p): ApiJson<ImagePatchJson>,
) -> ApiResult<Json<Image>> {
    let patch = ImagePatch {
        metadata: p.metadata,
        external_id: p.external_id,
    };
    Ok(Json(
        s.service.patch_image(&collection, id, patch).await?.into(),
    ))
}

#[utoipa::path(put, path = "/v1/collections/{collection}/images/by-external-id/{external_id}", tag = "images",
    operation_id = "upsert_image",
    params(("collection" = String, Path, description = "collection name"),
           ("external_id" = String, Path, description = "your id for the image (1-256 characters, percent-encoded)")),
    request_body(description = "the image, whole: photo, metadata and captions", content(
        (UpsertImageJson = "application/json",
         example = json!({"data": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC",
                          "metadata": {"price": 39.5}, "captions": ["a red espadrille"]})),
        (UpsertImageMultipart = "multipart/form-data"))),
    responses((status = 201, description = "created: no image had the external id", body = UpsertedImage),
              (status = 200, description = "replaced (a new photo, under a new id) or updated (the same photo)", body = UpsertedImage),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, description = "other writes kept changing the image while this ran; send it again", body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn put(
    State(s): State<AppState>,
    ItemPath(collection, external_id): ItemPath<String>,
    caller: Caller,
    req: Request,
) -> ApiResult<(StatusCode, Json<UpsertedImage>)> {
    let input = upsert_input(upload::read(req, FORM).await?)?;
    caller.charge_rows(1)?;
    let u = s
        .service
        .upsert_image(&collection, &external_id, input)
        .await?;
    let (status, outcome) = match u.outcome {
        UpsertOutcome::Created => (StatusCode::CREATED, Outcome::Created),
        UpsertOutcome::Replaced => (StatusCode::OK, Outcome::Replaced),
        UpsertOutcome::Updated => (StatusCode::OK, Outcome::Updated),
    };
    Ok((
        status,
        Json(UpsertedImage {
            id: u.image.id,
            external_id,
            outcome,
            previous_id: u.image.previous_id,
            width: u32::try_from(u.image.width).unwrap_or(0),
            height: u32::try_from(u.image.height).unwrap_or(0),
            caption_ids: u.image.caption_ids,
        }),
    ))
}

#[utoipa::path(get, path = "/v1/collections/{collection}/images/by-external-id/{external_id}", tag = "images",
    operation_id = "get_image_by_external_id",
    params(("collection" = String, Path, description = "collection name"),
           ("external_id" = String, Path, description = "your id for the image (percent-encoded)")),
    responses((status = 200, description = "the image with its captions", body = Image), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(s): State<AppState>,
    ItemPath(collection, external_id): ItemPath<String>,
) -> ApiResult<Json<Image>> {
    let row = s
        .service
        .image_by_external_id(&collection, &external_id)
        .await?;
    let (img, caps) = s.service.image(&collection, row.id).await?;
    let mut img: Image = img.into();
    img.captions = Some(caps.into_iter().map(Into::into).collect());
    Ok(Json(img))
}

#[utoipa::path(delete, path = "/v1/collections/{collection}/images/by-external-id/{external_id}", tag = "images",
    operation_id = "delete_image_by_external_id",
    params(("collection" = String, Path, description = "collection name"),
           ("external_id" = String, Path, description = "your id for the image (percent-encoded)")),
    responses((status = 204, description = "deleted, with its captions"), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(s): State<AppState>,
    ItemPath(collection, external_id): ItemPath<String>,
) -> ApiResult<StatusCode> {
    let row = s
        .service
        .image_by_external_id(&collection, &external_id)
        .await?;
    s.service.delete_image(&collection, row.id).await?;
    Ok(StatusCode::NO_CONTENT)
}
