//! The body limit, stated: a declared length over it is refused before the body is processed; for bodies
//! without a length, the extractors state the limit when they reach it.

use axum::{
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use http_body_util::BodyExt;

use crate::api::error::{ApiError, BodyLimit};

/// How far past the limit a refused body is still read and dropped. Answering while the client is still
/// writing makes the server close a socket with unread bytes, which resets the connection: the client then
/// sees a connection error (and may retry) instead of the 413. Reading a little past the limit lets the
/// answer arrive; anything larger is refused at once and the connection closed.
const DRAIN_PAST_LIMIT: u64 = 8 << 20;

/// A declared body over the limit is refused without being processed, with the limit in the message.
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
        let mut refused = ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the request body is {n} bytes; the limit is {} bytes (send fewer or smaller images per request)",
                limit.0
            ),
        )
        .into_response();
        if n <= limit.0 as u64 + DRAIN_PAST_LIMIT {
            drain(req.into_body()).await;
        } else {
            refused
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return refused;
    }
    // For bodies without a length, the extractors state the limit when they hit it.
    req.extensions_mut().insert(limit);
    next.run(req).await
}

/// Reads the body to its end (or its first error: the body timeout bounds a stalled sender), keeping nothing.
async fn drain(mut body: Body) {
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
}
