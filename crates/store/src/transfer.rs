//! Reading a collection out whole (an export) and remembering how far an import got.
//!
//! An export reads in one transaction that sees a single point in time (SQLite: a read transaction in WAL
//! mode; Postgres: REPEATABLE READ), page by page in id order, so a live collection exports as it was when the
//! export started, with no write blocked meanwhile.

use serde_json::Value;
use sqlx::{Row, any::AnyRow};

use super::{
    Engine, ImageRow, Store, StoreError, Tx, codec,
    images::{self, image_row},
};

/// One image as an export carries it: everything but the vector, which is the loaded bundle's function of
/// the code.
#[derive(Debug, Clone)]
pub struct ExportedImage {
    pub id: i64,
    pub external_id: Option<String>,
    pub metadata: Value,
    pub width: i64,
    pub height: i64,
    pub code: Vec<u8>,
    pub vision_id: String,
    /// The bundle whose W made the stored vector.
    pub bundle_id: String,
    pub content_hash: Option<String>,
    pub created_at: String,
    pub thumbnail: Option<Vec<u8>>,
    pub captions: Vec<String>,
}

/// An image with an external id as a catalogue sync sees it: the digest of its photo's bytes (none for an
/// image imported from codes), the vision model that coded it, what describes it, and its captions.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncedImage {
    pub id: i64,
    pub external_id: String,
    pub content_hash: Option<String>,
    /// The vision model that made its code: under another one the same bytes must be embedded again.
    pub vision_id: String,
    pub metadata: Value,
    pub captions: Vec<String>,
}

/// An import's progress: after the transaction that carries it, the first `lines` lines of `source` are in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportMark {
    pub source: String,
    pub lines: i64,
}

/// A read transaction fixed at one point in time.
pub struct ReadSnapshot {
    tx: Tx<'static>,
    engine: Engine,
}

impl Store {
    pub async fn read_snapshot(&self) -> Result<ReadSnapshot, StoreError> {
        let tx = match self.engine {
            Engine::Sqlite => self.pool.begin().await?,
            Engine::Postgres => {
                self.pool
                    .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    .await?
            }
        };
        Ok(ReadSnapshot {
            tx,
            engine: self.engine,
        })
    }

    /// Ends an insert of images or captions: marks the collection's snapshots stale, records how far an
    /// import has got (`mark`, if any), and commits.
    pub(super) async fn commit_insert(
        mut tx: Tx<'_>,
        collection_id: i64,
        mark: Option<&ImportMark>,
    ) -> Result<(), StoreError> {
        Self::bump(&mut tx, collection_id).await?;
        if let Some(m) = mark {
            Self::mark_import(&mut tx, collection_id, m).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn mark_import(
        tx: &mut Tx<'_>,
        collection_id: i64,
        m: &ImportMark,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO imports (collection_id, source, lines, updated_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (collection_id, source) DO UPDATE SET lines = excluded.lines, updated_at = excluded.updated_at",
        )
        .bind(collection_id)
        .bind(&m.source)
        .bind(m.lines)
        .bind(codec::now_rfc3339())
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// How many lines of `source` an earlier import into the collection committed (0: none).
    pub async fn import_progress(
        &self,
        collection_id: i64,
        source: &str,
    ) -> Result<i64, StoreError> {
        let n: Option<i64> = sqlx::query_scalar(
            "SELECT lines FROM imports WHERE collection_id = $1 AND source = $2",
        )
        .bind(collection_id)
        .bind(source)
        .fetch_optional(&self.pool)
        .await?;
        Ok(n.unwrap_or(0))
    }
}

impl ReadSnapshot {
    /// Up to `limit` images with ids above `after`, in id order, with their thumbnails and captions.
    pub async fn images_page(
        &mut self,
        collection_id: i64,
        after: i64,
        limit: i64,
    ) -> Result<Vec<ExportedImage>, StoreError> {
        let meta = super::dialect::metadata_text(self.engine, "i.");
        let sql = format!(
            "SELECT i.id, i.external_id, {meta}, i.width, i.height, i.code, i.vision_id, i.bundle_id, i.content_hash, \
             i.created_at, t.data AS thumbnail FROM images i LEFT JOIN thumbnails t ON t.image_id = i.id \
             WHERE i.collection_id = $1 AND i.id > $2 ORDER BY i.id LIMIT {limit}"
        );
        let rows = sqlx::query(&sql)
            .bind(collection_id)
            .bind(after)
            .fetch_all(&mut *self.tx)
            .await?;
        let mut out: Vec<ExportedImage> = rows.iter().map(exported).collect();
        let ids: Vec<i64> = out.iter().map(|i| i.id).collect();
        for (k, caps) in self
            .captions_of(collection_id, &ids)
            .await?
            .into_iter()
            .enumerate()
        {
            out[k].captions = caps;
        }
        Ok(out)
    }

    /// Up to `limit` images with an external id and ids above `after`, in id order: what a catalogue sync
    /// compares its feed with (photo digest, vision model, metadata, captions), without the codes and
    /// thumbnails an export reads.
    pub async fn synced_page(
        &mut self,
        collection_id: i64,
        after: i64,
        limit: i64,
    ) -> Result<Vec<SyncedImage>, StoreError> {
        let meta = super::dialect::metadata_text(self.engine, "");
        let sql = format!(
            "SELECT id, external_id, {meta}, content_hash, vision_id FROM images WHERE collection_id = $1 \
             AND id > $2 AND external_id IS NOT NULL ORDER BY id LIMIT {limit}"
        );
        let rows = sqlx::query(&sql)
            .bind(collection_id)
            .bind(after)
            .fetch_all(&mut *self.tx)
            .await?;
        let ids: Vec<i64> = rows.iter().map(|r| r.get("id")).collect();
        let caps = self.captions_of(collection_id, &ids).await?;
        Ok(rows
            .iter()
            .zip(caps)
            .map(|(r, captions)| SyncedImage {
                id: r.get("id"),
                external_id: r.get("external_id"),
                metadata: images::metadata(r),
                content_hash: r.get("content_hash"),
                vision_id: r.get("vision_id"),
                captions,
            })
            .collect())
    }

    /// The captions of each of `ids` (ascending, as a page reads them), each image's in caption id order.
    async fn captions_of(
        &mut self,
        collection_id: i64,
        ids: &[i64],
    ) -> Result<Vec<Vec<String>>, StoreError> {
        let mut out = vec![Vec::new(); ids.len()];
        let (Some(first), Some(last)) = (ids.first(), ids.last()) else {
            return Ok(out);
        };
        let caps = sqlx::query(
            "SELECT image_id, text FROM captions WHERE collection_id = $1 AND field IS NULL AND image_id >= $2 \
             AND image_id <= $3 ORDER BY id",
        )
        .bind(collection_id)
        .bind(first)
        .bind(last)
        .fetch_all(&mut *self.tx)
        .await?;
        let at: std::collections::HashMap<i64, usize> =
            ids.iter().enumerate().map(|(k, id)| (*id, k)).collect();
        for r in caps {
            if let Some(&k) = at.get(&r.get::<i64, _>("image_id")) {
                out[k].push(r.get("text"));
            }
        }
        Ok(out)
    }

    /// Up to `limit` captions without an image, with ids above `after`: (id, text) in id order.
    pub async fn free_captions_page(
        &mut self,
        collection_id: i64,
        after: i64,
        limit: i64,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT id, text FROM captions WHERE collection_id = $1 AND image_id IS NULL AND id > $2 \
             ORDER BY id LIMIT {limit}"
        ))
        .bind(collection_id)
        .bind(after)
        .fetch_all(&mut *self.tx)
        .await?;
        Ok(rows.iter().map(|r| (r.get("id"), r.get("text"))).collect())
    }
}

/// An `ImageRow` with the columns only an export reads.
fn exported(r: &AnyRow) -> ExportedImage {
    let ImageRow {
        id,
        external_id,
        metadata,
        width,
        height,
        bundle_id,
        created_at,
    } = image_row(r);
    ExportedImage {
        id,
        external_id,
        metadata,
        width,
        height,
        code: r.get("code"),
        vision_id: r.get("vision_id"),
        bundle_id,
        content_hash: r.get("content_hash"),
        created_at,
        thumbnail: r.get("thumbnail"),
        captions: vec![],
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        EmbeddedCaption, NewCaption, NewImage, Provenance,
        testing::{bare_image, free_caption, memory},
    };

    #[tokio::test]
    async fn a_snapshot_pages_images_with_captions_and_thumbnails_and_ignores_later_writes() {
        // A file, not memory: the late write below needs a connection of its own.
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("e.db").display());
        let store = Store::connect(&url).await.expect("store");
        let c = store.create_collection("shop", "").await.expect("create");
        let prov = Provenance {
            bundle_id: "b",
            vision_id: "v",
        };
        let rows: Vec<NewImage> = (0..5u8)
            .map(|i| NewImage {
                external_id: (i % 2 == 0).then(|| format!("e{i}")),
                metadata: json!({"n": i}),
                width: 10,
                height: 12,
                code: vec![i, i],
                vector: vec![1.0, 0.0],
                offset: 0.0,
                captions: (0..i)
                    .map(|k| EmbeddedCaption::plain(&format!("c{i}-{k}"), vec![0.0, 1.0]))
                    .collect(),
                thumbnail: (i != 3).then(|| vec![0xFF, i]),
                content_hash: Some(format!("h{i}")),
            })
            .collect();
        store
            .insert_images(c.id, &rows, prov.clone(), None)
            .await
            .expect("insert");
        store
            .insert_captions(c.id, &[free_caption("free", vec![1.0, 0.0])], "b", None)
            .await
            .expect("caption");
        let mut snap = store.read_snapshot().await.expect("snapshot");
        let first = snap.images_page(c.id, 0, 3).await.expect("page");
        // A write committed after the export began is not in it.
        let img = NewImage {
            external_id: Some("late".into()),
            code: vec![9],
            ..bare_image()
        };
        store
            .insert_images(c.id, &[img], prov, None)
            .await
            .expect("the late write commits");
        let rest = snap
            .images_page(c.id, first.last().expect("some").id, 100)
            .await
            .expect("page");
        assert_eq!(first.len() + rest.len(), 5);
        let all: Vec<&ExportedImage> = first.iter().chain(&rest).collect();
        assert_eq!(all[2].captions, vec!["c2-0", "c2-1"]);
        assert_eq!(all[3].thumbnail, None);
        assert_eq!(all[4].thumbnail, Some(vec![0xFF, 4]));
        assert_eq!(all[4].code, vec![4, 4]);
        assert_eq!(all[1].external_id, None);
        assert_eq!(all[0].content_hash.as_deref(), Some("h0"));
        let free = snap.free_captions_page(c.id, 0, 10).await.expect("free");
        assert_eq!(free.len(), 1);
        assert_eq!(free[0].1, "free");
        drop(snap);
        assert_eq!(
            store
                .count_images(c.id, &crate::filter::Filter::all())
                .await
                .expect("count"),
            6
        );
    }

    #[tokio::test]
    async fn an_import_mark_commits_with_its_rows() {
        let store = memory().await;
        let c = store.create_collection("shop", "").await.expect("create");
        assert_eq!(store.import_progress(c.id, "f").await.expect("progress"), 0);
        let caps = [free_caption("a", vec![1.0])];
        let mark = ImportMark {
            source: "f".into(),
            lines: 7,
        };
        store
            .insert_captions(c.id, &caps, "b", Some(&mark))
            .await
            .expect("insert");
        assert_eq!(store.import_progress(c.id, "f").await.expect("progress"), 7);
        let bad = [NewCaption {
            image_id: Some(999),
            ..free_caption("b", vec![1.0])
        }];
        let again = ImportMark {
            source: "f".into(),
            lines: 9,
        };
        assert!(
            store
                .insert_captions(c.id, &bad, "b", Some(&again))
                .await
                .is_err()
        );
        assert_eq!(
            store.import_progress(c.id, "f").await.expect("progress"),
            7,
            "a failed batch does not move the mark"
        );
    }
}
