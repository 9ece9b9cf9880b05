//! A collection made equal to a feed, through the service's own writes: each item's photo is read (or
//! fetched) and hashed and compared with what the collection holds under its external id; a new id is added,
//! a new photo embedded again (`replaced`), the same photo coded by another vision model embedded again by
//! the loaded one (`reembedded`), other text or attributes written by the upsert's same-photo path, which
//! never runs the CNN (`updated`), and an item equal to what is stored not written at all. Items gone from
//! the feed are deleted last, unless they are more of the collection than the caller allows: then nothing is
//! written. Resuming needs no mark: every write is idempotent, so a sync stopped part-way converges when run
//! again, skipping what is already in step.

use std::collections::HashMap;

use bytes::Bytes;
use futures::{StreamExt, stream::FuturesUnordered};

use super::{
    Catalogue, FeedChange, FeedItem, FeedPhoto,
    plan::{by_photo, withdrawals},
    report::{SyncAction, SyncFailure, SyncReport},
};
use crate::{
    CollectionName, Result, Service, ServiceError, UpsertInput, UpsertOutcome, content_hash,
    store::CollectionSettings,
};

/// The deletion guard's default: a feed may withdraw at most a fifth of the collection.
pub const DEFAULT_MAX_DELETE_SHARE: f64 = 0.2;

/// How a sync runs.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// Say what would change, write nothing.
    pub dry_run: bool,
    /// The largest share of the collection's items (under external ids) a feed may withdraw, 0 to 1.
    pub max_delete_share: f64,
    /// Leave an item that cannot be written as stored and go on (else the sync stops there, deleting nothing).
    pub skip_failed: bool,
    /// Items read and written at once.
    pub concurrency: usize,
    /// Create the collection with these settings if it is missing (None: a missing collection is an error).
    pub create: Option<CollectionSettings>,
}

/// Told how a sync goes (a progress bar, a job's heartbeat).
pub trait SyncProgress: Send + Sync {
    /// The items the sync will handle (each photo of a product is one).
    fn planned(&self, _items: usize) {}
    /// One more item handled.
    fn item_done(&self) {}
}

/// No one to tell.
impl SyncProgress for () {}

/// One item's outcome: the change it asked for and, unless a dry run, what the upsert did (with what it
/// embedded: a photo, and how many sentences).
type Done = (FeedChange, Option<(UpsertOutcome, bool, usize)>);

impl Service {
    /// Makes `collection` equal to `products` (a feed as `read_feed` gives it), filling `report` as it goes:
    /// it holds what was done when this fails. Refused whole by the deletion guard (`report.refused`); a
    /// failed item stops it before any deletion unless `skip_failed`.
    pub async fn sync_feed(
        &self,
        collection: &CollectionName,
        products: Vec<FeedItem>,
        opts: &SyncOptions,
        report: &mut SyncReport,
        progress: &dyn SyncProgress,
    ) -> Result<()> {
        super::jobs::check_share(opts.max_delete_share)?;
        report.collection = collection.to_string();
        report.dry_run = opts.dry_run;
        report.items = products.len();
        let settings = self.feed_settings(collection, opts.create.as_ref()).await?;
        let items = by_photo(products, &settings)?;
        if let (Some(s), false) = (&opts.create, opts.dry_run) {
            match self.create_collection_with(collection, "", s).await {
                Err(e) if !e.is_conflict() => return Err(e),
                _ => {}
            }
        }
        let catalogue = match self.catalogue(collection).await {
            Ok(c) => c,
            // A dry run creates nothing: against a collection it would create, everything is new.
            Err(ServiceError::NoCollection(_)) if opts.create.is_some() => Catalogue {
                items: HashMap::new(),
                without_external_id: 0,
            },
            Err(e) => return Err(e),
        };
        report.left_without_external_id = catalogue.without_external_id;
        // The guard, before anything is written: a feed cut short must not be half applied either.
        let gone = match withdrawals(&catalogue, &items, opts.max_delete_share, collection) {
            Ok(g) => g,
            Err(why) => {
                report.refused = Some(why.clone());
                return Err(ServiceError::Invalid(why));
            }
        };
        progress.planned(items.len());
        self.write_items(collection, &catalogue, &items, opts, report, progress)
            .await?;
        // Deletions last: only a feed that was read whole and applied withdraws items.
        for (external_id, id) in gone {
            if !opts.dry_run {
                match self.delete_image(collection, id).await {
                    // Gone already (another writer): what the feed asks for.
                    Err(ServiceError::NotFound(_)) => continue,
                    r => r?,
                }
            }
            report.deleted += 1;
            report.changes.push(SyncAction {
                line: None,
                external_id: external_id.clone(),
                action: "delete".into(),
            });
        }
        Ok(())
    }

    /// Writes every item (`concurrency` at once), counting each outcome into `report`; stops at the first
    /// failure unless `skip_failed` (those in flight finish: each write is whole either way).
    async fn write_items(
        &self,
        collection: &CollectionName,
        catalogue: &Catalogue,
        items: &[FeedItem],
        opts: &SyncOptions,
        report: &mut SyncReport,
        progress: &dyn SyncProgress,
    ) -> Result<()> {
        // The stored codes are compared with the loaded bundle's vision model.
        let vision_id = self.pipeline.bundle.vision_id.as_str();
        // A loop over a set of futures rather than stream combinators: the server runs a sync in a spawned
        // task, and the compiler cannot prove a combinator's closures Send for every lifetime they borrow.
        let mut queue = items.iter();
        let mut running = FuturesUnordered::new();
        let mut stopped = None;
        loop {
            while running.len() < opts.concurrency.max(1) && stopped.is_none() {
                let Some(it) = queue.next() else { break };
                running.push(async move {
                    let r = self
                        .sync_item(collection, catalogue, vision_id, it, opts.dry_run)
                        .await;
                    (it, r)
                });
            }
            let Some((it, r)) = running.next().await else {
                break;
            };
            progress.item_done();
            match r {
                Ok(d) => count(report, it, d),
                Err(e) => {
                    let reason = e.to_string();
                    if !opts.skip_failed && stopped.is_none() {
                        stopped = Some(format!(
                            "{}:{}: {}: {reason}",
                            report.feed, it.line, it.external_id
                        ));
                    }
                    report.failed.push(SyncFailure {
                        line: it.line,
                        external_id: it.external_id.clone(),
                        reason,
                    });
                }
            }
        }
        report.failed.sort_by_key(|f| f.line);
        report.changes.sort_by_key(|a| a.line);
        match stopped {
            Some(at) => Err(ServiceError::Invalid(format!(
                "{at}\nthe sync stopped there and deleted nothing; the items written before it are in step, \
                 so fix that line (or pass --skip-failed to leave such items as stored) and run again"
            ))),
            None => Ok(()),
        }
    }

    /// Reads the item's photo, compares the item with what is stored (and the stored code's vision model with
    /// `vision_id`, the loaded bundle's) and, unless `dry_run`, writes it.
    async fn sync_item(
        &self,
        collection: &CollectionName,
        catalogue: &Catalogue,
        vision_id: &str,
        it: &FeedItem,
        dry_run: bool,
    ) -> Result<Done> {
        let bytes =
            match &it.photos[0] {
                FeedPhoto::Path(p) => Bytes::from(tokio::fs::read(p).await.map_err(|e| {
                    ServiceError::Invalid(format!("cannot read {}: {e}", p.display()))
                })?),
                FeedPhoto::Url(u) => self.fetch_image(u).await?,
                FeedPhoto::Data(b) => b.clone(),
            };
        let stored = catalogue.items.get(&it.external_id);
        let change = FeedChange::of(
            stored,
            &content_hash(&bytes),
            vision_id,
            &it.metadata,
            &it.captions,
        );
        if dry_run || change == FeedChange::Unchanged {
            return Ok((change, None));
        }
        let input = UpsertInput {
            bytes,
            metadata: Some(it.metadata.clone()),
            captions: it.captions.clone(),
        };
        let done = self
            .upsert_image(collection, &it.external_id, input)
            .await?;
        Ok((
            change,
            Some((done.outcome, done.photo_embedded, done.sentences_embedded)),
        ))
    }
}

/// One item's outcome into the report: what happened, by the upsert's word where it wrote (another writer
/// may have moved first); a photo embedded again for its vision model is replaced as a new one is.
fn count(report: &mut SyncReport, it: &FeedItem, (change, outcome): Done) {
    if let Some((_, photo, sentences)) = outcome {
        report.photos_embedded += u64::from(photo);
        report.sentences_embedded += sentences as u64;
    }
    let action = match (outcome.map(|o| o.0), change) {
        (Some(UpsertOutcome::Created), _) => FeedChange::Add,
        (Some(UpsertOutcome::Replaced), FeedChange::Reembed) => FeedChange::Reembed,
        (Some(UpsertOutcome::Replaced), _) => FeedChange::Replace,
        (Some(UpsertOutcome::Updated), _) => FeedChange::Update,
        (None, change) => change,
    };
    match action {
        FeedChange::Add => report.added += 1,
        FeedChange::Replace => report.replaced += 1,
        FeedChange::Reembed => report.reembedded += 1,
        FeedChange::Update => report.updated += 1,
        FeedChange::Unchanged => {
            report.unchanged += 1;
            return;
        }
    }
    report.changes.push(SyncAction {
        line: Some(it.line),
        external_id: it.external_id.clone(),
        action: action.as_str().into(),
    });
}
