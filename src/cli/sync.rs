//! `jointspace sync`: a collection made equal to a shop's catalogue feed (CSV or JSON lines), through the
//! service's own writes. Each item's photo is read (or fetched) and hashed, and compared with what the
//! collection holds under its external id (`Service::catalogue`): a new id is added, a new photo embedded
//! again (`replaced`), the same photo coded by another vision model (a database made under another bundle)
//! embedded again by the loaded one (`reembedded`), other text or attributes written by the upsert's
//! same-photo path, which never runs the CNN (`updated`), and an item equal to what is stored not written at
//! all. Items gone from the feed are deleted last, unless they are more than `--max-delete-share` of the
//! collection: then nothing is written.
//!
//! The whole feed is read and checked before anything is written, so a bad line is refused with its number.
//! Resuming needs no mark: every item's write is idempotent, so a run stopped part-way (a crash, a photo that
//! failed) converges when run again, skipping what is already in step.

use std::{
    collections::{HashMap, HashSet},
    io::Read,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    import::{check_url_ingest, fetching_service, lines},
    progress,
};
use crate::{
    config::{FeedFormat, SyncArgs},
    filter::FieldPath,
    service::{
        Catalogue, CollectionName, CollectionSettings, FeedChange, Service, ServiceError,
        UpsertInput, UpsertOutcome, content_hash,
    },
};

/// Where an item's photo is.
#[derive(Debug, Clone, PartialEq)]
enum Photo {
    /// A file (relative paths are taken from the feed's folder).
    Path(PathBuf),
    /// An http(s) URL, fetched by URL ingest's fetcher.
    Url(String),
}

/// One feed item, read and checked: a product with its photos, or (`by_photo`) one of its photos.
#[derive(Debug, Clone, PartialEq)]
struct FeedItem {
    /// The feed's line (for CSV, the line its record starts on).
    line: usize,
    external_id: String,
    photos: Vec<Photo>,
    metadata: Value,
    captions: Vec<String>,
}

/// How a feed's fields map to an image.
struct Mapping<'a> {
    dir: &'a Path,
    id: &'a str,
    image: &'a str,
    captions: &'a str,
    caption_fields: &'a [String],
    number_fields: &'a [String],
}

impl Mapping<'_> {
    /// An item from its fields: the id, the photo and the captions taken out, every other field metadata.
    fn item(&self, line: usize, mut fields: Map<String, Value>) -> anyhow::Result<FeedItem> {
        let external_id = match fields.remove(self.id) {
            Some(Value::String(s)) if !s.trim().is_empty() => s,
            // Shops' ids are often numbers; the external id is their text.
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::Null | Value::String(_)) | None => {
                bail!(
                    "no `{}` (the product's id; --id-field names another field)",
                    self.id
                )
            }
            Some(v) => bail!("`{}` is {v}: an id is a string or a number", self.id),
        };
        if external_id.len() > 256 {
            bail!("the id is longer than 256 characters");
        }
        let places = match fields.remove(self.image) {
            Some(v) => strings(self.image, &v, "photos are paths or URLs")?.unwrap_or_default(),
            None => vec![],
        };
        let photos = places
            .iter()
            .filter(|s| !s.trim().is_empty())
            .map(|s| photo(self.dir, s.trim()))
            .collect::<anyhow::Result<Vec<Photo>>>()?;
        if photos.is_empty() {
            bail!(
                "no `{}` (the photo's path or http(s) URL, or a list of them; --image-field names another field)",
                self.image
            );
        }
        let mut captions = match fields.remove(self.captions) {
            None | Some(Value::Null) => vec![],
            Some(v) => match strings(self.captions, &v, "captions are strings")? {
                Some(c) => c,
                None => bail!(
                    "`{}` is {v}: captions are an array of strings",
                    self.captions
                ),
            },
        };
        for f in self.caption_fields {
            match fields.get(f) {
                Some(Value::String(s)) if !s.trim().is_empty() => captions.push(s.clone()),
                _ => {}
            }
        }
        captions.retain(|c| !c.trim().is_empty());
        Ok(FeedItem {
            line,
            external_id,
            photos,
            metadata: Value::Object(fields),
            captions,
        })
    }

    /// A CSV record's fields. A CSV cell cannot tell empty from absent: an empty cell is left out. The captions
    /// and the photos are lists separated by `|`.
    fn csv_fields(
        &self,
        header: &csv::StringRecord,
        record: &csv::StringRecord,
    ) -> anyhow::Result<Map<String, Value>> {
        let mut fields = Map::new();
        for (name, cell) in header.iter().zip(record.iter()) {
            if cell.is_empty() {
                continue;
            }
            let v = if name == self.captions || name == self.image {
                Value::Array(
                    cell.split('|')
                        .map(|c| Value::String(c.trim().to_string()))
                        .collect(),
                )
            } else if self.number_fields.iter().any(|n| n == name) {
                let n: serde_json::Number = cell.trim().parse().map_err(|_| {
                    anyhow::anyhow!("`{name}` is {cell:?}, not a number (--number-fields)")
                })?;
                Value::Number(n)
            } else {
                Value::String(cell.to_string())
            };
            fields.insert(name.to_string(), v);
        }
        Ok(fields)
    }
}

/// A field that holds a string or a list of them (the photos, the captions), as its strings; None for any other
/// value. `items` says what the list holds, for the error naming an item that is not a string.
fn strings(field: &str, v: &Value, items: &str) -> anyhow::Result<Option<Vec<String>>> {
    match v {
        Value::String(s) => Ok(Some(vec![s.clone()])),
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                other => bail!("`{field}` holds {other}: {items}"),
            })
            .collect::<anyhow::Result<_>>()
            .map(Some),
        _ => Ok(None),
    }
}

/// A photo's place as the feed gives it.
fn photo(dir: &Path, s: &str) -> anyhow::Result<Photo> {
    let lower = s.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        Ok(Photo::Url(s.to_string()))
    } else if s.contains("://") {
        bail!("{s:?} is neither a path nor an http(s) URL")
    } else {
        Ok(Photo::Path(dir.join(s)))
    }
}

fn format_of(file: &Path, format: FeedFormat) -> anyhow::Result<FeedFormat> {
    if format != FeedFormat::Auto {
        return Ok(format);
    }
    let ext = file
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    Ok(match ext.as_deref() {
        Some("csv") => FeedFormat::Csv,
        Some("jsonl" | "ndjson" | "json") => FeedFormat::Jsonl,
        _ => {
            let mut head = Vec::new();
            std::fs::File::open(file)
                .and_then(|f| f.take(4096).read_to_end(&mut head))
                .with_context(|| format!("cannot read {}", file.display()))?;
            let first = head.iter().find(|b| !b.is_ascii_whitespace());
            if first == Some(&b'{') {
                FeedFormat::Jsonl
            } else {
                FeedFormat::Csv
            }
        }
    })
}

/// Lines that could not be read, kept to report together (up to a point: one fix often mends them all).
struct BadLines {
    file: String,
    lines: Vec<String>,
    count: usize,
}

impl BadLines {
    const SHOWN: usize = 20;

    fn push(&mut self, line: usize, e: impl std::fmt::Display) {
        self.count += 1;
        if self.lines.len() < Self::SHOWN {
            self.lines.push(format!("{}:{line}: {e:#}", self.file));
        }
    }
}

/// The whole feed, read and checked: every line an item, no id twice.
fn read_feed(args: &SyncArgs) -> anyhow::Result<Vec<FeedItem>> {
    let file = &args.feed;
    let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let map = Mapping {
        dir: &dir,
        id: &args.id_field,
        image: &args.image_field,
        captions: &args.captions_field,
        caption_fields: &args.caption_fields,
        number_fields: &args.number_fields,
    };
    let mut bad = BadLines {
        file: file.display().to_string(),
        lines: vec![],
        count: 0,
    };
    let mut items = vec![];
    match format_of(file, args.format)? {
        FeedFormat::Csv => {
            let mut r = csv::Reader::from_path(file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let header = r
                .headers()
                .with_context(|| format!("{}: no header row", file.display()))?
                .clone();
            for need in [&args.id_field, &args.image_field] {
                if !header.iter().any(|h| h == need) {
                    bail!(
                        "{}: the header has no `{need}` column (it has {}); name the columns with \
                         --id-field and --image-field",
                        file.display(),
                        header.iter().collect::<Vec<_>>().join(", ")
                    );
                }
            }
            for rec in r.records() {
                match rec {
                    Ok(rec) => {
                        let line = rec.position().map_or(0, |p| p.line() as usize);
                        match map
                            .csv_fields(&header, &rec)
                            .and_then(|f| map.item(line, f))
                        {
                            Ok(it) => items.push(it),
                            Err(e) => bad.push(line, e),
                        }
                    }
                    // A record with another number of fields, or not UTF-8: the csv crate names its line.
                    Err(e) => {
                        let line = e.position().map_or(0, |p| p.line() as usize);
                        bad.push(line, e);
                    }
                }
            }
        }
        FeedFormat::Jsonl | FeedFormat::Auto => {
            for (n, l) in lines(file)? {
                let l = l?;
                if l.trim().is_empty() {
                    continue;
                }
                let item = match serde_json::from_str::<Value>(&l) {
                    Ok(Value::Object(fields)) => map.item(n, fields),
                    Ok(_) => Err(anyhow::anyhow!("not a JSON object")),
                    Err(e) => Err(anyhow::anyhow!("not JSON: {e}")),
                };
                match item {
                    Ok(it) => items.push(it),
                    Err(e) => bad.push(n, e),
                }
            }
        }
    }
    let mut first_line: HashMap<&str, usize> = HashMap::new();
    let mut twice = vec![];
    for it in &items {
        if let Some(l) = first_line.insert(&it.external_id, it.line) {
            twice.push((it.line, l, it.external_id.clone()));
        }
    }
    for (line, first, id) in twice {
        bad.push(line, format!("the id {id:?} again (first on line {first})"));
    }
    if bad.count > 0 {
        let more = bad.count.saturating_sub(BadLines::SHOWN);
        bail!(
            "{}\n{} bad line(s){}: nothing was written; fix the feed and run again",
            bad.lines.join("\n"),
            bad.count,
            if more > 0 {
                format!(" ({more} not shown)")
            } else {
                String::new()
            }
        );
    }
    Ok(items)
}

/// The settings the sync writes under: the collection's, or with --create for a collection not there yet,
/// those its flags ask for (a collection already there keeps its own; a --group-by that differs is refused,
/// as the feed's photos would be grouped one way and searched another).
async fn settings(
    args: &SyncArgs,
    svc: &Service,
    collection: &CollectionName,
) -> anyhow::Result<CollectionSettings> {
    let asked = CollectionSettings {
        text_fields: (!args.text_fields.is_empty()).then(|| args.text_fields.clone()),
        group_by: args.group_by.clone(),
    };
    match svc.collection(collection).await {
        Ok(c) => {
            if asked.group_by.is_some() && asked.group_by != c.group_by {
                bail!(
                    "--group-by {} but \"{}\" groups by {}: a collection's product key is set when it is \
                     created",
                    asked.group_by.as_deref().unwrap_or_default(),
                    collection,
                    c.group_by.as_deref().unwrap_or("nothing")
                );
            }
            Ok(CollectionSettings {
                text_fields: c.text_fields,
                group_by: c.group_by,
            })
        }
        Err(ServiceError::NoCollection(_)) => Ok(asked),
        Err(e) => Err(e.into()),
    }
}

/// Each product's photos as items of their own, as the collection holds them: the first under the product's
/// id, the n-th under `<id>~<n>`, each with the product's key in the `group_by` field (unless the feed gives
/// it) and its attributes, so filters and grouped search see every photo as the product's. The product's
/// captions and text fields go with its first photo only: a product's words are embedded once, and its other
/// photos reach them through the group (`search::groups`).
fn by_photo(
    products: Vec<FeedItem>,
    settings: &CollectionSettings,
) -> anyhow::Result<Vec<FeedItem>> {
    let text_fields: Vec<FieldPath> = settings
        .text_fields
        .iter()
        .flatten()
        .filter_map(|f| FieldPath::parse(f).ok())
        .collect();
    let mut items = Vec::with_capacity(products.len());
    for mut p in products {
        if let Some(key) = &settings.group_by {
            let path = FieldPath::parse(key)?;
            if path.get(&p.metadata).is_none() {
                set_path(&mut p.metadata, &path, Value::String(p.external_id.clone()));
            }
        } else if p.photos.len() > 1 {
            bail!(
                "line {}: item {:?} has {} photos; a collection holds several photos of a product when it \
                 groups them by a product key (create it with --create --group-by product_id)",
                p.line,
                p.external_id,
                p.photos.len()
            );
        }
        let mut rest = p.metadata.clone();
        for f in &text_fields {
            remove_path(&mut rest, f);
        }
        let others: Vec<Photo> = p.photos.drain(1..).collect();
        let (line, id) = (p.line, p.external_id.clone());
        items.push(p);
        for (n, photo) in others.into_iter().enumerate() {
            items.push(FeedItem {
                line,
                external_id: format!("{id}~{}", n + 2),
                photos: vec![photo],
                metadata: rest.clone(),
                captions: vec![],
            });
        }
    }
    let mut seen = HashSet::new();
    for it in &items {
        if !seen.insert(&it.external_id) {
            bail!(
                "line {}: the id {:?} is another item's photo (`<id>~<n>` names a product's n-th photo): \
                 nothing was written",
                it.line,
                it.external_id
            );
        }
    }
    Ok(items)
}

/// Sets the value at a dotted path, making the objects on the way.
fn set_path(v: &mut Value, path: &FieldPath, x: Value) {
    let (last, parents) = path.segments().split_last().expect("a path has a segment");
    let mut at = v;
    for s in parents {
        if !at.get(s).is_some_and(Value::is_object) {
            at[s.as_str()] = Value::Object(Map::new());
        }
        at = &mut at[s.as_str()];
    }
    at[last.as_str()] = x;
}

/// Removes the value at a dotted path, if there is one.
fn remove_path(v: &mut Value, path: &FieldPath) {
    let (last, parents) = path.segments().split_last().expect("a path has a segment");
    let at = parents.iter().try_fold(v, |at, s| at.get_mut(s.as_str()));
    if let Some(Value::Object(m)) = at {
        m.remove(last.as_str());
    }
}

#[derive(Debug, Serialize)]
struct Failure {
    line: usize,
    external_id: String,
    reason: String,
}

#[derive(Debug, Serialize)]
struct Action {
    /// The feed's line (none for a delete: the item is not in the feed).
    line: Option<usize>,
    external_id: String,
    /// `add`, `replace`, `reembed`, `update` or `delete`.
    action: &'static str,
}

/// What a sync did (or, in a dry run, would do), written to stdout and with --report as JSON.
#[derive(Debug, Default, Serialize)]
struct Report {
    collection: String,
    feed: String,
    dry_run: bool,
    /// Items in the feed.
    items: usize,
    added: u64,
    /// New photos, embedded again (under a new id).
    replaced: u64,
    /// The same photos, coded by another vision model (another bundle's): embedded again by the loaded one
    /// (under a new id).
    reembedded: u64,
    /// Text or attributes changed, the photo kept: written without the CNN.
    updated: u64,
    unchanged: u64,
    deleted: u64,
    failed: Vec<Failure>,
    /// Images without an external id, which no feed line can name: left as they are.
    left_without_external_id: i64,
    /// Photos the CNN embedded in this run (0 in a dry run, and when only text changed).
    photos_embedded: u64,
    /// Sentences the text model embedded (captions added or changed).
    sentences_embedded: u64,
    /// Why the sync refused to run (the deletion guard), if it did; nothing was written then.
    refused: Option<String>,
    seconds: f64,
    /// Every change made (or that a dry run would make), unchanged items left out.
    changes: Vec<Action>,
}

impl Report {
    fn write(&self, to: Option<&Path>) -> anyhow::Result<()> {
        if let Some(p) = to {
            let json = serde_json::to_vec_pretty(self)?;
            std::fs::write(p, json).with_context(|| format!("cannot write {}", p.display()))?;
        }
        Ok(())
    }

    fn summary(&self) -> String {
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

/// One item's outcome: the change it asked for and, unless a dry run, what the upsert did.
type Done = (FeedChange, Option<UpsertOutcome>);

/// Reads the item's photo, compares the item with what is stored (and the stored code's vision model with
/// `vision_id`, the loaded bundle's) and, unless `dry_run`, writes it.
async fn apply(
    svc: &Service,
    collection: &CollectionName,
    catalogue: &Catalogue,
    vision_id: &str,
    it: &FeedItem,
    dry_run: bool,
) -> anyhow::Result<Done> {
    let bytes = match &it.photos[0] {
        Photo::Path(p) => Bytes::from(
            tokio::fs::read(p)
                .await
                .with_context(|| format!("cannot read {}", p.display()))?,
        ),
        Photo::Url(u) => svc.fetch_image(u).await?,
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
    let done = svc.upsert_image(collection, &it.external_id, input).await?;
    Ok((change, Some(done.outcome)))
}

pub async fn sync(args: SyncArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    if !(0.0..=1.0).contains(&args.max_delete_share) {
        bail!(
            "--max-delete-share is a share of the collection, 0 to 1 (0.2: at most a fifth of it); got {}",
            args.max_delete_share
        );
    }
    let collection = CollectionName::parse(&args.collection)?;
    let products = read_feed(&args)?;
    let urls = products
        .iter()
        .any(|i| i.photos.iter().any(|p| matches!(p, Photo::Url(_))));
    check_url_ingest(&args.feed, urls, &args.url_ingest)?;
    let (svc, metrics) = fetching_service(&args.model, &args.store, &args.url_ingest).await?;
    let mut report = Report {
        collection: args.collection.clone(),
        feed: args.feed.display().to_string(),
        dry_run: args.dry_run,
        items: products.len(),
        ..Report::default()
    };
    let outcome = match settings(&args, &svc, &collection).await {
        Ok(settings) => match by_photo(products, &settings) {
            Ok(items) => run(&args, &svc, &collection, &settings, &items, &mut report).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    if outcome.is_ok() && !args.dry_run {
        svc.snapshot().await?;
    }
    svc.close().await;
    report.photos_embedded = metrics.embedded("image");
    report.sentences_embedded = metrics.embedded("text");
    report.seconds = start.elapsed().as_secs_f64();
    report.write(args.report.as_deref())?;
    if args.dry_run {
        for a in &report.changes {
            let at = a.line.map(|l| format!(" (line {l})")).unwrap_or_default();
            println!("would {} {}{at}", a.action, a.external_id);
        }
    }
    for f in &report.failed {
        println!(
            "failed: {}:{}: {}: {}",
            report.feed, f.line, f.external_id, f.reason
        );
    }
    if report.refused.is_none() {
        println!("{}", report.summary());
    }
    outcome
}

/// The sync proper; `report` holds what was done when it fails.
async fn run(
    args: &SyncArgs,
    svc: &Arc<Service>,
    collection: &CollectionName,
    settings: &CollectionSettings,
    items: &[FeedItem],
    report: &mut Report,
) -> anyhow::Result<()> {
    if args.create && !args.dry_run {
        match svc.create_collection_with(collection, "", settings).await {
            Err(e) if !e.is_conflict() => return Err(e.into()),
            _ => {}
        }
    }
    let catalogue = match svc.catalogue(collection).await {
        Ok(c) => c,
        // A dry run creates nothing: against a collection --create would make, everything is new.
        Err(ServiceError::NoCollection(_)) if args.create => Catalogue {
            items: HashMap::new(),
            without_external_id: 0,
        },
        Err(ServiceError::NoCollection(name)) => bail!(
            "no collection named \"{name}\": pass --create to make it (--text-fields for its hybrid search, \
             --group-by for products with several photos)"
        ),
        Err(e) => return Err(e.into()),
    };
    report.left_without_external_id = catalogue.without_external_id;

    // The guard, before anything is written: a feed cut short must not be half applied either.
    let in_feed: HashSet<&str> = items.iter().map(|i| i.external_id.as_str()).collect();
    let mut gone: Vec<(&String, i64)> = catalogue
        .items
        .iter()
        .filter(|(e, _)| !in_feed.contains(e.as_str()))
        .map(|(e, s)| (e, s.id))
        .collect();
    gone.sort_by_key(|(_, id)| *id);
    let share = gone.len() as f64 / catalogue.items.len().max(1) as f64;
    if share > args.max_delete_share {
        let why = format!(
            "the feed leaves out {} of the {} items \"{}\" holds under external ids ({:.1}%), more than \
             --max-delete-share {} allows: nothing was written. A feed cut short would wipe the catalogue; \
             if these items are withdrawn indeed, run again with --max-delete-share {:.2} or more",
            gone.len(),
            catalogue.items.len(),
            args.collection,
            share * 100.0,
            args.max_delete_share,
            // Rounded up from whole numbers: 0.4 * 100.0 is 40.00000000000001 in floating point.
            ((gone.len() * 100) as f64 / catalogue.items.len() as f64).ceil() / 100.0,
        );
        report.refused = Some(why.clone());
        bail!(why);
    }

    let pb = progress(items.len(), if args.dry_run { "dry run" } else { "sync" });
    let catalogue = &catalogue;
    // The stored codes are compared with the loaded bundle's vision model.
    let vision_id = svc.model().vision_id;
    let vision_id = vision_id.as_str();
    // Set at a failure without --skip-failed: no item starts after it, those in flight finish (each write is
    // whole either way, but a finished one is counted).
    let stop = &AtomicBool::new(false);
    let mut done = futures::stream::iter(items)
        .take_while(|_| std::future::ready(!stop.load(Ordering::Relaxed)))
        .map(|it| async move {
            (
                it,
                apply(svc, collection, catalogue, vision_id, it, args.dry_run).await,
            )
        })
        .buffer_unordered(args.concurrency.max(1));
    let mut stopped = None;
    while let Some((it, r)) = done.next().await {
        pb.inc(1);
        let (change, outcome) = match r {
            Ok(d) => d,
            Err(e) => {
                let reason = format!("{e:#}");
                if !args.skip_failed && stopped.is_none() {
                    stop.store(true, Ordering::Relaxed);
                    stopped = Some(format!(
                        "{}:{}: {}: {reason}",
                        report.feed, it.line, it.external_id
                    ));
                }
                report.failed.push(Failure {
                    line: it.line,
                    external_id: it.external_id.clone(),
                    reason,
                });
                continue;
            }
        };
        // What happened, by the upsert's word where it wrote (another writer may have moved first); a photo
        // embedded again for its vision model is replaced as a new one is.
        let action = match (outcome, change) {
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
                continue;
            }
        }
        report.changes.push(Action {
            line: Some(it.line),
            external_id: it.external_id.clone(),
            action: action.as_str(),
        });
    }
    drop(done);
    pb.finish_and_clear();
    report.failed.sort_by_key(|f| f.line);
    report.changes.sort_by_key(|a| a.line);
    if let Some(at) = stopped {
        bail!(
            "{at}\nthe sync stopped there and deleted nothing; the items written before it are in step, so \
             fix that line (or pass --skip-failed to leave such items as stored) and run again"
        );
    }

    // Deletions last: only a feed that was read whole and applied withdraws items.
    for (external_id, id) in gone {
        if !args.dry_run {
            match svc.delete_image(collection, id).await {
                // Gone already (another writer): what the feed asks for.
                Err(ServiceError::NotFound(_)) => continue,
                r => r.with_context(|| format!("deleting {external_id}"))?,
            }
        }
        report.deleted += 1;
        report.changes.push(Action {
            line: None,
            external_id: external_id.clone(),
            action: "delete",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn mapping<'a>(dir: &'a Path, numbers: &'a [String], titles: &'a [String]) -> Mapping<'a> {
        Mapping {
            dir,
            id: "id",
            image: "image",
            captions: "captions",
            caption_fields: titles,
            number_fields: numbers,
        }
    }

    #[test]
    fn a_csv_record_and_a_json_line_map_to_the_same_item() {
        let dir = Path::new("/feeds");
        let numbers = ["price".to_string()];
        let titles = ["title".to_string()];
        let m = mapping(dir, &numbers, &titles);
        let header =
            csv::StringRecord::from(vec!["id", "title", "image", "price", "captions", "note"]);
        let rec = csv::StringRecord::from(vec![
            "sku-1",
            "Red shoe",
            "photos/1.jpg",
            "39.5",
            "a red shoe | on grass",
            "",
        ]);
        let from_csv = m
            .csv_fields(&header, &rec)
            .and_then(|f| m.item(2, f))
            .expect("item");
        let line = json!({"id": "sku-1", "title": "Red shoe", "image": "photos/1.jpg", "price": 39.5,
                          "captions": ["a red shoe", "on grass"]});
        let Value::Object(fields) = line else {
            unreachable!()
        };
        let from_json = m.item(2, fields).expect("item");
        assert_eq!(from_csv, from_json);
        assert_eq!(from_csv.photos, vec![Photo::Path(dir.join("photos/1.jpg"))]);
        assert_eq!(
            from_csv.metadata,
            json!({"title": "Red shoe", "price": 39.5})
        );
        assert_eq!(
            from_csv.captions,
            vec!["a red shoe", "on grass", "Red shoe"]
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let m = mapping(Path::new("."), &[], &[]);
        let item = |v: Value| {
            let Value::Object(f) = v else { unreachable!() };
            m.item(1, f).map_err(|e| e.to_string())
        };
        assert!(
            item(json!({"image": "a.jpg"}))
                .unwrap_err()
                .contains("no `id`")
        );
        assert!(item(json!({"id": 7})).unwrap_err().contains("no `image`"));
        assert!(
            item(json!({"id": 7, "image": "ftp://x/a.jpg"}))
                .unwrap_err()
                .contains("neither a path nor an http(s) URL")
        );
        assert!(
            item(json!({"id": 7, "image": "a.jpg", "captions": [1]}))
                .unwrap_err()
                .contains("captions are strings")
        );
        let ok = item(json!({"id": 7, "image": "HTTPS://shop.example/a.jpg"})).expect("item");
        assert_eq!(ok.external_id, "7");
        assert_eq!(
            ok.photos,
            vec![Photo::Url("HTTPS://shop.example/a.jpg".into())]
        );
        let numbers = ["price".to_string()];
        let m = mapping(Path::new("."), &numbers, &[]);
        let header = csv::StringRecord::from(vec!["id", "image", "price"]);
        let rec = csv::StringRecord::from(vec!["1", "a.jpg", "cheap"]);
        let e = m.csv_fields(&header, &rec).expect_err("not a number");
        assert!(
            e.to_string().contains("`price` is \"cheap\", not a number"),
            "{e}"
        );
    }

    #[test]
    fn a_product_with_several_photos_is_an_item_per_photo() {
        let dir = Path::new("/feeds");
        let m = mapping(dir, &[], &[]);
        let header = csv::StringRecord::from(vec!["id", "image", "name", "brand", "price"]);
        let rec = csv::StringRecord::from(vec![
            "p1",
            "front.jpg | back.jpg|worn.jpg",
            "Red shoe",
            "acme",
            "40",
        ]);
        let product = m
            .csv_fields(&header, &rec)
            .and_then(|f| m.item(2, f))
            .expect("item");
        assert_eq!(product.photos.len(), 3);
        let settings = CollectionSettings {
            text_fields: Some(vec!["name".into()]),
            group_by: Some("product.id".into()),
        };
        let items = by_photo(vec![product.clone()], &settings).expect("photos");
        let ids: Vec<&str> = items.iter().map(|i| i.external_id.as_str()).collect();
        assert_eq!(ids, vec!["p1", "p1~2", "p1~3"]);
        let first = &items[0];
        assert_eq!(first.photos, vec![Photo::Path(dir.join("front.jpg"))]);
        assert_eq!(
            first.metadata,
            json!({"name": "Red shoe", "brand": "acme", "price": "40", "product": {"id": "p1"}})
        );
        // The words once, with the first photo; the attributes and the key with every photo.
        assert_eq!(
            items[2].metadata,
            json!({"brand": "acme", "price": "40", "product": {"id": "p1"}})
        );
        assert_eq!(items[2].photos, vec![Photo::Path(dir.join("worn.jpg"))]);
        // Without a product key, several photos are refused with what to do.
        let e =
            by_photo(vec![product.clone()], &CollectionSettings::default()).expect_err("no key");
        assert!(e.to_string().contains("--group-by"), "{e}");
        // A feed id that names another product's photo is refused.
        let mut clash = product;
        clash.external_id = "p1~2".into();
        clash.photos.truncate(1);
        let Value::Object(f) = json!({"id": "p1", "image": ["a.jpg", "b.jpg"]}) else {
            unreachable!()
        };
        let p1 = m.item(3, f).expect("item");
        let e = by_photo(vec![p1, clash], &settings).expect_err("clash");
        assert!(e.to_string().contains("another item's photo"), "{e}");
    }
}
