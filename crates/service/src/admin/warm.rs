//! Warming up after a start, before the first request: the first searches after a start were several times
//! slower than the later ones (p99 108 ms against 20). ONNX Runtime sizes its buffers on the first
//! run of each input shape, and a sentence query's shape is (sentences batched together, longest length);
//! the graphs, the vectors and the database pages are cold.

use std::time::Instant;

use crate::modality::Modality;
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
            if self.in_database() {
                // The database's HNSW pages and the rows, as a search reads them.
                let hits = self
                    .nearest_in_database(crate::search::database::DbQuery {
                        collection_id: c.id,
                        target: Modality::Images,
                        vector: &query,
                        query_modality: Modality::Captions,
                        filter: &crate::filter::Filter::all(),
                        exclude: None,
                        matches: None,
                        offset: 0,
                        k: 10,
                    })
                    .await?;
                let ids: Vec<i64> = hits.iter().map(|h| h.id).collect();
                self.store.images_by_ids(c.id, &ids).await?;
                continue;
            }
            let Ok(idx) = self.indexes_of(c.id) else {
                continue;
            };
            let (images, score) = (
                idx.images.clone(),
                self.score(Modality::Captions, Modality::Images),
            );
            let q = query.clone();
            let hits = tokio::task::spawn_blocking(move || images.search(&q, score, 0, 10, None))
                .await
                .map_err(|e| crate::ServiceError::Unavailable(e.to_string()))?;
            let ids: Vec<i64> = hits.iter().map(|h| h.id).collect();
            self.store.images_by_ids(c.id, &ids).await?;
        }
        Ok(t.elapsed())
    }
}
