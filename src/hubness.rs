//! After step 5, for search only: each image's hubness offset (docs/bundle.md, "The hubness section"). Some
//! images come out near the top for many captions that are not theirs (hubs); a caption query scores an image
//! by cosine + offset, with offset = -alpha x the mean of the image's k highest cosines to a bank of training
//! captions. It depends on the image alone, so it is computed once, where the image's vector is, and stored.

use ndarray::{Array2, ArrayView1};

pub struct Hubness {
    /// `[captions, joint_dim]`, row r = `vectors[r] * scales[r]` of the bundle's int8 bank.
    bank: Array2<f32>,
    k: usize,
    alpha: f32,
}

impl std::fmt::Debug for Hubness {
    // Not the 10 million numbers of a bank.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hubness")
            .field("bank", &self.bank.dim())
            .field("k", &self.k)
            .field("alpha", &self.alpha)
            .finish()
    }
}

impl Hubness {
    /// From the bundle's int8 rows (`[captions, joint]`, row-major) and their scales; the bundle checked
    /// `1 <= k <= captions` and the shapes.
    pub fn from_int8(
        vectors: &[i8],
        scales: &[f32],
        joint: usize,
        k: usize,
        alpha: f32,
    ) -> Hubness {
        let captions = scales.len();
        assert_eq!(
            vectors.len(),
            captions * joint,
            "bank must be [captions, joint]"
        );
        assert!((1..=captions).contains(&k), "k must be in 1..=captions");
        let bank = Array2::from_shape_fn((captions, joint), |(r, c)| {
            f32::from(vectors[r * joint + c]) * scales[r]
        });
        Hubness { bank, k, alpha }
    }

    pub fn joint_dim(&self) -> usize {
        self.bank.ncols()
    }

    /// The offsets of a batch of joint vectors: one matrix product with the bank for the whole batch (the
    /// vectors as columns), then each column's k largest.
    pub fn offsets(&self, vectors: &[&[f32]]) -> Vec<f32> {
        let mut x = Array2::<f32>::zeros((self.joint_dim(), vectors.len()));
        for (j, v) in vectors.iter().enumerate() {
            x.column_mut(j).assign(&ArrayView1::from(*v));
        }
        let sims = self.bank.dot(&x);
        let mut col = Vec::with_capacity(self.bank.nrows());
        sims.columns()
            .into_iter()
            .map(|c| {
                col.clear();
                col.extend(c.iter().copied());
                self.offset_of(&mut col)
            })
            .collect()
    }

    /// `-alpha * mean(top k)` of one image's bank cosines (reordered in place).
    fn offset_of(&self, sims: &mut [f32]) -> f32 {
        let n = sims.len();
        sims.select_nth_unstable_by(n - self.k, |a, b| a.total_cmp(b));
        let top: f64 = sims[n - self.k..].iter().map(|&s| f64::from(s)).sum();
        (-f64::from(self.alpha) * top / self.k as f64) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_is_minus_alpha_times_the_mean_of_the_k_best_bank_cosines() {
        // The bank is the unit axes (scale 1/127 on rows of 127), so an image's bank cosines are its coordinates;
        // the same numbers as the trainer's hub_bias test (train/tests/test_evaluate.py).
        let eye: Vec<i8> = (0..9).map(|i| if i % 4 == 0 { 127 } else { 0 }).collect();
        let h = Hubness::from_int8(&eye, &[1.0 / 127.0; 3], 3, 2, 0.5);
        let got = h.offsets(&[&[0.9, 0.5, 0.2], &[0.4, 0.3, -0.1]]);
        assert!(
            (got[0] + 0.35).abs() < 1e-6 && (got[1] + 0.175).abs() < 1e-6,
            "{got:?}"
        );
        let one = Hubness::from_int8(&eye, &[1.0 / 127.0; 3], 3, 1, 1.0);
        assert_eq!(one.offsets(&[&[0.9, 0.5, 0.2]]), [-0.9]);
        assert!(h.offsets(&[]).is_empty());
    }

    #[test]
    fn the_scales_are_applied_per_row() {
        let h = Hubness::from_int8(&[100, 0, 0, 50], &[0.01, 0.02], 2, 1, 1.0);
        // rows (1, 0) and (0, 1): the larger cosine of (0.3, 0.8) is 0.8
        assert!((h.offsets(&[&[0.3, 0.8]])[0] + 0.8).abs() < 1e-6);
    }
}
