//! The in-memory indexes of every collection, by collection id. The only holder of their lock: a poisoned
//! lock is recovered here (the map is consistent after any panic, since each change is one insert or
//! remove), and callers get `Arc`s to search without holding it.

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock, RwLockReadGuard, RwLockWriteGuard,
        atomic::{AtomicUsize, Ordering},
    },
};

use crate::{
    index::{Attributes, VectorIndex},
    modality::Modality,
};

/// A collection's two indexes, and its images' metadata for filters.
#[derive(Clone)]
pub(super) struct CollectionIndexes {
    pub images: Arc<VectorIndex>,
    pub captions: Arc<VectorIndex>,
    pub attributes: Arc<Attributes>,
}

impl CollectionIndexes {
    pub fn get(&self, m: Modality) -> &Arc<VectorIndex> {
        match m {
            Modality::Images => &self.images,
            Modality::Captions => &self.captions,
        }
    }
}

#[derive(Default)]
pub(super) struct IndexRegistry {
    map: RwLock<HashMap<i64, CollectionIndexes>>,
    /// Full rebuilds under way (a reindex, a reload of everything): readiness is off meanwhile.
    rebuilds: AtomicUsize,
}

/// Held while every index is being rebuilt from the database; dropping it (also on an error) ends that.
pub(super) struct Rebuilding<'a>(&'a AtomicUsize);

impl Drop for Rebuilding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl IndexRegistry {
    fn read(&self) -> RwLockReadGuard<'_, HashMap<i64, CollectionIndexes>> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<i64, CollectionIndexes>> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, collection_id: i64) -> Option<CollectionIndexes> {
        self.read().get(&collection_id).cloned()
    }

    pub fn contains(&self, collection_id: i64) -> bool {
        self.read().contains_key(&collection_id)
    }

    /// Sets a collection's indexes, replacing any.
    pub fn put(&self, collection_id: i64, idx: CollectionIndexes) {
        self.write().insert(collection_id, idx);
    }

    /// Sets a collection's indexes unless it has some already (loaded by the follower meanwhile, with items
    /// added since: those win).
    pub fn put_if_absent(&self, collection_id: i64, idx: CollectionIndexes) {
        self.write().entry(collection_id).or_insert(idx);
    }

    pub fn remove(&self, collection_id: i64) {
        self.write().remove(&collection_id);
    }

    /// Replaces every collection's indexes at once.
    pub fn replace_all(&self, fresh: HashMap<i64, CollectionIndexes>) {
        *self.write() = fresh;
    }

    /// Marks a full rebuild as under way until the guard is dropped.
    pub fn rebuilding(&self) -> Rebuilding<'_> {
        self.rebuilds.fetch_add(1, Ordering::AcqRel);
        Rebuilding(&self.rebuilds)
    }

    pub fn is_rebuilding(&self) -> bool {
        self.rebuilds.load(Ordering::Acquire) > 0
    }

    /// Points in all image indexes and all caption indexes.
    pub fn sizes(&self) -> (usize, usize) {
        self.read().values().fold((0, 0), |(i, c), idx| {
            (i + idx.images.len(), c + idx.captions.len())
        })
    }
}
