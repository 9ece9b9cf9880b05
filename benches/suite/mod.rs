//! The benches as functions of their sizes: `bench.rs` runs them at full size, tests/bench_smoke.rs tiny.
#![allow(dead_code)]

pub mod graph;
pub mod hubness;
pub mod index;
pub mod ingest;
pub mod load;
pub mod projection;
pub mod seed;

use std::{collections::HashMap, time::Duration};

use anyhow::{Context, bail};
use serde_json::{Value, json};

/// `--key value` flags after the bench's name.
pub struct Flags(HashMap<String, String>);

impl Flags {
    pub fn parse(args: &[String]) -> anyhow::Result<Flags> {
        let mut map = HashMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let Some(key) = k.strip_prefix("--") else {
                bail!("expected --flag value, found {k}");
            };
            let v = it
                .next()
                .with_context(|| format!("--{key} needs a value"))?;
            map.insert(key.to_string(), v.clone());
        }
        Ok(Flags(map))
    }

    pub fn str(&self, key: &str, default: &str) -> String {
        self.0
            .get(key)
            .cloned()
            .unwrap_or_else(|| default.to_string())
    }

    pub fn opt(&self, key: &str) -> Option<String> {
        self.0.get(key).cloned()
    }

    /// `--device` (cpu, cuda or auto; default cpu).
    pub fn device(&self) -> anyhow::Result<jointspace_embed::runtime::Device> {
        use clap::ValueEnum;
        jointspace_embed::runtime::Device::from_str(&self.str("device", "cpu"), true)
            .map_err(anyhow::Error::msg)
    }

    /// `--ort-dylib`, else ORT_DYLIB_PATH, as the server reads them.
    pub fn ort_dylib(&self) -> Option<String> {
        self.opt("ort-dylib")
            .or_else(|| std::env::var("ORT_DYLIB_PATH").ok())
    }

    pub fn num<T: std::str::FromStr>(&self, key: &str, default: T) -> anyhow::Result<T> {
        match self.0.get(key) {
            Some(v) => v
                .parse()
                .map_err(|_| anyhow::anyhow!("--{key} {v}: not a number")),
            None => Ok(default),
        }
    }
}

pub fn run(args: &[String]) -> anyhow::Result<Value> {
    let Some((what, rest)) = args.split_first() else {
        bail!("usage: bench <projection|hubness|index|graph|ingest|seed|load> [--flag value]...");
    };
    let f = Flags::parse(rest)?;
    let mut report = match what.as_str() {
        "projection" => projection::run(&projection::Opts::from_flags(&f)?)?,
        "hubness" => hubness::run(&hubness::Opts::from_flags(&f)?)?,
        "index" => index::run(&index::Opts::from_flags(&f)?)?,
        "graph" => graph::run(&graph::Opts::from_flags(&f)?)?,
        "ingest" => runtime()?.block_on(ingest::run(&ingest::Opts::from_flags(&f)?))?,
        "seed" => runtime()?.block_on(seed::run(&seed::Opts::from_flags(&f)?))?,
        "load" => runtime()?.block_on(load::run(&load::Opts::from_flags(&f)?))?,
        other => bail!("unknown bench {other}"),
    };
    report["bench"] = json!(what);
    report["loadavg"] = json!(loadavg());
    Ok(report)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// The 1/5/15-minute load averages: the machine is shared, so every result carries them.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Resident memory of a process (`self` or a pid), bytes.
pub fn rss(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A small deterministic generator (no extra dependency; the benches need speed, not quality).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in [-0.5, 0.5).
    pub fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    }

    /// A ternary code's values with `density` of the features at +1 and as many at -1.
    pub fn ternary(&mut self, dim: usize, density: f32) -> Vec<i8> {
        let t = density - 0.5;
        (0..dim)
            .map(|_| match self.next() {
                x if x < t => -1,
                x if x > -t => 1,
                _ => 0,
            })
            .collect()
    }
}

/// Unit vectors around `clusters` random centres (noise 0.5 per axis), like embeddings, not uniform noise.
pub struct Clustered {
    centres: Vec<Vec<f32>>,
    rng: Rng,
}

impl Clustered {
    pub fn new(dim: usize, clusters: usize, seed: u64) -> Clustered {
        let mut rng = Rng::new(seed);
        let centres = (0..clusters)
            .map(|_| (0..dim).map(|_| rng.next()).collect())
            .collect();
        Clustered { centres, rng }
    }

    pub fn sample(&mut self, i: usize) -> Vec<f32> {
        let c = &self.centres[i % self.centres.len()];
        let mut v: Vec<f32> = c.iter().map(|x| x + 0.5 * self.rng.next()).collect();
        jointspace_core::similarity::normalise(&mut v, false);
        v
    }
}

/// Latency summary in milliseconds.
pub fn latency(samples: &mut [Duration]) -> Value {
    if samples.is_empty() {
        return json!(null);
    }
    samples.sort_unstable();
    let ms = |d: Duration| (d.as_secs_f64() * 1e5).round() / 100.0;
    let at = |q: f64| ms(samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)]);
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    json!({"p50_ms": at(0.5), "p90_ms": at(0.9), "p99_ms": at(0.99), "max_ms": ms(samples[samples.len() - 1]), "mean_ms": ms(mean)})
}

pub fn round(v: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (v * p).round() / p
}
