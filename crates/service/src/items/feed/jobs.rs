//! Feeds sent over HTTP, run as jobs. Queuing reads and checks the whole feed first (a bad line is refused
//! with nothing queued), then keeps it in the database with its options; every server runs a worker that
//! claims queued jobs one at a time and keeps a heartbeat while it runs one. A job whose heartbeat stops for
//! the lease (its server crashed or was stopped) is claimed again, here after a restart or by another
//! replica, and run from the start: each write is idempotent, so the second run converges, and the job says
//! `succeeded` only once a run has finished every item and deletion. Its report is then that run's, so
//! items written before the interruption count as unchanged there.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use futures::future::{BoxFuture, Either};
use serde::{Deserialize, Serialize};

use super::{
    FeedPhoto,
    apply::{SyncOptions, SyncProgress},
    plan::by_photo,
    read::{FeedMapping, FeedSource, read_feed},
    report::SyncReport,
};
use crate::{
    CollectionName, Result, Service, ServiceError,
    store::{ClaimedJob, JobRow, JobState},
};

/// Items a job's sync reads and writes at once.
const JOB_CONCURRENCY: usize = 4;

/// What a sync job is asked to do, kept with it as JSON so any server can run it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncRequest {
    pub collection: String,
    /// How the feed is named in the report (a URL, or the request body).
    pub feed: String,
    pub mapping: FeedMapping,
    pub dry_run: bool,
    pub max_delete_share: f64,
    pub skip_failed: bool,
}

/// A sync job as callers see it.
#[derive(Debug, Clone)]
pub struct SyncJob {
    pub id: i64,
    pub collection: String,
    pub state: JobState,
    pub dry_run: bool,
    /// The items its sync handles (each photo of a product is one), and how many the running attempt has.
    pub items: i64,
    pub done: i64,
    pub attempts: i64,
    pub report: Option<SyncReport>,
    pub error: Option<String>,
    pub created_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

impl SyncJob {
    fn of(row: JobRow, collection: &str) -> Result<SyncJob> {
        let request: SyncRequest = serde_json::from_str(&row.request)
            .map_err(|e| ServiceError::Internal(format!("sync job {}: {e}", row.id)))?;
        let report = row
            .report
            .as_deref()
            .map(serde_json::from_str::<SyncReport>)
            .transpose()
            .map_err(|e| ServiceError::Internal(format!("sync job {} report: {e}", row.id)))?;
        Ok(SyncJob {
            id: row.id,
            collection: collection.to_string(),
            state: row.state,
            dry_run: request.dry_run,
            items: row.items,
            done: row.done,
            attempts: row.attempts,
            report,
            error: row.error,
            created_at: row.created_at,
            started_at: row.started_at,
            finished_at: row.finished_at,
        })
    }
}

/// A running job's progress, read by its heartbeat.
#[derive(Default)]
struct JobProgress {
    done: AtomicUsize,
}

impl SyncProgress for JobProgress {
    fn item_done(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

impl Service {
    /// Queues a sync of `collection` to `feed`: read and checked whole first (bad lines refused, naming each;
    /// photos by path refused, and by URL while URL ingest is off), one job per collection at a time.
    pub async fn queue_sync(
        &self,
        collection: &CollectionName,
        feed: Bytes,
        request: SyncRequest,
    ) -> Result<SyncJob> {
        let c = self.writable_ref(collection).await?;
        check_share(request.max_delete_share)?;
        let source = FeedSource {
            name: None,
            dir: None,
        };
        let products = read_feed(&feed, &request.mapping, &source)?;
        let urls = products
            .iter()
            .any(|p| p.photos.iter().any(|f| matches!(f, FeedPhoto::Url(_))));
        if urls && self.opts.url_fetcher.is_none() {
            return Err(ServiceError::Invalid(
                "the feed gives photos by URL and URL ingest is off on this server (start it with \
                 --url-ingest), or give each photo as a data: URL"
                    .into(),
            ));
        }
        let settings = self.feed_settings(collection, None).await?;
        let items = by_photo(products, &settings)?.len() as i64;
        let json = serde_json::to_string(&request)
            .map_err(|e| ServiceError::Internal(format!("a sync request as JSON: {e}")))?;
        let row = self.store.queue_job(c.id, &json, &feed, items).await?;
        SyncJob::of(row, collection.as_str())
    }

    /// The sync job `id` of `collection`.
    pub async fn sync_job(&self, collection: &CollectionName, id: i64) -> Result<SyncJob> {
        let c = self.collection_ref(collection).await?;
        let row = self.store.job(c.id, id).await?;
        SyncJob::of(row, collection.as_str())
    }

    /// Claims and runs sync jobs, one at a time, until the task is dropped: queued ones, and running ones whose
    /// heartbeat is older than `lease` (their server stopped). Looks for one every `poll` when idle.
    pub async fn run_sync_jobs(self: Arc<Self>, lease: Duration, poll: Duration) {
        let mut failing = false;
        let mut polls: u64 = 0;
        loop {
            polls += 1;
            if polls % 600 == 1 {
                match self.store.prune_jobs().await {
                    Ok(0) | Err(_) => {}
                    Ok(n) => tracing::debug!(jobs = n, "finished sync jobs pruned"),
                }
            }
            match self.claim_sync_job(lease).await {
                Ok(Some(job)) => {
                    failing = false;
                    self.run_job(job, lease).await;
                    continue;
                }
                Ok(None) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "cannot look for sync jobs; retrying");
                }
                Err(_) => {}
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Claims the oldest claimable job of a collection this server can write (a replica that has not loaded a
    /// collection yet leaves its jobs to the others).
    async fn claim_sync_job(&self, lease: Duration) -> Result<Option<ClaimedJob>> {
        for (id, collection_id) in self.store.claimable_jobs(lease).await? {
            if self.memory_indexes(collection_id).is_err() {
                continue;
            }
            if let Some(job) = self.store.claim_job(id, lease).await? {
                return Ok(Some(job));
            }
        }
        Ok(None)
    }

    /// Runs one claimed job to its end, beating every sixth of `lease`; gives it up (to whoever claimed it
    /// since) when a beat finds it is no longer this attempt's.
    async fn run_job(&self, claimed: ClaimedJob, lease: Duration) {
        let (id, attempt) = (claimed.job.id, claimed.job.attempts);
        let request: SyncRequest = match serde_json::from_str(&claimed.job.request) {
            Ok(r) => r,
            Err(e) => {
                let why = format!("the job's request cannot be read: {e}");
                let _ = self
                    .store
                    .finish_job(id, attempt, JobState::Failed, 0, "null", Some(&why))
                    .await;
                return;
            }
        };
        tracing::info!(job = id, attempt, collection = %request.collection, "sync job started");
        self.set_running_job(Some((id, attempt)));
        let progress = JobProgress::default();
        let mut report = SyncReport {
            feed: request.feed.clone(),
            ..SyncReport::default()
        };
        let started = std::time::Instant::now();
        // Boxed as Send futures: the worker is a spawned task.
        let run: BoxFuture<'_, Result<()>> =
            Box::pin(self.run_request(&request, &claimed.feed, &mut report, &progress));
        let beat: BoxFuture<'_, ()> = Box::pin(self.beat_until_lost(id, attempt, lease, &progress));
        let outcome = match futures::future::select(run, beat).await {
            Either::Left((r, _)) => {
                self.set_running_job(None);
                r
            }
            Either::Right(((), _)) => {
                self.set_running_job(None);
                tracing::warn!(
                    job = id,
                    attempt,
                    "sync job taken over by another server; this run stops"
                );
                return;
            }
        };
        report.seconds = started.elapsed().as_secs_f64();
        let done = progress.done.load(Ordering::Relaxed) as i64;
        let (state, error) = match &outcome {
            Ok(()) => (JobState::Succeeded, None),
            Err(e) => (JobState::Failed, Some(e.to_string())),
        };
        let json = serde_json::to_string(&report).unwrap_or_else(|_| "null".into());
        match self
            .store
            .finish_job(id, attempt, state, done, &json, error.as_deref())
            .await
        {
            Ok(_) => tracing::info!(job = id, state = state.as_str(), "sync job finished"),
            // Left running: once its lease passes it is claimed and run again, which converges.
            Err(e) => tracing::warn!(job = id, error = %e, "cannot record the sync job's end"),
        }
    }

    fn set_running_job(&self, job: Option<(i64, i64)>) {
        *self
            .running_job
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = job;
    }

    /// Hands the sync job this process was running back to the queue (call it once the worker is stopped, at
    /// shutdown): another replica, or this server's next start, runs it at once instead of after the lease.
    pub async fn release_sync_job(&self) {
        let job = self
            .running_job
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some((id, attempt)) = job {
            match self.store.release_job(id, attempt).await {
                Ok(true) => tracing::info!(job = id, "sync job handed back to the queue"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(job = id, error = %e, "cannot hand the sync job back; it is run again after its lease")
                }
            }
        }
    }

    /// Beats for the job every sixth of `lease` with its progress; returns once the job is no longer this
    /// attempt's.
    async fn beat_until_lost(
        &self,
        id: i64,
        attempt: i64,
        lease: Duration,
        progress: &JobProgress,
    ) {
        let mut tick = tokio::time::interval(lease / 6);
        loop {
            tick.tick().await;
            let done = progress.done.load(Ordering::Relaxed) as i64;
            match self.store.beat_job(id, attempt, done).await {
                Ok(false) => return,
                Ok(true) => {}
                Err(e) => tracing::warn!(job = id, error = %e, "sync job heartbeat failed"),
            }
        }
    }

    async fn run_request(
        &self,
        request: &SyncRequest,
        feed: &[u8],
        report: &mut SyncReport,
        progress: &JobProgress,
    ) -> Result<()> {
        let collection = CollectionName::parse(&request.collection)?;
        let source = FeedSource {
            name: None,
            dir: None,
        };
        let products = read_feed(feed, &request.mapping, &source)?;
        let opts = SyncOptions {
            dry_run: request.dry_run,
            max_delete_share: request.max_delete_share,
            skip_failed: request.skip_failed,
            concurrency: JOB_CONCURRENCY,
            create: None,
        };
        self.sync_feed(&collection, products, &opts, report, progress)
            .await
    }
}

/// A deletion share, 0 to 1.
pub(super) fn check_share(share: f64) -> Result<()> {
    if (0.0..=1.0).contains(&share) {
        return Ok(());
    }
    Err(ServiceError::Invalid(format!(
        "max_delete_share is a share of the collection, 0 to 1 (0.2: at most a fifth of it); got {share}"
    )))
}
