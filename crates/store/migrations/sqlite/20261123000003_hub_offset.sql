-- Each image's search offset (docs/bundle.md, "The hubness section"): added to a caption query's score for the
-- image. Derived from the vector and the bundle's bank, like the vector from the code; 0 without a bank. A
-- bundle change marks the rows stale through bundle_id, and a reindex recomputes both.
ALTER TABLE images ADD COLUMN hub_offset REAL NOT NULL DEFAULT 0;
