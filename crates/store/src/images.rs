//! The images table: each image's ternary code (the durable part), its joint vector and search offset
//! (derived from the code by the loaded bundle), its metadata, and its captions and thumbnail written in the
//! same transaction. Thumbnails live in their own table keyed by image id (deleted with the image), so row
//! scans of `images` never carry them and an export of the database carries them as it is.

use serde_json::Value;
use sqlx::{Any, Row, any::AnyRow};

use super::{
    ChangeKind, EmbeddedCaption, ImportMark, Store, StoreError, Tx,
    codec::{now_rfc3339, vector_to_blob},
    conflict_or, dialect,
};
use crate::filter::{FieldPath, Filter};

#[derive(Debug, Clone)]
pub struct ImageRow {
    pub id: i64,
    pub external_id: Option<String>,
    pub metadata: Value,
    pub width: i64,
    pub height: i64,
    pub bundle_id: String,
    pub created_at: String,
}

pub struct NewImage {
    pub external_id: Option<String>,
    pub metadata: Value,
    pub width: u32,
    pub height: u32,
    pub code: Vec<u8>,
    pub vector: Vec<f32>,
    /// The image's search offset (docs/bundle.md, "The hubness section"); 0 without a bank.
    pub offset: f32,
    pub captions: Vec<EmbeddedCaption>,
    /// A small JPEG for result grids (`crate::thumbnail`); none when thumbnails are off.
    pub thumbnail: Option<Vec<u8>>,
    /// The sha256 (hex) of the photo's bytes as sent, so an upsert of the same photo skips the CNN; none
    /// where the bytes are not known (an import of codes).
    pub content_hash: Option<String>,
}

/// Which bundle produced the stored vectors.
#[derive(Debug, Clone)]
pub struct Provenance<'a> {
    pub bundle_id: &'a str,
    pub vision_id: &'a str,
}

/// An image's stored code and the vision model that made it (what a reindex reads).
#[derive(Debug, Clone)]
pub struct StoredCode {
    pub id: i64,
    pub code: Vec<u8>,
    pub vision_id: String,
}

pub(super) fn image_row(r: &AnyRow) -> ImageRow {
    ImageRow {
        id: r.get("id"),
        external_id: r.get("external_id"),
        metadata: metadata(r),
        width: r.get("width"),
        height: r.get("height"),
        bundle_id: r.get("bundle_id"),
        created_at: r.get("created_at"),
    }
}

/// The row's `metadata` column, read as text (see `dialect::image_columns`); Null if it does not parse.
pub(super) fn metadata(r: &AnyRow) -> Value {
    serde_json::from_str(r.get("metadata")).unwrap_or(Value::Null)
}

pub(super) fn no_image(id: i64) -> StoreError {
    StoreError::NotFound(format!("no image {id} in this collection"))
}

impl Store {
    /// Inserts images (and their captions) in one transaction, recording in it how far an import has got
    /// (`mark`; None outside an import). Returns the new image ids and, per image, the new caption ids.
    pub async fn insert_images(
        &self,
        collection_id: i64,
        images: &[NewImage],
        prov: Provenance<'_>,
        mark: Option<&ImportMark>,
    ) -> Result<Vec<(i64, Vec<i64>)>, StoreError> {
        let now = now_rfc3339();
        let mut tx = self.write_tx().await?;
        let mut out = Vec::with_capacity(images.len());
        for (i, img) in images.iter().enumerate() {
            out.push(
                self.insert_image_tx(&mut tx, collection_id, img, &prov, &now)
                    .await
                    .map_err(|e| match e {
                        StoreError::Conflict(m) => StoreError::Conflict(format!("image {i}: {m}")),
                        e => e,
                    })?,
            );
        }
        let image_ids: Vec<i64> = out.iter().map(|(id, _)| *id).collect();
        let caption_ids: Vec<i64> = out.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        Self::log(&mut tx, collection_id, ChangeKind::Image, false, &image_ids).await?;
        Self::log(
            &mut tx,
            collection_id,
            ChangeKind::Caption,
            false,
            &caption_ids,
        )
        .await?;
        Self::commit_insert(tx, collection_id, mark).await?;
        Ok(out)
    }

    /// One image, its thumbnail and its captions, in the caller's transaction (the caller logs the change).
    pub(super) async fn insert_image_tx(
        &self,
        tx: &mut Tx<'_>,
        collection_id: i64,
        img: &NewImage,
        prov: &Provenance<'_>,
        now: &str,
    ) -> Result<(i64, Vec<i64>), StoreError> {
        // The pgvector column, when the database holds the vector index: in the same statement as the row.
        let embedding = self.embedding_insert(13, &img.vector);
        let sql = format!(
            "INSERT INTO images (collection_id, external_id, metadata, width, height, code, vector, bundle_id, vision_id, created_at, hub_offset, content_hash{}) \
             VALUES ($1, $2, {}, $4, $5, $6, $7, $8, $9, $10, $11, $12{}) RETURNING id",
            if embedding.is_some() {
                ", embedding"
            } else {
                ""
            },
            dialect::json_param(self.engine, 3),
            embedding.as_ref().map_or("", |e| e.0.as_str()),
        );
        let q = sqlx::query_scalar(&sql)
            .bind(collection_id)
            .bind(&img.external_id)
            .bind(img.metadata.to_string())
            .bind(i64::from(img.width))
            .bind(i64::from(img.height))
            .bind(&img.code)
            .bind(vector_to_blob(&img.vector))
            .bind(prov.bundle_id)
            .bind(prov.vision_id)
            .bind(now)
            .bind(f64::from(img.offset))
            .bind(&img.content_hash);
        let q = match embedding {
            Some((_, text)) => q.bind(text),
            None => q,
        };
        let id: i64 = q.fetch_one(&mut **tx).await.map_err(|e| {
            conflict_or(e, || {
                format!(
                    "external_id \"{}\" already exists in this collection",
                    img.external_id.as_deref().unwrap_or_default()
                )
            })
        })?;
        if let Some(t) = &img.thumbnail {
            sqlx::query("INSERT INTO thumbnails (image_id, data) VALUES ($1, $2)")
                .bind(id)
                .bind(t)
                .execute(&mut **tx)
                .await?;
        }
        let mut caps = Vec::with_capacity(img.captions.len());
        for caption in &img.captions {
            caps.push(
                self.insert_caption_tx(tx, collection_id, Some(id), caption, prov.bundle_id, now)
                    .await?,
            );
        }
        self.refresh_text(tx, collection_id, &[id]).await?;
        Ok((id, caps))
    }

    pub async fn image(&self, collection_id: i64, id: i64) -> Result<ImageRow, StoreError> {
        self.image_where(collection_id, "id", id)
            .await?
            .ok_or_else(|| no_image(id))
    }

    pub async fn image_by_external_id(
        &self,
        collection_id: i64,
        external_id: &str,
    ) -> Result<ImageRow, StoreError> {
        let r = self
            .image_where(collection_id, "external_id", external_id.to_string())
            .await?;
        r.ok_or_else(|| {
            StoreError::NotFound(format!(
                "no image with external_id \"{external_id}\" in this collection"
            ))
        })
    }

    /// The collection's image whose `column` holds `value` (a unique key), if any.
    async fn image_where<T>(
        &self,
        collection_id: i64,
        column: &str,
        value: T,
    ) -> Result<Option<ImageRow>, StoreError>
    where
        T: 'static + Send + for<'q> sqlx::Encode<'q, Any> + sqlx::Type<Any>,
    {
        let sql = format!(
            "SELECT {} FROM images WHERE collection_id = $1 AND {column} = $2",
            dialect::image_columns(self.engine)
        );
        let r = sqlx::query(&sql)
            .bind(collection_id)
            .bind(value)
            .fetch_optional(&self.pool)
            .await?;
        Ok(r.as_ref().map(image_row))
    }

    pub async fn images_by_ids(
        &self,
        collection_id: i64,
        ids: &[i64],
    ) -> Result<Vec<ImageRow>, StoreError> {
        let select = format!(
            "SELECT {} FROM images WHERE collection_id = $1 AND id IN",
            dialect::image_columns(self.engine)
        );
        self.fetch_by_ids(&select, collection_id, ids, image_row)
            .await
    }

    pub async fn image_vector(&self, collection_id: i64, id: i64) -> Result<Vec<f32>, StoreError> {
        let b: Vec<u8> = self
            .image_value(
                "SELECT vector FROM images WHERE collection_id = $1 AND id = $2",
                collection_id,
                id,
            )
            .await?;
        Ok(super::codec::blob_to_vector(&b))
    }

    pub async fn image_code(&self, collection_id: i64, id: i64) -> Result<Vec<u8>, StoreError> {
        self.image_value(
            "SELECT code FROM images WHERE collection_id = $1 AND id = $2",
            collection_id,
            id,
        )
        .await
    }

    /// An image's thumbnail: `Ok(None)` when the image exists without one (ingested with thumbnails off).
    pub async fn thumbnail(
        &self,
        collection_id: i64,
        id: i64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.image_value(
            "SELECT t.data FROM images i LEFT JOIN thumbnails t ON t.image_id = i.id \
             WHERE i.collection_id = $1 AND i.id = $2",
            collection_id,
            id,
        )
        .await
    }

    /// The one value `sql` selects for image `id` ($2) of the collection ($1); NotFound without it.
    async fn image_value<T>(&self, sql: &str, collection_id: i64, id: i64) -> Result<T, StoreError>
    where
        T: Send + Unpin,
        (T,): for<'r> sqlx::FromRow<'r, AnyRow>,
    {
        let v: Option<T> = sqlx::query_scalar(sql)
            .bind(collection_id)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        v.ok_or_else(|| no_image(id))
    }

    /// Lists images, optionally only those whose metadata matches `filter`.
    pub async fn list_images(
        &self,
        collection_id: i64,
        filter: &Filter,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<ImageRow>, StoreError> {
        let columns = dialect::image_columns(self.engine);
        let page = format!("LIMIT {limit} OFFSET {offset}");
        let rows = self
            .filtered_images(columns, collection_id, filter, &page)
            .await?;
        Ok(rows.iter().map(image_row).collect())
    }

    /// How many of the collection's images match `filter`.
    pub async fn count_images(
        &self,
        collection_id: i64,
        filter: &Filter,
    ) -> Result<i64, StoreError> {
        let f = dialect::compile_filter(self.engine, filter, 2);
        let sql = format!(
            "SELECT COUNT(*) FROM images WHERE collection_id = $1{}",
            f.clause
        );
        let q = f.bind(sqlx::query(&sql).bind(collection_id));
        Ok(q.fetch_one(&self.pool).await?.try_get(0)?)
    }

    /// How many products the images matching `filter` are: one per distinct value of `group_by`, one per
    /// image without a string, number or boolean there.
    pub async fn count_products(
        &self,
        collection_id: i64,
        filter: &Filter,
        group_by: &FieldPath,
    ) -> Result<usize, StoreError> {
        let f = dialect::compile_filter(self.engine, filter, 2);
        let key = dialect::product_key(self.engine, group_by);
        let sql = format!(
            "SELECT COUNT(DISTINCT {key}) FROM images WHERE collection_id = $1{}",
            f.clause
        );
        let q = f.bind(sqlx::query(&sql).bind(collection_id));
        let n: i64 = q.fetch_one(&self.pool).await?.try_get(0)?;
        Ok(n as usize)
    }

    /// Ids of the images matching a metadata filter (for filtered search).
    pub async fn filter_image_ids(
        &self,
        collection_id: i64,
        filter: &Filter,
    ) -> Result<Vec<i64>, StoreError> {
        let rows = self
            .filtered_images("id", collection_id, filter, "")
            .await?;
        Ok(rows.iter().map(|r| r.get::<i64, _>(0)).collect())
    }

    /// The id and metadata of every image of the collection whose metadata matches `filter` (a found
    /// product's photos).
    pub async fn image_metadata_matching(
        &self,
        collection_id: i64,
        filter: &Filter,
    ) -> Result<Vec<(i64, Value)>, StoreError> {
        let meta = dialect::metadata_text(self.engine, "");
        let rows = self
            .filtered_images(&format!("id, {meta}"), collection_id, filter, "")
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<i64, _>("id"), metadata(r)))
            .collect())
    }

    /// Which of `ids` are images of the collection whose metadata matches `filter` (a few hundred candidates
    /// of a search, checked in one query per 500).
    pub async fn matching_among(
        &self,
        collection_id: i64,
        filter: &Filter,
        ids: &[i64],
    ) -> Result<Vec<i64>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let list = dialect::placeholders(2, chunk.len());
            let f = dialect::compile_filter(self.engine, filter, 2 + chunk.len());
            let sql = format!(
                "SELECT id FROM images WHERE collection_id = $1 AND id IN ({list}){}",
                f.clause
            );
            let mut q = sqlx::query(&sql).bind(collection_id);
            for id in chunk {
                q = q.bind(id);
            }
            let q = f.bind(q);
            out.extend(
                q.fetch_all(&self.pool)
                    .await?
                    .iter()
                    .map(|r| r.get::<i64, _>(0)),
            );
        }
        Ok(out)
    }

    /// `columns` of the collection's images whose metadata matches `filter`, in id order, then `tail`
    /// (a LIMIT/OFFSET, or nothing).
    async fn filtered_images(
        &self,
        columns: &str,
        collection_id: i64,
        filter: &Filter,
        tail: &str,
    ) -> Result<Vec<AnyRow>, StoreError> {
        let f = dialect::compile_filter(self.engine, filter, 2);
        let sql = format!(
            "SELECT {columns} FROM images WHERE collection_id = $1{} ORDER BY id {tail}",
            f.clause
        );
        let q = f.bind(sqlx::query(&sql).bind(collection_id));
        Ok(q.fetch_all(&self.pool).await?)
    }

    /// Deletes an image with its captions; returns the captions' ids.
    pub async fn delete_image(&self, collection_id: i64, id: i64) -> Result<Vec<i64>, StoreError> {
        let mut tx = self.write_tx().await?;
        let caps: Vec<i64> = sqlx::query_scalar("SELECT id FROM captions WHERE image_id = $1")
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
        let n = sqlx::query("DELETE FROM images WHERE collection_id = $1 AND id = $2")
            .bind(collection_id)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if n.rows_affected() == 0 {
            return Err(no_image(id));
        }
        Self::forget_text_tx(&mut tx, self.engine, &[id]).await?;
        Self::log(&mut tx, collection_id, ChangeKind::Image, true, &[id]).await?;
        Self::log(&mut tx, collection_id, ChangeKind::Caption, true, &caps).await?;
        Self::bump(&mut tx, collection_id).await?;
        tx.commit().await?;
        Ok(caps)
    }

    /// (bundle_id, vision_id, count) of the stored image vectors, to detect vectors from another bundle.
    pub async fn image_provenance(&self) -> Result<Vec<(String, String, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT bundle_id, vision_id, COUNT(*) AS n FROM images GROUP BY bundle_id, vision_id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("bundle_id"), r.get("vision_id"), r.get("n")))
            .collect())
    }

    /// Image metadata by id, or every image's in the collection when `ids` is None (the in-memory attribute
    /// table keeps it beside the vectors). Ids no longer there are simply not returned.
    pub async fn image_metadata(
        &self,
        collection_id: i64,
        ids: Option<&[i64]>,
    ) -> Result<Vec<(i64, Value)>, StoreError> {
        let meta = dialect::metadata_text(self.engine, "");
        let row = |r: &AnyRow| (r.get::<i64, _>("id"), metadata(r));
        match ids {
            Some(ids) => {
                let select =
                    format!("SELECT id, {meta} FROM images WHERE collection_id = $1 AND id IN");
                self.fetch_by_ids(&select, collection_id, ids, row).await
            }
            None => {
                let sql = format!("SELECT id, {meta} FROM images WHERE collection_id = $1");
                let rows = sqlx::query(&sql)
                    .bind(collection_id)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows.iter().map(row).collect())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{modality::Modality, testing::memory};

    fn image(external_id: &str, metadata: Value, offset: f32) -> NewImage {
        NewImage {
            external_id: Some(external_id.into()),
            metadata,
            width: 4,
            height: 3,
            code: vec![0b01_10_00_01],
            vector: vec![0.6, 0.8],
            offset,
            captions: vec![EmbeddedCaption::plain("a red shoe", vec![1.0, 0.0])],
            thumbnail: None,
            content_hash: None,
        }
    }

    const PROV: Provenance<'static> = Provenance {
        bundle_id: "b@1",
        vision_id: "v@1",
    };

    #[tokio::test]
    async fn filters_select_by_metadata_and_ids_come_back_in_chunks() {
        let store = memory().await;
        let c = store.create_collection("shop", "").await.expect("create");
        let rows: Vec<NewImage> = (0..1_200)
            .map(|i| {
                image(
                    &format!("sku-{i}"),
                    json!({"size": if i % 3 == 0 { "M" } else { "L" }, "in_stock": i % 2 == 0, "n": i}),
                    -0.01 * (i % 7) as f32,
                )
            })
            .collect();
        let ids = store
            .insert_images(c.id, &rows, PROV, None)
            .await
            .expect("insert");
        assert_eq!(ids.len(), 1_200);
        assert!(ids.iter().all(|(_, caps)| caps.len() == 1));
        let f = Filter::parse(&json!({"size": "M", "in_stock": true})).expect("filter");
        let matching = store.filter_image_ids(c.id, &f).await.expect("filter");
        // i % 6 == 0 among 0..1200.
        assert_eq!(matching.len(), 200);
        let listed = store.list_images(c.id, &f, 10, 5).await.expect("list");
        assert_eq!(listed.len(), 5);
        assert_eq!(listed[0].metadata["n"], json!(60));
        // More ids than one IN-list chunk, and one that does not exist.
        let mut wanted: Vec<i64> = ids.iter().map(|(id, _)| *id).collect();
        wanted.push(999_999);
        let got = store.images_by_ids(c.id, &wanted).await.expect("by ids");
        assert_eq!(got.len(), 1_200);
        let offsets = store
            .offsets(c.id, Modality::Images)
            .await
            .expect("offsets");
        assert_eq!(offsets.len(), 1_200);
        assert!(offsets.iter().any(|(_, o)| (*o + 0.06).abs() < 1e-6));
    }

    #[tokio::test]
    async fn thumbnails_are_stored_with_their_image_and_go_with_it() {
        let store = memory().await;
        let c = store.create_collection("shop", "").await.expect("create");
        let mut with = image("with", json!({}), 0.0);
        with.thumbnail = Some(vec![0xFF, 0xD8, 1, 2, 3]);
        let ids = store
            .insert_images(c.id, &[with, image("without", json!({}), 0.0)], PROV, None)
            .await
            .expect("insert");
        let (a, b) = (ids[0].0, ids[1].0);
        assert_eq!(
            store.thumbnail(c.id, a).await.expect("thumbnail"),
            Some(vec![0xFF, 0xD8, 1, 2, 3])
        );
        assert_eq!(store.thumbnail(c.id, b).await.expect("no thumbnail"), None);
        let other = store.create_collection("other", "").await.expect("create");
        assert!(matches!(
            store.thumbnail(other.id, a).await,
            Err(StoreError::NotFound(_))
        ));
        store.delete_image(c.id, a).await.expect("delete");
        assert!(matches!(
            store.thumbnail(c.id, a).await,
            Err(StoreError::NotFound(_))
        ));
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM thumbnails")
            .fetch_one(&store.pool)
            .await
            .expect("count");
        assert_eq!(left, 0, "the thumbnail went with its image");
    }

    #[tokio::test]
    async fn codes_and_vectors_round_trip_and_a_duplicate_external_id_conflicts() {
        let store = memory().await;
        let c = store.create_collection("shop", "").await.expect("create");
        let ids = store
            .insert_images(c.id, &[image("a", json!({}), 0.0)], PROV, None)
            .await
            .expect("insert");
        let id = ids[0].0;
        assert_eq!(
            store.image_code(c.id, id).await.expect("code"),
            [0b01_10_00_01]
        );
        assert_eq!(
            store.image_vector(c.id, id).await.expect("vector"),
            [0.6, 0.8]
        );
        let page = store
            .stale_codes_page("another bundle", 0, 10)
            .await
            .expect("codes");
        assert_eq!((page[0].id, page[0].vision_id.as_str()), (id, "v@1"));
        let e = store
            .insert_images(c.id, &[image("a", json!({}), 0.0)], PROV, None)
            .await
            .expect_err("same external id");
        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
        let caps = store.delete_image(c.id, id).await.expect("delete");
        assert_eq!(caps, ids[0].1);
        assert!(matches!(
            store.image(c.id, id).await,
            Err(StoreError::NotFound(_))
        ));
    }
}
