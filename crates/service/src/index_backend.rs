//! Where the searchable vectors live (`--index`), chosen once when the service opens, and the one place that
//! choice is matched: the rest of the service asks this module to open the index, to rank, search and count,
//! to warm it, and for the graphs it holds (none outside memory mode), never which mode it runs in. Memory:
//! an HNSW graph per collection and modality in this process (`registry`), kept in step by following the
//! change sequence, searched by `search::graphs`. Database: pgvector columns and HNSW indexes inside Postgres,
//! written with the rows, searched by `search::database`. Rows only: no index anywhere.

use std::time::Instant;

use crate::{
    CollectionIndexes, CollectionRef, Result, Service,
    filter::Filter,
    modality::Modality,
    registry::IndexRegistry,
    search::{Matches, QueryVector, Ranked, SearchParams, database},
    store,
};

/// Where the vector indexes live (`--index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IndexBackend {
    /// An HNSW graph per collection and modality in this process's memory, built or loaded at start and kept
    /// in step by following the change sequence.
    #[default]
    Memory,
    /// pgvector columns and HNSW indexes inside Postgres, written with the rows; this process holds no graph
    /// (docs/storage.md, "The index in the database").
    Database,
    /// No index here or in the database: an offline command's writes go to the rows only, because a graph
    /// built as it writes would have nowhere to be kept (`jointspace import`, `ingest` or `sync` into Postgres
    /// without `--index-dir`); a server builds or fills its own index from the rows, as it would anyway.
    RowsOnly,
}

impl Service {
    /// Opens the index: every collection's graphs loaded (memory), the database's vector columns and indexes
    /// readied (database), or nothing (rows only).
    pub(crate) async fn open_indexes(&self) -> Result<()> {
        match self.opts.backend {
            IndexBackend::Database => self.enable_database_index().await,
            IndexBackend::Memory => {
                for c in self.store.list_collections().await? {
                    let idx = self.load_indexes(&c).await?;
                    self.indexes.put(c.id, idx);
                }
                Ok(())
            }
            IndexBackend::RowsOnly => Ok(()),
        }
    }

    /// The graphs this process holds and keeps in step: the registry in memory mode, none otherwise (nothing to
    /// load, update, follow or snapshot here).
    pub(crate) fn graphs(&self) -> Option<&IndexRegistry> {
        match self.opts.backend {
            IndexBackend::Memory => Some(&self.indexes),
            IndexBackend::Database | IndexBackend::RowsOnly => None,
        }
    }

    /// A collection's in-memory indexes, or none where this process holds no graph (under `--index database`
    /// the caller's write is then searchable through the rows it committed, with nothing more to do).
    pub(crate) fn memory_indexes(&self, collection_id: i64) -> Result<Option<CollectionIndexes>> {
        match self.graphs() {
            Some(_) => self.indexes_of(collection_id).map(Some),
            None => Ok(None),
        }
    }

    /// What an offline command should say of the index it wrote, if anything.
    pub fn index_note(&self) -> Option<&'static str> {
        match self.opts.backend {
            IndexBackend::RowsOnly => Some(
                "rows only: no HNSW graph built here (nowhere to keep it without --index-dir); a server builds \
                 its own from the rows at start",
            ),
            IndexBackend::Memory | IndexBackend::Database => None,
        }
    }

    /// The ranked page of `target` for a query vector, and how many images the filter admits.
    pub(crate) async fn search_ids(
        &self,
        c: &CollectionRef,
        target: Modality,
        q: &QueryVector,
        p: &SearchParams,
    ) -> Result<(Vec<Ranked>, Option<Matches>)> {
        match self.opts.backend {
            IndexBackend::Database => self.search_in_database(c.id, target, q, p).await,
            IndexBackend::Memory | IndexBackend::RowsOnly => {
                self.search_in_graphs(c.id, target, q, p).await
            }
        }
    }

    /// How many images the collection holds: the graph's live points, or counted in the database (at most
    /// once a minute).
    pub(crate) async fn image_count(&self, collection_id: i64) -> Result<usize> {
        match self.memory_indexes(collection_id)? {
            Some(idx) => Ok(idx.images.len()),
            None => self.collection_size(collection_id, Modality::Images).await,
        }
    }

    /// Internal search without the HTTP limits (for `eval`, which ranks against the whole split).
    pub async fn rank(
        &self,
        collection_id: i64,
        target: Modality,
        q: &[f32],
        qm: Modality,
        k: usize,
    ) -> Result<Vec<(i64, f32)>> {
        match self.opts.backend {
            IndexBackend::Database => {
                let hits = self
                    .nearest_in_database(database::DbQuery {
                        collection_id,
                        target,
                        vector: q,
                        query_modality: qm,
                        filter: &Filter::all(),
                        exclude: None,
                        matches: None,
                        offset: 0,
                        k,
                    })
                    .await?;
                Ok(hits.into_iter().map(|h| (h.id, h.score)).collect())
            }
            IndexBackend::Memory | IndexBackend::RowsOnly => {
                self.rank_in_graphs(collection_id, target, q, qm, k)
            }
        }
    }

    /// How many of the collection's images `filter` admits: from the metadata beside the graphs (exact and
    /// cheap), or counted in the database (bounded unless `exact`).
    pub(crate) async fn count_matches(
        &self,
        collection_id: i64,
        filter: &Filter,
        exact: bool,
    ) -> Result<Matches> {
        match self.opts.backend {
            IndexBackend::Database => {
                let bound = (!exact).then_some(database::MATCHES_COUNTED_TO);
                self.matches_in_database(collection_id, filter, None, bound)
                    .await
            }
            IndexBackend::Memory | IndexBackend::RowsOnly => Ok(Matches::exact(
                self.matches_in_graphs(collection_id, filter).await?,
            )),
        }
    }

    /// Which of `images` `filter` admits: from the metadata beside the graphs where this process holds them,
    /// else from the rows.
    pub(crate) async fn admitted_among(
        &self,
        collection_id: i64,
        filter: &Filter,
        images: &[i64],
    ) -> Result<std::collections::HashSet<i64>> {
        Ok(match self.memory_indexes(collection_id)? {
            Some(idx) => self.allowed_images(&idx, filter).await?,
            None => self
                .store
                .matching_among(collection_id, filter, images)
                .await?
                .into_iter()
                .collect(),
        })
    }

    /// Pages in what a first search of the collection reads: the database's HNSW pages and rows, or this
    /// process's graph and the rows it answers with.
    pub(crate) async fn warm_collection(&self, collection_id: i64, query: &[f32]) -> Result<()> {
        let ids: Vec<i64> = match self.opts.backend {
            IndexBackend::Database => self
                .nearest_in_database(database::DbQuery {
                    collection_id,
                    target: Modality::Images,
                    vector: query,
                    query_modality: Modality::Captions,
                    filter: &Filter::all(),
                    exclude: None,
                    matches: None,
                    offset: 0,
                    k: 10,
                })
                .await?
                .iter()
                .map(|h| h.id)
                .collect(),
            IndexBackend::Memory | IndexBackend::RowsOnly => {
                let Ok(idx) = self.indexes_of(collection_id) else {
                    return Ok(());
                };
                let (images, score) = (
                    idx.images.clone(),
                    self.score(Modality::Captions, Modality::Images),
                );
                let q = query.to_vec();
                tokio::task::spawn_blocking(move || images.search(&q, score, 0, 10, None))
                    .await
                    .map_err(|e| crate::ServiceError::Unavailable(e.to_string()))?
                    .iter()
                    .map(|h| h.id)
                    .collect()
            }
        };
        self.store.images_by_ids(collection_id, &ids).await?;
        Ok(())
    }

    /// Readies the database's pgvector columns and HNSW indexes for the loaded bundle (built at the first start
    /// in this mode, found at later ones).
    async fn enable_database_index(&self) -> Result<()> {
        let score = |q, t| self.score(q, t);
        let mut metrics = vec![];
        for (q, t) in [
            (Modality::Captions, Modality::Images),
            (Modality::Images, Modality::Images),
            (Modality::Images, Modality::Captions),
        ] {
            let m = database::metric_of(score(q, t));
            if !metrics.contains(&m) {
                metrics.push(m);
            }
        }
        let t = Instant::now();
        let build = store::HnswBuild {
            m: database::HNSW_M,
            ef_construction: self.opts.index.ef_construction,
        };
        let report = self
            .store
            .enable_vector_index(self.pipeline.joint_dim(), &metrics, build)
            .await?;
        tracing::info!(
            pgvector = %report.pgvector, filled = report.filled, built = ?report.built,
            prewarmed = ?report.prewarmed, huge_pages = ?report.huge_pages, secs = t.elapsed().as_secs_f32(),
            "the vector index is in the database"
        );
        if report.huge_pages.as_deref() == Some("off") {
            tracing::warn!(
                "Postgres' shared buffers are on 4 kB pages: with huge pages a search's walk takes about a quarter \
                 less time (docs/storage.md, \"Postgres settings\")"
            );
        }
        Ok(())
    }
}
