//! The items of a collection: adding images and captions (`ingest`, and `url_ingest` for images given by URL),
//! changing them (`updates`: PATCH and the upsert by external id), moving them in and out (`transfer`: export
//! and import; `feed`: a catalogue feed kept in sync), and here, reading, listing and deleting them. A
//! delete leaves the index at once (and starts a background rebuild when the holes pile up).

pub(crate) mod feed;
pub(crate) mod fields;
pub(crate) mod ingest;
pub(crate) mod transfer;
pub(crate) mod updates;
pub(crate) mod url_ingest;

use std::sync::Arc;

use super::{CollectionName, Result, Service, ServiceError};
use crate::{
    filter::Filter,
    fne::TernaryCode,
    index::VectorIndex,
    modality::Modality,
    store::{CaptionRow, ImageRow},
};

impl Service {
    pub async fn image(
        &self,
        collection: &CollectionName,
        id: i64,
    ) -> Result<(ImageRow, Vec<CaptionRow>)> {
        let c = self.collection_ref(collection).await?;
        let img = self.store.image(c.id, id).await?;
        let caps = self.store.list_captions(c.id, Some(id), 0, 1000).await?;
        Ok((img, caps))
    }

    /// An image's thumbnail (JPEG bytes), or NotFound naming why: no such image, or none kept for it.
    pub async fn thumbnail(&self, collection: &CollectionName, id: i64) -> Result<Vec<u8>> {
        let c = self.collection_ref(collection).await?;
        match self.store.thumbnail(c.id, id).await? {
            Some(t) if !t.is_empty() => Ok(t),
            _ => Err(ServiceError::NotFound(format!(
                "image {id} has no thumbnail: it was added while thumbnails were off (--thumbnails off) \
                 or before the server kept them"
            ))),
        }
    }

    pub async fn image_by_external_id(
        &self,
        collection: &CollectionName,
        external_id: &str,
    ) -> Result<ImageRow> {
        let c = self.collection_ref(collection).await?;
        Ok(self.store.image_by_external_id(c.id, external_id).await?)
    }

    pub async fn image_code(&self, collection: &CollectionName, id: i64) -> Result<TernaryCode> {
        let c = self.collection_ref(collection).await?;
        let raw = self.store.image_code(c.id, id).await?;
        TernaryCode::from_packed(self.pipeline.projection().fne_dim(), raw).map_err(|e| {
            ServiceError::Unavailable(format!("stored code of image {id} is unusable: {e}"))
        })
    }

    pub async fn delete_image(&self, collection: &CollectionName, id: i64) -> Result<()> {
        let c = self.writable_ref(collection).await?;
        let caps = self.store.delete_image(c.id, id).await?;
        let Some(idx) = self.memory_indexes(c.id)? else {
            return Ok(());
        };
        hide(&idx.images, id);
        idx.attributes.remove(&[id]);
        for cid in caps {
            hide(&idx.captions, cid);
        }
        self.update_gauges();
        Ok(())
    }

    /// A page of the collection's images matching `filter`, and how many match in all.
    pub async fn list_images(
        &self,
        collection: &CollectionName,
        filter: &Filter,
        offset: i64,
        limit: i64,
    ) -> Result<(Vec<ImageRow>, i64)> {
        let c = self.collection_ref(collection).await?;
        let rows = self.store.list_images(c.id, filter, offset, limit).await?;
        let total = self.store.count_images(c.id, filter).await?;
        Ok((rows, total))
    }

    /// A page of the captions (of one image, or all), and how many there are in all.
    pub async fn list_captions(
        &self,
        collection: &CollectionName,
        image_id: Option<i64>,
        offset: i64,
        limit: i64,
    ) -> Result<(Vec<CaptionRow>, i64)> {
        let c = self.collection_ref(collection).await?;
        let rows = self
            .store
            .list_captions(c.id, image_id, offset, limit)
            .await?;
        let total = self.store.count_captions(c.id, image_id).await?;
        Ok((rows, total))
    }

    pub async fn delete_caption(&self, collection: &CollectionName, id: i64) -> Result<()> {
        let c = self.writable_ref(collection).await?;
        self.store.delete_caption(c.id, id).await?;
        let Some(idx) = self.memory_indexes(c.id)? else {
            return Ok(());
        };
        hide(&idx.captions, id);
        self.update_gauges();
        Ok(())
    }

    /// Every stored vector of one modality in a collection, by id (for `eval`, which ranks whole splits).
    pub async fn stored_vectors(
        &self,
        collection_id: i64,
        modality: Modality,
    ) -> Result<Vec<(i64, Vec<f32>)>> {
        Ok(self.store.vectors(collection_id, modality).await?)
    }

    /// Every caption of a collection, in id order (for `eval`).
    pub async fn all_captions(&self, collection_id: i64) -> Result<Vec<CaptionRow>> {
        Ok(self
            .store
            .list_captions(collection_id, None, 0, i64::MAX)
            .await?)
    }
}

/// Takes a point out of an index; rebuilds the graph in the background once its holes are due.
pub(super) fn hide(idx: &Arc<VectorIndex>, id: i64) {
    if idx.remove(id) {
        let idx = idx.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = idx.rebuild() {
                tracing::warn!(error = %e, "index rebuild failed; the old graph stays in use");
            }
        });
    }
}
