//! How far a hybrid search trusts the photo in a collection, measured on the collection's own words. A
//! sample of its captions and text-field sentences (the words it holds about its images) is asked of the photo
//! channel alone: the share that finds its own image first says how well the photo matches sentences about
//! it here. On Flickr8k a title finds its photo first 21-29% of the time; on a gallery of drawn objects named
//! in a word, 1-9%, and there the photo's tuned half of the fused score drowns the words that find the
//! picture (docs/results.md, "Products and their words"). Below `UNTRUSTED_BELOW` the photo gets no weight,
//! from `TRUSTED_FROM` its full share, linearly between; the weight it does not get goes to the words.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::stream::{FuturesUnordered, StreamExt};

use crate::{CollectionRef, Result, Service, modality::Modality};

/// Sentences asked: enough that the share is known to a few points.
const SAMPLE: usize = 200;

/// With fewer sentences than this the share says too little: the photo keeps its full share.
const MIN_SAMPLE: usize = 20;

/// Found-own shares (above chance) below which the photo gets no weight, and from which it gets all of it.
/// Chosen on Flickr8k's dev split and the open-vocabulary gallery's tuning half.
const UNTRUSTED_BELOW: f32 = 0.05;
const TRUSTED_FROM: f32 = 0.20;

/// A measure is fresh until the collection's images change in number by this share, or for `MEASURE_TTL`;
/// a stale one still answers while a new one is taken in the background.
const REMEASURE_GROWTH: f64 = 0.1;
const MEASURE_TTL: Duration = Duration::from_secs(3600);

/// Photo-channel searches in flight while measuring: enough to hide the database's round trips, few enough
/// to leave the pool to the searches being served.
const CONCURRENCY: usize = 4;

/// The photo's trust per collection.
#[derive(Default)]
pub(crate) struct PhotoTrust(Mutex<HashMap<i64, Measure>>);

struct Measure {
    at: Instant,
    /// The collection's images when measured.
    images: usize,
    trust: f32,
    /// A new measure is being taken in the background.
    refreshing: bool,
}

impl Measure {
    fn fresh(&self, images: usize) -> bool {
        self.at.elapsed() < MEASURE_TTL
            && (images as f64 - self.images as f64).abs() <= REMEASURE_GROWTH * self.images as f64
    }
}

/// The trust a found-own share earns: 0 below `UNTRUSTED_BELOW`, 1 from `TRUSTED_FROM`.
pub(super) fn trust_of(found_own: f32) -> f32 {
    ((found_own - UNTRUSTED_BELOW) / (TRUSTED_FROM - UNTRUSTED_BELOW)).clamp(0.0, 1.0)
}

/// The share of `found` first among `images`, less what chance gives (one in `images`).
fn above_chance(found: usize, asked: usize, images: usize) -> f32 {
    let share = found as f64 / asked.max(1) as f64;
    let chance = 1.0 / images.max(1) as f64;
    ((share - chance) / (1.0 - chance).max(f64::EPSILON)).max(0.0) as f32
}

impl Service {
    /// The photo channel's trust in this collection (0..=1). The first search that needs it measures it;
    /// after that a search never waits: a stale measure (an hour old, or the collection a tenth larger or
    /// smaller) answers while one task measures again.
    pub(super) async fn photo_trust(self: &Arc<Self>, c: &CollectionRef) -> Result<f32> {
        let images = self.image_count(c.id).await?;
        {
            let mut known = self.trust.0.lock().expect("trust");
            if let Some(m) = known.get_mut(&c.id) {
                if !m.fresh(images) && !m.refreshing {
                    m.refreshing = true;
                    let svc = Arc::clone(self);
                    let id = c.id;
                    tokio::spawn(async move { svc.remeasure(id, images).await });
                }
                return Ok(m.trust);
            }
        }
        let trust = self.measure_photo_trust(c.id, images).await?;
        self.remember(c.id, images, trust);
        Ok(trust)
    }

    async fn remeasure(&self, collection_id: i64, images: usize) {
        match self.measure_photo_trust(collection_id, images).await {
            Ok(trust) => self.remember(collection_id, images, trust),
            Err(e) => {
                // The old measure stands; the next search that finds it stale tries again.
                tracing::warn!(collection_id, error = %e, "measuring the photo's trust failed");
                if let Some(m) = self.trust.0.lock().expect("trust").get_mut(&collection_id) {
                    m.refreshing = false;
                }
            }
        }
    }

    /// Drops a deleted collection's measure (ids are never reused; without this, each collection ever
    /// searched would keep one).
    pub(crate) fn forget_photo_trust(&self, collection_id: i64) {
        self.trust.0.lock().expect("trust").remove(&collection_id);
    }

    fn remember(&self, collection_id: i64, images: usize, trust: f32) {
        let m = Measure {
            at: Instant::now(),
            images,
            trust,
            refreshing: false,
        };
        self.trust.0.lock().expect("trust").insert(collection_id, m);
    }

    /// Asks the photo channel for up to `SAMPLE` of the collection's sentences and counts those that find
    /// their own image first.
    async fn measure_photo_trust(&self, collection_id: i64, images: usize) -> Result<f32> {
        let sample = self
            .timed_db(
                "sample_captions",
                self.store.sample_captions(collection_id, SAMPLE),
            )
            .await?;
        if sample.len() < MIN_SAMPLE || images < 2 {
            return Ok(1.0);
        }
        let ids: Vec<i64> = sample.iter().map(|(id, _)| *id).collect();
        let image_of: &HashMap<i64, i64> = &sample.into_iter().collect();
        let vectors = self
            .timed_db(
                "sentence_vectors",
                self.store
                    .vectors_by_ids(collection_id, Modality::Captions, &ids),
            )
            .await?;
        let asked = vectors.len();
        let mut found = 0;
        let mut running = FuturesUnordered::new();
        let mut queue = vectors.iter();
        loop {
            while running.len() < CONCURRENCY {
                let Some(v) = queue.next() else { break };
                running.push(async move {
                    let top = self
                        .rank(
                            collection_id,
                            Modality::Images,
                            &v.vector,
                            Modality::Captions,
                            1,
                        )
                        .await?;
                    Ok::<_, crate::ServiceError>(
                        top.first().map(|t| t.0) == image_of.get(&v.id).copied(),
                    )
                });
            }
            let Some(hit) = running.next().await else {
                break;
            };
            found += usize::from(hit?);
        }
        Ok(trust_of(above_chance(found, asked, images)))
    }
}

#[cfg(test)]
mod tests {
    use super::{above_chance, trust_of};

    #[test]
    fn trust_rises_from_none_to_full_between_the_two_shares() {
        assert_eq!(trust_of(0.0), 0.0);
        assert_eq!(trust_of(0.05), 0.0);
        assert!((trust_of(0.125) - 0.5).abs() < 1e-6);
        assert_eq!(trust_of(0.20), 1.0);
        assert_eq!(trust_of(0.9), 1.0);
    }

    #[test]
    fn chance_is_taken_off_the_share() {
        // 1 in 2 found among 2 images is what chance gives.
        assert_eq!(above_chance(50, 100, 2), 0.0);
        // 30 of 100 among 1,000 images: almost all of it is the photo's.
        assert!((above_chance(30, 100, 1000) - 0.2993).abs() < 1e-3);
        // 10 of 54 among 54 products: chance's 1.85% comes off.
        assert!((above_chance(10, 54, 54) - 0.1698).abs() < 1e-3);
    }
}
