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
    store::{
        EmbeddedCaption, FieldSentences, ImagePatch, ImageRow, NewImage, Photo, Provenance, Upsert,
        Upserted,
    },
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
    /// Whether the CNN embedded the photo for this write.
    pub photo_embedded: bool,
    /// How many sentences the text model embedded for it (captions, and text-field sentences not stored).
    pub sentences_embedded: usize,
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
        // Without text fields, or without a metadata change, the fields' sentences stay as they are.
        let reembed = c.text_fields.is_some() && patch.metadata.is_some();
        for _ in 0..UPSERT_ATTEMPTS {
            // The sentences of the metadata as the patch will leave it, from the row as read now; the store
            // refuses them (None) if the row's metadata changed meanwhile, and this starts again.
            let (before, sentences) = if reembed {
                let before = self.store.image(c.id, id).await?;
                let mut after = before.metadata.clone();
                if let Some(m) = &patch.metadata {
                    crate::store::merge_patch(&mut after, m);
                }
                let stored = self.stored_fields(c.id, &before).await?;
                let sentences = self
                    .embed_fields(c.text_fields.as_deref(), &[&after], &stored)
                    .await?
                    .remove(0);
                (Some(before.metadata), sentences)
            } else {
                (None, vec![])
            };
            let fields = before.as_ref().map(|seen| FieldSentences {
                seen,
                captions: &sentences,
                bundle_id: &self.pipeline.bundle.id,
            });
            let Some(done) = self.store.patch_image(c.id, id, &patch, fields).await? else {
                continue;
            };
            if let Some(idx) = self.memory_indexes(c.id)? {
                idx.attributes
                    .set([(done.image.id, done.image.metadata.clone())]);
                for cid in &done.removed_captions {
                    hide(&idx.captions, *cid);
                }
                for (cid, i) in &done.added_captions {
                    let s = &sentences[*i];
                    idx.captions.insert(*cid, s.vector.clone(), s.offset)?;
                }
            }
            return Ok(done.image);
        }
        Err(ServiceError::Conflict(format!(
            "image {id} kept changing while this patch ran (other writes to it); send it again"
        )))
    }

    pub async fn upsert_image(
        &self,
        collection: &CollectionName,
        external_id: &str,
        input: UpsertInput,
    ) -> Result<UpsertedImage> {
        let c = self.writable_ref(collection).await?;
        check_external_id(external_id, "")?;
        let metadata = object_metadata(input.metadata)?;
        let written = input.captions.len();
        let captions = self
            .upsert_captions(&c, external_id, input.captions, &metadata)
            .await?;
        let sentences_embedded = captions.iter().filter(|c| !c.vector.is_empty()).count();
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
                photo = Some(self.embed_photo(external_id, &input.bytes, &hash).await?);
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
            self.index_upserted(c.id, &done, &u)?;
            self.update_gauges();
            let mut done = done;
            done.caption_ids.truncate(written);
            return Ok(UpsertedImage {
                outcome: match (done.created, done.previous_id) {
                    (true, _) => UpsertOutcome::Created,
                    (false, Some(_)) => UpsertOutcome::Replaced,
                    (false, None) => UpsertOutcome::Updated,
                },
                image: done,
                photo_embedded: photo.is_some(),
                sentences_embedded,
            });
        }
        Err(ServiceError::Conflict(format!(
            "the image with external_id \"{external_id}\" kept changing while this upsert ran \
             (other writes to it); send it again"
        )))
    }

    /// The image's captions after the upsert: those sent, embedded, then its text fields' sentences.
    async fn upsert_captions(
        &self,
        c: &crate::CollectionRef,
        external_id: &str,
        sent: Vec<String>,
        metadata: &Value,
    ) -> Result<Vec<EmbeddedCaption>> {
        self.check_caption_count(sent.len())?;
        let mut tokens = self
            .pipeline
            .tokenize(sent.iter().collect::<Vec<&String>>())
            .map_err(|(i, e)| ServiceError::Text {
                index: Some(i),
                source: e,
            })?;
        // What the image holds already under the loaded bundle: a caption or a text field's sentence with the
        // same text is kept by the store under its id, so it is not embedded again (a text-only change costs a
        // text-model pass for the changed sentences alone).
        let (mut written, fields) = match self.store.image_by_external_id(c.id, external_id).await {
            Ok(img) => (
                self.store
                    .written_captions(c.id, img.id, &self.pipeline.bundle.id)
                    .await?,
                self.stored_fields(c.id, &img).await?,
            ),
            Err(crate::store::StoreError::NotFound(_)) => Default::default(),
            Err(e) => return Err(e.into()),
        };
        let mut captions = Vec::with_capacity(sent.len());
        let mut fresh = vec![];
        for (text, ids) in sent.into_iter().zip(tokens.drain(..)) {
            match written.iter().position(|w| *w == text) {
                // Each stored caption keeps one sent caption: a text sent twice and stored once is embedded once.
                Some(at) => {
                    written.swap_remove(at);
                    captions.push(EmbeddedCaption::new(text, (vec![], 0.0)));
                }
                None => {
                    fresh.push((captions.len(), ids));
                    captions.push(EmbeddedCaption::new(text, (vec![], 0.0)));
                }
            }
        }
        if !fresh.is_empty() {
            let (slots, ids): (Vec<usize>, Vec<_>) = fresh.into_iter().unzip();
            let vectors = self.embed_tokens(ids).await?;
            for (i, (vector, offset)) in slots
                .into_iter()
                .zip(self.with_caption_offsets(vectors).await?)
            {
                captions[i].vector = vector;
                captions[i].offset = offset;
            }
        }
        captions.extend(
            self.embed_fields(c.text_fields.as_deref(), &[metadata], &fields)
                .await?
                .remove(0),
        );
        Ok(captions)
    }

    /// The photo sent, embedded as a new row of the external id (its metadata and captions come separately).
    async fn embed_photo(&self, external_id: &str, bytes: &Bytes, hash: &str) -> Result<NewImage> {
        let e = self
            .embed_images(vec![bytes.clone()], ImageUse::Store)
            .await?
            .remove(0);
        Ok(NewImage {
            external_id: Some(external_id.to_string()),
            metadata: Value::Null,
            width: e.width,
            height: e.height,
            code: e.code.packed().to_vec(),
            vector: e.vector,
            offset: e.offset,
            captions: vec![],
            thumbnail: e.thumbnail,
            content_hash: Some(hash.to_string()),
        })
    }

    /// A committed upsert, carried into the in-memory indexes (under --index database the rows are the
    /// index: nothing to do).
    fn index_upserted(&self, collection_id: i64, done: &Upserted, u: &Upsert<'_>) -> Result<()> {
        let Some(idx) = self.memory_indexes(collection_id)? else {
            return Ok(());
        };
        if let Some(prev) = done.previous_id {
            hide(&idx.images, prev);
            idx.attributes.remove(&[prev]);
        }
        idx.attributes.set([(done.id, u.metadata.clone())]);
        if let (Photo::New(p), true) = (&u.photo, done.created || done.previous_id.is_some()) {
            idx.images.insert(done.id, p.vector.clone(), p.offset)?;
        }
        for cid in &done.removed_captions {
            hide(&idx.captions, *cid);
        }
        for (cid, i) in &done.added_captions {
            let c = &u.captions[*i];
            idx.captions.insert(*cid, c.vector.clone(), c.offset)?;
        }
        Ok(())
    }
}

/// An upsert's metadata: an object, `{}` when none was sent.
fn object_metadata(metadata: Option<Value>) -> Result<Value> {
    match metadata {
        None => Ok(Value::Object(Default::default())),
        Some(m) if m.is_object() => Ok(m),
        Some(_) => Err(ServiceError::Invalid(
            "metadata must be a JSON object".into(),
        )),
    }
}
