//! Running the service rather than serving a request: `reindex` (vectors recomputed under a new bundle),
//! `follow` (other replicas' writes, read from the change sequence), `readiness` (what `/readyz` reports),
//! `warm` (the first requests' buffers and pages, before the listener opens), `idempotency` (answers kept for
//! retried POSTs).

pub(crate) mod follow;
pub(crate) mod idempotency;
pub(crate) mod readiness;
pub(crate) mod reindex;
pub(crate) mod warm;
