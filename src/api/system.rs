//! Health, readiness, metrics, the API description, the loaded bundle, and admin operations.

use axum::{
    Json,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
};
use serde::Serialize;
use utoipa::ToSchema;

use super::{
    AppState,
    error::{ApiResult, ErrorBody},
};
use crate::{bundle::Similarity, service::REINDEX_PAGE_ROWS};

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    /// The server's release (`jointspace --version`; CHANGELOG.md).
    pub version: String,
}

/// Whether this process should be sent traffic, part by part.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    pub ready: bool,
    /// Both graphs answer (`checks.vision` and `checks.text`).
    pub bundle: bool,
    pub database: bool,
    pub index: bool,
    /// The ONNX Runtime execution provider running the graphs: `cpu` or `cuda`.
    pub execution_provider: String,
    pub checks: ReadyChecks,
    /// The failing checks' reasons, joined; absent when ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReadyChecks {
    /// The vision graph's worker answers a probe inference (or ran a batch within the last second).
    pub vision: Check,
    /// The text graph's worker answers a probe inference (or ran a batch within the last second).
    pub text: Check,
    /// The database answers.
    pub database: Check,
    /// Every collection's indexes are loaded, none is being rebuilt, and they follow the database within
    /// the allowed lag.
    pub index: Check,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Check {
    pub ok: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<&Result<(), String>> for Check {
    fn from(r: &Result<(), String>) -> Check {
        Check {
            ok: r.is_ok(),
            reason: r.as_ref().err().cloned(),
        }
    }
}

#[utoipa::path(get, path = "/healthz", tag = "system",
    responses((status = 200, description = "the process is up", body = Health),
              (status = 503, description = "an inference worker has stopped and never comes back: restart the process", body = Health)))]
pub async fn healthz(State(s): State<AppState>) -> (StatusCode, Json<Health>) {
    match s.service.stopped_worker() {
        None => (
            StatusCode::OK,
            Json(Health {
                status: "ok".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            }),
        ),
        Some(worker) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Health {
                status: format!(
                    "the {worker} inference worker has stopped (see the log); restart the process"
                ),
                version: env!("CARGO_PKG_VERSION").into(),
            }),
        ),
    }
}

#[utoipa::path(get, path = "/readyz", tag = "system",
    responses((status = 200, description = "ready: every check passes", body = Readiness),
              (status = 503, description = "not ready: the failing checks say why", body = Readiness)))]
pub async fn readyz(State(s): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let r = s.service.readiness(s.ready).await;
    let ready = r.ready();
    let reasons: Vec<&str> = [&r.vision, &r.text, &r.database, &r.index]
        .into_iter()
        .filter_map(|c| c.as_ref().err().map(String::as_str))
        .collect();
    let body = Readiness {
        ready,
        bundle: r.vision.is_ok() && r.text.is_ok(),
        database: r.database.is_ok(),
        index: r.index.is_ok(),
        execution_provider: r.provider.as_str().to_string(),
        checks: ReadyChecks {
            vision: (&r.vision).into(),
            text: (&r.text).into(),
            database: (&r.database).into(),
            index: (&r.index).into(),
        },
        message: (!reasons.is_empty()).then(|| reasons.join("; ")),
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}

#[utoipa::path(get, path = "/metrics", tag = "system", responses((status = 200, description = "Prometheus text format", body = String)))]
pub async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

#[utoipa::path(get, path = "/openapi.yaml", tag = "system", responses((status = 200, description = "this API, OpenAPI 3.1", body = Object, content_type = "application/yaml")))]
pub async fn openapi(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/yaml")],
        s.openapi.clone(),
    )
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BundleInfo {
    pub id: String,
    pub name: String,
    pub created: String,
    pub similarity: Similarity,
    pub joint_dim: usize,
    /// Features in the ternary code (every backbone's together).
    pub fne_dim: usize,
    /// The first backbone's crop mode.
    pub crop_mode: String,
    /// Each vision backbone, in the order their codes are concatenated.
    pub backbones: Vec<BackboneInfo>,
    /// The execution provider that runs the graphs.
    pub provider: String,
    /// The trainer's provenance and test metrics, as in bundle.json.
    #[schema(value_type = Object)]
    pub training: serde_json::Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BackboneInfo {
    /// The bundle's name for it (`vision.backbone`).
    pub backbone: String,
    pub crop_mode: String,
    /// Its features in the code.
    pub fne_dim: usize,
}

#[utoipa::path(get, path = "/v1/bundle", tag = "system", responses((status = 200, body = BundleInfo)))]
pub async fn bundle(State(s): State<AppState>) -> Json<BundleInfo> {
    let m = s.service.model();
    Json(BundleInfo {
        id: m.bundle_id,
        name: m.name,
        created: m.created,
        similarity: m.similarity,
        joint_dim: m.joint_dim,
        fne_dim: m.fne_dim,
        crop_mode: format!("{:?}", m.crop_mode).to_lowercase(),
        backbones: m
            .backbones
            .into_iter()
            .map(|b| BackboneInfo {
                backbone: b.backbone,
                crop_mode: format!("{:?}", b.crop_mode).to_lowercase(),
                fne_dim: b.fne_dim,
            })
            .collect(),
        provider: m.provider.to_string(),
        training: m.training,
    })
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReindexReport {
    /// Images whose vectors were switched to the loaded bundle (recomputed from their stored codes).
    pub images: u64,
    /// Captions re-embedded with the loaded text model.
    pub captions: u64,
    /// Rows an interrupted reindex under the same bundle had staged, reused rather than recomputed.
    pub resumed: u64,
}

#[utoipa::path(post, path = "/v1/admin/reindex", tag = "admin",
    responses((status = 200, description = "every vector of another bundle recomputed (images from their stored codes and the loaded W, captions with the loaded text model), staged, then switched in by one transaction: until then searches see the old vectors, and a reindex interrupted part-way resumes from what it staged", body = ReindexReport),
              (status = 422, description = "stored codes come from another vision model", body = ErrorBody)))]
pub async fn reindex(State(s): State<AppState>) -> ApiResult<Json<ReindexReport>> {
    let r = s.service.reindex(REINDEX_PAGE_ROWS).await?;
    Ok(Json(ReindexReport {
        images: r.images,
        captions: r.captions,
        resumed: r.resumed,
    }))
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
