//! A catalogue feed sent over HTTP: `POST /v1/collections/{collection}/sync` with the feed in the body (CSV
//! or JSON lines, by its Content-Type) or by URL (a JSON body `{"url": ...}`, fetched under URL ingest's
//! guard), answered 202 with a job that `GET .../sync/{job}` follows. The feed is read and checked before the
//! job is queued, so a bad line is a 422 naming it and nothing is queued; the sync itself is the service's
//! (`Service::sync_feed`), the one `jointspace sync` runs.

use axum::{
    Json,
    body::Bytes,
    extract::{FromRequest, Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{
    AppState,
    error::{ApiError, ApiResult, BodyLimit, ErrorBody, body_too_large},
    extract::{ApiQuery, CollectionPath, ItemPath},
};
use crate::service::{
    self, DEFAULT_MAX_DELETE_SHARE, FeedFormat, FeedMapping, JobState, SyncRequest,
};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SyncQuery {
    /// Say what would change, write nothing (the job's report lists the changes).
    #[serde(default)]
    pub dry_run: bool,
    /// The largest share of the collection's items (those with an external id) the feed may withdraw, 0 to
    /// 1 (default 0.2); a feed that leaves out more is refused whole, nothing written.
    pub max_delete_share: Option<f64>,
    /// Leave an item whose photo cannot be had as stored and go on (else the sync stops there, deleting
    /// nothing).
    #[serde(default)]
    pub skip_failed: bool,
    /// The field holding the product's id (default `id`).
    pub id_field: Option<String>,
    /// The field holding the photo's http(s) or data: URL, or a list of them (default `image`).
    pub image_field: Option<String>,
    /// The field holding captions (default `captions`): a JSON array of strings, in CSV separated by `|`.
    pub captions_field: Option<String>,
    /// Fields whose text is also added as a caption, comma-separated.
    pub caption_fields: Option<String>,
    /// CSV columns read as numbers, comma-separated.
    pub number_fields: Option<String>,
}

/// A feed given by URL.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SyncFromUrl {
    /// An http(s) URL serving the feed (URL ingest on; the same address guard as images). Its format is read
    /// from its first character: `{` for JSON lines, else CSV.
    pub url: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SyncJobState {
    /// Waiting for a server to run it.
    Queued,
    /// A server is running it (its heartbeat is fresh; a job whose server stopped is run again).
    Running,
    /// Every item and withdrawal was applied (or, in a dry run, reported).
    Succeeded,
    /// It stopped: `error` says why, the report says what was done.
    Failed,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SyncJob {
    pub id: i64,
    pub collection: String,
    pub state: SyncJobState,
    pub dry_run: bool,
    /// The items the sync handles (each photo of a product is one).
    pub items: i64,
    /// How many of them the running attempt has handled.
    pub done: i64,
    /// How many times a server started it (more than 1: run again after its server stopped).
    pub attempts: i64,
    pub created_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Once finished: what the sync did (or, in a dry run, would do).
    pub report: Option<SyncReport>,
    /// Why it failed.
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SyncReport {
    /// Products in the feed.
    pub items: usize,
    pub added: u64,
    /// New photos, embedded (under a new id).
    pub replaced: u64,
    /// The same photos coded by another bundle's vision model, embedded again by the loaded one.
    pub reembedded: u64,
    /// Text or attributes changed, the photo kept: written without the CNN.
    pub updated: u64,
    pub unchanged: u64,
    pub deleted: u64,
    pub failed: Vec<SyncFailure>,
    /// Images without an external id, which no feed line can name: left as they are.
    pub left_without_external_id: i64,
    /// Photos the CNN embedded (0 in a dry run, and when only text changed).
    pub photos_embedded: u64,
    /// Sentences the text model embedded (captions and text fields added or changed).
    pub sentences_embedded: u64,
    /// Why the deletion guard refused the feed; nothing was written then.
    pub refused: Option<String>,
    pub seconds: f64,
    /// Every change made (or that a dry run would make), unchanged items left out.
    pub changes: Vec<SyncAction>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SyncFailure {
    pub line: usize,
    pub external_id: String,
    pub reason: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SyncAction {
    /// The feed's line (none for a withdrawal).
    pub line: Option<usize>,
    pub external_id: String,
    /// `add`, `replace`, `reembed`, `update` or `delete`.
    pub action: String,
}

impl From<service::SyncReport> for SyncReport {
    fn from(r: service::SyncReport) -> Self {
        SyncReport {
            items: r.items,
            added: r.added,
            replaced: r.replaced,
            reembedded: r.reembedded,
            updated: r.updated,
            unchanged: r.unchanged,
            deleted: r.deleted,
            failed: r
                .failed
                .into_iter()
                .map(|f| SyncFailure {
                    line: f.line,
                    external_id: f.external_id,
                    reason: f.reason,
                })
                .collect(),
            left_without_external_id: r.left_without_external_id,
            photos_embedded: r.photos_embedded,
            sentences_embedded: r.sentences_embedded,
            refused: r.refused,
            seconds: r.seconds,
            changes: r
                .changes
                .into_iter()
                .map(|a| SyncAction {
                    line: a.line,
                    external_id: a.external_id,
                    action: a.action,
                })
                .collect(),
        }
    }
}

impl From<service::SyncJob> for SyncJob {
    fn from(j: service::SyncJob) -> Self {
        SyncJob {
            id: j.id,
            collection: j.collection,
            state: match j.state {
                JobState::Queued => SyncJobState::Queued,
                JobState::Running => SyncJobState::Running,
                JobState::Succeeded => SyncJobState::Succeeded,
                JobState::Failed => SyncJobState::Failed,
            },
            dry_run: j.dry_run,
            items: j.items,
            done: j.done,
            attempts: j.attempts,
            created_at: j.created_at,
            started_at: j.started_at,
            finished_at: j.finished_at,
            report: j.report.map(Into::into),
            error: j.error,
        }
    }
}

/// A comma-separated list, blanks left out.
fn list(s: Option<&str>) -> Vec<String> {
    s.unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(String::from)
        .collect()
}

/// What the body is: a feed of a format, or a URL to fetch one from.
enum Sent {
    Feed(FeedFormat),
    Url,
}

fn sent(headers: &HeaderMap) -> ApiResult<Sent> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = ct.split(';').next().unwrap_or_default().trim();
    match essence.to_ascii_lowercase().as_str() {
        "text/csv" => Ok(Sent::Feed(FeedFormat::Csv)),
        "application/x-ndjson" | "application/jsonl" | "application/json-lines" => {
            Ok(Sent::Feed(FeedFormat::Jsonl))
        }
        "application/json" => Ok(Sent::Url),
        _ => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "the body is {}: send the feed as text/csv or application/x-ndjson (JSON lines), or \
                 {{\"url\": ...}} as application/json",
                if ct.is_empty() { "untyped" } else { ct }
            ),
        )),
    }
}

#[utoipa::path(post, path = "/v1/collections/{collection}/sync", tag = "collections", operation_id = "sync_collection",
    params(("collection" = String, Path, description = "collection name"), SyncQuery),
    request_body(content(
        (String = "text/csv"),
        (String = "application/x-ndjson"),
        (SyncFromUrl = "application/json"),
    ), description = "The catalogue, every product the collection should hold: CSV (a header row naming the columns, then one product per record), JSON lines (one object per product), or a URL serving either. Photos are http(s) URLs (URL ingest on) or data: URLs; a product with several photos needs a collection grouped by a product key."),
    responses(
        (status = 202, description = "queued; follow it at the Location", body = SyncJob,
         headers(("Location" = String, description = "the job's URL"))),
        (status = 404, body = ErrorBody),
        (status = 409, description = "a sync job is already queued or running on this collection (its id in the message)", body = ErrorBody),
        (status = 422, description = "bad lines (each named, up to 20; nothing queued), a path instead of a URL, photos by URL with URL ingest off, a feed URL that could not be fetched, or a bad option", body = ErrorBody)))]
pub async fn start(
    State(s): State<AppState>,
    CollectionPath(collection): CollectionPath,
    ApiQuery(q): ApiQuery<SyncQuery>,
    req: Request,
) -> ApiResult<Response> {
    let kind = sent(req.headers())?;
    let limit = req.extensions().get::<BodyLimit>().copied();
    let body = match Bytes::from_request(req, &()).await {
        Ok(b) => b,
        Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(body_too_large(limit));
        }
        Err(r) => return Err(ApiError::bad_request(r.body_text())),
    };
    let (format, feed, named) = match kind {
        Sent::Feed(f) => (f, body, "the request body".to_string()),
        Sent::Url => {
            let from: SyncFromUrl = serde_json::from_slice(&body).map_err(|e| {
                ApiError::bad_request(format!("the body is not {{\"url\": \"...\"}}: {e}"))
            })?;
            let max = limit.map_or(64 << 20, |l| l.0);
            let feed = s.service.fetch_feed(&from.url, max).await?;
            let format = FeedFormat::sniff(&feed[..feed.len().min(4096)]);
            (format, feed, crate::fetch::redacted(&from.url))
        }
    };
    let defaults = FeedMapping::new(format);
    let request = SyncRequest {
        collection: collection.to_string(),
        feed: named,
        mapping: FeedMapping {
            format,
            id_field: q.id_field.unwrap_or(defaults.id_field),
            image_field: q.image_field.unwrap_or(defaults.image_field),
            captions_field: q.captions_field.unwrap_or(defaults.captions_field),
            caption_fields: list(q.caption_fields.as_deref()),
            number_fields: list(q.number_fields.as_deref()),
        },
        dry_run: q.dry_run,
        max_delete_share: q.max_delete_share.unwrap_or(DEFAULT_MAX_DELETE_SHARE),
        skip_failed: q.skip_failed,
    };
    let job = s.service.queue_sync(&collection, feed, request).await?;
    let location = format!("/v1/collections/{collection}/sync/{}", job.id);
    let mut r = (StatusCode::ACCEPTED, Json(SyncJob::from(job))).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

#[utoipa::path(get, path = "/v1/collections/{collection}/sync/{job}", tag = "collections", operation_id = "get_sync_job",
    params(("collection" = String, Path, description = "collection name"), ("job" = i64, Path, description = "the job's id")),
    responses((status = 200, body = SyncJob), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(s): State<AppState>,
    ItemPath(collection, job): ItemPath<i64>,
) -> ApiResult<Json<SyncJob>> {
    Ok(Json(s.service.sync_job(&collection, job).await?.into()))
}
