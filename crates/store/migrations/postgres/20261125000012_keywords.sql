-- Postgres twin of migrations/sqlite/20261125000012_keywords.sql: the keyword index of hybrid search, one
-- row per image, full-text searched through a GIN index on its English tsvector.
CREATE TABLE image_text (
    image_id      BIGINT PRIMARY KEY REFERENCES images(id) ON DELETE CASCADE,
    collection_id BIGINT NOT NULL,
    body          TEXT NOT NULL,
    tsv           tsvector GENERATED ALWAYS AS (to_tsvector('english', body)) STORED
);
CREATE INDEX image_text_tsv ON image_text USING GIN (tsv);

ALTER TABLE collections ADD COLUMN text_fields TEXT;

-- Punctuation as space, as src/store/keywords.rs writes it.
INSERT INTO image_text (image_id, collection_id, body)
SELECT i.id, i.collection_id,
       regexp_replace(
           COALESCE((SELECT string_agg(c.text, ' ' ORDER BY c.id) FROM captions c WHERE c.image_id = i.id), '')
               || ' ' || COALESCE(i.external_id, ''),
           '[^[:alnum:]]+', ' ', 'g')
FROM images i;
