//! The HNSW graph (USearch) and the semaphore over its scratch contexts. It stores vectors as bfloat16: half
//! the memory traffic of f32 per distance, which is what a 1,024-d search at 100k points is bound by; the
//! final order comes from the exact f32 scores, so the rounding can only cost a candidate, never misorder
//! the results.

use std::{
    collections::HashSet,
    sync::{Arc, Condvar, Mutex},
};

use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

use super::{IndexError, IndexParams};

/// Searches (and adds) that may run in one graph at once: USearch keeps a scratch context per concurrent
/// caller and fails a call that finds none free, so callers beyond this wait on `Slots`.
pub(super) const CONTEXTS: usize = 64;

/// A counting semaphore over the graph's scratch contexts (blocking: searches run on blocking threads).
pub(super) struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    pub(super) fn new() -> Slots {
        Slots {
            free: Mutex::new(CONTEXTS),
            freed: Condvar::new(),
        }
    }

    pub(super) fn hold<T>(&self, f: impl FnOnce() -> T) -> T {
        {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            while *free == 0 {
                free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
            }
            *free -= 1;
        }
        struct Release<'a>(&'a Slots);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                *self.0.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                self.0.freed.notify_one();
            }
        }
        let _release = Release(self);
        f()
    }
}

pub(super) struct Graph {
    pub(super) index: Index,
    pub(super) slots: Slots,
}

fn graph_error<E: std::fmt::Display>(what: String) -> impl FnOnce(E) -> IndexError {
    move |e| IndexError::Graph(format!("{what}: {e}"))
}

impl Graph {
    pub(super) fn new(
        params: &IndexParams,
        dim: usize,
        capacity: usize,
    ) -> Result<Graph, IndexError> {
        let index = usearch::new_index(&IndexOptions {
            dimensions: dim,
            metric: MetricKind::L2sq,
            quantization: ScalarKind::BF16,
            connectivity: params.max_connections,
            expansion_add: params.ef_construction,
            expansion_search: params.ef_search_for(capacity),
            multi: false,
        })
        .map_err(graph_error(format!("creating a {dim}-d graph")))?;
        index
            .reserve_capacity_and_threads(capacity.max(1024), CONTEXTS)
            .map_err(graph_error(format!("reserving {capacity} points")))?;
        Ok(Graph {
            index,
            slots: Slots::new(),
        })
    }

    /// Builds a graph of `items` (None when there are none: the first vector gives the dimension).
    pub(super) fn build(
        params: &IndexParams,
        items: &[(i64, Arc<[f32]>)],
    ) -> Result<Option<Arc<Graph>>, IndexError> {
        let Some(dim) = items.first().map(|(_, v)| v.len()) else {
            return Ok(None);
        };
        let graph = Graph::new(params, dim, items.len())?;
        graph.add_all(items, params.build_threads)?;
        graph.fit_expansion(params, items.len());
        Ok(Some(Arc::new(graph)))
    }

    /// Sets the search breadth for `n` points: the operator's, or the one that size needs. Callers hold the
    /// index's write lock (or own the graph), so no search reads it mid-change.
    pub(super) fn fit_expansion(&self, params: &IndexParams, n: usize) {
        let ef = params.ef_search_for(n);
        if self.index.expansion_search() != ef {
            self.index.change_expansion_search(ef);
        }
    }

    /// Adds from `threads` threads at once, 0: every core (the build at start and the background rebuild).
    fn add_all(&self, items: &[(i64, Arc<[f32]>)], threads: usize) -> Result<(), IndexError> {
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || -> Result<(), IndexError> {
                        for (id, v) in items.iter().skip(t).step_by(threads) {
                            self.add(*id, v)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|w| {
                w.join()
                    .map_err(|_| IndexError::Graph("a graph build thread panicked".into()))?
            })
        })
    }

    fn add(&self, id: i64, v: &[f32]) -> Result<(), IndexError> {
        self.slots
            .hold(|| self.index.add(id as u64, v))
            .map_err(graph_error(format!("adding point {id}")))
    }

    /// Adds one point after the build, growing the capacity when full. Callers hold the index's write lock:
    /// USearch's reserve must not race a search.
    pub(super) fn push(&self, id: i64, v: &[f32]) -> Result<(), IndexError> {
        let (size, capacity) = (self.index.size(), self.index.capacity());
        if size + 1 > capacity {
            self.index
                .reserve_capacity_and_threads((capacity * 2).max(1024), CONTEXTS)
                .map_err(graph_error(format!(
                    "growing the graph past {capacity} points"
                )))?;
        }
        self.add(id, v)
    }

    pub(super) fn remove(&self, id: i64) {
        // Fails only for an id the graph lacks, which the callers' `live` rules out.
        let _ = self.slots.hold(|| self.index.remove(id as u64));
    }

    pub(super) fn search(
        &self,
        q: &[f32],
        count: usize,
        allowed: Option<&HashSet<i64>>,
    ) -> Result<Vec<i64>, IndexError> {
        let found = self
            .slots
            .hold(|| match allowed {
                None => self.index.search(q, count),
                Some(a) => self
                    .index
                    .filtered_search(q, count, |key| a.contains(&(key as i64))),
            })
            .map_err(graph_error("searching the graph".into()))?;
        Ok(found.keys.into_iter().map(|k| k as i64).collect())
    }
}
