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
//! - Nothing is staged on top of a flight: the writer finishes the flight
//!   before it commits (`writer/group.rs`), and any other commit waits for
//!   it here ([`Flights`]): a commit's reads may rest on the flight's
//!   writes, and if the flight fails it must not land. So a failed flight
//!   drops everything its successors could rest on.
//! - One flight at a time: starting one, or a synchronous flush, first
//!   waits for the one in progress.
//! - Only the writer is told how a flight ended: the outcome stays here,
//!   by epoch, until its [`Store::finish_flush`] (or the next start or
//!   synchronous flush, which are the writer's too) takes it. A commit that
//!   found the flight failed is refused with a copy and leaves the outcome
//!   in place; a reader never looks. A flight that failed is reported
//!   once, and a flight of an epoch the store no longer holds never
//!   reports Ok unless its own transaction landed.
//! - The transaction is the one `send` runs (`commit.rs`): fenced first
//!   with the epoch it was staged at, on the writer's session, so a
//!   takeover refuses it exactly as before.

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
    pub(super) fn unreported_failure(&self, epoch: u64) -> Option<StoreError> {
        match &self.ended {
            Some((ended_at, Err(e))) if *ended_at == epoch => Some(staged::copy_of(e)),
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
            Some((_, outcome)) => outcome,
            None => Ok(()),
        }
    }

    /// Whether the last flight ended and its writer was not told yet.
    #[cfg(test)]
    pub(super) fn untold(&self) -> bool {
        self.ended.is_some()
    }
}

impl PostgresStore {
    /// The flights, once the one in progress (if any) ended: its outcome
    /// is applied (cache and staged set, as `send_staged` does) and kept
    /// for its writer.
    pub(super) fn landed_flight(&self) -> MutexGuard<'_, Flights> {
        let mut flights = self.flight.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(flight) = flights.running.take() {
            let ran = self.join(flight.task);
            let outcome = self.sent_ended(&flight.taken, flight.started, ran);
            self.staged.sent(&flight.taken, None);
            flights.ended = Some((flight.taken.epoch, outcome));
        }
        flights
    }

    /// Starts the flight of what is staged at `expected`'s epoch (None:
    /// the store's) and returns at once; nothing staged, nothing starts.
    /// A flight in progress is waited for first, and a failure of that
    /// epoch not told yet is returned (nothing starts then).
    pub(super) fn start_flush_at(&self, expected: Option<u64>) -> Result<(), StoreError> {
        let mut flights = self.landed_flight();
        flights.take_outcome(expected)?;
        let _one_flush = self.commit_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(taken) = self.staged.take(expected)? else {
            return Ok(());
        };
        match self.dispatch(&taken, true) {
            Ok((started, task)) => {
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
    pub(super) fn finish_flush_at(&self, expected: Option<u64>) -> Result<(), StoreError> {
        let mut flights = self.landed_flight();
        let of_this_epoch = flights
            .ended
            .as_ref()
            .is_some_and(|(ended_at, _)| expected.is_none_or(|held| held == *ended_at));
        if of_this_epoch {
            return flights.take_outcome(expected);
        }
        match (expected, self.fenced_epoch()) {
            (Some(held), Some(current)) if held != current => Err(StoreError::Fenced { held, current }),
            _ => Ok(()),
        }
    }
}
