//! The database: collections, images (code + vector + metadata) and captions, through sqlx. All SQL lives
//! under this module, one file per table family. One `Store` serves both engines through sqlx's `Any`
//! driver, chosen by the URL (`sqlite:` or `postgres://`); the few engine-specific spots (JSON metadata, the
//! change sequence) branch on `Engine` in `dialect`. Every write is one transaction that also appends to the
//! change sequence (`changes`); when a function returns Ok, the data is committed and durable (SQLite: WAL +
//! synchronous=FULL; Postgres: synchronous_commit=on), which is what makes a 2xx safe to give.
//!
//! Errors state facts ("no collection named x"); what a caller should do about them is the API's to say.

// The shared names under the paths the modules use (`crate::filter`, `crate::modality`).
use jointspace_core::{filter, modality};

mod captions;
mod changes;
pub mod codec;
mod collections;
mod dialect;
mod idempotency;
mod images;
mod jobs;
mod keywords;
mod pgvector;
mod reindex;
mod transfer;
mod upsert;
mod vectors;

use std::{path::Path, str::FromStr, time::Duration};

use sqlx::{
    Any, AnyPool, ConnectOptions, Connection, Executor,
    any::{AnyPoolOptions, AnyRow},
    sqlite::{SqliteConnectOptions, SqliteJournalMode},
};

pub use self::{
    captions::{CaptionRow, EmbeddedCaption, NewCaption},
    changes::{Change, ChangeKind, Cursor},
    collections::{CollectionKey, CollectionRow, CollectionSettings},
    idempotency::{Claim, IDEMPOTENCY_HEARTBEAT, IDEMPOTENCY_RETENTION, IdempotencyKey},
    images::{ImageRow, NewImage, Provenance, StoredCode},
    jobs::{ClaimedJob, JOB_RETENTION, JobRow, JobState},
    keywords::KeywordQuery,
    pgvector::{
        HALF_ERROR, HnswBuild, Nearest, Prewarmed, Similar, VectorIndexReport, VectorMetric,
    },
    reindex::Switch,
    transfer::{ExportedImage, ImportMark, ReadSnapshot, SyncedImage},
    upsert::{
        FieldSentences, ImagePatch, ImageState, Patched, Photo, Upsert, Upserted, merge_patch,
    },
    vectors::StoredVector,
};
pub use crate::modality::Modality;

static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

impl Engine {
    pub fn of_url(url: &str) -> Result<Engine, StoreError> {
        if url.starts_with("sqlite:") {
            Ok(Engine::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Engine::Postgres)
        } else {
            Err(StoreError::Invalid(format!(
                "database URL \"{}\" is not supported: use sqlite://PATH (or sqlite::memory:) or postgres://USER@HOST/DB",
                url.split('@').next_back().unwrap_or_default()
            )))
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No collection of this name (the API tells the caller how to create one).
    #[error("no collection named \"{0}\"")]
    NoCollection(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    /// The database cannot be reached or is refusing work (down, restarting, out of connections): a 503.
    #[error("the database is unavailable ({0}); retry shortly")]
    Unavailable(String),
    #[error("database error: {0}")]
    Db(sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The TLS handshake with the database failed (an untrusted or misnamed certificate): no retry fixes it.
    #[error("the TLS handshake with the database failed: {0}")]
    Tls(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        let down = match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => true,
            // Postgres: 08 connection exception, 57P admin shutdown / cannot connect now, 53 out of resources.
            sqlx::Error::Database(d) => d.code().is_some_and(|c| {
                c.starts_with("08") || c.starts_with("57P") || c.starts_with("53")
            }),
            _ => false,
        };
        if down {
            StoreError::Unavailable(e.to_string())
        } else {
            StoreError::Db(e)
        }
    }
}

/// A certificate the client refused surfaces as an I/O error from rustls; say it is TLS, not an outage.
fn tls_or_store(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Tls(_) => StoreError::Tls(e.to_string()),
        sqlx::Error::Io(io) if io.to_string().contains("certificate") => {
            StoreError::Tls(e.to_string())
        }
        _ => e.into(),
    }
}

/// A database URL fit for logs and error messages: the password, if any, replaced by `***`.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((user, host)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{name}:***@{host}")
        }
        _ => url.to_string(),
    }
}

/// A unique violation as a conflict (stated by `msg`), a foreign-key violation as the parent gone.
fn conflict_or(e: sqlx::Error, msg: impl FnOnce() -> String) -> StoreError {
    match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => StoreError::Conflict(msg()),
        // Only possible when the collection (or image) was deleted while this write was in flight.
        sqlx::Error::Database(d) if d.is_foreign_key_violation() => {
            StoreError::NotFound("the collection or image was deleted meanwhile".into())
        }
        _ => e.into(),
    }
}

#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    engine: Engine,
    /// The dimension of the pgvector `embedding` columns, 0 while they do not exist (pgvector.rs): read at
    /// connect, so that every server on a database whose index lives in it writes them.
    embedding_dim: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

type Tx<'a> = sqlx::Transaction<'a, Any>;

/// How long a pooled Postgres connection may sit idle and still be handed out without a ping first.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

impl Store {
    /// Opens and migrates the database (SQLite: creating the file and its folder if missing). Requests wait
    /// at most 5 s for a connection.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        Self::connect_with(url, Duration::from_secs(5), 8).await
    }

    /// As `connect`; a request that cannot get a connection within `acquire_timeout` (the database is down
    /// or saturated) fails with `StoreError::Unavailable` instead of hanging. Postgres gets at most
    /// `connections` (SQLite keeps its own pool).
    pub async fn connect_with(
        url: &str,
        acquire_timeout: Duration,
        connections: u32,
    ) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let engine = Engine::of_url(url)?;
        let pool = match engine {
            Engine::Sqlite => sqlite_pool(url, acquire_timeout).await?,
            Engine::Postgres => {
                AnyPoolOptions::new()
                    .max_connections(connections)
                    .acquire_timeout(acquire_timeout)
                    // sqlx pings every connection it hands out, a round trip each time a search takes one
                    // (five of a database-mode search's 13); one in use within PING_AFTER_IDLE is taken as
                    // alive (a dead one fails its statement with a 503, as a ping's failure would, and is
                    // dropped from the pool).
                    .test_before_acquire(false)
                    .before_acquire(|conn, meta| {
                        Box::pin(async move {
                            Ok(meta.idle_for < PING_AFTER_IDLE || conn.ping().await.is_ok())
                        })
                    })
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            // The server default, stated so that a cluster set to `off` cannot turn a 2xx
                            // into a write lost on a crash.
                            conn.execute("SET synchronous_commit = on").await?;
                            Ok(())
                        })
                    })
                    .connect(url)
                    .await
                    .map_err(tls_or_store)?
            }
        };
        match engine {
            Engine::Sqlite => SQLITE_MIGRATOR.run(&pool).await?,
            // Migrations take an advisory lock: replicas starting together migrate once.
            Engine::Postgres => POSTGRES_MIGRATOR.run(&pool).await?,
        }
        let dim = match engine {
            Engine::Sqlite => None,
            Engine::Postgres => pgvector::column_dim(&mut *pool.acquire().await?, "images").await?,
        };
        Ok(Store {
            pool,
            engine,
            embedding_dim: std::sync::Arc::new(dim.unwrap_or(0).into()),
        })
    }

    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The database file, if any (index snapshots go next to it).
    pub fn file_path(url: &str) -> Option<std::path::PathBuf> {
        if Engine::of_url(url).ok()? != Engine::Sqlite {
            return None;
        }
        let opts = SqliteConnectOptions::from_str(url).ok()?;
        if is_memory(url) {
            return None;
        }
        Some(Path::new(opts.get_filename()).to_path_buf())
    }

    /// Ends every connection, once nothing else will use this store (or any clone of it). On SQLite the WAL
    /// is first checkpointed into the database file and emptied, so that the file alone holds every write:
    /// a copy or a move of it (a backup, a prepared database) then misses nothing.
    pub async fn close(&self) {
        if self.engine == Engine::Sqlite
            && let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&self.pool)
                .await
        {
            tracing::warn!(error = %e, "checkpointing the database's WAL at close failed");
        }
        self.pool.close().await;
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// A write transaction. On SQLite it takes the write lock at BEGIN (IMMEDIATE), where the busy timeout
    /// applies: a deferred transaction that reads first fails with "database is locked" (SQLITE_BUSY_SNAPSHOT,
    /// no busy wait) when another connection commits between its read and its first write.
    async fn write_tx(&self) -> Result<Tx<'static>, StoreError> {
        Ok(match self.engine {
            Engine::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Engine::Postgres => self.pool.begin().await?,
        })
    }

    /// Deletes the rows of `table` created more than `age` ago; returns how many.
    async fn delete_older_than(&self, table: &str, age: Duration) -> Result<u64, StoreError> {
        let sql = format!("DELETE FROM {table} WHERE created_at < $1");
        let n = sqlx::query(&sql)
            .bind(codec::rfc3339_ago(age))
            .execute(&self.pool)
            .await?;
        Ok(n.rows_affected())
    }

    /// Runs `select`, which ends in `collection_id = $1 AND id IN`, for `ids` in chunks of 500 (well under
    /// either engine's limit on parameters), mapping each row with `row`. Ids without a row are left out.
    async fn fetch_by_ids<T>(
        &self,
        select: &str,
        collection_id: i64,
        ids: &[i64],
        row: impl Fn(&AnyRow) -> T,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let sql = format!("{select} ({})", dialect::placeholders(2, chunk.len()));
            let mut q = sqlx::query(&sql).bind(collection_id);
            for id in chunk {
                q = q.bind(id);
            }
            out.extend(q.fetch_all(&self.pool).await?.iter().map(&row));
        }
        Ok(out)
    }
}

fn is_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

async fn sqlite_pool(url: &str, acquire_timeout: Duration) -> Result<AnyPool, StoreError> {
    let memory = is_memory(url);
    if !memory {
        let opts = SqliteConnectOptions::from_str(url)?;
        if let Some(dir) = opts
            .get_filename()
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Invalid(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        // Create the file and switch it to WAL once (the journal mode is kept in the file), so readers
        // never block the writer. synchronous=FULL is per connection: set below.
        opts.create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .connect()
            .await?
            .close()
            .await?;
    }
    Ok(AnyPoolOptions::new()
        // An in-memory database exists per connection: keep exactly one.
        .max_connections(if memory { 1 } else { 8 })
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(acquire_timeout)
        .after_connect(|conn, _| {
            Box::pin(async move {
                // FULL: a commit is on disk before it returns, so an acknowledged write survives kill -9
                // and power loss.
                conn.execute(
                    "PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000; PRAGMA synchronous = FULL;",
                )
                .await?;
                Ok(())
            })
        })
        .connect(url)
        .await?)
}

#[cfg(test)]
pub(crate) mod testing {
    use super::{EmbeddedCaption, NewCaption, NewImage, Store};

    /// A migrated in-memory SQLite database, for the unit tests of each repository.
    pub async fn memory() -> Store {
        Store::connect("sqlite::memory:")
            .await
            .expect("in-memory sqlite")
    }

    /// A caption of no image, without an offset.
    pub fn free_caption(text: &str, vector: Vec<f32>) -> NewCaption {
        NewCaption {
            image_id: None,
            caption: EmbeddedCaption::plain(text, vector),
        }
    }

    /// A 1x1 image of code [0] and vector [1, 0], without captions, thumbnail or digest.
    pub fn bare_image() -> NewImage {
        NewImage {
            external_id: None,
            metadata: serde_json::json!({}),
            width: 1,
            height: 1,
            code: vec![0],
            vector: vec![1.0, 0.0],
            offset: 0.0,
            captions: vec![],
            thumbnail: None,
            content_hash: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Store, redacted_url};

    #[test]
    fn a_database_url_is_shown_without_its_password() {
        assert_eq!(
            redacted_url("postgres://shop:s3cret@db:5432/js?sslmode=require"),
            "postgres://shop:***@db:5432/js?sslmode=require"
        );
        assert_eq!(
            redacted_url("postgres://shop@db/js"),
            "postgres://shop@db/js"
        );
        assert_eq!(redacted_url("sqlite://data/js.db"), "sqlite://data/js.db");
    }

    /// The regression test of `write_tx`'s BEGIN IMMEDIATE on SQLite: a write transaction reads, another
    /// connection commits, then the transaction writes. Deferred, that write fails at once with "database is
    /// locked" (SQLITE_BUSY_SNAPSHOT: its read snapshot is stale, and the busy timeout does not apply);
    /// immediate, the transaction holds the write lock from BEGIN, the other writer waits for it, and both
    /// succeed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_transaction_that_reads_first_survives_a_concurrent_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("w.db").display());
        let store = Store::connect(&url).await.expect("store");
        let mut tx = store.write_tx().await.expect("begin");
        let before: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM collections")
            .fetch_one(&mut *tx)
            .await
            .expect("read");
        let other = store.clone();
        let mut concurrent =
            tokio::spawn(async move { other.create_collection("other", "").await });
        // Deferred, the other writer commits now; immediate, it waits for this transaction's lock.
        let early = tokio::time::timeout(Duration::from_millis(500), &mut concurrent)
            .await
            .ok();
        let wrote = sqlx::query(
            "INSERT INTO collections (name, description, created_at) VALUES ('mine', '', 'now')",
        )
        .execute(&mut *tx)
        .await;
        assert!(
            wrote.is_ok(),
            "the write after a read failed ({:?}); the other writer committed in between: {}",
            wrote.err(),
            early.is_some()
        );
        tx.commit().await.expect("commit");
        let other_done = match early {
            Some(done) => done,
            None => concurrent.await,
        };
        other_done
            .expect("task")
            .expect("the other writer waited for the lock and committed");
        let after = store.collection_names().await.expect("names").len() as i64;
        assert_eq!(after, before + 2);
    }
}
