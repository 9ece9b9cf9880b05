//! The staged reindex: new vectors are written beside the old ones (`reindex_staging`) page by page, then
//! switched into `images` and `captions` in one transaction that also bumps every collection's generation
//! and tells the other replicas to reload. Until that commit every reader sees the old vectors; after it,
//! the new ones; a crash in between leaves the old state, and the rows already staged are picked up again by
//! the next reindex under the same bundle.

use sqlx::{Row, any::AnyRow};

use super::{
    Engine, Modality, Store, StoreError, changes::ChangeKind, codec::vector_to_blob,
    images::StoredCode, vectors::StoredVector,
};

/// What switching the staged vectors in did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// The staged rows are now the stored vectors: (images, captions) rewritten.
    Done(u64, u64),
    /// Rows of another bundle arrived that have no staged vector yet (a writer on the old bundle): stage
    /// them and switch again. Nothing was changed.
    Unstaged(u64),
}

/// Rows still to be reindexed: not of `bundle_id`, and not yet staged for it.
fn stale(modality: Modality) -> String {
    format!(
        "{m}.bundle_id <> $1 AND {m}.id NOT IN \
         (SELECT item_id FROM reindex_staging WHERE modality = '{m}' AND bundle_id = $1)",
        m = modality.as_str()
    )
}

impl Store {
    /// Drops what an interrupted reindex under another bundle staged; returns how many rows are already
    /// staged for `bundle_id` (a resumed reindex).
    pub async fn begin_reindex(&self, bundle_id: &str) -> Result<i64, StoreError> {
        let mut tx = self.write_tx().await?;
        sqlx::query("DELETE FROM reindex_staging WHERE bundle_id <> $1")
            .bind(bundle_id)
            .execute(&mut *tx)
            .await?;
        let kept: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM reindex_staging")
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(kept)
    }

    /// How many rows a reindex under `bundle_id` left staged (0 when none was interrupted).
    pub async fn staged_rows(&self, bundle_id: &str) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT COUNT(*) FROM reindex_staging WHERE bundle_id = $1")
                .bind(bundle_id)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// A page of the codes of images still to reindex for `bundle_id`, after `after`, in id order.
    pub async fn stale_codes_page(
        &self,
        bundle_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<StoredCode>, StoreError> {
        let rows = self
            .stale_page(
                Modality::Images,
                "id, code, vision_id",
                bundle_id,
                after,
                limit,
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| StoredCode {
                id: r.get("id"),
                code: r.get("code"),
                vision_id: r.get("vision_id"),
            })
            .collect())
    }

    /// A page of (id, text) of captions still to reindex for `bundle_id`, after `after`, in id order.
    pub async fn stale_captions_page(
        &self,
        bundle_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = self
            .stale_page(Modality::Captions, "id, text", bundle_id, after, limit)
            .await?;
        Ok(rows.iter().map(|r| (r.get("id"), r.get("text"))).collect())
    }

    /// `columns` of up to `limit` rows still to reindex for `bundle_id`, after `after`, in id order.
    async fn stale_page(
        &self,
        modality: Modality,
        columns: &str,
        bundle_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<AnyRow>, StoreError> {
        let sql = format!(
            "SELECT {columns} FROM {} WHERE {} AND id > $2 ORDER BY id LIMIT $3",
            modality.as_str(),
            stale(modality)
        );
        Ok(sqlx::query(&sql)
            .bind(bundle_id)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Stages recomputed vectors (idempotent: a row staged twice keeps the last vector).
    pub async fn stage_vectors(
        &self,
        modality: Modality,
        rows: &[StoredVector],
        bundle_id: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        for row in rows {
            sqlx::query(
                "INSERT INTO reindex_staging (modality, item_id, bundle_id, vector, hub_offset) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (modality, item_id) DO UPDATE SET \
                 bundle_id = excluded.bundle_id, vector = excluded.vector, hub_offset = excluded.hub_offset",
            )
            .bind(modality.as_str())
            .bind(row.id)
            .bind(bundle_id)
            .bind(vector_to_blob(&row.vector))
            .bind(f64::from(row.offset))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Switches every staged vector of `bundle_id` in, in one transaction, unless some row still needs one.
    pub async fn switch_to_staged(&self, bundle_id: &str) -> Result<Switch, StoreError> {
        let mut tx = self.write_tx().await?;
        if self.engine == Engine::Postgres {
            // SQLite's BEGIN IMMEDIATE already keeps other writers out; on Postgres an insert committed
            // between the count below and the updates would stay on the old bundle.
            sqlx::query("LOCK TABLE images, captions IN SHARE ROW EXCLUSIVE MODE")
                .execute(&mut *tx)
                .await?;
        }
        let mut unstaged = 0i64;
        for m in Modality::BOTH {
            let sql = format!("SELECT COUNT(*) FROM {} WHERE {}", m.as_str(), stale(m));
            let n: i64 = sqlx::query_scalar(&sql)
                .bind(bundle_id)
                .fetch_one(&mut *tx)
                .await?;
            unstaged += n;
        }
        if unstaged > 0 {
            tx.rollback().await?;
            return Ok(Switch::Unstaged(unstaged as u64));
        }
        let mut done = [0u64; 2];
        for (i, m) in Modality::BOTH.into_iter().enumerate() {
            let t = m.as_str();
            let staged = |col: &str| {
                format!(
                    "(SELECT s.{col} FROM reindex_staging s \
                     WHERE s.modality = '{t}' AND s.item_id = {t}.id AND s.bundle_id = $1)"
                )
            };
            // The pgvector column of a rewritten row is emptied here and filled below, before the commit.
            let sql = format!(
                "UPDATE {t} SET vector = {}, hub_offset = {}, bundle_id = $1{} WHERE bundle_id <> $1 AND id IN \
                 (SELECT item_id FROM reindex_staging WHERE modality = '{t}' AND bundle_id = $1)",
                staged("vector"),
                staged("hub_offset"),
                if self.embedding_dim().is_some() {
                    ", embedding = NULL"
                } else {
                    ""
                },
            );
            done[i] = sqlx::query(&sql)
                .bind(bundle_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            self.fill_embeddings_in(&mut tx, t).await?;
        }
        sqlx::query("DELETE FROM reindex_staging WHERE bundle_id = $1")
            .bind(bundle_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE collections SET generation = generation + 1")
            .execute(&mut *tx)
            .await?;
        Self::log(&mut tx, 0, ChangeKind::All, false, &[0]).await?;
        tx.commit().await?;
        let [images, captions] = done;
        Ok(Switch::Done(images, captions))
    }

    /// The staged vector of one row, if any (what the switch would write).
    #[cfg(test)]
    async fn staged(&self, modality: Modality, id: i64) -> Option<Vec<f32>> {
        sqlx::query("SELECT vector FROM reindex_staging WHERE modality = $1 AND item_id = $2")
            .bind(modality.as_str())
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .expect("staged")
            .map(|r| super::codec::blob_to_vector(r.get::<&[u8], _>("vector")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Provenance,
        testing::{bare_image, free_caption, memory},
    };

    /// The ids of the first page of images still to reindex for `bundle_id`.
    async fn stale_images(store: &Store, bundle_id: &str) -> Vec<i64> {
        let page = store.stale_codes_page(bundle_id, 0, 10).await;
        page.expect("images").iter().map(|c| c.id).collect()
    }

    /// The first page of captions still to reindex for `bundle_id`.
    async fn stale_captions(store: &Store, bundle_id: &str) -> Vec<(i64, String)> {
        let page = store.stale_captions_page(bundle_id, 0, 10).await;
        page.expect("captions")
    }

    async fn seeded(store: &Store) -> (i64, i64, i64) {
        let c = store.create_collection("c", "").await.expect("create");
        let prov = Provenance {
            bundle_id: "old",
            vision_id: "v",
        };
        let id = store
            .insert_images(c.id, &[bare_image()], prov, None)
            .await
            .expect("insert")[0]
            .0;
        let cap = store
            .insert_captions(c.id, &[free_caption("x", vec![0.0, 1.0])], "old", None)
            .await
            .expect("caption")[0];
        (c.id, id, cap)
    }

    #[tokio::test]
    async fn staged_vectors_are_invisible_until_the_switch_then_replace_the_old_ones() {
        let store = memory().await;
        let (c, id, cap) = seeded(&store).await;
        let generation = store.collection("c").await.expect("row").generation;
        let new = StoredVector {
            id,
            vector: vec![0.0, 1.0],
            offset: -0.25,
        };
        assert_eq!(store.begin_reindex("new").await.expect("begin"), 0);
        assert_eq!(stale_images(&store, "new").await, [id]);
        store
            .stage_vectors(Modality::Images, std::slice::from_ref(&new), "new")
            .await
            .expect("stage");
        // Staged: the stored vector is still the old one, and the image is no longer to do.
        let old = store
            .vectors_by_ids(c, Modality::Images, &[id])
            .await
            .expect("read");
        assert_eq!(old[0].vector, [1.0, 0.0]);
        assert!(stale_images(&store, "new").await.is_empty());
        // The caption is not staged yet: the switch refuses and changes nothing.
        assert_eq!(
            store.switch_to_staged("new").await.expect("switch"),
            Switch::Unstaged(1)
        );
        assert_eq!(
            store.staged(Modality::Images, id).await,
            Some(vec![0.0, 1.0])
        );
        assert_eq!(
            stale_captions(&store, "new").await,
            [(cap, "x".to_string())]
        );
        store
            .stage_vectors(
                Modality::Captions,
                &[StoredVector {
                    id: cap,
                    vector: vec![1.0, 0.0],
                    offset: -0.125,
                }],
                "new",
            )
            .await
            .expect("stage caption");
        assert_eq!(
            store.switch_to_staged("new").await.expect("switch"),
            Switch::Done(1, 1)
        );
        let got = store
            .vectors_by_ids(c, Modality::Images, &[id, 12_345])
            .await
            .expect("read back");
        assert_eq!(got, [new]);
        let caps = store
            .vectors_by_ids(c, Modality::Captions, &[cap])
            .await
            .expect("captions");
        assert_eq!(
            (caps[0].offset, caps[0].vector.as_slice()),
            (-0.125, &[1.0, 0.0][..])
        );
        assert_eq!(
            store.caption_provenance().await.expect("provenance"),
            [("new".to_string(), 1)]
        );
        assert_eq!(store.staged_rows("new").await.expect("staged"), 0);
        assert!(store.collection("c").await.expect("row").generation > generation);
    }

    #[tokio::test]
    async fn a_new_reindex_keeps_its_own_bundles_staged_rows_and_drops_others() {
        let store = memory().await;
        let (_, id, cap) = seeded(&store).await;
        let v = |id| StoredVector {
            id,
            vector: vec![0.5, 0.5],
            offset: 0.0,
        };
        store
            .stage_vectors(Modality::Images, &[v(id)], "b1")
            .await
            .expect("stage b1");
        store
            .stage_vectors(Modality::Captions, &[v(cap)], "b2")
            .await
            .expect("stage b2");
        // Resuming under b2: b1's row goes, b2's stays and is not handed out again.
        assert_eq!(store.begin_reindex("b2").await.expect("begin"), 1);
        assert_eq!(store.staged(Modality::Images, id).await, None);
        assert!(stale_captions(&store, "b2").await.is_empty());
        assert_eq!(stale_images(&store, "b2").await, [id]);
    }
}
