//! Reindex: every vector recomputed under the loaded bundle (images from their stored codes, no CNN;
//! captions with the text model), then every index rebuilt, here and, through the change sequence, on the
//! other replicas.

use super::{Result, Service, ServiceError};
use crate::{
    fne::TernaryCode,
    modality::Modality,
    store::{StoredCode, StoredVector},
};

impl Service {
    /// Refuses codes from another vision model. Returns the images and captions rewritten.
    pub async fn reindex(&self) -> Result<(usize, usize)> {
        // Stored vectors and indexes disagree until the end: not ready meanwhile.
        let _rebuilding = self.indexes.rebuilding();
        let images = self.reindex_images().await?;
        let captions = self.reindex_captions().await?;
        // Other replicas reload too when they read this.
        self.store.log_reload().await?;
        for c in self.store.list_collections().await? {
            let idx = self.load_indexes(&c).await?;
            self.indexes.put(c.id, idx);
        }
        self.update_gauges();
        Ok((images, captions))
    }

    async fn reindex_images(&self) -> Result<usize> {
        let b = self.pipeline.bundle.clone();
        let dim = self.pipeline.projection().fne_dim();
        let (mut after, mut done) = (0, 0);
        loop {
            let page = self.store.codes_page(after, 1000).await?;
            let Some(last) = page.last() else { break };
            after = last.id;
            let mut ids = Vec::with_capacity(page.len());
            let mut codes = Vec::with_capacity(page.len());
            for StoredCode {
                id,
                code,
                vision_id,
            } in page
            {
                if vision_id != b.vision_id {
                    return Err(ServiceError::Invalid(format!(
                        "image {id} was coded by another vision model ({vision_id}, loaded {}); its code cannot be reused: re-ingest it",
                        b.vision_id
                    )));
                }
                let code = TernaryCode::from_packed(dim, code).map_err(|e| {
                    ServiceError::Invalid(format!("image {id}: stored code is invalid: {e}"))
                })?;
                ids.push(id);
                codes.push(code);
            }
            let (vectors, offsets) = self
                .pipeline
                .project_codes(codes)
                .await
                .map_err(|e| ServiceError::embed(None, e))?;
            let rows: Vec<StoredVector> = ids
                .into_iter()
                .zip(vectors)
                .zip(offsets)
                .map(|((id, vector), offset)| StoredVector {
                    id,
                    vector,
                    offset: Some(offset),
                })
                .collect();
            done += rows.len();
            self.store
                .update_vectors(Modality::Images, &rows, &b.id)
                .await?;
        }
        Ok(done)
    }

    async fn reindex_captions(&self) -> Result<usize> {
        let (mut after, mut done) = (0, 0);
        loop {
            let page = self.store.captions_page(after, 512).await?;
            let Some(last) = page.last() else { break };
            after = last.0;
            let (ids, texts): (Vec<i64>, Vec<String>) = page.into_iter().unzip();
            let vecs = self.embed_texts(&texts).await?;
            let rows: Vec<StoredVector> = ids
                .into_iter()
                .zip(vecs)
                .map(|(id, vector)| StoredVector {
                    id,
                    vector,
                    offset: None,
                })
                .collect();
            done += rows.len();
            self.store
                .update_vectors(Modality::Captions, &rows, &self.pipeline.bundle.id)
                .await?;
        }
        Ok(done)
    }
}
