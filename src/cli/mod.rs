//! The non-serving commands, one file each: `ingest` a folder, `eval` a bundle end to end, `inspect` a
//! bundle, `reindex` stored codes, `export` a collection and `import` it (or a catalogue), `sync` a collection
//! with a catalogue feed. `ingest` and `eval` go through `Service`, the same code path as the HTTP
//! API, by way of `add` (resumable batched adds).

mod add;
mod eval;
mod export;
mod import;
mod ingest;
mod inspect;
mod reindex;
mod sync;

use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};

pub use eval::{eval, read_captions};
pub use export::export;
pub use import::import;
pub use ingest::ingest;
pub use inspect::inspect;
pub use reindex::reindex;
pub use sync::sync;

use crate::{
    app::load_pipeline,
    config::ModelArgs,
    pipeline::Pipeline,
    service::{CollectionName, Service},
};

fn progress(n: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(n as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} {bar:40} {pos}/{len} [{elapsed_precise}<{eta_precise}, {per_sec}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_message(what.to_string());
    pb
}

/// The collection's id, creating the collection if it does not exist yet.
async fn ensure_collection(svc: &Service, name: &CollectionName) -> anyhow::Result<i64> {
    match svc.create_collection(name, "").await {
        Ok(c) => Ok(c.id),
        Err(e) if e.is_conflict() => Ok(svc.collection(name).await?.id),
        Err(e) => Err(e.into()),
    }
}

/// The pipeline of a batch job (ingest, eval, reindex): it queues as much as it is given and waits its turn.
/// Refusing work with "overloaded" (the server's load shedding, `--max-queue-wait-ms`) protects interactive
/// clients' latency; an offline job with a few requests in flight would only fail on it.
fn offline_pipeline(model: &ModelArgs) -> anyhow::Result<Arc<Pipeline>> {
    let mut model = model.clone();
    model.max_queue_wait_ms = 0;
    model.inference_queue = usize::MAX;
    load_pipeline(&model)
}
