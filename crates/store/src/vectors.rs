//! The joint vectors of either modality, read as the index and the followers need them (a reindex writes
//! them through `reindex`).

use sqlx::{Row, any::AnyRow};

use super::{Modality, Store, StoreError, codec::blob_to_vector};

/// One stored vector and its search offset (docs/bundle.md, "The hubness section"; 0 without a bank).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredVector {
    pub id: i64,
    pub vector: Vec<f32>,
    pub offset: f32,
}

impl Store {
    /// Every (id, vector) of one modality, in id order, for building the index.
    pub async fn vectors(
        &self,
        collection_id: i64,
        modality: Modality,
    ) -> Result<Vec<(i64, Vec<f32>)>, StoreError> {
        let rows = self
            .modality_rows(modality, "id, vector", collection_id)
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get::<i64, _>("id"),
                    blob_to_vector(r.get::<&[u8], _>("vector")),
                )
            })
            .collect())
    }

    /// The vectors and offsets of the given ids that still exist, for followers applying upserts.
    pub async fn vectors_by_ids(
        &self,
        collection_id: i64,
        modality: Modality,
        ids: &[i64],
    ) -> Result<Vec<StoredVector>, StoreError> {
        let select = format!(
            "SELECT id, vector, hub_offset FROM {} WHERE collection_id = $1 AND id IN",
            modality.as_str(),
        );
        self.fetch_by_ids(&select, collection_id, ids, |r| StoredVector {
            id: r.get("id"),
            vector: blob_to_vector(r.get::<&[u8], _>("vector")),
            offset: r.get::<f64, _>("hub_offset") as f32,
        })
        .await
    }

    /// Every point's search offset in one modality of a collection (the index keeps them beside the vectors).
    pub async fn offsets(
        &self,
        collection_id: i64,
        modality: Modality,
    ) -> Result<Vec<(i64, f32)>, StoreError> {
        let rows = self
            .modality_rows(modality, "id, hub_offset", collection_id)
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<i64, _>("id"), r.get::<f64, _>("hub_offset") as f32))
            .collect())
    }

    /// `columns` of every row of one modality in the collection, in id order.
    async fn modality_rows(
        &self,
        modality: Modality,
        columns: &str,
        collection_id: i64,
    ) -> Result<Vec<AnyRow>, StoreError> {
        let sql = format!(
            "SELECT {columns} FROM {} WHERE collection_id = $1 ORDER BY id",
            modality.as_str()
        );
        Ok(sqlx::query(&sql)
            .bind(collection_id)
            .fetch_all(&self.pool)
            .await?)
    }
}
