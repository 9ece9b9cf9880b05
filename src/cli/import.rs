//! `jointspace import`: a collection restored from an export without the CNN (codes projected by the loaded
//! bundle, as in a reindex), or a JSONL catalogue of photos on disk or at URLs added through the API's own
//! path (URLs fetched by URL ingest's guarded fetcher, the service's fetch.rs).
//!
//! The whole file is read and checked first (an export must end with its `end` line and counts, a catalogue's
//! every line must parse), so a bad file is refused before anything is written. Each batch then commits with
//! a mark of how many lines are in (the store's transfer.rs), so a rerun after a crash starts after the last
//! batch that committed and never adds one twice.

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, bail};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{offline_pipeline, progress};
use crate::{
    app::{Purpose, open_service, url_fetcher},
    config::{ImportArgs, ModelArgs, StoreArgs, UrlIngestArgs},
    metrics::Metrics,
    service::{
        CollectionName, CollectionSettings, EXPORT_FORMAT, ExportLine, ImageItem, ImageLine,
        ImageSource, ImportMark, Service,
    },
};

/// A catalogue line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogueItem {
    /// The photo's file, relative to the catalogue's folder (or absolute).
    path: Option<String>,
    /// Or its http(s) URL.
    url: Option<String>,
    external_id: Option<String>,
    metadata: Option<Value>,
    #[serde(default)]
    captions: Vec<String>,
}

enum Kind {
    /// An export of this collection name, description and settings, with this many images and captions.
    Export {
        collection: String,
        description: String,
        settings: CollectionSettings,
        images: u64,
        captions: u64,
    },
    Catalogue {
        items: u64,
        /// Whether any item is given by URL.
        urls: bool,
    },
}

/// A catalogue line, parsed and checked: exactly one of `path` and `url`.
fn catalogue_item(l: &str) -> anyhow::Result<CatalogueItem> {
    let it: CatalogueItem = serde_json::from_str(l)?;
    match (&it.path, &it.url) {
        (Some(_), None) | (None, Some(_)) => Ok(it),
        (Some(_), Some(_)) => bail!("a catalogue item gives `path` or `url`, not both"),
        (None, None) => bail!("a catalogue item needs `path` (a file) or `url`"),
    }
}

/// A file's identity for resuming: its length and a digest of its first MiB (an export's header has the
/// time it was made, so two exports of one collection differ there).
fn identity(file: &Path) -> anyhow::Result<String> {
    let len = std::fs::metadata(file)?.len();
    let mut head = Vec::new();
    std::fs::File::open(file)?
        .take(1 << 20)
        .read_to_end(&mut head)?;
    Ok(format!("{len}:{}", hex::encode(Sha256::digest(&head))))
}

pub(super) fn lines(
    file: &Path,
) -> anyhow::Result<impl Iterator<Item = (usize, anyhow::Result<String>)>> {
    let f = std::fs::File::open(file).with_context(|| format!("cannot read {}", file.display()))?;
    Ok(BufReader::new(f)
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.map_err(anyhow::Error::from))))
}

/// Reads the whole file once: what it is, and whether every line is what it should be.
fn survey(file: &Path) -> anyhow::Result<Kind> {
    let mut kind: Option<Kind> = None;
    let mut seen = (0u64, 0u64);
    let mut ended = None;
    for (n, l) in lines(file)? {
        let l = l?;
        if l.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{n}", file.display());
        match &kind {
            None => kind = Some(first_line(&l, at)?),
            Some(Kind::Catalogue { .. }) => {
                let it = catalogue_item(&l)
                    .with_context(|| format!("{}: not a catalogue item", at()))?;
                if let Some(Kind::Catalogue { items, urls }) = &mut kind {
                    *items += 1;
                    *urls |= it.url.is_some();
                }
            }
            Some(Kind::Export { .. }) => {
                if ended.is_some() {
                    bail!("{}: a line after the export's end", at());
                }
                match serde_json::from_str::<ExportLine>(&l)
                    .with_context(|| format!("{}: not an export line", at()))?
                {
                    ExportLine::Image(_) => seen.0 += 1,
                    ExportLine::Caption(_) => seen.1 += 1,
                    ExportLine::End(e) => ended = Some((e.images, e.captions)),
                    ExportLine::Header(_) => bail!("{}: a second header", at()),
                }
            }
        }
    }
    surveyed(file, kind, seen, ended)
}

/// What the file's first line says it is: an export (by its header, whose format this jointspace must read)
/// or a catalogue (by its first item).
fn first_line(l: &str, at: impl Fn() -> String) -> anyhow::Result<Kind> {
    if let Ok(ExportLine::Header(h)) = serde_json::from_str::<ExportLine>(l) {
        if h.format != EXPORT_FORMAT || h.version != 1 {
            bail!(
                "{}: an export of format {} version {}; this jointspace reads {EXPORT_FORMAT} version 1",
                at(),
                h.format,
                h.version
            );
        }
        Ok(Kind::Export {
            collection: h.collection,
            description: h.description,
            settings: CollectionSettings {
                text_fields: h.text_fields,
                group_by: h.group_by,
            },
            images: 0,
            captions: 0,
        })
    } else {
        let it = catalogue_item(l).with_context(|| {
            format!("{}: neither an export's header nor a catalogue item ({{\"path\" or \"url\", \"external_id\", \"metadata\", \"captions\"}})", at())
        })?;
        Ok(Kind::Catalogue {
            items: 1,
            urls: it.url.is_some(),
        })
    }
}

/// The survey's verdict once every line is read: an export must end with its `end` line, and its counts
/// must be those of the lines it holds.
fn surveyed(
    file: &Path,
    kind: Option<Kind>,
    seen: (u64, u64),
    ended: Option<(u64, u64)>,
) -> anyhow::Result<Kind> {
    match kind {
        None => bail!("{} is empty", file.display()),
        Some(Kind::Export {
            collection,
            description,
            settings,
            ..
        }) => match ended {
            Some(counts) if counts == seen => Ok(Kind::Export {
                collection,
                description,
                settings,
                images: seen.0,
                captions: seen.1,
            }),
            Some(counts) => bail!(
                "{}: the export says {} images and {} captions but holds {} and {}",
                file.display(),
                counts.0,
                counts.1,
                seen.0,
                seen.1
            ),
            None => bail!(
                "{} has no `end` line: the export was cut short (export again)",
                file.display()
            ),
        },
        Some(k) => Ok(k),
    }
}

/// Refuses a file that gives photos by URL unless URL ingest is on (`urls`: whether it does).
pub(super) fn check_url_ingest(
    file: &Path,
    urls: bool,
    args: &UrlIngestArgs,
) -> anyhow::Result<()> {
    if urls && !args.url_ingest {
        bail!(
            "{} gives photos by `url`: pass --url-ingest to let the command fetch them (loopback and \
             private addresses need --url-ingest-allow)",
            file.display()
        );
    }
    Ok(())
}

/// The service of a batch job that may fetch photos (with URL ingest's fetcher when it is on), and the
/// metrics that count its model work.
pub(super) async fn fetching_service(
    model: &ModelArgs,
    store: &StoreArgs,
    url_ingest: &UrlIngestArgs,
) -> anyhow::Result<(Arc<Service>, Arc<Metrics>)> {
    let fetcher = url_fetcher(url_ingest, model.max_image_bytes)?;
    let metrics = Arc::new(Metrics::new());
    let svc = open_service(
        offline_pipeline(model)?,
        store,
        metrics.clone(),
        fetcher,
        Purpose::Write,
    )
    .await?;
    Ok((svc, metrics))
}

pub async fn import(args: ImportArgs) -> anyhow::Result<()> {
    let kind = survey(&args.file)?;
    let urls = matches!(kind, Kind::Catalogue { urls: true, .. });
    check_url_ingest(&args.file, urls, &args.url_ingest)?;
    let source = identity(&args.file)?;
    let (svc, metrics) = fetching_service(&args.model, &args.store, &args.url_ingest).await?;
    let (name, description, settings) = target_collection(&args, &kind)?;
    let collection = CollectionName::parse(&name)?;
    match svc
        .create_collection_with(&collection, &description, &settings)
        .await
    {
        Ok(_) => {}
        Err(e) if e.is_conflict() => {}
        Err(e) => return Err(e.into()),
    }
    let done = svc.import_progress(&collection, &source).await? as usize;
    let batch = args.batch.max(1);
    let mut job = Job {
        pb: progress(0, "import"),
        svc: &svc,
        collection: &collection,
        source,
        file: args.file.clone(),
        dir: args
            .file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        skip_failed: args.skip_failed,
        images: vec![],
        captions: vec![],
        items: vec![],
        last: done,
        added: (0, 0),
        failed: 0,
    };
    let total = match kind {
        Kind::Export {
            images, captions, ..
        } => images + captions,
        Kind::Catalogue { items, .. } => items,
    };
    job.pb.set_length(total);
    if done > 0 {
        tracing::info!(
            lines = done,
            "resuming after the lines an earlier import committed"
        );
    }
    for (n, l) in lines(&args.file)? {
        let l = l?;
        if n <= done || l.trim().is_empty() {
            continue;
        }
        job.take_line(n, &l, batch).await?;
    }
    job.flush().await?;
    job.pb.finish();
    svc.snapshot().await?;
    svc.close().await;
    print_summary(&job, &name, &svc, &metrics);
    Ok(())
}

/// The collection to import into, its description and its settings if it is made: `--collection`, else the
/// export's own name (a catalogue has none); an export's text fields and product key either way.
fn target_collection(
    args: &ImportArgs,
    kind: &Kind,
) -> anyhow::Result<(String, String, CollectionSettings)> {
    Ok(match (&args.collection, kind) {
        (
            named,
            Kind::Export {
                collection,
                description,
                settings,
                ..
            },
        ) => match named {
            Some(c) => (c.clone(), String::new(), settings.clone()),
            None => (collection.clone(), description.clone(), settings.clone()),
        },
        (Some(c), Kind::Catalogue { .. }) => (c.clone(), String::new(), Default::default()),
        (None, Kind::Catalogue { .. }) => bail!("a catalogue needs --collection"),
    })
}

/// What the import did, and what it left for the server.
fn print_summary(job: &Job<'_>, name: &str, svc: &Service, metrics: &Metrics) {
    println!(
        "imported {} images and {} captions into \"{name}\" ({} photos embedded by the CNN, {} sentences by \
         the text model)",
        job.added.0,
        job.added.1,
        metrics.embedded("image"),
        metrics.embedded("text"),
    );
    if let Some(note) = svc.index_note() {
        println!("{note}");
    }
    if job.failed > 0 {
        println!(
            "{} photos given by URL were left out (--skip-failed; each is logged above with its line)",
            job.failed
        );
    }
}

/// What is read but not yet committed, and where it comes from.
struct Job<'a> {
    pb: indicatif::ProgressBar,
    svc: &'a Arc<Service>,
    collection: &'a CollectionName,
    source: String,
    file: PathBuf,
    dir: PathBuf,
    skip_failed: bool,
    images: Vec<ImageLine>,
    captions: Vec<String>,
    /// Catalogue items and their lines.
    items: Vec<(usize, CatalogueItem)>,
    /// The last line read: committed with the next flush.
    last: usize,
    /// Images and captions added.
    added: (u64, u64),
    /// Catalogue photos left out (--skip-failed).
    failed: u64,
}

impl Job<'_> {
    /// Line `n` (not committed yet) into the batch: an export's images and captions each in batches of their
    /// own, a catalogue's items; the batch is committed once full.
    async fn take_line(&mut self, n: usize, l: &str, batch: usize) -> anyhow::Result<()> {
        if let Ok(line) = serde_json::from_str::<ExportLine>(l) {
            match line {
                ExportLine::Image(i) => {
                    if !self.captions.is_empty() {
                        self.flush().await?;
                    }
                    self.images.push(i);
                }
                ExportLine::Caption(c) => {
                    if !self.images.is_empty() {
                        self.flush().await?;
                    }
                    self.captions.push(c.text);
                }
                ExportLine::Header(_) | ExportLine::End(_) => {}
            }
        } else {
            self.items.push((n, catalogue_item(l)?));
        }
        self.last = n;
        if self.images.len() + self.items.len() >= batch || self.captions.len() >= batch * 8 {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        let pending = self.images.len() + self.captions.len() + self.items.len();
        let mark = ImportMark {
            source: self.source.clone(),
            lines: self.last as i64,
        };
        let (svc, at) = (self.svc, self.last);
        let batch = || format!("the batch ending at line {at}");
        if !self.images.is_empty() {
            let images = std::mem::take(&mut self.images);
            let caps: u64 = images.iter().map(|i| i.captions.len() as u64).sum();
            let done = svc.restore_images(self.collection, images, &mark).await;
            let ids = done.with_context(batch)?;
            self.added.0 += ids.len() as u64;
            self.added.1 += caps;
        }
        if !self.captions.is_empty() {
            let texts = std::mem::take(&mut self.captions);
            let done = svc.restore_captions(self.collection, texts, &mark).await;
            let ids = done.with_context(batch)?;
            self.added.1 += ids.len() as u64;
        }
        if !self.items.is_empty() {
            let items = std::mem::take(&mut self.items);
            let mut inputs = Vec::with_capacity(items.len());
            for (_, it) in &items {
                let source = match (&it.path, &it.url) {
                    (_, Some(url)) => ImageSource::Url(url.clone()),
                    (Some(p), None) => {
                        let path = self.dir.join(p);
                        let bytes = tokio::fs::read(&path)
                            .await
                            .with_context(|| format!("cannot read {}", path.display()))?;
                        ImageSource::Bytes(Bytes::from(bytes))
                    }
                    (None, None) => unreachable!("catalogue_item checked it"),
                };
                inputs.push(ImageItem {
                    source,
                    external_id: it.external_id.clone(),
                    metadata: it.metadata.clone(),
                    captions: it.captions.clone(),
                });
            }
            // Failed URLs stop the import unless skipped: all or nothing of the batch, so that a rerun
            // resumes at it.
            let report = self
                .svc
                .add_image_items(self.collection, inputs, !self.skip_failed, Some(&mark))
                .await
                .with_context(batch)?;
            let failures: Vec<String> = report
                .failed
                .iter()
                .map(|f| format!("{}:{}: {}", self.file.display(), items[f.index].0, f.error))
                .collect();
            if !self.skip_failed && !failures.is_empty() {
                bail!(
                    "{}\nnothing of the batch ending at line {} was written: fix or remove those lines and run \
                     again (the import resumes at that batch), or pass --skip-failed",
                    failures.join("\n"),
                    self.last
                );
            }
            for f in &failures {
                tracing::warn!("left out: {f}");
            }
            self.failed += report.failed.len() as u64;
            for (i, _) in &report.added {
                self.added.1 += items[*i].1.captions.len() as u64;
            }
            self.added.0 += report.added.len() as u64;
        }
        self.pb.inc(pending as u64);
        Ok(())
    }
}
