//! Step 6: sentence -> token ids (the bundle's tokenizer.json) -> text graph -> unit joint vector.

use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::{
    batch::{BatchOptions, BatchStats, Batcher, Job},
    bundle::Bundle,
    runtime::{Backend, RuntimeError},
};

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
    pub fn new(bundle: &Bundle, max_chars: usize) -> Result<TextTokenizer, TextError> {
        let path = bundle.path(&bundle.manifest.text.tokenizer);
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| TextError::Load {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(TextTokenizer {
            tokenizer,
            max_tokens: bundle.manifest.text.max_tokens,
            max_chars,
        })
    }

    /// Validates and tokenises one sentence: ids cut to `max_tokens`, no special tokens added.
    pub fn ids(&self, text: &str) -> Result<Vec<i64>, TextError> {
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
            .encode(text, false)
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
        Ok(ids)
    }
}

/// Right-pads a batch: `(ids [n, t], lengths [n], t)`.
pub fn pad(batch: &[&[i64]], pad_id: i64) -> (Vec<i64>, Vec<i64>, usize) {
    let t = batch.iter().map(|s| s.len()).max().unwrap_or(1).max(1);
    let mut ids = Vec::with_capacity(batch.len() * t);
    let mut lengths = Vec::with_capacity(batch.len());
    for s in batch {
        ids.extend_from_slice(s);
        ids.extend(std::iter::repeat_n(pad_id, t - s.len()));
        lengths.push(s.len() as i64);
    }
    (ids, lengths, t)
}

/// The text graph behind a batching worker: sentences from concurrent requests share one run, right-padded
/// to the longest (the graph reads `lengths`, so padding does not change a sentence's vector).
pub struct TextEncoder {
    batcher: Batcher<Vec<Vec<i64>>>,
    joint_dim: usize,
}

impl TextEncoder {
    /// `opts.max_rows` is the most sentences in one runtime call.
    pub fn new(
        backend: Arc<dyn Backend>,
        bundle: &Bundle,
        opts: BatchOptions,
        stats: BatchStats,
    ) -> TextEncoder {
        let (pad_id, joint_dim) = (
            bundle.manifest.text.pad_id,
            bundle.manifest.projection.joint_dim,
        );
        let batcher = Batcher::spawn(
            "text",
            opts,
            joint_dim,
            stats,
            move |jobs: &[Job<Vec<Vec<i64>>>]| {
                let seqs: Vec<&[i64]> = jobs
                    .iter()
                    .flat_map(|j| j.input.iter().map(Vec::as_slice))
                    .collect();
                let (ids, lengths, t) = pad(&seqs, pad_id);
                backend.text(&ids, &lengths, seqs.len(), t)
            },
        );
        TextEncoder { batcher, joint_dim }
    }

    /// Token ids of each sentence -> one unit vector each.
    pub async fn embed(&self, ids: Vec<Vec<i64>>) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let n = ids.len();
        let out = self.batcher.submit(ids, n).await?;
        Ok(out
            .chunks_exact(self.joint_dim)
            .map(<[f32]>::to_vec)
            .collect())
    }
}
