//! The database: collections, images (code + vector + metadata) and captions, through sqlx. All SQL lives
//! here, so moving to Postgres touches this module only (the JSON filter is the one SQLite-specific spot).
//! Every write is one transaction: when a function returns Ok, the data is committed.

use std::{collections::BTreeMap, path::Path, str::FromStr, time::Duration};

use serde_json::Value;
use sqlx::{
    Row,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    },
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
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
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
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
    pool: SqlitePool,
}

fn conflict_or(e: sqlx::Error, msg: impl FnOnce() -> String) -> StoreError {
    match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => StoreError::Conflict(msg()),
        // Only possible when the collection (or image) was deleted while this write was in flight.
        sqlx::Error::Database(d) if d.is_foreign_key_violation() => {
            StoreError::NotFound("the collection or image was deleted meanwhile".into())
        }
        _ => StoreError::Db(e),
    }
}

impl Store {
    /// Opens (creating the file and its folder if missing) and migrates the database.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let memory = url.contains(":memory:") || url.contains("mode=memory");
        let opts = if memory {
            opts
        } else {
            if let Some(dir) = opts
                .get_filename()
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
            {
                std::fs::create_dir_all(dir).map_err(|e| {
                    StoreError::Invalid(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
            // WAL + synchronous=FULL: readers never block the writer and a commit survives power loss.
            opts.journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
        };
        // An in-memory database exists per connection: keep exactly one.
        let max = if memory { 1 } else { 8 };
        let pool = SqlitePoolOptions::new()
            .max_connections(max)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(opts)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(Store { pool })
    }

    /// The database file, if any (index snapshots go next to it).
    pub fn file_path(url: &str) -> Option<std::path::PathBuf> {
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

    pub async fn create_collection(
        &self,
        name: &str,
        description: &str,
    ) -> Result<CollectionRow, StoreError> {
        let now = now_rfc3339();
        let id: i64 = sqlx::query_scalar("INSERT INTO collections (name, description, created_at) VALUES ($1, $2, $3) RETURNING id")
            .bind(name)
            .bind(description)
            .bind(&now)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| conflict_or(e, || format!("a collection named \"{name}\" already exists")))?;
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

    fn collection_row(r: &sqlx::sqlite::SqliteRow) -> CollectionRow {
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

    pub async fn delete_collection(&self, name: &str) -> Result<i64, StoreError> {
        let id: Option<i64> =
            sqlx::query_scalar("DELETE FROM collections WHERE name = $1 RETURNING id")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
        id.ok_or_else(|| StoreError::NotFound(format!("no collection named \"{name}\"")))
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
        let mut tx = self.pool.begin().await?;
        let mut out = Vec::with_capacity(images.len());
        for (i, img) in images.iter().enumerate() {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO images (collection_id, external_id, metadata, width, height, code, vector, bundle_id, vision_id, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
            )
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
        Self::bump(&mut tx, collection_id).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn insert_caption_tx(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
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

    async fn bump(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        collection_id: i64,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE collections SET generation = generation + 1 WHERE id = $1")
            .bind(collection_id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    const IMAGE_COLUMNS: &'static str =
        "id, external_id, metadata, width, height, bundle_id, created_at";

    fn image_row(r: &sqlx::sqlite::SqliteRow) -> ImageRow {
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
            Self::IMAGE_COLUMNS
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
            Self::IMAGE_COLUMNS
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
            let marks: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 2)).collect();
            let sql = format!(
                "SELECT {} FROM images WHERE collection_id = $1 AND id IN ({})",
                Self::IMAGE_COLUMNS,
                marks.join(",")
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
        let (clause, binds) = Self::filter_sql(filter, 2)?;
        let sql = format!(
            "SELECT {} FROM images WHERE collection_id = $1{clause} ORDER BY id LIMIT {limit} OFFSET {offset}",
            Self::IMAGE_COLUMNS
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
        let (clause, binds) = Self::filter_sql(filter, 2)?;
        let sql = format!("SELECT id FROM images WHERE collection_id = $1{clause} ORDER BY id");
        let mut q = sqlx::query_scalar::<_, i64>(&sql).bind(collection_id);
        for b in binds {
            q = match b {
                Bind::Text(s) => q.bind(s),
                Bind::Real(f) => q.bind(f),
                Bind::Int(i) => q.bind(i),
            };
        }
        Ok(q.fetch_all(&self.pool).await?)
    }

    /// Equality on top-level metadata keys. SQLite's json_extract; Postgres would use `metadata->>key`.
    fn filter_sql(
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
        let mut tx = self.pool.begin().await?;
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
        let mut tx = self.pool.begin().await?;
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
        Self::bump(&mut tx, collection_id).await?;
        tx.commit().await?;
        Ok(ids)
    }

    fn caption_row(r: &sqlx::sqlite::SqliteRow) -> CaptionRow {
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
            let marks: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 2)).collect();
            let sql = format!(
                "SELECT id, image_id, text, created_at FROM captions WHERE collection_id = $1 AND id IN ({})",
                marks.join(",")
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
        let mut tx = self.pool.begin().await?;
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

    /// Rewrites vectors in one transaction and bumps every collection's generation (their snapshots go stale).
    pub async fn update_vectors(
        &self,
        modality: Modality,
        rows: &[(i64, Vec<f32>)],
        bundle_id: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let sql = format!(
            "UPDATE {} SET vector = $1, bundle_id = $2 WHERE id = $3",
            modality.as_str()
        );
        for (id, v) in rows {
            sqlx::query(&sql)
                .bind(vector_to_blob(v))
                .bind(bundle_id)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("UPDATE collections SET generation = generation + 1")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

enum Bind {
    Text(String),
    Real(f64),
    Int(i64),
}

impl Bind {
    fn bind<'q>(
        self,
        q: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
        match self {
            Bind::Text(s) => q.bind(s),
            Bind::Real(f) => q.bind(f),
            Bind::Int(i) => q.bind(i),
        }
    }
}
