//! Step 5: joint vector = W · code, as signed column sums (the code is ternary: no multiplications), plus
//! the bias of an affine map (the closed-form systems), then L2 normalisation and, for order embeddings,
//! |·|. Under euclidean similarity the vector is used as it is.

use crate::{bundle::Bundle, fne::TernaryCode};

pub struct Projection {
    /// W transposed, `[fne_dim, joint_dim]`: column `j` of W is one contiguous row here.
    wt: Vec<f32>,
    joint: usize,
    dim: usize,
    abs: bool,
    bias: Option<Vec<f32>>,
    normalise: bool,
}

impl Projection {
    pub fn new(bundle: &Bundle) -> Projection {
        let m = &bundle.manifest;
        let mut p = Projection::from_matrix(
            &bundle.projection,
            m.projection.joint_dim,
            m.fne.dim,
            m.projection.abs,
        );
        p.bias = bundle.projection_bias.clone();
        p.normalise = m.similarity.normalises();
        p
    }

    /// From W, row-major `[joint, dim]`: a linear map to unit vectors (no bias).
    pub fn from_matrix(w: &[f32], joint: usize, dim: usize, abs: bool) -> Projection {
        assert_eq!(w.len(), joint * dim, "W must be [joint, dim]");
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
            abs,
            bias: None,
            normalise: true,
        }
    }

    pub fn joint_dim(&self) -> usize {
        self.joint
    }

    pub fn fne_dim(&self) -> usize {
        self.dim
    }

    /// W · code before normalisation: one pass over the features in index order, adding or subtracting
    /// column `c`. Visiting both planes in one ascending pass makes every output the same sequence of f32
    /// operations as a dense `sum_c W[r,c] * code[c]` in index order, so the result is bit-identical to it.
    pub fn signed_sum(&self, code: &TernaryCode) -> Vec<f32> {
        let j = self.joint;
        let mut v = vec![0f32; j];
        for (i, (&p, &m)) in code.plus().iter().zip(code.minus()).enumerate() {
            let mut b = p | m;
            while b != 0 {
                let k = b.trailing_zeros();
                let c = i * 8 + k as usize;
                let col = &self.wt[c * j..(c + 1) * j];
                if p & (1 << k) != 0 {
                    v.iter_mut().zip(col).for_each(|(a, w)| *a += w);
                } else {
                    v.iter_mut().zip(col).for_each(|(a, w)| *a -= w);
                }
                b &= b - 1;
            }
        }
        v
    }

    pub fn project(&self, code: &TernaryCode) -> Vec<f32> {
        let mut v = self.signed_sum(code);
        if let Some(b) = &self.bias {
            v.iter_mut().zip(b).for_each(|(x, b)| *x += b);
        }
        if self.normalise {
            normalise(&mut v, self.abs);
        }
        v
    }
}

/// The dense reference: `W · x` with W row-major `[joint, dim]`, each output summed in index order.
pub fn dense_matvec(w: &[f32], joint: usize, dim: usize, x: &[f32]) -> Vec<f32> {
    (0..joint)
        .map(|r| {
            w[r * dim..(r + 1) * dim]
                .iter()
                .zip(x)
                .fold(0f32, |a, (w, x)| a + w * x)
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_sum_is_bit_identical_to_the_dense_product() {
        let (joint, dim) = (37, 301);
        let mut s = 5u64;
        let mut rnd = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as f32 / (1u64 << 31) as f32 - 0.5
        };
        let w: Vec<f32> = (0..joint * dim).map(|_| rnd() * 3.0).collect();
        let p = Projection::from_matrix(&w, joint, dim, false);
        for _ in 0..20 {
            let vals: Vec<i8> = (0..dim)
                .map(|_| match rnd() {
                    x if x < -0.1 => -1,
                    x if x > 0.1 => 1,
                    _ => 0,
                })
                .collect();
            let x: Vec<f32> = vals.iter().map(|&v| f32::from(v)).collect();
            let code = TernaryCode::from_values(&vals);
            let dense = dense_matvec(&w, joint, dim, &x);
            let ours = p.signed_sum(&code);
            assert!(
                ours.iter()
                    .zip(&dense)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "signed sum differs from the dense product"
            );
        }
    }

    #[test]
    fn an_affine_euclidean_map_adds_the_bias_and_keeps_the_length() {
        // W = [[1, 2], [0.5, -1]], code = [+1, -1]: W · code = [-1, 1.5].
        let mut p = Projection::from_matrix(&[1.0, 2.0, 0.5, -1.0], 2, 2, false);
        let code = TernaryCode::from_values(&[1, -1]);
        let n = 3.25f32.sqrt();
        assert_eq!(p.project(&code), vec![-1.0 / n, 1.5 / n]);
        p.bias = Some(vec![10.0, -0.5]);
        p.normalise = false;
        assert_eq!(p.project(&code), vec![9.0, 1.0]);
    }
}
