//! Catalogue feeds run as jobs (`sync_jobs`): a job is queued with its feed, claimed by one server, kept alive
//! by that server's heartbeat and finished with its report. A running job whose heartbeat is older than the
//! lease lost its server and may be claimed again; at most one job per collection is queued or running (a
//! unique index says so, so two servers cannot both take a second one).

use std::time::Duration;

use sqlx::{Row, any::AnyRow};

use super::{Store, StoreError, codec, conflict_or};

/// Finished jobs are kept this long, then pruned.
pub const JOB_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Result<JobState, StoreError> {
        Ok(match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "succeeded" => JobState::Succeeded,
            "failed" => JobState::Failed,
            other => {
                return Err(StoreError::Invalid(format!(
                    "a sync job in an unknown state {other:?}"
                )));
            }
        })
    }
}

/// A job as stored, without its feed.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub id: i64,
    pub collection_id: i64,
    pub state: JobState,
    /// The options and the feed's mapping (JSON, the service's to read).
    pub request: String,
    pub items: i64,
    pub done: i64,
    /// How many times a server has started it (more than one: resumed after its server stopped).
    pub attempts: i64,
    /// The report (JSON) once finished.
    pub report: Option<String>,
    pub error: Option<String>,
    pub created_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

const COLUMNS: &str = "id, collection_id, state, request, items, done, attempts, report, error, \
                       created_at, started_at, finished_at";

fn job_row(r: &AnyRow) -> Result<JobRow, StoreError> {
    Ok(JobRow {
        id: r.get("id"),
        collection_id: r.get("collection_id"),
        state: JobState::parse(&r.get::<String, _>("state"))?,
        request: r.get("request"),
        items: r.get("items"),
        done: r.get("done"),
        attempts: r.get("attempts"),
        report: r.get("report"),
        error: r.get("error"),
        created_at: r.get("created_at"),
        started_at: r.get("started_at"),
        finished_at: r.get("finished_at"),
    })
}

/// A job claimed by this server: its row and its feed.
pub struct ClaimedJob {
    pub job: JobRow,
    pub feed: Vec<u8>,
}

impl Store {
    /// Queues a job on `collection_id`; a Conflict naming the job already queued or running there, if any.
    pub async fn queue_job(
        &self,
        collection_id: i64,
        request: &str,
        feed: &[u8],
        items: i64,
    ) -> Result<JobRow, StoreError> {
        let id: Result<i64, sqlx::Error> = sqlx::query(
            "INSERT INTO sync_jobs (collection_id, state, request, feed, items, created_at) \
             VALUES ($1, 'queued', $2, $3, $4, $5) RETURNING id",
        )
        .bind(collection_id)
        .bind(request)
        .bind(feed)
        .bind(items)
        .bind(codec::now_rfc3339())
        .fetch_one(&self.pool)
        .await
        .map(|r| r.get("id"));
        match id {
            Ok(id) => self.job(collection_id, id).await,
            Err(e) => {
                let active = self.active_job(collection_id).await.ok().flatten();
                Err(conflict_or(e, || match active {
                    Some(j) => format!(
                        "sync job {} is {} on this collection; one runs at a time",
                        j.id,
                        j.state.as_str()
                    ),
                    None => "another sync job is queued or running on this collection".into(),
                }))
            }
        }
    }

    /// The job `id` of `collection_id`.
    pub async fn job(&self, collection_id: i64, id: i64) -> Result<JobRow, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM sync_jobs WHERE collection_id = $1 AND id = $2");
        let row = sqlx::query(&sql)
            .bind(collection_id)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(r) => job_row(&r),
            None => Err(StoreError::NotFound(format!(
                "no sync job {id} on this collection"
            ))),
        }
    }

    /// The job queued or running on `collection_id`, if any.
    pub async fn active_job(&self, collection_id: i64) -> Result<Option<JobRow>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM sync_jobs WHERE collection_id = $1 AND state IN ('queued', 'running')"
        );
        let row = sqlx::query(&sql)
            .bind(collection_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_row).transpose()
    }

    /// The jobs a server may claim, oldest first, as (job id, collection id): queued ones, and running ones with
    /// no heartbeat for `lease` (their server stopped).
    pub async fn claimable_jobs(&self, lease: Duration) -> Result<Vec<(i64, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, collection_id FROM sync_jobs WHERE state = 'queued' \
             OR (state = 'running' AND heartbeat_at < $1) ORDER BY id LIMIT 100",
        )
        .bind(codec::rfc3339_ago(lease))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("id"), r.get("collection_id")))
            .collect())
    }

    /// Claims job `id` if it is still claimable (see `claimable_jobs`): marks it running with a fresh heartbeat
    /// and one more attempt. None when another server claimed it first.
    pub async fn claim_job(
        &self,
        id: i64,
        lease: Duration,
    ) -> Result<Option<ClaimedJob>, StoreError> {
        let now = codec::now_rfc3339();
        // The condition in the update itself: of two servers that read the same candidate, one wins.
        let claimed = sqlx::query(
            "UPDATE sync_jobs SET state = 'running', attempts = attempts + 1, done = 0, heartbeat_at = $1, \
             started_at = COALESCE(started_at, $1) \
             WHERE id = $2 AND (state = 'queued' OR (state = 'running' AND heartbeat_at < $3))",
        )
        .bind(&now)
        .bind(id)
        .bind(codec::rfc3339_ago(lease))
        .execute(&self.pool)
        .await?
        .rows_affected();
        if claimed == 0 {
            return Ok(None);
        }
        let sql = format!("SELECT {COLUMNS}, feed FROM sync_jobs WHERE id = $1");
        let r = sqlx::query(&sql).bind(id).fetch_one(&self.pool).await?;
        Ok(Some(ClaimedJob {
            job: job_row(&r)?,
            feed: r.get("feed"),
        }))
    }

    /// The running job's heartbeat and progress. False when the job is no longer this attempt's to run
    /// (another server claimed it after a missed lease, or the collection was deleted).
    pub async fn beat_job(&self, id: i64, attempt: i64, done: i64) -> Result<bool, StoreError> {
        let n = sqlx::query(
            "UPDATE sync_jobs SET heartbeat_at = $1, done = $2 \
             WHERE id = $3 AND attempts = $4 AND state = 'running'",
        )
        .bind(codec::now_rfc3339())
        .bind(done)
        .bind(id)
        .bind(attempt)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Finishes this attempt of the job with its report (and, when it failed, why).
    pub async fn finish_job(
        &self,
        id: i64,
        attempt: i64,
        state: JobState,
        done: i64,
        report: &str,
        error: Option<&str>,
    ) -> Result<bool, StoreError> {
        let n = sqlx::query(
            "UPDATE sync_jobs SET state = $1, done = $2, report = $3, error = $4, finished_at = $5, \
             heartbeat_at = $5 WHERE id = $6 AND attempts = $7 AND state = 'running'",
        )
        .bind(state.as_str())
        .bind(done)
        .bind(report)
        .bind(error)
        .bind(codec::now_rfc3339())
        .bind(id)
        .bind(attempt)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Hands this attempt's job back to the queue (its server is shutting down): the next server to look claims
    /// it at once instead of after the lease. False when it is no longer this attempt's.
    pub async fn release_job(&self, id: i64, attempt: i64) -> Result<bool, StoreError> {
        let n = sqlx::query(
            "UPDATE sync_jobs SET state = 'queued', done = 0 \
             WHERE id = $1 AND attempts = $2 AND state = 'running'",
        )
        .bind(id)
        .bind(attempt)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Forgets finished jobs older than `JOB_RETENTION`.
    pub async fn prune_jobs(&self) -> Result<u64, StoreError> {
        let n = sqlx::query(
            "DELETE FROM sync_jobs WHERE state IN ('succeeded', 'failed') AND finished_at < $1",
        )
        .bind(codec::rfc3339_ago(JOB_RETENTION))
        .execute(&self.pool)
        .await?;
        Ok(n.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store_with_collection() -> (Store, i64) {
        let store = crate::testing::memory().await;
        let c = store
            .create_collection("shop", "")
            .await
            .expect("collection");
        (store, c.id)
    }

    #[tokio::test]
    async fn one_job_at_a_time_per_collection_claimed_once_and_again_after_its_lease() {
        let (store, c) = store_with_collection().await;
        let job = store
            .queue_job(c, "{}", b"id,image\n", 3)
            .await
            .expect("queued");
        assert_eq!(job.state, JobState::Queued);
        let second = store.queue_job(c, "{}", b"x", 1).await;
        assert!(
            matches!(&second, Err(StoreError::Conflict(m)) if m.contains(&format!("sync job {} is queued", job.id))),
            "{:?}",
            second.err()
        );

        let lease = Duration::from_secs(30);
        assert_eq!(
            store.claimable_jobs(lease).await.expect("jobs"),
            [(job.id, c)]
        );
        let claimed = store
            .claim_job(job.id, lease)
            .await
            .expect("claim")
            .expect("a job");
        assert_eq!((claimed.job.id, claimed.job.attempts), (job.id, 1));
        assert_eq!(claimed.feed, b"id,image\n");
        assert!(
            store
                .claim_job(job.id, lease)
                .await
                .expect("claim")
                .is_none(),
            "a running job with a fresh heartbeat is not claimed again"
        );
        assert!(store.claimable_jobs(lease).await.expect("jobs").is_empty());
        assert!(store.beat_job(job.id, 1, 2).await.expect("beat"));
        assert_eq!(store.job(c, job.id).await.expect("job").done, 2);
        // Handed back at a shutdown, it is queued again and claimed at once, one attempt more.
        assert!(store.release_job(job.id, 1).await.expect("release"));
        assert_eq!(
            store.job(c, job.id).await.expect("job").state,
            JobState::Queued
        );
        let back = store
            .claim_job(job.id, lease)
            .await
            .expect("claim")
            .expect("queued again");
        assert_eq!(back.job.attempts, 2);
        assert!(
            !store.beat_job(job.id, 1, 3).await.expect("beat"),
            "the old attempt is done"
        );

        // Its server stopped: past the lease, another claim takes it, and the old attempt can no longer
        // beat or finish it. (Heartbeats are stamped to the second.)
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let again = store
            .claim_job(job.id, Duration::ZERO)
            .await
            .expect("claim")
            .expect("the stale job");
        assert_eq!(
            (again.job.id, again.job.attempts, again.job.done),
            (job.id, 3, 0)
        );
        assert!(!store.beat_job(job.id, 2, 3).await.expect("beat"));
        assert!(
            !store
                .finish_job(job.id, 2, JobState::Succeeded, 3, "{}", None)
                .await
                .expect("finish")
        );
        assert!(
            store
                .finish_job(job.id, 3, JobState::Failed, 1, "{\"x\":1}", Some("why"))
                .await
                .expect("finish")
        );
        let done = store.job(c, job.id).await.expect("job");
        assert_eq!(done.state, JobState::Failed);
        assert_eq!(done.error.as_deref(), Some("why"));
        assert!(done.finished_at.is_some());
        // Finished, it can no longer be handed back.
        assert!(!store.release_job(job.id, 3).await.expect("release"));
        // Finished, it no longer holds the collection: the next job is queued.
        assert!(store.queue_job(c, "{}", b"x", 1).await.is_ok());
        assert!(matches!(
            store.job(c, job.id + 100).await,
            Err(StoreError::NotFound(_))
        ));
    }
}
