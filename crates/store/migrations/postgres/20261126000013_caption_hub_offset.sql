-- Postgres twin of migrations/sqlite/20261126000013_caption_hub_offset.sql (DOUBLE PRECISION, as for images).
ALTER TABLE captions ADD COLUMN hub_offset DOUBLE PRECISION NOT NULL DEFAULT 0;
