-- Catalogue feeds sent over HTTP (POST /v1/collections/{name}/sync), each run as a job by whichever server
-- claims it. The feed is kept with the job so a job whose server stopped (no heartbeat for the lease) is
-- claimed and run again from the start by another server, or by the same one after a restart: every write
-- of a sync is idempotent, so a second run converges. At most one queued or running job per collection.
CREATE TABLE sync_jobs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    -- queued, running, succeeded, failed
    state         TEXT NOT NULL,
    -- The options and the feed's field mapping, JSON.
    request       TEXT NOT NULL,
    feed          BLOB NOT NULL,
    -- Images the feed asks for, and how many of them this run has handled.
    items         INTEGER NOT NULL,
    done          INTEGER NOT NULL DEFAULT 0,
    attempts      INTEGER NOT NULL DEFAULT 0,
    -- The report (JSON) once finished, and why it failed.
    report        TEXT,
    error         TEXT,
    created_at    TEXT NOT NULL,
    started_at    TEXT,
    finished_at   TEXT,
    heartbeat_at  TEXT
);
CREATE UNIQUE INDEX sync_jobs_active ON sync_jobs (collection_id) WHERE state IN ('queued', 'running');
CREATE INDEX sync_jobs_state ON sync_jobs (state, heartbeat_at);
