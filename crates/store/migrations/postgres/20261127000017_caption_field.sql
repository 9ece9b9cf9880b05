-- A collection's text fields searched by meaning: each sentence of a declared field's value is embedded by the
-- text model and stored as a caption of its image, tagged here with the field's path. NULL: a caption someone
-- wrote. Tagged captions are derived from the metadata (rewritten when it changes, never exported) and kept out
-- of the keyword text, which reads the fields themselves.
ALTER TABLE captions ADD COLUMN field TEXT;
