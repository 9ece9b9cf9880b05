//! How a query vector scores a stored one: the bundle names it, the index scores by it, the API reports it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Similarity {
    Cosine,
    Order,
    /// `-‖c - i‖²` on the vectors as they are, never normalised: the closed-form regression and CCA.
    Euclidean,
}

impl Similarity {
    /// Whether joint vectors are L2-normalised (cosine and order are defined on unit vectors).
    pub fn normalises(self) -> bool {
        self != Similarity::Euclidean
    }
}

/// `v /= ‖v‖₂` (a zero vector stays zero), then `|v|` when `abs`: the unit vectors cosine and order are
/// defined on.
pub fn normalise(v: &mut [f32], abs: bool) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
    if abs {
        v.iter_mut().for_each(|x| *x = x.abs());
    }
}
