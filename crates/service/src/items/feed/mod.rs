//! A collection kept equal to a shop's catalogue feed: what the collection holds under external ids, read page
//! by page at one point in time, and what one feed item asks of it (here); the feed read and checked
//! (`read`), what it asks of the collection before anything is written (`plan`: photos as items, the deletion
//! guard), the sync itself (`apply`) and its report (`report`), and feeds sent over HTTP run as jobs
//! (`jobs`). The writes themselves are the upsert by external id (`updates`: a photo whose bytes are stored,
//! coded by the loaded vision model, is not embedded again) and the delete, so a sync changes a collection
//! exactly as the API would. `jointspace sync` and `POST /v1/collections/{name}/sync` both call `sync_feed`.

mod apply;
mod jobs;
mod plan;
mod read;
mod report;

pub use apply::{DEFAULT_MAX_DELETE_SHARE, SyncOptions, SyncProgress};
pub use jobs::{SyncJob, SyncRequest};
pub use read::{FeedFormat, FeedItem, FeedMapping, FeedPhoto, FeedSource, read_feed};
pub use report::{SyncAction, SyncFailure, SyncReport};

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::Value;

use crate::{CollectionName, Result, Service, ServiceError, fetch::FetchError, store::SyncedImage};

/// Images read per page.
const PAGE: i64 = 1000;

/// What a collection holds, as a feed is compared with it.
pub struct Catalogue {
    /// The images with an external id, by it.
    pub items: HashMap<String, SyncedImage>,
    /// Images without an external id: no feed line can name them, so a sync leaves them alone.
    pub without_external_id: i64,
}

/// What one feed item asks of the collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedChange {
    /// No image has its external id.
    Add,
    /// Its photo's bytes differ from the stored photo's: embedded again (under a new id, as an upsert does).
    Replace,
    /// The same bytes, coded by another vision model (a bundle whose vision part differs): embedded again by
    /// the loaded one, under a new id as a replaced photo, since the stored code is not comparable.
    Reembed,
    /// The same photo, other metadata or captions: written without the CNN.
    Update,
    /// Nothing to write.
    Unchanged,
}

impl FeedChange {
    /// What it is called in a sync's report.
    pub fn as_str(self) -> &'static str {
        match self {
            FeedChange::Add => "add",
            FeedChange::Replace => "replace",
            FeedChange::Reembed => "reembed",
            FeedChange::Update => "update",
            FeedChange::Unchanged => "unchanged",
        }
    }

    /// The change an item asks for: `hash` is the sha256 of its photo's bytes (`content_hash`),
    /// `vision_id` the loaded bundle's, `metadata` and `captions` what the feed says of it. Captions are
    /// compared as a set with repeats: an upsert keeps stored captions in the order they were first added,
    /// so the feed's order cannot be read back.
    pub fn of(
        stored: Option<&SyncedImage>,
        hash: &str,
        vision_id: &str,
        metadata: &Value,
        captions: &[String],
    ) -> FeedChange {
        let Some(s) = stored else {
            return FeedChange::Add;
        };
        if s.content_hash.as_deref() != Some(hash) {
            return FeedChange::Replace;
        }
        if s.vision_id != vision_id {
            return FeedChange::Reembed;
        }
        let empty = Value::Object(Default::default());
        let stored_meta = if s.metadata.is_null() {
            &empty
        } else {
            &s.metadata
        };
        let mut a: Vec<&String> = s.captions.iter().collect();
        let mut b: Vec<&String> = captions.iter().collect();
        a.sort();
        b.sort();
        if same_json(stored_meta, metadata) && a == b {
            FeedChange::Unchanged
        } else {
            FeedChange::Update
        }
    }
}

/// JSON equality with numbers compared by value: Postgres' jsonb may give back `1e3` as `1000`, which
/// serde reads as another kind of number, and a sync that saw a change there would write it on every run.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || matches!((x.as_f64(), y.as_f64()), (Some(p), Some(q)) if p == q)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

impl Service {
    /// Every image of the collection that has an external id, with its photo digest, metadata and captions,
    /// read page by page in one transaction (a single point in time, as an export reads).
    pub async fn catalogue(&self, collection: &CollectionName) -> Result<Catalogue> {
        let c = self.collection_ref(collection).await?;
        let all = self
            .store
            .count_images(c.id, &crate::filter::Filter::all())
            .await?;
        let mut snap = self.store.read_snapshot().await?;
        let mut items = HashMap::new();
        let mut after = 0;
        loop {
            let page = snap.synced_page(c.id, after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = last.id;
            items.extend(page.into_iter().map(|i| (i.external_id.clone(), i)));
        }
        drop(snap);
        let without_external_id = (all - items.len() as i64).max(0);
        Ok(Catalogue {
            items,
            without_external_id,
        })
    }

    /// A photo's bytes from an http(s) URL, by URL ingest's guarded fetcher (refused when the service has
    /// none: URL ingest off).
    pub async fn fetch_image(&self, url: &str) -> Result<Bytes> {
        let fetched = match self.opts.url_fetcher.as_deref() {
            Some(f) => self.fetch_counted(f, url).await,
            None => Err(FetchError::Off),
        };
        fetched.map_err(|source| ServiceError::Fetch {
            index: None,
            url: url.to_string(),
            source: Box::new(source),
        })
    }

    /// A feed's bytes from an http(s) URL (at most `max_bytes`), by URL ingest's guarded fetcher (refused when
    /// the service has none: URL ingest off).
    pub async fn fetch_feed(&self, url: &str, max_bytes: usize) -> Result<Bytes> {
        let fetched = match self.opts.url_fetcher.as_deref() {
            Some(f) => f.fetch_feed(url, max_bytes).await,
            None => Err(FetchError::Off),
        };
        fetched.map_err(|source| ServiceError::Fetch {
            index: None,
            url: url.to_string(),
            source: Box::new(source),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stored(hash: &str, metadata: Value, captions: &[&str]) -> SyncedImage {
        SyncedImage {
            id: 1,
            external_id: "sku-1".into(),
            content_hash: Some(hash.into()),
            vision_id: "v".into(),
            metadata,
            captions: captions.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn a_feed_item_is_compared_with_what_is_stored() {
        let caps = vec!["a red shoe".to_string(), "a shoe".to_string()];
        let meta = json!({"title": "Shoe", "price": 1000, "tags": ["a", {"b": 1.5}]});
        assert_eq!(
            FeedChange::of(None, "h", "v", &meta, &caps),
            FeedChange::Add
        );
        let s = stored(
            "h",
            json!({"tags": ["a", {"b": 1.5}], "price": 1e3, "title": "Shoe"}),
            &["a shoe", "a red shoe"],
        );
        assert_eq!(
            FeedChange::of(Some(&s), "h", "v", &meta, &caps),
            FeedChange::Unchanged,
            "key order, caption order and 1e3 against 1000 are no change"
        );
        assert_eq!(
            FeedChange::of(Some(&s), "other", "v", &meta, &caps),
            FeedChange::Replace
        );
        let cheaper = json!({"title": "Shoe", "price": 999, "tags": ["a", {"b": 1.5}]});
        assert_eq!(
            FeedChange::of(Some(&s), "h", "v", &cheaper, &caps),
            FeedChange::Update
        );
        assert_eq!(
            FeedChange::of(Some(&s), "h", "v", &meta, &caps[..1]),
            FeedChange::Update
        );
        let mut no_hash = s.clone();
        no_hash.content_hash = None;
        assert_eq!(
            FeedChange::of(Some(&no_hash), "h", "v", &meta, &caps),
            FeedChange::Replace,
            "an image imported from codes has no digest: its photo cannot be shown to be the same"
        );
        let bare = stored("h", Value::Null, &[]);
        assert_eq!(
            FeedChange::of(Some(&bare), "h", "v", &json!({}), &[]),
            FeedChange::Unchanged
        );
    }

    #[test]
    fn the_same_bytes_coded_by_another_vision_model_are_embedded_again() {
        let caps = vec!["a red shoe".to_string()];
        let meta = json!({"title": "Shoe"});
        let s = stored("h", meta.clone(), &["a red shoe"]);
        assert_eq!(
            FeedChange::of(Some(&s), "h", "v", &meta, &caps),
            FeedChange::Unchanged
        );
        assert_eq!(
            FeedChange::of(Some(&s), "h", "v2", &meta, &caps),
            FeedChange::Reembed,
            "a code of another vision model is not comparable with the loaded one's"
        );
        let cheaper = json!({"title": "Shoe", "price": 9});
        assert_eq!(
            FeedChange::of(Some(&s), "h", "v2", &cheaper, &[]),
            FeedChange::Reembed,
            "a text change under another vision model is written with the new code"
        );
        assert_eq!(
            FeedChange::of(Some(&s), "other", "v2", &meta, &caps),
            FeedChange::Replace,
            "new bytes are a new photo, whatever model coded the old one"
        );
        assert_eq!(FeedChange::Reembed.as_str(), "reembed");
    }
}
