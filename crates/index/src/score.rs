//! How a query and a stored vector are compared (higher is better), by the bundle's similarity and the two
//! sides' modalities.

use jointspace_core::{Similarity, modality::Modality};

#[derive(Debug, Clone, Copy)]
pub enum Score {
    /// Dot product of unit vectors.
    Cosine,
    /// Cosine plus the stored point's offset: a caption query on images under a bundle with a hubness bank,
    /// an image query on captions under one with an annotation bank.
    CosineOffset,
    /// Order embeddings, `-‖max(0, c - i)‖²`; `query_is_caption` says which side the query is.
    Order { query_is_caption: bool },
    /// Negative squared distance: every pair under a euclidean bundle, and image to image under an order
    /// bundle (where S is not symmetric).
    NegL2,
}

impl Score {
    /// `offsets`: whether the bundle gives stored points of `target` offsets (only a query from the other
    /// modality uses them).
    pub fn new(sim: Similarity, query: Modality, target: Modality, offsets: bool) -> Score {
        match (sim, query, target) {
            (Similarity::Cosine, q, t) if offsets && q != t => Score::CosineOffset,
            (Similarity::Cosine, _, _) => Score::Cosine,
            (Similarity::Order, Modality::Captions, Modality::Images) => Score::Order {
                query_is_caption: true,
            },
            (Similarity::Order, Modality::Images, Modality::Captions) => Score::Order {
                query_is_caption: false,
            },
            (Similarity::Order, _, _) | (Similarity::Euclidean, _, _) => Score::NegL2,
        }
    }

    /// Whether the stored point's search offset counts.
    pub fn uses_offsets(self) -> bool {
        matches!(self, Score::CosineOffset)
    }

    /// How many graph candidates (by L2 in bfloat16) to score exactly for the best `want`: twice as many
    /// absorbs the rounding under cosine; cosine with offsets (which can lift an image the cosine alone ranks
    /// lower) re-ranks more of them. Under order similarity L2 is only a proxy for S (an image can dominate a
    /// caption, S near 0, and still be far from it): at 100k points the top 100 by L2 held 98.3% of the exact
    /// top 10 by S, the top 200 99.8%, the top 400 all of it (`bench index --similarity order`), so it takes
    /// 200. Negative distance is the graph's own metric, but its vectors are not unit-length, so bfloat16's
    /// rounding is relative to larger norms: it keeps the wider re-rank.
    pub fn candidates(self, want: usize) -> usize {
        match self {
            Score::Cosine => want * 2,
            Score::Order { .. } => (want * 4).max(200),
            _ => (want * 4).max(100),
        }
    }

    /// The score without the offset (`VectorIndex::search` adds it).
    pub fn eval(self, q: &[f32], x: &[f32]) -> f32 {
        match self {
            Score::Cosine | Score::CosineOffset => q.iter().zip(x).map(|(a, b)| a * b).sum(),
            Score::Order { query_is_caption } => {
                let (c, i) = if query_is_caption { (q, x) } else { (x, q) };
                -c.iter()
                    .zip(i)
                    .map(|(c, i)| (c - i).max(0.0).powi(2))
                    .sum::<f32>()
            }
            Score::NegL2 => -q.iter().zip(x).map(|(a, b)| (a - b).powi(2)).sum::<f32>(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_score() {
        let s = Score::Order {
            query_is_caption: true,
        };
        assert_eq!(s.eval(&[0.5, 0.1], &[0.6, 0.0]), -0.010000001);
        let t = Score::Order {
            query_is_caption: false,
        };
        assert_eq!(t.eval(&[0.6, 0.0], &[0.5, 0.1]), -0.010000001);
    }

    #[test]
    fn only_queries_from_the_other_modality_take_the_offset() {
        let with = |q, t| Score::new(Similarity::Cosine, q, t, true).uses_offsets();
        assert!(with(Modality::Captions, Modality::Images));
        assert!(with(Modality::Images, Modality::Captions));
        assert!(!with(Modality::Images, Modality::Images));
        assert!(!with(Modality::Captions, Modality::Captions));
        assert!(
            !Score::new(
                Similarity::Cosine,
                Modality::Captions,
                Modality::Images,
                false
            )
            .uses_offsets()
        );
        assert_eq!(Score::Cosine.candidates(10), 20);
        assert_eq!(Score::CosineOffset.candidates(10), 100);
        let order = Score::Order {
            query_is_caption: true,
        };
        assert_eq!((order.candidates(10), order.candidates(100)), (200, 400));
    }

    #[test]
    fn euclidean_bundles_score_every_pair_by_negative_squared_distance() {
        for (q, t) in [
            (Modality::Captions, Modality::Images),
            (Modality::Images, Modality::Captions),
            (Modality::Images, Modality::Images),
        ] {
            let s = Score::new(Similarity::Euclidean, q, t, false);
            assert!(matches!(s, Score::NegL2), "{q:?} -> {t:?}: {s:?}");
            // Not a dot product: far-apart long vectors score below near short ones.
            assert_eq!(s.eval(&[3.0, 0.0], &[3.0, 1.0]), -1.0);
            assert!(s.eval(&[3.0, 0.0], &[0.0, 3.0]) < s.eval(&[0.1, 0.0], &[0.0, 0.1]));
        }
    }
}
