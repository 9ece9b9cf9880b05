-- Metadata filters compile equality and `$in` to containment (`metadata @> '{"k": v}'`), which this index
-- serves: a selective filter's count and exact scan read the matching rows from it instead of every row.
-- jsonb_path_ops: smaller and faster than the default operator class for `@>`, the only operator used on it.
CREATE INDEX images_metadata ON images USING gin (metadata jsonb_path_ops);
