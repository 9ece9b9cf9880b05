//! Adding a folder's images with their captions, in batches with several requests in flight (one batch's
//! photos decode while another's run through the CNN). Images already stored (same external id: the file
//! name) are skipped before anything is embedded, so an interrupted run resumes where it stopped; a photo
//! that cannot be read or decoded is left out of its batch and reported, not the end of the run.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::Context;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt, stream};
use serde_json::json;

use super::progress;
use crate::service::{CollectionName, ImageInput, Service};

/// Where a batch job reads its images and captions.
pub(super) struct Folder<'a> {
    pub dir: &'a Path,
    pub captions: &'a HashMap<String, Vec<String>>,
}

impl Folder<'_> {
    /// One file as the service takes it: its name is its external id.
    async fn input(dir: &Path, name: &str, captions: Vec<String>) -> anyhow::Result<ImageInput> {
        let bytes = tokio::fs::read(dir.join(name))
            .await
            .with_context(|| format!("cannot read {name}"))?;
        Ok(ImageInput {
            bytes: Bytes::from(bytes),
            external_id: Some(name.to_string()),
            metadata: Some(json!({ "file": name })),
            captions,
        })
    }
}

/// The stored id of `name`, if an earlier run stored it.
async fn stored(
    svc: &Service,
    collection: &CollectionName,
    name: &str,
) -> anyhow::Result<Option<i64>> {
    match svc.image_by_external_id(collection, name).await {
        Ok(row) => Ok(Some(row.id)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// What `add_all` did: every name's image id (stored now or before), and the photos left out, with why.
pub(super) struct Added {
    pub ids: HashMap<String, i64>,
    pub skipped: Vec<(String, String)>,
}

/// One batch's outcome: (name, id) stored, (name, why) left out.
type BatchOutcome = (Vec<(String, i64)>, Vec<(String, String)>);

/// Adds `names` from the folder, `batch` images per request and `concurrency` requests in flight.
pub(super) async fn add_all(
    svc: &Arc<Service>,
    collection: &CollectionName,
    folder: Folder<'_>,
    names: Vec<String>,
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<Added> {
    let pb = progress(names.len(), "ingest");
    let batches: Vec<Vec<String>> = names.chunks(batch.max(1)).map(<[String]>::to_vec).collect();
    let captions_of =
        |n: &String| -> Vec<String> { folder.captions.get(n).cloned().unwrap_or_default() };
    let results: Vec<BatchOutcome> = stream::iter(batches)
        .map(|chunk| {
            let (svc, pb) = (svc.clone(), pb.clone());
            let caps: Vec<Vec<String>> = chunk.iter().map(captions_of).collect();
            let dir: PathBuf = folder.dir.to_path_buf();
            async move {
                let n = chunk.len() as u64;
                let done = add_batch(&svc, collection, &dir, chunk, caps).await;
                pb.inc(n);
                done
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await?;
    pb.finish();
    let mut added = Added {
        ids: HashMap::new(),
        skipped: Vec::new(),
    };
    for (ids, skipped) in results {
        added.ids.extend(ids);
        added.skipped.extend(skipped);
    }
    added.skipped.sort();
    Ok(added)
}

async fn add_batch(
    svc: &Service,
    collection: &CollectionName,
    dir: &Path,
    chunk: Vec<String>,
    caps: Vec<Vec<String>>,
) -> anyhow::Result<BatchOutcome> {
    // Images stored by an earlier run are skipped before anything is embedded: a resumed ingest costs the
    // images it has left, not every batch's CNN passes again.
    let (mut present, mut skipped) = (Vec::new(), Vec::new());
    let (mut names, mut inputs) = (Vec::new(), Vec::new());
    for (name, caps) in chunk.into_iter().zip(caps) {
        if let Some(id) = stored(svc, collection, &name).await? {
            present.push((name, id));
            continue;
        }
        match Folder::input(dir, &name, caps).await {
            Ok(input) => {
                names.push(name);
                inputs.push(input);
            }
            Err(e) => skipped.push((name, format!("{e:#}"))),
        }
    }
    while !inputs.is_empty() {
        match svc.add_images(collection, inputs.clone()).await {
            Ok(a) => {
                present.extend(
                    a.into_iter()
                        .map(|a| (a.external_id.unwrap_or_default(), a.id)),
                );
                break;
            }
            // A photo that cannot be used leaves the batch; the rest go again without it.
            Err(e) if e.bad_photo().is_some() => {
                let i = e.bad_photo().flatten().unwrap_or(0);
                skipped.push((names.remove(i), e.to_string()));
                inputs.remove(i);
            }
            Err(e) if e.is_conflict() => {
                // Some are there already (another run meanwhile): one at a time, skipping those.
                for (name, input) in names.drain(..).zip(inputs.drain(..)) {
                    if let Some(id) = stored(svc, collection, &name).await? {
                        present.push((name, id));
                        continue;
                    }
                    match svc.add_images(collection, vec![input]).await {
                        Ok(a) => present.push((name, a[0].id)),
                        Err(e) if e.bad_photo().is_some() => skipped.push((name, e.to_string())),
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Err(e) => {
                return Err(
                    anyhow::Error::from(e).context(format!("batch starting at {}", names[0]))
                );
            }
        }
    }
    Ok((present, skipped))
}
