//! Reindex: every vector recomputed under the loaded bundle (images from their stored codes, no CNN;
//! captions with the text model), staged beside the old ones and switched in by one transaction
//! (`store::reindex`), then every index rebuilt, here and, through the change sequence, on the other
//! replicas. Killed part-way, the database keeps the old vectors; run again, it resumes from what was staged.

use crate::{Result, Service, ServiceError};
use crate::{
    fne::TernaryCode,
    modality::Modality,
    store::{StoredCode, StoredVector, Switch},
};

/// Rows per staged page when the caller does not say (one transaction each).
pub const REINDEX_PAGE_ROWS: usize = 1000;

/// How many times new rows of an old bundle may turn up between staging and switching before giving up.
const SWITCH_ATTEMPTS: usize = 3;

/// What a reindex did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reindexed {
    /// Images and captions whose vectors were switched to the loaded bundle.
    pub images: u64,
    pub captions: u64,
    /// Rows an interrupted reindex under the same bundle had staged, reused rather than recomputed.
    pub resumed: u64,
}

impl Service {
    /// Refuses, before anything is written, when stored codes come from another vision model.
    pub async fn reindex(&self, page_rows: usize) -> Result<Reindexed> {
        let b = self.pipeline.bundle.clone();
        for (bundle_id, vision_id, n) in self.store.image_provenance().await? {
            if bundle_id != b.id && vision_id != b.vision_id {
                return Err(ServiceError::Invalid(format!(
                    "{n} images were coded by another vision model ({vision_id}, loaded {}); their codes \
                     cannot be reused: re-ingest them",
                    b.vision_id
                )));
            }
        }
        // The indexes are rebuilt at the end: not ready meanwhile.
        let _rebuilding = self.indexes.rebuilding();
        let resumed = self.store.begin_reindex(&b.id).await?.max(0) as u64;
        if resumed > 0 {
            tracing::info!(
                staged = resumed,
                "resuming an interrupted reindex under this bundle"
            );
        }
        let page = page_rows.max(1) as i64;
        for _ in 0..SWITCH_ATTEMPTS {
            self.stage_images(page).await?;
            self.stage_captions(page).await?;
            match self.store.switch_to_staged(&b.id).await? {
                Switch::Done(images, captions) => {
                    // Under --index database the switch rewrote the pgvector column in its transaction.
                    for c in self
                        .store
                        .list_collections()
                        .await?
                        .into_iter()
                        .filter(|_| self.graphs().is_some())
                    {
                        let idx = self.load_indexes(&c).await?;
                        self.indexes.put(c.id, idx);
                    }
                    self.update_gauges();
                    return Ok(Reindexed {
                        images,
                        captions,
                        resumed,
                    });
                }
                Switch::Unstaged(n) => {
                    tracing::info!(
                        rows = n,
                        "rows of another bundle arrived while staging; staging them too"
                    );
                }
            }
        }
        Err(ServiceError::Unavailable(format!(
            "rows embedded with another bundle kept arriving while reindexing ({SWITCH_ATTEMPTS} attempts): \
             is a replica with the old bundle still writing? Nothing was switched; what was staged is kept"
        )))
    }

    async fn stage_images(&self, page: i64) -> Result<()> {
        let b = self.pipeline.bundle.clone();
        let dim = self.pipeline.projection().fne_dim();
        let mut after = 0;
        loop {
            let rows = self.store.stale_codes_page(&b.id, after, page).await?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            let mut ids = Vec::with_capacity(rows.len());
            let mut codes = Vec::with_capacity(rows.len());
            for StoredCode {
                id,
                code,
                vision_id,
            } in rows
            {
                // Written after the check above by a replica on another vision model.
                if vision_id != b.vision_id {
                    return Err(ServiceError::Invalid(format!(
                        "image {id} was coded by another vision model ({vision_id}, loaded {}); its code cannot \
                         be reused: re-ingest it",
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
            let staged: Vec<StoredVector> = ids
                .into_iter()
                .zip(vectors)
                .zip(offsets)
                .map(|((id, vector), offset)| StoredVector { id, vector, offset })
                .collect();
            self.store
                .stage_vectors(Modality::Images, &staged, &b.id)
                .await?;
        }
        Ok(())
    }

    async fn stage_captions(&self, page: i64) -> Result<()> {
        let bundle_id = self.pipeline.bundle.id.clone();
        let mut after = 0;
        loop {
            let rows = self
                .store
                .stale_captions_page(&bundle_id, after, page)
                .await?;
            let Some(last) = rows.last() else { break };
            after = last.0;
            let (ids, texts): (Vec<i64>, Vec<String>) = rows.into_iter().unzip();
            let vecs = self.embed_texts(&texts).await?;
            let staged: Vec<StoredVector> = ids
                .into_iter()
                .zip(self.with_caption_offsets(vecs).await?)
                .map(|(id, (vector, offset))| StoredVector { id, vector, offset })
                .collect();
            self.store
                .stage_vectors(Modality::Captions, &staged, &bundle_id)
                .await?;
        }
        Ok(())
    }
}
