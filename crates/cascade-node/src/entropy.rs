//! The node's sources of randomness — the uids and operation ids it mints
//! and the jitter of its peer links' reconnects — injected like the
//! [`Clock`], so a simulation that seeds them (and the clock) replays a run
//! exactly from one number.
//!
//! A real node uses [`SystemUids`] (`Uuid::now_v7`: wall clock plus random
//! bits from `rand`'s thread-local generator, which the OS seeds: uuid's
//! `fast-rng`, so minting a uid is no system call) and seeds its jitter from the wall clock's sub-second noise,
//! so links of different nodes do not reconnect in lockstep. A simulated
//! node uses [`SeededUids`] and a fixed jitter seed.

use std::sync::{Arc, Mutex};

use uuid::Uuid;

use crate::clock::Clock;

/// Mints the uids of resources and the ids of operations. Shared by every
/// incarnation of the writer (a restarted writer continues the sequence).
pub trait UidSource: Send + Sync + 'static {
    fn next_uuid(&self) -> Uuid;
}

/// UUID v7 from the system clock and a generator the OS seeds (not a
/// `getrandom` call per uid: two per created resource, its uid and its
/// audit entry's, were 4 % of P5's CPU; docs/BENCHMARKS.md "P5 (2026-11-27)").
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemUids;

impl UidSource for SystemUids {
    // The sanctioned place: a real node's uids are minted here and only here.
    #[allow(clippy::disallowed_methods)]
    fn next_uuid(&self) -> Uuid {
        Uuid::now_v7()
    }
}

/// UUID v7 from an injected clock and a seeded generator: the same seed,
/// clock readings and call sequence give the same ids.
///
/// Unique within the node (a counter), and across the nodes of one
/// simulation as long as each gets its own `seed` (the rest of the bits are
/// random). Not for production: a restarted node would restart the counter.
pub struct SeededUids {
    clock: Arc<dyn Clock>,
    state: Mutex<(XorShift64, u32)>,
}

impl SeededUids {
    pub fn new(seed: u64, clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Mutex::new((XorShift64::new(seed), 0)),
        }
    }
}

impl UidSource for SeededUids {
    fn next_uuid(&self) -> Uuid {
        // A poisoned lock only means another minting panicked; the state
        // (a generator and a counter) is still usable.
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (rng, counter) = &mut *guard;
        *counter = counter.wrapping_add(1);
        let random = rng.next_u64().to_be_bytes();
        // v7 keeps the low 12 bits of bytes 0–1 and the low 6 bits of byte 2;
        // bytes 3–6 carry the counter whole.
        let c = counter.to_be_bytes();
        let bytes = [
            random[0], random[1], random[2], c[0], c[1], c[2], c[3], random[3], random[4], random[5],
        ];
        uuid::Builder::from_unix_timestamp_millis(self.clock.now().0, &bytes).into_uuid()
    }
}

/// A tiny deterministic generator (Marsaglia's xorshift64*): reconnect
/// jitter and seeded ids need spread, not cryptographic quality.
#[derive(Debug, Clone)]
pub struct XorShift64(u64);

impl XorShift64 {
    pub fn new(seed: u64) -> Self {
        // Zero is xorshift's one fixed point; mix the seed so nearby seeds
        // give unrelated sequences.
        Self(splitmix64(seed) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n > 0`; 0 gives 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stable hash of a string (FNV-1a), to derive per-region and per-link
/// seeds: `std`'s hasher is not guaranteed stable across releases.
pub fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A jitter seed from the wall clock's sub-second noise: what a real node
/// uses when no seed is given.
// The sanctioned place: entropy for a real node's jitter, not a time; a
// simulated node passes a seed instead.
#[allow(clippy::disallowed_methods)]
pub fn wall_clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()) ^ d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cascade_core::Timestamp;

    struct Fixed;
    impl Clock for Fixed {
        fn now(&self) -> Timestamp {
            Timestamp(1_700_000_000_000)
        }
    }

    #[test]
    fn seeded_uids_replay_and_stay_unique() {
        let a = SeededUids::new(7, Arc::new(Fixed));
        let b = SeededUids::new(7, Arc::new(Fixed));
        let xs: Vec<_> = (0..1000).map(|_| a.next_uuid()).collect();
        let ys: Vec<_> = (0..1000).map(|_| b.next_uuid()).collect();
        assert_eq!(xs, ys, "same seed, same ids");
        let unique: std::collections::BTreeSet<_> = xs.iter().collect();
        assert_eq!(unique.len(), xs.len(), "no id twice");
        assert_eq!(xs[0].get_version_num(), 7);
        let other = SeededUids::new(8, Arc::new(Fixed)).next_uuid();
        assert_ne!(other, xs[0], "another seed, another sequence");
    }
}
