//! The server's whole image path (decode -> crops -> vision -> FNE -> projection -> store -> index) through
//! `Service::add_images`, the code the HTTP handler calls, in images per second; then the same images stage
//! by stage, to say where the time goes. The Python side of the comparison is
//! `python -m jointspace_train.evaluation.bench` (onnxruntime-python and PyTorch eager on the same graph and
//! images).
use std::{path::Path, sync::Arc, time::Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::ValueEnum;
use futures::StreamExt;
use jointspace_embed::bundle::{Bundle, CropMode};
use jointspace_embed::crops;
use jointspace_embed::decode;
use jointspace_embed::decode::DecodeLimits;
use jointspace_embed::fne::Fne;
use jointspace_embed::hubness;
use jointspace_embed::pipeline::{ImageUse, Pipeline, PipelineOptions};
use jointspace_embed::projection::Projection;
use jointspace_embed::runtime::{self, Backend, Device, OrtBackend, RuntimeOptions};
use jointspace_embed::vision::VisionRuns;
use jointspace_index::{IndexParams, VectorIndex};
use jointspace_service::metrics::Metrics;
use jointspace_service::{CollectionName, Database, ImageInput, Service, ServiceOptions};
use jointspace_store::{NewImage, Provenance, Store};
use serde_json::{Value, json};

use super::{Flags, round};

pub struct Opts {
    pub bundle: String,
    pub images: String,
    pub n: usize,
    pub crop: Option<CropMode>,
    /// ONNX Runtime intra-op threads (the Python side uses the same).
    pub threads: usize,
    /// Images per add request.
    pub batch: usize,
    /// Add requests in flight in the whole-path run (a server's concurrent clients).
    pub concurrency: usize,
    pub max_batch_crops: usize,
    pub ort_dylib: Option<String>,
    /// `--release-inference-memory` (the server's default; the batch commands keep the arena: false).
    pub release_memory: bool,
    /// Where the graphs run, and how (as the server's flags of the same names set them).
    pub device: Device,
    pub vision_sessions: Option<usize>,
    pub pad_batches: bool,
    pub tf32: bool,
    pub nhwc: bool,
}

impl Opts {
    pub fn from_flags(f: &Flags) -> anyhow::Result<Opts> {
        let crop = match f.opt("crop") {
            Some(c) => Some(CropMode::from_str(&c, true).map_err(anyhow::Error::msg)?),
            None => None,
        };
        Ok(Opts {
            bundle: f.str("bundle", "models/flickr8k-vgg16-fne"),
            images: f.str("images", "/work/shared/data/flickr8k/images"),
            n: f.num("n", 32)?,
            crop,
            threads: f.num("threads", 2)?,
            batch: f.num("batch", 8)?,
            concurrency: f.num("concurrency", 1usize)?.max(1),
            max_batch_crops: f.num("max-batch-crops", 32)?,
            ort_dylib: f.ort_dylib(),
            release_memory: f.str("release-memory", "true") == "true",
            device: f.device()?,
            vision_sessions: f.opt("vision-sessions").map(|v| v.parse()).transpose()?,
            pad_batches: f.str("pad-batches", "off") == "on",
            tf32: f.str("tf32", "on") == "on",
            nhwc: f.str("nhwc", "off") == "on",
        })
    }
}

/// The folder's first `n` files by name (the Python side takes the same).
fn names(o: &Opts) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(&o.images)
        .with_context(|| format!("cannot read {}", o.images))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.truncate(o.n);
    Ok(names)
}

pub async fn run(o: &Opts) -> anyhow::Result<Value> {
    let bundle = Arc::new(Bundle::load(Path::new(&o.bundle))?);
    let (backend, pipeline) = build_pipeline(o, &bundle)?;
    let mode = pipeline.crop_mode;
    let dir = tempfile::tempdir()?;
    // A file database with the server's settings (WAL, synchronous=FULL): commits cost what they cost.
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    // The service on its own handle, the stages below on the store's (one file, two pools, used in turn).
    let db = Database::open(&url, std::time::Duration::from_secs(30), 8).await?;
    let store = Store::connect(&url).await?;
    let index = IndexParams::default();
    let svc = open_service(pipeline.clone(), db, index).await?;
    let bench = CollectionName::parse("bench")?;
    svc.create_collection(&bench, "").await?;
    let names = names(o)?;
    let files: Vec<Bytes> = names
        .iter()
        .map(|n| std::fs::read(Path::new(&o.images).join(n)).map(Bytes::from))
        .collect::<Result<_, _>>()?;
    // Warm-up with one full run (as many images as one runtime call takes): the first run of a shape
    // allocates ONNX Runtime's arenas.
    let per_run = (o.max_batch_crops / mode.crops()).max(1);
    pipeline
        .embed_images(files[..per_run.min(files.len())].to_vec(), ImageUse::Store)
        .await
        .map_err(|(_, e)| anyhow::anyhow!("{e}"))?;

    // 1. The whole path, as the server runs it, `concurrency` requests at a time.
    let t = Instant::now();
    let requests = files.chunks(o.batch.max(1)).map(|chunk| {
        let inputs = chunk
            .iter()
            .map(|b| ImageInput {
                bytes: b.clone(),
                external_id: None,
                metadata: None,
                captions: vec![],
            })
            .collect();
        svc.add_images(&bench, inputs)
    });
    let added: Vec<_> = futures::stream::iter(requests)
        .buffer_unordered(o.concurrency)
        .collect()
        .await;
    for a in added {
        a?;
    }
    let whole_s = t.elapsed().as_secs_f64();

    // 2. The same images stage by stage (one thread but for the runtime's), the same batching.
    let stages = Stages {
        bundle: &bundle,
        backend: &backend,
        mode,
        limits: pipeline_limits(),
        per_run,
    };
    let st = stages.time(&store, index, &files, o.batch).await?;
    let n = files.len() as f64;
    let total: f64 = st.iter().sum();
    Ok(json!({
        "images": names.len(), "crop_mode": format!("{mode:?}").to_lowercase(), "threads": o.threads,
        "batch": o.batch, "concurrency": o.concurrency, "max_batch_crops": o.max_batch_crops, "release_memory": o.release_memory, "bundle": bundle.id,
        "provider": backend.provider().as_str(), "vision_sessions": backend.vision_sessions(),
        "pad_batches": o.pad_batches, "tf32": o.tf32, "nhwc": o.nhwc,
        "whole_path_s": round(whole_s, 3),
        "images_per_s": round(n / whole_s, 3),
        "stages_images_per_s": round(n / total, 3),
        "profile": profile(st, n),
    }))
}

/// The decoder's limits, as generous as the bench's images need.
fn pipeline_limits() -> DecodeLimits {
    DecodeLimits {
        max_bytes: 20 << 20,
        max_pixels: 40_000_000,
        min_side: 1,
    }
}

/// ONNX Runtime on the bundle, and the pipeline the server would build on it.
fn build_pipeline(
    o: &Opts,
    bundle: &Arc<Bundle>,
) -> anyhow::Result<(Arc<OrtBackend>, Arc<Pipeline>)> {
    let dylib = runtime::locate_dylib(o.ort_dylib.as_deref().map(Path::new))?;
    let backend = Arc::new(OrtBackend::new(
        bundle,
        &dylib,
        RuntimeOptions {
            device: o.device,
            release_memory: o.release_memory,
            vision_sessions: o.vision_sessions,
            tf32: o.tf32,
            nhwc: o.nhwc,
            ..RuntimeOptions::cpu(Some(o.threads))
        },
    )?);
    let pipeline = Arc::new(Pipeline::new(
        bundle.clone(),
        backend.clone(),
        PipelineOptions {
            limits: pipeline_limits(),
            crop_mode: o.crop,
            max_text_chars: 1000,
            // As the server runs by default (--thumbnails on).
            thumbnails: true,
            max_batch_crops: o.max_batch_crops,
            max_batch_texts: 256,
            // The server's defaults on the CPU (JOINTSPACE_INFERENCE_QUEUE, _BATCH_WAIT_MS, _MAX_QUEUE_WAIT_MS);
            // with concurrent requests, a queue that holds them all (a throughput bench refuses nothing), and
            // the batch wait the server takes on CUDA.
            queue: 256.max(4 * o.concurrency * o.batch * 10),
            max_wait: std::time::Duration::from_millis(if o.device == Device::Cpu { 0 } else { 2 }),
            max_queue_wait: if o.concurrency > 1 {
                std::time::Duration::ZERO
            } else {
                std::time::Duration::from_millis(2000)
            },
            vision_stats: Default::default(),
            text_stats: Default::default(),
            vision_runs: VisionRuns {
                workers: backend.vision_sessions(),
                pad_rows: o.pad_batches,
            },
        },
    )?);
    Ok((backend, pipeline))
}

async fn open_service(
    pipeline: Arc<Pipeline>,
    db: Database,
    index: IndexParams,
) -> anyhow::Result<Service> {
    Ok(Service::open(
        pipeline,
        db,
        Arc::new(Metrics::new()),
        ServiceOptions {
            index,
            backend: Default::default(),
            snapshot_dir: None,
            max_k: 1000,
            max_batch: 64,
            url_fetcher: None,
        },
    )
    .await?)
}

/// Each stage's seconds per image and share of the whole, by name.
fn profile(st: [f64; 8], n: f64) -> serde_json::Map<String, Value> {
    let stages = [
        "decode",
        "resize_and_crops",
        "vision",
        "fne",
        "projection",
        "hubness",
        "store",
        "index",
    ];
    let total: f64 = st.iter().sum();
    stages
        .iter()
        .zip(st)
        .map(|(k, s)| {
            (
                k.to_string(),
                json!({"ms_per_image": round(s * 1e3 / n, 2), "share": round(s / total, 4)}),
            )
        })
        .collect()
}

/// A batch's crops, every image's one after another, and each image's size.
type CroppedBatch = (Vec<f32>, Vec<(u32, u32)>);

/// The image path taken apart, each stage timed on its own.
struct Stages<'a> {
    bundle: &'a Bundle,
    backend: &'a OrtBackend,
    mode: CropMode,
    limits: DecodeLimits,
    /// Images per runtime call.
    per_run: usize,
}

impl Stages<'_> {
    /// Seconds spent in each stage of [`profile`]'s list, over all of `files` in batches of `batch`.
    async fn time(
        &self,
        store: &Store,
        index: IndexParams,
        files: &[Bytes],
        batch: usize,
    ) -> anyhow::Result<[f64; 8]> {
        let bundle = self.bundle;
        // The stages of one backbone's path (the whole path above times any bundle).
        anyhow::ensure!(
            bundle.manifest.extra_backbones.is_empty(),
            "the stage profile takes a single-backbone bundle's path apart; {} has {} backbones",
            bundle.id,
            1 + bundle.manifest.extra_backbones.len()
        );
        let spec = &bundle.manifest.vision;
        let (per, crop_len) = (self.mode.crops(), crops::crop_len(spec));
        let fne = Fne::new(bundle);
        let proj = Projection::new(bundle);
        let stage_coll = store.create_collection("stages", "").await?;
        let idx = VectorIndex::build(index, vec![])?;
        let mut st = [0f64; 8];
        let mut next_id = 1i64;
        for chunk in files.chunks(batch.max(1)) {
            let (crops_all, sizes) = self.decode_and_crop(chunk, &mut st)?;
            let t = Instant::now();
            let mut raw = Vec::with_capacity(chunk.len() * per * spec.raw_dim);
            for run in crops_all.chunks(self.per_run * per * crop_len) {
                raw.extend(
                    self.backend
                        .vision(0, run, run.len() / crop_len, spec.graph_side())?,
                );
            }
            st[2] += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let codes: Vec<_> = raw
                .chunks(per * spec.raw_dim)
                .map(|rows| fne.code(&[rows]))
                .collect();
            st[3] += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let vectors: Vec<Vec<f32>> = codes.iter().map(|c| proj.project(c)).collect();
            st[4] += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let refs: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
            let offsets = hubness::offsets(bundle.hubness.as_deref(), &refs);
            st[5] += t.elapsed().as_secs_f64();
            let rows: Vec<NewImage> = codes
                .iter()
                .zip(vectors)
                .zip(offsets)
                .zip(&sizes)
                .map(|(((c, v), offset), (w, h))| NewImage {
                    external_id: None,
                    metadata: json!({}),
                    width: *w,
                    height: *h,
                    code: c.packed().to_vec(),
                    vector: v,
                    offset,
                    captions: vec![],
                    thumbnail: None,
                    content_hash: None,
                })
                .collect();
            let t = Instant::now();
            store
                .insert_images(
                    stage_coll.id,
                    &rows,
                    Provenance {
                        bundle_id: &bundle.id,
                        vision_id: &bundle.vision_id,
                    },
                    None,
                )
                .await?;
            st[6] += t.elapsed().as_secs_f64();
            let t = Instant::now();
            for r in rows {
                idx.insert(next_id, r.vector, r.offset)?;
                next_id += 1;
            }
            st[7] += t.elapsed().as_secs_f64();
        }
        Ok(st)
    }

    /// The decode and crop stages of one batch (timed into `st[0]` and `st[1]`): the crops of every image,
    /// one after another, and each image's size.
    fn decode_and_crop(&self, chunk: &[Bytes], st: &mut [f64; 8]) -> anyhow::Result<CroppedBatch> {
        let spec = &self.bundle.manifest.vision;
        let (per, crop_len) = (self.mode.crops(), crops::crop_len(spec));
        let mut crops_all = Vec::with_capacity(chunk.len() * per * crop_len);
        let mut sizes = vec![];
        for b in chunk {
            let t = Instant::now();
            let img = decode::decode(b, &self.limits)?;
            st[0] += t.elapsed().as_secs_f64();
            sizes.push(img.dimensions());
            let t = Instant::now();
            let r = crops::resize(&img, spec.resize);
            let start = crops_all.len();
            crops_all.resize(start + per * crop_len, 0f32);
            crops::write_crops(&r, spec, self.mode, &mut crops_all[start..]);
            st[1] += t.elapsed().as_secs_f64();
        }
        Ok((crops_all, sizes))
    }
}
