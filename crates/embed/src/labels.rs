//! After step 5, for bundles with labels (docs/bundle.md, "The labels section"): ConSE read off the code. The
//! ImageNet classifier scores the classes from the head's ternary features (a row per set feature), the top
//! classes' name vectors are averaged by their softmax among themselves, and that unit vector is added to the
//! image's own at a weight that a gate lowers for images near the training captions.

use std::sync::Arc;

use jointspace_core::similarity::normalise;

use crate::{
    bundle::{LabelGate, LabelTensors, LabelsSpec},
    fne::TernaryCode,
    hubness::Hubness,
};

/// The classifier read off the code, and the classes' name vectors.
pub(crate) struct Labels {
    /// `[head, classes]`: the logits' change when head feature `c` is +1 (resp. -1), one contiguous row each.
    plus_t: Vec<f32>,
    minus_t: Vec<f32>,
    bias: Vec<f32>,
    /// `[classes, joint]`.
    vectors: Vec<f32>,
    classes: usize,
    start: usize,
    top: usize,
    pub(crate) weight: f32,
    /// The gate and the caption bank it reads.
    gate: Option<(LabelGate, Arc<Hubness>)>,
}

impl Labels {
    pub(crate) fn new(spec: &LabelsSpec, t: &LabelTensors, bank: Option<Arc<Hubness>>) -> Labels {
        let transpose = |m: &[f32]| {
            let head = m.len() / spec.classes;
            let mut out = vec![0f32; m.len()];
            for k in 0..spec.classes {
                for c in 0..head {
                    out[c * spec.classes + k] = m[k * head + c];
                }
            }
            out
        };
        Labels {
            plus_t: transpose(&t.plus),
            minus_t: transpose(&t.minus),
            bias: t.bias.clone(),
            vectors: t.vectors.clone(),
            classes: spec.classes,
            start: spec.code_start,
            top: spec.top,
            weight: spec.weight,
            gate: spec.gate.zip(bank),
        }
    }

    /// The weight for each image: less the nearer its vector sits to the training captions, under a gate.
    /// One bank product for the whole batch (the bank read once; from a few vectors on, a matrix product).
    pub(crate) fn weights_for(&self, vectors: &[Vec<f32>]) -> Vec<f32> {
        match &self.gate {
            None => vec![self.weight; vectors.len()],
            Some((g, bank)) => {
                let refs: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
                bank.nearness(&refs)
                    .into_iter()
                    .map(|near| self.weight / (1.0 + (g.slope * (near - g.middle)).exp()))
                    .collect()
            }
        }
    }

    /// The classes' scores: the bias plus a row per set head feature, in index order.
    fn logits(&self, code: &TernaryCode) -> Vec<f32> {
        let n = self.classes;
        let mut l = self.bias.clone();
        for (i, (&p, &m)) in code.plus().iter().zip(code.minus()).enumerate() {
            let mut b = p | m;
            while b != 0 {
                let k = b.trailing_zeros();
                let c = i * 8 + k as usize;
                b &= b - 1;
                let Some(h) = c.checked_sub(self.start) else {
                    continue;
                };
                let rows = if p & (1 << k) != 0 {
                    &self.plus_t
                } else {
                    &self.minus_t
                };
                l.iter_mut()
                    .zip(&rows[h * n..(h + 1) * n])
                    .for_each(|(a, d)| *a += d);
            }
        }
        l
    }

    /// Adds `weight` x the unit ConSE vector to unit `v` and normalises again: the top classes (ties to the
    /// lower index) weighted by their softmax among themselves.
    pub(crate) fn fuse(&self, code: &TernaryCode, v: &mut [f32], weight: f32) {
        let l = self.logits(code);
        let mut order: Vec<usize> = (0..self.classes).collect();
        let by_score = |a: &usize, b: &usize| l[*b].total_cmp(&l[*a]).then(a.cmp(b));
        if self.top < order.len() {
            order.select_nth_unstable_by(self.top - 1, by_score);
            order.truncate(self.top);
        }
        order.sort_unstable_by(by_score);
        let best = l[order[0]];
        let p: Vec<f32> = order.iter().map(|&k| (l[k] - best).exp()).collect();
        let total: f32 = p.iter().sum();
        let joint = v.len();
        let mut c = vec![0f32; joint];
        for (&k, &pk) in order.iter().zip(&p) {
            let w = pk / total;
            c.iter_mut()
                .zip(&self.vectors[k * joint..(k + 1) * joint])
                .for_each(|(a, x)| *a += w * x);
        }
        normalise(&mut c, false);
        v.iter_mut().zip(&c).for_each(|(a, x)| *a += weight * x);
        normalise(v, false);
    }
}
