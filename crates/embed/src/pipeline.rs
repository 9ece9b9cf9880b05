//! The straight line from bytes or a sentence to a joint vector: decode -> prepare -> crops -> vision -> fne ->
//! projection, and tokenizer -> text graph. A bundle with several backbones decodes each photo once, then
//! prepares, cuts and runs it through every backbone (their graphs concurrently), and concatenates their codes
//! in code order; a single-backbone bundle is the one-element case. The HTTP handlers, `ingest` and `eval` all
//! call this, so the numbers `eval` reports are the numbers the server gives.

use std::{sync::Arc, time::Duration};

use crate::{
    batch::{BatchOptions, BatchStats},
    bundle::{Bundle, CropMode, Manifest, Similarity, VisionSpec},
    crops,
    decode::{self, DecodeError, DecodeLimits},
    fne::{Fne, TernaryCode},
    hubness, prepare,
    projection::Projection,
    runtime::{Backend, Provider, RuntimeError},
    text::{Sentence, TextEncoder, TextError, TextTokenizer},
    thumbnail,
    vision::{Vision, VisionRuns},
};

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Text(#[from] TextError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// What an image is embedded for. Only a stored image needs its hubness offset (a product with the bank's
/// 10,000 captions); a query image, an annotation or `/v1/embed` does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageUse {
    Store,
    Query,
}

/// What the server keeps of an image: its code (the durable part), its joint vector and its search offset
/// (both derived from the code).
#[derive(Debug, Clone)]
pub struct ImageEmbedding {
    pub code: TernaryCode,
    pub vector: Vec<f32>,
    /// Added to a caption query's score for this image (docs/bundle.md, "The hubness section"); 0 without a
    /// bank, and for `ImageUse::Query`.
    pub offset: f32,
    pub width: u32,
    pub height: u32,
    /// A small JPEG of the photo (`thumbnail`), for `ImageUse::Store` when thumbnails are on.
    pub thumbnail: Option<Vec<u8>>,
}

pub struct PipelineOptions {
    pub limits: DecodeLimits,
    /// Overrides the bundle's crop mode (`--crop-mode`); a bundle with several backbones takes only the mode
    /// every backbone has.
    pub crop_mode: Option<CropMode>,
    pub max_text_chars: usize,
    /// Make a thumbnail of every stored image (from the decoded pixels, no second decode).
    pub thumbnails: bool,
    /// Upper bound of crops (images x crops per image) in one runtime call.
    pub max_batch_crops: usize,
    pub max_batch_texts: usize,
    /// Most crops (or sentences) waiting for inference before requests are refused as overloaded.
    pub queue: usize,
    /// How long a non-full batch waits for concurrent requests to join it.
    pub max_wait: Duration,
    /// Longest expected queueing time a request is admitted to (zero: only `queue` bounds it).
    pub max_queue_wait: Duration,
    /// Instruments of each backbone's vision batcher, in code order (one left out: unregistered ones), and of
    /// the text batcher.
    pub vision_stats: Vec<BatchStats>,
    pub text_stats: BatchStats,
    /// How each backbone's runtime calls are made (calls in flight, padded shapes).
    pub vision_runs: VisionRuns,
}

pub struct Pipeline {
    pub bundle: Arc<Bundle>,
    /// The first backbone's crop mode, as it runs (`cuts` has every backbone's).
    pub crop_mode: CropMode,
    pub limits: DecodeLimits,
    thumbnails: bool,
    provider: Provider,
    /// How each backbone cuts a photo, in code order.
    cuts: Arc<[Cut]>,
    /// One worker per backbone, in code order.
    vision: Vec<Vision>,
    // Shared with the blocking pool, where codes are made and projected.
    fne: Arc<Fne>,
    projection: Arc<Projection>,
    tokenizer: TextTokenizer,
    text: TextEncoder,
    /// Bounds the decoded images held in memory at once.
    decode_permits: Arc<tokio::sync::Semaphore>,
}

impl Pipeline {
    pub fn new(
        bundle: Arc<Bundle>,
        backend: Arc<dyn Backend>,
        opts: PipelineOptions,
    ) -> Result<Pipeline, EmbedError> {
        let m = &bundle.manifest;
        let cuts: Arc<[Cut]> = crop_modes(m, opts.crop_mode)?
            .into_iter()
            .zip(m.backbones())
            .map(|(mode, b)| Cut {
                spec: b.vision.clone(),
                mode,
            })
            .collect();
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        let vision = cuts
            .iter()
            .enumerate()
            .map(|(graph, cut)| {
                Vision::new(
                    backend.clone(),
                    graph,
                    &cut.spec,
                    BatchOptions {
                        max_rows: opts.max_batch_crops.max(cut.mode.crops()),
                        // Whatever the setting, one full run must fit the queue.
                        queue: opts.queue.max(opts.max_batch_crops),
                        max_wait: opts.max_wait,
                        max_queue_wait: opts.max_queue_wait,
                    },
                    opts.vision_stats.get(graph).cloned().unwrap_or_default(),
                    opts.vision_runs,
                )
            })
            .collect();
        Ok(Pipeline {
            vision,
            crop_mode: cuts[0].mode,
            cuts,
            fne: Arc::new(Fne::new(&bundle)),
            projection: Arc::new(Projection::new(&bundle)),
            tokenizer: TextTokenizer::new(&bundle, opts.max_text_chars)?,
            text: TextEncoder::new(
                backend.clone(),
                &bundle,
                BatchOptions {
                    max_rows: opts.max_batch_texts,
                    queue: opts.queue.max(opts.max_batch_texts),
                    max_wait: opts.max_wait,
                    max_queue_wait: opts.max_queue_wait,
                },
                opts.text_stats,
            ),
            provider: backend.provider(),
            limits: opts.limits,
            thumbnails: opts.thumbnails,
            decode_permits: Arc::new(tokio::sync::Semaphore::new(2 * cores)),
            bundle,
        })
    }

    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// Every backbone's `Vision::warm`, in code order: each one's shapes, or none when the calls are not padded.
    pub fn warm_shapes(&self) -> Result<Vec<Vec<usize>>, EmbedError> {
        let warmed: Option<Vec<Vec<usize>>> = self
            .vision
            .iter()
            .zip(self.cuts.iter())
            .map(|(v, cut)| v.warm(cut.mode.crops()))
            .collect::<Result<_, _>>()?;
        Ok(warmed.unwrap_or_default())
    }

    /// Each backbone's crop mode as it runs, in code order.
    pub fn crop_modes(&self) -> Vec<CropMode> {
        self.cuts.iter().map(|c| c.mode).collect()
    }

    /// Whether every vision worker's ONNX Runtime session answers (see `Batcher::probe`), probed together.
    pub async fn probe_vision(&self, fresh: Duration, timeout: Duration) -> Result<(), EmbedError> {
        futures::future::try_join_all(self.vision.iter().map(|v| v.probe(fresh, timeout))).await?;
        Ok(())
    }

    /// Whether the text worker's session answers, on a one-word sentence.
    pub async fn probe_text(&self, fresh: Duration, timeout: Duration) -> Result<(), EmbedError> {
        let ids = self.tokenizer.ids("a")?;
        Ok(self.text.probe(ids, fresh, timeout).await?)
    }

    /// The inference worker that has stopped, if one has: it never restarts, so the process is no longer
    /// alive for its purpose (`/healthz` says so, and an orchestrator restarts it).
    pub fn stopped_worker(&self) -> Option<&'static str> {
        if !self.vision.iter().all(Vision::alive) {
            Some("vision")
        } else if !self.text.alive() {
            Some("text")
        } else {
            None
        }
    }

    pub fn similarity(&self) -> Similarity {
        self.bundle.manifest.similarity
    }

    pub fn joint_dim(&self) -> usize {
        self.projection.joint_dim()
    }

    pub fn projection(&self) -> &Projection {
        &self.projection
    }

    /// Embeds a batch of images: decode -> crops -> vision -> fne -> projection (-> hubness offset, to store).
    /// All crops go to the runtime together (in runs bounded by `max_batch_crops`). One bad image fails the
    /// batch, naming it: a batch is stored all or nothing.
    pub async fn embed_images(
        &self,
        images: Vec<bytes::Bytes>,
        purpose: ImageUse,
    ) -> Result<Vec<ImageEmbedding>, (usize, EmbedError)> {
        let n = images.len();
        if n == 0 {
            return Ok(vec![]);
        }
        let limits = self.limits;
        let thumbnails = self.thumbnails && purpose == ImageUse::Store;
        // Decode and cut every image on the blocking pool; the permits bound the decoded images in memory.
        let tasks: Vec<_> = images
            .into_iter()
            .map(|bytes| {
                let (cuts, permits) = (self.cuts.clone(), self.decode_permits.clone());
                async move {
                    let _permit = permits
                        .acquire_owned()
                        .await
                        .map_err(|_| EmbedError::Runtime(RuntimeError::Stopped))?;
                    blocking(move || decode_and_cut(&bytes, &cuts, limits, thumbnails))
                        .await?
                        .map_err(EmbedError::from)
                }
            })
            .collect();
        let decoded = futures::future::join_all(tasks).await;
        let mut sizes = Vec::with_capacity(n);
        // Per backbone, every image's crops.
        let mut pieces: Vec<Vec<Vec<f32>>> =
            self.cuts.iter().map(|_| Vec::with_capacity(n)).collect();
        let mut thumbs = Vec::with_capacity(n);
        for (i, d) in decoded.into_iter().enumerate() {
            let (crops, w, h, thumb) = d.map_err(|e| (i, e))?;
            sizes.push((w, h));
            for (all, one) in pieces.iter_mut().zip(crops) {
                all.push(one);
            }
            thumbs.push(thumb);
        }
        // The backbones' graphs run together, each on its own worker.
        let raw = futures::future::try_join_all(
            self.vision
                .iter()
                .zip(pieces)
                .zip(self.cuts.iter())
                .map(|((v, pieces), cut)| v.features(pieces, cut.mode.crops())),
        )
        .await
        .map_err(|e| (0, e.into()))?;
        let per: Vec<usize> = self.cuts.iter().map(|c| c.mode.crops()).collect();
        // Codes, projection and offsets are milliseconds of arithmetic per image: off the async workers.
        let (fne, projection, bundle) = (
            self.fne.clone(),
            self.projection.clone(),
            self.bundle.clone(),
        );
        blocking(move || {
            let images = sizes.into_iter().zip(thumbs).collect();
            embeddings(&fne, &projection, &bundle, &raw, &per, images, purpose)
        })
        .await
        .map_err(|e| (0, e))
    }

    /// Joint vectors and search offsets of stored codes (a reindex), on the blocking pool.
    pub async fn project_codes(
        &self,
        codes: Vec<TernaryCode>,
    ) -> Result<(Vec<Vec<f32>>, Vec<f32>), EmbedError> {
        let (projection, bundle) = (self.projection.clone(), self.bundle.clone());
        blocking(move || {
            let vectors = projection.project_all(&codes.iter().collect::<Vec<_>>());
            let refs: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
            let offsets = hubness::offsets(bundle.hubness.as_deref(), &refs);
            (vectors, offsets)
        })
        .await
    }

    pub async fn embed_image(
        &self,
        bytes: bytes::Bytes,
        purpose: ImageUse,
    ) -> Result<ImageEmbedding, EmbedError> {
        let mut v = self
            .embed_images(vec![bytes], purpose)
            .await
            .map_err(|(_, e)| e)?;
        Ok(v.remove(0))
    }

    /// Tokenises every sentence (so that bad input is reported before any inference), then one runtime call.
    /// A search sentence, tokenised once: its ids for `embed_tokens` and its unknown words for the answer.
    pub fn sentence(&self, text: &str) -> Result<Sentence, TextError> {
        self.tokenizer.sentence(text)
    }

    pub fn tokenize(
        &self,
        texts: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<Vec<Vec<i64>>, (usize, TextError)> {
        texts
            .into_iter()
            .enumerate()
            .map(|(i, t)| self.tokenizer.ids(t.as_ref()).map_err(|e| (i, e)))
            .collect()
    }

    pub async fn embed_texts(
        &self,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, (usize, EmbedError)> {
        let ids = self.tokenize(texts).map_err(|(i, e)| (i, e.into()))?;
        self.embed_tokens(ids).await.map_err(|e| (0, e))
    }

    /// Sentences tokenised by `tokenize` already, so that a caller checking input first tokenises once.
    pub async fn embed_tokens(&self, ids: Vec<Vec<i64>>) -> Result<Vec<Vec<f32>>, EmbedError> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        Ok(self.text.embed(ids).await?)
    }

    /// The search offsets of captions to store (docs/bundle.md, "The annotation side"), from their joint
    /// vectors, on the blocking pool; all 0 without an annotation bank. The vectors go there and come back
    /// rather than being copied.
    pub async fn caption_offsets(
        &self,
        vectors: Vec<Vec<f32>>,
    ) -> Result<(Vec<Vec<f32>>, Vec<f32>), EmbedError> {
        if self.bundle.annotation_hubness.is_none() {
            let zeros = vec![0.0; vectors.len()];
            return Ok((vectors, zeros));
        }
        let bundle = self.bundle.clone();
        blocking(move || {
            let refs: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
            let offsets = hubness::offsets(bundle.annotation_hubness.as_ref(), &refs);
            (vectors, offsets)
        })
        .await
    }

    pub async fn embed_text(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        let mut v = self
            .embed_texts(&[text.to_string()])
            .await
            .map_err(|(_, e)| e)?;
        Ok(v.remove(0))
    }
}

/// The crop mode each backbone runs in, in code order: the bundle's own, or `--crop-mode`'s. A windowed graph
/// takes whole images and reads the crops itself, the others take crops, so the flag cannot cross that line; and
/// a bundle with several backbones takes the flag only where it restates every backbone's mode.
fn crop_modes(m: &Manifest, flag: Option<CropMode>) -> Result<Vec<CropMode>, EmbedError> {
    let own: Vec<CropMode> = m.backbones().map(|b| b.vision.crop_mode).collect();
    let name = |mode: CropMode| format!("{mode:?}").to_lowercase();
    let Some(mode) = flag else { return Ok(own) };
    let refuse = |message: String| {
        Err(EmbedError::Runtime(RuntimeError::Graph {
            graph: m.vision.onnx.clone(),
            message,
        }))
    };
    if own.len() > 1 && own.iter().any(|&o| o != mode) {
        let modes: Vec<String> = own.iter().map(|&o| name(o)).collect();
        return refuse(format!(
            "--crop-mode {} cannot run this bundle: it has {} backbones, each in its own crop mode ({}), \
             and --crop-mode may only name the mode they all share; leave it out",
            name(mode),
            own.len(),
            modes.join(", ")
        ));
    }
    if (mode == CropMode::Windowed) != (own[0] == CropMode::Windowed) {
        return refuse(format!(
            "--crop-mode {} cannot run this bundle's graph, built for crop mode {}: center and \
             ten share one graph, windowed needs its own",
            name(mode),
            name(own[0])
        ));
    }
    Ok(vec![mode; own.len()])
}

/// How one backbone cuts a photo: its vision section (preparation, resize, colours) in its crop mode.
struct Cut {
    spec: VisionSpec,
    mode: CropMode,
}

impl Cut {
    /// `img` prepared, resized and cut into this backbone's crops (normalised NCHW).
    fn apply(&self, img: image::RgbImage) -> Vec<f32> {
        let img = prepare::apply(self.spec.prepare.as_ref(), img);
        let resized = crops::resize(&img, self.spec.resize);
        drop(img);
        let mut out = vec![0f32; self.mode.crops() * crops::crop_len(&self.spec)];
        crops::write_crops(&resized, &self.spec, self.mode, &mut out);
        out
    }
}

/// One image decoded once (within `limits`) and cut into each backbone's crops, with its size and, when
/// `thumbnails`, its thumbnail.
fn decode_and_cut(
    bytes: &[u8],
    cuts: &[Cut],
    limits: DecodeLimits,
    thumbnails: bool,
) -> Result<Decoded, DecodeError> {
    let img = decode::decode(bytes, &limits)?;
    let (w, h) = img.dimensions();
    let thumb = thumbnails.then(|| thumbnail::make(&img)).flatten();
    // Every backbone but the last cuts a copy; the last (the only one, mostly) takes the decoded image.
    let mut out = Vec::with_capacity(cuts.len());
    if let Some((last, others)) = cuts.split_last() {
        out.extend(others.iter().map(|c| c.apply(img.clone())));
        out.push(last.apply(img));
    }
    Ok((out, w, h, thumb))
}

/// An image's width and height, and its thumbnail (when one is kept).
type SizeAndThumbnail = ((u32, u32), Option<Vec<u8>>);

/// The images' embeddings from their vision features (`raw[b]`: backbone `b`'s, `per[b]` crops an image):
/// codes, vectors and, for images to store, their hubness offsets. Each image comes with its size and thumbnail.
fn embeddings(
    fne: &Fne,
    projection: &Projection,
    bundle: &Bundle,
    raw: &[Vec<f32>],
    per: &[usize],
    images: Vec<SizeAndThumbnail>,
    purpose: ImageUse,
) -> Vec<ImageEmbedding> {
    // Floats of one image's crops' features, per backbone.
    let len: Vec<usize> = (0..raw.len())
        .map(|b| per[b] * fne.backbone_dim(b))
        .collect();
    let mut out: Vec<ImageEmbedding> = images
        .into_iter()
        .enumerate()
        .map(|(i, ((width, height), thumbnail))| ImageEmbedding {
            code: fne.code(
                &raw.iter()
                    .zip(&len)
                    .map(|(r, &l)| &r[i * l..(i + 1) * l])
                    .collect::<Vec<_>>(),
            ),
            vector: Vec::new(),
            offset: 0.0,
            width,
            height,
            thumbnail,
        })
        .collect();
    let codes: Vec<&TernaryCode> = out.iter().map(|e| &e.code).collect();
    let vectors = projection.project_all(&codes);
    for (e, v) in out.iter_mut().zip(vectors) {
        e.vector = v;
    }
    if purpose == ImageUse::Store {
        let vectors: Vec<&[f32]> = out.iter().map(|e| e.vector.as_slice()).collect();
        let offsets = hubness::offsets(bundle.hubness.as_deref(), &vectors);
        for (e, o) in out.iter_mut().zip(offsets) {
            e.offset = o;
        }
    }
    out
}

/// One image off the blocking pool: each backbone's crops, its size, its thumbnail (when one is made).
type Decoded = (Vec<Vec<f32>>, u32, u32, Option<Vec<u8>>);

/// Runs CPU work on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, EmbedError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| EmbedError::Runtime(RuntimeError::Run(e.to_string())))
}
