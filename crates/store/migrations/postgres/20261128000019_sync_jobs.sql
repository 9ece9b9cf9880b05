-- Postgres twin of migrations/sqlite/20261128000019_sync_jobs.sql: catalogue feeds sent over HTTP, each run
-- as a job, kept with its feed so another server (or this one after a restart) can run it again.
CREATE TABLE sync_jobs (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    collection_id BIGINT NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    state         TEXT NOT NULL,
    request       TEXT NOT NULL,
    feed          BYTEA NOT NULL,
    items         BIGINT NOT NULL,
    done          BIGINT NOT NULL DEFAULT 0,
    attempts      BIGINT NOT NULL DEFAULT 0,
    report        TEXT,
    error         TEXT,
    created_at    TEXT NOT NULL,
    started_at    TEXT,
    finished_at   TEXT,
    heartbeat_at  TEXT
);
CREATE UNIQUE INDEX sync_jobs_active ON sync_jobs (collection_id) WHERE state IN ('queued', 'running');
CREATE INDEX sync_jobs_state ON sync_jobs (state, heartbeat_at);
