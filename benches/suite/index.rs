//! The vector index alone: build time, HNSW recall@10 against the exact ranking at each ef, query times of
//! both, resident memory per vector, snapshot save and load times. With `--database-url`, the index is the
//! one the server serves: the seeded collection's image vectors from the database and the graph from the
//! server's own snapshot (so a 100k graph is not built twice), scored as the server scores a sentence query
//! (with each image's hubness offset when the bundle has a bank); otherwise the bench builds its own.
use std::{
    collections::{HashMap, HashSet},
    time::Instant,
};

use anyhow::ensure;
use jointspace::index::{IndexParams, Score, VectorIndex};
use serde_json::{Value, json};

use super::{Clustered, Flags, latency, round, rss};

pub struct Opts {
    pub n: usize,
    pub dim: usize,
    pub queries: usize,
    /// ef values to measure; the server's default (128) is the one that counts.
    pub efs: Vec<usize>,
    /// A database seeded by the `seed` bench, with the server's snapshot of collection `n<n>` in `index_dir`.
    pub database_url: Option<String>,
    pub index_dir: String,
    pub bundle: String,
}

impl Opts {
    pub fn from_flags(f: &Flags) -> anyhow::Result<Opts> {
        let efs = f
            .str("ef", "64,128,256")
            .split(',')
            .map(|s| s.trim().parse())
            .collect::<Result<_, _>>()?;
        Ok(Opts {
            n: f.num("n", 10_000)?,
            dim: f.num("dim", 1024)?,
            queries: f.num("queries", 200)?,
            efs,
            database_url: f.opt("database-url"),
            index_dir: f.str("index-dir", "target/bench/index"),
            bundle: f.str("bundle", "models/flickr8k-vgg16-fne"),
        })
    }
}

pub fn run(o: &Opts) -> anyhow::Result<Value> {
    // The seeded collections' image vectors come from `Clustered::new(dim, 100, 1)`: the same generator, run
    // past them, gives queries from the same clusters that are not in the index.
    let mut gen_ = Clustered::new(o.dim, 100, 1);
    let (data, snapshot, offsets) = match &o.database_url {
        Some(url) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let bundle = jointspace::bundle::Bundle::load(std::path::Path::new(&o.bundle))?;
            let bundle_id = bundle.id.clone();
            let (data, generation, cid, offsets) = rt.block_on(async {
                let store = jointspace::store::Store::connect(url).await?;
                let c = store.collection(&format!("n{}", o.n)).await?;
                let v = store
                    .vectors(c.id, jointspace::store::Modality::Images)
                    .await?;
                let offsets = store.image_offsets(c.id).await?;
                anyhow::Ok((v, c.generation, c.id, offsets))
            })?;
            // A sentence query's score under a bundle with a bank: cosine plus the image's offset.
            let offsets: HashMap<i64, f32> = match bundle.hubness {
                Some(_) => offsets.into_iter().collect(),
                None => HashMap::new(),
            };
            ensure!(
                data.len() == o.n,
                "the database holds {} vectors, not {}",
                data.len(),
                o.n
            );
            (0..o.n).for_each(|i| drop(gen_.sample(i)));
            let name = jointspace::index::snapshot_name(cid, jointspace::store::Modality::Images);
            (data, Some((name, generation, bundle_id)), offsets)
        }
        None => {
            let data: Vec<(i64, Vec<f32>)> =
                (0..o.n).map(|i| (i as i64 + 1, gen_.sample(i))).collect();
            (data, None, HashMap::new())
        }
    };
    let score = if offsets.is_empty() {
        Score::Cosine
    } else {
        Score::CosineOffset
    };
    let offset_of = |id: &i64| offsets.get(id).copied().unwrap_or(0.0);
    let queries: Vec<Vec<f32>> = (0..o.queries).map(|i| gen_.sample(i * 7 + 3)).collect();

    // The exact top 10 (brute force with the server's scoring and ordering), timed per query.
    let mut exact_t = Vec::with_capacity(o.queries);
    let exact: Vec<Vec<i64>> = queries
        .iter()
        .map(|q| {
            let t = Instant::now();
            let mut all: Vec<(i64, f32)> = data
                .iter()
                .map(|(id, v)| (*id, score.eval(q, v) + offset_of(id)))
                .collect();
            let cmp = |a: &(i64, f32), b: &(i64, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
            let k = 10.min(all.len() - 1);
            all.select_nth_unstable_by(k, cmp);
            all.truncate(k);
            all.sort_by(cmp);
            exact_t.push(t.elapsed());
            all.into_iter().map(|h| h.0).collect()
        })
        .collect();

    let base = IndexParams {
        exact_below: 0,
        ..IndexParams::default()
    };
    let copy = data.clone();
    let rss_before = rss("self").unwrap_or(0);
    let t = Instant::now();
    let idx = match &snapshot {
        Some((name, generation, bundle_id)) => VectorIndex::load(
            base,
            std::path::Path::new(&o.index_dir),
            name,
            *generation,
            bundle_id,
            copy,
        )
        .map_err(|(why, _)| anyhow::anyhow!("the server's snapshot {name} did not load: {why}"))?,
        None => VectorIndex::build(base, copy)?,
    };
    let build_s = t.elapsed().as_secs_f64();
    let rss_after = rss("self").unwrap_or(0);

    let dir = tempfile::tempdir()?;
    let t = Instant::now();
    idx.save(dir.path(), "bench", 1, "bench")?;
    let save_s = t.elapsed().as_secs_f64();
    let snapshot_bytes: u64 = std::fs::read_dir(dir.path())?
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    drop(idx);

    let mut per_ef = vec![];
    let mut load_s = 0.0;
    for &ef in &o.efs {
        let params = IndexParams {
            ef_search: ef,
            ..base
        };
        let t = Instant::now();
        let idx = VectorIndex::load(params, dir.path(), "bench", 1, "bench", data.clone())
            .map_err(|(why, _)| anyhow::anyhow!("snapshot did not load: {why}"))?;
        load_s = t.elapsed().as_secs_f64();
        ensure!(
            idx.len() == o.n,
            "the loaded index has {} points",
            idx.len()
        );
        idx.set_offsets(offsets.iter().map(|(id, o)| (*id, *o)));
        let mut times = Vec::with_capacity(o.queries);
        let mut hit = 0;
        for (q, want) in queries.iter().zip(&exact) {
            let t = Instant::now();
            let got = idx.search(q, score, 0, 10, None);
            times.push(t.elapsed());
            let got: HashSet<i64> = got.into_iter().map(|h| h.0).collect();
            hit += want.iter().filter(|id| got.contains(id)).count();
        }
        let total: usize = exact.iter().map(Vec::len).sum();
        per_ef.push(json!({
            "ef": ef, "recall_at_10": round(hit as f64 / total.max(1) as f64, 4),
            "latency": latency(&mut times),
        }));
    }
    Ok(json!({
        "n": o.n, "dim": o.dim, "queries": o.queries,
        "max_connections": base.max_connections, "ef_construction": base.ef_construction,
        "source": if snapshot.is_some() { "server snapshot + database" } else { "built here" },
        "score": format!("{score:?}"),
        "build_or_first_load_s": round(build_s, 2),
        "rss_per_vector_bytes": (rss_after.saturating_sub(rss_before)) / o.n.max(1) as u64,
        "raw_vector_bytes": o.dim * 4,
        "snapshot_save_s": round(save_s, 3), "snapshot_load_s": round(load_s, 3),
        "snapshot_bytes": snapshot_bytes,
        "hnsw": per_ef,
        "exact_scan": latency(&mut exact_t),
    }))
}
