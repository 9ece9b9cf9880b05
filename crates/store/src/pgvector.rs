//! The vector index inside Postgres (`--index database`, docs/storage.md "The index in the database"): each
//! image's and caption's joint vector also lives in a pgvector `halfvec(D)` column, `embedding`, with one HNSW
//! index per distance the bundle's similarity searches by; a search is one SQL query that walks that index
//! under the metadata filter (the same compiler as the list endpoints) and returns the candidates with their
//! exact f32 vectors and offsets for the caller's exact re-rank.
//!
//! The column is added when a server first starts in this mode, not by a migration: its dimension is the
//! bundle's (an HNSW index needs a fixed one), and a Postgres without pgvector must keep working with the
//! memory index. Once it exists, every server on the database writes it in the same statement as the row
//! (`Store::embedding_dim`, read at connect), whichever index mode that server runs, so a replica in memory mode
//! cannot leave rows that a replica in database mode does not see.

use std::sync::atomic::Ordering;

use sqlx::{AnyConnection, Row};

use super::{Engine, Modality, Store, StoreError, codec::blob_to_vector, dialect};
use crate::filter::Filter;

/// The least pgvector with iterative index scans (`hnsw.iterative_scan`), which filtered searches rely on
/// to return k results when k exist.
const MIN_PGVECTOR: (u32, u32) = (0, 8);

/// Rows converted per statement when the column is filled from the stored vectors (at first start, after a
/// reindex switch).
const FILL_PAGE: i64 = 500;

/// How the HNSW index orders points: pgvector's operator and operator class over `halfvec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorMetric {
    /// `<#>`, the negative inner product: cosine on unit vectors, without pgvector normalising each time.
    InnerProduct,
    /// `<->`, euclidean distance: euclidean bundles, and the candidates of order bundles (as the memory index).
    L2,
}

impl VectorMetric {
    fn operator(self) -> &'static str {
        match self {
            VectorMetric::InnerProduct => "<#>",
            VectorMetric::L2 => "<->",
        }
    }

    fn opclass(self) -> &'static str {
        match self {
            VectorMetric::InnerProduct => "halfvec_ip_ops",
            VectorMetric::L2 => "halfvec_l2_ops",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            VectorMetric::InnerProduct => "ip",
            VectorMetric::L2 => "l2",
        }
    }
}

/// How the HNSW indexes are built (pgvector's `m` and `ef_construction`).
#[derive(Debug, Clone, Copy)]
pub struct HnswBuild {
    pub m: usize,
    pub ef_construction: usize,
}

/// What `enable_vector_index` found and did.
#[derive(Debug, Clone, Default)]
pub struct VectorIndexReport {
    pub pgvector: String,
    /// Rows whose `embedding` was filled from their stored vector at this start.
    pub filled: u64,
    /// HNSW indexes built at this start (none when they existed).
    pub built: Vec<String>,
    /// What this start read in (`pg_prewarm`); None when the extension cannot be had (the role may not create
    /// it, or the server lacks it).
    pub prewarmed: Option<Prewarmed>,
    /// Whether Postgres' shared buffers are on huge pages (`huge_pages_status`: "on" or "off"); None before
    /// Postgres 17, which does not say.
    pub huge_pages: Option<String>,
}

/// One nearest-neighbour query.
pub struct Nearest<'a> {
    pub collection_id: i64,
    pub modality: Modality,
    pub query: &'a [f32],
    pub metric: VectorMetric,
    /// How many candidates to return.
    pub limit: usize,
    /// Images only (caption search takes none).
    pub filter: &'a Filter,
    /// An id left out (a stored image used as the query).
    pub exclude: Option<i64>,
    /// `hnsw.ef_search` (pgvector caps it at 1000; the iterative scan goes on past it as needed).
    pub ef_search: usize,
    /// Scan every matching row instead of walking the graph: exact, and faster for few rows.
    pub exact: bool,
}

/// How far the inner product of two unit vectors, rounded to halfvec and summed in f32 as pgvector does, can
/// lie from the f32 one: each factor's rounding is within 2^-11 of it, so the sum within (2^-10 + 2^-22) of
/// |q|.|x| = 1, plus the float sums' own rounding; with room to spare.
pub const HALF_ERROR: f32 = 1.2e-3;

/// A row found by `nearest_similarities`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Similar {
    pub id: i64,
    /// The inner product with the query, from the halfvec column (within `HALF_ERROR` of the f32 one).
    pub similarity: f32,
    pub offset: f32,
}

/// `[x1,x2,...]`, pgvector's text form. Rust prints finite floats without exponents, which pgvector reads.
pub(super) fn literal(v: &[f32]) -> String {
    let mut s = String::with_capacity(v.len() * 12 + 2);
    s.push('[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&x.to_string());
    }
    s.push(']');
    s
}

/// The dimension of `images.embedding`, if the column exists (what `format_type` prints: `halfvec(512)`).
pub(super) async fn column_dim(
    conn: &mut AnyConnection,
    table: &str,
) -> Result<Option<usize>, StoreError> {
    let t: Option<String> = sqlx::query_scalar(
        "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
         WHERE a.attrelid = to_regclass($1) AND a.attname = 'embedding' AND NOT a.attisdropped",
    )
    .bind(table)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(t.and_then(|t| {
        t.strip_prefix("halfvec(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|d| d.parse().ok())
    }))
}

impl Store {
    /// The dimension of the `embedding` columns when they exist: every insert then writes them.
    pub fn embedding_dim(&self) -> Option<usize> {
        match self.embedding_dim.load(Ordering::Acquire) {
            0 => None,
            d => Some(d),
        }
    }

    /// The extra column and value of an insert into `images` or `captions` (`$n`), and its bound text, when
    /// the database holds the vector index.
    pub(super) fn embedding_insert(&self, n: usize, v: &[f32]) -> Option<(String, String)> {
        self.embedding_dim()
            .map(|_| (format!(", ${n}::halfvec"), literal(v)))
    }

    /// Readies the database to be the vector index: the pgvector extension (created if the role may), the
    /// `embedding` columns of the bundle's dimension (recreated if they have another), filled from the stored
    /// vectors where empty, and an HNSW index per metric. Under an advisory lock, so replicas starting together
    /// do it once. Refuses SQLite and a Postgres without pgvector 0.8, saying what to do.
    pub async fn enable_vector_index(
        &self,
        dim: usize,
        metrics: &[VectorMetric],
        build: HnswBuild,
    ) -> Result<VectorIndexReport, StoreError> {
        if self.engine != Engine::Postgres {
            return Err(StoreError::Invalid(
                "--index database keeps the vectors in Postgres with pgvector; on SQLite use --index memory"
                    .into(),
            ));
        }
        let mut conn = self.pool.acquire().await?;
        // A session lock (not a transaction's): the index builds below run in their own statements.
        sqlx::query("SELECT pg_advisory_lock(7472016389)")
            .execute(&mut *conn)
            .await?;
        let r = self.enable_locked(&mut conn, dim, metrics, build).await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock(7472016389)")
            .execute(&mut *conn)
            .await;
        let report = r?;
        unlocked?;
        Ok(report)
    }

    async fn enable_locked(
        &self,
        conn: &mut AnyConnection,
        dim: usize,
        metrics: &[VectorMetric],
        build: HnswBuild,
    ) -> Result<VectorIndexReport, StoreError> {
        let version = pgvector_version(conn).await?;
        let mut report = VectorIndexReport {
            pgvector: version,
            ..Default::default()
        };
        fit_embedding_columns(conn, dim).await?;
        // The rows still to fill, found through a partial index that holds only them: without it every start
        // read the whole table to learn that none were left (3.3 s at 1M images, cold).
        let partitioned = index_missing_embeddings(conn).await?;
        // From here on this process writes the column with every row; what was written before is filled now.
        self.embedding_dim.store(dim, Ordering::Release);
        for m in Modality::BOTH {
            report.filled += fill_embeddings(conn, m.as_str(), dim).await?;
        }
        report.built = build_hnsw_indexes(conn, metrics, build, &partitioned).await?;
        report.prewarmed = prewarm(conn).await;
        report.huge_pages = sqlx::query_scalar("SHOW huge_pages_status")
            .fetch_one(&mut *conn)
            .await
            .ok();
        if report.filled > 0 || !report.built.is_empty() {
            // Fresh row estimates for the planner after a bulk fill (autovacuum would get there later).
            sqlx::query("ANALYZE images, captions")
                .execute(&mut *conn)
                .await?;
        }
        Ok(report)
    }

    /// How many of the collection's images `filter` admits, `exclude` left out (a filtered search's
    /// `matches`), counting at most `up_to` (None: all): the scan stops there.
    pub async fn count_matching(
        &self,
        collection_id: i64,
        filter: &Filter,
        exclude: Option<i64>,
        up_to: Option<usize>,
    ) -> Result<usize, StoreError> {
        let f = dialect::compile_filter(self.engine, filter, 2);
        let excl = exclude
            .map(|x| format!(" AND id <> {x}"))
            .unwrap_or_default();
        let rows = format!("FROM images WHERE collection_id = $1{excl}{}", f.clause);
        let sql = match up_to {
            Some(n) => format!("SELECT COUNT(*) FROM (SELECT 1 {rows} LIMIT {n}) AS admitted"),
            None => format!("SELECT COUNT(*) {rows}"),
        };
        let n: i64 = f
            .bind(sqlx::query(&sql).bind(collection_id))
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok(n.max(0) as usize)
    }

    /// The nearest rows to a query by the HNSW index (or an exact scan), with their exact f32 vectors and
    /// offsets, nearest first (roughly: the iterative scan's relaxed order; the caller re-ranks exactly).
    pub async fn nearest(&self, q: &Nearest<'_>) -> Result<Vec<super::StoredVector>, StoreError> {
        let rows = self.nearest_rows(q, "id, vector, hub_offset").await?;
        Ok(rows
            .iter()
            .map(|r| super::StoredVector {
                id: r.get("id"),
                vector: blob_to_vector(r.get::<&[u8], _>("vector")),
                offset: r.get::<f64, _>("hub_offset") as f32,
            })
            .collect())
    }

    /// As `nearest` for an inner-product search, with each row's inner product with the query as the halfvec
    /// column gives it (within `HALF_ERROR` of the f32 one for unit vectors) instead of its vector: ids and
    /// numbers come back, not 4 KB a row, and Postgres reads no vector out of line.
    pub async fn nearest_similarities(&self, q: &Nearest<'_>) -> Result<Vec<Similar>, StoreError> {
        if q.metric != VectorMetric::InnerProduct {
            return Err(StoreError::Invalid(
                "similarities come from the inner-product index only".into(),
            ));
        }
        let rows = self
            .nearest_rows(q, "id, -(embedding <#> {q}) AS similarity, hub_offset")
            .await?;
        Ok(rows
            .iter()
            .map(|r| Similar {
                id: r.get("id"),
                similarity: r.get::<f64, _>("similarity") as f32,
                offset: r.get::<f64, _>("hub_offset") as f32,
            })
            .collect())
    }

    /// The walk (or scan) itself, returning `columns` of the rows found (`{q}` in them stands for the query
    /// vector). The scan settings are `SET LOCAL`, scoped to this query's transaction (and, on Citus, carried to
    /// the workers):
    /// - relaxed_order: the scan goes on past ef_search until LIMIT rows passed the filter (or
    ///   hnsw.max_scan_tuples were visited); its slight disorder is undone by the caller's exact re-rank;
    /// - the caller chose walk or scan, and the planner must not overrule it on stale row estimates (right after
    ///   a bulk import it took a 4,000-row collection for 20 rows and sorted them all): the walk turns sorting
    ///   off, which leaves only the HNSW index to give the order; the scan turns index scans off.
    ///
    /// Without a filter's values to bind, the settings and the query go in one message (the simple protocol, one
    /// implicit transaction), the vector written into the SQL: one round trip where BEGIN, the query and COMMIT
    /// took three. The values are the server's own (numbers, ids), none the caller's.
    async fn nearest_rows(
        &self,
        q: &Nearest<'_>,
        columns: &str,
    ) -> Result<Vec<sqlx::any::AnyRow>, StoreError> {
        let t = q.modality.as_str();
        let f = match q.modality {
            Modality::Images => dialect::compile_filter(self.engine, q.filter, 3),
            Modality::Captions => Default::default(),
        };
        let excl = q
            .exclude
            .map(|x| format!(" AND id <> {x}"))
            .unwrap_or_default();
        let (index_scan, sort) = if q.exact {
            ("off", "on")
        } else {
            ("on", "off")
        };
        let settings = format!(
            "SET LOCAL hnsw.ef_search = {}; SET LOCAL hnsw.iterative_scan = relaxed_order; \
             SET LOCAL enable_indexscan = {index_scan}; SET LOCAL enable_sort = {sort}",
            q.ef_search.clamp(1, 1000)
        );
        let select = |collection: &str, vector: &str| {
            format!(
                "SELECT {} FROM {t} WHERE collection_id = {collection} AND embedding IS NOT NULL{excl}{} \
                 ORDER BY embedding {} {vector} LIMIT {}",
                columns.replace("{q}", vector),
                f.clause,
                q.metric.operator(),
                q.limit.max(1)
            )
        };
        if f.binds.is_empty() {
            let vector = format!("'{}'::halfvec", literal(q.query));
            let sql = format!(
                "{settings}; {}",
                select(&q.collection_id.to_string(), &vector)
            );
            return Ok(sqlx::raw_sql(&sql).fetch_all(&self.pool).await?);
        }
        // A custom plan each time: after five runs of the prepared statement Postgres would switch to a generic
        // plan, whose walk returns the same rows 4x slower (the query vector is a parameter cast from text
        // there, a constant in a custom plan; 7.7 against 1.8 ms for 100 rows of 3,000).
        let sql = select("$1", "$2::halfvec");
        let mut tx = self
            .pool
            .begin_with(format!(
                "BEGIN; {settings}; SET LOCAL plan_cache_mode = force_custom_plan"
            ))
            .await?;
        let rows = f
            .bind(
                sqlx::query(&sql)
                    .bind(q.collection_id)
                    .bind(literal(q.query)),
            )
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// Fills `embedding` where it is empty, from each row's stored vector (in the caller's transaction: a
    /// reindex switch fills what it rewrote before it commits).
    pub(super) async fn fill_embeddings_in(
        &self,
        conn: &mut AnyConnection,
        table: &str,
    ) -> Result<u64, StoreError> {
        match self.embedding_dim() {
            Some(dim) => fill_embeddings(conn, table, dim).await,
            None => Ok(0),
        }
    }
}

/// Converts the stored f32 blobs of rows without an embedding, a page at a time. Rows of another dimension
/// (another bundle's, until a reindex) stay empty and so unsearchable in this mode, as the startup warns.
async fn fill_embeddings(
    conn: &mut AnyConnection,
    table: &str,
    dim: usize,
) -> Result<u64, StoreError> {
    let (mut last, mut filled) = (i64::MIN, 0u64);
    loop {
        let rows = sqlx::query(&format!(
            "SELECT id, vector FROM {table} WHERE embedding IS NULL AND id > $1 ORDER BY id LIMIT {FILL_PAGE}"
        ))
        .bind(last)
        .fetch_all(&mut *conn)
        .await?;
        let Some(end) = rows.last() else {
            return Ok(filled);
        };
        last = end.get("id");
        let values: Vec<String> = rows
            .iter()
            .filter_map(|r| {
                let v = blob_to_vector(r.get::<&[u8], _>("vector"));
                (v.len() == dim).then(|| format!("({}, '{}')", r.get::<i64, _>("id"), literal(&v)))
            })
            .collect();
        if values.is_empty() {
            continue;
        }
        let n = sqlx::query(&format!(
            "UPDATE {table} SET embedding = v.e::halfvec FROM (VALUES {}) AS v(id, e) WHERE {table}.id = v.id",
            values.join(",")
        ))
        .execute(&mut *conn)
        .await?
        .rows_affected();
        filled += n;
    }
}

/// The pgvector extension's version, creating the extension when it is missing; refused below 0.8.
async fn pgvector_version(conn: &mut AnyConnection) -> Result<String, StoreError> {
    let mut version: Option<String> =
        sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            .fetch_optional(&mut *conn)
            .await?;
    if version.is_none() {
        sqlx::query("CREATE EXTENSION IF NOT EXISTS vector")
            .execute(&mut *conn)
            .await
            .map_err(|e| {
                StoreError::Invalid(format!(
                    "--index database needs the pgvector extension (0.8 or newer) in this database, and \
                     creating it failed ({e}): install pgvector on the server and run `CREATE EXTENSION \
                     vector` as a role that may, or start with --index memory"
                ))
            })?;
        version =
            sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
                .fetch_optional(&mut *conn)
                .await?;
    }
    let version = version.unwrap_or_default();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < MIN_PGVECTOR {
        return Err(StoreError::Invalid(format!(
            "--index database needs pgvector 0.8 or newer (its iterative index scans keep filtered searches \
             full); this database has {version}: `ALTER EXTENSION vector UPDATE` after upgrading it"
        )));
    }
    Ok(version)
}

/// An `embedding` column of the bundle's dimension in both tables: added when missing, recreated (empty) when
/// another bundle's dimension left it.
async fn fit_embedding_columns(conn: &mut AnyConnection, dim: usize) -> Result<(), StoreError> {
    for m in Modality::BOTH {
        let t = m.as_str();
        match column_dim(conn, t).await? {
            Some(d) if d == dim => {}
            found => {
                if let Some(d) = found {
                    // Another bundle's dimension: the column (and its indexes) go, and are refilled below
                    // from the vectors of the bundle now loaded.
                    tracing::warn!(
                        table = t,
                        was = d,
                        now = dim,
                        "recreating the embedding column for the loaded bundle's dimension"
                    );
                    sqlx::query(&format!("ALTER TABLE {t} DROP COLUMN embedding"))
                        .execute(&mut *conn)
                        .await?;
                }
                sqlx::query(&format!(
                    "ALTER TABLE {t} ADD COLUMN embedding halfvec({dim})"
                ))
                .execute(&mut *conn)
                .await?;
            }
        }
        keep_inline(conn, t, dim).await?;
    }
    Ok(())
}

/// The share of Postgres' shared buffers a start may fill with the search's relations; the rest is left to what
/// else searches and writes read (the change log, the f32 vectors out of line, new rows).
const PREWARM_SHARE: f64 = 0.9;

/// What a start read in before the server said it was ready (`pg_prewarm`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prewarmed {
    /// Pages of the HNSW indexes read.
    pub index_pages: i64,
    /// Pages of the rows (`images` and `captions`) and their other indexes read into the shared buffers; 0 when
    /// they and the HNSW indexes do not fit them together.
    pub row_pages: i64,
    /// Whether the indexes went into the shared buffers (else into the operating system's cache only).
    pub into_buffers: bool,
}

/// Reads the search's relations in before the server says it is ready: a walk touches index pages all over the
/// graph and fetches a row for each candidate it returns or tests against a filter, and the first searches after
/// a cold start read those pages from disk one by one (at 1M, 2.2 s for the first search with the cache dropped;
/// 133-319 ms p99 for the first pass with the index prewarmed but the rows cold). Into Postgres' own buffers when
/// they hold the HNSW indexes, and the rows too when they hold both; else the indexes into the operating
/// system's cache alone, as a walk's page from there costs a copy, not a disk read. Best effort: without the
/// `pg_prewarm` extension (not every role may create it) the start goes on, cold.
async fn prewarm(conn: &mut AnyConnection) -> Option<Prewarmed> {
    if let Err(e) = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        .execute(&mut *conn)
        .await
    {
        tracing::info!(error = %e, "pg_prewarm is not available: the vector index starts cold");
        return None;
    }
    let warn =
        |e: sqlx::Error| tracing::info!(error = %e, "the vector index could not be prewarmed");
    let tables = "(to_regclass('images'), to_regclass('captions'))";
    let indexes = format!(
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam \
         WHERE a.amname = 'hnsw' AND i.indrelid IN {tables}"
    );
    // The rows and their other indexes (the filters' GIN, the btrees); plain tables only, as a partitioned one
    // has no pages of its own (its shards hold them).
    let rows = format!(
        "FROM pg_class c WHERE (c.oid IN {tables} AND c.relkind = 'r') OR c.oid IN (SELECT i.indexrelid \
         FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid JOIN pg_am a ON a.oid = x.relam \
         WHERE a.amname <> 'hnsw' AND x.relkind = 'i' AND i.indrelid IN {tables})"
    );
    let (buffers, index_pages, row_pages): (i64, i64, i64) = sqlx::query_as(&format!(
        "SELECT (SELECT setting::bigint FROM pg_settings WHERE name = 'shared_buffers'), \
         (SELECT COALESCE(sum(pg_relation_size(i.indexrelid)), 0)::bigint {indexes}) \
           / current_setting('block_size')::bigint, \
         (SELECT COALESCE(sum(pg_relation_size(c.oid)), 0)::bigint {rows}) / current_setting('block_size')::bigint"
    ))
    .fetch_one(&mut *conn)
    .await
    .map_err(warn)
    .ok()?;
    let fits = |pages: i64| pages as f64 <= PREWARM_SHARE * buffers as f64;
    let into_buffers = fits(index_pages);
    let mode = if into_buffers { "buffer" } else { "read" };
    let read = |what: &str| {
        format!("SELECT COALESCE(sum(pg_prewarm(c.oid::regclass, '{mode}')), 0)::bigint {what}")
    };
    let index_pages: i64 = sqlx::query_scalar(&read(&indexes))
        .fetch_one(&mut *conn)
        .await
        .map_err(warn)
        .ok()?;
    let mut warmed = Prewarmed {
        index_pages,
        row_pages: 0,
        into_buffers,
    };
    if into_buffers && fits(index_pages + row_pages) {
        warmed.row_pages = sqlx::query_scalar(&read(&rows))
            .fetch_one(&mut *conn)
            .await
            .map_err(warn)
            .ok()?;
    }
    Some(warmed)
}

/// The largest halfvec kept in the row itself (`STORAGE PLAIN`): 2 bytes a dimension must leave the row under
/// Postgres' 8 KB page with the other columns beside it.
const MAX_INLINE_DIM: usize = 3000;

/// Keeps the column's values in the row rather than out of line (halfvec's default storage, `EXTERNAL`, moves
/// a 1,024-d value, 2 KB, to the TOAST table once the row passes 2 KB with it): a search computes each of its
/// 100 candidates' similarity from the row, and an out-of-line value costs a TOAST index probe and two chunk
/// reads apiece (at 100k under 200 searches a second, the walk's statement took 5.3 ms in the row against
/// 9.9-11.4 ms out of line). The 2 KB in the row then push every other value of the default storage out of line,
/// however small: an image's `metadata`, which a filter reads for each row it admits or the walk visits, is kept
/// in the row too (`MAIN`: compressed first, out of line only if the row would not fit a page). A 10% filter's
/// scan at 100k read 22 buffers a row with it out of line. Rows written from now on; `VACUUM FULL` rewrites older
/// ones.
async fn keep_inline(conn: &mut AnyConnection, table: &str, dim: usize) -> Result<(), StoreError> {
    if dim > MAX_INLINE_DIM {
        return Ok(());
    }
    let columns: &[(&str, &str)] = if table == "images" {
        &[("embedding", "PLAIN"), ("metadata", "MAIN")]
    } else {
        &[("embedding", "PLAIN")]
    };
    for (column, storage) in columns {
        let now: Option<String> = sqlx::query_scalar(
            "SELECT attstorage::text FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2",
        )
        .bind(table)
        .bind(*column)
        .fetch_optional(&mut *conn)
        .await?;
        // pg_attribute's code for a storage is its first letter, lower-cased.
        if now.as_deref() != Some(storage[..1].to_lowercase().as_str()) {
            sqlx::query(&format!(
                "ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE {storage}"
            ))
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

/// The partial index of each table's rows with no embedding yet; returns the tables partitioned over other
/// servers, which carry no index of their own.
async fn index_missing_embeddings(conn: &mut AnyConnection) -> Result<Vec<Modality>, StoreError> {
    let mut partitioned = vec![];
    for m in Modality::BOTH {
        // A table partitioned over other servers (postgres_fdw shards) cannot carry an index: each shard
        // indexes its own rows (docs/storage.md, "Beyond one machine").
        let relkind: Option<String> =
            sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)")
                .bind(m.as_str())
                .fetch_optional(&mut *conn)
                .await?;
        if relkind.as_deref() == Some("p") {
            partitioned.push(m);
            continue;
        }
        let t = m.as_str();
        sqlx::query(&format!(
            "CREATE INDEX IF NOT EXISTS {t}_embedding_missing ON {t} (id) WHERE embedding IS NULL"
        ))
        .execute(&mut *conn)
        .await?;
    }
    Ok(partitioned)
}

/// The HNSW index of each metric on each table not partitioned, built where it is missing (or left invalid
/// by a crash); returns the names of those built.
async fn build_hnsw_indexes(
    conn: &mut AnyConnection,
    metrics: &[VectorMetric],
    build: HnswBuild,
    partitioned: &[Modality],
) -> Result<Vec<String>, StoreError> {
    let mut built = vec![];
    for m in Modality::BOTH {
        if partitioned.contains(&m) {
            tracing::info!(
                table = m.as_str(),
                "partitioned: its shards hold the HNSW indexes"
            );
            continue;
        }
        for metric in metrics {
            let t = m.as_str();
            let name = format!("{t}_embedding_{}", metric.suffix());
            let exists: Option<bool> = sqlx::query_scalar(
                "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
            )
            .bind(&name)
            .fetch_optional(&mut *conn)
            .await?;
            match exists {
                Some(true) => continue,
                // A build interrupted by a crash leaves an invalid index that would never be used.
                Some(false) => {
                    sqlx::query(&format!("DROP INDEX {name}"))
                        .execute(&mut *conn)
                        .await?;
                }
                None => {}
            }
            let t0 = std::time::Instant::now();
            sqlx::query(&format!(
                "CREATE INDEX {name} ON {t} USING hnsw (embedding {}) WITH (m = {}, ef_construction = {})",
                metric.opclass(),
                build.m,
                build.ef_construction
            ))
            .execute(&mut *conn)
            .await?;
            tracing::info!(index = %name, secs = t0.elapsed().as_secs_f32(), "HNSW index built in the database");
            built.push(name);
        }
    }
    Ok(built)
}

#[cfg(test)]
mod tests {
    use crate::{
        Provenance,
        filter::Filter,
        testing::{bare_image, memory},
    };

    #[tokio::test]
    async fn a_bounded_count_stops_at_its_bound_and_an_exact_one_counts_all() {
        let store = memory().await;
        let c = store.create_collection("c", "").await.expect("create");
        let images: Vec<_> = (0..7)
            .map(|i| crate::NewImage {
                metadata: serde_json::json!({"even": i % 2 == 0}),
                ..bare_image()
            })
            .collect();
        let prov = Provenance {
            bundle_id: "b",
            vision_id: "v",
        };
        let ids = store
            .insert_images(c.id, &images, prov, None)
            .await
            .expect("insert");
        let even = Filter::parse(&serde_json::json!({"even": true})).expect("filter");
        let count = |up_to, exclude| store.count_matching(c.id, &even, exclude, up_to);
        assert_eq!(count(None, None).await.expect("count"), 4);
        assert_eq!(count(Some(3), None).await.expect("count"), 3);
        assert_eq!(count(Some(9), None).await.expect("count"), 4);
        assert_eq!(count(None, Some(ids[0].0)).await.expect("count"), 3);
    }

    #[test]
    fn the_text_form_is_what_pgvector_reads() {
        assert_eq!(super::literal(&[1.0, -0.5, 1e-7]), "[1,-0.5,0.0000001]");
    }
}
