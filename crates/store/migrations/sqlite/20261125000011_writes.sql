-- Upserts and idempotent retries (issue 26, item 4).
--
-- The sha256 of the photo's bytes as they were sent: an upsert whose photo has the same digest keeps the
-- stored code and vector instead of embedding the same pixels again. Rows from before this migration have
-- none, so their first upsert embeds.
ALTER TABLE images ADD COLUMN content_hash TEXT;

-- The first successful answer to a POST sent with an Idempotency-Key, replayed to retries for 24 hours. A
-- row with no status is a request still running. `scope` is the caller's key name and the route, so two
-- tenants' keys never meet; `fingerprint` is a digest of the request, so a key reused for another request is
-- refused instead of answered with the wrong result.
CREATE TABLE idempotency (
    scope       TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status      INTEGER,
    body        BLOB,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_created ON idempotency (created_at);

-- How far `jointspace import` got through a file, committed with the rows it added, so an interrupted import
-- resumes after the last batch that committed (and never adds one twice). `source` identifies the file
-- (its length and a digest of its first MiB).
CREATE TABLE imports (
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    source        TEXT NOT NULL,
    lines         INTEGER NOT NULL,
    updated_at    TEXT NOT NULL,
    PRIMARY KEY (collection_id, source)
);
