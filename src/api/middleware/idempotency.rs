//! `Idempotency-Key` on the POSTs that write (adding images, captions and collections; the admin
//! operations). The first successful answer to a key is kept for 24 hours, in the database so that a retry
//! reaching another replica finds it, and a retry with the same key and the same request gets that answer
//! again, marked `Idempotent-Replayed: true`, without running anything: a client that timed out and retries
//! does not store its photos twice. A key whose request is still running answers 409; a key reused for a
//! different request answers 422; a request that failed keeps nothing (it wrote nothing), so its retry runs.
//!
//! It runs inside the request timeout, so a write that finishes after its client was given 503 still keeps
//! its answer for the retry. Keys are scoped by the caller's key name and the path: two tenants never meet.
//!
//! While a keyed request runs, its server refreshes the claim's heartbeat; a retry that finds a claim with
//! no answer and no heartbeat for `IDEMPOTENCY_LEASE` knows the server running it stopped (a crash, a kill),
//! and says so (409 `idempotency_abandoned`, no Retry-After: retrying the key cannot help) instead of "still
//! running" until the key expires. It never runs the request again: the first may have been applied before
//! its server stopped. A process also knows the keys it runs itself, so a beat held up behind a long SQLite
//! write never makes its own request look abandoned.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use sha2::{Digest, Sha256};

use crate::{
    api::{
        access::RouteInfos,
        error::{ApiError, BodyLimit, body_too_large},
        keys::KeyFound,
    },
    service::{Claim, IDEMPOTENCY_HEARTBEAT, IdempotencyKey, Service},
};

pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

#[derive(Clone)]
pub struct Idempotency {
    pub service: Arc<Service>,
    pub routes: RouteInfos,
    pub max_request_bytes: usize,
    /// The claims this process is running now.
    pub running: Arc<Mutex<HashSet<IdempotencyKey>>>,
}

/// A claim this process runs: listed in `running` and kept alive by a heartbeat until dropped.
struct Running {
    running: Arc<Mutex<HashSet<IdempotencyKey>>>,
    claim: IdempotencyKey,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(st: &Idempotency, claim: IdempotencyKey) -> Running {
        st.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(claim.clone());
        let (service, key) = (st.service.clone(), claim.clone());
        let heartbeat = tokio::spawn(async move {
            let mut every = tokio::time::interval(IDEMPOTENCY_HEARTBEAT);
            every.tick().await; // the claim itself was the first sign of life
            loop {
                every.tick().await;
                if let Err(e) = service.beat_idempotency(&key).await {
                    tracing::warn!(error = %e, "refreshing an idempotency claim failed");
                }
            }
        });
        Running {
            running: st.running.clone(),
            claim,
            heartbeat,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.heartbeat.abort();
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.claim);
    }
}

fn in_flight() -> Response {
    let mut e = ApiError::new(
        StatusCode::CONFLICT,
        "idempotency_in_flight",
        "a request with this Idempotency-Key is still running; retry once it has finished",
    );
    e.retry_after = Some(1);
    e.into_response()
}

/// A key as the header may carry it: 1-255 visible ASCII characters (a UUID is the usual choice).
fn parse_key(v: &HeaderValue) -> Result<String, ApiError> {
    match v.to_str() {
        Ok(k) if !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic()) => {
            Ok(k.to_string())
        }
        _ => Err(ApiError::bad_request(
            "Idempotency-Key must be 1-255 visible ASCII characters (a UUID, say)",
        )),
    }
}

/// A digest of what makes two requests the same: the media type and the body. A multipart boundary is
/// chosen afresh by most clients for each attempt, so it is taken out of both.
fn fingerprint(headers: &HeaderMap, body: &[u8]) -> String {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let boundary = ct
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .map(|b| b.trim_matches('"'))
        .find(|b| !b.is_empty());
    let mut h = Sha256::new();
    // The media type alone: parameters (a boundary, a charset) do not make another request.
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    h.update(media.as_bytes());
    h.update([0]);
    match boundary {
        Some(b) => {
            let b = b.as_bytes();
            let mut rest = body;
            while let Some(at) = rest.windows(b.len()).position(|w| w == b) {
                h.update(&rest[..at]);
                rest = &rest[at + b.len()..];
            }
            h.update(rest);
        }
        None => h.update(body),
    }
    hex::encode(h.finalize())
}

pub async fn idempotency(State(st): State<Idempotency>, req: Request, next: Next) -> Response {
    let Some(value) = req.headers().get(&IDEMPOTENCY_KEY) else {
        return next.run(req).await;
    };
    // Reads and searches may be retried as they are; PUT, PATCH and DELETE are idempotent by themselves.
    if req.method() != Method::POST || !st.routes.of_request(&req).writes {
        return next.run(req).await;
    }
    let key = match parse_key(value) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let claim = claim_of(&req, key);
    let (parts, body) = req.into_parts();
    let bytes = match buffered_body(body, st.max_request_bytes).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let fp = fingerprint(&parts.headers, &bytes);
    match st.service.claim_idempotency(&claim, &fp).await {
        Err(e) => return ApiError::from(e).into_response(),
        Ok(claimed) => {
            if let Some(answer) = not_run(&st, &claim, claimed) {
                return answer;
            }
        }
    }
    let _running = Running::start(&st, claim.clone());
    let res = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if !res.status().is_success() {
        if let Err(e) = st.service.release_idempotency(&claim).await {
            tracing::warn!(error = %e, "releasing an idempotency key failed; its retries answer 409 for 24 h");
        }
        return res;
    }
    keep_answer(&st, &claim, res).await
}

/// The claim a request makes: its key, scoped by the caller's key name and the path.
fn claim_of(req: &Request, key: String) -> IdempotencyKey {
    let caller = req
        .extensions()
        .get::<KeyFound>()
        .and_then(|c| c.0.as_ref().map(|k| k.name.clone()))
        .unwrap_or_else(|| "-".into());
    IdempotencyKey {
        scope: format!("{caller} POST {}", req.uri().path()),
        key,
    }
}

/// The request's body, read whole (up to the server's limit) so it can be fingerprinted; else the answer
/// refusing it.
async fn buffered_body(body: Body, limit: usize) -> Result<Bytes, Response> {
    match axum::body::to_bytes(body, limit).await {
        Ok(b) => Ok(b),
        Err(e) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            Err(if too_large {
                body_too_large(Some(BodyLimit(limit)))
            } else {
                ApiError::bad_request(format!("the request body could not be read: {e}"))
            }
            .into_response())
        }
    }
}

/// The answer to a request whose key was claimed before (the first answer again, or why it does not run
/// now); none when the request runs.
fn not_run(st: &Idempotency, claim: &IdempotencyKey, claimed: Claim) -> Option<Response> {
    Some(match claimed {
        Claim::Run => return None,
        Claim::Replay { status, body } => replay(status, body),
        Claim::InFlight => in_flight(),
        Claim::Abandoned { .. }
            if st
                .running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(claim) =>
        {
            in_flight()
        }
        Claim::Abandoned { since } => ApiError::new(
            StatusCode::CONFLICT,
            "idempotency_abandoned",
            format!(
                "the request first sent with this Idempotency-Key stopped without an answer (the server \
                 running it stopped; last seen {since}); it may or may not have been applied: check \
                 (for example, look the images up by external id), then send it with a new key"
            ),
        )
        .into_response(),
        Claim::Mismatch => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was used for a different request in the last 24 hours; \
             use a new key for a new request",
        )
        .into_response(),
    })
}

/// A successful answer, kept for the key's retries (a failed one frees the key instead).
async fn keep_answer(st: &Idempotency, claim: &IdempotencyKey, res: Response) -> Response {
    let (parts, body) = res.into_parts();
    let body: Bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "reading our own answer failed");
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the request was applied but its answer was lost; retry with the same Idempotency-Key",
            )
            .into_response();
        }
    };
    if let Err(e) = st
        .service
        .finish_idempotency(claim, parts.status.as_u16(), &body)
        .await
    {
        tracing::warn!(error = %e, "keeping the answer of an idempotent request failed; its retries answer 409");
    }
    Response::from_parts(parts, Body::from(body))
}

fn replay(status: u16, body: Vec<u8>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (REPLAYED, HeaderValue::from_static("true")),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(ct).expect("header"),
        );
        h
    }

    #[test]
    fn a_fingerprint_ignores_the_multipart_boundary_and_nothing_else() {
        let body = |b: &str, v: &str| {
            format!(
                "--{b}\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\n{v}\r\n--{b}--\r\n"
            )
        };
        let a = fingerprint(
            &headers("multipart/form-data; boundary=aaa111"),
            body("aaa111", "x").as_bytes(),
        );
        let b = fingerprint(
            &headers("multipart/form-data; boundary=\"bbb222\""),
            body("bbb222", "x").as_bytes(),
        );
        let c = fingerprint(
            &headers("multipart/form-data; boundary=bbb222"),
            body("bbb222", "y").as_bytes(),
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        let j = fingerprint(&headers("application/json"), b"{\"name\":\"a\"}");
        assert_ne!(
            j,
            fingerprint(&headers("application/json"), b"{\"name\":\"b\"}")
        );
        assert_ne!(j, fingerprint(&headers("text/plain"), b"{\"name\":\"a\"}"));
    }

    #[test]
    fn keys_are_visible_ascii_up_to_255() {
        assert!(parse_key(&HeaderValue::from_static("3f2a-uuid")).is_ok());
        assert!(parse_key(&HeaderValue::from_static("")).is_err());
        assert!(parse_key(&HeaderValue::from_static("has space")).is_err());
        assert!(parse_key(&HeaderValue::from_str(&"k".repeat(256)).expect("header")).is_err());
    }
}
