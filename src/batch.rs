//! Dynamic batching: requests queue for a model's worker thread, which takes everything waiting (up to a row
//! budget) and makes one runtime call for all of it. Concurrent requests thus share one `session.run`, which
//! is what keeps a GPU busy and costs nothing on a CPU.

use std::{sync::mpsc, thread};

use tokio::sync::oneshot;

use crate::runtime::RuntimeError;

/// One request: `rows` rows of input; the reply holds its `rows` rows of output.
pub struct Job<I> {
    pub input: I,
    pub rows: usize,
    reply: oneshot::Sender<Result<Vec<f32>, RuntimeError>>,
}

pub struct Batcher<I> {
    tx: mpsc::SyncSender<Job<I>>,
}

impl<I> Clone for Batcher<I> {
    fn clone(&self) -> Self {
        Batcher {
            tx: self.tx.clone(),
        }
    }
}

impl<I: Send + 'static> Batcher<I> {
    /// `run` gets the jobs of one batch and returns their outputs concatenated, `dim` floats per row.
    pub fn spawn<F>(name: &str, max_rows: usize, dim: usize, mut run: F) -> Batcher<I>
    where
        F: FnMut(&[Job<I>]) -> Result<Vec<f32>, RuntimeError> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel::<Job<I>>(1024);
        let spawned = thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut pending: Option<Job<I>> = None;
                loop {
                    let first = match pending.take() {
                        Some(j) => j,
                        None => match rx.recv() {
                            Ok(j) => j,
                            Err(_) => return, // every sender dropped: shut down
                        },
                    };
                    let mut rows = first.rows;
                    let mut jobs = vec![first];
                    while rows < max_rows {
                        match rx.try_recv() {
                            Ok(j) if rows + j.rows <= max_rows => {
                                rows += j.rows;
                                jobs.push(j);
                            }
                            Ok(j) => {
                                pending = Some(j);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    match run(&jobs) {
                        Ok(out) if out.len() == rows * dim => {
                            let mut rest = out.as_slice();
                            for job in jobs {
                                let (mine, tail) = rest.split_at(job.rows * dim);
                                rest = tail;
                                let _ = job.reply.send(Ok(mine.to_vec()));
                            }
                        }
                        Ok(out) => {
                            for job in jobs {
                                let _ = job.reply.send(Err(RuntimeError::Run(format!(
                                    "expected {rows}x{dim} outputs, got {}",
                                    out.len()
                                ))));
                            }
                        }
                        Err(e) => {
                            let msg = e.to_string();
                            for job in jobs {
                                let _ = job.reply.send(Err(RuntimeError::Run(msg.clone())));
                            }
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot spawn the {name} worker");
        }
        Batcher { tx }
    }

    /// Queues one request and waits (asynchronously) for its rows.
    pub async fn submit(&self, input: I, rows: usize) -> Result<Vec<f32>, RuntimeError> {
        let (reply, rx) = oneshot::channel();
        let tx = self.tx.clone();
        // The queue is bounded: a full queue blocks the sender, so send from the blocking pool.
        tokio::task::spawn_blocking(move || tx.send(Job { input, rows, reply }))
            .await
            .map_err(|_| RuntimeError::Stopped)?
            .map_err(|_| RuntimeError::Stopped)?;
        rx.await.map_err(|_| RuntimeError::Stopped)?
    }
}
