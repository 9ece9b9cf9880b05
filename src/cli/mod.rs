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
    runtime::Device,
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
    load_pipeline(&offline(model))
}

/// A batch command's model settings: no load shedding, and where not given, ONNX Runtime's arena kept with
/// small runs on the CPU (throughput first: 1.9x the photos/s of giving the memory back after every run, at
/// a lower peak than the server's 32 crops; docs/benchmarks.md, "Bulk ingest").
pub(crate) fn offline(model: &ModelArgs) -> ModelArgs {
    let mut model = model.clone();
    model.max_queue_wait_ms = 0;
    model.inference_queue = usize::MAX;
    model.runtime.release_inference_memory.get_or_insert(false);
    if model.runtime.device == Device::Cpu {
        model.max_batch_crops.get_or_insert(4);
    }
    model
}

#[cfg(test)]
mod tests {
    use super::offline;
    use crate::config::ServeArgs;

    fn model(flags: &[&str]) -> crate::config::ModelArgs {
        ServeArgs::try_from_flags(flags.iter().copied())
            .expect("flags")
            .model
    }

    #[test]
    fn batch_commands_keep_the_arena_and_run_small_batches_on_the_cpu_unless_told() {
        let serve = model(&[]);
        assert!(
            serve.runtime.options().release_memory,
            "serve gives memory back"
        );
        assert_eq!(serve.max_batch_crops, None);
        let batch = offline(&serve);
        assert!(!batch.runtime.options().release_memory);
        assert_eq!(batch.max_batch_crops, Some(4));
        assert_eq!(batch.max_queue_wait_ms, 0);
        // What is given stands.
        let given = offline(&model(&[
            "--release-inference-memory",
            "true",
            "--max-batch-crops",
            "16",
        ]));
        assert!(given.runtime.options().release_memory);
        assert_eq!(given.max_batch_crops, Some(16));
        // A GPU wants larger runs: the windowed default's best on an H100.
        assert_eq!(
            offline(&model(&["--device", "cuda"])).max_batch_crops(),
            256
        );
        assert_eq!(serve.max_batch_crops(), 32);
    }
}
