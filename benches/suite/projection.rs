//! Ternary signed-sum projection (what the server runs) against dense matrix-vector products: time per
//! code, and bit-exact equality with the dense product summed in the same (index) order.
use std::time::Instant;

use anyhow::ensure;
use jointspace_embed::bundle::Bundle;
use jointspace_embed::fne::TernaryCode;
use jointspace_embed::projection::{Projection, dense_matvec};
use ndarray::{Array1, ArrayView2};
use serde_json::{Value, json};

use super::{Flags, Rng, round};

pub struct Opts {
    /// W from this bundle; otherwise a random `[joint, dim]`.
    pub bundle: Option<String>,
    pub joint: usize,
    pub dim: usize,
    pub codes: usize,
    /// Fraction of features at +1 and at -1 each.
    pub density: f32,
}

impl Opts {
    pub fn from_flags(f: &Flags) -> anyhow::Result<Opts> {
        Ok(Opts {
            bundle: f.opt("bundle"),
            joint: f.num("joint", 1024)?,
            dim: f.num("dim", 4224)?,
            codes: f.num("codes", 200)?,
            density: f.num("density", 0.3)?,
        })
    }
}

pub fn run(o: &Opts) -> anyhow::Result<Value> {
    let mut rng = Rng::new(17);
    // With a bundle, also the whole step as the server runs it (normalisation, and labels where it has them).
    let (w, joint, dim, source, served) = match &o.bundle {
        Some(dir) => {
            let b = Bundle::load(std::path::Path::new(dir))?;
            let (j, d) = (b.manifest.projection.joint_dim, b.manifest.code_dim());
            let served = Projection::new(&b);
            (b.projection, j, d, format!("bundle {}", b.id), Some(served))
        }
        None => {
            let w = (0..o.joint * o.dim).map(|_| rng.next()).collect();
            (w, o.joint, o.dim, "random".to_string(), None)
        }
    };
    let p = Projection::from_matrix(&w, joint, dim, false);
    let codes: Vec<Vec<i8>> = (0..o.codes).map(|_| rng.ternary(dim, o.density)).collect();
    let packed: Vec<TernaryCode> = codes.iter().map(|c| TernaryCode::from_values(c)).collect();
    let dense_x: Vec<Vec<f32>> = codes
        .iter()
        .map(|c| c.iter().map(|&v| f32::from(v)).collect())
        .collect();

    let time = |f: &mut dyn FnMut(usize) -> Vec<f32>| {
        let _ = f(0); // warm
        let t = Instant::now();
        let out: Vec<Vec<f32>> = (0..o.codes).map(&mut *f).collect();
        (t.elapsed().as_secs_f64() * 1e6 / o.codes as f64, out)
    };
    let (signed_us, signed) = time(&mut |i| p.signed_sum(&packed[i]));
    let project_us = served
        .as_ref()
        .map(|s| time(&mut |i| s.project(&packed[i])).0);
    // In batches of 16, as a request's images are projected together.
    let batched_us = served.as_ref().map(|s| {
        let refs: Vec<&TernaryCode> = packed.iter().collect();
        let t = Instant::now();
        let n: usize = refs.chunks(16).map(|b| s.project_all(b).len()).sum();
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    });
    let (dense_us, dense) = time(&mut |i| dense_matvec(&w, joint, dim, &dense_x[i]));
    let wv = ArrayView2::from_shape((joint, dim), &w)?;
    let (nd_us, nd) = time(&mut |i| wv.dot(&Array1::from(dense_x[i].clone())).to_vec());
    let bit_equal = signed
        .iter()
        .zip(&dense)
        .all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
    ensure!(
        bit_equal,
        "the signed sum differs from the dense product in index order"
    );
    let max_diff_nd = signed
        .iter()
        .zip(&nd)
        .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
        .fold(0f32, f32::max);
    let nonzero = codes
        .iter()
        .map(|c| c.iter().filter(|&&v| v != 0).count())
        .sum::<usize>() as f64
        / (o.codes * dim) as f64;
    Ok(json!({
        "w": source, "joint": joint, "dim": dim, "codes": o.codes, "nonzero_fraction": round(nonzero, 3),
        "signed_sum_us": round(signed_us, 1),
        "project_us": project_us.map(|u| round(u, 1)),
        "project_batch16_us": batched_us.map(|u| round(u, 1)),
        "dense_in_order_us": round(dense_us, 1),
        "dense_ndarray_us": round(nd_us, 1),
        "speedup_vs_dense_in_order": round(dense_us / signed_us, 2),
        "speedup_vs_ndarray": round(nd_us / signed_us, 2),
        "bit_equal_to_dense_in_order": bit_equal,
        "max_abs_diff_vs_ndarray": max_diff_nd,
    }))
}
