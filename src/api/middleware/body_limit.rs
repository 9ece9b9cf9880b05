//! The body limit, stated: a declared length over it is refused before the body is read; for bodies without
//! a length, the extractors state the limit when they reach it.

use axum::{
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

use crate::api::error::{ApiError, BodyLimit};

/// A declared body over the limit is refused before it is read, with the limit in the message.
pub async fn check_length(
    State(limit): State<BodyLimit>,
    mut req: Request,
    next: Next,
) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limit.0 as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the request body is {n} bytes; the limit is {} bytes (send fewer or smaller images per request)",
                limit.0
            ),
        )
        .into_response();
    }
    // For bodies without a length, the extractors state the limit when they hit it.
    req.extensions_mut().insert(limit);
    next.run(req).await
}
