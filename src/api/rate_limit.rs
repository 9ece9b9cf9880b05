//! A token bucket: `rate` tokens a second up to `capacity`; a request takes what it costs or waits. The clock
//! is passed in, so the arithmetic is tested without sleeping.

use std::time::Instant;

#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Starts full.
    pub fn new(rate: f64, capacity: f64, now: Instant) -> Bucket {
        Bucket {
            rate,
            capacity,
            tokens: capacity,
            at: now,
        }
    }

    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// Takes `cost` tokens, or says how many seconds until there are enough (infinite when the cost exceeds
    /// the capacity: it never fits). Nothing is taken on a refusal.
    pub fn take(&mut self, cost: f64, now: Instant) -> Result<(), f64> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.at = now;
        if cost > self.capacity {
            return Err(f64::INFINITY);
        }
        if self.tokens >= cost {
            self.tokens -= cost;
            Ok(())
        } else {
            Err((cost - self.tokens) / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(2.0, 3.0, t0);
        for _ in 0..3 {
            assert_eq!(b.take(1.0, t0), Ok(()));
        }
        // Empty: one token comes back in half a second at 2/s.
        let wait = b.take(1.0, t0).expect_err("empty");
        assert!((wait - 0.5).abs() < 1e-9, "{wait}");
        assert_eq!(b.take(1.0, t0 + Duration::from_millis(500)), Ok(()));
        // Refusals take nothing; a long pause refills only to the capacity.
        assert!(b.take(1.0, t0 + Duration::from_millis(600)).is_err());
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.take(3.0, later), Ok(()));
        assert!(b.take(1.0, later).is_err());
        // More than the capacity never fits.
        assert_eq!(
            b.take(4.0, later + Duration::from_secs(60)),
            Err(f64::INFINITY)
        );
    }
}
