-- Postgres twin of migrations/sqlite/20261126000014_idempotency_heartbeat.sql: the last sign of life of a request
-- still running under an Idempotency-Key (NULL on older rows: their created_at stands in).
ALTER TABLE idempotency ADD COLUMN heartbeat_at TEXT;
