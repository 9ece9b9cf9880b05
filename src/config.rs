//! The command line: one binary, every flag with an environment fallback.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::{
    bundle::CropMode,
    runtime::{ConvSearch, Device, RuntimeOptions},
};

#[derive(Debug, Parser)]
#[command(
    name = "jointspace",
    version,
    about = "Find photos from a sentence and sentences for a photo"
)]
pub struct Cli {
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, env = "JOINTSPACE_LOG_JSON", global = true, value_parser = clap::builder::FalseyValueParser::new())]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API.
    Serve(ServeArgs),
    /// Add a folder of images (and a captions file) to a collection, through the server's code path.
    Ingest(IngestArgs),
    /// Ingest a dataset split into a scratch database and measure retrieval (R@1/5/10, median rank).
    Eval(EvalArgs),
    /// Model bundle tools.
    Bundle {
        #[command(subcommand)]
        command: BundleCommand,
    },
    /// Recompute every stored vector with the loaded bundle: image vectors from their stored ternary codes and
    /// the new W (no CNN), caption vectors with the new text model.
    Reindex(ReindexArgs),
    /// Write a collection as JSON lines (images with their codes, metadata, captions and thumbnails), read at
    /// one point in time: a backup that `import` restores without the CNN.
    Export(ExportArgs),
    /// Restore a collection from an export (no CNN: codes are projected by the loaded bundle), or add a JSONL
    /// catalogue of `{path, external_id, metadata, captions}` items (embedded); resumable.
    Import(ImportArgs),
    /// Make a collection equal to a shop's catalogue feed (CSV or JSON lines): new items added, changed
    /// photos embedded again (and photos coded by another vision model, after a bundle change), changed text
    /// or attributes written without the CNN, items gone from the feed deleted (up to --max-delete-share); a
    /// rerun changes nothing.
    Sync(SyncArgs),
}

#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Verify a bundle (checksums, shapes) and print what it holds.
    Inspect {
        dir: PathBuf,
        /// Also open the ONNX graphs with ONNX Runtime.
        #[arg(long, env = "JOINTSPACE_INSPECT_GRAPHS", value_parser = clap::builder::FalseyValueParser::new())]
        graphs: bool,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
}

/// Where ONNX Runtime comes from and where it runs.
#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// libonnxruntime.so; default: .venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub ort_dylib: Option<PathBuf>,
    /// Execution provider: `cpu`; `cuda` (refuses to start when ONNX Runtime cannot use CUDA); `auto` (CUDA
    /// when it can be used, else the CPU, with a warning saying why).
    #[arg(long, env = "JOINTSPACE_DEVICE", value_enum, default_value = "cpu")]
    pub device: Device,
    /// Intra-op threads of the vision session (default: ONNX Runtime's choice, all cores); the text session
    /// always runs on one (docs/benchmarks.md).
    #[arg(long, env = "JOINTSPACE_INTRA_THREADS")]
    pub intra_threads: Option<usize>,
    /// Give inference memory back after each run: ONNX Runtime's CPU arena and memory pattern off. Default:
    /// `true` for `serve` (with the ten-crop bundle, resident memory after ingesting photos about 470 MB instead
    /// of 1.4 GB, about 220 MB with glibc's `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304`, which the
    /// container and manifests set; docs/operations.md, "Memory"); `false` for the batch commands (`ingest`,
    /// `eval`, `sync`, `reindex`), where the pages given back and faulted in again on every run cost the windowed
    /// default 1.9x in photos/s (a third of its CPU time in the kernel; docs/benchmarks.md, "Bulk ingest").
    #[arg(long, env = "JOINTSPACE_RELEASE_INFERENCE_MEMORY",
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub release_inference_memory: Option<bool>,
    /// How cuDNN chooses convolution algorithms on CUDA: `heuristic` at once; `exhaustive` times them all on
    /// every new batch shape, which the dynamic batcher makes many of (docs/benchmarks.md, "GPU").
    #[arg(
        long,
        env = "JOINTSPACE_CUDNN_CONV_SEARCH",
        value_enum,
        default_value = "heuristic"
    )]
    pub cudnn_conv_search: ConvSearch,
    /// Sessions of each vision graph, so that as many runtime calls run at once. Default: 2 on CUDA (one
    /// call's copies and host work overlap the other's kernels), 1 on the CPU (one call has every core).
    #[arg(long, env = "JOINTSPACE_VISION_SESSIONS", value_parser = clap::value_parser!(u16).range(1..=16))]
    pub vision_sessions: Option<u16>,
    /// CUDA: float32 convolutions and matrix products on the tensor cores in TF32 (ONNX Runtime's own
    /// default is off: a float32 graph then runs at the GPU's plain float32 rate; docs/benchmarks.md, "GPU").
    #[arg(long, env = "JOINTSPACE_CUDA_TF32", default_value = "on", value_name = "on|off",
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub cuda_tf32: bool,
    /// CUDA: convolutions in NHWC layout (ONNX Runtime's `prefer_nhwc`), which the tensor cores prefer.
    #[arg(long, env = "JOINTSPACE_CUDA_NHWC", default_value = "off", value_name = "on|off",
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub cuda_nhwc: bool,
}

impl ModelArgs {
    /// `--max-batch-crops`, or its default for the device.
    pub fn max_batch_crops(&self) -> usize {
        self.max_batch_crops
            .unwrap_or(if self.runtime.device == Device::Cuda {
                256
            } else {
                32
            })
    }
}

impl RuntimeArgs {
    pub fn options(&self) -> RuntimeOptions {
        RuntimeOptions {
            device: self.device,
            intra_threads: self.intra_threads,
            release_memory: self.release_inference_memory.unwrap_or(true),
            conv_search: self.cudnn_conv_search,
            vision_sessions: self.vision_sessions.map(usize::from),
            tf32: self.cuda_tf32,
            nhwc: self.cuda_nhwc,
        }
    }
}

/// The model bundle and how inputs are turned into vectors.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Model bundle directory (docs/bundle.md).
    #[arg(
        long,
        env = "JOINTSPACE_BUNDLE",
        default_value = "models/flickr8k-vgg16-effnetl2-fne"
    )]
    pub bundle: PathBuf,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Override the bundle's crop mode (`ten` is the paper's 10-crop procedure, 10x the CNN cost). `center`
    /// and `ten` share one graph; a `windowed` bundle has its own, so it neither takes nor gives them. A
    /// bundle with several backbones runs each in its own mode and takes only the mode they all have.
    #[arg(long, env = "JOINTSPACE_CROP_MODE", value_enum)]
    pub crop_mode: Option<CropMode>,
    /// Most crops in one runtime call (requests queued together are batched up to this; a photo's crops are
    /// never split). Default: 32 on the CPU, 4 for the batch commands there (they keep ONNX Runtime's arena,
    /// which holds the largest run's buffers: 0.9 GB at 4 crops against 3.0 GB at 32 for the windowed default,
    /// at the same photos/s); 256 with `--device cuda`, the windowed default's best on an H100 (381 photos/s
    /// against 214 at 16; docs/benchmarks.md, "GPU").
    #[arg(long, env = "JOINTSPACE_MAX_BATCH_CROPS")]
    pub max_batch_crops: Option<usize>,
    /// Milliseconds a runtime call waits for concurrent requests to join a batch that is not full. Default:
    /// 0 on the CPU (a free core starts at once; what arrives meanwhile forms the next batch, and holding
    /// the batch open only added latency: text search at 200 req/s, p99 21 ms with 2 ms, 15 ms with 0),
    /// 2 on CUDA, where one call per request would leave the device idle between small runs.
    #[arg(long, env = "JOINTSPACE_BATCH_WAIT_MS")]
    pub batch_wait_ms: Option<u64>,
    /// Pad each vision call with black crops to the next power of two (at most --max-batch-crops), so the
    /// runtime sees a few shapes, not every row count. Default: on with CUDA, which plans each new shape (it
    /// cost EfficientNet-Lite2 over a second a call; docs/benchmarks.md, "GPU"); off on the CPU, where a
    /// padded row costs as much as a real one.
    #[arg(long, env = "JOINTSPACE_PAD_BATCHES", value_name = "on|off",
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub pad_batches: Option<bool>,
    /// With padded batches: before serving, run a black call of every padded shape through every vision
    /// session, so no request waits for the runtime to plan one. On a GPU that planning is 0.4-1.2 s a shape
    /// and session for VGG16 and 3-5 s for EfficientNet-Lite2 (docs/benchmarks.md, "GPU: a second round on an
    /// H200"), so the start takes that much longer.
    #[arg(long, env = "JOINTSPACE_WARM_BATCH_SHAPES", default_value = "off", value_name = "on|off",
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub warm_batch_shapes: bool,
    /// Most crops (vision) or sentences (text) waiting for inference; requests beyond it get 429 at once.
    #[arg(long, env = "JOINTSPACE_INFERENCE_QUEUE", default_value_t = 256)]
    pub inference_queue: usize,
    /// Longest expected wait for inference (rows queued x measured time per row) a request is admitted to,
    /// in milliseconds; beyond it, 429 at once. 0: only --inference-queue bounds the queue.
    #[arg(long, env = "JOINTSPACE_MAX_QUEUE_WAIT_MS", default_value_t = 2000)]
    pub max_queue_wait_ms: u64,
    /// Largest accepted image file, bytes.
    #[arg(long, env = "JOINTSPACE_MAX_IMAGE_BYTES", default_value_t = 20 << 20)]
    pub max_image_bytes: usize,
    /// Largest accepted image, width x height (checked before decoding: decompression bombs are refused).
    #[arg(
        long,
        env = "JOINTSPACE_MAX_IMAGE_PIXELS",
        default_value_t = 40_000_000
    )]
    pub max_image_pixels: u64,
    /// Smallest accepted image side, pixels.
    #[arg(long, env = "JOINTSPACE_MIN_IMAGE_SIDE", default_value_t = 16)]
    pub min_image_side: u32,
    /// Longest accepted sentence, characters.
    #[arg(long, env = "JOINTSPACE_MAX_TEXT_CHARS", default_value_t = 1000)]
    pub max_text_chars: usize,
    /// Keep a thumbnail of every added image (JPEG, longest side 256 px, a few KB, in the database), served
    /// at GET /v1/collections/{c}/images/{id}/thumbnail and shown by the search page. `off` skips it.
    #[arg(long, env = "JOINTSPACE_THUMBNAILS", default_value = "on", value_name = "on|off",
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub thumbnails: bool,
}

/// `--index`: the service's `IndexBackend`, as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IndexMode {
    Memory,
    Database,
}

/// The database and the indexes built from it.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Database URL: `sqlite://PATH` (the file and its folder are created if missing) or
    /// `postgres://USER:PASSWORD@HOST:PORT/DB` (several replicas may share one Postgres).
    #[arg(
        long,
        env = "JOINTSPACE_DATABASE_URL",
        default_value = "sqlite://data/jointspace.db"
    )]
    pub database_url: String,
    /// Seconds a request waits for a database connection before failing with 503 (database down or busy).
    #[arg(long, env = "JOINTSPACE_DATABASE_TIMEOUT", default_value_t = 5)]
    pub database_timeout: u64,
    /// Postgres connections this process opens at most (default: twice its cores, at least 4): more queries at
    /// once than the cores can run only queue inside Postgres, each holding a connection.
    #[arg(long, env = "JOINTSPACE_DATABASE_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    pub database_connections: Option<u32>,
    /// Where the vector index lives: `memory` (an HNSW graph per collection in this process, built or loaded
    /// from a snapshot at start) or `database` (Postgres with pgvector 0.8: vectors and HNSW indexes in the
    /// database, written with the rows; the process holds no graph and starts at once; docs/storage.md).
    #[arg(long, env = "JOINTSPACE_INDEX", value_enum, default_value = "memory")]
    pub index: IndexMode,
    /// Where index snapshots go (default: an `index` folder next to the database file).
    #[arg(long, env = "JOINTSPACE_INDEX_DIR")]
    pub index_dir: Option<PathBuf>,
    /// Collections (or filtered subsets) smaller than this are searched exactly instead of through HNSW (either
    /// index also scans a filter's matches whenever that costs less than the walk).
    #[arg(long, env = "JOINTSPACE_EXACT_BELOW", default_value_t = 2000)]
    pub exact_below: usize,
    /// HNSW search breadth (higher: better recall, slower). Unset: from each collection's size, 112 up to
    /// 100,000 images rising to 1000 at 1M, which keeps recall@10 near 0.95 or above (docs/storage.md).
    #[arg(long, env = "JOINTSPACE_EF_SEARCH", value_parser = clap::value_parser!(u32).range(1..))]
    pub ef_search: Option<u32>,
    /// Links per point in the memory index's graphs (more: better recall at a given breadth, more memory and
    /// a slower build). A graph loaded from a snapshot keeps its own; the next build takes this.
    #[arg(long, env = "JOINTSPACE_HNSW_M", value_parser = clap::value_parser!(u32).range(2..=128),
          default_value_t = jointspace_service::DEFAULT_MAX_CONNECTIONS as u32)]
    pub hnsw_m: u32,
    /// The memory index's search breadth while it builds a graph (more: a better graph, a slower build).
    #[arg(long, env = "JOINTSPACE_HNSW_EF_CONSTRUCTION", value_parser = clap::value_parser!(u32).range(4..=2000),
          default_value_t = jointspace_service::DEFAULT_EF_CONSTRUCTION as u32)]
    pub hnsw_ef_construction: u32,
    /// Largest `k` a search may ask for.
    #[arg(long, env = "JOINTSPACE_MAX_K", default_value_t = 1000)]
    pub max_k: usize,
    /// Most images in one add request.
    #[arg(long, env = "JOINTSPACE_MAX_BATCH", default_value_t = 64)]
    pub max_batch: usize,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "JOINTSPACE_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Largest request body, bytes (a batch of uploads).
    #[arg(long, env = "JOINTSPACE_MAX_REQUEST_BYTES", default_value_t = 64 << 20)]
    pub max_request_bytes: usize,
    /// Seconds between index snapshots when something changed (0: only at shutdown).
    #[arg(long, env = "JOINTSPACE_SNAPSHOT_INTERVAL", default_value_t = 300)]
    pub snapshot_interval: u64,
    /// Milliseconds between reads of the database's change sequence, through which this process's indexes
    /// follow writes made by other replicas sharing the database (0: never).
    #[arg(long, env = "JOINTSPACE_FOLLOW_INTERVAL_MS", default_value_t = 500)]
    pub follow_interval_ms: u64,
    /// Milliseconds a running sync job (`POST /v1/collections/{name}/sync`) may go without its server's
    /// heartbeat (every sixth of it) before another server, or this one restarted, runs it again.
    #[arg(long, env = "JOINTSPACE_SYNC_JOB_LEASE_MS", default_value_t = 30_000)]
    pub sync_job_lease_ms: u64,
    /// Milliseconds `/readyz` waits for a probe inference through each model's worker (and for the
    /// database); a worker that does not answer in time (wedged, or busy behind a long queue) is not ready.
    #[arg(
        long,
        env = "JOINTSPACE_READY_PROBE_TIMEOUT_MS",
        default_value_t = 2000
    )]
    pub ready_probe_timeout_ms: u64,
    /// Milliseconds the indexes may go without catching up with the database's change sequence before
    /// `/readyz` reports them stale (with --follow-interval-ms 0 nothing is followed and this is not checked).
    #[arg(long, env = "JOINTSPACE_READY_MAX_LAG_MS", default_value_t = 5000)]
    pub ready_max_lag_ms: u64,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub url_ingest: UrlIngestArgs,
}

/// Images given by URL (`{"url": ...}` in place of `data`), which the server fetches itself.
#[derive(Debug, Clone, Default, Args)]
pub struct UrlIngestArgs {
    /// Accept images by URL: the server fetches them over http(s), refusing loopback, private, link-local
    /// (cloud metadata), CGNAT, multicast and reserved addresses, after DNS resolution and on every redirect
    /// (docs/api.md, "URL ingest"). Off by default: a server that can reach an internal network should not
    /// fetch URLs for its callers unless that is wanted.
    #[arg(long, env = "JOINTSPACE_URL_INGEST", value_parser = clap::builder::FalseyValueParser::new())]
    pub url_ingest: bool,
    /// Address ranges URL ingest may reach although they are forbidden (comma-separated CIDRs, e.g.
    /// `10.20.0.0/16,fd00:1::/64`): an internal image store. Public addresses need no entry.
    #[arg(long, env = "JOINTSPACE_URL_INGEST_ALLOW", value_delimiter = ',')]
    pub url_ingest_allow: Vec<String>,
    /// Milliseconds one fetch may take, from connecting to the body's last byte, redirects included.
    #[arg(
        long,
        env = "JOINTSPACE_URL_INGEST_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub url_ingest_timeout_ms: u64,
    /// Largest fetched image, bytes (default: --max-image-bytes); a longer answer is cut off and refused.
    #[arg(long, env = "JOINTSPACE_URL_INGEST_MAX_BYTES")]
    pub url_ingest_max_bytes: Option<usize>,
    /// Fetches in flight at once in this server (every request together); the others wait for a turn.
    #[arg(long, env = "JOINTSPACE_URL_INGEST_CONCURRENCY", default_value_t = 8)]
    pub url_ingest_concurrency: usize,
}

/// Who may call the API, and how much a request may ask for.
#[derive(Debug, Clone, Default, Args)]
pub struct HttpArgs {
    /// API key for everything (writes, deletes, admin, and reads), sent as `Authorization: Bearer <key>`.
    /// With no key configured at all the API is open (the log says so).
    #[arg(long, env = "JOINTSPACE_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,
    /// File holding the admin key (a mounted secret); surrounding whitespace is ignored.
    #[arg(long, env = "JOINTSPACE_ADMIN_KEY_FILE", conflicts_with = "admin_key")]
    pub admin_key_file: Option<PathBuf>,
    /// API key for reads only: GET, search and embed.
    #[arg(long, env = "JOINTSPACE_READ_KEY", hide_env_values = true)]
    pub read_key: Option<String>,
    /// File holding the read-only key.
    #[arg(long, env = "JOINTSPACE_READ_KEY_FILE", conflicts_with = "read_key")]
    pub read_key_file: Option<PathBuf>,
    /// Named keys (TOML): each with a role (admin, write, read), optionally the collections it may use and
    /// its request and row rates (docs/operations.md, "API keys"). Beside the two keys above, which are
    /// named admin and read.
    #[arg(long, env = "JOINTSPACE_KEYS_FILE")]
    pub keys_file: Option<PathBuf>,
    /// Seconds a request may take before it is answered 503 (0: no limit).
    #[arg(long, env = "JOINTSPACE_REQUEST_TIMEOUT", default_value_t = 120)]
    pub request_timeout: u64,
    /// Milliseconds a request's body may take to arrive after its headers; a client that stalls or trickles
    /// it gets 408 and its connection closed (0: no limit of its own, only --request-timeout).
    #[arg(
        long,
        env = "JOINTSPACE_BODY_READ_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub body_read_timeout_ms: u64,
    /// Browser origins allowed to call the API (comma-separated; `*` for any). None: no CORS headers.
    #[arg(long, env = "JOINTSPACE_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,
}

#[derive(Debug, Clone, Args)]
pub struct IngestArgs {
    /// Folder of images.
    #[arg(long, env = "JOINTSPACE_INGEST_IMAGES")]
    pub images: PathBuf,
    /// Captions file in Flickr8k token format (`<image>#<n>\t<caption>` per line).
    #[arg(long, env = "JOINTSPACE_INGEST_CAPTIONS")]
    pub captions: Option<PathBuf>,
    /// Only the images named in this file (one file name per line).
    #[arg(long, env = "JOINTSPACE_INGEST_LIST")]
    pub list: Option<PathBuf>,
    /// Collection to add to (created if missing).
    #[arg(long, env = "JOINTSPACE_COLLECTION", default_value = "default")]
    pub collection: String,
    /// Images per add request.
    #[arg(long, env = "JOINTSPACE_INGEST_BATCH", default_value_t = 8)]
    pub batch: usize,
    /// Requests in flight.
    #[arg(long, env = "JOINTSPACE_INGEST_CONCURRENCY", default_value_t = 2)]
    pub concurrency: usize,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// Dataset folder (Flickr8k layout: images/, Flickr8k.token.txt, Flickr_8k.<split>Images.txt). No default:
    /// no path is the same on every machine.
    #[arg(long, env = "JOINTSPACE_EVAL_DATA")]
    pub data: Option<PathBuf>,
    /// train, dev or test.
    #[arg(long, env = "JOINTSPACE_EVAL_SPLIT", default_value = "test")]
    pub split: String,
    /// Print the metrics as JSON.
    #[arg(long, env = "JOINTSPACE_EVAL_JSON", value_parser = clap::builder::FalseyValueParser::new())]
    pub json: bool,
    /// Only the first N images of the split (a quick check).
    #[arg(long, env = "JOINTSPACE_EVAL_LIMIT")]
    pub limit: Option<usize>,
    /// Scratch database (default: in memory).
    #[arg(
        long,
        env = "JOINTSPACE_EVAL_DATABASE_URL",
        default_value = "sqlite::memory:"
    )]
    pub database_url: String,
    #[arg(long, env = "JOINTSPACE_EVAL_BATCH", default_value_t = 8)]
    pub batch: usize,
    #[arg(long, env = "JOINTSPACE_EVAL_CONCURRENCY", default_value_t = 2)]
    pub concurrency: usize,
    /// Also measure hybrid search: each image keeps its first caption as its `title` text field and its other
    /// four are the queries, by each channel alone (vector, text, keyword) and fused (docs/api.md, "Hybrid
    /// search").
    #[arg(long, env = "JOINTSPACE_EVAL_HYBRID", value_parser = clap::builder::FalseyValueParser::new())]
    pub hybrid: bool,
    /// With --hybrid: also every weighting of the three channels on a 0.1 grid, per fusion method (the five
    /// best of each), measured on the same candidates: how the served weights were chosen (on --split dev).
    #[arg(long, env = "JOINTSPACE_EVAL_FUSION_SWEEP", value_parser = clap::builder::FalseyValueParser::new())]
    pub fusion_sweep: bool,
    /// With --hybrid: products of this many photos (1 to 3): the split's photos taken in order, N at a time,
    /// as one product each (a collection grouped by product, each photo titled by its own first caption, so
    /// the product's words describe each of its photos), each photo's other four captions the queries for its
    /// product, ranked among all products.
    #[arg(long, env = "JOINTSPACE_EVAL_PHOTOS_PER_PRODUCT", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    pub photos_per_product: u8,
    #[command(flatten)]
    pub model: ModelArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ReindexArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Rows staged per transaction. Smaller pages hold the database's write lock for less time at a time
    /// (SQLite has one writer); nothing is visible until the final switch whatever the page.
    #[arg(long, env = "JOINTSPACE_REINDEX_PAGE_ROWS", default_value_t = crate::service::REINDEX_PAGE_ROWS)]
    pub page_rows: usize,
}

#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The collection to export.
    pub collection: String,
    /// Where to write (default: standard output).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    /// An export (`jointspace export`, or GET /v1/collections/{c}/export), or a catalogue: one JSON object per
    /// line with `path` (relative to the file's folder) or `url` (fetched with --url-ingest), and optional
    /// `external_id`, `metadata` and `captions`.
    pub file: PathBuf,
    /// The collection to import into, created if missing (default: an export's own name).
    #[arg(long, env = "JOINTSPACE_COLLECTION")]
    pub collection: Option<String>,
    /// Images per transaction.
    #[arg(long, env = "JOINTSPACE_IMPORT_BATCH", default_value_t = 64)]
    pub batch: usize,
    /// A catalogue photo whose URL cannot be fetched (or is not an image) is reported and left out, and the
    /// import goes on; without it the import stops at that photo's batch, and a rerun resumes there.
    #[arg(long, env = "JOINTSPACE_IMPORT_SKIP_FAILED", value_parser = clap::builder::FalseyValueParser::new())]
    pub skip_failed: bool,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Catalogue photos given by `url` are fetched as the server's URL ingest fetches them (--url-ingest,
    /// the same address guard, allow-list and limits).
    #[command(flatten)]
    pub url_ingest: UrlIngestArgs,
}

/// How a feed file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FeedFormat {
    /// By the file's extension (`.csv`; `.jsonl`, `.ndjson`, `.json`), else by its first character (`{`:
    /// JSON lines).
    Auto,
    /// A header row naming the columns, then one product per record (RFC 4180 quoting).
    Csv,
    /// One JSON object per line.
    Jsonl,
}

#[derive(Debug, Clone, Args)]
pub struct SyncArgs {
    /// The collection the feed describes.
    #[arg(long, env = "JOINTSPACE_COLLECTION")]
    pub collection: String,
    /// The feed: one product per CSV record or JSON line, with its id, its photo (a path relative to the
    /// feed's folder, or an http(s) URL fetched with --url-ingest), optional captions, and any other fields,
    /// which become the image's metadata.
    #[arg(long, env = "JOINTSPACE_SYNC_FEED")]
    pub feed: PathBuf,
    #[arg(
        long,
        env = "JOINTSPACE_SYNC_FORMAT",
        value_enum,
        default_value = "auto"
    )]
    pub format: FeedFormat,
    /// The field holding the product's id (the image's external id).
    #[arg(long, env = "JOINTSPACE_SYNC_ID_FIELD", default_value = "id")]
    pub id_field: String,
    /// The field holding the photo's path or URL.
    #[arg(long, env = "JOINTSPACE_SYNC_IMAGE_FIELD", default_value = "image")]
    pub image_field: String,
    /// The field holding captions: a JSON array of strings (or one string), in CSV separated by `|`.
    #[arg(
        long,
        env = "JOINTSPACE_SYNC_CAPTIONS_FIELD",
        default_value = "captions"
    )]
    pub captions_field: String,
    /// Fields whose text is also a caption (e.g. `title`), embedded by the text model; they stay in metadata.
    #[arg(long, env = "JOINTSPACE_SYNC_CAPTION_FIELDS", value_delimiter = ',')]
    pub caption_fields: Vec<String>,
    /// CSV columns read as numbers (e.g. `price,stock`), so that filters can compare them; other CSV cells
    /// are strings. JSON lines keep their own types.
    #[arg(long, env = "JOINTSPACE_SYNC_NUMBER_FIELDS", value_delimiter = ',')]
    pub number_fields: Vec<String>,
    /// Print what the sync would do and write nothing (photos are still read, to tell a new photo from an
    /// unchanged one).
    #[arg(long, env = "JOINTSPACE_SYNC_DRY_RUN", value_parser = clap::builder::FalseyValueParser::new())]
    pub dry_run: bool,
    /// The largest share (0 to 1) of the collection's items with an external id that a feed may withdraw;
    /// past it the sync refuses before writing anything, so a feed cut short cannot wipe a catalogue.
    #[arg(long, env = "JOINTSPACE_SYNC_MAX_DELETE_SHARE", default_value_t = crate::service::DEFAULT_MAX_DELETE_SHARE)]
    pub max_delete_share: f64,
    /// Create the collection when it does not exist (without it, a missing collection is an error).
    #[arg(long, env = "JOINTSPACE_SYNC_CREATE", value_parser = clap::builder::FalseyValueParser::new())]
    pub create: bool,
    /// With --create: the new collection's text fields, searched by meaning and as keywords (e.g.
    /// `title,description^0.5`: a weight after `^`, from 0 to 10, scales a field's sentences by meaning; 0 reads
    /// it as keywords only).
    #[arg(long, env = "JOINTSPACE_SYNC_TEXT_FIELDS", value_delimiter = ',', value_parser = crate::service::TextField::parse_arg)]
    pub text_fields: Vec<crate::service::TextField>,
    /// With --create: the new collection's product key (e.g. `product_id`), a metadata field set to each
    /// item's id unless the feed gives it. Needed for items with several photos (a JSON list in the image
    /// field, or paths or URLs separated by `|` in a CSV cell): each photo is stored as an image of the
    /// product, the n-th under `<id>~<n>`, and a search returns each product once.
    #[arg(long, env = "JOINTSPACE_SYNC_GROUP_BY")]
    pub group_by: Option<String>,
    /// An item whose photo cannot be read, fetched or decoded is reported and left as it is stored, and the
    /// sync goes on; without it the sync stops at that item (what came before it is in; run again).
    #[arg(long, env = "JOINTSPACE_SYNC_SKIP_FAILED", value_parser = clap::builder::FalseyValueParser::new())]
    pub skip_failed: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, env = "JOINTSPACE_SYNC_REPORT")]
    pub report: Option<PathBuf>,
    /// Items read and written at once (their photos are embedded in shared batches).
    #[arg(long, env = "JOINTSPACE_SYNC_CONCURRENCY", default_value_t = 4)]
    pub concurrency: usize,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Photos given by URL are fetched as the server's URL ingest fetches them (--url-ingest, the same
    /// address guard, allow-list and limits).
    #[command(flatten)]
    pub url_ingest: UrlIngestArgs,
}

#[derive(Debug, Parser)]
struct ServeOnly {
    #[command(flatten)]
    serve: ServeArgs,
}

impl ServeArgs {
    /// Parses `serve` flags (with their environment fallbacks) from a list: for tests and embedders.
    pub fn try_from_flags<I: IntoIterator<Item = S>, S: Into<std::ffi::OsString> + Clone>(
        flags: I,
    ) -> Result<ServeArgs, clap::Error> {
        let args = std::iter::once(std::ffi::OsString::from("jointspace"))
            .chain(flags.into_iter().map(Into::into));
        Ok(ServeOnly::try_parse_from(args)?.serve)
    }
}
