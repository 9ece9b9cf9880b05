//! Clean-up after snapshot format 1. Those were hnsw_rs dumps, which never overwrote a file
//! (`<basename>.hnsw.*`, then `<basename>-<random>.hnsw.*` on every later save: 490 MB more per save at 100k).
//! They are dead weight now.

use std::path::Path;

pub(super) fn remove_hnsw_rs_dumps(dir: &Path, basename: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name
            .strip_suffix(".hnsw.data")
            .or_else(|| name.strip_suffix(".hnsw.graph"))
        else {
            continue;
        };
        let ours = stem == basename
            || stem
                .strip_prefix(basename)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if ours {
            if let Err(e) = std::fs::remove_file(entry.path()) {
                tracing::warn!(file = %entry.path().display(), error = %e, "could not remove an old index dump");
            }
        }
    }
}
