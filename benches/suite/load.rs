//! A load generator for the running server over loopback. Closed loop (`--concurrency c`: c clients, each
//! sends its next request when the last one answers) for throughput, and open loop (`--rate r`: requests
//! start on a fixed schedule whatever the server does, latency counted from the scheduled start, so a slow
//! server cannot hide its queue) for latency at a given load and for what happens past saturation. Bodies:
//! real sentences (`--texts`, one per line), stored image ids (`--ids`) or a photo (`--image`); `--fields` (a
//! JSON object, e.g. `{"mode": "hybrid", "channels": ["text"]}`) is added to every body.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::ensure;
use serde_json::{Value, json};

use super::{Flags, Rng, latency, round};

pub struct Opts {
    pub url: String,
    /// `text` (a sentence from `texts`), `image_id` (1..=ids) or `image` (the file `image`, base64).
    pub query: String,
    pub image: Option<String>,
    pub texts: Vec<String>,
    pub ids: usize,
    /// The first stored image id (ids are global: a later collection's start after an earlier one's).
    pub first_id: usize,
    pub k: usize,
    pub concurrency: usize,
    /// Requests per second (open loop); 0: closed loop.
    pub rate: f64,
    pub duration: Duration,
    pub warmup: Duration,
    /// The server's pid, to report its CPU time per request (what the load costs, whatever else runs).
    pub server_pid: Option<u32>,
    /// Fields added to every body (a search's mode and channels).
    pub fields: serde_json::Map<String, Value>,
}

/// CPU seconds (user + system) a process has used so far (Linux: fields 14 and 15 of /proc/<pid>/stat, in
/// clock ticks of 1/100 s).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are plain.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

impl Opts {
    pub fn from_flags(f: &Flags) -> anyhow::Result<Opts> {
        let texts = match f.opt("texts") {
            Some(p) => std::fs::read_to_string(p)?
                .lines()
                .map(|l| l.split('\t').next_back().unwrap_or(l).trim().to_string())
                .filter(|l| !l.is_empty())
                .collect(),
            None => vec!["a dog runs on the beach".to_string()],
        };
        Ok(Opts {
            url: f.str(
                "url",
                "http://127.0.0.1:8080/v1/collections/n10000/images/search",
            ),
            query: f.str("query", "text"),
            image: match f.opt("image") {
                Some(p) => Some(base64::Engine::encode(
                    &base64::engine::general_purpose::STANDARD,
                    std::fs::read(p)?,
                )),
                None => None,
            },
            texts,
            ids: f.num("ids", 1000)?,
            first_id: f.num("first-id", 1)?,
            k: f.num("k", 10)?,
            concurrency: f.num("concurrency", 8)?,
            rate: f.num("rate", 0.0)?,
            duration: Duration::from_secs_f64(f.num("seconds", 10.0)?),
            warmup: Duration::from_secs_f64(f.num("warmup", 1.0)?),
            server_pid: f.opt("server-pid").and_then(|p| p.parse().ok()),
            fields: match f.opt("fields") {
                Some(j) => serde_json::from_str(&j)
                    .map_err(|e| anyhow::anyhow!("--fields must be a JSON object: {e}"))?,
                None => Default::default(),
            },
        })
    }

    fn body(&self, i: usize, rng: &mut Rng) -> String {
        let mut body = match self.query.as_str() {
            "image_id" => {
                let id = self.first_id
                    + ((rng.next() + 0.5) * self.ids as f32) as usize % self.ids.max(1);
                json!({"image_id": id, "k": self.k})
            }
            "image" => json!({"image": self.image.as_deref().unwrap_or(""), "k": self.k}),
            _ => json!({"text": self.texts[i % self.texts.len()], "k": self.k}),
        };
        if let Value::Object(b) = &mut body {
            b.extend(self.fields.clone());
        }
        body.to_string()
    }
}

/// One answered (or failed) request: when it was due, how long it took, its status (0: no answer).
struct Sample {
    due: Duration,
    took: Duration,
    status: u16,
}

async fn send(client: &reqwest::Client, url: &str, body: String) -> u16 {
    match client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
    {
        Ok(r) => {
            let s = r.status().as_u16();
            let _ = r.bytes().await;
            s
        }
        Err(_) => 0,
    }
}

pub async fn run(o: &Opts) -> anyhow::Result<Value> {
    ensure!(
        o.concurrency > 0 || o.rate > 0.0,
        "give --concurrency or --rate"
    );
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(4096)
        .build()?;
    // Warm-up (connections, the server's first runs), not counted.
    let until = Instant::now() + o.warmup;
    let mut rng = Rng::new(3);
    while Instant::now() < until {
        send(&client, &o.url, o.body(0, &mut rng)).await;
    }
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let cpu_before = o.server_pid.and_then(cpu_seconds);
    let start = Instant::now();
    if o.rate > 0.0 {
        open_loop(o, &client, &mut rng, &samples, start).await;
    } else {
        closed_loop(o, &client, &samples, start).await;
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = match (cpu_before, o.server_pid.and_then(cpu_seconds)) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for s in &samples {
        *statuses.entry(s.status.to_string()).or_default() += 1;
    }
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.status == 200).collect();
    let mut all: Vec<Duration> = samples.iter().map(|s| s.took).collect();
    let mut ok_t: Vec<Duration> = ok.iter().map(|s| s.took).collect();
    // Latency by when the request was due, in tenths of the run: flat when the server keeps up, rising
    // when a queue grows.
    let tenth = o.duration / 10;
    let over_time: Vec<Value> = (0..10)
        .map(|b| {
            let mut d: Vec<Duration> = samples
                .iter()
                .filter(|s| s.due >= tenth * b && s.due < tenth * (b + 1))
                .map(|s| s.took)
                .collect();
            latency(&mut d)["p50_ms"].clone()
        })
        .collect();
    Ok(json!({
        "url": o.url, "query": o.query, "fields": o.fields, "mode": if o.rate > 0.0 { "open" } else { "closed" },
        "concurrency": o.concurrency, "rate": o.rate, "seconds": o.duration.as_secs_f64(),
        "requests": samples.len(), "wall_s": round(wall, 2),
        "throughput_ok_per_s": round(ok.len() as f64 / wall, 1),
        "statuses": statuses,
        "latency_all": latency(&mut all), "latency_ok": latency(&mut ok_t),
        "p50_ms_by_tenth": over_time,
        "server_cpu_ms_per_request": cpu.map(|c| round(c * 1e3 / samples.len().max(1) as f64, 2)),
        "server_cpu_cores_used": cpu.map(|c| round(c / wall, 2)),
    }))
}

/// Requests started on a fixed schedule (`--rate`) whatever the server does, each timed from when it was due.
async fn open_loop(
    o: &Opts,
    client: &reqwest::Client,
    rng: &mut Rng,
    samples: &Arc<Mutex<Vec<Sample>>>,
    start: Instant,
) {
    let interval = Duration::from_secs_f64(1.0 / o.rate);
    let total = (o.duration.as_secs_f64() * o.rate) as usize;
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let due = interval * i as u32;
        tokio::time::sleep_until((start + due).into()).await;
        let (client, url, body, samples) = (
            client.clone(),
            o.url.clone(),
            o.body(i, rng),
            samples.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let status = send(&client, &url, body).await;
            let took = start.elapsed().saturating_sub(due);
            samples.lock().unwrap().push(Sample { due, took, status });
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// `--concurrency` clients, each sending its next request when the last one answers, until the run's end.
async fn closed_loop(
    o: &Opts,
    client: &reqwest::Client,
    samples: &Arc<Mutex<Vec<Sample>>>,
    start: Instant,
) {
    let tasks: Vec<_> = (0..o.concurrency)
        .map(|w| {
            let (client, url, samples) = (client.clone(), o.url.clone(), samples.clone());
            let bodies: Vec<String> = {
                let mut rng = Rng::new(w as u64 + 10);
                (0..1000)
                    .map(|i| o.body(i * o.concurrency + w, &mut rng))
                    .collect()
            };
            let end = o.duration;
            tokio::spawn(async move {
                let mut i = 0;
                loop {
                    let due = start.elapsed();
                    if due >= end {
                        break;
                    }
                    let status = send(&client, &url, bodies[i % bodies.len()].clone()).await;
                    let took = start.elapsed() - due;
                    samples.lock().unwrap().push(Sample { due, took, status });
                    i += 1;
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}
