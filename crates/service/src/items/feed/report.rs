//! What a sync did (or, in a dry run, would do), counted from its own writes' outcomes: the command prints
//! it and writes it as JSON, a sync job keeps it for `GET .../sync/{job}`.

use serde::{Deserialize, Serialize};

/// A feed item that could not be written, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncFailure {
    pub line: usize,
    pub external_id: String,
    pub reason: String,
}

/// One change made (or that a dry run would make).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncAction {
    /// The feed's line (none for a delete: the item is not in the feed).
    pub line: Option<usize>,
    pub external_id: String,
    /// `add`, `replace`, `reembed`, `update` or `delete`.
    pub action: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SyncReport {
    pub collection: String,
    /// The feed, as its sender named it (a file, a URL, or the request body).
    pub feed: String,
    pub dry_run: bool,
    /// Items in the feed.
    pub items: usize,
    pub added: u64,
    /// New photos, embedded again (under a new id).
    pub replaced: u64,
    /// The same photos, coded by another vision model (another bundle's): embedded again by the loaded one
    /// (under a new id).
    pub reembedded: u64,
    /// Text or attributes changed, the photo kept: written without the CNN.
    pub updated: u64,
    pub unchanged: u64,
    pub deleted: u64,
    pub failed: Vec<SyncFailure>,
    /// Images without an external id, which no feed line can name: left as they are.
    pub left_without_external_id: i64,
    /// Photos the CNN embedded in this run (0 in a dry run, and when only text changed).
    pub photos_embedded: u64,
    /// Sentences the text model embedded (captions and text fields added or changed).
    pub sentences_embedded: u64,
    /// Why the sync refused to run (the deletion guard), if it did; nothing was written then.
    pub refused: Option<String>,
    pub seconds: f64,
    /// Every change made (or that a dry run would make), unchanged items left out.
    pub changes: Vec<SyncAction>,
}

impl SyncReport {
    /// The report's one-line summary.
    pub fn summary(&self) -> String {
        let failed = self.failed.len();
        let (would, tail) = if self.dry_run {
            ("would be ", "; dry run: nothing was written")
        } else {
            ("", "")
        };
        let verb = |w: &str| format!("{would}{w}");
        // Only after a change of vision model: said then, not in every day's summary.
        let reembedded = if self.reembedded > 0 {
            format!(
                ", {} {} (coded by another vision model)",
                self.reembedded,
                verb("re-embedded")
            )
        } else {
            String::new()
        };
        format!(
            "sync of {} into \"{}\": {} items, {} {}, {} {} (new photo){reembedded}, {} {} (text or attributes), \
             {} unchanged, {} {}, {failed} failed; {} photos embedded by the CNN, {} sentences by the text model, \
             {:.1} s{tail}",
            self.feed,
            self.collection,
            self.items,
            self.added,
            verb("added"),
            self.replaced,
            verb("replaced"),
            self.updated,
            verb("updated"),
            self.unchanged,
            self.deleted,
            verb("deleted"),
            self.photos_embedded,
            self.sentences_embedded,
            self.seconds,
        )
    }
}
