//! The change sequence: every write appends what it touched in its own transaction, and replicas follow
//! it to keep their in-memory indexes in step (jointspace-service, admin/follow.rs).

use std::time::Duration;

use sqlx::Row;

use super::{Engine, Store, StoreError, Tx, codec};

/// What a change in the change sequence touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Collection,
    Image,
    Caption,
    /// A reindex rewrote every vector: followers reload everything.
    All,
}

impl ChangeKind {
    fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Collection => "collection",
            ChangeKind::Image => "image",
            ChangeKind::Caption => "caption",
            ChangeKind::All => "all",
        }
    }

    fn parse(s: &str) -> Option<ChangeKind> {
        Some(match s {
            "collection" => ChangeKind::Collection,
            "image" => ChangeKind::Image,
            "caption" => ChangeKind::Caption,
            "all" => ChangeKind::All,
            _ => return None,
        })
    }
}

/// One row of the change sequence.
#[derive(Debug, Clone)]
pub struct Change {
    pub seq: i64,
    pub collection_id: i64,
    pub kind: ChangeKind,
    /// false: upsert.
    pub delete: bool,
    pub item_id: i64,
}

/// A position in the change sequence: on SQLite the last `seq` read; on Postgres the snapshot xmin up to
/// which every change has been read (see migrations/postgres/*_changes.sql).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor(i64);

impl Cursor {
    /// Before every change (for tests reading the whole sequence).
    #[cfg(test)]
    pub(crate) fn start() -> Cursor {
        Cursor(0)
    }
}

impl Store {
    /// Appends to the change sequence, in the caller's transaction (so a change is visible iff its data is).
    pub(super) async fn log(
        tx: &mut Tx<'_>,
        collection_id: i64,
        kind: ChangeKind,
        delete: bool,
        ids: &[i64],
    ) -> Result<(), StoreError> {
        let now = codec::now_rfc3339();
        let op = if delete { "delete" } else { "upsert" };
        for chunk in ids.chunks(200) {
            let rows: Vec<String> = (0..chunk.len())
                .map(|i| format!("($1, $2, $3, $4, ${})", i + 5))
                .collect();
            let sql = format!(
                "INSERT INTO changes (collection_id, kind, op, created_at, item_id) VALUES {}",
                rows.join(", ")
            );
            let mut q = sqlx::query(&sql)
                .bind(collection_id)
                .bind(kind.as_str())
                .bind(op)
                .bind(&now);
            for id in chunk {
                q = q.bind(*id);
            }
            q.execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// The position now: every change committed before this call is before it. Take it *before* reading the
    /// data an index is built from, so that nothing committed meanwhile is missed (replaying a change that
    /// the build already saw is harmless).
    pub async fn change_cursor(&self) -> Result<Cursor, StoreError> {
        let v: i64 = match self.engine {
            Engine::Sqlite => {
                sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM changes")
                    .fetch_one(&self.pool)
                    .await?
            }
            Engine::Postgres => self.pg_xmin().await?,
        };
        Ok(Cursor(v))
    }

    /// Every transaction id below this has finished (committed or rolled back).
    async fn pg_xmin(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The changes after `cursor`, in sequence order, and the cursor to pass next time.
    ///
    /// SQLite has one writer at a time, so `seq` is handed out in commit order and `seq > last` is exact.
    /// On Postgres it is not: `seq` is taken at insert time, so a transaction holding seq 41 may commit after
    /// the one holding 42, and a reader that saw 42 and moved on to `seq > 42` would skip 41 forever. Rows
    /// are therefore read by the writing transaction's id instead: below the snapshot's xmin no transaction
    /// is still running, so the window [cursor, xmin) is complete and final, and consecutive windows neither
    /// overlap nor leave gaps. A long write transaction holds xmin back, delaying (never losing) changes.
    pub async fn changes_since(&self, cursor: Cursor) -> Result<(Vec<Change>, Cursor), StoreError> {
        let (rows, next) = match self.engine {
            Engine::Sqlite => {
                let rows = sqlx::query(
                    "SELECT seq, collection_id, kind, op, item_id FROM changes WHERE seq > $1 ORDER BY seq",
                )
                .bind(cursor.0)
                .fetch_all(&self.pool)
                .await?;
                let last = rows.last().map_or(cursor.0, |r| r.get::<i64, _>("seq"));
                (rows, Cursor(last))
            }
            Engine::Postgres => {
                let xmin = self.pg_xmin().await?;
                let rows = sqlx::query(
                    "SELECT seq, collection_id, kind, op, item_id FROM changes WHERE txid >= $1 AND txid < $2 ORDER BY seq",
                )
                .bind(cursor.0)
                .bind(xmin)
                .fetch_all(&self.pool)
                .await?;
                (rows, Cursor(xmin.max(cursor.0)))
            }
        };
        let changes = rows
            .iter()
            .filter_map(|r| {
                Some(Change {
                    seq: r.get("seq"),
                    collection_id: r.get("collection_id"),
                    kind: ChangeKind::parse(r.get::<&str, _>("kind"))?,
                    delete: r.get::<&str, _>("op") == "delete",
                    item_id: r.get("item_id"),
                })
            })
            .collect();
        Ok((changes, next))
    }

    /// Drops changes older than `age`; a follower that has been away longer reloads everything instead.
    pub async fn prune_changes(&self, age: Duration) -> Result<u64, StoreError> {
        self.delete_older_than("changes", age).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{free_caption, memory};

    fn kinds(changes: &[Change]) -> Vec<(ChangeKind, bool, i64)> {
        changes
            .iter()
            .map(|c| (c.kind, c.delete, c.item_id))
            .collect()
    }

    #[tokio::test]
    async fn a_cursor_sees_each_committed_change_once_in_order() {
        let store = memory().await;
        let start = store.change_cursor().await.expect("cursor");
        let c = store.create_collection("c", "").await.expect("create");
        let caps = [free_caption("a", vec![1.0]), free_caption("b", vec![1.0])];
        let ids = store
            .insert_captions(c.id, &caps, "b@1", None)
            .await
            .expect("captions");
        let (changes, after) = store.changes_since(start).await.expect("changes");
        assert_eq!(
            kinds(&changes),
            [
                (ChangeKind::Collection, false, c.id),
                (ChangeKind::Caption, false, ids[0]),
                (ChangeKind::Caption, false, ids[1]),
            ]
        );
        assert!(changes.windows(2).all(|w| w[0].seq < w[1].seq));
        // Nothing new: the same cursor back, no changes.
        let (none, same) = store.changes_since(after).await.expect("again");
        assert!(none.is_empty());
        assert_eq!(same, after);
        // A cursor taken now starts after everything committed so far.
        assert_eq!(store.change_cursor().await.expect("cursor"), after);
        store.delete_caption(c.id, ids[0]).await.expect("delete");
        // A reindex's switch tells followers to reload everything.
        store.switch_to_staged("b@1").await.expect("switch");
        let (later, _) = store.changes_since(after).await.expect("later");
        assert_eq!(
            kinds(&later),
            [
                (ChangeKind::Caption, true, ids[0]),
                (ChangeKind::All, false, 0)
            ]
        );
    }

    #[tokio::test]
    async fn pruning_drops_only_changes_older_than_the_age() {
        let store = memory().await;
        let prune = || store.prune_changes(Duration::from_secs(3600));
        store.create_collection("c", "").await.expect("create");
        assert_eq!(prune().await.expect("prune"), 0);
        sqlx::query("UPDATE changes SET created_at = '2000-01-01T00:00:00Z'")
            .execute(&store.pool)
            .await
            .expect("age the rows");
        store.create_collection("d", "").await.expect("create");
        assert_eq!(prune().await.expect("prune"), 1);
        let (left, _) = store.changes_since(Cursor(0)).await.expect("what is left");
        assert_eq!(left.len(), 1);
    }
}
