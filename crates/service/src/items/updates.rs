//! Changing stored images: PATCH (a metadata merge and the external id) and the upsert by external id
//! (PUT). An upsert runs the CNN only when the photo's bytes differ from the stored photo's (by their sha256)
//! or the stored photo was coded by another vision model (another bundle's: its code and vector are not
//! this model's), and a replaced photo gets a new id (the store's upsert.rs says why).

use bytes::Bytes;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{CollectionName, Result, Service, ServiceError, items::hide};
use crate::{
    pipeline::ImageUse,
    store::{EmbeddedCaption, ImagePatch, ImageRow, NewImage, Photo, Provenance, Upsert, Upserted},
};

/// The sha256 of a photo's bytes, as stored in `images.content_hash`.
pub fn content_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// An external id as the API accepts it.
pub(crate) fn check_external_id(e: &str, at: &str) -> Result<()> {
    if e.is_empty() || e.len() > 256 {
        return Err(ServiceError::Invalid(format!(
            "{at}external_id must be 1-256 characters"
        )));
    }
    Ok(())
}

/// What a PUT by external id sends.
pub struct UpsertInput {
    pub bytes: Bytes,
    pub metadata: Option<Value>,
    pub captions: Vec<String>,
}

/// What an upsert did to the image under the external id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpsertOutcome {
    /// No image had the external id: it was added.
    Created,
    /// The photo was new, or the stored one coded by another vision model: it was embedded and replaced the
    /// old image, under a new id.
    Replaced,
    /// The photo was the stored one, coded by the loaded vision model: its metadata and captions were
    /// updated, its id kept.
    Updated,
}

/// An upsert's answer: what it did, and the stored image as the store reports it (its id, the one it replaced,
/// its size, its caption ids in the order sent).
pub struct UpsertedImage {
    pub outcome: UpsertOutcome,
    pub image: Upserted,
}

/// An upsert re-reads the row and starts again when another write changed it meanwhile; this many times.
const UPSERT_ATTEMPTS: usize = 3;

impl Service {
    pub async fn patch_image(
        &self,
        collection: &CollectionName,
        id: i64,
        patch: ImagePatch,
    ) -> Result<ImageRow> {
        let c = self.writable_ref(collection).await?;
        if let Some(Some(e)) = &patch.external_id {
            check_external_id(e, "")?;
        }
        if patch.metadata.as_ref().is_some_and(|m| !m.is_object()) {
            return Err(ServiceError::Invalid(
                "metadata must be a JSON object (a merge patch: a key set to null is removed)"
                    .into(),
            ));
        }
        let row = self.store.patch_image(c.id, id, &patch).await?;
        if let Some(idx) = self.memory_indexes(c.id)? {
            idx.attributes.set([(row.id, row.metadata.clone())]);
        }
        Ok(row)
    }

    pub async fn upsert_image(
        &self,
        collection: &CollectionName,
        external_id: &str,
        input: UpsertInput,
    ) -> Result<UpsertedImage> {
        let c = self.writable_ref(collection).await?;
        check_external_id(external_id, "")?;
        let metadata = match input.metadata {
            None => Value::Object(Default::default()),
            Some(m) if m.is_object() => m,
            Some(_) => {
                return Err(ServiceError::Invalid(
                    "metadata must be a JSON object".into(),
                ));
            }
        };
        self.check_caption_count(input.captions.len())?;
        let tokens = self
            .pipeline
            .tokenize(input.captions.iter().collect::<Vec<&String>>())
            .map_err(|(i, e)| ServiceError::Text {
                index: Some(i),
                source: e,
            })?;
        let vectors = self.embed_tokens(tokens).await?;
        let captions: Vec<EmbeddedCaption> = input
            .captions
            .into_iter()
            .zip(self.with_caption_offsets(vectors).await?)
            .map(|(text, v)| EmbeddedCaption::new(text, v))
            .collect();
        let hash = content_hash(&input.bytes);
        let b = &self.pipeline.bundle;
        let prov = Provenance {
            bundle_id: &b.id,
            vision_id: &b.vision_id,
        };
        // Embedded at most once, however many times the row changes under us.
        let mut photo: Option<NewImage> = None;
        for _ in 0..UPSERT_ATTEMPTS {
            let seen = self.store.image_state(c.id, external_id).await?;
            let same = seen
                .as_ref()
                .is_some_and(|s| s.is_photo(&hash, &b.vision_id));
            if !same && photo.is_none() {
                let e = self
                    .embed_images(vec![input.bytes.clone()], ImageUse::Store)
                    .await?
                    .remove(0);
                photo = Some(NewImage {
                    external_id: Some(external_id.to_string()),
                    metadata: Value::Null,
                    width: e.width,
                    height: e.height,
                    code: e.code.packed().to_vec(),
                    vector: e.vector,
                    offset: e.offset,
                    captions: vec![],
                    thumbnail: e.thumbnail,
                    content_hash: Some(hash.clone()),
                });
            }
            let u = Upsert {
                external_id,
                seen,
                photo: match (&photo, same) {
                    (Some(p), false) => Photo::New(p),
                    _ => Photo::Same,
                },
                metadata: &metadata,
                captions: &captions,
            };
            let Some(done) = self
                .timed_db(
                    "upsert_image",
                    self.store.upsert_image(c.id, &u, prov.clone()),
                )
                .await?
            else {
                continue;
            };
            // Committed: now the indexes (under --index database the rows are the index: nothing to do).
            if let Some(idx) = self.memory_indexes(c.id)? {
                if let Some(prev) = done.previous_id {
                    hide(&idx.images, prev);
                    idx.attributes.remove(&[prev]);
                }
                idx.attributes.set([(done.id, metadata.clone())]);
                if let (Photo::New(p), true) =
                    (&u.photo, done.created || done.previous_id.is_some())
                {
                    idx.images.insert(done.id, p.vector.clone(), p.offset)?;
                }
                for cid in &done.removed_captions {
                    hide(&idx.captions, *cid);
                }
                for (cid, i) in &done.added_captions {
                    let c = &captions[*i];
                    idx.captions.insert(*cid, c.vector.clone(), c.offset)?;
                }
            }
            self.update_gauges();
            return Ok(UpsertedImage {
                outcome: match (done.created, done.previous_id) {
                    (true, _) => UpsertOutcome::Created,
                    (false, Some(_)) => UpsertOutcome::Replaced,
                    (false, None) => UpsertOutcome::Updated,
                },
                image: done,
            });
        }
        Err(ServiceError::Conflict(format!(
            "the image with external_id \"{external_id}\" kept changing while this upsert ran \
             (other writes to it); send it again"
        )))
    }
}
