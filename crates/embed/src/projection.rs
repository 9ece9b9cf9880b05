//! Step 5: joint vector = W · code, as signed column sums (the code is ternary: no multiplications), plus
//! the bias of an affine map (the closed-form systems), then L2 normalisation and, for order embeddings,
//! |·|. Under euclidean similarity the vector is used as it is. A bundle with labels then adds what its
//! ImageNet head names (ConSE, docs/bundle.md "The labels section"), read off the same code.

use jointspace_core::similarity::normalise;

use crate::{bundle::Bundle, fne::TernaryCode, labels::Labels};

pub struct Projection {
    /// W transposed, `[code_dim, joint_dim]`: column `j` of W is one contiguous row here.
    wt: Vec<f32>,
    joint: usize,
    dim: usize,
    abs: bool,
    bias: Option<Vec<f32>>,
    normalise: bool,
    labels: Option<Labels>,
}

impl Projection {
    pub fn new(bundle: &Bundle) -> Projection {
        let m = &bundle.manifest;
        let mut p = Projection::from_matrix(
            &bundle.projection,
            m.projection.joint_dim,
            m.code_dim(),
            m.projection.abs,
        );
        p.bias = bundle.projection_bias.clone();
        p.normalise = m.similarity.normalises();
        p.labels = m
            .labels
            .as_ref()
            .zip(bundle.labels.as_ref())
            .map(|(spec, t)| Labels::new(spec, t, bundle.hubness.clone()));
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
            labels: None,
        }
    }

    pub fn joint_dim(&self) -> usize {
        self.joint
    }

    /// Features of the code W reads: every backbone's, as stored codes have them.
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
        self.project_all(&[code]).pop().expect("one vector")
    }

    /// The vectors of a batch of codes (a batch shares the labels' gate's bank product).
    pub fn project_all(&self, codes: &[&TernaryCode]) -> Vec<Vec<f32>> {
        let mut vectors: Vec<Vec<f32>> = codes
            .iter()
            .map(|code| {
                let mut v = self.signed_sum(code);
                if let Some(b) = &self.bias {
                    v.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                }
                if self.normalise {
                    normalise(&mut v, self.abs);
                }
                v
            })
            .collect();
        if let Some(l) = &self.labels {
            let weights = l.weights_for(&vectors);
            for ((v, code), w) in vectors.iter_mut().zip(codes).zip(weights) {
                l.fuse(code, v, w);
            }
        }
        vectors
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        bundle::{LabelGate, LabelTensors, LabelsSpec},
        hubness::Hubness,
    };

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
    fn labels_add_the_top_classes_name_vectors_read_off_the_code() {
        // Identity W on 3 features, joint 2... W is [2, 3]: feature 0 -> x, features 1-2 unused by W.
        let mut p = Projection::from_matrix(&[1.0, 0.0, 0.0, 0.0, 0.0, 0.0], 2, 3, false);
        // The head is features 1..3; three classes. Logits = bias + plus/minus rows of the set features.
        let spec = LabelsSpec {
            weights: String::new(),
            from: None,
            classes: 3,
            code_start: 1,
            top: 2,
            weight: 1.0,
            gate: None,
            source: serde_json::Value::Null,
        };
        let t = LabelTensors {
            // [classes, head]: feature 1 at +1 raises class 2 by 3; feature 2 at -1 raises class 1 by 3.
            plus: vec![0.0, 0.0, 0.0, 0.0, 3.0, 0.0],
            minus: vec![0.0, 0.0, 0.0, 3.0, 0.0, 0.0],
            bias: vec![1.0, 0.0, 0.0],
            // Class 0 names +x, class 1 +y, class 2 -y.
            vectors: vec![1.0, 0.0, 0.0, 1.0, 0.0, -1.0],
        };
        p.labels = Some(Labels::new(&spec, &t, None));
        // Feature 1 +1: logits [1, 0, 3]; the top two are class 2 then class 0, softmax e^0 : e^-2.
        let v = p.project(&TernaryCode::from_values(&[1, 1, 0]));
        let (p2, p0) = (
            1.0 / (1.0 + (-2f32).exp()),
            (-2f32).exp() / (1.0 + (-2f32).exp()),
        );
        let n = (p0 * p0 + p2 * p2).sqrt();
        let (cx, cy) = (p0 / n, -p2 / n);
        let (fx, fy) = (1.0 + cx, cy);
        let fnorm = (fx * fx + fy * fy).sqrt();
        let want = [fx / fnorm, fy / fnorm];
        assert!(
            v.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{v:?} vs {want:?}"
        );
        // Features 1 and 2 both set: logits [1, 3, 3]: a tie goes to the lower class, 1 then 2, which cancel.
        let v = p.project(&TernaryCode::from_values(&[1, 1, -1]));
        assert!((v[0] - 1.0).abs() < 1e-6 && v[1].abs() < 1e-6, "{v:?}");
        // A weight of 0 leaves W . code alone.
        p.labels.as_mut().unwrap().weight = 0.0;
        assert_eq!(
            p.project(&TernaryCode::from_values(&[1, 1, 0])),
            vec![1.0, 0.0]
        );
    }

    #[test]
    fn the_gate_lowers_the_labels_weight_near_the_training_captions() {
        let mut p = Projection::from_matrix(&[1.0, 0.0, 0.0, 0.0], 2, 2, false);
        let spec = LabelsSpec {
            weights: String::new(),
            from: None,
            classes: 1,
            code_start: 1,
            top: 1,
            weight: 1.0,
            gate: Some(LabelGate {
                middle: 0.5,
                slope: 10.0,
            }),
            source: serde_json::Value::Null,
        };
        let t = LabelTensors {
            plus: vec![0.0],
            minus: vec![0.0],
            bias: vec![0.0],
            vectors: vec![0.0, 1.0],
        };
        // The only caption of the bank is +x, where the image's own vector points (nearness 1).
        let bank = |row: [i8; 2]| Arc::new(Hubness::from_int8(&row, &[1.0 / 127.0], 2, 1, 0.5));
        let fused = |p: &Projection| p.project(&TernaryCode::from_values(&[1, 0]));
        let expect = |w: f32| {
            let n = (1.0 + w * w).sqrt();
            [1.0 / n, w / n]
        };
        let close =
            |v: Vec<f32>, want: [f32; 2]| v.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-5);
        p.labels = Some(Labels::new(&spec, &t, Some(bank([127, 0]))));
        let near = 1.0 / (1.0 + (10.0f32 * (1.0 - 0.5)).exp());
        assert!(close(fused(&p), expect(near)), "{:?}", fused(&p));
        // A bank of -x: nearness -1, the weight nearly whole.
        p.labels = Some(Labels::new(&spec, &t, Some(bank([-127, 0]))));
        let far = 1.0 / (1.0 + (10.0f32 * (-1.0 - 0.5)).exp());
        assert!(
            far > 0.99 && close(fused(&p), expect(far)),
            "{:?}",
            fused(&p)
        );
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
