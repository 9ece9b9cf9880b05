-- A collection's product key: the metadata field (a dotted path) whose value names the product an image is a
-- photo of. Images sharing a value are one product's photos, and an image search returns each product once,
-- scored by its best photo and its words. NULL: every image stands alone.
ALTER TABLE collections ADD COLUMN group_by TEXT;
