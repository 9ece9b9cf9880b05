//! A steady load for the fault tests: a few clients on one server, each alternating a write of a new photo
//! and a search, every answer recorded (when it was sent, how long it took, its status, Retry-After and
//! error), and the images acknowledged with a 201, so that a test can stop a database under it and judge
//! what the clients saw.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::json;
use tokio::task::JoinHandle;

use super::{TestApp, b64, unique_image};

#[derive(Debug, Clone)]
pub struct Outcome {
    /// When the request was sent, since the load started.
    pub at: Duration,
    pub took: Duration,
    pub status: u16,
    pub retry_after: Option<u64>,
    /// The error's code and message (empty on success).
    pub code: String,
    pub message: String,
}

impl Outcome {
    /// Answered before `t` (since the load started).
    pub fn done_by(&self, t: Duration) -> bool {
        self.at + self.took < t
    }
}

/// An image acknowledged with a 201: its id and the seed of its photo (`unique_image`).
pub type Acked = (i64, u64);

pub struct Load {
    t0: Instant,
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    acked: Arc<Mutex<Vec<Acked>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Load {
    /// `workers` clients on `app`'s `collection`. Photo seeds start at `first_seed`, so that loads one after
    /// the other on a collection write different photos.
    pub fn start(app: Arc<TestApp>, collection: &str, workers: u64, first_seed: u64) -> Load {
        let load = Load {
            t0: Instant::now(),
            stop: Arc::new(AtomicBool::new(false)),
            outcomes: Arc::default(),
            acked: Arc::default(),
            tasks: Vec::new(),
        };
        let (images, search) = (
            format!("/v1/collections/{collection}/images"),
            format!("/v1/collections/{collection}/images/search"),
        );
        let tasks = (0..workers)
            .map(|w| {
                let (app, stop, t0) = (app.clone(), load.stop.clone(), load.t0);
                let (outcomes, acked) = (load.outcomes.clone(), load.acked.clone());
                let (images, search) = (images.clone(), search.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let seed = first_seed + w * 1_000_000 + n;
                        let start = t0.elapsed();
                        let (status, retry_after, r) = if (w + n) % 2 == 0 {
                            let photo = b64(&unique_image(seed));
                            app.post_json_retry_after(
                                &images,
                                json!({"images": [{"data": photo, "metadata": {"seed": seed}}]}),
                            )
                            .await
                        } else {
                            app.post_json_retry_after(&search, json!({"text": "a dog", "k": 3}))
                                .await
                        };
                        let took = t0.elapsed() - start;
                        if status == 201 {
                            let id = r["images"][0]["id"].as_i64().expect("id");
                            acked.lock().expect("lock").push((id, seed));
                        }
                        let text =
                            |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                        outcomes.lock().expect("lock").push(Outcome {
                            at: start,
                            took,
                            status,
                            retry_after,
                            code: text(&r["error"]["code"]),
                            message: text(&r["error"]["message"]),
                        });
                        n += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
            })
            .collect();
        Load { tasks, ..load }
    }

    /// Time since the load started (the clock of `Outcome::at`).
    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    /// Stops the clients once their requests in flight are answered.
    pub async fn finish(self) -> (Vec<Outcome>, Vec<Acked>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("load client");
        }
        let outcomes = std::mem::take(&mut *self.outcomes.lock().expect("lock"));
        let acked = std::mem::take(&mut *self.acked.lock().expect("lock"));
        (outcomes, acked)
    }
}

/// How many answers of each status among the outcomes `pick` keeps.
pub fn statuses(outcomes: &[Outcome], pick: impl Fn(&Outcome) -> bool) -> BTreeMap<u16, usize> {
    let mut m = BTreeMap::new();
    for o in outcomes.iter().filter(|o| pick(o)) {
        *m.entry(o.status).or_default() += 1;
    }
    m
}

/// Only clean answers: a 2xx or a 503, never a 500 or a dropped connection (the client would have panicked);
/// and a 503 says what is unavailable (`says` in its message) and when to retry (src/api/error.rs:
/// Unavailable, Retry-After 1).
pub fn assert_clean_answers(outcomes: &[Outcome], says: &str) {
    assert!(
        outcomes.iter().all(|o| matches!(o.status, 200 | 201 | 503)),
        "{outcomes:?}"
    );
    for o in outcomes.iter().filter(|o| o.status == 503) {
        assert_eq!(o.code, "unavailable", "{o:?}");
        assert!(o.message.contains(says), "{o:?}");
        assert!(
            o.retry_after.is_some_and(|s| s >= 1),
            "no Retry-After: {o:?}"
        );
    }
}

/// Every acknowledged image is stored (by id) and is the first hit of a search by its own photo, unfiltered,
/// so that the index answers it (HNSW in memory, or pgvector's in the database): a write the database lost,
/// or whose vector the index lacks, fails it.
pub async fn assert_found_by_own_photo(app: &TestApp, collection: &str, acked: &[Acked]) {
    for (id, seed) in acked {
        let (s, img) = app
            .get_json(&format!("/v1/collections/{collection}/images/{id}"))
            .await;
        assert_eq!(s, 200, "acknowledged image {id} is not stored: {img}");
        let (s, r) = app
            .post_json(
                &format!("/v1/collections/{collection}/images/search"),
                json!({"image": b64(&unique_image(*seed)), "k": 1}),
            )
            .await;
        assert_eq!(s, 200, "{r}");
        assert_eq!(
            r["results"][0]["image"]["id"].as_i64(),
            Some(*id),
            "acknowledged image {id} (photo seed {seed}) is not the first hit of its own photo: {r}"
        );
    }
}
