//! The answers kept for retried POSTs (`Idempotency-Key`), handed to the HTTP layer's middleware, which is
//! the only user: the service is the only way up to the store.

use crate::store::{Claim, IdempotencyKey};
use crate::{Result, Service};

impl Service {
    pub async fn claim_idempotency(&self, k: &IdempotencyKey, fingerprint: &str) -> Result<Claim> {
        Ok(self.store.claim_idempotency(k, fingerprint).await?)
    }

    pub async fn beat_idempotency(&self, k: &IdempotencyKey) -> Result<()> {
        Ok(self.store.beat_idempotency(k).await?)
    }

    pub async fn finish_idempotency(
        &self,
        k: &IdempotencyKey,
        status: u16,
        body: &[u8],
    ) -> Result<()> {
        Ok(self.store.finish_idempotency(k, status, body).await?)
    }

    pub async fn release_idempotency(&self, k: &IdempotencyKey) -> Result<()> {
        Ok(self.store.release_idempotency(k).await?)
    }
}
