//! What a node's writer committed since it opened (see [`WriteStats`]),
//! and how much of it is durable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters of what a node's writer committed since it opened. Relaxed
/// atomics for the totals: readers want totals, not an ordering with the
/// data. `batches` and `flushed_through` are ordered with the data (see
/// [`WriteStats::committed`]).
#[derive(Debug, Default)]
pub struct WriteStats {
    /// Counted before each batch is committed, so a reader that saw a
    /// batch's writes in the store then reads a count that includes it.
    batches: AtomicU64,
    /// Of `batches`, those the work steps committed (`work_budget.rs`).
    work_batches: AtomicU64,
    key_writes: AtomicU64,
    value_bytes: AtomicU64,
    /// Flushes that made committed batches durable: one per group of
    /// client steps (`writer/group.rs`), so fewer than `batches` when
    /// queued writes share one.
    flushes: AtomicU64,
    /// The count of `batches` when the last successful flush started:
    /// every batch up to it is durable. Behind `batches` while a commit
    /// that skipped its flush waits for a later one (`WriterState::commit_as`).
    flushed_through: AtomicU64,
    /// Woken after each successful flush.
    flushed: tokio::sync::Notify,
    /// Times the store may have taken back commits that skipped their
    /// flush while the process lived (a failed commit or flush, a reopen:
    /// see [`WriteStats::takebacks`]).
    takebacks: AtomicU64,
}

/// A reading of [`WriteStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStatsSnapshot {
    /// Atomic batches committed (one per protocol step that wrote anything).
    pub batches: u64,
    /// Of `batches`, those committed by work steps: a deletion's progress,
    /// apart from the client steps that share the writer with it (whose
    /// count depends on how many clients ran, while a delete's work steps
    /// are shared by every deletion under way).
    pub work_batches: u64,
    /// Keys put or removed, over every table.
    pub key_writes: u64,
    /// Bytes of the values put (keys not counted).
    pub value_bytes: u64,
}

impl WriteStats {
    pub(super) fn record(&self, batch: &crate::store::Batch) {
        let bytes: usize = batch.ops.iter().map(|(_, _, v)| v.as_ref().map_or(0, Vec::len)).sum();
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.key_writes.fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.value_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A work step committed `batches` of the batches [`Self::record`]
    /// counted.
    pub(super) fn record_work_batches(&self, batches: u64) {
        self.work_batches.fetch_add(batches, Ordering::Relaxed);
    }

    /// A flush succeeded that started when `through` batches were
    /// committed: they are all durable.
    pub(super) fn record_flush(&self, through: u64) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.flushed_through.fetch_max(through, Ordering::SeqCst);
        self.flushed.notify_waiters();
    }

    /// The store may have taken back what was committed and not flushed
    /// (`WriterState::store_failed`, `WriterState::reopened`).
    pub(super) fn note_takeback(&self) {
        self.takebacks.fetch_add(1, Ordering::SeqCst);
    }

    /// How often the store may have taken back commits that skipped their
    /// flush (`writer/durable.rs`) while the process lived: PostgreSQL drops
    /// a group's staged writes when its transaction fails, and a disk
    /// engine reopened after a failed flush reads only what reached its
    /// files. Such a commit's loss is safe only if whoever relied on it
    /// learns of it: a peer link that handed the writer events the stored
    /// cursor no longer covers follows again from the stored cursor
    /// (`links.rs`), or it would go on past the events taken back, and
    /// a PURGED whose tombstone removal was lost would never come again.
    /// Counted on the writer's thread before its next step, so a step that
    /// reads the count sees every takeback before it.
    pub fn takebacks(&self) -> u64 {
        self.takebacks.load(Ordering::SeqCst)
    }

    /// Batches committed so far. Read after reading something from the
    /// store, it counts the batch that wrote it (see `batches`), so
    /// [`Self::wait_flushed`] of it waits until that read is durable.
    pub fn committed(&self) -> u64 {
        self.batches.load(Ordering::SeqCst)
    }

    /// Whether the first `through` batches are durable, waiting at most
    /// `within` for a flush that makes them so. The writer flushes a
    /// commit that skipped its flush at its next tick at the latest.
    pub async fn wait_flushed(&self, through: u64, within: Duration) -> bool {
        let flushed = async {
            loop {
                // Made before the check: a flush between the two wakes it.
                let next = self.flushed.notified();
                if self.flushed_through.load(Ordering::SeqCst) >= through {
                    return;
                }
                next.await;
            }
        };
        tokio::time::timeout(within, flushed).await.is_ok()
    }

    /// Whether a committed batch waits for a flush (the writer's state
    /// after a restart of the actor: its predecessor may have left one).
    pub(super) fn unflushed(&self) -> bool {
        self.flushed_through.load(Ordering::SeqCst) < self.committed()
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
            work_batches: self.work_batches.load(Ordering::Relaxed),
            key_writes: self.key_writes.load(Ordering::Relaxed),
            value_bytes: self.value_bytes.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> crate::store::Batch {
        let mut b = crate::store::Batch::default();
        b.put(crate::store::Table::Meta, b"k".to_vec(), b"v".to_vec());
        b
    }

    /// What a link's acknowledgement waits for: a read of a batch that
    /// skipped its flush is durable only once a flush that started after
    /// it succeeded; one that started before does not count.
    #[tokio::test]
    async fn a_batch_committed_after_a_flush_started_waits_for_the_next_flush() {
        let stats = std::sync::Arc::new(WriteStats::default());
        stats.record(&batch());
        let before_second = stats.committed();
        stats.record(&batch());
        let read = stats.committed();
        assert!(stats.unflushed());
        // A flush that started before the second batch leaves it waiting.
        stats.record_flush(before_second);
        assert!(!stats.wait_flushed(read, Duration::from_millis(20)).await);
        let waiter = tokio::spawn({
            let stats = stats.clone();
            async move { stats.wait_flushed(read, Duration::from_secs(30)).await }
        });
        tokio::task::yield_now().await;
        stats.record_flush(read);
        assert!(waiter.await.expect("the waiter ends"), "woken by the flush");
        assert!(!stats.unflushed());
    }
}
