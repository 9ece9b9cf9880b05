-- Every start counts the stored images per (bundle, vision model) to warn about vectors of another bundle: with
-- this index the count reads the index alone instead of every row (0.52 s -> 0.07 s at 1M images, Postgres).
CREATE INDEX images_provenance ON images (bundle_id, vision_id);
