//! The HTTP API, one module per area (collections, images, captions, search, embed, sync, system), their wire
//! types beside their handlers, and `page`, the search page served at `/`. `routes` is the one table of routes; `middleware` is what runs around every
//! handler; `openapi` assembles the document; `extract` and `error` are the edges where requests are parsed
//! and errors become HTTP.

pub mod access;
pub mod captions;
pub mod collections;
pub mod embed;
pub mod error;
pub mod extract;
pub mod images;
pub mod keys;
pub mod metrics;
pub mod middleware;
pub mod openapi;
pub mod page;
pub mod rate_limit;
pub mod routes;
pub mod search;
pub mod sync;
pub mod system;
pub mod upload;
pub mod upsert;

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use axum::{
    Router,
    extract::{DefaultBodyLimit, Request},
    http::{HeaderName, HeaderValue, Method, StatusCode, header},
    middleware::from_fn_with_state,
    response::IntoResponse,
};
use bytes::Bytes;
use tower_http::{
    catch_panic::CatchPanicLayer,
    cors::{AllowOrigin, CorsLayer},
    request_id::{MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer},
    trace::{DefaultOnResponse, TraceLayer},
};
use tracing::Level;

use crate::service::{ReadyOptions, Service, metrics::Metrics};
use error::{ApiError, BodyLimit};
pub use keys::ApiKeys;
use metrics::HttpMetrics;
use middleware::{
    auth::KeyCheck, body_timeout::BodyTimeout, idempotency::Idempotency, timeout::Timeout,
};
pub use openapi::ApiDoc;

#[derive(Clone)]
pub struct AppState {
    pub service: Arc<Service>,
    /// The registry `/metrics` renders (the service's, with the HTTP layer's families in it).
    pub metrics: Arc<Metrics>,
    /// The HTTP layer's own families.
    pub http: Arc<HttpMetrics>,
    /// What `/readyz` demands.
    pub ready: ReadyOptions,
    /// The served API description, made once.
    pub openapi: Bytes,
}

/// What the HTTP layer enforces around the handlers.
#[derive(Clone, Default)]
pub struct RouterOptions {
    pub max_request_bytes: usize,
    pub keys: ApiKeys,
    pub request_timeout: Option<Duration>,
    /// How long a request's body may take to arrive after its headers (none: no limit of its own).
    pub body_read_timeout: Option<Duration>,
    pub cors_origins: Vec<String>,
    pub ready: ReadyOptions,
    /// A test hook: bytes every request keeps for ever (a planted leak for the soak; 0, the default: none).
    pub test_leak_bytes_per_request: usize,
}

/// The router with an open API, no timeout and no CORS (for embedders; the server uses `router_with`).
pub fn router(service: Arc<Service>, metrics: Arc<Metrics>, max_request_bytes: usize) -> Router {
    router_with(
        service,
        metrics,
        RouterOptions {
            max_request_bytes,
            ..RouterOptions::default()
        },
    )
    .expect("no CORS origins to parse")
}

fn cors(origins: &[String]) -> anyhow::Result<Option<CorsLayer>> {
    // An empty JOINTSPACE_CORS_ORIGINS (as a ConfigMap may carry) means none.
    let origins: Vec<&String> = origins.iter().filter(|o| !o.trim().is_empty()).collect();
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o.trim() == "*") {
        AllowOrigin::any()
    } else {
        let list = origins
            .iter()
            .map(|o| HeaderValue::from_str(o.trim()).with_context(|| format!("CORS origin {o:?}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        AllowOrigin::list(list)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static("idempotency-key"),
            ])
            .expose_headers([
                header::RETRY_AFTER,
                HeaderName::from_static("x-request-id"),
                HeaderName::from_static("idempotent-replayed"),
            ])
            .max_age(Duration::from_secs(3600)),
    ))
}

/// The outermost layers, the edge of every request: its id (the client's x-request-id or a fresh UUID, echoed
/// back), its log line and span, and a panic answered 500 instead of dropping the connection.
fn request_edges(app: Router<AppState>) -> Router<AppState> {
    app
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            // One line per request at info (method, path, status, latency), in a span with the request id
            // (the client's x-request-id, or a fresh UUID), so every log line of a request can be found.
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    let id = req
                        .extensions()
                        .get::<RequestId>()
                        .and_then(|r| r.header_value().to_str().ok())
                        .unwrap_or("-");
                    tracing::info_span!("request", request_id = %id, method = %req.method(), uri = %req.uri(), key = tracing::field::Empty)
                })
                .on_response(DefaultOnResponse::new().level(Level::INFO)),
        )
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error; the request was not applied",
            )
            .into_response()
        }))
}

/// The API around `service`, recording into `metrics` (the registry the service was opened with).
pub fn router_with(
    service: Arc<Service>,
    metrics: Arc<Metrics>,
    opts: RouterOptions,
) -> anyhow::Result<Router> {
    let max_request_bytes = opts.max_request_bytes;
    let state = AppState {
        service,
        http: Arc::new(HttpMetrics::register(&metrics)),
        metrics,
        ready: opts.ready,
        openapi: openapi::yaml().into(),
    };
    let table = routes::table();
    let infos = routes::infos(&table);
    let app = routes::router(table)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(
            Idempotency {
                service: state.service.clone(),
                routes: infos.clone(),
                max_request_bytes,
                running: Default::default(),
            },
            middleware::idempotency::idempotency,
        ))
        .layer(DefaultBodyLimit::max(max_request_bytes))
        .layer(from_fn_with_state(
            BodyLimit(max_request_bytes),
            middleware::body_limit::check_length,
        ))
        .layer(from_fn_with_state(
            BodyTimeout {
                limit: opts.body_read_timeout,
            },
            middleware::body_timeout::body_timeout,
        ))
        .layer(from_fn_with_state(
            KeyCheck {
                keys: opts.keys,
                routes: infos.clone(),
                metrics: state.http.clone(),
            },
            middleware::auth::require_key,
        ))
        .layer(from_fn_with_state(
            Timeout {
                limit: opts.request_timeout,
                routes: infos,
            },
            middleware::timeout::timeout,
        ))
        .layer(from_fn_with_state(
            state.clone(),
            middleware::observe::observe,
        ));
    let app = if opts.test_leak_bytes_per_request > 0 {
        app.layer(from_fn_with_state(
            opts.test_leak_bytes_per_request,
            middleware::test_leak::leak,
        ))
    } else {
        app
    };
    let app = match cors(&opts.cors_origins)? {
        Some(c) => app.layer(c),
        None => app,
    };
    Ok(request_edges(app).with_state(state))
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route {} {}; see /openapi.yaml",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}
