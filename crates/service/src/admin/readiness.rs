//! Readiness: whether this process should be sent traffic. Ready only when both ONNX Runtime sessions
//! answer (a probe through each worker's queue, unless a run just succeeded; the verdict kept for a second,
//! so frequent probes do not run the models each time), every collection in the database has its indexes
//! loaded, no full rebuild is under way, the indexes have followed the database within the allowed lag, and
//! the database answers. Each part that fails says why.

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use crate::Service;
use crate::runtime::Provider;

/// How long a probe verdict is reused, and how recent a successful run must be to stand in for a probe.
const PROBE_TTL: Duration = Duration::from_secs(1);

/// What readiness demands.
#[derive(Debug, Clone, Copy)]
pub struct ReadyOptions {
    /// Longest wait for a probe inference, and for each of the database's answers.
    pub probe_timeout: Duration,
    /// Longest time since the indexes last followed the database; none when this process does not follow
    /// it (its own writes are then its only ones).
    pub max_lag: Option<Duration>,
}

impl Default for ReadyOptions {
    /// As `serve`'s defaults, for a process that does not follow the database (nothing runs the follower).
    fn default() -> Self {
        ReadyOptions {
            probe_timeout: Duration::from_millis(2000),
            max_lag: None,
        }
    }
}

/// Each part's verdict: Ok, or what is wrong, in a sentence for the operator.
#[derive(Debug, Clone)]
pub struct ReadinessReport {
    pub provider: Provider,
    pub vision: Result<(), String>,
    pub text: Result<(), String>,
    pub database: Result<(), String>,
    pub index: Result<(), String>,
}

impl ReadinessReport {
    pub fn ready(&self) -> bool {
        [&self.vision, &self.text, &self.database, &self.index]
            .iter()
            .all(|c| c.is_ok())
    }
}

/// The inference workers' last verdicts and when they were reached.
pub(crate) type ProbeCache = tokio::sync::Mutex<Option<(Instant, [Result<(), String>; 2])>>;

impl Service {
    pub async fn readiness(&self, opts: ReadyOptions) -> ReadinessReport {
        let ([vision, text], database, index) = tokio::join!(
            self.probe_inference(opts.probe_timeout),
            self.database_check(opts.probe_timeout),
            self.index_check(opts),
        );
        ReadinessReport {
            provider: self.pipeline.provider(),
            vision,
            text,
            database,
            index,
        }
    }

    /// Notes that the indexes hold everything committed before `read_at` (a follow step succeeded).
    pub(crate) fn mark_followed(&self, read_at: Instant) {
        let ms = read_at.saturating_duration_since(self.started).as_millis() as u64;
        self.followed_at_ms.fetch_max(ms, Ordering::AcqRel);
    }

    fn follow_lag(&self) -> Duration {
        let at = self.followed_at_ms.load(Ordering::Acquire);
        self.started
            .elapsed()
            .saturating_sub(Duration::from_millis(at))
    }

    async fn probe_inference(&self, timeout: Duration) -> [Result<(), String>; 2] {
        // Held while probing: concurrent readiness checks share one probe.
        let mut cache = self.probes.lock().await;
        if let Some((_, verdict)) = cache.as_ref().filter(|(at, _)| at.elapsed() < PROBE_TTL) {
            return verdict.clone();
        }
        let p = &self.pipeline;
        let (vision, text) = tokio::join!(
            p.probe_vision(PROBE_TTL, timeout),
            p.probe_text(PROBE_TTL, timeout)
        );
        let verdict = [
            vision.map_err(|e| format!("vision graph: {e}")),
            text.map_err(|e| format!("text graph: {e}")),
        ];
        *cache = Some((Instant::now(), verdict.clone()));
        verdict
    }

    async fn database_check(&self, timeout: Duration) -> Result<(), String> {
        match tokio::time::timeout(timeout, self.store.ping()).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!(
                "the database did not answer within {} ms",
                timeout.as_millis()
            )),
        }
    }

    async fn index_check(&self, opts: ReadyOptions) -> Result<(), String> {
        let max_lag = opts.max_lag;
        if self.indexes.is_rebuilding() {
            return Err(
                "the indexes are being rebuilt from the database (a reindex, or a reload after one)"
                    .into(),
            );
        }
        let mut missing = self.unloaded_collections(opts.probe_timeout).await?;
        if !missing.is_empty() && max_lag.is_some() {
            // Made through another replica since the follower last looked: follow now rather than report
            // what the next step would fix anyway.
            if let Err(e) = self.follow_once().await {
                return Err(format!("cannot follow the database: {e}"));
            }
            missing = self.unloaded_collections(opts.probe_timeout).await?;
        }
        if !missing.is_empty() {
            return Err(format!(
                "{} collection(s) without a loaded index: {}",
                missing.len(),
                missing.join(", ")
            ));
        }
        if let Some(max) = max_lag {
            let lag = self.follow_lag();
            if lag > max {
                return Err(format!(
                    "the indexes last caught up with the database {} ms ago (the limit is {} ms): \
                     the change sequence cannot be read or applied",
                    lag.as_millis(),
                    max.as_millis()
                ));
            }
        }
        Ok(())
    }

    async fn unloaded_collections(&self, timeout: Duration) -> Result<Vec<String>, String> {
        let Some(graphs) = self.graphs() else {
            return Ok(vec![]);
        };
        let all = tokio::time::timeout(timeout, self.store.collection_names())
            .await
            .map_err(|_| {
                format!(
                    "cannot list the collections: the database did not answer within {} ms",
                    timeout.as_millis()
                )
            })?
            .map_err(|e| format!("cannot list the collections: {e}"))?;
        Ok(all
            .into_iter()
            .filter(|(id, _)| !graphs.contains(*id))
            .map(|(_, name)| name)
            .collect())
    }
}
