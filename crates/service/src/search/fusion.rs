//! Fusing the channels of a sentence search into one ranking. Each channel scores the candidates on its own
//! scale (a cosine, a full-text relevance); fusion by calibrated scores standardises each channel over the
//! query's candidate pool (zero mean, unit spread) and sums them by weight, so a channel that is sure of one
//! candidate (far above the rest) counts for more than one that barely separates them. Reciprocal-rank fusion
//! throws that away: the first of two near-ties and the first of a clear winner weigh the same.

use std::collections::HashMap;

/// Where a sentence finds an image: its photo (the sentence's vector against the image's), its words by
/// meaning (against the vectors of its captions and text fields), its words as keywords (full text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    Vector,
    Text,
    Keyword,
}

impl Channel {
    pub const ALL: [Channel; 3] = [Channel::Vector, Channel::Text, Channel::Keyword];

    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Vector => "vector",
            Channel::Text => "text",
            Channel::Keyword => "keyword",
        }
    }
}

/// The keyword channel's share of a hybrid search's fused score, checked once where a caller gives it: 0..=1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeywordWeight(f32);

impl KeywordWeight {
    pub fn parse(weight: f32) -> Result<KeywordWeight, String> {
        if (0.0..=1.0).contains(&weight) {
            Ok(KeywordWeight(weight))
        } else {
            Err(format!(
                "keyword_weight is {weight}; it must be between 0 and 1"
            ))
        }
    }

    pub fn get(self) -> f32 {
        self.0
    }
}

/// How the channels' scores are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fusion {
    /// Each channel standardised over the candidate pool, summed by weight.
    #[default]
    Score,
    /// Each channel rescaled to 0..1 over the candidate pool (its lowest 0, its highest 1), summed by weight.
    MinMax,
    /// Reciprocal rank: weight / (60 + rank) summed over the channels that ranked the candidate.
    Rank,
}

/// RRF's constant, as in Cormack et al. (2009).
const RRF_K: f32 = 60.0;

/// What each channel said of a hit: the photo's similarity to the sentence, its nearest sentence's
/// similarity, its keyword relevance (None: the channel did not reach it, or was not asked).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChannelValues {
    pub vector: Option<f32>,
    pub text: Option<f32>,
    pub keyword: Option<f32>,
}

/// One channel's view of the candidates.
pub struct ChannelScores {
    pub weight: f32,
    /// The raw score of each candidate the channel scored.
    pub values: HashMap<i64, f32>,
    /// The score of a candidate the channel did not reach: a bound on what it would have given (the lowest
    /// score of its list, or no match at all for the keyword channel).
    pub floor: f32,
}

impl ChannelScores {
    fn value(&self, id: i64) -> f32 {
        self.values.get(&id).copied().unwrap_or(self.floor)
    }

    /// The channel's candidates best first (ties by id), for rank fusion.
    fn ranks(&self) -> HashMap<i64, usize> {
        let mut order: Vec<(i64, f32)> = self.values.iter().map(|(i, v)| (*i, *v)).collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        order
            .into_iter()
            .enumerate()
            .map(|(r, (i, _))| (i, r))
            .collect()
    }
}

/// The fused score of each candidate, in the order given.
pub fn fuse(candidates: &[i64], channels: &[ChannelScores], how: Fusion) -> Vec<f32> {
    let mut fused = vec![0.0f32; candidates.len()];
    for ch in channels.iter().filter(|c| c.weight > 0.0) {
        if how == Fusion::Rank {
            let ranks = ch.ranks();
            for (f, id) in fused.iter_mut().zip(candidates) {
                if let Some(r) = ranks.get(id) {
                    *f += ch.weight / (RRF_K + *r as f32 + 1.0);
                }
            }
            continue;
        }
        let values: Vec<f32> = candidates.iter().map(|id| ch.value(*id)).collect();
        let (shift, scale) = match how {
            Fusion::MinMax => {
                let lo = values.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                (lo, hi - lo)
            }
            _ => {
                let n = values.len() as f32;
                let mean = values.iter().sum::<f32>() / n;
                let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
                (mean, var.sqrt())
            }
        };
        // A channel that cannot tell the candidates apart says nothing about their order.
        if scale.is_nan() || scale <= 1e-6 {
            continue;
        }
        for (f, v) in fused.iter_mut().zip(&values) {
            *f += ch.weight * (v - shift) / scale;
        }
    }
    fused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel(_: Channel, weight: f32, values: &[(i64, f32)], floor: f32) -> ChannelScores {
        ChannelScores {
            weight,
            values: values.iter().copied().collect(),
            floor,
        }
    }

    #[test]
    fn a_channel_sure_of_one_candidate_outweighs_one_that_barely_separates_them() {
        // The vector channel puts 1 a hair above 2; the text channel puts 2 far above everything.
        let vector = channel(
            Channel::Vector,
            0.5,
            &[(1, 0.301), (2, 0.300), (3, 0.299), (4, 0.298)],
            0.0,
        );
        let text = channel(Channel::Text, 0.5, &[(2, 0.9), (1, 0.2), (3, 0.21)], 0.2);
        let ids = [1, 2, 3, 4];
        let by_score = fuse(&ids, &[vector, text], Fusion::Score);
        assert!(by_score[1] > by_score[0], "{by_score:?}");
        // Rank fusion: weight / (60 + rank) per channel that ranked the candidate.
        let vector = channel(Channel::Vector, 0.5, &[(1, 0.301), (2, 0.300)], 0.0);
        let text = channel(Channel::Text, 0.5, &[(2, 0.9)], 0.2);
        let by_rank = fuse(&ids, &[vector, text], Fusion::Rank);
        assert_eq!(by_rank, vec![0.5 / 61.0, 0.5 / 62.0 + 0.5 / 61.0, 0.0, 0.0]);
    }

    #[test]
    fn an_unreached_candidate_takes_the_floor_and_a_flat_channel_counts_for_nothing() {
        let keyword = channel(Channel::Keyword, 1.0, &[(7, 3.0)], 0.0);
        let flat = channel(Channel::Text, 1.0, &[(7, 0.5), (8, 0.5)], 0.5);
        let f = fuse(&[7, 8, 9], &[keyword, flat], Fusion::Score);
        // Keyword values 3, 0, 0: mean 1, spread sqrt(2).
        assert!((f[0] - 2.0 / 2f32.sqrt()).abs() < 1e-5, "{f:?}");
        assert!((f[1] + 1.0 / 2f32.sqrt()).abs() < 1e-5, "{f:?}");
        assert_eq!(f[1], f[2]);
        let m = fuse(
            &[7, 8, 9],
            &[channel(Channel::Keyword, 2.0, &[(7, 3.0), (8, 1.5)], 0.0)],
            Fusion::MinMax,
        );
        assert_eq!(m, vec![2.0, 1.0, 0.0]);
    }

    #[test]
    fn a_keyword_weight_is_a_share() {
        assert_eq!(KeywordWeight::parse(0.25).map(KeywordWeight::get), Ok(0.25));
        for bad in [-0.1, 1.5, f32::NAN] {
            let e = KeywordWeight::parse(bad).expect_err("out of range");
            assert!(e.contains("between 0 and 1"), "{e}");
        }
    }

    #[test]
    fn a_weight_of_zero_leaves_a_channel_out() {
        let vector = channel(Channel::Vector, 1.0, &[(1, 0.2), (2, 0.4)], 0.0);
        let keyword = channel(Channel::Keyword, 0.0, &[(1, 9.0)], 0.0);
        let f = fuse(&[1, 2], &[vector, keyword], Fusion::Score);
        assert!(f[1] > f[0]);
    }
}
