//! Adding images (with their captions) and free captions: check everything, embed, commit, then index. A
//! write is searchable only after its commit, and acknowledged only after both.

use std::collections::HashSet;

use bytes::Bytes;
use serde_json::Value;

use crate::{
    CollectionName, Result, Service, ServiceError,
    items::updates::{check_external_id, content_hash},
};
use crate::{
    pipeline::ImageUse,
    store::{EmbeddedCaption, ImportMark, NewCaption, NewImage, Provenance},
};

#[derive(Clone)]
pub struct ImageInput {
    pub bytes: Bytes,
    pub external_id: Option<String>,
    pub metadata: Option<Value>,
    pub captions: Vec<String>,
}

pub struct AddedImage {
    pub id: i64,
    pub external_id: Option<String>,
    pub caption_ids: Vec<i64>,
    pub width: u32,
    pub height: u32,
}

impl Service {
    /// The request's shape, before anything is read or embedded: counts, external ids, metadata.
    pub(crate) fn check_images(&self, inputs: &[ImageInput]) -> Result<()> {
        if inputs.is_empty() {
            return Err(ServiceError::Invalid("no images in the request".into()));
        }
        if inputs.len() > self.opts.max_batch {
            return Err(ServiceError::Invalid(format!(
                "{} images in one request; the limit is {}",
                inputs.len(),
                self.opts.max_batch
            )));
        }
        let mut seen = HashSet::new();
        for (i, inp) in inputs.iter().enumerate() {
            if let Some(e) = &inp.external_id {
                check_external_id(e, &format!("image {i}: "))?;
                if !seen.insert(e.as_str()) {
                    return Err(ServiceError::Conflict(format!(
                        "image {i}: external_id \"{e}\" appears twice in the request"
                    )));
                }
            }
            if inp.metadata.as_ref().is_some_and(|m| !m.is_object()) {
                return Err(ServiceError::Invalid(format!(
                    "image {i}: metadata must be a JSON object"
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn check_caption_count(&self, n: usize) -> Result<()> {
        if n > self.opts.max_batch * 10 {
            return Err(ServiceError::Invalid(format!(
                "{n} captions in one request; the limit is {}",
                self.opts.max_batch * 10
            )));
        }
        Ok(())
    }

    pub async fn add_images(
        &self,
        collection: &CollectionName,
        inputs: Vec<ImageInput>,
    ) -> Result<Vec<AddedImage>> {
        self.add_images_marked(collection, inputs, None).await
    }

    /// `add_images`, recording in the same transaction how far an import has got (`mark`).
    pub async fn add_images_marked(
        &self,
        collection: &CollectionName,
        inputs: Vec<ImageInput>,
        mark: Option<&ImportMark>,
    ) -> Result<Vec<AddedImage>> {
        let c = self.writable_ref(collection).await?;
        self.check_images(&inputs)?;
        let texts: Vec<&String> = inputs.iter().flat_map(|i| &i.captions).collect();
        self.check_caption_count(texts.len())?;
        // Captions are tokenised (and so checked) before the expensive image path runs, and only once.
        let tokens = self
            .pipeline
            .tokenize(texts)
            .map_err(|(i, e)| ServiceError::Text {
                index: Some(i),
                source: e,
            })?;
        let (bytes, rest): (Vec<Bytes>, Vec<_>) = inputs
            .into_iter()
            .map(|i| {
                let hash = content_hash(&i.bytes);
                let metadata = i
                    .metadata
                    .unwrap_or_else(|| Value::Object(Default::default()));
                (i.bytes, (i.external_id, metadata, i.captions, hash))
            })
            .unzip();
        let embeddings = self.embed_images(bytes, ImageUse::Store).await?;
        let text_vecs = self.embed_tokens(tokens).await?;
        let mut text_vecs = self.with_caption_offsets(text_vecs).await?.into_iter();
        let metadatas: Vec<&Value> = rest.iter().map(|r| &r.1).collect();
        let fields = self
            .embed_fields(c.text_fields.as_deref(), &metadatas, &HashSet::new())
            .await?;
        let written: Vec<usize> = rest.iter().map(|r| r.2.len()).collect();
        let rows: Vec<NewImage> = embeddings
            .into_iter()
            .zip(rest)
            .zip(fields)
            .map(
                |((e, (external_id, metadata, captions, hash)), fields)| NewImage {
                    external_id,
                    metadata,
                    width: e.width,
                    height: e.height,
                    code: e.code.packed().to_vec(),
                    vector: e.vector,
                    offset: e.offset,
                    thumbnail: e.thumbnail,
                    content_hash: Some(hash),
                    captions: captions
                        .into_iter()
                        .map(|text| {
                            EmbeddedCaption::new(text, text_vecs.next().unwrap_or_default())
                        })
                        .chain(fields)
                        .collect(),
                },
            )
            .collect();
        let b = &self.pipeline.bundle;
        let ids = self
            .timed_db(
                "insert_images",
                self.store.insert_images(
                    c.id,
                    &rows,
                    Provenance {
                        bundle_id: &b.id,
                        vision_id: &b.vision_id,
                    },
                    mark,
                ),
            )
            .await?;
        let out = added_images(&rows, &ids, written);
        self.index_added(c.id, rows, &ids)?;
        Ok(out)
    }

    /// Committed images (with their captions, `ids` as the store gave them) made searchable.
    pub(crate) fn index_added(
        &self,
        collection_id: i64,
        rows: Vec<NewImage>,
        ids: &[(i64, Vec<i64>)],
    ) -> Result<()> {
        let Some(idx) = self.memory_indexes(collection_id)? else {
            return Ok(());
        };
        idx.attributes.set(
            rows.iter()
                .zip(ids)
                .map(|(row, (id, _))| (*id, row.metadata.clone())),
        );
        for (row, (id, cap_ids)) in rows.into_iter().zip(ids) {
            idx.images.insert(*id, row.vector, row.offset)?;
            for (caption, cid) in row.captions.into_iter().zip(cap_ids) {
                idx.captions.insert(*cid, caption.vector, caption.offset)?;
            }
        }
        self.update_gauges();
        Ok(())
    }

    pub async fn add_captions(
        &self,
        collection: &CollectionName,
        caps: Vec<(Option<i64>, String)>,
    ) -> Result<Vec<i64>> {
        let c = self.writable_ref(collection).await?;
        if caps.is_empty() {
            return Err(ServiceError::Invalid("no captions in the request".into()));
        }
        self.check_caption_count(caps.len())?;
        let (image_ids, texts): (Vec<Option<i64>>, Vec<String>) = caps.into_iter().unzip();
        let vecs = self.embed_texts(&texts).await?;
        let vecs = self.with_caption_offsets(vecs).await?;
        let rows: Vec<NewCaption> = image_ids
            .into_iter()
            .zip(texts)
            .zip(vecs)
            .map(|((image_id, text), v)| NewCaption {
                image_id,
                caption: EmbeddedCaption::new(text, v),
            })
            .collect();
        let ids = self
            .store
            .insert_captions(c.id, &rows, &self.pipeline.bundle.id, None)
            .await?;
        self.index_added_captions(c.id, rows, &ids)?;
        Ok(ids)
    }

    /// Committed captions (`ids` as the store gave them) made searchable.
    pub(crate) fn index_added_captions(
        &self,
        collection_id: i64,
        rows: Vec<NewCaption>,
        ids: &[i64],
    ) -> Result<()> {
        let Some(idx) = self.memory_indexes(collection_id)? else {
            return Ok(());
        };
        for (row, id) in rows.into_iter().zip(ids) {
            idx.captions
                .insert(*id, row.caption.vector, row.caption.offset)?;
        }
        self.update_gauges();
        Ok(())
    }
}

/// What an add answers for each row inserted: its id, and the ids of the `written` captions sent with it
/// (the fields' sentences follow them).
fn added_images(
    rows: &[NewImage],
    ids: &[(i64, Vec<i64>)],
    written: Vec<usize>,
) -> Vec<AddedImage> {
    rows.iter()
        .zip(ids)
        .zip(written)
        .map(|((row, (id, cap_ids)), n)| AddedImage {
            id: *id,
            external_id: row.external_id.clone(),
            // The written captions' ids; the fields' sentences follow them.
            caption_ids: cap_ids[..n].to_vec(),
            width: row.width,
            height: row.height,
        })
        .collect()
}
