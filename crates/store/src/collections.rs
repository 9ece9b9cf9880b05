//! The collections table: a name, a description, and a generation that every write bumps (index snapshots
//! of an older generation are stale).

use jointspace_core::TextField;
use sqlx::{Row, any::AnyRow};

use super::{ChangeKind, Store, StoreError, Tx, codec::now_rfc3339, conflict_or};

#[derive(Debug, Clone)]
pub struct CollectionRow {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub created_at: String,
    pub generation: i64,
    /// The metadata fields searched by keyword; `None`: keyword search not asked for (vector by default).
    pub text_fields: Option<Vec<TextField>>,
    /// The metadata field naming each image's product (`CollectionSettings::group_by`).
    pub group_by: Option<String>,
    pub images: i64,
    pub captions: i64,
}

/// What a collection asks of its searches, set when it is created.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CollectionSettings {
    /// The metadata fields searched by keyword and by meaning; `None`: neither asked for (vector by default).
    pub text_fields: Option<Vec<TextField>>,
    /// The metadata field whose value names an image's product: images sharing it are one product's photos,
    /// and an image search returns each product once. `None`: every image stands alone.
    pub group_by: Option<String>,
}

/// A collection as a request resolves it (`collection_key`).
#[derive(Debug, Clone)]
pub struct CollectionKey {
    pub id: i64,
    pub settings: CollectionSettings,
    /// Whether it holds any caption (written, or a text field's sentence) when resolved.
    pub has_captions: bool,
}

const COLLECTION_SELECT: &str = "SELECT c.id, c.name, c.description, c.created_at, c.generation, c.text_fields, c.group_by, \
    (SELECT COUNT(*) FROM images i WHERE i.collection_id = c.id) AS images, \
    (SELECT COUNT(*) FROM captions p WHERE p.collection_id = c.id AND p.field IS NULL) AS captions FROM collections c";

fn collection_row(r: &AnyRow) -> CollectionRow {
    CollectionRow {
        id: r.get("id"),
        name: r.get("name"),
        description: r.get("description"),
        created_at: r.get("created_at"),
        generation: r.get("generation"),
        text_fields: super::keywords::parse_fields(r.get("text_fields")),
        group_by: r.get("group_by"),
        images: r.get("images"),
        captions: r.get("captions"),
    }
}

impl Store {
    pub async fn create_collection(
        &self,
        name: &str,
        description: &str,
    ) -> Result<CollectionRow, StoreError> {
        self.create_collection_with(name, description, &CollectionSettings::default())
            .await
    }

    /// A collection with the searches `settings` ask for.
    pub async fn create_collection_with(
        &self,
        name: &str,
        description: &str,
        settings: &CollectionSettings,
    ) -> Result<CollectionRow, StoreError> {
        let text_fields = settings.text_fields.as_deref();
        let now = now_rfc3339();
        let mut tx = self.write_tx().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO collections (name, description, created_at, text_fields, group_by) VALUES ($1, $2, $3, $4, $5) \
             RETURNING id",
        )
        .bind(name)
        .bind(description)
        .bind(&now)
        .bind(text_fields.map(super::keywords::write_fields))
        .bind(settings.group_by.clone())
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
            text_fields: text_fields.map(<[TextField]>::to_vec),
            group_by: settings.group_by.clone(),
            images: 0,
            captions: 0,
        })
    }

    pub async fn list_collections(&self) -> Result<Vec<CollectionRow>, StoreError> {
        let rows = sqlx::query(&format!("{COLLECTION_SELECT} ORDER BY c.name"))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(collection_row).collect())
    }

    /// Every collection's id and name, without the row counts (readiness asks this every few seconds).
    pub async fn collection_names(&self) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = sqlx::query("SELECT id, name FROM collections ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| (r.get("id"), r.get("name"))).collect())
    }

    pub async fn collection(&self, name: &str) -> Result<CollectionRow, StoreError> {
        let row = sqlx::query(&format!("{COLLECTION_SELECT} WHERE c.name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref()
            .map(collection_row)
            .ok_or_else(|| StoreError::NoCollection(name.into()))
    }

    /// A collection's id and settings by name, and whether it holds any caption (an index probe, no counts:
    /// every request resolves its collection, and a sentence search's default mode needs the probe).
    pub async fn collection_key(&self, name: &str) -> Result<CollectionKey, StoreError> {
        let r = sqlx::query(
            "SELECT id, text_fields, group_by, \
             CAST(CASE WHEN EXISTS (SELECT 1 FROM captions p WHERE p.collection_id = c.id) THEN 1 ELSE 0 END \
             AS BIGINT) AS has_captions FROM collections c WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NoCollection(name.into()))?;
        Ok(CollectionKey {
            id: r.get("id"),
            settings: CollectionSettings {
                text_fields: super::keywords::parse_fields(r.get("text_fields")),
                group_by: r.get("group_by"),
            },
            has_captions: r.get::<i64, _>("has_captions") != 0,
        })
    }

    pub async fn collection_id(&self, name: &str) -> Result<i64, StoreError> {
        let id: Option<i64> = sqlx::query_scalar("SELECT id FROM collections WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        id.ok_or_else(|| StoreError::NoCollection(name.into()))
    }

    pub async fn collection_by_id(&self, id: i64) -> Result<Option<CollectionRow>, StoreError> {
        let row = sqlx::query(&format!("{COLLECTION_SELECT} WHERE c.id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.as_ref().map(collection_row))
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
        // FTS5 rows have no foreign key to cascade on (Postgres' go with their images).
        if self.engine == super::Engine::Sqlite {
            sqlx::query("DELETE FROM image_text WHERE collection_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        Self::log(&mut tx, id, ChangeKind::Collection, true, &[id]).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Marks a collection's snapshots stale, in the caller's write transaction.
    pub(super) async fn bump(tx: &mut Tx<'_>, collection_id: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE collections SET generation = generation + 1 WHERE id = $1")
            .bind(collection_id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}
