//! The exact scan: every live point (or every allowed one) scored in f32. Small or heavily filtered searches
//! take it instead of the graph (faster there, and exact), and so does a search whose graph call failed.

use std::collections::HashSet;

use super::{Hit, Inner};

pub(super) fn scan(
    inner: &Inner,
    allowed: Option<&HashSet<i64>>,
    eval: impl Fn(i64, &[f32]) -> Hit,
) -> Vec<Hit> {
    match allowed {
        Some(a) => a
            .iter()
            .filter_map(|id| inner.live.get(id).map(|v| eval(*id, v)))
            .collect(),
        None => inner.live.iter().map(|(id, v)| eval(*id, v)).collect(),
    }
}

/// The best `offset + k` of `hits` by score (ties by id), then skips `offset`.
pub(super) fn page(mut hits: Vec<Hit>, offset: usize, k: usize) -> Vec<Hit> {
    let want = offset + k;
    let cmp = |a: &Hit, b: &Hit| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id));
    if hits.len() > want {
        hits.select_nth_unstable_by(want, cmp);
        hits.truncate(want);
    }
    hits.sort_by(cmp);
    hits.into_iter().skip(offset).collect()
}
