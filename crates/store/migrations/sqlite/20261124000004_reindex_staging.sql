-- A reindex writes its new vectors here first and switches them into images and captions in one
-- transaction (src/store/reindex.rs): a crash part-way leaves the old vectors everywhere, and the rows staged
-- so far are reused when the reindex is run again under the same bundle.
CREATE TABLE reindex_staging (
    -- 'images' or 'captions'.
    modality   TEXT NOT NULL,
    item_id    INTEGER NOT NULL,
    -- The bundle the vector was computed with; rows of any other bundle are dropped when a reindex starts.
    bundle_id  TEXT NOT NULL,
    vector     BLOB NOT NULL,
    -- An image's search offset (0 for captions).
    hub_offset REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (modality, item_id)
);
