//! The database: collections, images (code + vector + metadata) and captions, through sqlx. All SQL lives
//! here. One `Store` serves both engines through sqlx's `Any` driver, chosen by the URL (`sqlite:` or
//! `postgres://`); the few engine-specific spots (JSON metadata, the change sequence) branch on `Engine`.
//! Every write is one transaction that also appends to the change sequence (`changes`); when a function
//! returns Ok, the data is committed and durable (SQLite: WAL + synchronous=FULL; Postgres:
//! synchronous_commit=on), which is what makes a 2xx safe to give.

use std::{collections::BTreeMap, path::Path, str::FromStr, time::Duration};

use serde_json::Value;
use sqlx::{
    Any, AnyPool, ConnectOptions, Connection, Executor, Row,
    any::{AnyPoolOptions, AnyRow},
    sqlite::{SqliteConnectOptions, SqliteJournalMode},
};

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

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Modality {
    Images,
    Captions,
}

impl Modality {
    pub fn as_str(self) -> &'static str {
        match self {
            Modality::Images => "images",
            Modality::Captions => "captions",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CollectionRow {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub created_at: String,
    pub generation: i64,
    pub images: i64,
    pub captions: i64,
}

#[derive(Debug, Clone)]
pub struct ImageRow {
    pub id: i64,
    pub external_id: Option<String>,
    pub metadata: Value,
    pub width: i64,
    pub height: i64,
    pub bundle_id: String,
    pub created_at: String,
}

#[derive(Debug, Clone)]
pub struct CaptionRow {
    pub id: i64,
    pub image_id: Option<i64>,
    pub text: String,
    pub created_at: String,
}

pub struct NewImage {
    pub external_id: Option<String>,
    pub metadata: Value,
    pub width: u32,
    pub height: u32,
    pub code: Vec<u8>,
    pub vector: Vec<f32>,
    /// The image's search offset (docs/bundle.md, "The hubness section"); 0 without a bank.
    pub offset: f32,
    pub captions: Vec<(String, Vec<f32>)>,
}

pub struct NewCaption {
    pub image_id: Option<i64>,
    pub text: String,
    pub vector: Vec<f32>,
}

/// Which bundle produced the stored vectors.
#[derive(Debug, Clone)]
pub struct Provenance<'a> {
    pub bundle_id: &'a str,
    pub vision_id: &'a str,
}

pub fn vector_to_blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn blob_to_vector(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// RFC 3339 UTC timestamp, second precision (no date crate needed for this one format).
pub fn now_rfc3339() -> String {
    rfc3339_at(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0) as i64,
    )
}

/// RFC 3339 UTC timestamp of a Unix time in seconds.
pub fn rfc3339_at(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    engine: Engine,
}

type Tx<'a> = sqlx::Transaction<'a, Any>;

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

impl Store {
    /// Opens and migrates the database (SQLite: creating the file and its folder if missing). Requests wait
    /// at most 5 s for a connection.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        Self::connect_with(url, Duration::from_secs(5)).await
    }

    /// As `connect`; a request that cannot get a connection within `acquire_timeout` (the database is down
    /// or saturated) fails with `StoreError::Unavailable` instead of hanging.
    pub async fn connect_with(url: &str, acquire_timeout: Duration) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let engine = Engine::of_url(url)?;
        let pool = match engine {
            Engine::Sqlite => {
                let memory = url.contains(":memory:") || url.contains("mode=memory");
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
                    // Create the file and switch it to WAL once (the journal mode is kept in the file), so
                    // readers never block the writer. synchronous=FULL is per connection: set below.
                    opts.create_if_missing(true)
                        .journal_mode(SqliteJournalMode::Wal)
                        .connect()
                        .await?
                        .close()
                        .await?;
                }
                AnyPoolOptions::new()
                    // An in-memory database exists per connection: keep exactly one.
                    .max_connections(if memory { 1 } else { 8 })
                    .min_connections(1)
                    .idle_timeout(None)
                    .max_lifetime(None)
                    .acquire_timeout(acquire_timeout)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            // FULL: a commit is on disk before it returns, so an acknowledged write
                            // survives kill -9 and power loss.
                            conn.execute(
                                "PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000; PRAGMA synchronous = FULL;",
                            )
                            .await?;
                            Ok(())
                        })
                    })
                    .connect(url)
                    .await?
            }
            Engine::Postgres => {
                AnyPoolOptions::new()
                    .max_connections(8)
                    .acquire_timeout(acquire_timeout)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            // The server default, stated so that a cluster set to `off` cannot turn a 2xx
                            // into a write lost on a crash.
                            conn.execute("SET synchronous_commit = on").await?;
                            Ok(())
                        })
                    })
                    .connect(url)
                    .await?
            }
        };
        match engine {
            Engine::Sqlite => SQLITE_MIGRATOR.run(&pool).await?,
            // Migrations take an advisory lock: replicas starting together migrate once.
            Engine::Postgres => POSTGRES_MIGRATOR.run(&pool).await?,
        }
        Ok(Store { pool, engine })
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
        if url.contains(":memory:") || url.contains("mode=memory") {
            return None;
        }
        Some(Path::new(opts.get_filename()).to_path_buf())
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    // ---- collections ----

    /// A write transaction. On SQLite it takes the write lock at BEGIN (IMMEDIATE), where the busy timeout
    /// applies: a deferred transaction that reads first fails with "database is locked" (SQLITE_BUSY_SNAPSHOT,
    /// no busy wait) when another connection commits between its read and its first write.
    async fn write_tx(&self) -> Result<Tx<'static>, StoreError> {
        Ok(match self.engine {
            Engine::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Engine::Postgres => self.pool.begin().await?,
        })
    }

    pub async fn create_collection(
        &self,
        name: &str,
        description: &str,
    ) -> Result<CollectionRow, StoreError> {
        let now = now_rfc3339();
        let mut tx = self.write_tx().await?;
        let id: i64 = sqlx::query_scalar("INSERT INTO collections (name, description, created_at) VALUES ($1, $2, $3) RETURNING id")
            .bind(name)
            .bind(description)
            .bind(&now)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| conflict_or(e, || format!("a collection named \"{name}\" already exists")))?;
        Self::log(&mut tx, id, ChangeKind::Collection, false, &[id]).await?;
        tx.commit().await?;
        Ok(CollectionRow {
            id,
            name: name.into(),
            description: description.into(),
            created_at: now,
            generation: 0,
            images: 0,
            captions: 0,
        })
    }

    const COLLECTION_SELECT: &'static str = "SELECT c.id, c.name, c.description, c.created_at, c.generation, \
        (SELECT COUNT(*) FROM images i WHERE i.collection_id = c.id) AS images, \
        (SELECT COUNT(*) FROM captions p WHERE p.collection_id = c.id) AS captions FROM collections c";

    fn collection_row(r: &AnyRow) -> CollectionRow {
        CollectionRow {
            id: r.get("id"),
            name: r.get("name"),
            description: r.get("description"),
            created_at: r.get("created_at"),
            generation: r.get("generation"),
            images: r.get("images"),
            captions: r.get("captions"),
        }
    }

    pub async fn list_collections(&self) -> Result<Vec<CollectionRow>, StoreError> {
        let rows = sqlx::query(&format!("{} ORDER BY c.name", Self::COLLECTION_SELECT))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(Self::collection_row).collect())
    }

    pub async fn collection(&self, name: &str) -> Result<CollectionRow, StoreError> {
        let row = sqlx::query(&format!("{} WHERE c.name = $1", Self::COLLECTION_SELECT))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(Self::collection_row).ok_or_else(|| {
            StoreError::NotFound(format!(
                "no collection named \"{name}\"; create it with POST /v1/collections"
            ))
        })
    }

    /// Just the id (no row counts): what a request needs to resolve its collection.
    pub async fn collection_id(&self, name: &str) -> Result<i64, StoreError> {
        let id: Option<i64> = sqlx::query_scalar("SELECT id FROM collections WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        id.ok_or_else(|| {
            StoreError::NotFound(format!(
                "no collection named \"{name}\"; create it with POST /v1/collections"
            ))
        })
    }

    pub async fn collection_by_id(&self, id: i64) -> Result<Option<CollectionRow>, StoreError> {
        let row = sqlx::query(&format!("{} WHERE c.id = $1", Self::COLLECTION_SELECT))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.as_ref().map(Self::collection_row))
    }

    pub async fn delete_collection(&self, name: &str) -> Result<i64, StoreError> {
        let mut tx = self.write_tx().await?;
        let id: Option<i64> =
            sqlx::query_scalar("DELETE FROM collections WHERE name = $1 RETURNING id")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
        let id =
            id.ok_or_else(|| StoreError::NotFound(format!("no collection named \"{name}\"")))?;
        Self::log(&mut tx, id, ChangeKind::Collection, true, &[id]).await?;
        tx.commit().await?;
        Ok(id)
    }

    // ---- images ----

    /// Inserts images (and their captions) in one transaction. Returns the new image ids and, per image,
    /// the new caption ids.
    pub async fn insert_images(
        &self,
        collection_id: i64,
        images: &[NewImage],
        prov: Provenance<'_>,
    ) -> Result<Vec<(i64, Vec<i64>)>, StoreError> {
        let now = now_rfc3339();
        let mut tx = self.write_tx().await?;
        let mut out = Vec::with_capacity(images.len());
        let sql = format!(
            "INSERT INTO images (collection_id, external_id, metadata, width, height, code, vector, bundle_id, vision_id, created_at, hub_offset) \
             VALUES ($1, $2, {}, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
            self.json_param(3)
        );
        for (i, img) in images.iter().enumerate() {
            let id: i64 = sqlx::query_scalar(&sql)
                .bind(collection_id)
                .bind(&img.external_id)
                .bind(img.metadata.to_string())
                .bind(i64::from(img.width))
                .bind(i64::from(img.height))
                .bind(&img.code)
                .bind(vector_to_blob(&img.vector))
                .bind(prov.bundle_id)
                .bind(prov.vision_id)
                .bind(&now)
                .bind(f64::from(img.offset))
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| {
                    conflict_or(e, || {
                        format!(
                            "image {i}: external_id \"{}\" already exists in this collection",
                            img.external_id.as_deref().unwrap_or_default()
                        )
                    })
                })?;
            let mut caps = Vec::with_capacity(img.captions.len());
            for (text, vector) in &img.captions {
                caps.push(
                    Self::insert_caption_tx(
                        &mut tx,
                        collection_id,
                        Some(id),
                        text,
                        vector,
                        prov.bundle_id,
                        &now,
                    )
                    .await?,
                );
            }
            out.push((id, caps));
        }
        let image_ids: Vec<i64> = out.iter().map(|(id, _)| *id).collect();
        let caption_ids: Vec<i64> = out.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        Self::log(&mut tx, collection_id, ChangeKind::Image, false, &image_ids).await?;
        Self::log(
            &mut tx,
            collection_id,
            ChangeKind::Caption,
            false,
            &caption_ids,
        )
        .await?;
        Self::bump(&mut tx, collection_id).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn insert_caption_tx(
        tx: &mut Tx<'_>,
        collection_id: i64,
        image_id: Option<i64>,
        text: &str,
        vector: &[f32],
        bundle_id: &str,
        now: &str,
    ) -> Result<i64, StoreError> {
        sqlx::query_scalar(
            "INSERT INTO captions (collection_id, image_id, text, vector, bundle_id, created_at) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        )
        .bind(collection_id)
        .bind(image_id)
        .bind(text)
        .bind(vector_to_blob(vector))
        .bind(bundle_id)
        .bind(now)
        .fetch_one(&mut **tx)
        .await
        .map_err(|e| conflict_or(e, String::new))
    }

    /// Appends to the change sequence, in the caller's transaction (so a change is visible iff its data is).
    async fn log(
        tx: &mut Tx<'_>,
        collection_id: i64,
        kind: ChangeKind,
        delete: bool,
        ids: &[i64],
    ) -> Result<(), StoreError> {
        let now = now_rfc3339();
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

    async fn bump(tx: &mut Tx<'_>, collection_id: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE collections SET generation = generation + 1 WHERE id = $1")
            .bind(collection_id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// The image columns that `image_row` reads (Postgres keeps metadata as jsonb; the Any driver reads text).
    fn image_columns(&self) -> &'static str {
        match self.engine {
            Engine::Sqlite => "id, external_id, metadata, width, height, bundle_id, created_at",
            Engine::Postgres => {
                "id, external_id, metadata::text AS metadata, width, height, bundle_id, created_at"
            }
        }
    }

    /// The placeholder for a JSON text parameter stored into a JSON column.
    fn json_param(&self, n: usize) -> String {
        match self.engine {
            Engine::Sqlite => format!("${n}"),
            Engine::Postgres => format!("${n}::jsonb"),
        }
    }

    fn image_row(r: &AnyRow) -> ImageRow {
        let meta: String = r.get("metadata");
        ImageRow {
            id: r.get("id"),
            external_id: r.get("external_id"),
            metadata: serde_json::from_str(&meta).unwrap_or(Value::Null),
            width: r.get("width"),
            height: r.get("height"),
            bundle_id: r.get("bundle_id"),
            created_at: r.get("created_at"),
        }
    }

    pub async fn image(&self, collection_id: i64, id: i64) -> Result<ImageRow, StoreError> {
        let r = sqlx::query(&format!(
            "SELECT {} FROM images WHERE collection_id = $1 AND id = $2",
            self.image_columns()
        ))
        .bind(collection_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        r.as_ref()
            .map(Self::image_row)
            .ok_or_else(|| StoreError::NotFound(format!("no image {id} in this collection")))
    }

    pub async fn image_by_external_id(
        &self,
        collection_id: i64,
        external_id: &str,
    ) -> Result<ImageRow, StoreError> {
        let r = sqlx::query(&format!(
            "SELECT {} FROM images WHERE collection_id = $1 AND external_id = $2",
            self.image_columns()
        ))
        .bind(collection_id)
        .bind(external_id)
        .fetch_optional(&self.pool)
        .await?;
        r.as_ref().map(Self::image_row).ok_or_else(|| {
            StoreError::NotFound(format!(
                "no image with external_id \"{external_id}\" in this collection"
            ))
        })
    }

    pub async fn images_by_ids(
        &self,
        collection_id: i64,
        ids: &[i64],
    ) -> Result<Vec<ImageRow>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT {} FROM images WHERE collection_id = $1 AND id IN ({})",
                self.image_columns(),
                placeholders(2, chunk.len())
            );
            let mut q = sqlx::query(&sql).bind(collection_id);
            for id in chunk {
                q = q.bind(id);
            }
            out.extend(q.fetch_all(&self.pool).await?.iter().map(Self::image_row));
        }
        Ok(out)
    }

    pub async fn image_vector(&self, collection_id: i64, id: i64) -> Result<Vec<f32>, StoreError> {
        let b: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT vector FROM images WHERE collection_id = $1 AND id = $2")
                .bind(collection_id)
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        b.map(|b| blob_to_vector(&b))
            .ok_or_else(|| StoreError::NotFound(format!("no image {id} in this collection")))
    }

    pub async fn image_code(&self, collection_id: i64, id: i64) -> Result<Vec<u8>, StoreError> {
        let b: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT code FROM images WHERE collection_id = $1 AND id = $2")
                .bind(collection_id)
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        b.ok_or_else(|| StoreError::NotFound(format!("no image {id} in this collection")))
    }

    /// Lists images, optionally only those whose metadata equals `filter` on every key.
    pub async fn list_images(
        &self,
        collection_id: i64,
        filter: &BTreeMap<String, Value>,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<ImageRow>, StoreError> {
        let (clause, binds) = self.filter_sql(filter, 2)?;
        let sql = format!(
            "SELECT {} FROM images WHERE collection_id = $1{clause} ORDER BY id LIMIT {limit} OFFSET {offset}",
            self.image_columns()
        );
        let mut q = sqlx::query(&sql).bind(collection_id);
        for b in binds {
            q = b.bind(q);
        }
        Ok(q.fetch_all(&self.pool)
            .await?
            .iter()
            .map(Self::image_row)
            .collect())
    }

    /// Ids of the images matching a metadata filter (for filtered search).
    pub async fn filter_image_ids(
        &self,
        collection_id: i64,
        filter: &BTreeMap<String, Value>,
    ) -> Result<Vec<i64>, StoreError> {
        let (clause, binds) = self.filter_sql(filter, 2)?;
        let sql = format!("SELECT id FROM images WHERE collection_id = $1{clause} ORDER BY id");
        let mut q = sqlx::query(&sql).bind(collection_id);
        for b in binds {
            q = b.bind(q);
        }
        Ok(q.fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| r.get::<i64, _>(0))
            .collect())
    }

    /// Equality on top-level metadata keys: SQLite's json_extract; on Postgres, jsonb containment of
    /// `{"key": value}` (which for a scalar is equality, and strict about types: `true` is not `1` there).
    fn filter_sql(
        &self,
        filter: &BTreeMap<String, Value>,
        first: usize,
    ) -> Result<(String, Vec<Bind>), StoreError> {
        let mut clause = String::new();
        let mut binds = Vec::new();
        for (i, (k, v)) in filter.iter().enumerate() {
            if k.is_empty()
                || k.len() > 64
                || !k
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(StoreError::Invalid(format!(
                    "filter key \"{k}\" is not allowed: use 1-64 letters, digits, '_' or '-'"
                )));
            }
            if self.engine == Engine::Postgres {
                if !(v.is_string() || v.is_number() || v.is_boolean()) {
                    return Err(StoreError::Invalid(format!(
                        "filter \"{k}\": only strings, numbers and booleans can be matched"
                    )));
                }
                let one: serde_json::Map<String, Value> =
                    [(k.clone(), v.clone())].into_iter().collect();
                binds.push(Bind::Text(Value::Object(one).to_string()));
                clause.push_str(&format!(" AND metadata @> ${}::jsonb", first + i));
                continue;
            }
            binds.push(match v {
                Value::String(s) => Bind::Text(s.clone()),
                Value::Bool(b) => Bind::Int(i64::from(*b)),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => Bind::Int(i),
                    None => Bind::Real(n.as_f64().unwrap_or(f64::NAN)),
                },
                _ => {
                    return Err(StoreError::Invalid(format!(
                        "filter \"{k}\": only strings, numbers and booleans can be matched"
                    )));
                }
            });
            clause.push_str(&format!(
                " AND json_extract(metadata, '$.\"{k}\"') = ${}",
                first + i
            ));
        }
        Ok((clause, binds))
    }

    pub async fn delete_image(&self, collection_id: i64, id: i64) -> Result<Vec<i64>, StoreError> {
        let mut tx = self.write_tx().await?;
        let caps: Vec<i64> = sqlx::query_scalar("SELECT id FROM captions WHERE image_id = $1")
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
        let n = sqlx::query("DELETE FROM images WHERE collection_id = $1 AND id = $2")
            .bind(collection_id)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if n.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!(
                "no image {id} in this collection"
            )));
        }
        Self::log(&mut tx, collection_id, ChangeKind::Image, true, &[id]).await?;
        Self::log(&mut tx, collection_id, ChangeKind::Caption, true, &caps).await?;
        Self::bump(&mut tx, collection_id).await?;
        tx.commit().await?;
        Ok(caps)
    }

    // ---- captions ----

    pub async fn insert_captions(
        &self,
        collection_id: i64,
        caps: &[NewCaption],
        bundle_id: &str,
    ) -> Result<Vec<i64>, StoreError> {
        let now = now_rfc3339();
        let mut tx = self.write_tx().await?;
        let mut ids = Vec::with_capacity(caps.len());
        for (i, c) in caps.iter().enumerate() {
            if let Some(image_id) = c.image_id {
                let ok: Option<i64> = sqlx::query_scalar(
                    "SELECT id FROM images WHERE collection_id = $1 AND id = $2",
                )
                .bind(collection_id)
                .bind(image_id)
                .fetch_optional(&mut *tx)
                .await?;
                if ok.is_none() {
                    return Err(StoreError::NotFound(format!(
                        "caption {i}: no image {image_id} in this collection"
                    )));
                }
            }
            ids.push(
                Self::insert_caption_tx(
                    &mut tx,
                    collection_id,
                    c.image_id,
                    &c.text,
                    &c.vector,
                    bundle_id,
                    &now,
                )
                .await?,
            );
        }
        Self::log(&mut tx, collection_id, ChangeKind::Caption, false, &ids).await?;
        Self::bump(&mut tx, collection_id).await?;
        tx.commit().await?;
        Ok(ids)
    }

    fn caption_row(r: &AnyRow) -> CaptionRow {
        CaptionRow {
            id: r.get("id"),
            image_id: r.get("image_id"),
            text: r.get("text"),
            created_at: r.get("created_at"),
        }
    }

    pub async fn list_captions(
        &self,
        collection_id: i64,
        image_id: Option<i64>,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<CaptionRow>, StoreError> {
        let rows = match image_id {
            Some(img) => sqlx::query(&format!(
                "SELECT id, image_id, text, created_at FROM captions WHERE collection_id = $1 AND image_id = $2 ORDER BY id LIMIT {limit} OFFSET {offset}"
            ))
            .bind(collection_id)
            .bind(img)
            .fetch_all(&self.pool)
            .await?,
            None => sqlx::query(&format!(
                "SELECT id, image_id, text, created_at FROM captions WHERE collection_id = $1 ORDER BY id LIMIT {limit} OFFSET {offset}"
            ))
            .bind(collection_id)
            .fetch_all(&self.pool)
            .await?,
        };
        Ok(rows.iter().map(Self::caption_row).collect())
    }

    pub async fn captions_by_ids(
        &self,
        collection_id: i64,
        ids: &[i64],
    ) -> Result<Vec<CaptionRow>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT id, image_id, text, created_at FROM captions WHERE collection_id = $1 AND id IN ({})",
                placeholders(2, chunk.len())
            );
            let mut q = sqlx::query(&sql).bind(collection_id);
            for id in chunk {
                q = q.bind(id);
            }
            out.extend(q.fetch_all(&self.pool).await?.iter().map(Self::caption_row));
        }
        Ok(out)
    }

    pub async fn delete_caption(&self, collection_id: i64, id: i64) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        let n = sqlx::query("DELETE FROM captions WHERE collection_id = $1 AND id = $2")
            .bind(collection_id)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if n.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!(
                "no caption {id} in this collection"
            )));
        }
        Self::log(&mut tx, collection_id, ChangeKind::Caption, true, &[id]).await?;
        Self::bump(&mut tx, collection_id).await?;
        tx.commit().await?;
        Ok(())
    }

    // ---- index building and reindex ----

    /// Every (id, vector) of one modality, for building the index.
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

    /// (bundle_id, vision_id, count) of the stored image vectors, to detect vectors from another bundle.
    pub async fn image_provenance(&self) -> Result<Vec<(String, String, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT bundle_id, vision_id, COUNT(*) AS n FROM images GROUP BY bundle_id, vision_id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("bundle_id"), r.get("vision_id"), r.get("n")))
            .collect())
    }

    pub async fn caption_provenance(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = sqlx::query("SELECT bundle_id, COUNT(*) AS n FROM captions GROUP BY bundle_id")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("bundle_id"), r.get("n")))
            .collect())
    }

    /// A page of (id, code, vision_id) of all images after `after`, for reindexing.
    pub async fn codes_page(
        &self,
        after: i64,
        limit: i64,
    ) -> Result<Vec<(i64, Vec<u8>, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, code, vision_id FROM images WHERE id > $1 ORDER BY id LIMIT $2",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("id"), r.get("code"), r.get("vision_id")))
            .collect())
    }

    pub async fn captions_page(
        &self,
        after: i64,
        limit: i64,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = sqlx::query("SELECT id, text FROM captions WHERE id > $1 ORDER BY id LIMIT $2")
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| (r.get("id"), r.get("text"))).collect())
    }

    /// Rewrites vectors (and, for images, their search offsets, one per row) in one transaction and bumps
    /// every collection's generation (their snapshots go stale).
    pub async fn update_vectors(
        &self,
        modality: Modality,
        rows: &[(i64, Vec<f32>)],
        offsets: &[f32],
        bundle_id: &str,
    ) -> Result<(), StoreError> {
        let images = modality == Modality::Images;
        assert!(
            !images || offsets.len() == rows.len(),
            "one offset per image"
        );
        let mut tx = self.write_tx().await?;
        let sql = format!(
            "UPDATE {} SET vector = $1, bundle_id = $2{} WHERE id = $3",
            modality.as_str(),
            if images { ", hub_offset = $4" } else { "" }
        );
        for (i, (id, v)) in rows.iter().enumerate() {
            let q = sqlx::query(&sql)
                .bind(vector_to_blob(v))
                .bind(bundle_id)
                .bind(id);
            let q = if images {
                q.bind(f64::from(offsets[i]))
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

    /// The (id, vector, search offset) of the given ids that still exist (for followers applying upserts);
    /// captions have no offset (0).
    pub async fn vectors_by_ids(
        &self,
        collection_id: i64,
        modality: Modality,
        ids: &[i64],
    ) -> Result<Vec<(i64, Vec<f32>, f32)>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        let images = modality == Modality::Images;
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT id, vector{} FROM {} WHERE collection_id = $1 AND id IN ({})",
                if images { ", hub_offset" } else { "" },
                modality.as_str(),
                placeholders(2, chunk.len())
            );
            let mut q = sqlx::query(&sql).bind(collection_id);
            for id in chunk {
                q = q.bind(id);
            }
            out.extend(q.fetch_all(&self.pool).await?.iter().map(|r| {
                (
                    r.get::<i64, _>("id"),
                    blob_to_vector(r.get::<&[u8], _>("vector")),
                    if images {
                        r.get::<f64, _>("hub_offset") as f32
                    } else {
                        0.0
                    },
                )
            }));
        }
        Ok(out)
    }

    /// Every image's search offset in one collection (the index keeps them beside the vectors).
    pub async fn image_offsets(&self, collection_id: i64) -> Result<Vec<(i64, f32)>, StoreError> {
        let rows = sqlx::query("SELECT id, hub_offset FROM images WHERE collection_id = $1")
            .bind(collection_id)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<i64, _>("id"), r.get::<f64, _>("hub_offset") as f32))
            .collect())
    }

    // ---- the change sequence (how replicas follow each other's writes) ----

    /// Records that every vector may have changed (after a reindex): followers reload everything.
    pub async fn log_reload(&self) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        Self::log(&mut tx, 0, ChangeKind::All, false, &[0]).await?;
        tx.commit().await?;
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
        let cutoff = rfc3339_at(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
                .saturating_sub(age.as_secs()) as i64,
        );
        let n = sqlx::query("DELETE FROM changes WHERE created_at < $1")
            .bind(cutoff)
            .execute(&self.pool)
            .await?;
        Ok(n.rows_affected())
    }
}

/// `$first, $first+1, ...`: `n` numbered placeholders for an `IN (...)` list.
fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(",")
}

enum Bind {
    Text(String),
    Real(f64),
    Int(i64),
}

impl Bind {
    fn bind<'q>(
        self,
        q: sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>,
    ) -> sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>> {
        match self {
            Bind::Text(s) => q.bind(s),
            Bind::Real(f) => q.bind(f),
            Bind::Int(i) => q.bind(i),
        }
    }
}
