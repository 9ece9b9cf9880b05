//! A collection's text fields, read by meaning: the first sentences of each field its `text_fields` declare
//! (with a weight above 0) are embedded by the bundle's text model when an image is written and stored as
//! captions of the image tagged with the field, so the caption index (in memory or in Postgres), replicas,
//! reindex and annotation carry them as they carry written captions. A sentence search's text channel ranks
//! images by their nearest such caption, its similarity times its field's weight. A write embeds only the
//! sentences that are not stored already: a text-only change costs one text-model pass, never the CNN.

use std::collections::HashSet;

use serde_json::Value;

use crate::{
    Result, Service, TextField,
    filter::FieldPath,
    store::{EmbeddedCaption, ImageRow},
};

/// At most this many sentences of each field are embedded: a product's name and the opening of its
/// description say what it is; the rest of a long description blurs a recurrent encoder's one vector.
pub(crate) const SENTENCES_PER_FIELD: usize = 3;

/// The longest sentence embedded, in characters (cut at a word boundary).
const MAX_SENTENCE_CHARS: usize = 300;

/// The (field, sentence) pairs an image's metadata gives the collection's text fields read by meaning, in
/// field order.
pub(crate) fn field_sentences(
    fields: Option<&[TextField]>,
    metadata: &Value,
) -> Vec<(String, String)> {
    let mut out = vec![];
    for f in fields.unwrap_or_default().iter().filter(|f| f.by_meaning()) {
        let Ok(path) = FieldPath::parse(&f.path) else {
            continue;
        };
        let texts: Vec<&str> = match path.get(metadata) {
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let sentences = texts.into_iter().flat_map(sentences);
        let mut seen = HashSet::new();
        for s in sentences
            .filter(|s| seen.insert(s.clone()))
            .take(SENTENCES_PER_FIELD)
        {
            out.push((f.path.clone(), s));
        }
    }
    out
}

/// The sentences of a text: split after `.`, `!` or `?` followed by a space, and at line breaks; trimmed;
/// the empty ones dropped; each at most `MAX_SENTENCE_CHARS`.
fn sentences(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut start = 0;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (k, (i, c)) in chars.iter().enumerate() {
        let next_is_space = chars.get(k + 1).is_none_or(|(_, n)| n.is_whitespace());
        if *c == '\n' || (matches!(c, '.' | '!' | '?') && next_is_space) {
            out.push(&text[start..*i + c.len_utf8()]);
            start = i + c.len_utf8();
        }
    }
    out.push(&text[start..]);
    out.into_iter()
        .map(|s| cut(s.trim()))
        .filter(|s| s.chars().any(char::is_alphanumeric))
        .collect()
}

/// `s` cut to at most `MAX_SENTENCE_CHARS` characters, at the last space before the limit.
fn cut(s: &str) -> String {
    if s.chars().count() <= MAX_SENTENCE_CHARS {
        return s.to_string();
    }
    let end = s
        .char_indices()
        .nth(MAX_SENTENCE_CHARS)
        .map_or(s.len(), |(i, _)| i);
    let head = &s[..end];
    head[..head.rfind(' ').unwrap_or(end)].to_string()
}

impl Service {
    /// The embedded sentences of each metadata's text fields (`metadatas` in order), in one text-model pass;
    /// a (field, sentence) in `stored` is not embedded again but marked to keep (`EmbeddedCaption::kept_field`).
    /// A sentence the tokenizer refuses is left out: a field's text must never make a write fail.
    pub(crate) async fn embed_fields(
        &self,
        fields: Option<&[TextField]>,
        metadatas: &[&Value],
        stored: &HashSet<(String, String)>,
    ) -> Result<Vec<Vec<EmbeddedCaption>>> {
        let mut out: Vec<Vec<EmbeddedCaption>> = Vec::with_capacity(metadatas.len());
        // Where each sentence to embed goes: (image, position), in the order of `tokens`.
        let (mut tokens, mut slots) = (vec![], vec![]);
        for m in metadatas {
            let mut sentences = vec![];
            for (field, text) in field_sentences(fields, m) {
                if stored.contains(&(field.clone(), text.clone())) {
                    sentences.push(EmbeddedCaption::kept_field(field, text));
                } else if let Ok(mut ids) = self.pipeline.tokenize([&text]) {
                    tokens.push(ids.remove(0));
                    slots.push((out.len(), sentences.len()));
                    sentences.push(EmbeddedCaption::kept_field(field, text));
                }
            }
            out.push(sentences);
        }
        if tokens.is_empty() {
            return Ok(out);
        }
        let vectors = self.embed_tokens(tokens).await?;
        for ((i, j), (vector, offset)) in slots
            .into_iter()
            .zip(self.with_caption_offsets(vectors).await?)
        {
            out[i][j].vector = vector;
            out[i][j].offset = offset;
        }
        Ok(out)
    }

    /// The (field, sentence) pairs stored for an image under the loaded bundle (what a change need not embed).
    pub(crate) async fn stored_fields(
        &self,
        collection_id: i64,
        image: &ImageRow,
    ) -> Result<HashSet<(String, String)>> {
        Ok(self
            .store
            .field_captions(collection_id, image.id, &self.pipeline.bundle.id)
            .await?
            .into_iter()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_field_gives_its_first_sentences_and_other_values_nothing() {
        let mut fields = ["name", "description", "brand.name", "tags", "sku"].map(TextField::new);
        // A field of weight 0 is read as keywords only.
        fields[4].weight = 0.0;
        let m = json!({
            "name": "Trail runner",
            "description": "A light shoe for rough ground. Grippy sole!  Made in 2024. Fourth sentence.",
            "brand": {"name": 7},
            "tags": ["waterproof", "red", ""],
            "sku": "TR-2024",
            "price": 80
        });
        assert_eq!(
            field_sentences(Some(&fields), &m),
            [
                ("name", "Trail runner"),
                ("description", "A light shoe for rough ground."),
                ("description", "Grippy sole!"),
                ("description", "Made in 2024."),
                ("tags", "waterproof"),
                ("tags", "red"),
            ]
            .map(|(f, s)| (f.to_string(), s.to_string()))
        );
        assert!(field_sentences(None, &m).is_empty());
    }

    #[test]
    fn a_decimal_point_or_a_long_sentence_does_not_break_it_badly() {
        assert_eq!(
            sentences("Size 10.5 boots.\nNew"),
            ["Size 10.5 boots.", "New"]
        );
        let long = "word ".repeat(200);
        let s = sentences(&long);
        assert_eq!(s.len(), 1);
        assert!(
            s[0].len() <= MAX_SENTENCE_CHARS && s[0].ends_with("word"),
            "{}",
            s[0]
        );
    }
}
