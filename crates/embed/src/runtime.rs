//! The inference runtime behind one trait, so the pipeline does not care whether ONNX Runtime runs on the
//! CPU or CUDA (and a future runtime only implements `Backend`). ONNX Runtime is loaded dynamically from
//! the PyPI wheel's shared library: `ort`'s own binary download cannot work offline.

use std::{
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock},
};

use ort::{
    ep::{self, ExecutionProvider},
    session::{Session, builder::GraphOptimizationLevel},
    value::TensorRef,
};

use crate::bundle::{Bundle, VisionSpec};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "no ONNX Runtime library: pass --ort-dylib or set ORT_DYLIB_PATH to libonnxruntime.so \
         (scripts/setup-python.sh installs it under .venv/lib/python3*/site-packages/onnxruntime/capi/)"
    )]
    NoLibrary,
    #[error("cannot load ONNX Runtime from {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("{graph}: {message}")]
    Graph { graph: String, message: String },
    /// `--device cuda` and CUDA cannot run the graphs: refusing beats a server that
    /// silently runs on the CPU.
    #[error(
        "--device cuda, but ONNX Runtime cannot use the CUDA execution provider ({0}). It needs onnxruntime-gpu's \
         1.31.1 library (ORT_DYLIB_PATH), CUDA 13 and cuDNN 9 and an NVIDIA GPU visible to this \
         process; or start with --device auto (CUDA when it works, else the CPU) or --device cpu"
    )]
    NoCuda(String),
    #[error("inference failed: {0}")]
    Run(String),
    #[error("the inference worker has stopped")]
    Stopped,
    /// A readiness probe waited this long for the worker (wedged, or busy behind that many rows).
    #[error(
        "the inference worker did not answer a probe within {waited_ms} ms ({queued} rows queued)"
    )]
    Unresponsive { waited_ms: u64, queued: usize },
    #[error(
        "the server is at capacity: its inference queue is full (at most {queue} crops or sentences, and no more than the wait it admits); retry shortly"
    )]
    Overloaded { queue: usize },
}

/// What `--device` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// The CPU execution provider.
    Cpu,
    /// CUDA, or refuse to start.
    Cuda,
    /// CUDA when it can be used, else the CPU (the log says which, and why).
    Auto,
}

/// How cuDNN picks each convolution's algorithm on CUDA (`--cudnn-conv-search`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ConvSearch {
    /// cuDNN's heuristics, at once. The batcher sends many batch sizes, and each new input shape would
    /// otherwise pay a search of its own (docs/benchmarks.md, "GPU").
    Heuristic,
    /// Time every algorithm on each new input shape and keep the fastest (ONNX Runtime's default).
    Exhaustive,
    /// cuDNN's default algorithm.
    Default,
}

/// How the graphs' sessions are opened.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeOptions {
    pub device: Device,
    /// Intra-op threads of the vision session (None: ONNX Runtime's choice).
    pub intra_threads: Option<usize>,
    /// Give each run's buffers back when it ends (`--release-inference-memory`).
    pub release_memory: bool,
    pub conv_search: ConvSearch,
    /// Sessions per vision graph, so that as many runtime calls run at once: on CUDA one call's copies and
    /// host work overlap another's kernels (`--vision-sessions`). None: 2 on CUDA, 1 on the CPU (whose
    /// one call already has every core).
    pub vision_sessions: Option<usize>,
    /// CUDA: float32 convolutions and products on the tensor cores in TF32 (`--cuda-tf32`). ONNX Runtime's
    /// default is off, which leaves a float32 graph at the GPU's plain float32 rate (docs/benchmarks.md, "GPU").
    pub tf32: bool,
    /// CUDA: convolutions in NHWC layout, which the tensor cores prefer (`--cuda-nhwc`).
    pub nhwc: bool,
}

impl RuntimeOptions {
    /// The CPU, as the server runs there by default.
    pub fn cpu(intra_threads: Option<usize>) -> RuntimeOptions {
        RuntimeOptions {
            device: Device::Cpu,
            intra_threads,
            release_memory: true,
            conv_search: ConvSearch::Heuristic,
            vision_sessions: None,
            tf32: true,
            nhwc: false,
        }
    }
}

/// The execution provider that actually runs the graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Cpu,
    Cuda,
}

impl Provider {
    /// As `--device` spells it: the label of `/metrics`' gauge and `/readyz`' field.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Cpu => "cpu",
            Provider::Cuda => "cuda",
        }
    }

    /// ONNX Runtime's name for it (as `/v1/bundle` reports it).
    pub fn ort_name(self) -> &'static str {
        match self {
            Provider::Cpu => "CPUExecutionProvider",
            Provider::Cuda => "CUDAExecutionProvider",
        }
    }
}

/// Runs the bundle's graphs: a vision graph per backbone and the text graph. Inputs are borrowed, outputs are
/// row-major `[n, dim]`.
pub trait Backend: Send + Sync {
    /// The execution provider that actually runs (for logs, /readyz, /metrics and /v1/bundle).
    fn provider(&self) -> Provider;
    /// Backbone `graph`'s vision graph (0: the first, in code order; `Manifest::backbones`).
    /// `crops`: `[n, 3, side, side]` NCHW float32 -> `[n, raw_dim]`.
    fn vision(
        &self,
        graph: usize,
        crops: &[f32],
        n: usize,
        side: usize,
    ) -> Result<Vec<f32>, RuntimeError>;
    /// `ids`: `[n, t]` right-padded, `lengths`: `[n]` -> `[n, joint_dim]` (n and t follow from the two
    /// lengths, so they cannot disagree with the data).
    fn text(&self, ids: &[i64], lengths: &[i64]) -> Result<Vec<f32>, RuntimeError>;
    /// How many `vision` calls of one graph can run at once (its sessions).
    fn vision_sessions(&self) -> usize {
        1
    }
    /// Runs `crops` through every session of backbone `graph`, so each has planned that shape
    /// (`--warm-batch-shapes`); the answer is dropped.
    fn warm_vision(
        &self,
        graph: usize,
        crops: &[f32],
        n: usize,
        side: usize,
    ) -> Result<(), RuntimeError> {
        self.vision(graph, crops, n, side).map(drop)
    }
}

/// Finds the ONNX Runtime library: the flag / ORT_DYLIB_PATH first, then the project's virtualenv.
pub fn locate_dylib(explicit: Option<&Path>) -> Result<PathBuf, RuntimeError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let lib = Path::new(".venv/lib");
    let mut found: Vec<PathBuf> = std::fs::read_dir(lib)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .flat_map(|e| {
            std::fs::read_dir(e.path().join("site-packages/onnxruntime/capi"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libonnxruntime.so"))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|p| std::path::absolute(&p).unwrap_or(p))
        .ok_or(RuntimeError::NoLibrary)
}

/// ONNX Runtime can be initialised once per process; later calls must agree on the library.
fn init_ort(dylib: &Path) -> Result<ort::environment::Environment, RuntimeError> {
    static ENV: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();
    let res = ENV.get_or_init(|| {
        if !dylib.exists() {
            return Err("file not found".to_string());
        }
        ort::init_from(dylib)
            .map_err(|e| e.to_string())
            .and_then(|b| b.with_name("jointspace").build().map_err(|e| e.to_string()))
    });
    res.clone().map_err(|message| RuntimeError::Load {
        path: dylib.to_path_buf(),
        message,
    })
}

pub struct OrtBackend {
    provider: Provider,
    // `Session::run` needs `&mut`; the batchers call from one thread each, so these locks are uncontended.
    /// One session per backbone, in code order.
    vision: Vec<VisionSession>,
    text: Mutex<Session>,
    text_io: (String, String, String),
}

/// A backbone's vision graph (as many sessions of it as calls may run at once), its input and output names.
struct VisionSession {
    sessions: Vec<Mutex<Session>>,
    io: (String, String),
}

impl OrtBackend {
    pub fn new(
        bundle: &Bundle,
        dylib: &Path,
        o: RuntimeOptions,
    ) -> Result<OrtBackend, RuntimeError> {
        let env = init_ort(dylib)?;
        let m = &bundle.manifest;
        let (first, provider) = open(&env, &bundle.path(&m.vision.onnx), o)?;
        // The other graphs on the provider the first vision graph got: `auto` has decided (and said so) once.
        let decided = RuntimeOptions {
            device: match provider {
                Provider::Cpu => Device::Cpu,
                Provider::Cuda => Device::Cuda,
            },
            ..o
        };
        let mut first = Some(first);
        let sessions = o.vision_sessions.unwrap_or(match provider {
            Provider::Cuda => 2,
            Provider::Cpu => 1,
        });
        let vision = m
            .backbones()
            .map(|b| {
                let path = bundle.path(&b.vision.onnx);
                let sessions = (0..sessions.max(1))
                    .map(|_| match first.take() {
                        Some(s) => Ok(s),
                        None => open(&env, &path, decided).map(|(s, _)| s),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                vision_session(sessions, b.vision)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The text graph is a GRU: one small step after another, where a second intra-op thread costs more in
        // hand-offs than it gives (one sentence: 3.8 ms on one thread, 15 ms on two; docs/benchmarks.md).
        // Concurrent sentences are batched into one run instead. It runs on the CPU whatever the device: its
        // products are uint8 x int8, which CUDA has no kernel for, so on a GPU each step would cross to the
        // CPU and back (sentence search cost 16 ms of CPU a request on an H200; docs/benchmarks.md, "GPU").
        let text_options = RuntimeOptions {
            device: Device::Cpu,
            intra_threads: Some(1),
            ..decided
        };
        let (text, _) = open(&env, &bundle.path(&m.text.onnx), text_options)?;
        expect_io(
            &text,
            &m.text.onnx,
            &[&m.text.ids_name, &m.text.lengths_name],
            &[&m.text.output_name],
        )?;
        let joint = m.projection.joint_dim as i64;
        expect_dims(&text, &m.text.onnx, &m.text.output_name, &[-1, joint])?;
        Ok(OrtBackend {
            provider,
            vision,
            text: Mutex::new(text),
            text_io: (
                m.text.ids_name.clone(),
                m.text.lengths_name.clone(),
                m.text.output_name.clone(),
            ),
        })
    }
}

impl OrtBackend {
    fn vision_graph(&self, graph: usize) -> Result<&VisionSession, RuntimeError> {
        self.vision.get(graph).ok_or_else(|| {
            RuntimeError::Run(format!(
                "no vision graph {graph}: the bundle has {}",
                self.vision.len()
            ))
        })
    }
}

impl VisionSession {
    /// `crops` (`[n, 3, side, side]`) through `session`, one of this graph's.
    fn run(
        &self,
        session: &mut Session,
        crops: &[f32],
        n: usize,
        side: usize,
    ) -> Result<Vec<f32>, RuntimeError> {
        let input = TensorRef::from_array_view(([n, 3, side, side], crops)).map_err(run_err)?;
        let outputs = session
            .run(vec![(self.io.0.as_str(), input)])
            .map_err(run_err)?;
        rows(&outputs[self.io.1.as_str()], n, "vision graph", "crops")
    }
}

/// A backbone's opened graph, its inputs and outputs checked against bundle.json.
fn vision_session(sessions: Vec<Session>, v: &VisionSpec) -> Result<VisionSession, RuntimeError> {
    let session = &sessions[0];
    expect_io(session, &v.onnx, &[&v.input_name], &[&v.output_name])?;
    let (side, raw) = (v.graph_side() as i64, v.raw_dim as i64);
    expect_dims(session, &v.onnx, &v.input_name, &[-1, 3, side, side])?;
    expect_dims(session, &v.onnx, &v.output_name, &[-1, raw])?;
    Ok(VisionSession {
        sessions: sessions.into_iter().map(Mutex::new).collect(),
        io: (v.input_name.clone(), v.output_name.clone()),
    })
}

fn open(
    env: &ort::environment::Environment,
    path: &Path,
    o: RuntimeOptions,
) -> Result<(Session, Provider), RuntimeError> {
    let RuntimeOptions {
        device,
        intra_threads,
        release_memory,
        conv_search,
        vision_sessions: _,
        tf32,
        nhwc,
    } = o;
    let graph = path.display().to_string();
    let err = |e: &dyn std::fmt::Display| RuntimeError::Graph {
        graph: graph.clone(),
        message: e.to_string(),
    };
    let builder = || -> Result<_, RuntimeError> {
        let mut b = Session::builder(env).map_err(|e| err(&e))?;
        b = b
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(|e| err(&e))?;
        if !has_vnni() {
            // Without VNNI, onnxruntime's uint8 x int8 product sums pairs in int16 and saturates: the int8
            // vision graph's Flickr8k test rsum fell from 286.62 to 264.46. Its precise path restores 286.62
            // for about 25% more ingest time (docs/benchmarks.md, "cores without AVX-512").
            b = b
                .with_config_entry("session.x64quantprecision", "1")
                .map_err(|e| err(&e))?;
        }
        if let Some(n) = intra_threads {
            b = b.with_intra_threads(n).map_err(|e| err(&e))?;
        }
        if release_memory {
            // Without the arena and the memory pattern, a run's buffers are freed when it ends instead of
            // being kept for the next one (docs/operations.md, "Memory").
            b = b.with_memory_pattern(false).map_err(|e| err(&e))?;
            ep::CPU::default()
                .with_arena_allocator(false)
                .register(&mut b)
                .map_err(|e| err(&e))?;
        }
        Ok(b)
    };
    if device == Device::Cpu {
        let session = builder()?.commit_from_file(path).map_err(|e| err(&e))?;
        return Ok((session, Provider::Cpu));
    }
    // Registering fails when the library has no CUDA EP (the CPU-only wheel); with onnxruntime-gpu but no
    // usable GPU or CUDA libraries, creating the session fails instead. Either way CUDA is not running.
    let mut b = builder()?;
    let cuda = ep::CUDA::default()
        .with_conv_algorithm_search(match conv_search {
            ConvSearch::Heuristic => ep::cuda::ConvAlgorithmSearch::Heuristic,
            ConvSearch::Exhaustive => ep::cuda::ConvAlgorithmSearch::Exhaustive,
            ConvSearch::Default => ep::cuda::ConvAlgorithmSearch::Default,
        })
        .with_tf32(tf32)
        .with_prefer_nhwc(nhwc)
        .register(&mut b)
        .map_err(|e| e.to_string())
        .and_then(|()| b.commit_from_file(path).map_err(|e| e.to_string()));
    match (cuda, device) {
        (Ok(session), _) => Ok((session, Provider::Cuda)),
        (Err(why), Device::Auto) => {
            tracing::warn!(graph = %graph, error = %why, "--device auto: CUDA cannot be used, running on the CPU");
            let session = builder()?.commit_from_file(path).map_err(|e| err(&e))?;
            Ok((session, Provider::Cpu))
        }
        (Err(why), _) => Err(RuntimeError::NoCuda(why.trim_end_matches('.').to_string())),
    }
}

fn expect_io(
    s: &Session,
    graph: &str,
    inputs: &[&str],
    outputs: &[&str],
) -> Result<(), RuntimeError> {
    for (want, have, kind) in [
        (inputs, s.inputs(), "input"),
        (outputs, s.outputs(), "output"),
    ] {
        for name in want {
            if !have.iter().any(|o| o.name() == *name) {
                let names: Vec<&str> = have.iter().map(|o| o.name()).collect();
                return Err(RuntimeError::Graph {
                    graph: graph.to_string(),
                    message: format!(
                        "bundle.json names {kind} \"{name}\" but the graph has {names:?}"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Checks a graph input's or output's shape against bundle.json; -1 (on either side) is a dynamic dimension.
fn expect_dims(s: &Session, graph: &str, name: &str, want: &[i64]) -> Result<(), RuntimeError> {
    let outlet = s
        .inputs()
        .iter()
        .chain(s.outputs())
        .find(|o| o.name() == name);
    let Some(shape) = outlet.and_then(|o| o.dtype().tensor_shape()) else {
        return Ok(());
    };
    let have: &[i64] = shape;
    let fits = have.len() == want.len()
        && have
            .iter()
            .zip(want)
            .all(|(h, w)| *h < 0 || *w < 0 || h == w);
    if !fits {
        return Err(RuntimeError::Graph {
            graph: graph.to_string(),
            message: format!(
                "\"{name}\" has shape {have:?}, bundle.json implies {want:?} (-1: any)"
            ),
        });
    }
    Ok(())
}

/// A graph's `[n, d]` float output, checked to hold one row per input.
fn rows(
    out: &ort::value::DynValue,
    n: usize,
    graph: &str,
    what: &str,
) -> Result<Vec<f32>, RuntimeError> {
    let (shape, data) = out.try_extract_tensor::<f32>().map_err(run_err)?;
    if shape.len() != 2 || shape[0] as usize != n {
        return Err(RuntimeError::Run(format!(
            "{graph} returned shape {shape:?} for {n} {what}"
        )));
    }
    Ok(data.to_vec())
}

fn run_err(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Run(e.to_string())
}

impl Backend for OrtBackend {
    fn provider(&self) -> Provider {
        self.provider
    }

    fn vision_sessions(&self) -> usize {
        self.vision.first().map_or(1, |v| v.sessions.len())
    }

    fn vision(
        &self,
        graph: usize,
        crops: &[f32],
        n: usize,
        side: usize,
    ) -> Result<Vec<f32>, RuntimeError> {
        let v = self.vision_graph(graph)?;
        // A free session if there is one (each worker thread finds its own), else wait for the first.
        let mut session = v
            .sessions
            .iter()
            .find_map(|s| s.try_lock().ok())
            .unwrap_or_else(|| v.sessions[0].lock().unwrap_or_else(|p| p.into_inner()));
        v.run(&mut session, crops, n, side)
    }

    fn warm_vision(
        &self,
        graph: usize,
        crops: &[f32],
        n: usize,
        side: usize,
    ) -> Result<(), RuntimeError> {
        let v = self.vision_graph(graph)?;
        for s in &v.sessions {
            let mut session = s.lock().unwrap_or_else(|p| p.into_inner());
            v.run(&mut session, crops, n, side)?;
        }
        Ok(())
    }

    fn text(&self, ids: &[i64], lengths: &[i64]) -> Result<Vec<f32>, RuntimeError> {
        let n = lengths.len();
        let t = ids.len().checked_div(n).unwrap_or(0);
        let ids = TensorRef::from_array_view(([n, t], ids)).map_err(run_err)?;
        let lengths = TensorRef::from_array_view(([n], lengths)).map_err(run_err)?;
        let mut session = self.text.lock().unwrap_or_else(|p| p.into_inner());
        let outputs = session
            .run(ort::inputs![self.text_io.0.as_str() => ids, self.text_io.1.as_str() => lengths])
            .map_err(run_err)?;
        rows(
            &outputs[self.text_io.2.as_str()],
            n,
            "text graph",
            "sentences",
        )
    }
}

/// Whether the CPU has a VNNI dot product (AVX-512 or AVX), which sums uint8 x int8 products without
/// saturating; other architectures are left as they are.
fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vnni")
            || std::arch::is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}
