//! The request-body read timeout: a client that sends its headers and then stalls or trickles the body gets
//! 408 once `--body-read-timeout-ms` has passed, and its connection is closed, so slow senders cannot hold
//! connections and handler tasks open (slowloris). The deadline covers the whole body, not the gap between
//! chunks: a client trickling a byte at a time would never trip a per-chunk timer (tower-http's
//! `RequestBodyTimeoutLayer` is one).

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context as TaskContext, Poll},
    time::Duration,
};

use axum::{
    body::{Body, Bytes, HttpBody},
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

use crate::api::error::ApiError;

/// The limit; none: bodies may take as long as the request timeout allows.
#[derive(Clone, Copy)]
pub struct BodyTimeout {
    pub limit: Option<Duration>,
}

/// Gives the body a deadline; when it passed before the body had arrived, whatever the handler made of the
/// failed read is replaced by a 408 that says what happened.
pub async fn body_timeout(State(rule): State<BodyTimeout>, req: Request, next: Next) -> Response {
    let Some(limit) = rule.limit.filter(|_| !req.body().is_end_stream()) else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let (body, expired) = Deadline::new(
        body,
        limit,
        "the request body did not arrive within the server's body read timeout",
    );
    let res = next.run(Request::from_parts(parts, Body::new(body))).await;
    if !expired.load(Ordering::Acquire) {
        return res;
    }
    let mut r = ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "request_timeout",
        format!(
            "the request body did not arrive within {}s of its headers (the server's body read timeout); \
             nothing was applied: send the whole body without pausing",
            limit.as_secs_f64()
        ),
    )
    .into_response();
    // The rest of the body may still be on its way: this connection cannot carry another request.
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A request body that fails when its deadline passes before it has fully arrived, and says so in `expired`.
pub(super) struct Deadline {
    body: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
    message: &'static str,
}

impl Deadline {
    pub(super) fn new(
        body: Body,
        after: Duration,
        message: &'static str,
    ) -> (Deadline, Arc<AtomicBool>) {
        let expired = Arc::new(AtomicBool::new(false));
        let d = Deadline {
            body,
            sleep: Box::pin(tokio::time::sleep(after)),
            expired: expired.clone(),
            message,
        };
        (d, expired)
    }
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        // Polling the timer registers the waker, so a silent client still wakes the task at the deadline.
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.expired.store(true, Ordering::Release);
                Poll::Ready(Some(Err(axum::Error::new(this.message))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
