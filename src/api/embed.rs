//! /v1/embed: vectors without storing anything.

use axum::{
    Json,
    extract::{Request, State},
};
use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::pipeline::ImageUse;

use super::{
    AppState,
    error::{ApiError, ApiResult, ErrorBody},
    extract::{ApiJson, Caller},
    upload::{self, Body, Kind, field},
};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbedTextRequest {
    /// Sentences, embedded in one batch.
    pub texts: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbedTextResponse {
    pub dim: usize,
    /// Vectors in the joint space, one per sentence: unit length, except under a euclidean bundle.
    pub embeddings: Vec<Vec<f32>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbedImageJson {
    /// The image file, base64.
    pub image: String,
}

/// multipart/form-data: one `image` file part.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct EmbedImageMultipart {
    #[schema(value_type = String, format = Binary)]
    pub image: Vec<u8>,
}

/// The embed form: the image file alone.
const IMAGE_FORM: &[upload::Field] = &[field(&["image"], "image", Kind::File)];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageOnly {}

#[derive(Debug, Serialize, ToSchema)]
pub struct FneCode {
    /// Features in the code.
    pub dim: usize,
    /// Packed ternary code (docs/bundle.md), base64: the +1 bit plane, then the -1 bit plane.
    pub packed: String,
    pub plus: usize,
    pub minus: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbedImageResponse {
    pub dim: usize,
    /// The vector in the joint space: unit length, except under a euclidean bundle.
    pub embedding: Vec<f32>,
    pub code: FneCode,
    pub width: u32,
    pub height: u32,
}

#[utoipa::path(post, path = "/v1/embed/text", tag = "embed", operation_id = "embed_text", request_body = EmbedTextRequest,
    responses((status = 200, body = EmbedTextResponse), (status = 422, body = ErrorBody)))]
pub async fn text(
    State(s): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<EmbedTextRequest>,
) -> ApiResult<Json<EmbedTextResponse>> {
    if req.texts.is_empty() || req.texts.len() > 256 {
        return Err(ApiError::invalid("send between 1 and 256 texts"));
    }
    caller.charge_rows(req.texts.len())?;
    let embeddings = s.service.embed_texts(&req.texts).await?;
    Ok(Json(EmbedTextResponse {
        dim: s.service.joint_dim(),
        embeddings,
    }))
}

#[utoipa::path(post, path = "/v1/embed/image", tag = "embed", operation_id = "embed_image",
    request_body(content((EmbedImageJson = "application/json"), (EmbedImageMultipart = "multipart/form-data"))),
    responses((status = 200, body = EmbedImageResponse), (status = 400, body = ErrorBody), (status = 413, body = ErrorBody),
              (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn image(
    State(s): State<AppState>,
    caller: Caller,
    req: Request,
) -> ApiResult<Json<EmbedImageResponse>> {
    caller.charge_rows(1)?;
    let bytes = match upload::read::<EmbedImageJson, ImageOnly>(req, IMAGE_FORM).await? {
        Body::Json(j) => upload::base64_image("image", &j.image)?,
        Body::Form(ImageOnly {}, mut files) => {
            if files.len() != 1 {
                return Err(ApiError::bad_request("send exactly one `image` file part"));
            }
            files.remove(0)
        }
    };
    let mut e = s.service.embed_images(vec![bytes], ImageUse::Query).await?;
    let e = e.remove(0);
    let (plus, minus) = e.code.counts();
    Ok(Json(EmbedImageResponse {
        dim: e.vector.len(),
        code: FneCode {
            dim: e.code.dim(),
            packed: base64::engine::general_purpose::STANDARD.encode(e.code.packed()),
            plus,
            minus,
        },
        embedding: e.vector,
        width: e.width,
        height: e.height,
    }))
}
