//! Sentence -> token ids, and padding a batch of them. Depends on no other module of the crate, so the fuzz
//! targets (fuzz/) compile it on its own.

use std::path::Path;

use tokenizers::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error(
        "the text is empty or only whitespace; send a sentence such as \"a dog running on the beach\""
    )]
    Empty,
    #[error("the text is {chars} characters long; the limit is {max}")]
    TooLong { chars: usize, max: usize },
    #[error("the text \"{0}\" has no tokens the model can read")]
    NoTokens(String),
    #[error("cannot load tokenizer {path}: {message}")]
    Load { path: String, message: String },
    #[error("tokenizer failed: {0}")]
    Tokenize(String),
}

pub struct TextTokenizer {
    tokenizer: Tokenizer,
    max_tokens: usize,
    max_chars: usize,
}

impl TextTokenizer {
    /// The tokenizer in `path` (a Hugging Face tokenizer.json), ids cut to `max_tokens`.
    pub fn from_file(
        path: &Path,
        max_tokens: usize,
        max_chars: usize,
    ) -> Result<TextTokenizer, TextError> {
        let tokenizer = Tokenizer::from_file(path).map_err(|e| TextError::Load {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(TextTokenizer {
            tokenizer,
            max_tokens,
            max_chars,
        })
    }

    /// Token ids run from 0 to this (exclusive), added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Validates and tokenises one sentence: ids cut to `max_tokens`, no special tokens added.
    pub fn ids(&self, text: &str) -> Result<Vec<i64>, TextError> {
        Ok(self.sentence(text)?.ids)
    }

    /// One sentence read once: its ids (as `ids`) and the words it reads as unknown (as `unknown_words`),
    /// from one pass of the tokenizer.
    pub fn sentence(&self, text: &str) -> Result<Sentence, TextError> {
        if text.trim().is_empty() {
            return Err(TextError::Empty);
        }
        let chars = text.chars().count();
        if chars > self.max_chars {
            return Err(TextError::TooLong {
                chars,
                max: self.max_chars,
            });
        }
        let enc = self
            .tokenizer
            .encode_char_offsets(text, false)
            .map_err(|e| TextError::Tokenize(e.to_string()))?;
        let ids: Vec<i64> = enc
            .get_ids()
            .iter()
            .take(self.max_tokens)
            .map(|&i| i64::from(i))
            .collect();
        if ids.is_empty() {
            return Err(TextError::NoTokens(text.to_string()));
        }
        let unknown_words = self.unknown_in(text, &enc);
        let unk = self.tokenizer.token_to_id("<unk>").map(i64::from);
        let unknown = ids.iter().filter(|&&i| Some(i) == unk).count();
        Ok(Sentence {
            unknown_share: unknown as f32 / ids.len() as f32,
            ids,
            unknown_words,
        })
    }
}

/// A sentence as the text graph reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sentence {
    pub ids: Vec<i64>,
    /// The words read as the unknown token, as written, in order, once each.
    pub unknown_words: Vec<String>,
    /// The share of the tokens read as the unknown token: how little of the sentence its vector knows.
    pub unknown_share: f32,
}

impl TextTokenizer {
    /// The words of `text` the model has no vector for (each read as the unknown token), as written, in
    /// order, once each: a brand or a model number the caller should know the vector search ignores.
    fn unknown_in(&self, text: &str, enc: &tokenizers::Encoding) -> Vec<String> {
        let Some(unk) = self.tokenizer.token_to_id("<unk>") else {
            return vec![];
        };
        let chars: Vec<char> = text.chars().collect();
        let mut out: Vec<String> = vec![];
        for (&id, &(a, b)) in enc.get_ids().iter().zip(enc.get_offsets()) {
            if id != unk || a >= b || b > chars.len() {
                continue;
            }
            let word: String = chars[a..b].iter().collect();
            if !out.contains(&word) {
                out.push(word);
            }
        }
        out
    }
}

/// Right-pads a batch: `(ids [n, t], lengths [n])`, t the longest sentence's length.
pub fn pad(batch: &[&[i64]], pad_id: i64) -> (Vec<i64>, Vec<i64>) {
    let t = batch.iter().map(|s| s.len()).max().unwrap_or(1).max(1);
    let mut ids = Vec::with_capacity(batch.len() * t);
    let mut lengths = Vec::with_capacity(batch.len());
    for s in batch {
        ids.extend_from_slice(s);
        ids.extend(std::iter::repeat_n(pad_id, t - s.len()));
        lengths.push(s.len() as i64);
    }
    (ids, lengths)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> TextTokenizer {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/fixture-tiny/tokenizer.json");
        TextTokenizer::from_file(&path, 4, 100).expect("the fixture bundle's tokenizer")
    }

    #[test]
    fn a_sentence_read_once_gives_the_ids_and_the_unknown_words() {
        let t = fixture();
        let s = t
            .sentence("A red zzqx in the zzqx Qwv")
            .expect("a sentence");
        // Cut to max_tokens (4), as `ids` cuts; the unknown words come from the whole sentence, once each.
        assert_eq!(s.ids, t.ids("A red zzqx in the zzqx Qwv").expect("ids"));
        assert_eq!(s.ids.len(), 4);
        assert_eq!(s.ids[0], 2, "\"a\" lower-cased to the vocabulary's id 2");
        assert_eq!(s.unknown_words, ["zzqx", "Qwv"]);
        assert!(
            t.sentence("a red background")
                .expect("known")
                .unknown_words
                .is_empty()
        );
        assert!(matches!(t.sentence("  "), Err(TextError::Empty)));
        assert!(matches!(
            t.sentence(&"a ".repeat(60)),
            Err(TextError::TooLong { .. })
        ));
    }
}
