//! Rate-limited warnings: a condition that repeats (a store that refuses
//! every commit, a watcher that keeps falling behind, a peer that keeps
//! refusing) is logged once per window, with how many times it happened
//! meanwhile, instead of once per occurrence.
//!
//! Why: a full disk made the deletion engine log a warning every 100 ms
//! (216 lines in 20 s) while nothing changed. An operator needs the first
//! line and a count, not the flood; and a flood on a full disk makes the
//! disk fuller.
//!
//! ```ignore
//! if let Some(more) = self.work_failed.admit() {
//!     warn!(error = %e, suppressed = more.count(), "deletion work step failed; will retry{more}");
//! }
//! ```
//!
//! Time is tokio's monotonic clock (`clock::monotonic_now`), the one a
//! simulation controls.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::monotonic_now;

/// How long a throttle stays quiet after it let a line through, unless
/// said otherwise: a condition that lasts is logged three times a minute.
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(20);

/// Lets one occurrence a window through; counts the others.
#[derive(Debug)]
pub(crate) struct Throttle {
    window: Duration,
    state: Mutex<ThrottleState>,
}

#[derive(Debug, Default)]
struct ThrottleState {
    /// When the last admitted occurrence was logged.
    last_logged: Option<tokio::time::Instant>,
    /// Occurrences since then that were not logged.
    suppressed: u64,
}

/// What an admitted occurrence reports of the ones held back before it.
/// Displays as nothing when there were none, else as
/// `" (215 more in the last 20 s)"`, so it can end any message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Suppressed {
    count: u64,
    over: Duration,
}

impl Suppressed {
    /// Occurrences held back since the previous logged one.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }
}

impl fmt::Display for Suppressed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 0 {
            return Ok(());
        }
        write!(f, " ({} more in the last {} s)", self.count, self.over.as_secs().max(1))
    }
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new(DEFAULT_WINDOW)
    }
}

impl Throttle {
    /// A throttle that logs at most once per `window`.
    pub(crate) const fn new(window: Duration) -> Self {
        Self {
            window,
            state: Mutex::new(ThrottleState {
                last_logged: None,
                suppressed: 0,
            }),
        }
    }

    /// Whether this occurrence should be logged: `Some` (with the count
    /// held back since the last logged one) at most once per window,
    /// `None` (counted) otherwise.
    pub(crate) fn admit(&self) -> Option<Suppressed> {
        self.admit_at(monotonic_now())
    }

    fn admit_at(&self, now: tokio::time::Instant) -> Option<Suppressed> {
        // A poisoned lock only means another thread panicked mid-count:
        // the counts are still plain numbers.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.last_logged {
            Some(last) if now.saturating_duration_since(last) < self.window => {
                state.suppressed = state.suppressed.saturating_add(1);
                None
            }
            last => {
                let over = last.map_or(Duration::ZERO, |l| now.saturating_duration_since(l));
                let count = std::mem::take(&mut state.suppressed);
                state.last_logged = Some(now);
                Some(Suppressed { count, over })
            }
        }
    }

    /// The condition is over (the store commits again, the watcher caught
    /// up): the next occurrence is logged at once, and what was held back
    /// is returned so the "over" line can say it.
    pub(crate) fn reset(&self) -> Suppressed {
        self.reset_at(monotonic_now())
    }

    fn reset_at(&self, now: tokio::time::Instant) -> Suppressed {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let over = state
            .last_logged
            .map_or(Duration::ZERO, |l| now.saturating_duration_since(l));
        let count = std::mem::take(&mut state.suppressed);
        state.last_logged = None;
        Suppressed { count, over }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_window_with_the_count_held_back() {
        let t = Throttle::new(Duration::from_secs(20));
        let start = monotonic_now();
        let first = t.admit_at(start).expect("the first occurrence is logged");
        assert_eq!(first.count(), 0);
        assert_eq!(first.to_string(), "", "nothing held back: no suffix");
        // An occurrence every 100 ms for 20 s: none logged, all counted.
        for i in 1..200 {
            assert!(t.admit_at(start + Duration::from_millis(100 * i)).is_none());
        }
        let next = t
            .admit_at(start + Duration::from_secs(20))
            .expect("a new window logs again");
        assert_eq!(next.count(), 199);
        assert_eq!(next.to_string(), " (199 more in the last 20 s)");
    }

    #[test]
    fn reset_logs_the_next_occurrence_at_once() {
        let t = Throttle::new(Duration::from_secs(20));
        let start = monotonic_now();
        assert!(t.admit_at(start).is_some());
        assert!(t.admit_at(start).is_none());
        assert!(t.admit_at(start + Duration::from_secs(1)).is_none());
        let held = t.reset_at(start + Duration::from_secs(3));
        assert_eq!(held.count(), 2);
        assert_eq!(held.to_string(), " (2 more in the last 3 s)");
        let again = t.admit_at(start + Duration::from_secs(4));
        assert_eq!(again.map(|s| s.count()), Some(0), "a new episode starts with a line");
    }
}
