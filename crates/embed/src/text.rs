//! Step 6: sentence -> token ids (the bundle's tokenizer.json) -> text graph -> unit joint vector.

use std::{sync::Arc, time::Duration};

use crate::{
    batch::{BatchOptions, BatchStats, Batcher, Job},
    bundle::Bundle,
    runtime::{Backend, RuntimeError},
};

pub use crate::tokenize::{Sentence, TextError, TextTokenizer, pad};

impl TextTokenizer {
    pub fn new(bundle: &Bundle, max_chars: usize) -> Result<TextTokenizer, TextError> {
        let path = bundle.path(&bundle.manifest.text.tokenizer);
        TextTokenizer::from_file(&path, bundle.manifest.text.max_tokens, max_chars)
    }
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
                let (ids, lengths) = pad(&seqs, pad_id);
                backend.text(&ids, &lengths)
            },
        );
        TextEncoder { batcher, joint_dim }
    }

    /// Whether the worker answers (readiness): `ids`, one short sentence, through the queue, unless a run
    /// just succeeded.
    pub async fn probe(
        &self,
        ids: Vec<i64>,
        fresh: Duration,
        timeout: Duration,
    ) -> Result<(), RuntimeError> {
        self.batcher.probe(|| vec![ids], fresh, timeout).await
    }

    /// Whether the worker thread still runs (see `Batcher::alive`).
    pub fn alive(&self) -> bool {
        self.batcher.alive()
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
