//! Collections: their names (parsed once, at the edge) and their lifetime, with the indexes that go with
//! them.

use std::sync::Arc;

use super::{CollectionIndexes, Result, Service, ServiceError};
use crate::{
    filter::FieldPath,
    index::{VectorIndex, remove_snapshot, snapshot_name},
    modality::Modality,
    store::{CollectionRow, CollectionSettings},
};

/// A collection name that satisfies the naming rule: 1-64 lower-case letters, digits, '-' or '_', starting
/// with a letter or digit (safe in URLs, file names and log lines).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CollectionName(String);

impl CollectionName {
    pub fn parse(name: &str) -> Result<CollectionName> {
        validate_collection_name(name)?;
        Ok(CollectionName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for CollectionName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub fn validate_collection_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(ServiceError::Invalid(format!(
            "collection name \"{}\" is not allowed: use 1-64 lower-case letters, digits, '-' or '_', starting with a letter or digit",
            name.chars().take(80).collect::<String>()
        )))
    }
}

impl Service {
    pub async fn create_collection(
        &self,
        name: &CollectionName,
        description: &str,
    ) -> Result<CollectionRow> {
        self.create_collection_with(name, description, &CollectionSettings::default())
            .await
    }

    /// A collection with settings: `text_fields` (dotted metadata paths) make its sentence searches default
    /// to hybrid, finding images by their captions, external ids and those fields by meaning and as keywords
    /// as well as by the photo; `group_by` (a dotted path) names the field whose value is an image's product.
    pub async fn create_collection_with(
        &self,
        name: &CollectionName,
        description: &str,
        settings: &CollectionSettings,
    ) -> Result<CollectionRow> {
        let text_fields = settings.text_fields.as_deref();
        if let Some(g) = &settings.group_by {
            FieldPath::parse(g)
                .map_err(|e| ServiceError::Invalid(format!("group_by: {}", e.message)))?;
        }
        for f in text_fields.unwrap_or_default() {
            FieldPath::parse(&f.path)
                .map_err(|e| ServiceError::Invalid(format!("text_fields: {}", e.message)))?;
        }
        if text_fields.is_some_and(|f| f.len() > 32) {
            return Err(ServiceError::Invalid(
                "text_fields: at most 32 fields".into(),
            ));
        }
        let row = self
            .store
            .create_collection_with(name.as_str(), description, settings)
            .await?;
        if self.graphs().is_none() {
            return Ok(row);
        }
        let params = self.opts.index;
        let idx = CollectionIndexes {
            images: Arc::new(VectorIndex::build(params, vec![])?),
            captions: Arc::new(VectorIndex::build(params, vec![])?),
            attributes: Arc::default(),
        };
        // The follower may have loaded it already (and items added elsewhere since): keep that one.
        self.indexes.put_if_absent(row.id, idx);
        Ok(row)
    }

    pub async fn collection(&self, name: &CollectionName) -> Result<CollectionRow> {
        Ok(self
            .timed_db("collection", self.store.collection(name.as_str()))
            .await?)
    }

    pub async fn list_collections(&self) -> Result<Vec<CollectionRow>> {
        Ok(self.store.list_collections().await?)
    }

    pub async fn delete_collection(&self, name: &CollectionName) -> Result<()> {
        let id = self.store.delete_collection(name.as_str()).await?;
        self.indexes.remove(id);
        self.forget_photo_trust(id);
        if let Some(dir) = &self.opts.snapshot_dir {
            for m in Modality::BOTH {
                remove_snapshot(dir, &snapshot_name(id, m));
            }
        }
        self.update_gauges();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        for ok in ["a", "products", "shop-2_eu", "0", &"x".repeat(64)] {
            assert_eq!(CollectionName::parse(ok).expect(ok).as_str(), ok);
        }
        for bad in ["", "-a", "_a", "A", "a b", "a/b", "é", &"x".repeat(65)] {
            let e = CollectionName::parse(bad).expect_err(bad);
            assert!(e.to_string().contains("is not allowed"), "{e}");
        }
    }
}
