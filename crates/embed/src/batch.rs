//! Dynamic batching: requests queue for a model's worker thread, which takes everything waiting (up to a row
//! budget, holding a non-full batch open at most `max_wait` for more) and makes one runtime call for all of
//! it. Concurrent requests thus share one `session.run`, which is what keeps a GPU busy.
//!
//! The queue is bounded in rows (crops, sentences) and in expected wait, and never blocks: a request that does
//! not fit is refused at once (`RuntimeError::Overloaded`, a 429 with Retry-After) instead of waiting an
//! unbounded time behind the backlog. The wait bound matters on a CPU, where a row of the vision model costs
//! ~0.4 s: 256 queued crops would be minutes. A request always fits an empty queue, so no single request is
//! refused for its size alone.
//!
//! `probe` tells readiness whether the worker answers: a run that succeeded a moment ago is answer enough;
//! otherwise one row goes through the queue like any request.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        mpsc::{self, RecvTimeoutError, TryRecvError},
    },
    thread,
    time::{Duration, Instant},
};

use prometheus_client::metrics::{counter::Counter, gauge::Gauge, histogram::Histogram};
use tokio::sync::oneshot;

use crate::runtime::RuntimeError;

/// One request: `rows` rows of input; the reply holds its `rows` rows of output.
pub struct Job<I> {
    pub input: I,
    pub rows: usize,
    reply: oneshot::Sender<Result<Vec<f32>, RuntimeError>>,
}

/// How a batcher queues and groups work.
#[derive(Debug, Clone, Copy)]
pub struct BatchOptions {
    /// Most rows (crops, sentences) in one runtime call.
    pub max_rows: usize,
    /// Most rows waiting for the worker; a request that would go over is refused as overloaded.
    pub queue: usize,
    /// How long the worker holds a non-full batch open for more requests (zero: take only what is waiting).
    pub max_wait: Duration,
    /// Longest expected wait in the queue (rows ahead x the measured time per row) a request is admitted
    /// to; zero: only the row bound applies.
    pub max_queue_wait: Duration,
}

/// The batcher's instruments; clones share their values, so the registered metrics see them.
#[derive(Clone)]
pub struct BatchStats {
    pub queue_depth: Gauge,
    pub batch_rows: Histogram,
    pub rejected: Counter,
}

impl Default for BatchStats {
    fn default() -> Self {
        BatchStats {
            queue_depth: Gauge::default(),
            batch_rows: Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
            rejected: Counter::default(),
        }
    }
}

pub struct Batcher<I> {
    tx: mpsc::Sender<Job<I>>,
    queue: usize,
    /// Rows sent and not yet taken by the worker.
    queued: Arc<AtomicUsize>,
    /// Moving average of a runtime call's nanoseconds per row (0 until the first call).
    row_nanos: Arc<AtomicU64>,
    max_queue_wait: Duration,
    /// Worker threads, each with its runtime call in flight: the queue drains that many times as fast.
    workers: usize,
    stats: BatchStats,
    /// When the last runtime call succeeded, in milliseconds after `epoch` (0: never).
    last_ok: Arc<AtomicU64>,
    epoch: Instant,
    /// A probe that has not answered yet: the next probe waits on it rather than queueing another behind a
    /// wedged worker.
    pending_probe: Arc<tokio::sync::Mutex<Option<Reply>>>,
    /// False once the worker thread has ended (a panic): nothing will run again in this process.
    alive: Arc<AtomicBool>,
}

type Reply = oneshot::Receiver<Result<Vec<f32>, RuntimeError>>;

impl<I> Clone for Batcher<I> {
    fn clone(&self) -> Self {
        Batcher {
            tx: self.tx.clone(),
            queue: self.queue,
            queued: self.queued.clone(),
            row_nanos: self.row_nanos.clone(),
            max_queue_wait: self.max_queue_wait,
            workers: self.workers,
            stats: self.stats.clone(),
            last_ok: self.last_ok.clone(),
            epoch: self.epoch,
            pending_probe: self.pending_probe.clone(),
            alive: self.alive.clone(),
        }
    }
}

impl<I: Send + 'static> Batcher<I> {
    /// `run` gets the jobs of one batch and returns their outputs concatenated, `dim` floats per row.
    pub fn spawn<F>(
        name: &str,
        opts: BatchOptions,
        dim: usize,
        stats: BatchStats,
        run: F,
    ) -> Batcher<I>
    where
        F: FnMut(&[Job<I>]) -> Result<Vec<f32>, RuntimeError> + Send + 'static,
    {
        Self::start(name, vec![run], opts, dim, stats)
    }

    /// As `spawn`, with `workers` threads taking batches from the one queue: while one thread's runtime call
    /// runs, the next gathers its batch and calls (each with its own copy of `run`).
    pub fn spawn_workers<F>(
        name: &str,
        workers: usize,
        opts: BatchOptions,
        dim: usize,
        stats: BatchStats,
        run: F,
    ) -> Batcher<I>
    where
        F: FnMut(&[Job<I>]) -> Result<Vec<f32>, RuntimeError> + Clone + Send + 'static,
    {
        Self::start(name, vec![run; workers.max(1)], opts, dim, stats)
    }

    /// One worker thread per element of `runs`.
    fn start<F>(
        name: &str,
        runs: Vec<F>,
        opts: BatchOptions,
        dim: usize,
        stats: BatchStats,
    ) -> Batcher<I>
    where
        F: FnMut(&[Job<I>]) -> Result<Vec<f32>, RuntimeError> + Send + 'static,
    {
        let queue = opts.queue.max(1);
        let max_rows = opts.max_rows.max(1);
        let workers = runs.len();
        let (tx, rx) = mpsc::channel::<Job<I>>();
        // One thread at a time waits on the queue and gathers a batch; the others run theirs meanwhile.
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let queued = Arc::new(AtomicUsize::new(0));
        let row_nanos = Arc::new(AtomicU64::new(0));
        let (epoch, last_ok) = (Instant::now(), Arc::new(AtomicU64::new(0)));
        let alive = Arc::new(AtomicBool::new(true));
        let mut spawned = Ok(());
        for (w, run) in runs.into_iter().enumerate() {
            let (rx, per_row) = (rx.clone(), row_nanos.clone());
            let (st, q) = (stats.clone(), queued.clone());
            let took = move |j: &Job<I>| {
                let left = q.fetch_sub(j.rows, Ordering::AcqRel) - j.rows;
                st.queue_depth.set(left as i64);
            };
            let st = stats.clone();
            let ok_at = last_ok.clone();
            let thread_name = match w {
                0 => name.to_string(),
                w => format!("{name}.{w}"),
            };
            let living = alive.clone();
            LIVE_WORKERS.fetch_add(1, Ordering::AcqRel);
            let dies = DiesLoudly(thread_name.clone(), living);
            let started = thread::Builder::new().name(thread_name).spawn(move || {
                let _dies_loudly = dies;
                // Declared after the guard, so dropped before it: the runtime's sessions are gone when the
                // worker counts as ended (`wait_for_workers`).
                let mut run = run;
                let mut pending: Option<Job<I>> = None;
                loop {
                    // A job left over from this worker's last batch runs now: alone if another worker holds
                    // the queue (it may be waiting there for work that never comes).
                    let (queue, first) = match pending.take() {
                        Some(first) => match rx.try_lock() {
                            Ok(rx) => (Some(rx), first),
                            Err(std::sync::TryLockError::Poisoned(p)) => {
                                (Some(p.into_inner()), first)
                            }
                            Err(std::sync::TryLockError::WouldBlock) => (None, first),
                        },
                        None => {
                            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
                            match rx.recv() {
                                Ok(j) => {
                                    took(&j);
                                    (Some(rx), j)
                                }
                                Err(_) => return, // every sender dropped: shut down
                            }
                        }
                    };
                    let (jobs, rows) = match queue {
                        Some(rx) => {
                            gather_batch(&rx, first, max_rows, opts.max_wait, &took, &mut pending)
                        }
                        None => {
                            let rows = first.rows;
                            (vec![first], rows)
                        }
                    };
                    st.batch_rows.observe(rows as f64);
                    let started = Instant::now();
                    let result = run(&jobs);
                    update_row_time(&per_row, started, rows);
                    answer_jobs(jobs, result, rows, dim, || {
                        let ms = epoch.elapsed().as_millis() as u64;
                        ok_at.store(ms.max(1), Ordering::Relaxed);
                    });
                }
            });
            if let Err(e) = started {
                spawned = Err(e);
                break;
            }
        }
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot spawn the {name} worker");
            alive.store(false, Ordering::Release);
        }
        Batcher {
            tx,
            queue,
            queued,
            row_nanos,
            max_queue_wait: opts.max_queue_wait,
            workers,
            stats,
            last_ok,
            epoch,
            pending_probe: Arc::default(),
            alive,
        }
    }

    /// Whether the worker thread still runs (liveness: a stopped one never comes back).
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Whether the worker answers. Ok at once when a runtime call succeeded within `fresh`; otherwise a
    /// one-row `input` is queued (past the admission bounds: a probe is never refused as overloaded) and
    /// must come back within `timeout`. A probe that times out stays queued, and the next call waits on it.
    pub async fn probe(
        &self,
        input: impl FnOnce() -> I,
        fresh: Duration,
        timeout: Duration,
    ) -> Result<(), RuntimeError> {
        let last = self.last_ok.load(Ordering::Relaxed);
        let since = (self.epoch.elapsed().as_millis() as u64).saturating_sub(last);
        if last > 0 && !fresh.is_zero() && since <= fresh.as_millis() as u64 {
            return Ok(());
        }
        let mut slot = self.pending_probe.lock().await;
        if slot.is_none() {
            let (reply, rx) = oneshot::channel();
            let depth = self.queued.fetch_add(1, Ordering::AcqRel) + 1;
            self.stats.queue_depth.set(depth as i64);
            let job = Job {
                input: input(),
                rows: 1,
                reply,
            };
            if self.tx.send(job).is_err() {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                return Err(RuntimeError::Stopped);
            }
            *slot = Some(rx);
        }
        // Awaited in place: a caller that gives up (a probe client hanging up) leaves it for the next one.
        let Some(reply) = slot.as_mut() else {
            return Err(RuntimeError::Stopped);
        };
        match tokio::time::timeout(timeout, reply).await {
            Ok(answer) => {
                *slot = None;
                answer.map_err(|_| RuntimeError::Stopped)?.map(drop)
            }
            Err(_) => Err(RuntimeError::Unresponsive {
                waited_ms: timeout.as_millis() as u64,
                queued: self.queued.load(Ordering::Acquire),
            }),
        }
    }

    /// Queues one request and waits (asynchronously) for its rows; a full queue refuses it at once.
    pub async fn submit(&self, input: I, rows: usize) -> Result<Vec<f32>, RuntimeError> {
        let mut out = self.submit_all(vec![(input, rows)]).await?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Queues several runs of one request, admitted together (all or none, so a request is never half
    /// refused by its own runs), and waits for each one's rows.
    pub async fn submit_all(&self, runs: Vec<(I, usize)>) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let (cap, total) = (self.queue, runs.iter().map(|r| r.1).sum::<usize>());
        let (per_row, max_wait) = (
            self.row_nanos.load(Ordering::Relaxed) as u128,
            self.max_queue_wait.as_nanos(),
        );
        let admitted = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                let rows_fit = q + total <= cap;
                let wait_fits = max_wait == 0
                    || per_row * (q + total) as u128 / self.workers as u128 <= max_wait;
                (q == 0 || (rows_fit && wait_fits)).then_some(q + total)
            });
        match admitted {
            Ok(before) => {
                self.stats.queue_depth.set((before + total) as i64);
            }
            Err(_) => {
                self.stats.rejected.inc();
                return Err(RuntimeError::Overloaded { queue: cap });
            }
        }
        let mut replies = Vec::with_capacity(runs.len());
        let mut unsent = total;
        for (input, rows) in runs {
            let (reply, rx) = oneshot::channel();
            if self.tx.send(Job { input, rows, reply }).is_err() {
                self.queued.fetch_sub(unsent, Ordering::AcqRel);
                return Err(RuntimeError::Stopped);
            }
            unsent -= rows;
            replies.push(rx);
        }
        let mut out = Vec::with_capacity(replies.len());
        for rx in replies {
            out.push(rx.await.map_err(|_| RuntimeError::Stopped)??);
        }
        Ok(out)
    }
}

/// The jobs run together after `first`: those that arrive within `max_wait` while their rows fit in
/// `max_rows`. A job that would not fit waits in `pending` for the next batch. Returns the jobs and their rows.
fn gather_batch<I>(
    rx: &mpsc::Receiver<Job<I>>,
    first: Job<I>,
    max_rows: usize,
    max_wait: Duration,
    took: &impl Fn(&Job<I>),
    pending: &mut Option<Job<I>>,
) -> (Vec<Job<I>>, usize) {
    let deadline = Instant::now() + max_wait;
    let mut rows = first.rows;
    let mut jobs = vec![first];
    while rows < max_rows {
        let next = match deadline.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => rx.recv_timeout(left).map_err(|e| match e {
                RecvTimeoutError::Timeout => TryRecvError::Empty,
                RecvTimeoutError::Disconnected => TryRecvError::Disconnected,
            }),
            _ => rx.try_recv(),
        };
        match next {
            Ok(j) => {
                took(&j);
                if rows + j.rows <= max_rows {
                    rows += j.rows;
                    jobs.push(j);
                } else {
                    *pending = Some(j);
                    break;
                }
            }
            Err(_) => break,
        }
    }
    (jobs, rows)
}

/// Folds a run's time per row into the moving average the queue's expected wait is judged by.
fn update_row_time(per_row: &AtomicU64, started: Instant, rows: usize) {
    let took_ns = started.elapsed().as_nanos() as u64 / rows.max(1) as u64;
    let old = per_row.load(Ordering::Relaxed);
    let avg = if old == 0 {
        took_ns
    } else {
        (old * 7 + took_ns) / 8
    };
    per_row.store(avg.max(1), Ordering::Relaxed);
}

/// Hands each job its rows of a run's output, or the run's error; `ran_ok` is called first when the run gave
/// every row.
fn answer_jobs<I>(
    jobs: Vec<Job<I>>,
    result: Result<Vec<f32>, RuntimeError>,
    rows: usize,
    dim: usize,
    ran_ok: impl FnOnce(),
) {
    match result {
        Ok(out) if out.len() == rows * dim => {
            ran_ok();
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

/// Logs a worker thread that ends in a panic and marks it stopped: inference is down from then on (readiness
/// and liveness say so).
struct DiesLoudly(String, Arc<AtomicBool>);

/// Worker threads not yet ended, in the whole process.
static LIVE_WORKERS: AtomicUsize = AtomicUsize::new(0);

/// Waits up to `limit` for every inference worker to end, once their batchers are dropped. A process should
/// call it before it exits: a worker that drops a CUDA session while the process's exit is tearing the CUDA
/// runtime down aborts the process ("driver shutting down") after its work is done.
pub fn wait_for_workers(limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while LIVE_WORKERS.load(Ordering::Acquire) > 0 {
        if Instant::now() >= until {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
    true
}

impl Drop for DiesLoudly {
    fn drop(&mut self) {
        LIVE_WORKERS.fetch_sub(1, Ordering::AcqRel);
        self.1.store(false, Ordering::Release);
        if thread::panicking() {
            tracing::error!(worker = %self.0, "the inference worker panicked and has stopped");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    fn opts(queue: usize, max_wait_ms: u64) -> BatchOptions {
        BatchOptions {
            max_rows: 8,
            queue,
            max_wait: Duration::from_millis(max_wait_ms),
            max_queue_wait: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_and_recovers() {
        // The worker blocks on the barrier inside each run, so the queue fills up behind it.
        let gate = Arc::new(Barrier::new(2));
        let (started_tx, started) = mpsc::channel::<usize>();
        let g = gate.clone();
        let stats = BatchStats::default();
        let b: Batcher<f32> = Batcher::spawn("t", opts(2, 0), 1, stats.clone(), move |jobs| {
            let _ = started_tx.send(jobs.len());
            g.wait();
            Ok(jobs.iter().map(|j| j.input).collect())
        });
        let first = tokio::spawn({
            let b = b.clone();
            async move { b.submit(1.0, 1).await }
        });
        let wait_started = || loop {
            if let Ok(n) = started.try_recv() {
                return n;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        tokio::task::yield_now().await; // let `first` send
        assert_eq!(wait_started(), 1);
        let queued: Vec<_> = (0..2)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.submit(10.0 + i as f32, 1).await })
            })
            .collect();
        while stats.queue_depth.get() != 2 {
            tokio::task::yield_now().await;
        }
        let t = Instant::now();
        match b.submit(99.0, 1).await {
            Err(RuntimeError::Overloaded { queue }) => assert_eq!(queue, 2),
            other => panic!("expected Overloaded, got {other:?}"),
        }
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "a refusal must not wait"
        );
        assert_eq!(stats.rejected.get(), 1);
        gate.wait(); // release the first run
        assert_eq!(first.await.unwrap().unwrap(), vec![1.0]);
        // The two queued requests share the second run.
        assert_eq!(wait_started(), 2);
        gate.wait();
        for (i, q) in queued.into_iter().enumerate() {
            assert_eq!(q.await.unwrap().unwrap(), vec![10.0 + i as f32]);
        }
        assert_eq!(stats.queue_depth.get(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_workers_run_two_batches_at_once() {
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (n, m) = (now.clone(), most.clone());
        let run = move |jobs: &[Job<f32>]| {
            let at = n.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(at, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(100));
            n.fetch_sub(1, Ordering::SeqCst);
            Ok(jobs.iter().map(|j| j.input).collect())
        };
        let one_row = BatchOptions {
            max_rows: 1,
            ..opts(16, 0)
        };
        for (workers, together) in [(1, 1), (2, 2)] {
            most.store(0, Ordering::SeqCst);
            let b: Batcher<f32> = Batcher::spawn_workers(
                "t",
                workers,
                one_row,
                1,
                BatchStats::default(),
                run.clone(),
            );
            let tasks: Vec<_> = (0..4)
                .map(|i| {
                    let b = b.clone();
                    tokio::spawn(async move { b.submit(i as f32, 1).await })
                })
                .collect();
            for (i, t) in tasks.into_iter().enumerate() {
                assert_eq!(t.await.unwrap().unwrap(), vec![i as f32]);
            }
            assert_eq!(most.load(Ordering::SeqCst), together, "{workers} workers");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_left_over_runs_while_another_worker_waits_on_the_queue() {
        // Two rows a call: the two-row job does not fit beside the one-row job, so the worker that took the
        // first keeps it for its next call, while the other worker waits on the empty queue.
        let opts = BatchOptions {
            max_rows: 2,
            ..opts(16, 50)
        };
        let b: Batcher<f32> = Batcher::spawn_workers(
            "t",
            2,
            opts,
            1,
            BatchStats::default(),
            |jobs: &[Job<f32>]| {
                Ok(jobs
                    .iter()
                    .flat_map(|j| std::iter::repeat_n(j.input, j.rows))
                    .collect())
            },
        );
        let (one, two) = (b.clone(), b.clone());
        let first = tokio::spawn(async move { one.submit(1.0, 1).await });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let second = tokio::spawn(async move { two.submit(2.0, 2).await });
        let both = tokio::time::timeout(Duration::from_secs(5), async {
            (first.await.unwrap(), second.await.unwrap())
        })
        .await
        .expect("both jobs answered, none left waiting behind the other worker");
        assert_eq!(both.0.unwrap(), vec![1.0]);
        assert_eq!(both.1.unwrap(), vec![2.0, 2.0]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn max_wait_gathers_requests_that_arrive_shortly_after() {
        let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = sizes.clone();
        let b: Batcher<f32> =
            Batcher::spawn("t", opts(16, 300), 1, BatchStats::default(), move |jobs| {
                s.lock().unwrap().push(jobs.len());
                Ok(jobs.iter().map(|j| j.input).collect())
            });
        let mut tasks = Vec::new();
        for i in 0..4 {
            let b = b.clone();
            tasks.push(tokio::spawn(async move { b.submit(i as f32, 1).await }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap().unwrap(), vec![i as f32]);
        }
        // Four requests 20 ms apart all fall inside the 300 ms window: one runtime call.
        assert_eq!(*sizes.lock().unwrap(), vec![4]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_expected_wait_bounds_the_queue_once_a_row_has_been_timed() {
        // 40 ms per runtime call of one row; a 50 ms bound admits one queued row, not two.
        let run = |jobs: &[Job<f32>]| {
            std::thread::sleep(Duration::from_millis(40));
            Ok(jobs.iter().map(|j| j.input).collect())
        };
        for (bound_ms, expect_refusal) in [(50, true), (0, false)] {
            let b: Batcher<f32> = Batcher::spawn(
                "t",
                BatchOptions {
                    max_rows: 1,
                    queue: 100,
                    max_wait: Duration::ZERO,
                    max_queue_wait: Duration::from_millis(bound_ms),
                },
                1,
                BatchStats::default(),
                run,
            );
            assert_eq!(b.submit(1.0, 1).await.unwrap(), vec![1.0]); // times a row
            let tasks: Vec<_> = (0..3)
                .map(|i| {
                    let b = b.clone();
                    tokio::spawn(async move { b.submit(i as f32, 1).await })
                })
                .collect();
            let mut refused = 0;
            for t in tasks {
                match t.await.unwrap() {
                    Ok(_) => {}
                    Err(RuntimeError::Overloaded { .. }) => refused += 1,
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            assert_eq!(
                refused > 0,
                expect_refusal,
                "bound {bound_ms} ms: {refused} refused"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_probe_skips_a_fresh_worker_waits_once_for_a_wedged_one_and_sees_a_dead_one() {
        // Input 7 blocks the run until released; a negative input panics, ending the worker thread.
        let (release, released) = mpsc::channel::<()>();
        let released = std::sync::Mutex::new(released);
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let b: Batcher<f32> =
            Batcher::spawn("t", opts(4, 0), 1, BatchStats::default(), move |jobs| {
                counted.fetch_add(1, Ordering::SeqCst);
                for j in jobs {
                    assert!(j.input >= 0.0, "the worker dies");
                    if j.input == 7.0 {
                        let _ = released.lock().unwrap().recv();
                    }
                }
                Ok(jobs.iter().map(|j| j.input).collect())
            });
        let (ms, long) = (Duration::from_millis(100), Duration::from_secs(60));
        let never = || -> f32 { panic!("no probe may be queued here") };

        assert_eq!(b.submit(1.0, 1).await.unwrap(), vec![1.0]);
        // A run just succeeded: that is the answer, nothing is queued.
        b.probe(never, long, ms).await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // Otherwise one row goes through the worker.
        b.probe(|| 2.0, Duration::ZERO, long).await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 2);

        // Wedged: the probe gives up after its timeout, and the next one waits on it instead of queueing more.
        match b.probe(|| 7.0, Duration::ZERO, ms).await {
            Err(RuntimeError::Unresponsive { waited_ms: 100, .. }) => {}
            other => panic!("expected Unresponsive, got {other:?}"),
        }
        // A caller that gives up mid-wait (a probe client hanging up) leaves the probe for the next one.
        let gave_up = tokio::time::timeout(
            Duration::from_millis(20),
            b.probe(never, Duration::ZERO, long),
        )
        .await;
        assert!(gave_up.is_err());
        assert!(matches!(
            b.probe(never, Duration::ZERO, ms).await,
            Err(RuntimeError::Unresponsive { .. })
        ));
        release.send(()).unwrap();
        b.probe(never, Duration::ZERO, long).await.unwrap();

        // Dead: the probe that kills it, and every later one, say the worker has stopped.
        for input in [-1.0, 3.0] {
            match b.probe(move || input, Duration::ZERO, long).await {
                Err(RuntimeError::Stopped) => {}
                other => panic!("expected Stopped, got {other:?}"),
            }
        }
    }
}
