//! The HTTP API, one module per area. Routes, middleware and the OpenAPI document are assembled here.

pub mod captions;
pub mod collections;
pub mod embed;
pub mod error;
pub mod images;
pub mod search;
pub mod system;
pub mod upload;

use std::{sync::Arc, time::Instant};

use axum::{
    Router,
    extract::{DefaultBodyLimit, MatchedPath, Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use tower_http::{
    catch_panic::CatchPanicLayer,
    trace::{DefaultMakeSpan, DefaultOnResponse, TraceLayer},
};
use tracing::Level;
use utoipa::OpenApi;

use crate::service::Service;
use error::ApiError;

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
    modifiers(&NoLicense),
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

pub fn router(service: Arc<Service>, max_request_bytes: usize) -> Router {
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
    Router::new()
        .route("/healthz", get(system::healthz))
        .route("/readyz", get(system::readyz))
        .route("/metrics", get(system::metrics))
        .route("/openapi.yaml", get(system::openapi))
        .nest("/v1", v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(DefaultBodyLimit::max(max_request_bytes))
        .layer(
            // One line per request at info: method, path, status, latency.
            TraceLayer::new_for_http()
                .make_span_with(DefaultMakeSpan::new().level(Level::INFO))
                .on_response(DefaultOnResponse::new().level(Level::INFO)),
        )
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error; the request was not applied",
            )
            .into_response()
        }))
        .with_state(state)
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
    let res = next.run(req).await;
    s.service
        .metrics
        .observe_http(&method, &route, res.status().as_u16(), t.elapsed());
    res
}
