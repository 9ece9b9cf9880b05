//! How far a hybrid search trusts the photo in a collection, measured on the collection's own words. A
//! sample of its captions and text-field sentences (the words it holds about its images) is asked of the photo
//! channel alone: the share that finds its own image first says how well the photo matches sentences about
//! it here. On Flickr8k a title finds its photo first 21-29% of the time; on a gallery of drawn objects named
//! in a word, 1-9%, and there the photo's tuned half of the fused score drowns the words that find the
//! picture (docs/results.md, "Products and their words"). Below `UNTRUSTED_BELOW` the photo gets no weight,
//! from `TRUSTED_FROM` its full share, linearly between; the weight it does not get goes to the words.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::{CollectionRef, Result, Service, modality::Modality};

/// Sentences asked: enough that the share is known to a few points.
const SAMPLE: usize = 200;

/// With fewer sentences than this the share says too little: the photo keeps its full share.
const MIN_SAMPLE: usize = 20;

/// Found-own shares (above chance) below which the photo gets no weight, and from which it gets all of it.
/// Chosen on Flickr8k's dev split and the open-vocabulary gallery's tuning half.
const UNTRUSTED_BELOW: f32 = 0.05;
const TRUSTED_FROM: f32 = 0.20;

/// A measure stands until the collection's images change in number by this share, or for `MEASURE_TTL`.
const REMEASURE_GROWTH: f64 = 0.1;
const MEASURE_TTL: Duration = Duration::from_secs(3600);

/// The photo's trust per collection: (when measured, images then, trust).
#[derive(Default)]
pub(crate) struct PhotoTrust(Mutex<HashMap<i64, (Instant, usize, f32)>>);

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
    /// The photo channel's trust in this collection (0..=1), measured when first needed and again when the
    /// collection has grown or shrunk by a tenth.
    pub(super) async fn photo_trust(&self, c: &CollectionRef) -> Result<f32> {
        let images = self.image_count(c.id).await?;
        let fresh = |at: &Instant, then: &usize| {
            at.elapsed() < MEASURE_TTL
                && (images as f64 - *then as f64).abs() <= REMEASURE_GROWTH * *then as f64
        };
        if let Some((at, then, trust)) = self.trust.0.lock().expect("trust").get(&c.id) {
            if fresh(at, then) {
                return Ok(*trust);
            }
        }
        let trust = self.measure_photo_trust(c, images).await?;
        self.trust
            .0
            .lock()
            .expect("trust")
            .insert(c.id, (Instant::now(), images, trust));
        Ok(trust)
    }

    /// Asks the photo channel for up to `SAMPLE` of the collection's sentences and counts those that find
    /// their own image first.
    async fn measure_photo_trust(&self, c: &CollectionRef, images: usize) -> Result<f32> {
        let sample = self
            .timed_db("sample_captions", self.store.sample_captions(c.id, SAMPLE))
            .await?;
        if sample.len() < MIN_SAMPLE || images < 2 {
            return Ok(1.0);
        }
        let ids: Vec<i64> = sample.iter().map(|(id, _)| *id).collect();
        let image_of: HashMap<i64, i64> = sample.into_iter().collect();
        let vectors = self
            .timed_db(
                "sentence_vectors",
                self.store.vectors_by_ids(c.id, Modality::Captions, &ids),
            )
            .await?;
        let mut found = 0;
        for v in &vectors {
            let top = self
                .rank(c.id, Modality::Images, &v.vector, Modality::Captions, 1)
                .await?;
            if top.first().map(|t| t.0) == image_of.get(&v.id).copied() {
                found += 1;
            }
        }
        Ok(trust_of(above_chance(found, vectors.len(), images)))
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
