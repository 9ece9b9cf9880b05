//! Step 4: Full-Network Embedding. Mean over crops -> z-score with the training statistics -> ternary code.
//! The packed code (docs/bundle.md) is what the database stores: 2 bits per feature.

use crate::bundle::Bundle;

/// A ternary code packed as two bit planes (+1 plane, then -1 plane), feature `j` at bit `j % 8` of byte `j / 8`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TernaryCode {
    dim: usize,
    bytes: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("a packed code of {dim} features has {expected} bytes, not {found}")]
    Length {
        dim: usize,
        expected: usize,
        found: usize,
    },
    #[error("feature {0} is set in both the +1 and the -1 plane")]
    BothPlanes(usize),
}

impl TernaryCode {
    pub fn plane_len(dim: usize) -> usize {
        dim.div_ceil(8)
    }

    pub fn from_values(values: &[i8]) -> TernaryCode {
        let dim = values.len();
        let p = Self::plane_len(dim);
        let mut bytes = vec![0u8; 2 * p];
        for (j, &v) in values.iter().enumerate() {
            match v {
                1 => bytes[j / 8] |= 1 << (j % 8),
                -1 => bytes[p + j / 8] |= 1 << (j % 8),
                _ => {}
            }
        }
        TernaryCode { dim, bytes }
    }

    /// Parses a stored code, refusing one that is not a valid ternary code of `dim` features.
    pub fn from_packed(dim: usize, bytes: Vec<u8>) -> Result<TernaryCode, CodeError> {
        let p = Self::plane_len(dim);
        if bytes.len() != 2 * p {
            return Err(CodeError::Length {
                dim,
                expected: 2 * p,
                found: bytes.len(),
            });
        }
        for (i, (a, b)) in bytes[..p].iter().zip(&bytes[p..]).enumerate() {
            if a & b != 0 {
                return Err(CodeError::BothPlanes(
                    i * 8 + (a & b).trailing_zeros() as usize,
                ));
            }
        }
        Ok(TernaryCode { dim, bytes })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn packed(&self) -> &[u8] {
        &self.bytes
    }

    pub fn plus(&self) -> &[u8] {
        &self.bytes[..Self::plane_len(self.dim)]
    }

    pub fn minus(&self) -> &[u8] {
        &self.bytes[Self::plane_len(self.dim)..]
    }

    pub fn values(&self) -> Vec<i8> {
        let (p, m) = (self.plus(), self.minus());
        (0..self.dim)
            .map(|j| {
                let bit = 1 << (j % 8);
                if p[j / 8] & bit != 0 {
                    1
                } else if m[j / 8] & bit != 0 {
                    -1
                } else {
                    0
                }
            })
            .collect()
    }

    /// (number of +1, number of -1)
    pub fn counts(&self) -> (usize, usize) {
        let c = |s: &[u8]| s.iter().map(|b| b.count_ones() as usize).sum();
        (c(self.plus()), c(self.minus()))
    }
}

/// Calls `f(j)` for every set bit `j` of a plane, without testing the zero bits one by one.
pub fn for_each_set(plane: &[u8], mut f: impl FnMut(usize)) {
    for (i, &b) in plane.iter().enumerate() {
        let mut b = b;
        while b != 0 {
            let k = b.trailing_zeros() as usize;
            f(i * 8 + k);
            b &= b - 1;
        }
    }
}

/// The whole code: each backbone's FNE in code order, its features at its offset.
pub struct Fne {
    parts: Vec<Part>,
    dim: usize,
}

/// One backbone's FNE: its training statistics and thresholds.
struct Part {
    mean: Vec<f32>,
    std: Vec<f32>,
    std_eps: f32,
    lo: f32,
    hi: f32,
}

impl Fne {
    pub fn new(bundle: &Bundle) -> Fne {
        let parts: Vec<Part> = bundle
            .manifest
            .backbones()
            .zip(&bundle.fne_stats)
            .map(|(b, s)| Part {
                mean: s.mean.clone(),
                std: s.std.clone(),
                std_eps: b.fne.std_eps,
                lo: b.fne.thresholds[0],
                hi: b.fne.thresholds[1],
            })
            .collect();
        let dim = parts.iter().map(|p| p.mean.len()).sum();
        Fne { parts, dim }
    }

    /// Features in the whole code (every backbone's).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Backbone `b`'s features (its raw rows' width).
    pub fn backbone_dim(&self, b: usize) -> usize {
        self.parts[b].mean.len()
    }

    /// `rows[b]`: backbone `b`'s raw features of one image's crops, `[crops, its dim]`; one slice per backbone,
    /// in code order.
    pub fn code(&self, rows: &[&[f32]]) -> TernaryCode {
        assert_eq!(rows.len(), self.parts.len(), "one slice per backbone");
        let p = TernaryCode::plane_len(self.dim);
        let mut bytes = vec![0u8; 2 * p];
        let mut at = 0;
        for (part, rows) in self.parts.iter().zip(rows) {
            part.write(rows, at, &mut bytes, p);
            at += part.mean.len();
        }
        TernaryCode {
            dim: self.dim,
            bytes,
        }
    }
}

impl Part {
    /// Sets this backbone's features, `at..at + dim` of the code, in `bytes` (planes of `p` bytes).
    fn write(&self, rows: &[f32], at: usize, bytes: &mut [u8], p: usize) {
        let dim = self.mean.len();
        let crops = rows.len() / dim;
        for j in 0..dim {
            let f = if crops == 1 {
                rows[j]
            } else {
                let mut s = 0f32;
                for c in 0..crops {
                    s += rows[c * dim + j];
                }
                s / crops as f32
            };
            let sd = self.std[j];
            // A (near-)constant feature carries no information: z = 0, whatever the image.
            let z = if sd <= self.std_eps {
                0.0
            } else {
                (f - self.mean[j]) / sd
            };
            let k = at + j;
            if z > self.hi {
                bytes[k / 8] |= 1 << (k % 8);
            } else if z < self.lo {
                bytes[p + k / 8] |= 1 << (k % 8);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_roundtrip() {
        let v: Vec<i8> = (0..21).map(|i| [(1), (0), (-1)][i % 3]).collect();
        let c = TernaryCode::from_values(&v);
        assert_eq!(c.packed().len(), 6);
        assert_eq!(c.values(), v);
        assert_eq!(c.packed()[0], 0b0100_1001);
        assert!(TernaryCode::from_packed(21, c.packed().to_vec()).is_ok());
        assert!(TernaryCode::from_packed(21, vec![1, 0, 0, 1, 0, 0]).is_err());
        let mut seen = vec![];
        for_each_set(c.plus(), |j| seen.push(j));
        assert_eq!(seen, vec![0, 3, 6, 9, 12, 15, 18]);
    }

    #[test]
    fn backbones_codes_follow_one_another() {
        let part = |dim: usize, mean: f32| Part {
            mean: vec![mean; dim],
            std: vec![1.0; dim],
            std_eps: 1e-6,
            lo: -0.5,
            hi: 0.5,
        };
        // 3 features in one crop, then 6 over two crops (whose mean is what is coded), so that the second
        // backbone's features straddle a byte.
        let fne = Fne {
            parts: vec![part(3, 0.0), part(6, 1.0)],
            dim: 9,
        };
        let first = [1.0, -1.0, 0.2];
        let second = [
            2.0, 0.0, 1.0, 3.0, -1.0, 1.0, //
            2.0, 0.0, 1.0, 1.0, 1.0, 1.2,
        ];
        let code = fne.code(&[&first, &second]);
        assert_eq!(code.values(), [1, -1, 0, 1, -1, 0, 1, -1, 0]);
        assert_eq!(code.packed().len(), 4);
    }
}
