//! A group's flush sent in the background (a **flight**), so that the
//! writer's next step (its reads and its compute) runs while the server
//! works on the transaction ([`Store::start_flush`],
//! [`Store::finish_flush`]).
//!
//! Why: the group's transaction was about 44 % of a P1's wall on
//! PostgreSQL (1.6–2.3 ms each at 1M), and the writer's thread waited for
//! it doing nothing (docs/BENCHMARKS.md, "PostgreSQL: a group's flush
//! overlapped with the next step").
//!
//! What keeps it as safe as the synchronous flush:
//! - The flight's writes stay staged until it ended (`staged.rs`): the
//!   writer's view reads them first, then the cache, which holds what the
//!   server held before the flight (so its lookups are right for every
//!   other key; `cache.rs`, `State::busy_for`). Landed, the cache takes
//!   them and the staged set drops them; failed, both go (nothing of the
//!   flight is read again). A reader never sees a write, then not, then
//!   again within a flight that lands.
//! - A commit made while a flight flies is staged on top of it, without
//!   waiting (`PostgresStore::commit_at`; the writer's next group,
//!   `writer.rs`, `commit_unflushed`): read over the flight's writes
//!   (`staged.rs`), and sent by the next flush, which starts once the
//!   flight ended. Its reads may rest on the flight's writes, so if the
//!   flight fails it must not land: a failed flight drops what was
//!   staged on top of it too, and the next flush of that epoch fails
//!   (`Staged::flight_failed`). The flights' lock is held while a commit
//!   stages, so a flight never ends between a commit's check of it and
//!   its staging; and once a flight ended failed, a commit is refused
//!   until its writer was told ([`Flights`]).
//! - One flight at a time: starting one, or a synchronous flush, first
//!   waits for the one in progress.
//! - Only the writer is told how a flight ended: the outcome stays here,
//!   by epoch, until its [`Store::finish_flush`] (or the next start, the
//!   writer's too) takes it. A commit or a synchronous flush that finds
//!   the flight failed is refused with a copy and leaves the outcome in
//!   place (the shutdown flush must not take the error of a writer stuck
//!   in a step). A flight that failed is reported once; a writer whose
//!   flight's outcome is gone is told it is unknown, never Ok; and a
//!   flight of an epoch the store no longer holds never reports Ok unless
//!   its own transaction landed. A caller naming no epoch (the shutdown
//!   flush, the bench) acts at the store's: an older epoch's outcome is
//!   left for its writer.
//! - The transaction is the one `send` runs (`commit.rs`): fenced first
//!   with the epoch it was staged at, on the writer's session, so a
//!   takeover refuses it exactly as before.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{MutexGuard, PoisonError};

#[cfg(doc)]
use super::Store;
use super::{commit, staged, PostgresStore, StoreError};

/// The flight in progress, and how the last one ended.
#[derive(Default)]
pub(super) struct Flights {
    running: Option<Flight>,
    /// How the last flight ended, with its epoch, until the writer of that
    /// epoch is told.
    ended: Option<(u64, Result<(), StoreError>)>,
    /// The epoch of the last flight started whose outcome its writer was
    /// not told yet: its `finish_flush` finding no outcome then says the
    /// outcome was lost, never Ok (review finding S1: "no flight" and "my
    /// flight's outcome was taken by someone else" looked the same).
    owed: Option<u64>,
}

/// A group's transaction on its way.
struct Flight {
    taken: staged::Taken,
    /// The cache's generation it started at.
    started: u64,
    task: commit::Task,
}

impl Flights {
    /// A failed flight of `epoch` its writer was not told of yet: a copy
    /// (the writer's `finish_flush` still gets the error).
    pub(super) fn unreported_failure(&self, epoch: Option<u64>) -> Option<StoreError> {
        match &self.ended {
            Some((ended_at, Err(e))) if epoch.is_none_or(|epoch| epoch == *ended_at) => Some(staged::copy_of(e)),
            _ => None,
        }
    }

    /// Takes how the last flight of `expected`'s epoch (None: of any)
    /// ended: its error when it failed. A flight of another epoch is left
    /// for its own writer.
    pub(super) fn take_outcome(&mut self, expected: Option<u64>) -> Result<(), StoreError> {
        let of_this_epoch = self
            .ended
            .as_ref()
            .is_some_and(|(ended_at, _)| expected.is_none_or(|held| held == *ended_at));
        if !of_this_epoch {
            return Ok(());
        }
        match self.ended.take() {
            Some((ended_at, outcome)) => {
                if self.owed == Some(ended_at) {
                    self.owed = None;
                }
                outcome
            }
            None => Ok(()),
        }
    }

    /// Tests only: the outcome taken by a path other than the writer's
    /// wait (a bug of that class), without its owed mark cleared.
    #[cfg(test)]
    pub(super) fn lose_outcome(&mut self) -> Option<Result<(), StoreError>> {
        self.ended.take().map(|(_, outcome)| outcome)
    }

    /// Whether the last flight ended and its writer was not told yet.
    #[cfg(test)]
    pub(super) fn untold(&self) -> bool {
        self.ended.is_some()
    }
}

#[cfg(test)]
impl PostgresStore {
    /// Whether a flight was started and nobody ended it yet (without
    /// waiting for it, as [`PostgresStore::landed_flight`] would).
    pub(super) fn landed_flight_is_running(&self) -> bool {
        self.flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running
            .is_some()
    }
}

impl PostgresStore {
    /// The flights, once the one in progress (if any) ended: its outcome
    /// is applied (cache and staged set, as `send_staged` does) and kept
    /// for its writer.
    ///
    /// A panic while it ends (in the cache's write-through, say) must not
    /// lose the outcome (review finding S3): the flight was taken out of
    /// `running` already, so the next `finish_flush` would find nothing
    /// and the staged set would never be cleared. It is caught here: the
    /// cache is dropped, the staged set drops the flight's writes, and the
    /// outcome is unknown (the transaction may have landed), which stops
    /// later commits as any unknown outcome does.
    pub(super) fn landed_flight(&self) -> MutexGuard<'_, Flights> {
        let mut flights = self.flight.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(flight) = flights.running.take() {
            let Flight { taken, started, task } = flight;
            let ended = catch_unwind(AssertUnwindSafe(|| {
                let ran = self.join(task);
                let outcome = self.sent_ended(&taken, started, ran);
                match &outcome {
                    Ok(()) => self.staged.sent(&taken, None),
                    // What was staged on top of it goes too.
                    Err(e) => self.staged.flight_failed(&taken, e),
                }
                outcome
            }));
            let outcome = ended.unwrap_or_else(|_| {
                self.cache.clear();
                let e = StoreError::CommitOutcomeUnknown("a panic while the flight's transaction ended".into());
                // Whatever panicked above, the flight's writes leave the
                // staged set, with what was staged on top of them (a
                // second panic here is not caught: the writer's restart
                // reads the store again).
                self.staged.flight_failed(&taken, &e);
                self.commit_failed(&e, taken.epoch);
                Err(e)
            });
            flights.ended = Some((taken.epoch, outcome));
        }
        flights
    }

    /// The epoch a caller that names none (`expected` None: the shutdown
    /// flush, the bench) acts at: the store's. An outcome left by an older
    /// epoch's flight is that epoch's writer's, never theirs.
    pub(super) fn acting_epoch(&self, expected: Option<u64>) -> Option<u64> {
        expected.or_else(|| self.fenced_epoch())
    }

    /// Starts the flight of what is staged at `expected`'s epoch (None:
    /// the store's) and returns at once; nothing staged, nothing starts.
    /// A flight in progress is waited for first, and a failure of that
    /// epoch not told yet is returned (nothing starts then).
    ///
    /// `landed` runs on the store's runtime as soon as the transaction's
    /// COMMIT returned (never when it failed, nor when nothing started):
    /// its writes are on the server then, and every reader but the
    /// writer's view reads the server while a flight is in progress
    /// (`cache.rs`, `State::busy_for`), so whoever it answers reads them.
    pub(super) fn start_flush_at(
        &self,
        expected: Option<u64>,
        landed: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<(), StoreError> {
        let mut flights = self.landed_flight();
        flights.take_outcome(self.acting_epoch(expected))?;
        let _one_flush = self.commit_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(taken) = self.staged.take(expected)? else {
            return Ok(());
        };
        match self.unwound(&taken, || self.dispatch(&taken, true, landed))? {
            Ok((started, task)) => {
                flights.owed = Some(taken.epoch);
                flights.running = Some(Flight { taken, started, task });
                Ok(())
            }
            Err(e) => {
                self.staged.sent(&taken, None);
                Err(e)
            }
        }
    }

    /// Waits for the flight in progress of `expected`'s epoch (None: the
    /// store's) and says how it ended; Ok when none was in progress. A
    /// writer of an epoch the store no longer holds, whose flight's
    /// outcome is gone, is told it is fenced, never Ok.
    ///
    /// Its flight started and its outcome is gone (taken by another path
    /// than this wait): an error, never Ok.
    pub(super) fn finish_flush_at(&self, expected: Option<u64>) -> Result<(), StoreError> {
        let mut flights = self.landed_flight();
        let acting = self.acting_epoch(expected);
        let of_this_epoch = flights
            .ended
            .as_ref()
            .is_some_and(|(ended_at, _)| acting.is_none_or(|held| held == *ended_at));
        if of_this_epoch {
            return flights.take_outcome(acting);
        }
        if flights.owed.is_some_and(|owed| acting.is_none_or(|held| held == owed)) {
            flights.owed = None;
            return Err(StoreError::CommitOutcomeUnknown(
                "the outcome of this writer's flight was lost before it was told".into(),
            ));
        }
        match (expected, self.fenced_epoch()) {
            (Some(held), Some(current)) if held != current => Err(StoreError::Fenced { held, current }),
            _ => Ok(()),
        }
    }
}
