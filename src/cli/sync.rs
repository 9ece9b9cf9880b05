//! `jointspace sync`: a collection made equal to a shop's catalogue feed (CSV or JSON lines) on this machine,
//! by the service's own sync (`Service::sync_feed`, which `POST /v1/collections/{name}/sync` runs as a job).
//! This command reads the feed file (photo paths are taken from its folder), says which settings a
//! collection it creates gets, and prints the report; the plan, the guard and the writes are the service's.

use std::{path::Path, time::Instant};

use anyhow::{Context, bail};
use indicatif::ProgressBar;

use super::{
    import::{check_url_ingest, fetching_service},
    progress,
};
use crate::{
    config::{FeedFormat, SyncArgs},
    service::{
        CollectionName, CollectionSettings, FeedMapping, FeedPhoto, FeedSource, ServiceError,
        SyncOptions, SyncProgress, SyncReport, read_feed,
    },
};

/// The feed's format: as asked, else by the file's extension, else by its first character (`bytes`: the file).
fn format_of(file: &Path, format: FeedFormat, bytes: &[u8]) -> crate::service::FeedFormat {
    use crate::service::FeedFormat as F;
    let ext = file
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match (format, ext.as_deref()) {
        (FeedFormat::Csv, _) | (FeedFormat::Auto, Some("csv")) => F::Csv,
        (FeedFormat::Jsonl, _) | (FeedFormat::Auto, Some("jsonl" | "ndjson" | "json")) => F::Jsonl,
        (FeedFormat::Auto, _) => F::sniff(bytes),
    }
}

/// The progress bar, sized once the sync knows how many items it handles.
struct Bar(ProgressBar);

impl SyncProgress for Bar {
    fn planned(&self, items: usize) {
        self.0.set_length(items as u64);
    }

    fn item_done(&self) {
        self.0.inc(1);
    }
}

pub async fn sync(args: SyncArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    let collection = CollectionName::parse(&args.collection)?;
    let file = &args.feed;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mapping = FeedMapping {
        format: format_of(file, args.format, &bytes),
        id_field: args.id_field.clone(),
        image_field: args.image_field.clone(),
        captions_field: args.captions_field.clone(),
        caption_fields: args.caption_fields.clone(),
        number_fields: args.number_fields.clone(),
    };
    let name = file.display().to_string();
    let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let source = FeedSource {
        name: Some(&name),
        dir: Some(&dir),
    };
    let products = read_feed(&bytes, &mapping, &source)?;
    let urls = products
        .iter()
        .any(|i| i.photos.iter().any(|p| matches!(p, FeedPhoto::Url(_))));
    check_url_ingest(file, urls, &args.url_ingest)?;
    let (svc, _) = fetching_service(&args.model, &args.store, &args.url_ingest).await?;
    let opts = SyncOptions {
        dry_run: args.dry_run,
        max_delete_share: args.max_delete_share,
        skip_failed: args.skip_failed,
        concurrency: args.concurrency,
        create: args.create.then(|| CollectionSettings {
            text_fields: (!args.text_fields.is_empty()).then(|| args.text_fields.clone()),
            group_by: args.group_by.clone(),
        }),
    };
    let mut report = SyncReport {
        feed: name,
        ..SyncReport::default()
    };
    let bar = Bar(progress(0, if args.dry_run { "dry run" } else { "sync" }));
    let outcome = svc
        .sync_feed(&collection, products, &opts, &mut report, &bar)
        .await;
    bar.0.finish_and_clear();
    if outcome.is_ok() && !args.dry_run {
        svc.snapshot().await?;
    }
    svc.close().await;
    report.seconds = start.elapsed().as_secs_f64();
    if let Some(p) = &args.report {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(p, json).with_context(|| format!("cannot write {}", p.display()))?;
    }
    print(&report);
    match outcome {
        Ok(()) => Ok(()),
        Err(ServiceError::NoCollection(name)) => bail!(
            "no collection named \"{name}\": pass --create to make it (--text-fields for its hybrid search, \
             --group-by for products with several photos)"
        ),
        Err(e) => Err(e.into()),
    }
}

/// The dry run's changes, the failures and the summary (none when the guard refused: its error says why).
fn print(report: &SyncReport) {
    if report.dry_run {
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
}
