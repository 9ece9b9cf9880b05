-- The database is the source of truth; every HNSW index can be rebuilt from it.
-- Portable SQL except AUTOINCREMENT (Postgres: GENERATED ALWAYS AS IDENTITY). Ids are never reused: the
-- HNSW graphs keep deleted ids hidden until a rebuild, and clients may hold ids.

CREATE TABLE collections (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL UNIQUE,
    description TEXT NOT NULL DEFAULT '',
    created_at  TEXT NOT NULL,
    -- Bumped by every write to the collection; an index snapshot is fresh iff it records the same value.
    generation  INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE images (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    external_id   TEXT,
    metadata      TEXT NOT NULL DEFAULT '{}',
    width         INTEGER NOT NULL,
    height        INTEGER NOT NULL,
    -- Packed ternary FNE code (docs/bundle.md): what makes a reindex without the CNN possible.
    code          BLOB NOT NULL,
    -- Joint vector, float32 little-endian; derived from code and the bundle's W.
    vector        BLOB NOT NULL,
    bundle_id     TEXT NOT NULL,
    vision_id     TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    UNIQUE (collection_id, external_id)
);
CREATE INDEX images_collection ON images (collection_id, id);

CREATE TABLE captions (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    image_id      INTEGER REFERENCES images(id) ON DELETE CASCADE,
    text          TEXT NOT NULL,
    vector        BLOB NOT NULL,
    bundle_id     TEXT NOT NULL,
    created_at    TEXT NOT NULL
);
CREATE INDEX captions_collection ON captions (collection_id, id);
CREATE INDEX captions_image ON captions (image_id);
