-- Postgres twin of migrations/sqlite/20261124000010_thumbnails.sql: each stored image's thumbnail, keyed by
-- image id and deleted with it.
CREATE TABLE thumbnails (
    image_id BIGINT PRIMARY KEY REFERENCES images(id) ON DELETE CASCADE,
    data     BYTEA NOT NULL
);
