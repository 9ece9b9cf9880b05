-- The change sequence: one row per write, in the same transaction as the data, so that every process on
-- this database can bring its in-memory index up to date by applying the rows after the last one it saw
-- (src/service/follow.rs). SQLite serialises writers, so `seq` order is commit order here.
CREATE TABLE changes (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    collection_id INTEGER NOT NULL,
    -- 'collection', 'image', 'caption', or 'all' (a reindex rewrote every vector).
    kind          TEXT NOT NULL,
    -- 'upsert' or 'delete'.
    op            TEXT NOT NULL,
    item_id       INTEGER NOT NULL,
    created_at    TEXT NOT NULL
);
