-- The change sequence (see migrations/sqlite/20261121000002_changes.sql), written in the same transaction
-- as the data. Here several transactions write at once, and `seq` values are handed out before commit, so
-- a later seq can become visible before an earlier one. Readers therefore go by `txid`, the writing
-- transaction's id: every transaction below the current snapshot's xmin has finished, so the rows with
-- txid < xmin are final and can be consumed in windows [last xmin, xmin) without missing a late commit.
CREATE TABLE changes (
    seq           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    collection_id BIGINT NOT NULL,
    kind          TEXT NOT NULL,
    op            TEXT NOT NULL,
    item_id       BIGINT NOT NULL,
    created_at    TEXT NOT NULL,
    txid          BIGINT NOT NULL DEFAULT (pg_current_xact_id()::text::bigint)
);
CREATE INDEX changes_txid ON changes (txid);
