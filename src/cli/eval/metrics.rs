//! Retrieval metrics as the papers report them: recall at 1, 5 and 10 (percent) and the median rank, from
//! the rank of the first correct result of each query (1-based).

/// R@1, R@5, R@10 (percent) and the median rank. An even count takes the lower whole number of the two
/// middle ranks' mean.
pub(super) fn summarise(ranks: &[usize]) -> [f64; 4] {
    let n = ranks.len().max(1) as f64;
    let at = |k| 100.0 * ranks.iter().filter(|&&r| r <= k).count() as f64 / n;
    let mut s = ranks.to_vec();
    s.sort_unstable();
    let med = if s.is_empty() {
        0.0
    } else if s.len() % 2 == 1 {
        s[s.len() / 2] as f64
    } else {
        ((s[s.len() / 2 - 1] + s[s.len() / 2]) as f64 / 2.0).floor()
    };
    [at(1), at(5), at(10), med]
}

/// The 1-based rank of the first hit that `correct` accepts, if any does.
pub(super) fn first_correct(hits: &[(i64, f32)], correct: impl Fn(i64) -> bool) -> Option<usize> {
    hits.iter().position(|(id, _)| correct(*id)).map(|p| p + 1)
}

/// The keys of a report, in order; `rsum` is the sum of the six recalls.
pub(super) const KEYS: [&str; 9] = [
    "i2t_r1", "i2t_r5", "i2t_r10", "i2t_medr", "t2i_r1", "t2i_r5", "t2i_r10", "t2i_medr", "rsum",
];

/// Both directions' summaries as the values of `KEYS`.
pub(super) fn values(i2t: [f64; 4], t2i: [f64; 4]) -> [f64; 9] {
    let [a, b, c, d] = i2t;
    let [e, f, g, h] = t2i;
    [a, b, c, d, e, f, g, h, a + b + c + e + f + g]
}

/// Two decimals, as the trainer records its figures.
pub(super) fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recalls_and_medians() {
        let [r1, r5, r10, med] = summarise(&[1, 2, 6, 11]);
        assert_eq!((r1, r5, r10), (25.0, 50.0, 75.0));
        // Even count: floor of (2 + 6) / 2.
        assert_eq!(med, 4.0);
        assert_eq!(summarise(&[3, 1, 2])[3], 2.0);
        assert_eq!(summarise(&[1, 2])[3], 1.0, "floor of 1.5");
        assert_eq!(summarise(&[]), [0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn ranks_count_from_one() {
        let hits = [(7, 0.9), (3, 0.8), (5, 0.1)];
        assert_eq!(first_correct(&hits, |id| id == 7), Some(1));
        assert_eq!(first_correct(&hits, |id| id == 5 || id == 3), Some(2));
        assert_eq!(first_correct(&hits, |id| id == 1), None);
    }

    #[test]
    fn rsum_adds_the_six_recalls_not_the_medians() {
        let v = values([10.0, 20.0, 30.0, 5.0], [1.0, 2.0, 3.0, 50.0]);
        assert_eq!(v[8], 66.0);
        assert_eq!(KEYS[3], "i2t_medr");
        assert_eq!(round2(1.23456), 1.23);
    }
}
