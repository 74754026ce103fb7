//! Commits that skip their flush.
//!
//! A step that says its writes claim nothing (`WriterState::commit_as`,
//! `WriterHandle::apply_may_skip_flush`), and that emits no event, queues
//! no release and writes no audit entry, is committed without a flush of
//! its own: the next flush of any step makes it durable (the engines keep
//! commits in order, so a flushed batch makes every batch before it
//! durable too), and the writer's tick flushes it at the latest
//! ([`WriterState::flush_leftovers`]).
//!
//! Such a step's loss in a crash must only repeat idempotent work: the
//! importer's cursor moved over events that change nothing here, the
//! tombstone and queue entry of a target its owner purged
//! (`peer::AppliedEvents::needs_flush`), and its removal of releases the
//! owner acknowledged (`peer::releases_acknowledged`): a crash that loses
//! them has the owner send the same events again, and the importer the same
//! releases, which the owner answers as absent. Nothing that leaves the
//! node may rest on them unflushed: [`super::WriteStats`] counts the
//! batches (before each commit) and how many the last flush covered, and a
//! link acknowledges its cursor only once the batch that wrote it is
//! durable (`links.rs`, `ack`), since the owner compacts its outbox below
//! the acknowledgements.
//!
//! Why: P3 at 50 regions on fjall, where a network deletion cost 60
//! fsyncs over its nodes and a sample of the next deletion waited behind
//! them; with these skipped it costs 26 (docs/BENCHMARKS.md, "P3 at 50
//! regions and P2 on the memory engine"). `tests/cross_region_crash.rs` loses them in a
//! SIGKILL and checks that they are sent again and applied once.

use cascade_core::CoreError;
use tracing::debug;

use super::WriterState;

impl WriterState {
    /// Flushes every batch committed so far, and notes them durable.
    pub(super) fn flush(&mut self) -> Result<(), CoreError> {
        // The flight in progress first (its failure is counted there).
        self.finish_flight()?;
        // Every commit is this thread's: none lands during the flush.
        let through = self.ctx.stats.committed();
        if let Err(e) = self.ctx.store.flush() {
            self.commit_failed(&e);
            return Err(CoreError::Storage(cascade_core::error::StorageError(e.to_string())));
        }
        self.ctx.stats.record_flush(through);
        self.unflushed = false;
        Ok(())
    }

    /// Shows the commits that skipped their flush to the node's other
    /// readers (its API, its links) now, where the store keeps commits
    /// from them until a flush (`Store::land`; the embedded engines'
    /// pipelined view): a lone one, and a group's when none of its steps
    /// needed a flight. As before the store was pipelined, an importer's
    /// cursor reads moved once its step answered.
    pub(super) fn land_unflushed(&mut self) -> Result<(), CoreError> {
        if !self.unflushed {
            return Ok(());
        }
        if let Err(e) = self.ctx.store.land() {
            self.commit_failed(&e);
            return Err(CoreError::Storage(cascade_core::error::StorageError(e.to_string())));
        }
        Ok(())
    }

    /// Flushes the commits that skipped their flush ([`Self::commit_as`])
    /// if no step's flush has covered them since: run on every tick, so
    /// they wait one tick at most (a link's acknowledgement of its cursor
    /// waits for it).
    pub(super) fn flush_leftovers(&mut self) {
        if !self.unflushed {
            return;
        }
        // A flush of batches committed earlier says nothing about whether
        // the store takes commits now: it does not end an episode of
        // failed commits (health stays NOT_SERVING until a commit, a
        // retry's or a client's, succeeds). It did: on a full disk whose
        // flush still worked, the tick after a refused create read
        // SERVING (`faults::disk_full::a_failing_store_is_retried_with_backoff_and_reopened_then_serves_at_once`
        // failed in CI on that race).
        if let Err(e) = self.flush() {
            debug!(error = %e, "commits that skipped their flush not flushed yet; the next flush will");
        }
    }
}
