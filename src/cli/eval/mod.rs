//! `jointspace eval`: a Flickr8k split ingested through the server's own path, then every image and every
//! caption ranked against the whole split through the HNSW graphs, and the figures set beside the ones the
//! trainer recorded in the bundle.

mod dataset;
mod hybrid;
mod metrics;
mod report;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

pub use dataset::read_captions;
use metrics::{first_correct, summarise, values};
use report::Report;

use super::{
    add::{Folder, add_all},
    ensure_collection, offline_pipeline,
};
use crate::{
    app::{Purpose, open_service},
    config::{EvalArgs, StoreArgs},
    metrics::Metrics,
    modality::Modality,
    pipeline::Pipeline,
    service::{CollectionName, Service},
};

pub async fn eval(args: EvalArgs) -> anyhow::Result<()> {
    let data = data_folder(&args)?;
    let split = dataset::read_split(data, &args.split, args.limit)?;
    let pipeline = offline_pipeline(&args.model)?;
    let svc = eval_service(&args, pipeline.clone()).await?;
    let collection = CollectionName::parse(&format!("eval-{}", args.split))?;
    let cid = ensure_collection(&svc, &collection).await?;
    let t = std::time::Instant::now();
    let folder = Folder {
        dir: &split.images_dir,
        captions: &split.captions,
    };
    let added = add_all(
        &svc,
        &collection,
        folder,
        split.names.clone(),
        args.batch,
        args.concurrency,
    )
    .await?;
    if let Some((name, why)) = added.skipped.first() {
        anyhow::bail!(
            "{} photos of the split could not be added (the first: {name}: {why}); an evaluation needs them all",
            added.skipped.len()
        );
    }
    let ids = added.ids;
    let ingest_seconds = t.elapsed().as_secs_f64();
    let image_ids: Vec<i64> = split.names.iter().map(|n| ids[n]).collect();
    let ranks = rank_split(&svc, cid, &image_ids).await?;
    let report = Report {
        bundle: &pipeline.bundle.id,
        split: &args.split,
        crop_mode: format!("{:?}", pipeline.crop_mode).to_lowercase(),
        images: image_ids.len(),
        captions: ranks.t2i.len(),
        ingest_seconds,
        index_recall: ranks.index_recall,
        ours: values(summarise(&ranks.i2t), summarise(&ranks.t2i)),
        theirs: pipeline
            .bundle
            .manifest
            .training
            .get("test_metrics")
            .cloned()
            .unwrap_or(serde_json::Value::Null),
    };
    let hybrid = if args.hybrid {
        Some(
            hybrid::measure(
                &svc,
                &collection,
                &split.names,
                &ids,
                &split.captions,
                args.fusion_sweep,
                usize::from(args.photos_per_product),
            )
            .await?,
        )
    } else {
        None
    };
    svc.close().await;
    print_results(&args, &report, hybrid)?;
    Ok(())
}

/// `--data`, which must be a folder.
fn data_folder(args: &EvalArgs) -> anyhow::Result<&std::path::Path> {
    let Some(data) = &args.data else {
        anyhow::bail!(
            "which dataset? give --data (or JOINTSPACE_EVAL_DATA) the Flickr8k folder: images/, \
             Flickr8k.token.txt and Flickr_8k.<split>Images.txt (in this project's layout, ../shared/data/flickr8k)"
        );
    };
    if !data.is_dir() {
        anyhow::bail!(
            "--data {}: no such folder (the Flickr8k folder: images/, Flickr8k.token.txt, ...)",
            data.display()
        );
    }
    Ok(data)
}

/// The service the split is added to and searched in.
async fn eval_service(args: &EvalArgs, pipeline: Arc<Pipeline>) -> anyhow::Result<Arc<Service>> {
    let store_args = StoreArgs {
        database_url: args.database_url.clone(),
        database_timeout: 5,
        database_connections: None,
        index: crate::config::IndexMode::Memory,
        index_dir: None,
        // Through the HNSW graphs, as a large collection is searched (full rankings are exact either way).
        exact_below: 0,
        ef_search: None,
        hnsw_m: jointspace_service::DEFAULT_MAX_CONNECTIONS as u32,
        hnsw_ef_construction: jointspace_service::DEFAULT_EF_CONSTRUCTION as u32,
        max_k: 1000,
        max_batch: 64,
    };
    open_service(
        pipeline,
        &store_args,
        Arc::new(Metrics::new()),
        None,
        Purpose::Search,
    )
    .await
}

/// The report as JSON (`--json`) or as a table, with the hybrid search's figures when they were measured.
fn print_results(
    args: &EvalArgs,
    report: &Report<'_>,
    hybrid: Option<serde_json::Value>,
) -> anyhow::Result<()> {
    if args.json {
        let mut j = report.json();
        if let (Some(h), Some(o)) = (hybrid, j.as_object_mut()) {
            o.insert("hybrid".into(), h);
        }
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        print!("{}", report.table());
        if let Some(h) = hybrid {
            println!(
                "hybrid search (first caption as title, the other four as queries, k=10, {} photo(s) a \
                 product): {h}",
                args.photos_per_product
            );
        }
    }
    Ok(())
}

/// Each query's rank of its first correct answer, both ways, and how well k=10 graph searches agree with
/// the exact top 10.
struct Ranks {
    i2t: Vec<usize>,
    t2i: Vec<usize>,
    index_recall: f64,
}

async fn rank_split(svc: &Service, cid: i64, image_ids: &[i64]) -> anyhow::Result<Ranks> {
    // Owners: caption id -> image id, from the database (what the server stored).
    let mut owner: HashMap<i64, i64> = HashMap::new();
    let mut caps_of: HashMap<i64, Vec<i64>> = HashMap::new();
    for c in svc.all_captions(cid).await? {
        if let Some(img) = c.image_id {
            owner.insert(c.id, img);
            caps_of.entry(img).or_default().push(c.id);
        }
    }
    let (n_img, n_cap) = (image_ids.len(), owner.len());
    let img_vecs: BTreeMap<i64, Vec<f32>> = svc
        .stored_vectors(cid, Modality::Images)
        .await?
        .into_iter()
        .collect();
    let cap_vecs = svc.stored_vectors(cid, Modality::Captions).await?;

    // Annotation: an image's rank is the best rank among its captions.
    let mut i2t = Vec::with_capacity(n_img);
    for id in image_ids {
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
        i2t.push(first_correct(&hits, |c| mine.contains(&c)).unwrap_or(n_cap + 1));
    }
    // Search: each caption is a query with one correct image.
    let mut t2i = Vec::with_capacity(n_cap);
    let (mut graph_hits, mut graph_total) = (0usize, 0usize);
    for (cap, v) in &cap_vecs {
        let hits = svc
            .rank(cid, Modality::Images, v, Modality::Captions, n_img)
            .await?;
        let target = owner[cap];
        t2i.push(first_correct(&hits, |i| i == target).unwrap_or(n_img + 1));
        // How much of the exact top 10 a k=10 search through the graph returns.
        let top = svc
            .rank(cid, Modality::Images, v, Modality::Captions, 10)
            .await?;
        let exact: HashSet<i64> = hits.iter().take(10).map(|h| h.0).collect();
        graph_hits += top.iter().filter(|h| exact.contains(&h.0)).count();
        graph_total += exact.len();
    }
    Ok(Ranks {
        i2t,
        t2i,
        index_recall: graph_hits as f64 / graph_total.max(1) as f64,
    })
}
