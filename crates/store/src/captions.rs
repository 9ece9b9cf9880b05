//! The captions table: sentences with their joint vectors, attached to an image or free-standing.

use sqlx::{Row, any::AnyRow};

use super::{
    ChangeKind, ImportMark, Store, StoreError, Tx,
    codec::{now_rfc3339, vector_to_blob},
    conflict_or,
};

#[derive(Debug, Clone)]
pub struct CaptionRow {
    pub id: i64,
    pub image_id: Option<i64>,
    pub text: String,
    /// The text field of the image this sentence was taken from; None for a caption someone wrote.
    pub field: Option<String>,
    pub created_at: String,
}

/// The columns `caption_row` reads.
const CAPTION_COLUMNS: &str = "id, image_id, text, field, created_at";

/// A sentence with what the server derives from it to store: its joint vector and its search offset
/// (docs/bundle.md, "The annotation side"; 0 without an annotation bank).
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddedCaption {
    pub text: String,
    pub vector: Vec<f32>,
    pub offset: f32,
    /// The text field it was taken from (a sentence of the image's metadata); None for a written caption.
    pub field: Option<String>,
}

pub struct NewCaption {
    pub image_id: Option<i64>,
    pub caption: EmbeddedCaption,
}

impl EmbeddedCaption {
    /// A sentence with the (vector, offset) the service computed for it.
    pub fn new(text: String, (vector, offset): (Vec<f32>, f32)) -> EmbeddedCaption {
        EmbeddedCaption {
            text,
            vector,
            offset,
            field: None,
        }
    }

    /// A sentence of the image's text field `field`, with its (vector, offset).
    pub fn of_field(field: String, text: String, v: (Vec<f32>, f32)) -> EmbeddedCaption {
        EmbeddedCaption {
            field: Some(field),
            ..EmbeddedCaption::new(text, v)
        }
    }

    /// A field's sentence that is stored already, so the store keeps its row and vector (an upsert or a PATCH
    /// that leaves the field's text as it was).
    pub fn kept_field(field: String, text: String) -> EmbeddedCaption {
        EmbeddedCaption::of_field(field, text, (vec![], 0.0))
    }
}

#[cfg(test)]
impl EmbeddedCaption {
    /// A caption without an offset (a bundle without an annotation bank).
    pub fn plain(text: &str, vector: Vec<f32>) -> EmbeddedCaption {
        EmbeddedCaption::new(text.into(), (vector, 0.0))
    }
}

fn caption_row(r: &AnyRow) -> CaptionRow {
    CaptionRow {
        id: r.get("id"),
        image_id: r.get("image_id"),
        text: r.get("text"),
        field: r.get("field"),
        created_at: r.get("created_at"),
    }
}

impl Store {
    /// Stores new captions in one transaction, recording in it how far an import has got (`mark`, an
    /// import's; None otherwise).
    pub async fn insert_captions(
        &self,
        collection_id: i64,
        caps: &[NewCaption],
        bundle_id: &str,
        mark: Option<&ImportMark>,
    ) -> Result<Vec<i64>, StoreError> {
        let now = now_rfc3339();
        let mut tx = self.write_tx().await?;
        let mut ids = Vec::with_capacity(caps.len());
        for (i, c) in caps.iter().enumerate() {
            if let Some(image_id) = c.image_id {
                let ok: Option<i64> = sqlx::query_scalar(
                    "SELECT id FROM images WHERE collection_id = $1 AND id = $2",
                )
                .bind(collection_id)
                .bind(image_id)
                .fetch_optional(&mut *tx)
                .await?;
                if ok.is_none() {
                    return Err(StoreError::NotFound(format!(
                        "caption {i}: no image {image_id} in this collection"
                    )));
                }
            }
            ids.push(
                self.insert_caption_tx(
                    &mut tx,
                    collection_id,
                    c.image_id,
                    &c.caption,
                    bundle_id,
                    &now,
                )
                .await?,
            );
        }
        let mut images: Vec<i64> = caps.iter().filter_map(|c| c.image_id).collect();
        images.sort_unstable();
        images.dedup();
        self.refresh_text(&mut tx, collection_id, &images).await?;
        Self::log(&mut tx, collection_id, ChangeKind::Caption, false, &ids).await?;
        Self::commit_insert(tx, collection_id, mark).await?;
        Ok(ids)
    }

    /// One caption, in the caller's write transaction (images insert theirs in the same one).
    pub(super) async fn insert_caption_tx(
        &self,
        tx: &mut Tx<'_>,
        collection_id: i64,
        image_id: Option<i64>,
        caption: &EmbeddedCaption,
        bundle_id: &str,
        now: &str,
    ) -> Result<i64, StoreError> {
        // The pgvector column, when the database holds the vector index: in the same statement as the row.
        if caption.vector.is_empty() {
            // A field's sentence the caller took to be stored already, which is not (a write in between).
            return Err(StoreError::Conflict(format!(
                "the image's text changed while this write ran (\"{}\"); send it again",
                caption.text
            )));
        }
        let embedding = self.embedding_insert(9, &caption.vector);
        let sql = format!(
            "INSERT INTO captions (collection_id, image_id, text, vector, bundle_id, created_at, hub_offset, field{}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8{}) RETURNING id",
            if embedding.is_some() {
                ", embedding"
            } else {
                ""
            },
            embedding.as_ref().map_or("", |e| e.0.as_str()),
        );
        let q = sqlx::query_scalar(&sql)
            .bind(collection_id)
            .bind(image_id)
            .bind(&caption.text)
            .bind(vector_to_blob(&caption.vector))
            .bind(bundle_id)
            .bind(now)
            .bind(f64::from(caption.offset))
            .bind(&caption.field);
        match embedding {
            Some((_, text)) => q.bind(text),
            None => q,
        }
        .fetch_one(&mut **tx)
        .await
        .map_err(|e| conflict_or(e, String::new))
    }

    pub async fn list_captions(
        &self,
        collection_id: i64,
        image_id: Option<i64>,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<CaptionRow>, StoreError> {
        let rows = match image_id {
            Some(img) => sqlx::query(&format!(
                "SELECT {CAPTION_COLUMNS} FROM captions WHERE collection_id = $1 AND image_id = $2 AND field IS NULL ORDER BY id LIMIT {limit} OFFSET {offset}"
            ))
            .bind(collection_id)
            .bind(img)
            .fetch_all(&self.pool)
            .await?,
            None => sqlx::query(&format!(
                "SELECT {CAPTION_COLUMNS} FROM captions WHERE collection_id = $1 AND field IS NULL ORDER BY id LIMIT {limit} OFFSET {offset}"
            ))
            .bind(collection_id)
            .fetch_all(&self.pool)
            .await?,
        };
        Ok(rows.iter().map(caption_row).collect())
    }

    /// How many captions the collection (or one of its images) has.
    pub async fn count_captions(
        &self,
        collection_id: i64,
        image_id: Option<i64>,
    ) -> Result<i64, StoreError> {
        Ok(match image_id {
            Some(img) => {
                sqlx::query_scalar(
                    "SELECT COUNT(*) FROM captions WHERE collection_id = $1 AND image_id = $2 AND field IS NULL",
                )
                .bind(collection_id)
                .bind(img)
                .fetch_one(&self.pool)
                .await?
            }
            None => {
                sqlx::query_scalar("SELECT COUNT(*) FROM captions WHERE collection_id = $1 AND field IS NULL")
                    .bind(collection_id)
                    .fetch_one(&self.pool)
                    .await?
            }
        })
    }

    /// Every sentence row of a collection: written captions and text-field sentences, what its caption index
    /// holds.
    pub async fn count_sentences(&self, collection_id: i64) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT COUNT(*) FROM captions WHERE collection_id = $1")
                .bind(collection_id)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The (field, sentence) pairs stored for an image's text fields, embedded by bundle `bundle_id`.
    pub async fn field_captions(
        &self,
        collection_id: i64,
        image_id: i64,
        bundle_id: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT field, text FROM captions WHERE collection_id = $1 AND image_id = $2 \
             AND field IS NOT NULL AND bundle_id = $3 ORDER BY id",
        )
        .bind(collection_id)
        .bind(image_id)
        .bind(bundle_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("field"), r.get("text")))
            .collect())
    }

    /// The texts of an image's written captions (not its text fields' sentences) embedded by `bundle_id`: what
    /// an upsert need not embed again.
    pub async fn written_captions(
        &self,
        collection_id: i64,
        image_id: i64,
        bundle_id: &str,
    ) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT text FROM captions WHERE collection_id = $1 AND image_id = $2 \
             AND field IS NULL AND bundle_id = $3 ORDER BY id",
        )
        .bind(collection_id)
        .bind(image_id)
        .bind(bundle_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| r.get("text")).collect())
    }

    /// Up to `n` of a collection's captions of images (written or a text field's), as (caption id, image id),
    /// spread evenly over its ids: the same ones while it is unchanged. Each is the first caption of an image
    /// at or after one of `n` evenly spaced ids, found on the (collection, id) index, so the cost does not grow
    /// with the collection.
    pub async fn sample_captions(
        &self,
        collection_id: i64,
        n: usize,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        let row = sqlx::query(
            "SELECT MIN(id) AS lo, MAX(id) AS hi FROM captions WHERE collection_id = $1",
        )
        .bind(collection_id)
        .fetch_one(&self.pool)
        .await?;
        let (Some(lo), Some(hi)) = (
            row.get::<Option<i64>, _>("lo"),
            row.get::<Option<i64>, _>("hi"),
        ) else {
            return Ok(Vec::new());
        };
        let step = (hi - lo + 1) as f64 / n.max(1) as f64;
        // One statement: a first-at-or-after lookup per evenly spaced id (each a subquery, as SQLite wants a
        // compound select's LIMIT inside one).
        let mut starts: Vec<i64> = (0..n).map(|k| lo + (k as f64 * step) as i64).collect();
        // With fewer ids than `n` the starts repeat: each is looked up once.
        starts.dedup();
        let sql = starts
            .iter()
            .enumerate()
            .map(|(k, start)| {
                format!(
                    "SELECT id, image_id FROM (SELECT id, image_id FROM captions WHERE collection_id = $1 \
                     AND id >= {start} AND image_id IS NOT NULL ORDER BY id LIMIT 1) AS s{k}"
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let rows = sqlx::query(&sql)
            .bind(collection_id)
            .fetch_all(&self.pool)
            .await?;
        let mut seen = std::collections::HashSet::new();
        Ok(rows
            .iter()
            .map(|r| (r.get("id"), r.get("image_id")))
            .filter(|(id, _): &(i64, i64)| seen.insert(*id))
            .collect())
    }

    pub async fn captions_by_ids(
        &self,
        collection_id: i64,
        ids: &[i64],
    ) -> Result<Vec<CaptionRow>, StoreError> {
        self.fetch_by_ids(
            &format!("SELECT {CAPTION_COLUMNS} FROM captions WHERE collection_id = $1 AND id IN"),
            collection_id,
            ids,
            caption_row,
        )
        .await
    }

    pub async fn delete_caption(&self, collection_id: i64, id: i64) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        let image: Option<Option<i64>> = sqlx::query_scalar(
            "DELETE FROM captions WHERE collection_id = $1 AND id = $2 RETURNING image_id",
        )
        .bind(collection_id)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(image) = image else {
            return Err(StoreError::NotFound(format!(
                "no caption {id} in this collection"
            )));
        };
        if let Some(image) = image {
            self.refresh_text(&mut tx, collection_id, &[image]).await?;
        }
        Self::log(&mut tx, collection_id, ChangeKind::Caption, true, &[id]).await?;
        Self::bump(&mut tx, collection_id).await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn caption_provenance(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = sqlx::query("SELECT bundle_id, COUNT(*) AS n FROM captions GROUP BY bundle_id")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("bundle_id"), r.get("n")))
            .collect())
    }
}
