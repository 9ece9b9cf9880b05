//! The hubness offset of an image (a product with the bank, then the k largest): time per image at several
//! batch sizes, against the same offsets from a float32 bank through ndarray's matrix product (what the server
//! did first), next to the projection that comes before it, so the cost the bank adds to an ingest is seen.
//! `--side captions` times a caption's offset against the bundle's annotation bank of images instead (the same
//! arithmetic on another bank; projected codes stand in for caption vectors, which costs the same).
use std::time::Instant;

use anyhow::{Context, ensure};
use jointspace_embed::bundle::Bundle;
use jointspace_embed::fne::TernaryCode;
use jointspace_embed::hubness::Hubness;
use jointspace_embed::projection::Projection;
use ndarray::{Array2, ArrayView1};
use serde_json::{Value, json};

use super::{Flags, Rng, round};

pub struct Opts {
    /// The bank and W of this bundle; otherwise a random bank `[captions, joint]` and W `[joint, dim]`.
    pub bundle: Option<String>,
    /// With a bundle: "images" (the caption bank, offsets of images) or "captions" (the annotation bank).
    pub side: String,
    pub captions: usize,
    pub joint: usize,
    pub dim: usize,
    pub k: usize,
    /// Batch sizes, comma-separated.
    pub batches: Vec<usize>,
    /// Images timed per batch size (rounded up to whole batches).
    pub images: usize,
}

impl Opts {
    pub fn from_flags(f: &Flags) -> anyhow::Result<Opts> {
        Ok(Opts {
            bundle: f.opt("bundle"),
            side: f.str("side", "images"),
            captions: f.num("captions", 10_000)?,
            joint: f.num("joint", 1024)?,
            dim: f.num("dim", 4224)?,
            k: f.num("k", 67)?,
            batches: f
                .str("batches", "1,8,64")
                .split(',')
                .map(|b| b.trim().parse().context("--batches: numbers"))
                .collect::<anyhow::Result<_>>()?,
            images: f.num("images", 128)?,
        })
    }
}

pub fn run(o: &Opts) -> anyhow::Result<Value> {
    let mut rng = Rng::new(23);
    let (hub, proj, source) = bank_and_projection(o, &mut rng)?;
    let dim = proj.fne_dim();
    ensure!(
        hub.joint_dim() == proj.joint_dim(),
        "bank and W disagree on the joint size"
    );
    // Codes at the default bundle's density (about 30% at each of -1 and +1), projected as the server does.
    let codes: Vec<TernaryCode> = (0..o.images)
        .map(|_| TernaryCode::from_values(&rng.ternary(dim, 0.3)))
        .collect();
    let t = Instant::now();
    let vectors: Vec<Vec<f32>> = codes.iter().map(|c| proj.project(c)).collect();
    let project_us = t.elapsed().as_secs_f64() * 1e6 / o.images as f64;

    let bank = Array2::from_shape_vec((hub.rows(), hub.joint_dim()), hub.dequantized())?;
    let mut rows = Vec::new();
    for &b in &o.batches {
        ensure!(b >= 1, "--batches: sizes from 1");
        let refs: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
        let _ = hub.offsets(&refs[..b.min(refs.len())]); // warm
        let (mut done, t) = (0, Instant::now());
        let mut offsets = Vec::new();
        while done < o.images {
            let batch: Vec<&[f32]> = (0..b).map(|j| refs[(done + j) % refs.len()]).collect();
            offsets.extend(hub.offsets(&batch));
            done += b;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / done as f64;
        ensure!(
            offsets
                .iter()
                .all(|o| o.is_finite() && o.abs() <= hub.alpha() * 1.0001),
            "an offset left [-alpha, alpha]"
        );
        // The same offsets from a float32 bank through ndarray's matrix product (the batch as columns).
        let t = Instant::now();
        let dense = dense_offsets(&hub, &bank, &refs, b, done);
        let dense_us = t.elapsed().as_secs_f64() * 1e6 / done as f64;
        let max_diff = dense
            .iter()
            .zip(&offsets)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        ensure!(
            max_diff < 1e-5,
            "int8 and float32 banks disagree by {max_diff}"
        );
        rows.push(json!({
            "batch": b,
            "offset_us_per_image": round(us, 1),
            "ndarray_f32_us_per_image": round(dense_us, 1),
            "speedup_vs_ndarray": round(dense_us / us, 2),
            "max_abs_diff_vs_ndarray": max_diff,
        }));
    }
    Ok(json!({
        "bank": source, "bank_rows": hub.rows(), "joint": hub.joint_dim(), "k": hub.k(), "fne_dim": dim,
        "images": o.images,
        "projection_us_per_image": round(project_us, 1),
        "offsets": rows,
    }))
}

/// The hubness bank, the projection before it, and what they are (the bundle's, or random ones of the
/// flags' sizes).
fn bank_and_projection(
    o: &Opts,
    rng: &mut Rng,
) -> anyhow::Result<(std::sync::Arc<Hubness>, Projection, String)> {
    Ok(match &o.bundle {
        Some(dir) => {
            let b = Bundle::load(std::path::Path::new(dir))?;
            let proj = Projection::new(&b);
            let hub = match o.side.as_str() {
                "images" => b.hubness,
                "captions" => b.annotation_hubness.map(std::sync::Arc::new),
                other => anyhow::bail!("--side {other}: images or captions"),
            }
            .with_context(|| format!("{dir} has no hubness bank for the {} side", o.side))?;
            (hub, proj, format!("bundle {} ({} side)", b.id, o.side))
        }
        None => {
            let bank: Vec<i8> = (0..o.captions * o.joint)
                .map(|_| (rng.next() * 254.0) as i8)
                .collect();
            let scales = vec![1.0 / (127.0 * (o.joint as f32).sqrt()); o.captions];
            let w: Vec<f32> = (0..o.joint * o.dim).map(|_| rng.next()).collect();
            (
                std::sync::Arc::new(Hubness::from_int8(&bank, &scales, o.joint, o.k, 0.5)),
                Projection::from_matrix(&w, o.joint, o.dim, false),
                "random".to_string(),
            )
        }
    })
}

/// The same offsets from a float32 bank through ndarray's matrix product (the batch as columns), for the
/// `done` vectors from `refs` the int8 bank was timed on.
fn dense_offsets(
    hub: &Hubness,
    bank: &Array2<f32>,
    refs: &[&[f32]],
    b: usize,
    done: usize,
) -> Vec<f32> {
    let mut dense = Vec::new();
    let mut x = Array2::<f32>::zeros((hub.joint_dim(), b));
    let mut col = Vec::new();
    for start in (0..done).step_by(b) {
        for j in 0..b {
            x.column_mut(j)
                .assign(&ArrayView1::from(refs[(start + j) % refs.len()]));
        }
        for c in bank.dot(&x).columns() {
            col.clear();
            col.extend(c.iter().copied());
            dense.push(hub.offset_of(&mut col));
        }
    }
    dense
}
