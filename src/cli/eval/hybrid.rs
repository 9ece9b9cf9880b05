//! `eval --hybrid`: what does each channel of a sentence search find, and what does their fusion? Each image
//! of the split is copied from its stored code (no CNN) into a collection that keeps its first caption as its
//! `title` text field, as a shop keeps a product's name (searched by meaning and as keywords); its other four
//! captions are the queries, other people's words for the same photo. Each query runs through the service's
//! own image search by each channel alone (vector, text, keyword) and fused (hybrid by calibrated scores, as
//! served; by min-max scores; by reciprocal rank), k = 10, and R@1/5/10 are reported per mode. With
//! `--fusion-sweep`, every weighting of the three channels on a 0.1 grid is measured for each fusion method
//! from the same candidates (the service's `channel_scores`), best first.

use std::{collections::HashMap, sync::Arc};

use base64::{Engine, engine::general_purpose::STANDARD};
use serde_json::{Value, json};

use super::metrics::round2;
use crate::service::{
    Candidates, Channel, CollectionName, CollectionSettings, Fusion, ImageLine, ImportMark, Query,
    SearchMode, SearchParams, Service, TextField, fuse,
};

/// R@1, R@5 and R@10 (percent) of ranks (None: not in the top 10).
fn recalls(ranks: &[Option<usize>]) -> Value {
    let n = ranks.len().max(1) as f64;
    let at = |k: usize| {
        round2(100.0 * ranks.iter().filter(|r| r.is_some_and(|r| r <= k)).count() as f64 / n)
    };
    json!({"r1": at(1), "r5": at(5), "r10": at(10)})
}

pub(super) async fn measure(
    svc: &Arc<Service>,
    from: &CollectionName,
    names: &[String],
    ids: &HashMap<String, i64>,
    captions: &HashMap<String, Vec<String>>,
    sweep: bool,
    per_product: usize,
) -> anyhow::Result<Value> {
    if sweep && per_product > 1 {
        anyhow::bail!(
            "--fusion-sweep weighs photos one by one: run it without --photos-per-product"
        );
    }
    let photos = Photos {
        names,
        captions,
        per_product,
    };
    let to = titled_copy(svc, from, ids, &photos).await?;
    let mut out = serde_json::Map::new();
    let queries = recall_by_mode(svc, &to, &photos, &mut out).await?;
    if sweep {
        out.insert(
            "sweep".into(),
            sweep_weights(svc, &to, names, captions).await?,
        );
    }
    svc.delete_collection(&to).await?;
    out.insert("queries".into(), json!(queries));
    Ok(Value::Object(out))
}

/// The split's photos by name, with their captions, `per_product` photos to a product.
struct Photos<'a> {
    names: &'a [String],
    captions: &'a HashMap<String, Vec<String>>,
    per_product: usize,
}

impl Photos<'_> {
    /// Each photo's product: the name of the product's first photo.
    fn product_of(&self, i: usize) -> String {
        self.names[i - i % self.per_product].clone()
    }
}

/// `<from>-hybrid`, made afresh: each photo copied from its stored code with its first caption as its
/// `title` (and its product when products have several photos).
async fn titled_copy(
    svc: &Service,
    from: &CollectionName,
    ids: &HashMap<String, i64>,
    photos: &Photos<'_>,
) -> anyhow::Result<CollectionName> {
    let (names, captions, per_product) = (photos.names, photos.captions, photos.per_product);
    let to = CollectionName::parse(&format!("{}-hybrid", from.as_str()))?;
    if svc.collection(&to).await.is_ok() {
        svc.delete_collection(&to).await?;
    }
    let settings = CollectionSettings {
        text_fields: Some(vec![TextField::new("title")]),
        group_by: (per_product > 1).then(|| "product".to_string()),
    };
    svc.create_collection_with(&to, "eval --hybrid", &settings)
        .await?;
    let model = svc.model();
    let mut lines = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let code = svc.image_code(from, ids[name]).await?;
        let title = captions
            .get(name)
            .and_then(|c| c.first())
            .cloned()
            .unwrap_or_default();
        let metadata = if per_product == 1 {
            json!({ "title": title })
        } else {
            json!({ "title": title, "product": photos.product_of(i) })
        };
        lines.push(ImageLine {
            external_id: Some(name.clone()),
            metadata,
            width: 224,
            height: 224,
            code: STANDARD.encode(code.packed()),
            vision_id: model.vision_id.clone(),
            bundle_id: model.bundle_id.clone(),
            content_hash: None,
            created_at: String::new(),
            thumbnail: None,
            captions: vec![],
        });
    }
    let mark = ImportMark {
        source: "eval --hybrid".into(),
        lines: names.len() as i64,
    };
    for chunk in lines.chunks(256) {
        svc.restore_images(&to, chunk.to_vec(), &mark).await?;
    }
    Ok(to)
}

/// R@1/5/10 of every search mode into `out`, by the mode's name; returns the queries each mode ran.
async fn recall_by_mode(
    svc: &Arc<Service>,
    to: &CollectionName,
    photos: &Photos<'_>,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<usize> {
    let (names, captions) = (photos.names, photos.captions);
    let mut queries = 0;
    let modes: [(&str, SearchParams); 6] = [
        ("vector", mode(SearchMode::Vector, None, Fusion::Score)),
        (
            "text",
            mode(SearchMode::Hybrid, Some(Channel::Text), Fusion::Score),
        ),
        ("keyword", mode(SearchMode::Keyword, None, Fusion::Score)),
        ("hybrid", mode(SearchMode::Hybrid, None, Fusion::Score)),
        (
            "hybrid_minmax",
            mode(SearchMode::Hybrid, None, Fusion::MinMax),
        ),
        ("hybrid_rank", mode(SearchMode::Hybrid, None, Fusion::Rank)),
    ];
    for (label, p) in modes {
        let mut ranks = vec![];
        for (i, name) in names.iter().enumerate() {
            let product = photos.product_of(i);
            for q in captions.get(name).map(|c| &c[1..]).unwrap_or_default() {
                let hits = svc
                    .search_images(to, Query::Text(q.clone()), p.clone())
                    .await?;
                let found = |h: &crate::service::ImageHit| match &h.product {
                    Some(p) => p.key.as_deref() == Some(product.as_str()),
                    None => h.row.external_id.as_deref() == Some(name.as_str()),
                };
                ranks.push(hits.hits.iter().position(found).map(|p| p + 1));
            }
        }
        queries = ranks.len();
        out.insert(label.into(), recalls(&ranks));
    }
    Ok(queries)
}

/// Search parameters for one row of the report: k = 10 in `m`, with only `only` as a channel if given.
fn mode(m: SearchMode, only: Option<Channel>, fusion: Fusion) -> SearchParams {
    SearchParams {
        mode: Some(m),
        channels: only.map(|c| vec![c]),
        fusion,
        ..SearchParams::page(10, 0)
    }
}

/// Every weighting (vector, text, keyword) on a 0.1 grid of the simplex under each fusion method, measured on
/// the same candidates: the five best by R@1 (then R@5) per method.
async fn sweep_weights(
    svc: &Service,
    to: &CollectionName,
    names: &[String],
    captions: &HashMap<String, Vec<String>>,
) -> anyhow::Result<Value> {
    // (the target's external id, its candidates) per query; the target's candidate id found by name below.
    let mut per_query: Vec<(String, Candidates)> = vec![];
    for name in names {
        for q in captions.get(name).map(|c| &c[1..]).unwrap_or_default() {
            per_query.push((name.clone(), svc.channel_scores(to, q).await?));
        }
    }
    let mut stored: HashMap<String, i64> = HashMap::new();
    for name in names {
        stored.insert(name.clone(), svc.image_by_external_id(to, name).await?.id);
    }
    let grid: Vec<[f32; 3]> = (0..=10)
        .flat_map(|v| {
            (0..=10 - v)
                .map(move |t| [v as f32 / 10.0, t as f32 / 10.0, (10 - v - t) as f32 / 10.0])
        })
        .collect();
    let mut out = serde_json::Map::new();
    for (label, how) in [
        ("score", Fusion::Score),
        ("minmax", Fusion::MinMax),
        ("rank", Fusion::Rank),
    ] {
        let mut rows: Vec<(f64, f64, Value)> = vec![];
        for w in &grid {
            let mut ranks = Vec::with_capacity(per_query.len());
            for (name, cands) in &mut per_query {
                for (ch, wi) in cands.channels.iter_mut().zip(w) {
                    ch.weight = *wi;
                }
                let scores = fuse(&cands.ids, &cands.channels, how);
                let target = stored.get(name.as_str()).copied();
                ranks.push(target.and_then(|t| rank_of(t, &cands.ids, &scores, &cands.similarity)));
            }
            let r = recalls(&ranks);
            let key = (
                r["r1"].as_f64().unwrap_or(0.0),
                r["r5"].as_f64().unwrap_or(0.0),
            );
            rows.push((key.0, key.1, json!({"weights": w, "recall": r})));
        }
        rows.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.total_cmp(&a.1)));
        out.insert(
            label.into(),
            Value::Array(rows.into_iter().take(5).map(|r| r.2).collect()),
        );
    }
    Ok(Value::Object(out))
}

/// The 1-based rank of `target` among candidates ordered as a page orders them (score, then similarity,
/// then id), if in the first ten.
fn rank_of(target: i64, ids: &[i64], scores: &[f32], sim: &[f32]) -> Option<usize> {
    let k = ids.iter().position(|i| *i == target)?;
    let better = (0..ids.len())
        .filter(|&j| {
            scores[j]
                .total_cmp(&scores[k])
                .then(sim[j].total_cmp(&sim[k]))
                .then(ids[k].cmp(&ids[j]))
                .is_gt()
        })
        .count();
    (better < 10).then_some(better + 1)
}
