//! Step 5: joint vector = W · code, as signed column sums (the code is ternary: no multiplications), then
//! L2 normalisation and, for order embeddings, |·|.

use crate::{
    bundle::Bundle,
    fne::{TernaryCode, for_each_set},
};

pub struct Projection {
    /// W transposed, `[fne_dim, joint_dim]`: column `j` of W is one contiguous row here.
    wt: Vec<f32>,
    joint: usize,
    dim: usize,
    abs: bool,
}

impl Projection {
    pub fn new(bundle: &Bundle) -> Projection {
        let (joint, dim) = (
            bundle.manifest.projection.joint_dim,
            bundle.manifest.fne.dim,
        );
        let w = &bundle.projection;
        let mut wt = vec![0f32; w.len()];
        for r in 0..joint {
            for c in 0..dim {
                wt[c * joint + r] = w[r * dim + c];
            }
        }
        Projection {
            wt,
            joint,
            dim,
            abs: bundle.manifest.projection.abs,
        }
    }

    pub fn joint_dim(&self) -> usize {
        self.joint
    }

    pub fn fne_dim(&self) -> usize {
        self.dim
    }

    pub fn project(&self, code: &TernaryCode) -> Vec<f32> {
        let j = self.joint;
        let mut v = vec![0f32; j];
        for_each_set(code.plus(), |c| {
            v.iter_mut()
                .zip(&self.wt[c * j..(c + 1) * j])
                .for_each(|(a, w)| *a += w)
        });
        for_each_set(code.minus(), |c| {
            v.iter_mut()
                .zip(&self.wt[c * j..(c + 1) * j])
                .for_each(|(a, w)| *a -= w)
        });
        normalise(&mut v, self.abs);
        v
    }
}

/// `v /= ‖v‖₂` (a zero vector stays zero), then `|v|` when `abs`.
pub fn normalise(v: &mut [f32], abs: bool) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
    if abs {
        v.iter_mut().for_each(|x| *x = x.abs());
    }
}
