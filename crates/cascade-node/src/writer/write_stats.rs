//! What a node's writer committed since it opened (see [`WriteStats`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of what a node's writer committed since it opened. Relaxed
/// atomics: readers want totals, not an ordering with the data.
#[derive(Debug, Default)]
pub struct WriteStats {
    batches: AtomicU64,
    key_writes: AtomicU64,
    value_bytes: AtomicU64,
    /// Flushes that made committed batches durable: one per group of
    /// client steps (`writer/group.rs`), so fewer than `batches` when
    /// queued writes share one.
    flushes: AtomicU64,
}

/// A reading of [`WriteStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStatsSnapshot {
    /// Atomic batches committed (one per protocol step that wrote anything).
    pub batches: u64,
    /// Keys put or removed, over every table.
    pub key_writes: u64,
    /// Bytes of the values put (keys not counted).
    pub value_bytes: u64,
}

impl WriteStats {
    pub(super) fn record(&self, batch: &crate::store::Batch) {
        let bytes: usize = batch.ops.iter().map(|(_, _, v)| v.as_ref().map_or(0, Vec::len)).sum();
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.key_writes.fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.value_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(super) fn record_flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// Flushes so far (each made every batch committed before it durable).
    /// Apart from [`WriteStatsSnapshot`], whose fields callers sum and
    /// compare whole.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// The totals now.
    pub fn snapshot(&self) -> WriteStatsSnapshot {
        WriteStatsSnapshot {
            batches: self.batches.load(Ordering::Relaxed),
            key_writes: self.key_writes.load(Ordering::Relaxed),
            value_bytes: self.value_bytes.load(Ordering::Relaxed),
        }
    }
}
