//! Changing stored images in place: a metadata merge (PATCH) and the upsert by external id (PUT).
//!
//! An upsert whose photo is new inserts it under a new id and deletes the old row in the same transaction:
//! an id always denotes the same pixels (thumbnails are cached for ever by id, and an index snapshot is
//! caught up by differences of ids), so a replaced photo never keeps its id. Its external id, which is the
//! caller's handle on it, does not change.

use serde_json::Value;
use sqlx::Row;

use super::{
    ChangeKind, EmbeddedCaption, ImageRow, NewImage, Provenance, Store, StoreError, Tx,
    codec::now_rfc3339, conflict_or, dialect, images::no_image,
};

/// A PATCH: a JSON merge patch (RFC 7396) for the metadata, and the external id to set (`Some(None)`
/// clears it).
#[derive(Debug, Default)]
pub struct ImagePatch {
    pub metadata: Option<Value>,
    pub external_id: Option<Option<String>>,
}

/// A PATCH's text fields: their sentences after the patch (embedded, or `EmbeddedCaption::kept_field` for one
/// stored already), derived from the metadata `seen` as read before the patch, under bundle `bundle_id`.
pub struct FieldSentences<'a> {
    pub seen: &'a Value,
    pub captions: &'a [EmbeddedCaption],
    pub bundle_id: &'a str,
}

/// What a PATCH did: the image as it now is, and its fields' sentences added ((id, index in
/// `FieldSentences::captions`)) and removed.
#[derive(Debug)]
pub struct Patched {
    pub image: ImageRow,
    pub added_captions: Vec<(i64, usize)>,
    pub removed_captions: Vec<i64>,
}

/// The photo of an upsert.
pub enum Photo<'a> {
    /// The bytes sent have the stored photo's digest and it was coded by the loaded vision model: keep its
    /// code, vector and thumbnail.
    Same,
    /// A photo to store under a new id (its `captions` are ignored: `Upsert::captions` says them).
    New(&'a NewImage),
}

/// What is stored under an external id, as an upsert reads it before embedding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageState {
    pub id: i64,
    /// The sha256 of its photo's bytes (none for an image imported from codes).
    pub content_hash: Option<String>,
    /// The vision model that made its code.
    pub vision_id: String,
}

impl ImageState {
    /// From a row with `id`, `content_hash` and `vision_id`.
    fn of(r: &sqlx::any::AnyRow) -> ImageState {
        ImageState {
            id: r.get("id"),
            content_hash: r.get("content_hash"),
            vision_id: r.get("vision_id"),
        }
    }

    /// Whether it is the photo with digest `hash` coded by the vision model `vision_id`: the same bytes
    /// coded by another model are not the same photo to the index (another model's code and vector).
    pub fn is_photo(&self, hash: &str, vision_id: &str) -> bool {
        self.content_hash.as_deref() == Some(hash) && self.vision_id == vision_id
    }
}

pub struct Upsert<'a> {
    pub external_id: &'a str,
    /// What the caller read before embedding: the image stored under the external id, if any. When the
    /// row has changed since (a concurrent upsert or delete), nothing is written and `upsert_image` returns
    /// `Ok(None)`, so the caller starts again from what is there now.
    pub seen: Option<ImageState>,
    pub photo: Photo<'a>,
    /// The metadata, replaced whole.
    pub metadata: &'a Value,
    /// The image's captions after the upsert, with their vectors. Stored captions with the same text,
    /// embedded by the same bundle, are kept (same id); the others are deleted and the new ones added.
    pub captions: &'a [EmbeddedCaption],
}

/// What an upsert did.
#[derive(Debug, Clone, PartialEq)]
pub struct Upserted {
    pub id: i64,
    /// The id of the image it replaced, when the photo was new.
    pub previous_id: Option<i64>,
    /// No image had the external id.
    pub created: bool,
    pub width: i64,
    pub height: i64,
    /// The image's caption ids, in the order of `Upsert::captions`.
    pub caption_ids: Vec<i64>,
    /// (caption id, index in `Upsert::captions`) of the captions added.
    pub added_captions: Vec<(i64, usize)>,
    pub removed_captions: Vec<i64>,
}

/// A stored caption as an upsert compares it: its id, and its (field, text) if it may be kept.
type StoredCaption = (i64, Option<(Option<String>, String)>);

/// RFC 7396: objects merge key by key, `null` removes a key, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

impl Store {
    /// Merges `patch` into an image's metadata and sets its external id; returns the image as it now is.
    /// The vector does not change; the change sequence says the image changed, so that other replicas read
    /// its metadata again (their filters are evaluated in memory). With `fields`, the image's text fields'
    /// sentences become `fields.captions` (as an upsert's captions: the same text kept), which the caller
    /// derived from the metadata `fields.seen`: `Ok(None)` when the stored metadata is no longer that.
    pub async fn patch_image(
        &self,
        collection_id: i64,
        id: i64,
        patch: &ImagePatch,
        fields: Option<FieldSentences<'_>>,
    ) -> Result<Option<Patched>, StoreError> {
        let now = now_rfc3339();
        let mut tx = self.write_tx().await?;
        let select = format!(
            "SELECT {} FROM images WHERE collection_id = $1 AND id = $2{}",
            dialect::image_columns(self.engine),
            dialect::for_update(self.engine)
        );
        let row = sqlx::query(&select)
            .bind(collection_id)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| no_image(id))?;
        let mut img = super::images::image_row(&row);
        if fields.as_ref().is_some_and(|f| *f.seen != img.metadata) {
            return Ok(None);
        }
        if let Some(p) = &patch.metadata {
            merge_patch(&mut img.metadata, p);
            self.set_metadata(&mut tx, id, &img.metadata).await?;
        }
        if let Some(ext) = &patch.external_id {
            sqlx::query("UPDATE images SET external_id = $1 WHERE id = $2")
                .bind(ext)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(|e| {
                    conflict_or(e, || {
                        format!(
                            "external_id \"{}\" already belongs to another image in this collection",
                            ext.as_deref().unwrap_or_default()
                        )
                    })
                })?;
            img.external_id = ext.clone();
        }
        let (mut added, mut removed) = (vec![], vec![]);
        if let Some(f) = fields {
            let prov = Provenance {
                bundle_id: f.bundle_id,
                vision_id: "",
            };
            let stored = Self::stored_captions(&mut tx, id, &prov, true).await?;
            (_, added, removed) = self
                .sync_captions(&mut tx, collection_id, id, &stored, f.captions, &prov, &now)
                .await?;
            Self::log_caption_sync(&mut tx, collection_id, &added, &removed).await?;
        }
        self.refresh_text(&mut tx, collection_id, &[id]).await?;
        Self::log(&mut tx, collection_id, ChangeKind::Image, false, &[id]).await?;
        if !added.is_empty() || !removed.is_empty() {
            Self::bump(&mut tx, collection_id).await?;
        }
        tx.commit().await?;
        Ok(Some(Patched {
            image: img,
            added_captions: added,
            removed_captions: removed,
        }))
    }

    /// The id, photo digest and vision model stored under an external id, if any (what `Upsert::seen`
    /// wants).
    pub async fn image_state(
        &self,
        collection_id: i64,
        external_id: &str,
    ) -> Result<Option<ImageState>, StoreError> {
        let r = sqlx::query(
            "SELECT id, content_hash, vision_id FROM images WHERE collection_id = $1 AND external_id = $2",
        )
        .bind(collection_id)
        .bind(external_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(r.as_ref().map(ImageState::of))
    }

    /// Creates, replaces or updates the image under `u.external_id`, in one transaction; `Ok(None)` when
    /// the row changed after the caller read it (see `Upsert::seen`).
    pub async fn upsert_image(
        &self,
        collection_id: i64,
        u: &Upsert<'_>,
        prov: Provenance<'_>,
    ) -> Result<Option<Upserted>, StoreError> {
        let now = now_rfc3339();
        let mut tx = self.write_tx().await?;
        let row = self
            .locked_image(&mut tx, collection_id, u.external_id)
            .await?;
        let state = row.as_ref().map(ImageState::of);
        if state != u.seen {
            return Ok(None);
        }
        let old = row.map(|r| {
            (
                r.get::<i64, _>("id"),
                r.get::<i64, _>("width"),
                r.get::<i64, _>("height"),
            )
        });
        // A caption another bundle embedded is not kept, whatever its text: its vector is another model's,
        // and the caller's (in `u.captions`) the loaded one's.
        let stored_caps = match &old {
            Some((id, ..)) => Self::stored_captions(&mut tx, *id, &prov, false).await?,
            None => vec![],
        };
        let (id, previous_id, width, height) = match (&old, &u.photo) {
            (None, Photo::Same) => return Ok(None),
            (Some((id, w, h)), Photo::Same) => {
                self.set_metadata(&mut tx, *id, u.metadata).await?;
                (*id, None, *w, *h)
            }
            (old, Photo::New(img)) => {
                let old_id = old.as_ref().map(|(o, ..)| *o);
                if let Some(old_id) = old_id {
                    // Free the external id for the new row; the old row goes once its captions are sorted.
                    sqlx::query("UPDATE images SET external_id = NULL WHERE id = $1")
                        .bind(old_id)
                        .execute(&mut *tx)
                        .await?;
                }
                let id = self
                    .insert_replacement(&mut tx, collection_id, u, img, &prov, &now)
                    .await?;
                (id, old_id, i64::from(img.width), i64::from(img.height))
            }
        };
        let (caption_ids, added, removed) = self
            .sync_captions(
                &mut tx,
                collection_id,
                id,
                &stored_caps,
                u.captions,
                &prov,
                &now,
            )
            .await?;
        self.refresh_text(&mut tx, collection_id, &[id]).await?;
        if let Some(old_id) = previous_id {
            self.delete_replaced(&mut tx, collection_id, old_id).await?;
        }
        // Also when updated in place: followers read its metadata again.
        Self::log(&mut tx, collection_id, ChangeKind::Image, false, &[id]).await?;
        Self::log_caption_sync(&mut tx, collection_id, &added, &removed).await?;
        Self::bump(&mut tx, collection_id).await?;
        tx.commit().await?;
        Ok(Some(Upserted {
            id,
            previous_id,
            created: old.is_none(),
            width,
            height,
            caption_ids,
            added_captions: added,
            removed_captions: removed,
        }))
    }

    /// Replaces image `id`'s metadata, in the caller's write transaction.
    /// The image stored under the external id, locked for the rest of the transaction (Postgres).
    async fn locked_image(
        &self,
        tx: &mut Tx<'_>,
        collection_id: i64,
        external_id: &str,
    ) -> Result<Option<sqlx::any::AnyRow>, StoreError> {
        let sql = format!(
            "SELECT id, content_hash, vision_id, width, height FROM images WHERE collection_id = $1 \
             AND external_id = $2{}",
            dialect::for_update(self.engine)
        );
        Ok(sqlx::query(&sql)
            .bind(collection_id)
            .bind(external_id)
            .fetch_optional(&mut **tx)
            .await?)
    }

    /// The upsert's new photo as a new row under the external id; returns its id.
    async fn insert_replacement(
        &self,
        tx: &mut Tx<'_>,
        collection_id: i64,
        u: &Upsert<'_>,
        img: &NewImage,
        prov: &Provenance<'_>,
        now: &str,
    ) -> Result<i64, StoreError> {
        let row = NewImage {
            external_id: Some(u.external_id.to_string()),
            metadata: u.metadata.clone(),
            width: img.width,
            height: img.height,
            code: img.code.clone(),
            vector: img.vector.clone(),
            offset: img.offset,
            captions: vec![],
            thumbnail: img.thumbnail.clone(),
            content_hash: img.content_hash.clone(),
        };
        let (id, _) = self
            .insert_image_tx(tx, collection_id, &row, prov, now)
            .await?;
        Ok(id)
    }

    /// The row a new photo replaced. Its remaining captions were moved or deleted already; the thumbnail
    /// goes with the row.
    async fn delete_replaced(
        &self,
        tx: &mut Tx<'_>,
        collection_id: i64,
        old_id: i64,
    ) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM images WHERE id = $1")
            .bind(old_id)
            .execute(&mut **tx)
            .await?;
        Self::forget_text_tx(tx, self.engine, &[old_id]).await?;
        Self::log(tx, collection_id, ChangeKind::Image, true, &[old_id]).await?;
        Ok(())
    }

    async fn set_metadata(
        &self,
        tx: &mut Tx<'_>,
        id: i64,
        metadata: &Value,
    ) -> Result<(), StoreError> {
        let sql = format!(
            "UPDATE images SET metadata = {} WHERE id = $2",
            dialect::json_param(self.engine, 1)
        );
        sqlx::query(&sql)
            .bind(metadata.to_string())
            .bind(id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Records what `sync_captions` did in the change sequence (deleted, then added), in its transaction.
    async fn log_caption_sync(
        tx: &mut Tx<'_>,
        collection_id: i64,
        added: &[(i64, usize)],
        removed: &[i64],
    ) -> Result<(), StoreError> {
        Self::log(tx, collection_id, ChangeKind::Caption, true, removed).await?;
        let added_ids: Vec<i64> = added.iter().map(|(c, _)| *c).collect();
        Self::log(tx, collection_id, ChangeKind::Caption, false, &added_ids).await
    }

    /// An image's stored captions as `sync_captions` compares them: (id, Some((field, text))), or (id, None)
    /// for one another bundle embedded (its vector is another model's: never kept, whatever its text). Only
    /// its fields' sentences with `fields_only`.
    async fn stored_captions(
        tx: &mut Tx<'_>,
        image_id: i64,
        prov: &Provenance<'_>,
        fields_only: bool,
    ) -> Result<Vec<StoredCaption>, StoreError> {
        let sql = format!(
            "SELECT id, text, field, bundle_id FROM captions WHERE image_id = $1{} ORDER BY id",
            if fields_only {
                " AND field IS NOT NULL"
            } else {
                ""
            }
        );
        Ok(sqlx::query(&sql)
            .bind(image_id)
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(|r| {
                let same_bundle = r.get::<String, _>("bundle_id") == prov.bundle_id;
                (
                    r.get("id"),
                    same_bundle.then(|| (r.get("field"), r.get("text"))),
                )
            })
            .collect())
    }

    /// Makes image `id`'s captions `wanted`: a stored caption (of `stored`, which may belong to the image
    /// being replaced) with a wanted text (from the same field, or written) is kept under its id and moved to
    /// `id`; the rest (and those without a text: not to be kept) are deleted, and wanted texts left over are
    /// inserted. Returns the caption ids in `wanted` order, the added (id, index) and the deleted ids.
    // `&self` (for the pgvector column of inserted captions) is the eighth argument; the rest are the
    // caller's transaction and what it names.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    async fn sync_captions(
        &self,
        tx: &mut Tx<'_>,
        collection_id: i64,
        id: i64,
        stored: &[StoredCaption],
        wanted: &[EmbeddedCaption],
        prov: &Provenance<'_>,
        now: &str,
    ) -> Result<(Vec<i64>, Vec<(i64, usize)>, Vec<i64>), StoreError> {
        let mut free: Vec<Option<&StoredCaption>> = stored.iter().map(Some).collect();
        let mut ids = Vec::with_capacity(wanted.len());
        let mut added = vec![];
        for (i, caption) in wanted.iter().enumerate() {
            let kept = free
                .iter_mut()
                .find(|s| {
                    s.is_some_and(|(_, t)| {
                        t.as_ref()
                            .is_some_and(|(f, t)| *f == caption.field && *t == caption.text)
                    })
                })
                .and_then(Option::take);
            match kept {
                Some((cid, _)) => {
                    sqlx::query("UPDATE captions SET image_id = $1 WHERE id = $2")
                        .bind(id)
                        .bind(cid)
                        .execute(&mut **tx)
                        .await?;
                    ids.push(*cid);
                }
                None => {
                    let cid = self
                        .insert_caption_tx(
                            tx,
                            collection_id,
                            Some(id),
                            caption,
                            prov.bundle_id,
                            now,
                        )
                        .await?;
                    ids.push(cid);
                    added.push((cid, i));
                }
            }
        }
        let removed: Vec<i64> = free.into_iter().flatten().map(|(cid, _)| *cid).collect();
        for cid in &removed {
            sqlx::query("DELETE FROM captions WHERE id = $1")
                .bind(cid)
                .execute(&mut **tx)
                .await?;
        }
        Ok((ids, added, removed))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{filter::Filter, testing::memory};

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let mut m = json!({"a": "b", "c": {"d": "e", "f": "g"}, "keep": [1, 2]});
        merge_patch(
            &mut m,
            &json!({"a": "z", "c": {"f": null, "h": 1}, "new": {"x": true}}),
        );
        assert_eq!(
            m,
            json!({"a": "z", "c": {"d": "e", "h": 1}, "keep": [1, 2], "new": {"x": true}})
        );
        // An array or scalar replaces whole; null on a missing key is nothing.
        merge_patch(&mut m, &json!({"keep": [3], "gone": null, "a": null}));
        assert_eq!(
            m,
            json!({"c": {"d": "e", "h": 1}, "keep": [3], "new": {"x": true}})
        );
    }

    fn photo(tag: u8) -> NewImage {
        NewImage {
            external_id: None,
            metadata: json!({}),
            width: 4 + u32::from(tag),
            height: 3,
            code: vec![tag],
            vector: vec![f32::from(tag), 1.0],
            offset: 0.0,
            captions: vec![],
            thumbnail: Some(vec![0xFF, 0xD8, tag]),
            content_hash: Some(format!("hash-{tag}")),
        }
    }

    const PROV: Provenance<'static> = Provenance {
        bundle_id: "b@1",
        vision_id: "v@1",
    };

    /// `u` applied, with no other write racing it.
    async fn upserted(store: &Store, collection_id: i64, u: &Upsert<'_>) -> Upserted {
        let done = store.upsert_image(collection_id, u, PROV).await;
        done.expect("upsert").expect("not raced")
    }

    fn caps(texts: &[&str]) -> Vec<EmbeddedCaption> {
        texts
            .iter()
            .map(|t| EmbeddedCaption::plain(t, vec![0.0, 1.0]))
            .collect()
    }

    #[tokio::test]
    async fn an_upsert_creates_then_keeps_or_replaces_the_photo_and_syncs_captions() {
        let store = memory().await;
        let c = store.create_collection("shop", "").await.expect("create");
        let p1 = photo(1);
        let wanted = caps(&["a red shoe", "a shoe"]);
        let first = Upsert {
            external_id: "sku-1",
            seen: None,
            photo: Photo::New(&p1),
            metadata: &json!({"price": 10}),
            captions: &wanted,
        };
        let made = upserted(&store, c.id, &first).await;
        assert!(made.created && made.previous_id.is_none());
        assert_eq!(made.added_captions.len(), 2);
        let state = store.image_state(c.id, "sku-1").await.expect("state");
        assert_eq!(
            state,
            Some(ImageState {
                id: made.id,
                content_hash: Some("hash-1".into()),
                vision_id: "v@1".into(),
            })
        );
        let s = state.as_ref().expect("stored");
        assert!(s.is_photo("hash-1", "v@1"));
        assert!(!s.is_photo("hash-2", "v@1"));
        assert!(
            !s.is_photo("hash-1", "v@2"),
            "the same bytes coded by another vision model are another photo to the index"
        );

        // A stale `seen` writes nothing: one that saw no row, or the row coded by another vision model than
        // the one it holds.
        let other_model = ImageState {
            vision_id: "v@0".into(),
            ..s.clone()
        };
        for seen in [None, Some(other_model)] {
            let stale = Upsert {
                seen,
                photo: Photo::New(&p1),
                ..first
            };
            let done = store.upsert_image(c.id, &stale, PROV).await;
            assert!(done.expect("upsert").is_none(), "{:?}", stale.seen);
        }

        // The same photo: metadata replaced, one caption kept, one removed, one added; the id stays.
        let wanted = caps(&["a shoe", "a blue shoe"]);
        let same = Upsert {
            external_id: "sku-1",
            seen: state.clone(),
            photo: Photo::Same,
            metadata: &json!({"price": 12}),
            captions: &wanted,
        };
        let kept = upserted(&store, c.id, &same).await;
        assert_eq!(
            (kept.id, kept.previous_id, kept.created),
            (made.id, None, false)
        );
        assert_eq!(
            kept.caption_ids[0], made.caption_ids[1],
            "\"a shoe\" kept its id"
        );
        assert_eq!(kept.removed_captions, vec![made.caption_ids[0]]);
        assert_eq!(kept.added_captions, vec![(kept.caption_ids[1], 1)]);
        assert_eq!(
            store.image(c.id, made.id).await.expect("row").metadata,
            json!({"price": 12})
        );

        // A new photo: a new id under the same external id, captions moved, the old row and thumbnail gone.
        let p2 = photo(2);
        let new = Upsert {
            external_id: "sku-1",
            seen: store.image_state(c.id, "sku-1").await.expect("state"),
            photo: Photo::New(&p2),
            metadata: &json!({"price": 12}),
            captions: &wanted,
        };
        let replaced = upserted(&store, c.id, &new).await;
        assert_eq!(replaced.previous_id, Some(made.id));
        assert!(replaced.id > made.id && !replaced.created);
        assert_eq!(replaced.caption_ids, kept.caption_ids);
        assert!(replaced.added_captions.is_empty() && replaced.removed_captions.is_empty());
        assert!(matches!(
            store.image(c.id, made.id).await,
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            store.thumbnail(c.id, made.id).await,
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(
            store.thumbnail(c.id, replaced.id).await.expect("thumbnail"),
            Some(vec![0xFF, 0xD8, 2])
        );
        assert_eq!(
            store.image_vector(c.id, replaced.id).await.expect("vector"),
            [2.0, 1.0]
        );
        let listed = store
            .list_captions(c.id, Some(replaced.id), 0, 10)
            .await
            .expect("captions");
        assert_eq!(listed.len(), 2);
        assert_eq!(
            store
                .count_images(c.id, &Filter::all())
                .await
                .expect("count"),
            1
        );
        // Replicas learn of it: created, updated in place (its metadata), the old id deleted, the new one
        // inserted.
        let (changes, _) = store
            .changes_since(crate::Cursor::start())
            .await
            .expect("changes");
        let images: Vec<(i64, bool)> = changes
            .iter()
            .filter(|ch| ch.kind == ChangeKind::Image)
            .map(|ch| (ch.item_id, ch.delete))
            .collect();
        assert_eq!(
            images,
            vec![
                (made.id, false),
                (made.id, false),
                (made.id, true),
                (replaced.id, false)
            ]
        );

        // Under another bundle the same texts are not kept: their stored vectors are the other model's, so
        // they are deleted and the caller's vectors inserted under new ids.
        let b2 = Provenance {
            bundle_id: "b@2",
            ..PROV
        };
        let again = Upsert {
            external_id: "sku-1",
            seen: store.image_state(c.id, "sku-1").await.expect("state"),
            photo: Photo::Same,
            metadata: &json!({"price": 12}),
            captions: &wanted,
        };
        let fresh = store
            .upsert_image(c.id, &again, b2)
            .await
            .expect("upsert")
            .expect("not raced");
        assert_eq!(fresh.id, replaced.id);
        assert_eq!(fresh.removed_captions, replaced.caption_ids);
        assert_eq!(
            fresh.added_captions,
            vec![(fresh.caption_ids[0], 0), (fresh.caption_ids[1], 1)]
        );
        assert_eq!(
            store.caption_provenance().await.expect("provenance"),
            vec![("b@2".to_string(), 2)]
        );
    }

    #[tokio::test]
    async fn a_patch_merges_metadata_and_moves_the_external_id() {
        let store = memory().await;
        let c = store.create_collection("shop", "").await.expect("create");
        let mut a = photo(1);
        a.external_id = Some("a".into());
        a.metadata = json!({"color": "red", "stock": {"m": 1, "l": 0}});
        let mut b = photo(2);
        b.external_id = Some("b".into());
        let ids = store
            .insert_images(c.id, &[a, b], PROV, None)
            .await
            .expect("insert");
        let id = ids[0].0;
        let patched = store
            .patch_image(
                c.id,
                id,
                &ImagePatch {
                    metadata: Some(json!({"stock": {"l": 3}, "color": null})),
                    external_id: Some(Some("a2".into())),
                },
                None,
            )
            .await
            .expect("patch")
            .expect("no fields to check")
            .image;
        assert_eq!(patched.metadata, json!({"stock": {"m": 1, "l": 3}}));
        assert_eq!(patched.external_id.as_deref(), Some("a2"));
        let row = store.image(c.id, id).await.expect("row");
        assert_eq!(
            (row.metadata, row.external_id),
            (patched.metadata, patched.external_id)
        );
        let taken = store
            .patch_image(
                c.id,
                id,
                &ImagePatch {
                    metadata: None,
                    external_id: Some(Some("b".into())),
                },
                None,
            )
            .await
            .expect_err("b is taken");
        assert!(matches!(taken, StoreError::Conflict(_)), "{taken}");
        assert!(matches!(
            store
                .patch_image(c.id, 999, &ImagePatch::default(), None)
                .await,
            Err(StoreError::NotFound(_))
        ));
    }
}
