//! Mutating calls per principal (`[auth.rate]`): a token bucket each,
//! `burst` deep, refilled at `per_second`. The buckets of at most
//! [`MAX_TRACKED_PRINCIPALS`] principals are kept; a new one beyond that
//! evicts the least recently seen (it starts again full, which is what a
//! principal quiet for that long would have anyway).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::RateSettings;

/// Principals whose buckets are kept at once.
pub const MAX_TRACKED_PRINCIPALS: usize = 10_000;

struct Bucket {
    tokens: f64,
    /// When `tokens` was last brought up to date (and the principal last seen).
    at: Instant,
}

/// The buckets of every principal seen lately.
pub struct RateLimiter {
    settings: RateSettings,
    capacity: usize,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    pub fn new(settings: RateSettings) -> Self {
        Self::with_capacity(settings, MAX_TRACKED_PRINCIPALS)
    }

    fn with_capacity(settings: RateSettings, capacity: usize) -> Self {
        RateLimiter {
            settings,
            capacity: capacity.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token of `principal`'s bucket at `now`, or says how long
    /// until one is there.
    pub fn admit(&self, principal: &str, now: Instant) -> Result<(), Duration> {
        let burst = f64::from(self.settings.burst);
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !buckets.contains_key(principal) && buckets.len() >= self.capacity {
            // The least recently seen goes: a scan, only when a principal
            // not seen lately arrives at a full table.
            if let Some(oldest) = buckets.iter().min_by_key(|(_, b)| b.at).map(|(k, _)| k.clone()) {
                buckets.remove(&oldest);
            }
        }
        let bucket = buckets
            .entry(principal.to_owned())
            .or_insert(Bucket { tokens: burst, at: now });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.settings.per_second).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - bucket.tokens) / self.settings.per_second;
        Err(Duration::from_secs_f64(wait).max(Duration::from_millis(1)))
    }

    /// Principals whose buckets are kept.
    pub fn tracked(&self) -> usize {
        self.buckets.lock().map(|b| b.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(per_second: f64, burst: u32, capacity: usize) -> RateLimiter {
        RateLimiter::with_capacity(RateSettings { per_second, burst }, capacity)
    }

    #[test]
    fn a_burst_then_the_sustained_rate_with_the_delay_to_retry_after() {
        let l = limiter(10.0, 3, 100);
        let t0 = crate::clock::monotonic_now();
        for _ in 0..3 {
            l.admit("alice", t0).unwrap();
        }
        let wait = l.admit("alice", t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // Another principal has its own bucket.
        l.admit("bob", t0).unwrap();
        // A tenth of a second later, one more.
        let t1 = t0 + Duration::from_millis(100);
        l.admit("alice", t1).unwrap();
        assert!(l.admit("alice", t1).is_err());
        // Quiet for long: full again, never beyond the burst.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            l.admit("alice", t2).unwrap();
        }
        assert!(l.admit("alice", t2).is_err());
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_least_recently_seen() {
        let l = limiter(1.0, 1, 3);
        let t0 = crate::clock::monotonic_now();
        l.admit("a", t0).unwrap();
        l.admit("b", t0 + Duration::from_millis(1)).unwrap();
        l.admit("c", t0 + Duration::from_millis(2)).unwrap();
        // a is seen again (refused: its bucket is empty), so b is the oldest.
        assert!(l.admit("a", t0 + Duration::from_millis(3)).is_err());
        l.admit("d", t0 + Duration::from_millis(4)).unwrap();
        assert_eq!(l.tracked(), 3);
        // b was evicted: it starts full again; a was kept: still empty.
        l.admit("b", t0 + Duration::from_millis(5)).unwrap();
        assert!(l.admit("a", t0 + Duration::from_millis(6)).is_err());
    }
}
