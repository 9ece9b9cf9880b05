//! Warming up after a start, before the first request: the first searches after a start were several times
//! slower than the later ones (p99 108 ms against 20). ONNX Runtime sizes its buffers on the first
//! run of each input shape, and a sentence query's shape is (sentences batched together, longest length);
//! the graphs, the vectors and the database pages are cold.

use std::time::Instant;

use crate::{Result, Service};

/// Sentences of one to twenty words (the lengths most queries have), cut from one caption-like text.
fn sentences() -> Vec<String> {
    const WORDS: [&str; 20] = [
        "a", "brown", "dog", "runs", "across", "the", "green", "grass", "with", "a", "red", "ball",
        "in", "its", "mouth", "while", "two", "children", "watch", "it",
    ];
    (1..=WORDS.len()).map(|n| WORDS[..n].join(" ")).collect()
}

impl Service {
    /// Runs the text graph on every common shape, then searches each collection's image index through the
    /// graph and fetches the hits' rows, as queries will. Returns how long it took.
    pub async fn warm_up(&self) -> Result<std::time::Duration> {
        let t = Instant::now();
        let texts = sentences();
        let mut query = Vec::new();
        // Concurrent queries are batched together: shapes of one to four sentences.
        for batch in 1..=4 {
            for chunk in texts.chunks(batch) {
                let mut v = self.embed_texts(chunk).await?;
                query = v.swap_remove(0);
            }
        }
        for c in self.store.list_collections().await? {
            self.warm_collection(c.id, &query).await?;
        }
        Ok(t.elapsed())
    }
}
