//! Health, readiness, metrics, the API description, the loaded bundle, and admin operations.

use axum::{
    Json,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
};
use serde::Serialize;
use utoipa::{OpenApi, ToSchema};

use super::{
    ApiDoc, AppState,
    error::{ApiResult, ErrorBody},
};
use crate::bundle::Similarity;

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    pub ready: bool,
    pub bundle: bool,
    pub database: bool,
    pub index: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[utoipa::path(get, path = "/healthz", tag = "system", responses((status = 200, description = "the process is up", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

#[utoipa::path(get, path = "/readyz", tag = "system",
    responses((status = 200, body = Readiness), (status = 503, description = "not ready", body = Readiness)))]
pub async fn readyz(State(s): State<AppState>) -> (StatusCode, Json<Readiness>) {
    // The bundle and the indexes are loaded before the listener opens; the database is checked live.
    let db = s.service.ping_database().await;
    let ready = db.is_ok();
    let r = Readiness {
        ready,
        bundle: true,
        database: ready,
        index: true,
        message: db.err().map(|e| e.to_string()),
    };
    (
        if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        Json(r),
    )
}

#[utoipa::path(get, path = "/metrics", tag = "system", responses((status = 200, description = "Prometheus text format", body = String)))]
pub async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.service.metrics().render(),
    )
}

/// The served API description; `openapi.yaml` in the repository must be identical (a test checks it).
pub fn openapi_yaml() -> String {
    ApiDoc::openapi().to_yaml().unwrap_or_default()
}

#[utoipa::path(get, path = "/openapi.yaml", tag = "system", responses((status = 200, description = "this API, OpenAPI 3.1", body = Object, content_type = "application/yaml")))]
pub async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/yaml")], openapi_yaml())
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BundleInfo {
    pub id: String,
    pub name: String,
    pub created: String,
    pub similarity: Similarity,
    pub joint_dim: usize,
    pub fne_dim: usize,
    pub crop_mode: String,
    /// The execution provider that runs the graphs.
    pub provider: String,
    /// The trainer's provenance and test metrics, as in bundle.json.
    #[schema(value_type = Object)]
    pub training: serde_json::Value,
}

#[utoipa::path(get, path = "/v1/bundle", tag = "system", responses((status = 200, body = BundleInfo)))]
pub async fn bundle(State(s): State<AppState>) -> Json<BundleInfo> {
    let p = s.service.pipeline();
    let m = &p.bundle.manifest;
    Json(BundleInfo {
        id: p.bundle.id.clone(),
        name: m.name.clone(),
        created: m.created.clone(),
        similarity: m.similarity,
        joint_dim: m.projection.joint_dim,
        fne_dim: m.fne.dim,
        crop_mode: format!("{:?}", p.crop_mode).to_lowercase(),
        provider: p.provider().ort_name().to_string(),
        training: m.training.clone(),
    })
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReindexReport {
    pub images: usize,
    pub captions: usize,
}

#[utoipa::path(post, path = "/v1/admin/reindex", tag = "admin",
    responses((status = 200, description = "every vector recomputed: images from their stored codes and the loaded W, captions with the loaded text model", body = ReindexReport),
              (status = 422, description = "stored codes come from another vision model", body = ErrorBody)))]
pub async fn reindex(State(s): State<AppState>) -> ApiResult<Json<ReindexReport>> {
    let (images, captions) = s.service.reindex().await?;
    Ok(Json(ReindexReport { images, captions }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotReport {
    pub indexes: usize,
}

#[utoipa::path(post, path = "/v1/admin/snapshot", tag = "admin",
    responses((status = 200, description = "index snapshots written", body = SnapshotReport)))]
pub async fn snapshot(State(s): State<AppState>) -> ApiResult<Json<SnapshotReport>> {
    Ok(Json(SnapshotReport {
        indexes: s.service.snapshot().await?,
    }))
}
