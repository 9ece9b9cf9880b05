//! The request timeout: a read past it is cancelled; a write runs on to completion (its body under a deadline
//! of its own) while the client gets 503 at once.

use std::time::Duration;

use axum::{
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

use super::body_timeout::Deadline;
use crate::api::{access::RouteInfos, error::ApiError};

/// The timeout's state: the limit (none: no timeout) and the route table that says which routes write.
#[derive(Clone)]
pub struct Timeout {
    pub limit: Option<Duration>,
    pub routes: RouteInfos,
}

/// Answers 503 when a request runs past the timeout. A write runs on as its own task and finishes: cancelling
/// it half-way could leave a committed row out of the in-memory index. A read is cancelled.
pub async fn timeout(State(rule): State<Timeout>, req: Request, next: Next) -> Response {
    let Some(limit) = rule.limit else {
        return next.run(req).await;
    };
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let write = rule.routes.of_request(&req).writes;
    let req = if write {
        // The write's task outlives the 503, so its body gets a deadline of its own: a client that stops
        // sending must not hold the task and its connection open for ever. Handlers read the whole body
        // before they apply anything, so a body cut off here means nothing was stored. The grace keeps the
        // 503 first.
        let (parts, body) = req.into_parts();
        let (body, _) = Deadline::new(
            body,
            limit + BODY_GRACE,
            "the request body did not arrive before the server's timeout",
        );
        Request::from_parts(parts, Body::new(body))
    } else {
        req
    };
    let mut task = tokio::spawn(next.run(req));
    match tokio::time::timeout(limit, &mut task).await {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("internal error; the request was not applied ({e})"),
        )
        .into_response(),
        Err(_) => {
            if !write {
                task.abort();
            }
            let mut r = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "timeout",
                format!(
                    "{method} {path} took longer than the server's {}s limit{}",
                    limit.as_secs_f64(),
                    if write {
                        "; it may still complete, so check before sending it again"
                    } else {
                        "; retry later or ask for less"
                    }
                ),
            )
            .into_response();
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            r
        }
    }
}

const BODY_GRACE: Duration = Duration::from_millis(200);
