//! After step 5, for search only: the hubness offsets (docs/bundle.md, "The hubness section"). Some images come
//! out near the top for many captions that are not theirs (hubs); a caption query scores an image by cosine +
//! offset, with offset = -alpha x the mean of the image's k highest cosines to a bank of training captions.
//! The annotation side is the mirror: a caption's offset against a bank of training images, for image queries.
//! An offset depends on its point alone, so it is computed once, where the point's vector is, and stored.

use ndarray::{Array2, ArrayView1, ArrayView2};

pub struct Hubness {
    /// `[rows, joint]` row-major, as the bundle stores it: int8 keeps the bank at a quarter of float32's
    /// memory, and reading it is what the product costs.
    bank: Vec<i8>,
    /// Row r of the bank is `bank[r] * scales[r]`.
    scales: Vec<f32>,
    joint: usize,
    k: usize,
    alpha: f32,
}

impl std::fmt::Debug for Hubness {
    // Not the 10 million numbers of a bank.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hubness")
            .field("rows", &self.rows())
            .field("joint", &self.joint)
            .field("k", &self.k)
            .field("alpha", &self.alpha)
            .finish()
    }
}

/// Lanes of the dot product's accumulators: independent sums the compiler turns into vector registers (one
/// float accumulator would be a chain of dependent adds).
const LANES: usize = 16;
/// Batches from this size go through the matrix product (measured: `cargo bench --bench bench -- hubness`).
const PRODUCT_FROM: usize = 6;
/// Bank rows widened at a time for the matrix product (2 MB of float32 at 1,024-d).
const BLOCK_ROWS: usize = 512;

impl Hubness {
    /// From the bundle's int8 rows (`[rows, joint]`, row-major) and their scales; the bundle checked
    /// `1 <= k <= rows` and the shapes.
    pub fn from_int8(
        vectors: &[i8],
        scales: &[f32],
        joint: usize,
        k: usize,
        alpha: f32,
    ) -> Hubness {
        let rows = scales.len();
        assert_eq!(vectors.len(), rows * joint, "bank must be [rows, joint]");
        assert!((1..=rows).contains(&k), "k must be in 1..=rows");
        Hubness {
            bank: vectors.to_vec(),
            scales: scales.to_vec(),
            joint,
            k,
            alpha,
        }
    }

    pub fn joint_dim(&self) -> usize {
        self.joint
    }

    /// Training captions (or images, on the annotation side) in the bank.
    pub fn rows(&self) -> usize {
        self.scales.len()
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn alpha(&self) -> f32 {
        self.alpha
    }

    /// The bank as float32, `[rows, joint]` row-major (what a dense product would hold; the benches
    /// compare against one).
    pub fn dequantized(&self) -> Vec<f32> {
        self.bank
            .chunks_exact(self.joint)
            .zip(&self.scales)
            .flat_map(|(q, &s)| q.iter().map(move |&b| f32::from(b) * s))
            .collect()
    }

    /// The offsets of a batch of joint vectors. The bank is read once per batch. A few vectors are dotted
    /// with each row widened to float32 in a buffer that stays in L1 (a matrix product would first repack the
    /// whole bank for one column); a larger batch goes through the matrix product a block of rows at a time,
    /// widened into a block-sized buffer, so the float32 bank never exists whole.
    pub fn offsets(&self, vectors: &[&[f32]]) -> Vec<f32> {
        self.offsets_in_blocks(vectors, BLOCK_ROWS)
    }

    /// How near each vector sits to the bank: the mean of its k highest cosines (the offset is -alpha x this).
    pub fn nearness(&self, vectors: &[&[f32]]) -> Vec<f32> {
        self.top_sums(vectors, BLOCK_ROWS)
            .into_iter()
            .map(|t| (t / self.k as f64) as f32)
            .collect()
    }

    fn offsets_in_blocks(&self, vectors: &[&[f32]], block: usize) -> Vec<f32> {
        self.top_sums(vectors, block)
            .into_iter()
            .map(|t| self.offset_from(t))
            .collect()
    }

    /// Each vector's sum of its k highest bank cosines.
    fn top_sums(&self, vectors: &[&[f32]], block: usize) -> Vec<f64> {
        let rows = self.rows();
        for v in vectors {
            assert_eq!(v.len(), self.joint, "vector of the wrong size");
        }
        // sims[j * rows + r]: vector j's cosine to bank row r.
        let mut sims = vec![0f32; vectors.len() * rows];
        if vectors.len() < PRODUCT_FROM {
            let mut row = vec![0f32; self.joint];
            for (r, (q, &scale)) in self
                .bank
                .chunks_exact(self.joint)
                .zip(&self.scales)
                .enumerate()
            {
                for (x, &b) in row.iter_mut().zip(q) {
                    *x = f32::from(b);
                }
                for (j, v) in vectors.iter().enumerate() {
                    sims[j * rows + r] = scale * dot(&row, v);
                }
            }
        } else {
            let mut x = Array2::<f32>::zeros((self.joint, vectors.len()));
            for (j, v) in vectors.iter().enumerate() {
                x.column_mut(j).assign(&ArrayView1::from(*v));
            }
            let mut buf = vec![0f32; block.min(rows) * self.joint];
            for (b, (q, scales)) in self
                .bank
                .chunks(block * self.joint)
                .zip(self.scales.chunks(block))
                .enumerate()
            {
                let in_block = scales.len();
                let w = &mut buf[..in_block * self.joint];
                for ((out, q), &s) in w
                    .chunks_exact_mut(self.joint)
                    .zip(q.chunks_exact(self.joint))
                    .zip(scales)
                {
                    for (x, &b) in out.iter_mut().zip(q) {
                        *x = f32::from(b) * s;
                    }
                }
                let part = ArrayView2::from_shape((in_block, self.joint), &*w)
                    .expect("block shape")
                    .dot(&x);
                for ((i, j), &s) in part.indexed_iter() {
                    sims[j * rows + b * block + i] = s;
                }
            }
        }
        sims.chunks_exact_mut(rows)
            .map(|c| self.top_sum(c))
            .collect()
    }

    /// `-alpha * mean(top k)` of one point's bank cosines (reordered in place).
    pub fn offset_of(&self, sims: &mut [f32]) -> f32 {
        self.offset_from(self.top_sum(sims))
    }

    fn offset_from(&self, top_sum: f64) -> f32 {
        (-f64::from(self.alpha) * top_sum / self.k as f64) as f32
    }

    fn top_sum(&self, sims: &mut [f32]) -> f64 {
        let n = sims.len();
        sims.select_nth_unstable_by(n - self.k, |a, b| a.total_cmp(b));
        sims[n - self.k..].iter().map(|&s| f64::from(s)).sum()
    }
}

/// The offsets of joint vectors under a bundle's bank, if it has one: all 0 without.
pub fn offsets(bank: Option<&Hubness>, vectors: &[&[f32]]) -> Vec<f32> {
    match bank {
        Some(h) => h.offsets(vectors),
        None => vec![0.0; vectors.len()],
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
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
    fn a_batch_gives_each_vector_the_offset_it_gets_alone_and_the_dot_handles_a_tail() {
        // joint 37: two full lanes of 16 and a tail of 5; 40 captions, k 7.
        let (joint, captions) = (37, 40);
        let bank: Vec<i8> = (0..joint * captions)
            .map(|i| ((i * 7919 % 255) as i32 - 127) as i8)
            .collect();
        let scales: Vec<f32> = (0..captions).map(|r| 0.001 + r as f32 * 1e-4).collect();
        let h = Hubness::from_int8(&bank, &scales, joint, 7, 0.5);
        let vs: Vec<Vec<f32>> = (0..5)
            .map(|j| {
                (0..joint)
                    .map(|c| ((c * 31 + j * 17) % 11) as f32 / 11.0 - 0.5)
                    .collect()
            })
            .collect();
        let refs: Vec<&[f32]> = vs.iter().map(Vec::as_slice).collect();
        let batch = h.offsets(&refs);
        for (j, v) in vs.iter().enumerate() {
            // The definition in float64, straight from the int8 rows.
            let mut sims: Vec<f64> = (0..captions)
                .map(|r| {
                    (0..joint)
                        .map(|c| {
                            f64::from(bank[r * joint + c]) * f64::from(scales[r]) * f64::from(v[c])
                        })
                        .sum()
                })
                .collect();
            sims.sort_by(|a, b| b.total_cmp(a));
            let want = -0.5 * sims[..7].iter().sum::<f64>() / 7.0;
            assert!(
                (f64::from(batch[j]) - want).abs() < 1e-5,
                "{j}: {} vs {want}",
                batch[j]
            );
            assert_eq!(h.offsets(&[v]), [batch[j]], "alone and in a batch");
        }
        // A batch large enough for the matrix product, in blocks of 16 rows (40 = 16 + 16 + 8).
        let many: Vec<&[f32]> = (0..2 * PRODUCT_FROM)
            .map(|j| refs[j % refs.len()])
            .collect();
        for (j, o) in h.offsets_in_blocks(&many, 16).iter().enumerate() {
            assert!(
                (o - batch[j % refs.len()]).abs() < 1e-6,
                "{j}: {o} vs {}",
                batch[j % refs.len()]
            );
        }
    }

    #[test]
    fn the_scales_are_applied_per_row() {
        let h = Hubness::from_int8(&[100, 0, 0, 50], &[0.01, 0.02], 2, 1, 1.0);
        // rows (1, 0) and (0, 1): the larger cosine of (0.3, 0.8) is 0.8
        assert!((h.offsets(&[&[0.3, 0.8]])[0] + 0.8).abs() < 1e-6);
    }
}
