//! A bundle's first vision graph alone through the runtime: crops per second at fixed batch shapes, with
//! `sessions` calls in flight, on synthetic crops (the values do not change the arithmetic). Against the
//! whole image path (`ingest`, the server) it says how much of a photo's time is the graph itself, copies to
//! and from the device included; `scripts/gpu-check.sh` runs it per precision and layout.
use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::ValueEnum;
use jointspace_embed::bundle::Bundle;
use jointspace_embed::crops;
use jointspace_embed::runtime::{self, Backend, ConvSearch, Device, OrtBackend, RuntimeOptions};
use serde_json::{Value, json};

use super::{Flags, Rng, latency, round};

pub struct Opts {
    pub bundle: String,
    pub device: Device,
    /// Rows (crops) of each call, one measurement per value.
    pub rows: Vec<usize>,
    pub sessions: usize,
    pub seconds: f64,
    pub tf32: bool,
    pub nhwc: bool,
    pub conv_search: ConvSearch,
    pub threads: Option<usize>,
    pub ort_dylib: Option<String>,
}

impl Opts {
    pub fn from_flags(f: &Flags) -> anyhow::Result<Opts> {
        let rows = f
            .str("rows", "16,64,256")
            .split(',')
            .map(|r| r.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| anyhow::anyhow!("--rows: a comma-separated list of numbers"))?;
        anyhow::ensure!(
            rows.iter().all(|&r| r > 0),
            "--rows: every value at least 1"
        );
        Ok(Opts {
            bundle: f.str("bundle", "models/flickr8k-vgg16-fne"),
            device: f.device()?,
            rows,
            sessions: f.num("sessions", 1usize)?.max(1),
            seconds: f.num("seconds", 3.0)?,
            tf32: f.str("tf32", "on") == "on",
            nhwc: f.str("nhwc", "off") == "on",
            conv_search: ConvSearch::from_str(&f.str("conv-search", "heuristic"), true)
                .map_err(anyhow::Error::msg)?,
            threads: f.opt("threads").map(|t| t.parse()).transpose()?,
            ort_dylib: f.ort_dylib(),
        })
    }
}

pub fn run(o: &Opts) -> anyhow::Result<Value> {
    let bundle = Bundle::load(Path::new(&o.bundle))?;
    let dylib = runtime::locate_dylib(o.ort_dylib.as_deref().map(Path::new))?;
    let t = Instant::now();
    let backend = Arc::new(OrtBackend::new(
        &bundle,
        &dylib,
        RuntimeOptions {
            device: o.device,
            intra_threads: o.threads,
            release_memory: false,
            conv_search: o.conv_search,
            vision_sessions: Some(o.sessions),
            tf32: o.tf32,
            nhwc: o.nhwc,
        },
    )?);
    let open_s = t.elapsed().as_secs_f64();
    let spec = &bundle.manifest.vision;
    let (side, crop_len) = (spec.graph_side(), crops::crop_len(spec));
    let mut rng = Rng::new(7);
    let most = o.rows.iter().copied().max().unwrap_or(1);
    // Normalised pixels are within a few hundred of 0 for either colour convention.
    let input: Arc<Vec<f32>> = Arc::new((0..most * crop_len).map(|_| 200.0 * rng.next()).collect());
    let mut runs = Vec::with_capacity(o.rows.len());
    for &rows in &o.rows {
        let data = &input[..rows * crop_len];
        // The first calls of a shape plan it (and, with several sessions, each session plans its own).
        let t = Instant::now();
        for _ in 0..o.sessions {
            backend.vision(0, data, rows, side)?;
        }
        let first_s = t.elapsed().as_secs_f64();
        let deadline = Instant::now() + Duration::from_secs_f64(o.seconds);
        let started = Instant::now();
        let per_thread: Vec<anyhow::Result<Vec<Duration>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..o.sessions)
                .map(|_| {
                    let backend = backend.clone();
                    s.spawn(move || -> anyhow::Result<Vec<Duration>> {
                        let mut took = Vec::new();
                        while Instant::now() < deadline {
                            let t = Instant::now();
                            backend.vision(0, data, rows, side)?;
                            took.push(t.elapsed());
                        }
                        Ok(took)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a caller panicked")))
                })
                .collect()
        });
        let wall = started.elapsed().as_secs_f64();
        let mut calls = Vec::new();
        for t in per_thread {
            calls.extend(t?);
        }
        let crops_per_s = (calls.len() * rows) as f64 / wall;
        runs.push(json!({
            "rows": rows,
            "calls": calls.len(),
            "seconds": round(wall, 3),
            "crops_per_s": round(crops_per_s, 1),
            "first_calls_s": round(first_s, 3),
            "input_mb_per_call": round((rows * crop_len * 4) as f64 / 1e6, 1),
            "call": latency(&mut calls),
        }));
    }
    Ok(json!({
        "bundle": bundle.id,
        "crop_mode": format!("{:?}", spec.crop_mode).to_lowercase(),
        "graph_side": side,
        "provider": backend.provider().as_str(),
        "sessions": o.sessions,
        "tf32": o.tf32,
        "nhwc": o.nhwc,
        "conv_search": format!("{:?}", o.conv_search).to_lowercase(),
        "open_s": round(open_s, 2),
        "runs": runs,
    }))
}
