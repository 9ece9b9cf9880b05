//! `jointspace ingest`: a folder of images (optionally a list of them, and Flickr8k-style captions) into a
//! collection, resumably.

use std::{collections::HashMap, sync::Arc};

use anyhow::Context;

use super::{
    add::{Folder, add_all},
    ensure_collection, offline_pipeline, read_captions,
};
use crate::{
    app::{Purpose, open_service},
    config::IngestArgs,
    metrics::Metrics,
    service::CollectionName,
};

pub async fn ingest(args: IngestArgs) -> anyhow::Result<()> {
    let collection = CollectionName::parse(&args.collection)?;
    let pipeline = offline_pipeline(&args.model)?;
    let svc = open_service(
        pipeline,
        &args.store,
        Arc::new(Metrics::new()),
        None,
        Purpose::Write,
    )
    .await?;
    let captions = match &args.captions {
        Some(p) => read_captions(p)?,
        None => HashMap::new(),
    };
    let mut names: Vec<String> = match &args.list {
        Some(l) => std::fs::read_to_string(l)?
            .lines()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        None => std::fs::read_dir(&args.images)
            .with_context(|| format!("cannot read {}", args.images.display()))?
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
    };
    let before = names.len();
    names.retain(|n| args.images.join(n).is_file());
    if names.len() < before {
        tracing::warn!(
            missing = before - names.len(),
            "listed images without a file are skipped"
        );
    }
    names.sort();
    ensure_collection(&svc, &collection).await?;
    let folder = Folder {
        dir: &args.images,
        captions: &captions,
    };
    let added = add_all(
        &svc,
        &collection,
        folder,
        names,
        args.batch,
        args.concurrency,
    )
    .await?;
    let orphans = captions
        .keys()
        .filter(|k| !args.images.join(k).is_file())
        .count();
    if orphans > 0 {
        tracing::warn!(
            images = orphans,
            "captions of images that are not in the folder were skipped"
        );
    }
    svc.snapshot().await?;
    // The database file alone now holds the run (scripts move a prepared database into place).
    svc.close().await;
    println!(
        "{} images in collection \"{}\"",
        added.ids.len(),
        args.collection
    );
    if !added.skipped.is_empty() {
        println!("{} photos skipped:", added.skipped.len());
        for (name, why) in &added.skipped {
            println!("  {name}: {why}");
        }
    }
    Ok(())
}
