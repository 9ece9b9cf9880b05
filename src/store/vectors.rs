//! The joint vectors of either modality, read and written as the index and a reindex need them.

use sqlx::Row;

use super::{
    Modality, Store, StoreError,
    codec::{blob_to_vector, vector_to_blob},
};

/// One stored vector. `offset` is an image's search offset (0 without a hubness bank); captions have none.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredVector {
    pub id: i64,
    pub vector: Vec<f32>,
    pub offset: Option<f32>,
}

impl Store {
    /// Every (id, vector) of one modality, in id order, for building the index.
    pub async fn vectors(
        &self,
        collection_id: i64,
        modality: Modality,
    ) -> Result<Vec<(i64, Vec<f32>)>, StoreError> {
        let sql = format!(
            "SELECT id, vector FROM {} WHERE collection_id = $1 ORDER BY id",
            modality.as_str()
        );
        let rows = sqlx::query(&sql)
            .bind(collection_id)
            .fetch_all(&self.pool)
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

    /// Rewrites vectors (and images' search offsets) in one transaction and bumps every collection's
    /// generation (their snapshots go stale).
    pub async fn update_vectors(
        &self,
        modality: Modality,
        rows: &[StoredVector],
        bundle_id: &str,
    ) -> Result<(), StoreError> {
        let images = modality == Modality::Images;
        let mut tx = self.write_tx().await?;
        let sql = format!(
            "UPDATE {} SET vector = $1, bundle_id = $2{} WHERE id = $3",
            modality.as_str(),
            if images { ", hub_offset = $4" } else { "" }
        );
        for row in rows {
            let q = sqlx::query(&sql)
                .bind(vector_to_blob(&row.vector))
                .bind(bundle_id)
                .bind(row.id);
            let q = if images {
                q.bind(f64::from(row.offset.unwrap_or(0.0)))
            } else {
                q
            };
            q.execute(&mut *tx).await?;
        }
        sqlx::query("UPDATE collections SET generation = generation + 1")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The vectors (and images' offsets) of the given ids that still exist, for followers applying upserts.
    pub async fn vectors_by_ids(
        &self,
        collection_id: i64,
        modality: Modality,
        ids: &[i64],
    ) -> Result<Vec<StoredVector>, StoreError> {
        let images = modality == Modality::Images;
        let select = format!(
            "SELECT id, vector{} FROM {} WHERE collection_id = $1 AND id IN",
            if images { ", hub_offset" } else { "" },
            modality.as_str(),
        );
        self.fetch_by_ids(&select, collection_id, ids, |r| StoredVector {
            id: r.get("id"),
            vector: blob_to_vector(r.get::<&[u8], _>("vector")),
            offset: images.then(|| r.get::<f64, _>("hub_offset") as f32),
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::{NewCaption, NewImage, Provenance, testing::memory};

    #[tokio::test]
    async fn updates_rewrite_vectors_and_offsets_and_make_snapshots_stale() {
        let store = memory().await;
        let c = store.create_collection("c", "").await.expect("create");
        let prov = Provenance {
            bundle_id: "old",
            vision_id: "v",
        };
        let img = NewImage {
            external_id: None,
            metadata: json!({}),
            width: 1,
            height: 1,
            code: vec![0],
            vector: vec![1.0, 0.0],
            offset: 0.0,
            captions: vec![],
            thumbnail: None,
        };
        let id = store
            .insert_images(c.id, &[img], prov)
            .await
            .expect("insert")[0]
            .0;
        let cap = store
            .insert_captions(
                c.id,
                &[NewCaption {
                    image_id: None,
                    text: "x".into(),
                    vector: vec![0.0, 1.0],
                }],
                "old",
            )
            .await
            .expect("caption")[0];
        let generation = store.collection("c").await.expect("row").generation;
        let new = StoredVector {
            id,
            vector: vec![0.0, 1.0],
            offset: Some(-0.25),
        };
        store
            .update_vectors(Modality::Images, std::slice::from_ref(&new), "new")
            .await
            .expect("update images");
        store
            .update_vectors(
                Modality::Captions,
                &[StoredVector {
                    id: cap,
                    vector: vec![1.0, 0.0],
                    offset: None,
                }],
                "new",
            )
            .await
            .expect("update captions");
        let got = store
            .vectors_by_ids(c.id, Modality::Images, &[id, 12_345])
            .await
            .expect("read back");
        assert_eq!(got, [new]);
        let caps = store
            .vectors_by_ids(c.id, Modality::Captions, &[cap])
            .await
            .expect("captions");
        assert_eq!(
            (caps[0].offset, caps[0].vector.as_slice()),
            (None, &[1.0, 0.0][..])
        );
        assert_eq!(
            store.caption_provenance().await.expect("provenance"),
            [("new".to_string(), 1)]
        );
        assert!(store.collection("c").await.expect("row").generation > generation);
    }
}
