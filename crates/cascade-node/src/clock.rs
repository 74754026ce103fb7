//! The node's source of time, injected so tests control `deleted_at` and
//! retry schedules.

use std::time::{SystemTime, UNIX_EPOCH};

use cascade_core::Timestamp;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    // The sanctioned place: the one wall-clock read of a real node. Every
    // timestamp a node writes comes from its injected `Clock`.
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Timestamp(ms)
    }
}

/// The monotonic instant that paces the peer links (reconnect backoff, ack
/// refresh, check interval). tokio's clock, not std's: it is the one a
/// simulation and a paused test runtime control. The sanctioned place for
/// `tokio::time::Instant::now` in a node.
#[allow(clippy::disallowed_methods)]
pub(crate) fn monotonic_now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}
