//! A database for the query benches: collections of `n` images and `n` captions with synthetic ternary
//! codes and clustered unit vectors, written through the server's own store (`Store::insert_images`), so
//! the server builds (or loads) its indexes from them at start. The text queries stay real: the server
//! embeds them with the loaded bundle.
use std::{path::Path, time::Instant};

use jointspace_embed::bundle::Bundle;
use jointspace_embed::fne::TernaryCode;
use jointspace_embed::hubness;
use jointspace_store::{EmbeddedCaption, NewCaption, NewImage, Provenance, Store};
use serde_json::{Value, json};

use super::{Clustered, Flags, Rng, round};

pub struct Opts {
    pub database_url: String,
    pub bundle: String,
    /// One collection per size, named `n<size>`.
    pub sizes: Vec<usize>,
}

impl Opts {
    pub fn from_flags(f: &Flags) -> anyhow::Result<Opts> {
        Ok(Opts {
            database_url: f.str("database-url", "sqlite://target/bench/query.db"),
            bundle: f.str("bundle", "models/flickr8k-vgg16-fne"),
            sizes: f
                .str("sizes", "10000,100000")
                .split(',')
                .map(|s| s.trim().parse())
                .collect::<Result<_, _>>()?,
        })
    }
}

pub async fn run(o: &Opts) -> anyhow::Result<Value> {
    let b = Bundle::load(Path::new(&o.bundle))?;
    let (dim, joint) = (b.manifest.code_dim(), b.manifest.projection.joint_dim);
    let store = Store::connect(&o.database_url).await?;
    let prov = Provenance {
        bundle_id: &b.id,
        vision_id: &b.vision_id,
    };
    let mut out = vec![];
    for &n in &o.sizes {
        let name = format!("n{n}");
        if let Ok(c) = store.collection(&name).await {
            if c.images as usize == n && c.captions as usize == n {
                out.push(json!({"collection": name, "images": n, "seeded_s": 0, "note": "already there"}));
                continue;
            }
            store.delete_collection(&name).await?;
        }
        let c = store
            .create_collection(&name, "synthetic, for benchmarks")
            .await?;
        let t = Instant::now();
        let mut rng = Rng::new(n as u64);
        let mut images = Clustered::new(joint, 100, 1);
        let mut caps = Clustered::new(joint, 100, 2);
        for start in (0..n).step_by(1000) {
            let vectors: Vec<Vec<f32>> = (start..(start + 1000).min(n))
                .map(|i| images.sample(i))
                .collect();
            // Each image's search offset from the bundle's hubness bank, as an ingest computes it, so that
            // sentence searches re-rank by the scores they would have on real data.
            let refs: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
            let offsets = hubness::offsets(b.hubness.as_deref(), &refs);
            let rows: Vec<NewImage> = (start..(start + 1000).min(n))
                .zip(vectors.into_iter().zip(offsets))
                .map(|(i, (vector, offset))| {
                    let vals = rng.ternary(dim, 0.3);
                    NewImage {
                        external_id: Some(format!("synthetic-{i}")),
                        // For the filter benches: `pct` spreads the images over 100 buckets independently of
                        // their clusters (the high bits of a multiplicative hash), `group` is their cluster
                        // (`Clustered` takes cluster i % 100), so a filter on it keeps or drops whole clusters.
                        metadata: json!({
                            "shard": i % 10,
                            "pct": ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % 100,
                            "group": i % 100,
                        }),
                        width: 500,
                        height: 375,
                        code: TernaryCode::from_values(&vals).packed().to_vec(),
                        vector,
                        offset,
                        captions: vec![],
                        thumbnail: None,
                        content_hash: None,
                    }
                })
                .collect();
            store.insert_images(c.id, &rows, prov.clone(), None).await?;
            let cap_vectors: Vec<Vec<f32>> = (start..(start + 1000).min(n))
                .map(|i| caps.sample(i))
                .collect();
            let refs: Vec<&[f32]> = cap_vectors.iter().map(Vec::as_slice).collect();
            let cap_offsets = hubness::offsets(b.annotation_hubness.as_ref(), &refs);
            let cap_rows: Vec<NewCaption> = (start..(start + 1000).min(n))
                .zip(cap_vectors.into_iter().zip(cap_offsets))
                .map(|(i, (vector, offset))| NewCaption {
                    image_id: None,
                    caption: EmbeddedCaption::new(
                        format!("synthetic caption {i}"),
                        (vector, offset),
                    ),
                })
                .collect();
            store.insert_captions(c.id, &cap_rows, &b.id, None).await?;
        }
        out.push(json!({"collection": name, "images": n, "captions": n, "seeded_s": round(t.elapsed().as_secs_f64(), 1)}));
    }
    Ok(json!({"database_url": o.database_url, "bundle": b.id, "collections": out}))
}
