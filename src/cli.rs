//! The non-serving commands. `ingest` and `eval` go through `Service`, the same code path as the HTTP API.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt, stream};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::{
    app::{load_pipeline, open_service},
    bundle::Bundle,
    config::{EvalArgs, IngestArgs, ModelArgs, ReindexArgs, RuntimeArgs, StoreArgs},
    metrics::Metrics,
    pipeline::Pipeline,
    runtime::{self, OrtBackend},
    service::{ImageInput, Service, ServiceError},
    store::{Modality, StoreError},
};

/// Flickr8k token format: `<image>#<n>\t<caption>`; captions grouped by image, in file order.
pub fn read_captions(path: &Path) -> anyhow::Result<HashMap<String, Vec<String>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut caps: HashMap<String, Vec<String>> = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some((key, caption)) = line.split_once('\t') else {
            continue;
        };
        let name = key.split('#').next().unwrap_or(key);
        caps.entry(name.to_string())
            .or_default()
            .push(caption.trim().to_string());
    }
    Ok(caps)
}

fn progress(n: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(n as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} {bar:40} {pos}/{len} [{elapsed_precise}<{eta_precise}, {per_sec}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_message(what.to_string());
    pb
}

async fn ensure_collection(svc: &Service, name: &str) -> anyhow::Result<i64> {
    match svc.create_collection(name, "").await {
        Ok(c) => Ok(c.id),
        Err(ServiceError::Store(StoreError::Conflict(_))) => Ok(svc.collection(name).await?.id),
        Err(e) => Err(e.into()),
    }
}

/// The pipeline of a batch job (ingest, eval, reindex): it queues as much as it is given and waits its turn.
/// Refusing work with "overloaded" (the server's load shedding, `--max-queue-wait-ms`) protects interactive
/// clients' latency; an offline job with a few requests in flight would only fail on it.
fn offline_pipeline(model: &ModelArgs) -> anyhow::Result<Arc<Pipeline>> {
    let mut model = model.clone();
    model.max_queue_wait_ms = 0;
    model.inference_queue = usize::MAX;
    load_pipeline(&model)
}

/// Adds `names` from `dir` with their captions, `batch` images per request and `concurrency` requests in flight.
/// Images already present (same external id) are skipped, so an interrupted ingest can be resumed.
async fn add_all(
    svc: &Arc<Service>,
    collection: &str,
    dir: &Path,
    names: Vec<String>,
    captions: &HashMap<String, Vec<String>>,
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<HashMap<String, i64>> {
    let pb = progress(names.len(), "ingest");
    let batches: Vec<Vec<String>> = names.chunks(batch.max(1)).map(<[String]>::to_vec).collect();
    let results: Vec<Vec<(String, i64)>> = stream::iter(batches)
        .map(|chunk| {
            let (svc, pb) = (svc.clone(), pb.clone());
            let caps: Vec<Vec<String>> = chunk
                .iter()
                .map(|n| captions.get(n).cloned().unwrap_or_default())
                .collect();
            let dir = dir.to_path_buf();
            async move {
                // Images stored by an earlier run are skipped before anything is embedded: a resumed
                // ingest costs the images it has left, not every batch's CNN passes again.
                let cid = svc.store.collection_id(collection).await?;
                let mut present = Vec::new();
                let mut todo = Vec::with_capacity(chunk.len());
                for (name, caps) in chunk.iter().zip(caps) {
                    match svc.store.image_by_external_id(cid, name).await {
                        Ok(row) => present.push((name.clone(), row.id)),
                        Err(StoreError::NotFound(_)) => todo.push((name.clone(), caps)),
                        Err(e) => return Err(e.into()),
                    }
                }
                let chunk: Vec<String> = todo.iter().map(|(n, _)| n.clone()).collect();
                if chunk.is_empty() {
                    pb.inc(present.len() as u64);
                    return Ok(present);
                }
                let mut inputs = Vec::with_capacity(chunk.len());
                for (name, caps) in todo {
                    let bytes = tokio::fs::read(dir.join(&name))
                        .await
                        .with_context(|| format!("cannot read {name}"))?;
                    inputs.push(ImageInput {
                        bytes: Bytes::from(bytes),
                        external_id: Some(name.clone()),
                        metadata: Some(json!({ "file": name })),
                        captions: caps,
                    });
                }
                let added = match svc.add_images(collection, inputs).await {
                    Ok(a) => a
                        .into_iter()
                        .map(|a| (a.external_id.unwrap_or_default(), a.id))
                        .collect(),
                    Err(ServiceError::Store(StoreError::Conflict(_))) => {
                        // Some are there already: fall back to one at a time, skipping those.
                        let c = svc.collection(collection).await?;
                        let mut out = vec![];
                        for name in &chunk {
                            if let Ok(row) = svc.store.image_by_external_id(c.id, name).await {
                                out.push((name.clone(), row.id));
                                continue;
                            }
                            let bytes = tokio::fs::read(dir.join(name)).await?;
                            let caps = captions.get(name).cloned().unwrap_or_default();
                            let a = svc
                                .add_images(
                                    collection,
                                    vec![ImageInput {
                                        bytes: bytes.into(),
                                        external_id: Some(name.clone()),
                                        metadata: Some(json!({ "file": name })),
                                        captions: caps,
                                    }],
                                )
                                .await?;
                            out.push((name.clone(), a[0].id));
                        }
                        out
                    }
                    Err(e) => {
                        return Err(anyhow::Error::from(e)
                            .context(format!("batch starting at {}", chunk[0])));
                    }
                };
                pb.inc((chunk.len() + present.len()) as u64);
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

pub async fn ingest(args: IngestArgs) -> anyhow::Result<()> {
    let pipeline = offline_pipeline(&args.model)?;
    let svc = open_service(pipeline, &args.store, Arc::new(Metrics::new())).await?;
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
    ensure_collection(&svc, &args.collection).await?;
    let added = add_all(
        &svc,
        &args.collection,
        &args.images,
        names,
        &captions,
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
    println!(
        "{} images in collection \"{}\"",
        added.len(),
        args.collection
    );
    Ok(())
}

fn summarise(ranks: &[usize]) -> [f64; 4] {
    let n = ranks.len().max(1) as f64;
    let at = |k| 100.0 * ranks.iter().filter(|&&r| r <= k).count() as f64 / n;
    let mut s = ranks.to_vec();
    s.sort_unstable();
    let med = if s.is_empty() {
        0.0
    } else if s.len() % 2 == 1 {
        s[s.len() / 2] as f64
    } else {
        ((s[s.len() / 2 - 1] + s[s.len() / 2]) as f64 / 2.0).floor()
    };
    [at(1), at(5), at(10), med]
}

pub async fn eval(args: EvalArgs) -> anyhow::Result<()> {
    let file = match args.split.as_str() {
        "train" => "Flickr_8k.trainImages.txt",
        "dev" => "Flickr_8k.devImages.txt",
        "test" => "Flickr_8k.testImages.txt",
        other => bail!("unknown split \"{other}\"; use train, dev or test"),
    };
    let captions = read_captions(&args.data.join("Flickr8k.token.txt"))?;
    let images_dir = args.data.join("images");
    let mut names: Vec<String> = std::fs::read_to_string(args.data.join(file))
        .with_context(|| {
            format!(
                "cannot read the split list {file} in {}",
                args.data.display()
            )
        })?
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty() && images_dir.join(n).is_file() && captions.contains_key(*n))
        .map(String::from)
        .collect();
    if let Some(l) = args.limit {
        names.truncate(l);
    }
    let captions: HashMap<String, Vec<String>> = names
        .iter()
        .map(|n| (n.clone(), captions[n].iter().take(5).cloned().collect()))
        .collect();

    let pipeline = offline_pipeline(&args.model)?;
    let store_args = StoreArgs {
        database_url: args.database_url.clone(),
        database_timeout: 5,
        index_dir: None,
        // Through the HNSW graphs, as a large collection is searched (full rankings are exact either way).
        exact_below: 0,
        ef_search: 128,
        max_k: 1000,
        max_batch: 64,
    };
    let svc = open_service(pipeline.clone(), &store_args, Arc::new(Metrics::new())).await?;
    let collection = format!("eval-{}", args.split);
    let cid = ensure_collection(&svc, &collection).await?;
    let t = std::time::Instant::now();
    let ids = add_all(
        &svc,
        &collection,
        &images_dir,
        names.clone(),
        &captions,
        args.batch,
        args.concurrency,
    )
    .await?;
    let ingest_secs = t.elapsed().as_secs_f64();

    // Owners: caption id -> image id, from the database (what the server stored).
    let image_ids: Vec<i64> = names.iter().map(|n| ids[n]).collect();
    let mut owner: HashMap<i64, i64> = HashMap::new();
    let mut caps_of: HashMap<i64, Vec<i64>> = HashMap::new();
    for c in svc.store.list_captions(cid, None, 0, i64::MAX).await? {
        if let Some(img) = c.image_id {
            owner.insert(c.id, img);
            caps_of.entry(img).or_default().push(c.id);
        }
    }
    let n_img = image_ids.len();
    let n_cap = owner.len();
    let img_vecs: BTreeMap<i64, Vec<f32>> = svc
        .store
        .vectors(cid, Modality::Images)
        .await?
        .into_iter()
        .collect();
    let cap_vecs: Vec<(i64, Vec<f32>)> = svc.store.vectors(cid, Modality::Captions).await?;

    // Annotation: an image's rank is the best rank among its captions.
    let mut i2t = Vec::with_capacity(n_img);
    for id in &image_ids {
        let hits = svc
            .rank(
                cid,
                Modality::Captions,
                &img_vecs[id],
                Modality::Images,
                n_cap,
            )
            .await?;
        let mine = caps_of.get(id).cloned().unwrap_or_default();
        i2t.push(
            hits.iter()
                .position(|(c, _)| mine.contains(c))
                .map_or(n_cap + 1, |p| p + 1),
        );
    }
    // Search: each caption is a query with one correct image.
    let mut t2i = Vec::with_capacity(n_cap);
    let (mut graph_hits, mut graph_total) = (0usize, 0usize);
    for (cid_, v) in &cap_vecs {
        let hits = svc
            .rank(cid, Modality::Images, v, Modality::Captions, n_img)
            .await?;
        let target = owner[cid_];
        t2i.push(
            hits.iter()
                .position(|(i, _)| *i == target)
                .map_or(n_img + 1, |p| p + 1),
        );
        // How much of the exact top 10 a k=10 search through the graph returns.
        let top = svc
            .rank(cid, Modality::Images, v, Modality::Captions, 10)
            .await?;
        let exact: HashSet<i64> = hits.iter().take(10).map(|h| h.0).collect();
        graph_hits += top.iter().filter(|h| exact.contains(&h.0)).count();
        graph_total += exact.len();
    }
    let index_recall = graph_hits as f64 / graph_total.max(1) as f64;
    let i = summarise(&i2t);
    let t = summarise(&t2i);
    let keys = [
        "i2t_r1", "i2t_r5", "i2t_r10", "i2t_medr", "t2i_r1", "t2i_r5", "t2i_r10", "t2i_medr",
        "rsum",
    ];
    let vals = [
        i[0],
        i[1],
        i[2],
        i[3],
        t[0],
        t[1],
        t[2],
        t[3],
        i[0] + i[1] + i[2] + t[0] + t[1] + t[2],
    ];
    let round = |v: f64| (v * 100.0).round() / 100.0;
    let ours: BTreeMap<&str, f64> = keys.iter().zip(vals).map(|(k, v)| (*k, round(v))).collect();
    let theirs = pipeline
        .bundle
        .manifest
        .training
        .get("test_metrics")
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    let diff: BTreeMap<&str, Option<f64>> = keys
        .iter()
        .map(|k| {
            (
                *k,
                theirs
                    .get(*k)
                    .and_then(|v| v.as_f64())
                    .map(|v| round(ours[k] - v)),
            )
        })
        .collect();
    if args.json {
        let out = json!({
            "bundle": pipeline.bundle.id, "split": args.split, "images": n_img, "captions": n_cap,
            "crop_mode": format!("{:?}", pipeline.crop_mode).to_lowercase(),
            "ingest_seconds": round(ingest_secs),
            "index_recall_at_10": (index_recall * 1000.0).round() / 1000.0,
            "metrics": ours, "trainer_test_metrics": theirs, "difference": diff,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "bundle {}  split {}  {} images, {} captions  (ingest {:.1}s; HNSW recall@10 {:.3})",
            pipeline.bundle.id, args.split, n_img, n_cap, ingest_secs, index_recall
        );
        println!(
            "{:<10} {:>9} {:>9} {:>9}",
            "metric", "server", "trainer", "diff"
        );
        for k in keys {
            let th = theirs.get(k).and_then(|v| v.as_f64());
            println!(
                "{:<10} {:>9.2} {:>9} {:>9}",
                k,
                ours[k],
                th.map_or("-".into(), |v| format!("{v:.2}")),
                diff[k].map_or("-".into(), |v| format!("{v:+.2}"))
            );
        }
    }
    Ok(())
}

pub fn inspect(dir: PathBuf, graphs: bool, rt: RuntimeArgs) -> anyhow::Result<()> {
    let b = Bundle::load(&dir)?;
    let m = &b.manifest;
    println!(
        "bundle     {} (format {}, created {})",
        b.id, m.format, m.created
    );
    println!(
        "vision     {} {} from {}; {} taps, raw_dim {}, input {}x{} after resize {}, crop mode {:?}, {:?}",
        m.vision.onnx,
        m.vision.backbone,
        m.vision.weights,
        m.vision.taps.len(),
        m.vision.raw_dim,
        m.vision.input_size,
        m.vision.input_size,
        m.vision.resize,
        m.vision.crop_mode,
        m.vision.color_order
    );
    println!(
        "fne        dim {}, thresholds {:?}, vision id {}",
        m.fne.dim, m.fne.thresholds, b.vision_id
    );
    println!(
        "projection [{}, {}], abs {}",
        m.projection.joint_dim, m.fne.dim, m.projection.abs
    );
    println!(
        "text       {} + {}, max {} tokens",
        m.text.onnx, m.text.tokenizer, m.text.max_tokens
    );
    println!("similarity {:?}", m.similarity);
    println!("files      {} verified (sha256)", m.files.len());
    if let Some(t) = m.training.get("test_metrics") {
        println!("test       {t}");
    }
    if graphs {
        let dylib = runtime::locate_dylib(rt.ort_dylib.as_deref())?;
        let be = OrtBackend::new(&b, &dylib, rt.device, rt.intra_threads)?;
        println!(
            "graphs     open with {}",
            crate::runtime::Backend::provider(&be)
        );
    }
    Ok(())
}

pub async fn reindex(args: ReindexArgs) -> anyhow::Result<()> {
    let pipeline = offline_pipeline(&args.model)?;
    let svc = open_service(pipeline, &args.store, Arc::new(Metrics::new())).await?;
    let (images, captions) = svc.reindex().await?;
    svc.snapshot().await?;
    println!("reindexed {images} images (from their stored codes) and {captions} captions");
    Ok(())
}
