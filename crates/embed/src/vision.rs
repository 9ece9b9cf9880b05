//! Step 3: a backbone's vision graph over crops. Requests queue for one worker per graph that batches them into
//! runtime calls of at most `max_batch_crops` crops (whole images per run): concurrent requests share a
//! `session.run`, and a large upload cannot ask for gigabytes of activations at once. A bundle with several
//! backbones has one `Vision` (one worker, one session) per backbone.

use std::{sync::Arc, time::Duration};

use crate::{
    batch::{BatchOptions, BatchStats, Batcher, Job},
    bundle::VisionSpec,
    crops,
    runtime::{Backend, RuntimeError},
};

/// Backbone `graph`'s worker, as its thread and its metrics' `model` label name it: the first keeps the name a
/// single-backbone bundle's has always had, `vision`; the others are `vision-1`, `vision-2`...
pub fn worker_name(graph: usize) -> String {
    match graph {
        0 => "vision".to_string(),
        g => format!("vision-{g}"),
    }
}

/// How a backbone's runtime calls are made.
#[derive(Debug, Clone, Copy)]
pub struct VisionRuns {
    /// Calls in flight at once (worker threads; the backend holds a session for each).
    pub workers: usize,
    /// Pad each call's rows with black crops to the next power of two (at most the batch's maximum), so the
    /// runtime sees a few input shapes instead of every count: CUDA plans each new shape, which cost
    /// EfficientNet-Lite2 over a second a call (docs/benchmarks.md, "GPU").
    pub pad_rows: bool,
}

/// The rows a call of `rows` is padded to under `pad_rows`, at most `max_rows` (and never fewer than `rows`).
pub fn padded_rows(rows: usize, max_rows: usize) -> usize {
    rows.next_power_of_two().min(max_rows).max(rows)
}

/// Every shape a padded call can take when each photo brings `per` rows and a call holds at most `max_rows`
/// (whole photos only), smallest first: what `Vision::warm` runs once per session.
pub fn padded_shapes(per: usize, max_rows: usize) -> Vec<usize> {
    let per = per.max(1);
    let photos = (max_rows / per).max(1);
    let mut shapes: Vec<usize> = (1..=photos)
        .map(|k| padded_rows(k * per, max_rows.max(per)))
        .collect();
    shapes.dedup();
    shapes
}

pub struct Vision {
    batcher: Batcher<Vec<f32>>,
    max_batch_crops: usize,
    crop_len: usize,
    raw_dim: usize,
    /// What `warm` needs: the runtime under the worker, this backbone's graph and side, and whether calls pad.
    backend: Arc<dyn Backend>,
    graph: usize,
    side: usize,
    pad_rows: bool,
}

impl Vision {
    /// Backbone `graph`'s worker (`spec`: its vision section); `opts.max_rows` is the most crops in one
    /// runtime call.
    pub fn new(
        backend: Arc<dyn Backend>,
        graph: usize,
        spec: &VisionSpec,
        opts: BatchOptions,
        stats: BatchStats,
        runs: VisionRuns,
    ) -> Vision {
        let (side, crop_len, raw_dim) = (spec.graph_side(), crops::crop_len(spec), spec.raw_dim);
        let max_batch_crops = opts.max_rows.max(1);
        let runtime = backend.clone();
        let batcher = Batcher::spawn_workers(
            &worker_name(graph),
            runs.workers,
            opts,
            raw_dim,
            stats,
            move |jobs: &[Job<Vec<f32>>]| {
                let rows: usize = jobs.iter().map(|j| j.rows).sum();
                let shape = if runs.pad_rows {
                    padded_rows(rows, max_batch_crops)
                } else {
                    rows
                };
                if let ([one], true) = (jobs, shape == rows) {
                    return runtime.vision(graph, &one.input, rows, side);
                }
                // Several requests, or padding: one contiguous input for one run.
                let mut all = Vec::with_capacity(shape * crop_len);
                jobs.iter().for_each(|j| all.extend_from_slice(&j.input));
                all.resize(shape * crop_len, 0.0);
                let mut out = runtime.vision(graph, &all, shape, side)?;
                out.truncate(rows * raw_dim);
                Ok(out)
            },
        );
        Vision {
            batcher,
            max_batch_crops,
            crop_len,
            raw_dim,
            backend,
            graph,
            side,
            pad_rows: runs.pad_rows,
        }
    }

    /// Runs a black call of every shape the padded calls can take, `per` rows a photo, through every session,
    /// so no request waits for the runtime to plan one (`--warm-batch-shapes`; CUDA plans a shape per session,
    /// 3-5 s for EfficientNet-Lite2 on an H200). Blocking. Returns the shapes, the readiness probe's one crop
    /// first; None when the calls are not padded (every row count is a shape).
    pub fn warm(&self, per: usize) -> Result<Option<Vec<usize>>, RuntimeError> {
        if !self.pad_rows {
            return Ok(None);
        }
        let mut shapes = vec![1];
        shapes.extend(padded_shapes(per, self.max_batch_crops));
        shapes.dedup();
        let most = shapes.last().copied().unwrap_or(per);
        let black = vec![0f32; most * self.crop_len];
        for &rows in &shapes {
            self.backend.warm_vision(
                self.graph,
                &black[..rows * self.crop_len],
                rows,
                self.side,
            )?;
        }
        Ok(Some(shapes))
    }

    /// Whether the worker answers (readiness): one black crop through the queue, unless a run just succeeded.
    pub async fn probe(&self, fresh: Duration, timeout: Duration) -> Result<(), RuntimeError> {
        let len = self.crop_len;
        self.batcher.probe(|| vec![0.0; len], fresh, timeout).await
    }

    /// Whether the worker thread still runs (see `Batcher::alive`).
    pub fn alive(&self) -> bool {
        self.batcher.alive()
    }

    pub fn raw_dim(&self) -> usize {
        self.raw_dim
    }

    /// `images`: each image's `per` crops (NCHW, normalised) -> `[images * per, raw_dim]` features.
    pub async fn features(
        &self,
        images: Vec<Vec<f32>>,
        per: usize,
    ) -> Result<Vec<f32>, RuntimeError> {
        let n = images.len();
        let per_run = (self.max_batch_crops / per).max(1);
        let mut runs = Vec::with_capacity(n.div_ceil(per_run));
        let mut it = images.into_iter().peekable();
        while it.peek().is_some() {
            let chunk: Vec<Vec<f32>> = it.by_ref().take(per_run).collect();
            let rows = chunk.len() * per;
            // A run of one image hands its buffer over without a copy.
            let input = if chunk.len() == 1 {
                chunk.into_iter().next().unwrap_or_default()
            } else {
                let mut all = Vec::with_capacity(rows * self.crop_len);
                chunk.iter().for_each(|c| all.extend_from_slice(c));
                all
            };
            runs.push((input, rows));
        }
        let mut raw = Vec::with_capacity(n * per * self.raw_dim);
        for out in self.batcher.submit_all(runs).await? {
            raw.extend_from_slice(&out);
        }
        Ok(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::padded_rows;

    #[test]
    fn the_padded_shapes_are_each_whole_photo_count_padded() {
        // Ten crops, 40 rows a call: 10, 20, 30, 40 rows pad to 16, 32, 32, 40.
        assert_eq!(super::padded_shapes(10, 40), vec![16, 32, 40]);
        // Windowed (2 a photo) up to 256: every power of two from 2.
        assert_eq!(
            super::padded_shapes(2, 256),
            vec![2, 4, 8, 16, 32, 64, 128, 256]
        );
        // A call smaller than one photo still takes the photo.
        assert_eq!(super::padded_shapes(10, 4), vec![10]);
    }

    #[test]
    fn rows_are_padded_to_a_power_of_two_within_the_batch() {
        assert_eq!(padded_rows(1, 256), 1);
        assert_eq!(padded_rows(10, 256), 16);
        assert_eq!(padded_rows(64, 256), 64);
        assert_eq!(padded_rows(130, 256), 256);
        // Never past the batch's maximum, and never below the rows themselves.
        assert_eq!(padded_rows(130, 200), 200);
        assert_eq!(padded_rows(300, 256), 300);
    }
}
