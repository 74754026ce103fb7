//! One work step (`WriterState::work`), and how much it may do: the
//! policy's bounds in items (`batch_items`, `batch_budget`), scaled down
//! so that a step also keeps to a time budget. A client's write waits for
//! the rest of the step in progress (it then joins the step's group and
//! its one flush, `writer/group.rs`), so the step's length is what a
//! small write waits for during a long cascade.
//!
//! The bounds in items are a guess from the steps before; the step also
//! stops at its time target ([`WorkBudget::target`]) between two items,
//! and between two referrers of a walk resumed from an earlier step
//! (`protocol::process_work_until`, asked the clock), so one whose items
//! cost more than guessed (a page of tombstones, a wait for a core) ends
//! after the item in progress instead of running several times its
//! target (issue 28: on fjall one step in a hundred ran 23–36 ms against
//! 10; docs/BENCHMARKS.md, "fjall: a step that stops at its time"). A step stopped so is one that hit its
//! bounds: its length still tunes the item bounds below.
//!
//! The time budget comes from the flush's measured cost: a step
//! [`FLUSHES_PER_STEP`] times as long as its flush spends at most about an
//! eighth of the cascade's time in fsyncs; it is never above
//! [`MOST_STEP`] (the small write's p99 target is 20 ms: the rest of one
//! step, then its own step and the group's flush) nor below [`LEAST_STEP`] (steps of
//! the memory engine, whose flush costs nothing, keep their size).
//!
//! Where the store lands a group's writes on a thread of its own while
//! the next step runs (`store/pipelined.rs`), the small write waits for
//! the rest of the step and then its group's landing, so the step is also
//! kept to [`WAIT_GOAL`] less the landings' measured length, down to
//! [`LEAST_STEP_BESIDE_A_LANDING`]. On fjall a landing is a fraction of
//! its step (2–3 ms) and this changes nothing; on sled it is about as long
//! as the step (its writes cost about what the step's reads do), and steps
//! of 10 ms held small writes 24–31 ms at the p99 during P1 1M, of 4–5 ms
//! 16 ms, at the same rate (docs/BENCHMARKS.md, "sled: the writer's reads
//! no longer wait for a landing batch").
//!
//! On PostgreSQL the flush is the group's one transaction
//! (`store/postgres/staged.rs`), whose time is mostly the step's own
//! writes, not a fixed cost to spread: counted as one, it would set its
//! own target (8 × a flush that grows with the step, always
//! [`MOST_STEP`]). A store that reads ahead
//! ([`crate::store::Store::prefetches`]: postgres, whose reads and
//! transactions are round trips) aims its steps at [`TRANSACTION_STEP`],
//! the transaction included. Issue 28's rule is the small write's p99
//! during a P1 of 1M, at most 20 ms. Steps of 10 ms deleted faster (a
//! step's round trips and its transaction's fixed cost are the same
//! whatever its size) but held small writes longer: a p99 of 25.0 ms
//! against 15.6 ms at 5 ms when a group's transaction was flushed in
//! place and its clients answered after it (docs/BENCHMARKS.md,
//! "PostgreSQL: a group's steps in one transaction" and "PostgreSQL at
//! 1M: the variance, the flush, the step"). Since a group's transaction
//! flies while the next step runs, and its clients are answered as soon
//! as it landed, 10 ms steps hold the p99 at 16.6–16.9 ms and delete
//! 49–53k/s against 42–49k/s at 5 ms (docs/BENCHMARKS.md, "PostgreSQL:
//! client groups fly during a cascade").

use std::time::Duration;

use cascade_core::protocol::{self, WorkReport};
use cascade_core::{CoreError, Ctx, Policy};
use ractor::ActorRef;

use super::{WriterMsg, WriterState};

/// A step's time over its flush's: the flush's share of a cascade.
const FLUSHES_PER_STEP: u32 = 8;
/// The longest a step is aimed at, whatever its flush costs.
const MOST_STEP: Duration = Duration::from_millis(10);
/// The shortest: below, a step's fixed costs (finding due work, encoding)
/// would outweigh what it does.
const LEAST_STEP: Duration = Duration::from_millis(5);
/// What a step and the landing of its writes are aimed to take together,
/// where a group's writes land while the next step runs: a small write
/// waits for the rest of one and then the other (the module's doc). Well
/// below issue 28's 20 ms for the small write's p99: both have tails (on
/// sled at 1M the p99 of either is about twice its median).
const WAIT_GOAL: Duration = Duration::from_millis(8);
/// The shortest step [`WAIT_GOAL`]'s rule aims at. Shorter than
/// [`LEAST_STEP`]: beside a landing as long as itself, a step's fixed
/// costs hide in the landing's time (sled at 1M deleted as fast with steps
/// of 4–5 ms as of 6–7).
const LEAST_STEP_BESIDE_A_LANDING: Duration = Duration::from_micros(2_500);
/// What a step is aimed at when its flush is its transaction (the
/// module's doc).
const TRANSACTION_STEP: Duration = MOST_STEP;
/// The smallest share of the policy's bounds a step is given.
const LEAST_SCALE: f64 = 1.0 / 16.0;

/// The bounds of the next work step (see the module's doc).
#[derive(Debug, Clone)]
pub(super) struct WorkBudget {
    /// The share of the policy's bounds the next step is given (0..=1).
    scale: f64,
    /// A flush's duration, smoothed (seconds; an eighth per flush).
    flush_secs: f64,
    /// A flight's landing on the store's own thread, smoothed as
    /// `flush_secs`; None until one landed (none does on a store without
    /// that thread).
    landing_secs: Option<f64>,
    /// The flush is the step's transaction (postgres): steps aim at
    /// [`TRANSACTION_STEP`].
    flush_is_the_transaction: bool,
}

impl WorkBudget {
    pub(super) fn new() -> Self {
        Self {
            scale: 1.0,
            flush_secs: 0.0,
            landing_secs: None,
            flush_is_the_transaction: false,
        }
    }

    /// The policy for the next work step: `base` with its step bounds
    /// scaled, at least one of each.
    pub(super) fn policy(&self, base: &Policy) -> Policy {
        let scaled = |most: usize| ((most as f64 * self.scale).round() as usize).clamp(1, most.max(1));
        Policy {
            batch_items: scaled(base.batch_items),
            batch_budget: scaled(base.batch_budget),
            ..base.clone()
        }
    }

    /// A flush took `took`.
    pub(super) fn flushed(&mut self, took: Duration) {
        self.flush_secs += (took.as_secs_f64() - self.flush_secs) / 8.0;
    }

    /// A flight landed in `took` on the store's own thread.
    pub(super) fn landed(&mut self, took: Duration) {
        let took = took.as_secs_f64();
        let smoothed = self.landing_secs.get_or_insert(took);
        *smoothed += (took - *smoothed) / 8.0;
    }

    /// What a step is aimed at now.
    pub(super) fn target(&self) -> Duration {
        if self.flush_is_the_transaction {
            return TRANSACTION_STEP;
        }
        let by_flush =
            Duration::from_secs_f64(self.flush_secs * f64::from(FLUSHES_PER_STEP)).clamp(LEAST_STEP, MOST_STEP);
        let Some(landing) = self.landing_secs else {
            return by_flush;
        };
        let by_landing = WAIT_GOAL
            .saturating_sub(Duration::from_secs_f64(landing))
            .max(LEAST_STEP_BESIDE_A_LANDING);
        by_flush.min(by_landing)
    }

    /// Whether the store's flush is the transaction of the step's writes
    /// (the module's doc says why it then sets no target of its own).
    pub(super) fn flush_is_the_transaction(&mut self, is: bool) {
        self.flush_is_the_transaction = is;
    }

    /// A work step took `took` (its reads, commit and flush); `bounded`:
    /// it stopped at its bounds with more due, so its length says what
    /// those bounds cost. At most halved or doubled per step.
    pub(super) fn step_took(&mut self, took: Duration, bounded: bool) {
        let target = self.target().as_secs_f64();
        let took = took.as_secs_f64().max(1e-6);
        if !bounded && took <= target {
            return;
        }
        let factor = (target / took).clamp(0.5, 2.0);
        self.scale = (self.scale * factor).clamp(LEAST_SCALE, 1.0);
    }

    /// The share of the policy's bounds the next step is given.
    #[cfg(test)]
    pub(super) fn scale(&self) -> f64 {
        self.scale
    }
}

impl WriterState {
    /// One work step, kept to its time budget.
    ///
    /// The step opens a group (`writer/group.rs`): its commit waits for
    /// the group's flush, which the client steps queued while it ran join,
    /// so a small write that came in meanwhile waits for one flush, not
    /// for the step's and then its own.
    pub(super) fn work(&mut self, myself: &ActorRef<WriterMsg>) -> Result<WorkReport, CoreError> {
        let started = crate::clock::monotonic_now();
        self.work_budget.flush_is_the_transaction(self.ctx.store.prefetches());
        let policy = self.work_budget.policy(&self.ctx.policy);
        // The item bounds guess a step's length from the last steps'; the
        // clock ends the one whose items cost more than guessed, after the
        // item in progress (the module's doc).
        let stop_at = started + self.work_budget.target();
        let may_go_on = move || crate::clock::monotonic_now() < stop_at;
        self.group = Some(super::group::Group::default());
        let committed_before = self.ctx.stats.committed();
        let ran = self.run(myself, |state, ctx, _| {
            protocol::process_work_until(state, Ctx { policy: &policy, ..ctx }, &may_go_on)
        });
        let ran_for = started.elapsed();
        self.ctx
            .stats
            .record_work_batches(self.ctx.stats.committed().saturating_sub(committed_before));
        let report = match ran {
            Ok(report) => report,
            Err(e) => {
                // Refused or not committed: the group holds nothing.
                self.group = None;
                return Err(e);
            }
        };
        // The step's length is its own: its reads and commit, and the
        // flush; not the client steps that joined its group.
        // Its flight overlaps the next step only when this one stopped at
        // its bounds with more due: a cascade's steps.
        let flushed_in = self.close_group(myself, Vec::new(), report.more)?;
        // What a small write queued behind this step waits for: the step's
        // own run and its group's flush, apart (issue 28's tail;
        // `RUST_LOG=cascade_node::writer::work_budget=debug` prints them).
        tracing::debug!(
            ran_us = ran_for.as_micros() as u64,
            target_us = self.work_budget.target().as_micros() as u64,
            last_landing_us = self.ctx.store.last_landing().map_or(0, |l| l.as_micros() as u64),
            flush_us = flushed_in.as_micros() as u64,
            items = report.items,
            stopped_early = report.stopped_early,
            "work step timed"
        );
        self.work_budget.step_took(ran_for + flushed_in, report.more);
        self.ctx.metrics.deletions_retried(report.retried);
        if report.more || report.items > 0 {
            self.kick(myself);
        }
        if !report.awaiting_closure.is_empty() {
            // After the group's flush: the waiting root is durable (with
            // the flush in flight, once it landed: `finish_flight`).
            match &mut self.in_flight {
                Some(flight) => flight.awaiting_closure.extend(report.awaiting_closure.iter().copied()),
                None => self.ctx.closure_checks.report(report.awaiting_closure.iter().copied()),
            }
        }
        if !report.budget_wanted.is_empty() {
            if let Ok(mut wants) = self.ctx.budget_wants.lock() {
                for want in &report.budget_wanted {
                    let entry = wants.entry(want.operation).or_insert_with(|| want.clone());
                    entry.wanted = entry.wanted.max(want.wanted);
                }
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_step_shrinks_the_next_and_a_short_bounded_one_grows_it_back() {
        let mut budget = WorkBudget::new();
        let base = Policy::default();
        for _ in 0..8 {
            budget.flushed(Duration::from_millis(1));
        }
        // Steps of 40 ms against a target of 5..10 ms: halved each time.
        budget.step_took(Duration::from_millis(40), true);
        assert_eq!(budget.scale(), 0.5);
        budget.step_took(Duration::from_millis(40), true);
        assert_eq!(budget.policy(&base).batch_budget, base.batch_budget / 4);
        for _ in 0..10 {
            budget.step_took(Duration::from_secs(1), true);
        }
        assert_eq!(budget.scale(), LEAST_SCALE, "never below the least share");
        for _ in 0..10 {
            budget.step_took(Duration::from_micros(100), true);
        }
        assert_eq!(budget.policy(&base), base, "never above the policy");
    }

    #[test]
    fn a_step_that_ran_out_of_work_says_nothing_about_its_bounds() {
        let mut budget = WorkBudget::new();
        budget.step_took(Duration::from_millis(40), true);
        let scale = budget.scale();
        budget.step_took(Duration::from_micros(10), false);
        assert_eq!(budget.scale(), scale);
    }

    #[test]
    fn a_flush_that_is_the_steps_transaction_sets_no_target_of_its_own() {
        let mut budget = WorkBudget::new();
        budget.flush_is_the_transaction(true);
        assert_eq!(budget.target(), TRANSACTION_STEP, "before any flush");
        for _ in 0..100 {
            budget.flushed(Duration::from_millis(50));
        }
        assert_eq!(budget.target(), TRANSACTION_STEP, "whatever the flush took");
        budget.flush_is_the_transaction(false);
        assert_eq!(budget.target(), MOST_STEP);
        for _ in 0..100 {
            budget.flushed(Duration::from_micros(10));
        }
        assert_eq!(budget.target(), LEAST_STEP);
    }

    #[test]
    fn the_target_follows_the_flush_within_its_bounds() {
        let mut budget = WorkBudget::new();
        assert_eq!(budget.target(), LEAST_STEP);
        for _ in 0..100 {
            budget.flushed(Duration::from_millis(50));
        }
        assert_eq!(budget.target(), MOST_STEP);
    }

    /// A small write that joins a step's group waits for the rest of the
    /// step and then the group's landing: landings shorten the steps so
    /// that both stay within the goal, down to a floor; a flush's target
    /// that is shorter still holds.
    #[test]
    fn long_landings_shorten_the_step_and_short_ones_leave_it() {
        let mut budget = WorkBudget::new();
        for _ in 0..100 {
            budget.flushed(Duration::from_millis(50));
        }
        assert_eq!(budget.target(), MOST_STEP, "no landing yet");
        for _ in 0..100 {
            budget.landed(Duration::from_millis(2));
        }
        let target = budget.target();
        assert_eq!(target, WAIT_GOAL - Duration::from_millis(2), "{target:?}");
        for _ in 0..100 {
            budget.flushed(Duration::from_micros(10));
        }
        assert_eq!(
            budget.target(),
            LEAST_STEP,
            "the flush's own target, when shorter, holds"
        );
        for _ in 0..100 {
            budget.flushed(Duration::from_millis(50));
            budget.landed(Duration::from_millis(40));
        }
        assert_eq!(
            budget.target(),
            LEAST_STEP_BESIDE_A_LANDING,
            "never below the shortest step beside a landing"
        );
    }
}
