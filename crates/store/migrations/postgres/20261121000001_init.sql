-- Postgres twin of migrations/sqlite/20261121000001_init.sql (same tables and meaning; see there).
-- Ids come from identity columns and are never reused.

CREATE TABLE collections (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    description TEXT NOT NULL DEFAULT '',
    created_at  TEXT NOT NULL,
    generation  BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE images (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    collection_id BIGINT NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    external_id   TEXT,
    -- jsonb: metadata filters use containment (`@>`).
    metadata      JSONB NOT NULL DEFAULT '{}',
    width         BIGINT NOT NULL,
    height        BIGINT NOT NULL,
    code          BYTEA NOT NULL,
    vector        BYTEA NOT NULL,
    bundle_id     TEXT NOT NULL,
    vision_id     TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    UNIQUE (collection_id, external_id)
);
CREATE INDEX images_collection ON images (collection_id, id);

CREATE TABLE captions (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    collection_id BIGINT NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    image_id      BIGINT REFERENCES images(id) ON DELETE CASCADE,
    text          TEXT NOT NULL,
    vector        BYTEA NOT NULL,
    bundle_id     TEXT NOT NULL,
    created_at    TEXT NOT NULL
);
CREATE INDEX captions_collection ON captions (collection_id, id);
CREATE INDEX captions_image ON captions (image_id);
