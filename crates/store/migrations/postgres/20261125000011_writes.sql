-- Postgres twin of migrations/sqlite/20261125000011_writes.sql: the photo's content digest (upserts) and the
-- answers replayed to retried POSTs (Idempotency-Key).
ALTER TABLE images ADD COLUMN content_hash TEXT;

CREATE TABLE idempotency (
    scope       TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status      INTEGER,
    body        BYTEA,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_created ON idempotency (created_at);

-- How far `jointspace import` got through a file, committed with the rows it added, so an interrupted import
-- resumes after the last batch that committed (and never adds one twice). `source` identifies the file
-- (its length and a digest of its first MiB).
CREATE TABLE imports (
    collection_id BIGINT NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    source        TEXT NOT NULL,
    lines         BIGINT NOT NULL,
    updated_at    TEXT NOT NULL,
    PRIMARY KEY (collection_id, source)
);
