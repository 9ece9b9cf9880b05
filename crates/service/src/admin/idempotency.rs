//! The answers kept for retried POSTs (`Idempotency-Key`), handed to the HTTP layer's middleware, which is
//! the only user: the service is the only way up to the store.

use crate::store::Claim;
use crate::{Result, Service};

impl Service {
    pub async fn claim_idempotency(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
    ) -> Result<Claim> {
        Ok(self
            .store
            .claim_idempotency(scope, key, fingerprint)
            .await?)
    }

    pub async fn beat_idempotency(&self, scope: &str, key: &str) -> Result<()> {
        Ok(self.store.beat_idempotency(scope, key).await?)
    }

    pub async fn finish_idempotency(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &[u8],
    ) -> Result<()> {
        Ok(self
            .store
            .finish_idempotency(scope, key, status, body)
            .await?)
    }

    pub async fn release_idempotency(&self, scope: &str, key: &str) -> Result<()> {
        Ok(self.store.release_idempotency(scope, key).await?)
    }
}
