//! The HTTP API, one module per area. Routes, middleware and the OpenAPI document are assembled here.

pub mod auth;
pub mod captions;
pub mod collections;
pub mod embed;
pub mod error;
pub mod images;
pub mod search;
pub mod system;
pub mod upload;

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context as TaskContext, Poll},
    time::{Duration, Instant},
};

use anyhow::Context;
use axum::{
    Router,
    body::{Body, Bytes, HttpBody},
    extract::{DefaultBodyLimit, MatchedPath, Request, State},
    http::{HeaderName, HeaderValue, Method, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use tower_http::{
    catch_panic::CatchPanicLayer,
    cors::{AllowOrigin, CorsLayer},
    request_id::{MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer},
    trace::{DefaultOnResponse, TraceLayer},
};
use tracing::Level;
use utoipa::{
    OpenApi,
    openapi::{
        Ref, RefOr, ResponseBuilder,
        content::ContentBuilder,
        header::HeaderBuilder,
        path::Operation,
        schema::{ObjectBuilder, Type},
        security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme},
    },
};

use crate::service::Service;
use auth::{Access, ApiKeys};
use error::{ApiError, BodyLimit};

#[derive(Clone)]
pub struct AppState {
    pub service: Arc<Service>,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "jointspace", description = "Find photos from a sentence and sentences for a photo. Errors always have the shape of ErrorBody."),
    paths(
        collections::create, collections::list, collections::get, collections::delete,
        images::add, images::list, images::get, images::delete,
        captions::add, captions::list, captions::delete,
        search::images, search::captions,
        embed::text, embed::image,
        system::healthz, system::readyz, system::metrics, system::openapi, system::bundle, system::reindex, system::snapshot,
    ),
    components(schemas(error::ErrorBody, error::ErrorDetail)),
    modifiers(&NoLicense, &Operational),
    tags((name = "collections"), (name = "images"), (name = "captions"), (name = "search"), (name = "embed"),
         (name = "system"), (name = "admin"))
)]
pub struct ApiDoc;

/// utoipa fills `info.license` from Cargo.toml even when there is none; leave it out instead of empty.
struct NoLicense;

impl utoipa::Modify for NoLicense {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        openapi.info.license = None;
    }
}

/// Documents what the middleware adds to every operation: the API key (and its 401/403), the body limit
/// (413), the inference queue (429 with Retry-After) and the request timeout (503).
struct Operational;

impl utoipa::Modify for Operational {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut bearer = Http::new(HttpAuthScheme::Bearer);
        bearer.description = Some(
            "`Authorization: Bearer <key>`. The admin key may do everything; the read key may GET, search \
             and embed. A server started without keys is open and ignores the header."
                .into(),
        );
        components.add_security_scheme("bearer", SecurityScheme::Http(bearer));
        let error = |description: &str| {
            ResponseBuilder::new().description(description).content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
        };
        let retry_after = HeaderBuilder::new()
            .schema(ObjectBuilder::new().schema_type(Type::Integer))
            .description(Some("seconds to wait before retrying"))
            .build();
        let shared = [
            (
                "Unauthorized",
                error("no API key, or not a valid one (only when the server has keys configured)"),
            ),
            (
                "Forbidden",
                error("the read-only key cannot do this; use the admin key"),
            ),
            (
                "PayloadTooLarge",
                error(
                    "the request body, or an image in it, is over the server's limit; the message states the limit",
                ),
            ),
            (
                "Overloaded",
                error("the inference queue is full (in rows or in expected wait); retry after Retry-After seconds")
                    .header("Retry-After", retry_after.clone()),
            ),
            (
                "Unavailable",
                error("the request ran past the server's timeout, or a dependency is unavailable")
                    .header("Retry-After", retry_after),
            ),
            (
                "BadRequest",
                error(
                    "the path, query or body cannot be parsed (e.g. an id that is not a 64-bit integer)",
                ),
            ),
            (
                "Invalid",
                error(
                    "well-formed but not acceptable (e.g. a collection name outside the allowed pattern)",
                ),
            ),
            (
                "UnsupportedMediaType",
                error(
                    "the body's Content-Type is not one this operation reads; the message says which",
                ),
            ),
        ];
        for (name, r) in shared {
            components
                .responses
                .insert(name.into(), RefOr::T(r.build()));
        }
        let shared = |name: &str| RefOr::Ref(Ref::new(format!("#/components/responses/{name}")));
        for (path, item) in openapi.paths.paths.iter_mut() {
            let ops: [(Method, &mut Option<Operation>); 3] = [
                (Method::GET, &mut item.get),
                (Method::POST, &mut item.post),
                (Method::DELETE, &mut item.delete),
            ];
            for (method, op) in ops {
                let Some(op) = op.as_mut() else { continue };
                let r = &mut op.responses.responses;
                let need = auth::access(&method, path);
                if need == Access::Public {
                    continue;
                }
                // The name rule of service::validate_collection_name, so clients (and fuzzers) can see it.
                for p in op.parameters.iter_mut().flatten() {
                    if p.name == "collection" {
                        p.schema = Some(RefOr::T(
                            ObjectBuilder::new()
                                .schema_type(Type::String)
                                .pattern(Some("^[a-z0-9][a-z0-9_-]{0,63}$"))
                                .into(),
                        ));
                    }
                }
                op.security = Some(vec![SecurityRequirement::new(
                    "bearer",
                    Vec::<String>::new(),
                )]);
                r.insert("401".into(), shared("Unauthorized"));
                r.entry("503".into())
                    .or_insert_with(|| shared("Unavailable"));
                if need == Access::Admin {
                    r.insert("403".into(), shared("Forbidden"));
                }
                // What the extractors answer for any operation: unparsable input, invalid names.
                r.entry("400".into())
                    .or_insert_with(|| shared("BadRequest"));
                r.entry("422".into()).or_insert_with(|| shared("Invalid"));
                if method == Method::POST {
                    r.entry("415".into())
                        .or_insert_with(|| shared("UnsupportedMediaType"));
                    r.entry("413".into())
                        .or_insert_with(|| shared("PayloadTooLarge"));
                }
                // Routes that run a model: embed, search, and adding images or captions.
                let infers = path.starts_with("/v1/embed/")
                    || path.ends_with("/search")
                    || (method == Method::POST
                        && (path.ends_with("/images") || path.ends_with("/captions")));
                if infers {
                    r.insert("429".into(), shared("Overloaded"));
                }
            }
        }
    }
}

/// What the HTTP layer enforces around the handlers.
#[derive(Clone, Default)]
pub struct RouterOptions {
    pub max_request_bytes: usize,
    pub keys: ApiKeys,
    pub request_timeout: Option<Duration>,
    pub cors_origins: Vec<String>,
}

/// The router with an open API, no timeout and no CORS (for embedders; the server uses `router_with`).
pub fn router(service: Arc<Service>, max_request_bytes: usize) -> Router {
    router_with(
        service,
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
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .expose_headers([header::RETRY_AFTER, HeaderName::from_static("x-request-id")])
            .max_age(Duration::from_secs(3600)),
    ))
}

pub fn router_with(service: Arc<Service>, opts: RouterOptions) -> anyhow::Result<Router> {
    let max_request_bytes = opts.max_request_bytes;
    let state = AppState { service };
    let v1 = Router::new()
        .route(
            "/collections",
            post(collections::create).get(collections::list),
        )
        .route(
            "/collections/{collection}",
            get(collections::get).delete(collections::delete),
        )
        .route(
            "/collections/{collection}/images",
            post(images::add).get(images::list),
        )
        .route(
            "/collections/{collection}/images/search",
            post(search::images),
        )
        .route(
            "/collections/{collection}/images/{id}",
            get(images::get).delete(images::delete),
        )
        .route(
            "/collections/{collection}/captions",
            post(captions::add).get(captions::list),
        )
        .route(
            "/collections/{collection}/captions/search",
            post(search::captions),
        )
        .route(
            "/collections/{collection}/captions/{id}",
            axum::routing::delete(captions::delete),
        )
        .route("/embed/text", post(embed::text))
        .route("/embed/image", post(embed::image))
        .route("/bundle", get(system::bundle))
        .route("/admin/reindex", post(system::reindex))
        .route("/admin/snapshot", post(system::snapshot));
    let app = Router::new()
        .route("/healthz", get(system::healthz))
        .route("/readyz", get(system::readyz))
        .route("/metrics", get(system::metrics))
        .route("/openapi.yaml", get(system::openapi))
        .nest("/v1", v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_request_bytes))
        .layer(middleware::from_fn_with_state(
            BodyLimit(max_request_bytes),
            check_length,
        ))
        .layer(middleware::from_fn_with_state(opts.keys, auth::require_key))
        .layer(middleware::from_fn_with_state(
            opts.request_timeout,
            timeout,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), observe));
    let app = match cors(&opts.cors_origins)? {
        Some(c) => app.layer(c),
        None => app,
    };
    Ok(app
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
                    tracing::info_span!("request", request_id = %id, method = %req.method(), uri = %req.uri())
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
        .with_state(state))
}

/// A declared body over the limit is refused before it is read, with the limit in the message.
async fn check_length(State(limit): State<BodyLimit>, mut req: Request, next: Next) -> Response {
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

/// Answers 503 when a request runs past the timeout. A write runs on as its own task and finishes: cancelling
/// it half-way could leave a committed row out of the in-memory index. A read is cancelled.
async fn timeout(State(limit): State<Option<Duration>>, req: Request, next: Next) -> Response {
    let Some(limit) = limit else {
        return next.run(req).await;
    };
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let write = auth::access(&method, &path) == Access::Admin;
    let req = if write {
        // The write's task outlives the 503, so its body gets a deadline of its own: a client that stops
        // sending must not hold the task and its connection open for ever. Handlers read the whole body
        // before they apply anything, so a body cut off here means nothing was stored. The grace keeps the
        // 503 first.
        let (parts, body) = req.into_parts();
        let sleep = Box::pin(tokio::time::sleep(limit + BODY_GRACE));
        Request::from_parts(parts, Body::new(Deadline { body, sleep }))
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

/// A request body that fails when its deadline passes before it has fully arrived. A total deadline, not
/// tower-http's `RequestBodyTimeoutLayer`: that one resets after every frame, so a client trickling a byte at a
/// time would never reach it.
struct Deadline {
    body: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
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
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(
                "the request body did not arrive before the server's timeout",
            )))),
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

/// Counts and times every request by its route template (not the raw path: bounded label values).
async fn observe(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().to_string();
    let t = Instant::now();
    // A guard, so a panicking handler (caught further out) does not leave the gauge up.
    struct InFlight(prometheus_client::metrics::gauge::Gauge);
    impl Drop for InFlight {
        fn drop(&mut self) {
            self.0.dec();
        }
    }
    let g = InFlight(s.service.metrics.http_in_flight().clone());
    g.0.inc();
    let res = next.run(req).await;
    drop(g);
    s.service
        .metrics
        .observe_http(&method, &route, res.status().as_u16(), t.elapsed());
    res
}
