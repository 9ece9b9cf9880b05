//! The one JSON error shape, and the one place where an error gets its HTTP status: the service's errors (the
//! layers below it are converted there), the HTTP layer's own rejections, and a filter that does not parse.

use axum::{
    Json,
    extract::rejection::{JsonRejection, PathRejection, QueryRejection},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use utoipa::ToSchema;

use crate::{
    decode::DecodeError,
    fetch::FetchError,
    filter::FilterError,
    runtime::RuntimeError,
    service::{ItemFailure, ServiceError},
    text::TextError,
};

/// Every error response: `{"error": {"status": 404, "code": "not_found", "message": "..."}}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// The HTTP status, repeated for clients that only keep the body.
    pub status: u16,
    /// Stable machine-readable kind, e.g. `not_found`, `conflict`, `invalid_image`.
    pub code: String,
    /// What went wrong and what to do about it.
    pub message: String,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for the `Retry-After` header (429, 503).
    pub retry_after: Option<u32>,
}

/// The request body limit, put in the request by the HTTP layer so the extractors can state it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

pub(super) fn body_too_large(limit: Option<BodyLimit>) -> ApiError {
    let limit = limit
        .map(|l| format!("the limit is {} bytes", l.0))
        .unwrap_or_else(|| "see JOINTSPACE_MAX_REQUEST_BYTES".into());
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!(
            "the request body is over the server's limit: {limit} (send fewer or smaller images per request)"
        ),
    )
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn with_code(self, code: &'static str) -> ApiError {
        ApiError { code, ..self }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message)
    }

    pub fn unsupported_media(message: impl Into<String>) -> ApiError {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            message,
        )
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), code = self.code, message = %self.message, "request failed");
        }
        let body = ErrorBody {
            error: ErrorDetail {
                status: self.status.as_u16(),
                code: self.code.to_string(),
                message: self.message,
            },
        };
        let mut r = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, s.into());
        }
        r
    }
}

impl From<FilterError> for ApiError {
    fn from(e: FilterError) -> Self {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_filter",
            e.to_string(),
        )
    }
}

impl From<DecodeError> for ApiError {
    fn from(e: DecodeError) -> Self {
        decode_error(None, e)
    }
}

fn decode_error(index: Option<usize>, e: DecodeError) -> ApiError {
    let status = match e {
        DecodeError::Empty => StatusCode::BAD_REQUEST,
        DecodeError::TooManyBytes { .. } | DecodeError::TooManyPixels { .. } => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        DecodeError::UnknownFormat => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        DecodeError::TooSmall { .. } | DecodeError::Corrupt { .. } => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
    };
    let prefix = index.map(|i| format!("image {i}: ")).unwrap_or_default();
    ApiError::new(status, "invalid_image", format!("{prefix}{e}"))
}

fn text_error(index: Option<usize>, e: TextError) -> ApiError {
    let prefix = index.map(|i| format!("text {i}: ")).unwrap_or_default();
    match e {
        TextError::Load { .. } | TextError::Tokenize(_) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{prefix}{e}"),
        ),
        _ => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_text",
            format!("{prefix}{e}"),
        ),
    }
}

/// An image given by URL that could not be had. All are 422: the request cannot be carried out as given, and
/// the fault is at the URL (the code says which; `url_timeout`, `url_unreachable` and `url_status` may pass on
/// a retry), not in this server, so none is a 5xx that would page its operator.
fn fetch_error(index: Option<usize>, url: &str, e: FetchError) -> ApiError {
    let url = &crate::fetch::redacted(url);
    let code = match &e {
        FetchError::Off => "url_ingest_off",
        FetchError::InvalidUrl(_) => "invalid_url",
        FetchError::Forbidden(_) => "url_forbidden",
        FetchError::Unreachable(_) => "url_unreachable",
        FetchError::Timeout(_) => "url_timeout",
        FetchError::Status(_) => "url_status",
        FetchError::TooManyRedirects => "url_redirects",
        FetchError::TooLarge { .. } => "url_too_large",
        FetchError::NotImage { .. } => "url_not_image",
        FetchError::NotFeed { .. } => "url_not_feed",
    };
    let advice = match &e {
        FetchError::Off => {
            "; send the image as `data` (base64) instead, or start the server with --url-ingest \
             (JOINTSPACE_URL_INGEST=1)"
        }
        FetchError::Forbidden(_) => {
            "; URL ingest fetches only from public addresses (the server's operator may allow ranges with \
             --url-ingest-allow)"
        }
        FetchError::Timeout(_) => "; the server's limit is --url-ingest-timeout-ms",
        FetchError::TooLarge { .. } => "; the server's limit is --url-ingest-max-bytes",
        FetchError::NotImage { .. } => {
            "; the URL must serve the image file itself, not a page showing it"
        }
        FetchError::NotFeed { .. } => {
            "; the URL must serve the feed file itself (CSV or JSON lines)"
        }
        _ => "",
    };
    let prefix = index.map(|i| format!("image {i}: ")).unwrap_or_default();
    let shown = if url.chars().count() > 200 {
        format!("{}...", url.chars().take(200).collect::<String>())
    } else {
        url.to_string()
    };
    ApiError::invalid(format!("{prefix}{shown}: {e}{advice}")).with_code(code)
}

/// The answer when no image was added because images given by URL failed: 422 (the fault is at the URLs,
/// not in the request's size or type, whatever a decode error of uploaded bytes would answer), the first
/// failure's code, and every failure in the message.
pub fn items_failed(total: usize, all_or_nothing: bool, failed: Vec<ItemFailure>) -> ApiError {
    let n = failed.len();
    let mut errors = failed.into_iter().map(|f| {
        let e = ApiError::from(f.error);
        let msg = format!("image {}: {}", f.index, e.message);
        (e, msg)
    });
    let Some((first, first_msg)) = errors.next() else {
        return ApiError::invalid("no image was added");
    };
    let mut all = vec![first_msg];
    all.extend(errors.map(|(_, m)| m));
    let why = if all_or_nothing && n < total {
        format!("no image was added (all_or_nothing, and {n} of {total} failed)")
    } else if total > 1 {
        format!("no image was added ({n} of {total} failed)")
    } else {
        return ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            message: all.remove(0),
            ..first
        };
    };
    ApiError {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        message: format!("{why}: {}", all.join("; ")),
        ..first
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::Overloaded { .. } => ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "overloaded", e.to_string())
            },
            e => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "inference_failed",
                e.to_string(),
            ),
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::Decode { index, source } => decode_error(index, source),
            ServiceError::Text { index, source } => text_error(index, source),
            ServiceError::Fetch { index, url, source } => fetch_error(index, &url, *source),
            ServiceError::Runtime(e) => e.into(),
            // The service states the fact; the advice is the API's.
            e @ ServiceError::NoCollection(_) => {
                ApiError::not_found(format!("{e}; create it with POST /v1/collections"))
            }
            ServiceError::NotFound(m) => ApiError::not_found(m),
            ServiceError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            ServiceError::Invalid(m) => ApiError::invalid(m),
            // Transient by definition (an index still loading, the database restarting): say when to retry,
            // as openapi.yaml's 503 promises.
            ServiceError::Unavailable(m) => ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", m)
            },
            ServiceError::Internal(m) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", m)
            }
        }
    }
}

fn rejection(status: StatusCode, text: String) -> ApiError {
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid",
        _ => "bad_request",
    };
    ApiError::new(status, code, text)
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let msg = match &r {
            JsonRejection::MissingJsonContentType(_) => {
                "send the body as JSON with `Content-Type: application/json`".to_string()
            }
            _ => r.body_text(),
        };
        rejection(r.status(), msg)
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        rejection(StatusCode::BAD_REQUEST, r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        rejection(StatusCode::BAD_REQUEST, r.body_text())
    }
}

/// A multipart error, with the body limit stated when that is what was hit.
pub fn multipart_error(
    e: axum::extract::multipart::MultipartError,
    limit: Option<BodyLimit>,
) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        body_too_large(limit)
    } else {
        ApiError::new(e.status(), "bad_request", e.body_text())
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
