-- Each stored image's thumbnail (a small JPEG, longest side 256 px; src/thumbnail.rs), keyed by image id and
-- deleted with it. A table of its own so that scans of `images` (index builds, filters) never read them, and
-- in the database so that replicas serve them as they are and an export carries them. Images ingested with
-- --thumbnails off, or before this migration, have no row here.
CREATE TABLE thumbnails (
    image_id INTEGER PRIMARY KEY REFERENCES images(id) ON DELETE CASCADE,
    data     BLOB NOT NULL
);
