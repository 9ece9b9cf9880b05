//! The answers replayed to retried POSTs (the `Idempotency-Key` header; src/api/middleware/idempotency.rs).
//! They live in the database so that a retry reaching another replica finds them.

use std::time::Duration;

use sqlx::Row;

use super::{Store, StoreError, codec};

/// How long an answer is replayed.
pub const IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How often a running request's server refreshes its claim's `heartbeat_at`.
pub const IDEMPOTENCY_HEARTBEAT: Duration = Duration::from_secs(5);

/// A running claim not refreshed for this long lost its server (six missed heartbeats: a slow database
/// delays a beat, it does not drop six).
pub const IDEMPOTENCY_LEASE: Duration = Duration::from_secs(30);

/// A client's `Idempotency-Key` within its scope (the caller's key name and the path): the same key in
/// another scope is another key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    pub scope: String,
    pub key: String,
}

/// What a request with an idempotency key is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is new (or its answer expired): run the request, then `finish_idempotency`.
    Run,
    /// The first request with this key succeeded: answer this.
    Replay { status: u16, body: Vec<u8> },
    /// The first request with this key has not finished.
    InFlight,
    /// The first request with this key has no answer and no heartbeat since `since` (older than
    /// `IDEMPOTENCY_LEASE`): the server running it stopped, and whether it was applied is unknown.
    Abandoned { since: String },
    /// The key was used for a different request.
    Mismatch,
}

impl Store {
    /// Claims `k` for a request with digest `fingerprint`, in one transaction: a key seen within the
    /// retention period answers what it answered, any other is taken for this request.
    pub async fn claim_idempotency(
        &self,
        k: &IdempotencyKey,
        fingerprint: &str,
    ) -> Result<Claim, StoreError> {
        let mut tx = self.write_tx().await?;
        sqlx::query("DELETE FROM idempotency WHERE scope = $1 AND key = $2 AND created_at < $3")
            .bind(&k.scope)
            .bind(&k.key)
            .bind(codec::rfc3339_ago(IDEMPOTENCY_RETENTION))
            .execute(&mut *tx)
            .await?;
        let inserted = sqlx::query(
            "INSERT INTO idempotency (scope, key, fingerprint, created_at, heartbeat_at) \
             VALUES ($1, $2, $3, $4, $4) ON CONFLICT (scope, key) DO NOTHING",
        )
        .bind(&k.scope)
        .bind(&k.key)
        .bind(fingerprint)
        .bind(codec::now_rfc3339())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let claim = if inserted == 1 {
            Claim::Run
        } else {
            let r = sqlx::query(
                "SELECT fingerprint, status, body, COALESCE(heartbeat_at, created_at) AS beat \
                 FROM idempotency WHERE scope = $1 AND key = $2",
            )
            .bind(&k.scope)
            .bind(&k.key)
            .fetch_one(&mut *tx)
            .await?;
            let (fp, status, body, beat): (String, Option<i64>, Option<Vec<u8>>, String) = (
                r.get("fingerprint"),
                r.get("status"),
                r.get("body"),
                r.get("beat"),
            );
            match status {
                _ if fp != fingerprint => Claim::Mismatch,
                // RFC 3339 UTC timestamps sort as text.
                None if beat < codec::rfc3339_ago(IDEMPOTENCY_LEASE) => {
                    Claim::Abandoned { since: beat }
                }
                None => Claim::InFlight,
                Some(s) => Claim::Replay {
                    status: u16::try_from(s).unwrap_or(200),
                    body: body.unwrap_or_default(),
                },
            }
        };
        tx.commit().await?;
        Ok(claim)
    }

    /// Says that the request that claimed `k` is still running (`IDEMPOTENCY_HEARTBEAT`).
    pub async fn beat_idempotency(&self, k: &IdempotencyKey) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE idempotency SET heartbeat_at = $1 WHERE scope = $2 AND key = $3 AND status IS NULL",
        )
        .bind(codec::now_rfc3339())
        .bind(&k.scope)
        .bind(&k.key)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Keeps the successful answer to the request that claimed `k`.
    pub async fn finish_idempotency(
        &self,
        k: &IdempotencyKey,
        status: u16,
        body: &[u8],
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE idempotency SET status = $1, body = $2 WHERE scope = $3 AND key = $4")
            .bind(i64::from(status))
            .bind(body)
            .bind(&k.scope)
            .bind(&k.key)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Gives `k` up after its request failed (a failed request wrote nothing): a retry runs again.
    pub async fn release_idempotency(&self, k: &IdempotencyKey) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM idempotency WHERE scope = $1 AND key = $2 AND status IS NULL")
            .bind(&k.scope)
            .bind(&k.key)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Forgets answers older than the retention period.
    pub async fn prune_idempotency(&self) -> Result<u64, StoreError> {
        self.delete_older_than("idempotency", IDEMPOTENCY_RETENTION)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::memory;

    #[tokio::test]
    async fn a_key_runs_once_then_replays_and_refuses_another_request() {
        let key = |scope: &str, key: &str| IdempotencyKey {
            scope: scope.into(),
            key: key.into(),
        };
        let k = |name: &str| key("k POST /x", name);
        let store = memory().await;
        let claim = |name: &'static str, fp: &'static str| {
            let store = store.clone();
            async move { store.claim_idempotency(&k(name), fp).await.expect("claim") }
        };
        let finish = |name: &'static str, body: &'static [u8]| {
            let store = store.clone();
            async move { store.finish_idempotency(&k(name), 201, body).await }
        };
        let release = |name: &'static str| {
            let store = store.clone();
            async move { store.release_idempotency(&k(name)).await }
        };
        let beat = |name: &'static str| {
            let store = store.clone();
            async move { store.beat_idempotency(&k(name)).await }
        };
        assert_eq!(claim("k1", "f1").await, Claim::Run);
        assert_eq!(claim("k1", "f1").await, Claim::InFlight);
        assert_eq!(claim("k1", "f2").await, Claim::Mismatch);
        // The same key in another scope is another key.
        assert_eq!(
            store
                .claim_idempotency(&key("other POST /x", "k1"), "f1")
                .await
                .expect("claim"),
            Claim::Run
        );
        finish("k1", b"{\"id\":1}").await.expect("finish");
        assert_eq!(
            claim("k1", "f1").await,
            Claim::Replay {
                status: 201,
                body: b"{\"id\":1}".to_vec()
            }
        );
        // A failed request gives its key back; a finished one keeps it.
        assert_eq!(claim("k2", "f1").await, Claim::Run);
        release("k2").await.expect("release");
        assert_eq!(claim("k2", "f1").await, Claim::Run);
        release("k1").await.expect("release");
        assert!(matches!(claim("k1", "f1").await, Claim::Replay { .. }));
        // A running claim whose heartbeat stopped lost its server; one that beats is still running.
        assert_eq!(claim("k3", "f1").await, Claim::Run);
        let long_ago = codec::rfc3339_ago(IDEMPOTENCY_LEASE + Duration::from_secs(5));
        sqlx::query("UPDATE idempotency SET heartbeat_at = $1 WHERE key = 'k3'")
            .bind(&long_ago)
            .execute(&store.pool)
            .await
            .expect("stop the heartbeat");
        assert_eq!(
            claim("k3", "f1").await,
            Claim::Abandoned {
                since: long_ago.clone()
            }
        );
        assert_eq!(claim("k3", "f2").await, Claim::Mismatch);
        beat("k3").await.expect("beat");
        assert_eq!(claim("k3", "f1").await, Claim::InFlight);
        // A row from before the heartbeat column: its created_at stands in.
        sqlx::query("UPDATE idempotency SET heartbeat_at = NULL, created_at = $1 WHERE key = 'k3'")
            .bind(&long_ago)
            .execute(&store.pool)
            .await
            .expect("an old row");
        assert!(matches!(claim("k3", "f1").await, Claim::Abandoned { .. }));
        // A finished one never beats again.
        finish("k3", b"{}").await.expect("finish");
        beat("k3").await.expect("beat");
        assert!(matches!(claim("k3", "f1").await, Claim::Replay { .. }));
        // Expired answers are forgotten.
        sqlx::query("UPDATE idempotency SET created_at = '2000-01-01T00:00:00Z'")
            .execute(&store.pool)
            .await
            .expect("age");
        assert_eq!(
            claim("k1", "f9").await,
            Claim::Run,
            "an expired key is free again"
        );
        assert_eq!(store.prune_idempotency().await.expect("prune"), 3);
    }
}
