//! The vector index alone: build time, HNSW recall@10 against the exact ranking at each ef, query times of
//! both, resident memory per vector, snapshot save and load times. With `--database-url`, the index is the
//! one the server serves: the seeded collection's image vectors from the database and the graph from the
//! server's own snapshot (so a 100k graph is not built twice), scored as the server scores a sentence query
//! (with each image's hubness offset when the bundle has a bank); otherwise the bench builds its own.
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use anyhow::ensure;
use jointspace_index::{IndexParams, Score, VectorIndex};
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
    /// `cosine` or `order` (built here only): order embeddings are |unit vectors| scored by S(c, i) =
    /// -‖max(0, c - i)‖² with the query as the caption, found as the server finds them: L2 candidates from
    /// the graph, re-ranked exactly by S.
    pub similarity: String,
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
            similarity: f.str("similarity", "cosine"),
        })
    }
}

/// The vectors the bench searches, and what the database adds when there is one.
struct Source {
    data: Vec<(i64, Vec<f32>)>,
    /// The server's snapshot (name, generation, bundle id), loaded instead of building a graph.
    snapshot: Option<(String, i64, String)>,
    /// Each image's hubness offset, when the bundle has a bank.
    offsets: HashMap<i64, f32>,
    db_filters: Vec<Value>,
    db_allowed: Vec<HashSet<i64>>,
}

pub fn run(o: &Opts) -> anyhow::Result<Value> {
    let order = order_similarity(o)?;
    // The seeded collections' image vectors come from `Clustered::new(dim, 100, 1)`: the same generator, run
    // past them, gives queries from the same clusters that are not in the index. Under order similarity both
    // sides are their absolute values (still unit vectors), as an order bundle's are.
    let mut gen_ = Clustered::new(o.dim, 100, 1);
    let mut sample = move |i: usize| {
        let mut v = gen_.sample(i);
        if order {
            v.iter_mut().for_each(|x| *x = x.abs());
        }
        v
    };
    let Source {
        data,
        snapshot,
        offsets,
        db_filters,
        db_allowed,
    } = match &o.database_url {
        Some(url) => from_database(o, url, &mut sample)?,
        None => Source {
            data: (0..o.n).map(|i| (i as i64 + 1, sample(i))).collect(),
            snapshot: None,
            offsets: HashMap::new(),
            db_filters: vec![],
            db_allowed: vec![],
        },
    };
    let score = if order {
        Score::Order {
            query_is_caption: true,
        }
    } else if offsets.is_empty() {
        Score::Cosine
    } else {
        Score::CosineOffset
    };
    let offset_of = |id: &i64| offsets.get(id).copied().unwrap_or(0.0);
    let queries: Vec<Vec<f32>> = (0..o.queries).map(|i| sample(i * 7 + 3)).collect();

    let (exact, mut exact_t) = exact_top_10(&data, &queries, score, &offset_of);

    let base = IndexParams {
        exact_below: 0,
        ..IndexParams::default()
    };
    let built = build_and_save(o, base, &data, &snapshot)?;

    let searched = Searched {
        o,
        dir: built.dir.path(),
        data: &data,
        offsets: &offsets,
        queries: &queries,
        score,
    };
    let (per_ef, load_s) = recall_per_ef(&searched, base, &exact)?;
    let filtered = recall_filtered(&searched, base, db_allowed, &offset_of)?;
    Ok(json!({
        "n": o.n, "dim": o.dim, "queries": o.queries,
        "max_connections": base.max_connections, "ef_construction": base.ef_construction,
        "source": if snapshot.is_some() { "server snapshot + database" } else { "built here" },
        "score": format!("{score:?}"),
        "build_or_first_load_s": round(built.build_s, 2),
        "rss_per_vector_bytes": built.rss_grown / o.n.max(1) as u64,
        "raw_vector_bytes": o.dim * 4,
        "snapshot_save_s": round(built.save_s, 3), "snapshot_load_s": round(load_s, 3),
        "snapshot_bytes": built.snapshot_bytes,
        "hnsw": per_ef,
        "filtered": filtered,
        "database_filter": db_filters,
        "exact_scan": latency(&mut exact_t),
    }))
}

/// The index built (or the server's snapshot loaded), then saved to a temporary folder, which the recall
/// measurements load from.
struct Built {
    dir: tempfile::TempDir,
    build_s: f64,
    /// Resident memory grown by building (or loading) the index.
    rss_grown: u64,
    save_s: f64,
    snapshot_bytes: u64,
}

fn build_and_save(
    o: &Opts,
    base: IndexParams,
    data: &[(i64, Vec<f32>)],
    snapshot: &Option<(String, i64, String)>,
) -> anyhow::Result<Built> {
    let copy = data.to_vec();
    let rss_before = rss("self").unwrap_or(0);
    let t = Instant::now();
    let idx = match snapshot {
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
    Ok(Built {
        dir,
        build_s,
        rss_grown: rss_after.saturating_sub(rss_before),
        save_s,
        snapshot_bytes,
    })
}

/// `--similarity`: whether the bench scores by order embeddings (true) or cosine (false).
fn order_similarity(o: &Opts) -> anyhow::Result<bool> {
    let order = match o.similarity.as_str() {
        "cosine" => false,
        "order" => true,
        other => anyhow::bail!("--similarity {other}: cosine or order"),
    };
    ensure!(
        !(order && o.database_url.is_some()),
        "--similarity order builds its own index (the seeded databases hold cosine vectors)"
    );
    Ok(order)
}

/// The seeded collection `n<n>` as the server holds it: its image vectors, the server's snapshot, the offsets,
/// and the filters timed both ways. `sample` is run past the seeded vectors so the queries are new ones.
fn from_database(
    o: &Opts,
    url: &str,
    sample: &mut impl FnMut(usize) -> Vec<f32>,
) -> anyhow::Result<Source> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let bundle = jointspace_embed::bundle::Bundle::load(std::path::Path::new(&o.bundle))?;
    let bundle_id = bundle.id.clone();
    let (data, generation, cid, offsets) = rt.block_on(async {
        let store = jointspace_store::Store::connect(url).await?;
        let c = store.collection(&format!("n{}", o.n)).await?;
        let v = store
            .vectors(c.id, jointspace_store::Modality::Images)
            .await?;
        let offsets = store
            .offsets(c.id, jointspace_store::Modality::Images)
            .await?;
        anyhow::Ok((v, c.generation, c.id, offsets))
    })?;
    let (db_filters, db_allowed) = time_database_filters(&rt, url, cid)?;
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
    (0..o.n).for_each(|i| drop(sample(i)));
    let name = jointspace_index::snapshot_name(cid, jointspace_store::Modality::Images);
    Ok(Source {
        data,
        snapshot: Some((name, generation, bundle_id)),
        offsets,
        db_filters,
        db_allowed,
    })
}

/// The ids a filter admits, 20 times each: as a search finds them, from the metadata held in memory
/// (src/index/attributes.rs), and as a list finds them, from the database. Returns each filter's report and
/// its allowed ids.
fn time_database_filters(
    rt: &tokio::runtime::Runtime,
    url: &str,
    cid: i64,
) -> anyhow::Result<(Vec<Value>, Vec<HashSet<i64>>)> {
    let (mut db_filters, mut db_allowed) = (vec![], vec![]);
    let rss = || -> u64 {
        std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map_or(0, |pages| pages * 4096)
    };
    let before = rss();
    let attributes = jointspace_index::Attributes::new(rt.block_on(async {
        let store = jointspace_store::Store::connect(url).await?;
        anyhow::Ok(store.image_metadata(cid, None).await?)
    })?);
    let attributes_bytes = rss().saturating_sub(before);
    for (label, f) in [
        ("1%, across clusters", json!({"pct": 0})),
        ("50%, across clusters", json!({"pct": {"$lt": 50}})),
        ("50%, whole clusters", json!({"group": {"$lt": 50}})),
    ] {
        let f = jointspace_core::filter::Filter::parse(&f)?;
        let (ids, mut times) = rt.block_on(async {
            let store = jointspace_store::Store::connect(url).await?;
            let (mut ids, mut times) = (vec![], vec![]);
            for _ in 0..20 {
                let t = Instant::now();
                ids = store.filter_image_ids(cid, &f).await?;
                times.push(t.elapsed());
            }
            anyhow::Ok((ids, times))
        })?;
        let mut memory_times = vec![];
        for _ in 0..20 {
            let t = Instant::now();
            let found = attributes.matching(&f);
            memory_times.push(t.elapsed());
            ensure!(
                found.len() == ids.len(),
                "memory and database disagree on {label}"
            );
        }
        db_filters.push(json!({
            "filter": label, "matching_ids": ids.len(),
            "latency": latency(&mut times),
            "in_memory_latency": latency(&mut memory_times),
            "in_memory_rss_bytes": attributes_bytes,
        }));
        db_allowed.push(ids.into_iter().collect::<HashSet<i64>>());
    }
    Ok((db_filters, db_allowed))
}

/// The exact top 10 (brute force with the server's scoring and ordering), timed per query.
fn exact_top_10(
    data: &[(i64, Vec<f32>)],
    queries: &[Vec<f32>],
    score: Score,
    offset_of: &impl Fn(&i64) -> f32,
) -> (Vec<Vec<i64>>, Vec<Duration>) {
    let mut exact_t = Vec::with_capacity(queries.len());
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
    (exact, exact_t)
}

/// What the recall measurements share: the saved snapshot, the vectors and offsets it is loaded with, and the
/// queries with their scoring.
struct Searched<'a> {
    o: &'a Opts,
    dir: &'a std::path::Path,
    data: &'a [(i64, Vec<f32>)],
    offsets: &'a HashMap<i64, f32>,
    queries: &'a [Vec<f32>],
    score: Score,
}

impl Searched<'_> {
    fn load(&self, params: IndexParams) -> anyhow::Result<VectorIndex> {
        let idx = VectorIndex::load(params, self.dir, "bench", 1, "bench", self.data.to_vec())
            .map_err(|(why, _)| anyhow::anyhow!("snapshot did not load: {why}"))?;
        Ok(idx)
    }
}

/// HNSW recall@10 against the exact ranking and query times at each ef, with the snapshot's load time (the
/// last one's).
fn recall_per_ef(
    s: &Searched<'_>,
    base: IndexParams,
    exact: &[Vec<i64>],
) -> anyhow::Result<(Vec<Value>, f64)> {
    let mut per_ef = vec![];
    let mut load_s = 0.0;
    for &ef in &s.o.efs {
        let params = IndexParams {
            ef_search: Some(ef),
            ..base
        };
        let t = Instant::now();
        let idx = s.load(params)?;
        load_s = t.elapsed().as_secs_f64();
        ensure!(
            idx.len() == s.o.n,
            "the loaded index has {} points",
            idx.len()
        );
        idx.set_offsets(s.offsets.iter().map(|(id, o)| (*id, *o)));
        let mut times = Vec::with_capacity(s.o.queries);
        let mut hit = 0;
        for (q, want) in s.queries.iter().zip(exact) {
            let t = Instant::now();
            let got = idx.search(q, s.score, 0, 10, None);
            times.push(t.elapsed());
            let got: HashSet<i64> = got.into_iter().map(|h| h.id).collect();
            hit += want.iter().filter(|id| got.contains(id)).count();
        }
        let total: usize = exact.iter().map(Vec::len).sum();
        per_ef.push(json!({
            "ef": ef, "recall_at_10": round(hit as f64 / total.max(1) as f64, 4),
            "latency": latency(&mut times),
        }));
    }
    Ok((per_ef, load_s))
}

/// Under filters, with the server's settings (exact below 2,000 allowed ids, ef 128): a selective (1%) and a
/// broad (50%) filter, the allowed ids spread over the clusters by a hash of the id. Recall@10 against the
/// exact ranking of the allowed ids; the database's part (reading the matching ids) is not in these times.
fn recall_filtered(
    s: &Searched<'_>,
    base: IndexParams,
    db_allowed: Vec<HashSet<i64>>,
    offset_of: &impl Fn(&i64) -> f32,
) -> anyhow::Result<Vec<Value>> {
    let served = IndexParams {
        exact_below: IndexParams::default().exact_below,
        ..base
    };
    let idx = s.load(served)?;
    idx.set_offsets(s.offsets.iter().map(|(id, o)| (*id, *o)));
    let mut filtered = vec![];
    // From the database's filters when there is one, else spreads made here: 1% and 50% across the clusters,
    // and 50% as whole clusters (ids i + 1 of cluster i % 100).
    let made_here = |keep: &dyn Fn(i64) -> bool| -> HashSet<i64> {
        s.data
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| keep(*id))
            .collect()
    };
    let spread = |id: i64| ((id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % 100;
    let sets: Vec<HashSet<i64>> = if db_allowed.is_empty() {
        vec![
            made_here(&|id| spread(id) == 0),
            made_here(&|id| spread(id) < 50),
            made_here(&|id| (id - 1) % 100 < 50),
        ]
    } else {
        db_allowed
    };
    let labels = [
        "1%, across clusters",
        "50%, across clusters",
        "50%, whole clusters",
    ];
    for (allowed, label) in sets.into_iter().zip(labels) {
        let mut times = Vec::with_capacity(s.o.queries);
        let (mut hit, mut total) = (0, 0);
        for q in s.queries {
            let mut want: Vec<(i64, f32)> = s
                .data
                .iter()
                .filter(|(id, _)| allowed.contains(id))
                .map(|(id, v)| (*id, s.score.eval(q, v) + offset_of(id)))
                .collect();
            want.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            want.truncate(10);
            let t = Instant::now();
            let got = idx.search(q, s.score, 0, 10, Some(&allowed));
            times.push(t.elapsed());
            let got: HashSet<i64> = got.into_iter().map(|h| h.id).collect();
            hit += want.iter().filter(|(id, _)| got.contains(id)).count();
            total += want.len();
        }
        filtered.push(json!({
            "filter": label, "allowed": allowed.len(),
            "path": if allowed.len() < served.exact_below { "exact scan of the allowed ids" } else { "HNSW, allowed ids kept (exact scan when too few)" },
            "recall_at_10": round(hit as f64 / total.max(1) as f64, 4),
            "latency": latency(&mut times),
        }));
    }
    Ok(filtered)
}
