//! The exact scan: every live point (or every allowed one) scored in f32. Small or heavily filtered searches
//! take it instead of the graph (faster there, and exact), and so does a search whose graph call failed.

use std::collections::HashSet;

use super::Inner;

pub(super) fn scan(
    inner: &Inner,
    allowed: Option<&HashSet<i64>>,
    eval: impl Fn(i64, &[f32]) -> f32,
) -> Vec<(i64, f32)> {
    match allowed {
        Some(a) => a
            .iter()
            .filter_map(|id| inner.live.get(id).map(|v| (*id, eval(*id, v))))
            .collect(),
        None => inner
            .live
            .iter()
            .map(|(id, v)| (*id, eval(*id, v)))
            .collect(),
    }
}

/// The best `offset + k` of `hits` by score (ties by id), then skips `offset`.
pub(super) fn page(mut hits: Vec<(i64, f32)>, offset: usize, k: usize) -> Vec<(i64, f32)> {
    let want = offset + k;
    let cmp = |a: &(i64, f32), b: &(i64, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if hits.len() > want {
        hits.select_nth_unstable_by(want, cmp);
        hits.truncate(want);
    }
    hits.sort_by(cmp);
    hits.into_iter().skip(offset).collect()
}
