-- The last sign of life of a request still running under an Idempotency-Key: its server refreshes it every few
-- seconds (src/api/middleware/idempotency.rs), so a retry can tell a request still running (409, retry) from
-- one whose server stopped while running it (409, check and use a new key). NULL on rows from before this
-- migration: their created_at stands in.
ALTER TABLE idempotency ADD COLUMN heartbeat_at TEXT;
