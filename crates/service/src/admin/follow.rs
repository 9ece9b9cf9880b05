//! Following the database. Several replicas may share one database; each keeps its in-memory indexes in
//! step with the writes made through the others by applying the change sequence (`Store::changes_since`)
//! every `--follow-interval-ms`. A replica's own writes reach its index directly, before the 2xx, and
//! again through the sequence, where they change nothing. The staleness bound for a write made elsewhere is
//! the follow interval plus one poll and apply (measured in tests/it/replicas.rs).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use crate::{Result, Service, items::hide};
use crate::{
    modality::Modality,
    store::{Change, ChangeKind, Cursor},
};

/// Changes older than this are pruned. A follower that could not read for half as long reloads everything
/// from the database instead of trusting the sequence.
pub const CHANGE_RETENTION: Duration = Duration::from_secs(3600);

pub(crate) struct FollowState {
    cursor: Cursor,
    last_ok: Instant,
    last_prune: Option<Instant>,
}

impl FollowState {
    pub(crate) fn new(cursor: Cursor) -> FollowState {
        FollowState {
            cursor,
            last_ok: Instant::now(),
            last_prune: None,
        }
    }
}

/// What one follow step did.
#[derive(Debug, Default, Clone, Copy)]
pub struct FollowReport {
    pub changes: usize,
    pub reloaded: bool,
}

impl Service {
    /// Reads the changes committed since the last step and applies them to the indexes. On an error (the
    /// database is down) nothing is skipped: the next step starts from the same position.
    pub async fn follow_once(&self) -> Result<FollowReport> {
        let mut st = self.follow.lock().await;
        // The indexes are current as of this read once the step succeeds (readiness measures the lag).
        let read_at = Instant::now();
        if st.last_ok.elapsed() > CHANGE_RETENTION / 2 {
            tracing::warn!(
                "the change sequence was unreadable for too long; reloading every index"
            );
            let cursor = self.store.change_cursor().await?;
            self.reload_all().await?;
            (st.cursor, st.last_ok) = (cursor, Instant::now());
            self.mark_followed(read_at);
            return Ok(FollowReport {
                changes: 0,
                reloaded: true,
            });
        }
        let (changes, next) = self.store.changes_since(st.cursor).await?;
        let n = changes.len();
        let reloaded = self.apply(changes).await?;
        (st.cursor, st.last_ok) = (next, Instant::now());
        self.mark_followed(read_at);
        if st
            .last_prune
            .is_none_or(|t| t.elapsed() > Duration::from_secs(60))
        {
            st.last_prune = Some(Instant::now());
            match self.store.prune_changes(CHANGE_RETENTION).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(rows = n, "old changes pruned"),
                Err(e) => tracing::warn!(error = %e, "pruning the change sequence failed"),
            }
            match self.store.prune_idempotency().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(rows = n, "expired idempotency keys pruned"),
                Err(e) => tracing::warn!(error = %e, "pruning the idempotency keys failed"),
            }
        }
        if n > 0 {
            tracing::debug!(changes = n, reloaded, "followed the database");
        }
        Ok(FollowReport {
            changes: n,
            reloaded,
        })
    }

    /// Runs `follow_once` every `every` until the task is dropped.
    pub async fn follow_forever(&self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            match self.follow_once().await {
                Ok(_) if failing => {
                    failing = false;
                    tracing::info!("following the database again");
                }
                Ok(_) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "cannot read the change sequence; retrying");
                }
                Err(_) => {}
            }
        }
    }

    /// Applies one batch; true when it reloaded everything.
    async fn apply(&self, changes: Vec<Change>) -> Result<bool> {
        // Under --index database every replica searches the same committed rows: the sequence is read (and
        // pruned) only to keep readiness's lag meaningful.
        if changes.is_empty() || self.graphs().is_none() {
            return Ok(false);
        }
        if changes.iter().any(|c| c.kind == ChangeKind::All) {
            self.reload_all().await?;
            return Ok(true);
        }
        let Sorted {
            upserts,
            deletes,
            created,
            dropped,
        } = sorted(changes);
        for id in &dropped {
            self.indexes.remove(*id);
        }
        // Collections this process has not seen yet (made elsewhere) are loaded whole from the database;
        // that includes the items changed in this batch.
        let mentioned: BTreeSet<i64> = created
            .iter()
            .copied()
            .chain(upserts.keys().chain(deletes.keys()).map(|(c, _)| *c))
            .filter(|c| !dropped.contains(c))
            .collect();
        self.load_unseen(mentioned).await?;
        self.apply_upserts(upserts).await?;
        for ((cid, m), ids) in deletes {
            let Ok(idx) = self.indexes_of(cid) else {
                continue;
            };
            if m == Modality::Images {
                idx.attributes.remove(&ids);
            }
            for id in ids {
                hide(idx.get(m), id);
            }
        }
        self.update_gauges();
        Ok(false)
    }

    /// Loads the collections among `mentioned` that this process has no indexes for.
    async fn load_unseen(&self, mentioned: BTreeSet<i64>) -> Result<()> {
        for cid in mentioned {
            if self.indexes.contains(cid) {
                continue;
            }
            let Some(row) = self.store.collection_by_id(cid).await? else {
                continue;
            };
            let idx = self.load_indexes(&row).await?;
            self.indexes.put_if_absent(cid, idx);
        }
        Ok(())
    }

    /// Brings upserted items into the indexes: images' metadata read again, vectors the indexes lack added.
    async fn apply_upserts(&self, upserts: ByIndex) -> Result<()> {
        for ((cid, m), ids) in upserts {
            let Ok(idx) = self.indexes_of(cid) else {
                continue;
            };
            if m == Modality::Images {
                // Every mentioned image's metadata is read again: a PATCH or an upsert changes it in place.
                idx.attributes
                    .set(self.store.image_metadata(cid, Some(&ids)).await?);
            }
            let idx = idx.get(m);
            let missing: Vec<i64> = ids
                .into_iter()
                .filter(|id| idx.vector(*id).is_none())
                .collect();
            if missing.is_empty() {
                continue;
            }
            // Rows deleted since are simply not returned.
            for p in self.store.vectors_by_ids(cid, m, &missing).await? {
                idx.insert(p.id, p.vector, p.offset)?;
            }
        }
        Ok(())
    }

    /// Rebuilds every index from the database (after a reindex elsewhere, or a long absence).
    async fn reload_all(&self) -> Result<()> {
        if self.graphs().is_none() {
            return Ok(());
        }
        let _rebuilding = self.indexes.rebuilding();
        let mut fresh = HashMap::new();
        for c in self.store.list_collections().await? {
            fresh.insert(c.id, self.load_indexes(&c).await?);
        }
        self.indexes.replace_all(fresh);
        self.update_gauges();
        Ok(())
    }
}

/// Item ids by collection and modality.
type ByIndex = BTreeMap<(i64, Modality), Vec<i64>>;

/// A batch of changes sorted by what they do.
struct Sorted {
    upserts: ByIndex,
    deletes: ByIndex,
    created: BTreeSet<i64>,
    dropped: BTreeSet<i64>,
}

/// Sorts changes into upserts and deletes, applied in that order: ids are never reused, so a delete is
/// always the last word on its id. (`All` is handled before.)
fn sorted(changes: Vec<Change>) -> Sorted {
    let (mut upserts, mut deletes) = (ByIndex::new(), ByIndex::new());
    let (mut created, mut dropped) = (BTreeSet::new(), BTreeSet::new());
    for c in changes {
        let m = match c.kind {
            ChangeKind::Collection => {
                if c.delete {
                    dropped.insert(c.collection_id);
                } else {
                    created.insert(c.collection_id);
                }
                continue;
            }
            ChangeKind::Image => Modality::Images,
            ChangeKind::Caption => Modality::Captions,
            ChangeKind::All => continue,
        };
        let to = if c.delete { &mut deletes } else { &mut upserts };
        to.entry((c.collection_id, m)).or_default().push(c.item_id);
    }
    Sorted {
        upserts,
        deletes,
        created,
        dropped,
    }
}
