//! `eval --hybrid`: does fusing the keyword ranking with the vector ranking lower recall for Flickr-style
//! sentences? Each image of the split is copied from its stored code (no CNN) into a collection that keeps
//! its first caption as a searchable `title`, as a shop keeps a product description; its other four captions
//! are the queries, other people's words for the same photo. Each query runs through the service's own image
//! search in vector, hybrid and keyword mode (k = 10), and R@1/5/10 are reported per mode.

use std::collections::HashMap;

use base64::{Engine, engine::general_purpose::STANDARD};
use serde_json::{Value, json};

use super::metrics::round2;
use crate::service::{
    CollectionName, ImageLine, ImportMark, Query, SearchMode, SearchParams, Service,
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
    svc: &Service,
    from: &CollectionName,
    names: &[String],
    ids: &HashMap<String, i64>,
    captions: &HashMap<String, Vec<String>>,
) -> anyhow::Result<Value> {
    let to = CollectionName::parse(&format!("{}-hybrid", from.as_str()))?;
    if svc.collection(&to).await.is_ok() {
        svc.delete_collection(&to).await?;
    }
    svc.create_collection_with(&to, "eval --hybrid", Some(&["title".to_string()]))
        .await?;
    let model = svc.model();
    let mut lines = Vec::with_capacity(names.len());
    for name in names {
        let code = svc.image_code(from, ids[name]).await?;
        let title = captions
            .get(name)
            .and_then(|c| c.first())
            .cloned()
            .unwrap_or_default();
        lines.push(ImageLine {
            external_id: Some(name.clone()),
            metadata: json!({ "title": title }),
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
    let mut out = serde_json::Map::new();
    let mut queries = 0;
    for mode in [SearchMode::Vector, SearchMode::Hybrid, SearchMode::Keyword] {
        let mut ranks = vec![];
        for name in names {
            for q in captions.get(name).map(|c| &c[1..]).unwrap_or_default() {
                let p = SearchParams {
                    mode: Some(mode),
                    ..SearchParams::page(10, 0)
                };
                let hits = svc.search_images(&to, Query::Text(q.clone()), p).await?;
                ranks.push(
                    hits.hits
                        .iter()
                        .position(|h| h.row.external_id.as_deref() == Some(name.as_str()))
                        .map(|p| p + 1),
                );
            }
        }
        queries = ranks.len();
        out.insert(mode.as_str().into(), recalls(&ranks));
    }
    svc.delete_collection(&to).await?;
    out.insert("queries".into(), json!(queries));
    Ok(Value::Object(out))
}
