-- The keyword index of hybrid search (issue 26, item 1): one row per image (rowid = image id) holding its
-- captions, its external id and the metadata fields its collection declares searchable, kept by the same
-- transactions that write them (src/store/keywords.rs). FTS5 with the Porter stemmer: "running dogs" finds
-- "a dog runs".
CREATE VIRTUAL TABLE image_text USING fts5(body, collection_id UNINDEXED, tokenize = 'porter unicode61');

-- The metadata fields a collection searches by keyword (a JSON array of dotted paths; captions and external
-- ids always are). NULL: the collection did not ask for keyword search, so its sentence searches default to
-- vector mode; any array (even empty) makes them default to hybrid.
ALTER TABLE collections ADD COLUMN text_fields TEXT;

INSERT INTO image_text (rowid, body, collection_id)
SELECT i.id,
       COALESCE((SELECT group_concat(c.text, ' ') FROM captions c WHERE c.image_id = i.id), '')
           || ' ' || COALESCE(i.external_id, ''),
       i.collection_id
FROM images i;
