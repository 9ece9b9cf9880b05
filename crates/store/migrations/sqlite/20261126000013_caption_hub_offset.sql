-- Each caption's search offset (docs/bundle.md, "The annotation side"): added to an image query's score for the
-- caption. Derived from the vector and the bundle's image bank, like the images' hub_offset; 0 without a bank.
ALTER TABLE captions ADD COLUMN hub_offset REAL NOT NULL DEFAULT 0;
