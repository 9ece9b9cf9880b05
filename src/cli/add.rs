//! Adding a folder's images with their captions, in batches with several requests in flight. Images already
//! stored (same external id: the file name) are skipped before anything is embedded, so an interrupted run
//! resumes where it stopped.

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

/// Adds `names` from the folder, `batch` images per request and `concurrency` requests in flight; returns
/// every name's image id (stored now or before).
pub(super) async fn add_all(
    svc: &Arc<Service>,
    collection: &CollectionName,
    folder: Folder<'_>,
    names: Vec<String>,
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<HashMap<String, i64>> {
    let pb = progress(names.len(), "ingest");
    let batches: Vec<Vec<String>> = names.chunks(batch.max(1)).map(<[String]>::to_vec).collect();
    let captions_of =
        |n: &String| -> Vec<String> { folder.captions.get(n).cloned().unwrap_or_default() };
    let results: Vec<Vec<(String, i64)>> = stream::iter(batches)
        .map(|chunk| {
            let (svc, pb) = (svc.clone(), pb.clone());
            let caps: Vec<Vec<String>> = chunk.iter().map(captions_of).collect();
            let dir: PathBuf = folder.dir.to_path_buf();
            async move {
                // Images stored by an earlier run are skipped before anything is embedded: a resumed
                // ingest costs the images it has left, not every batch's CNN passes again.
                let mut present = Vec::new();
                let mut todo = Vec::with_capacity(chunk.len());
                for (name, caps) in chunk.into_iter().zip(caps) {
                    match stored(&svc, collection, &name).await? {
                        Some(id) => present.push((name, id)),
                        None => todo.push((name, caps)),
                    }
                }
                if todo.is_empty() {
                    pb.inc(present.len() as u64);
                    return Ok(present);
                }
                let names: Vec<String> = todo.iter().map(|(n, _)| n.clone()).collect();
                let mut inputs = Vec::with_capacity(todo.len());
                for (name, caps) in &todo {
                    inputs.push(Folder::input(&dir, name, caps.clone()).await?);
                }
                let added = match svc.add_images(collection, inputs).await {
                    Ok(a) => a
                        .into_iter()
                        .map(|a| (a.external_id.unwrap_or_default(), a.id))
                        .collect(),
                    Err(e) if e.is_conflict() => {
                        // Some are there already (another run meanwhile): one at a time, skipping those.
                        let mut out = vec![];
                        for (name, caps) in todo {
                            if let Some(id) = stored(&svc, collection, &name).await? {
                                out.push((name, id));
                                continue;
                            }
                            let input = Folder::input(&dir, &name, caps).await?;
                            let a = svc.add_images(collection, vec![input]).await?;
                            out.push((name, a[0].id));
                        }
                        out
                    }
                    Err(e) => {
                        return Err(anyhow::Error::from(e)
                            .context(format!("batch starting at {}", names[0])));
                    }
                };
                pb.inc((names.len() + present.len()) as u64);
                present.extend(added);
                Ok::<_, anyhow::Error>(present)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await?;
    pb.finish();
    Ok(results.into_iter().flatten().collect())
}
