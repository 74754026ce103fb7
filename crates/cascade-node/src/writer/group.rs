//! Group commit: the steps clients ask for (`Create`, `Update`, `Delete`,
//! `Apply`) queue beside the writer's mailbox, and the writer runs every
//! step queued (at most [`MAX_GROUP_STEPS`]) one after the other, each
//! committed without a flush, then flushes once for all of them, then
//! answers each and publishes their events in order.
//!
//! Why a queue of its own: a ractor actor sees one message at a time and
//! cannot look at the rest of its mailbox, so it could neither gather the
//! writes queued there nor serve them before a `Work` queued ahead of
//! them. Here the writer takes the client steps first whatever message
//! woke it (`WriterState::serve_clients` runs before every message): a
//! client's write waits for the step in progress, never for a `Work`
//! queued before it. And it does not wait for that step's flush: a work
//! step opens a group of its own, and the client steps queued while a
//! group's steps ran join it before its one flush
//! ([`WriterState::close_group`]).
//!
//! Each step reads what the steps before it committed (the engine shows a
//! committed batch before its flush), so the group is the same sequence of
//! steps as before, only with one flush. Nothing leaves the node before it
//! is durable: replies and events wait for the group's flush. A step the
//! core refuses writes nothing and answers its refusal; a failed flush
//! answers every step that succeeded once something was committed with
//! the storage error (UNAVAILABLE: it may have happened, as any commit
//! whose flush failed).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use cascade_core::CoreError;
use ractor::{ActorRef, RpcReplyPort};
use tracing::info_span;

use super::{off_the_workers, WriterMsg, WriterState};
use crate::error::WriterUnavailable;

/// Client steps one flush covers at most. A step answers after the whole
/// group's flush, so the group is bounded: its first step waits for the
/// others' reads and commits. P3 queues about 20 steps per notification
/// over 50 regions (docs/BENCHMARKS.md), a few per node at once; the
/// bound only matters under a flood of writes.
pub(super) const MAX_GROUP_STEPS: usize = 64;

/// The client steps waiting for the writer (see the module's doc).
#[derive(Default)]
pub(super) struct ClientQueue {
    inner: Mutex<Queued>,
}

#[derive(Default)]
struct Queued {
    steps: VecDeque<WriterMsg>,
    /// A `Clients` message is in the writer's mailbox: no other is cast.
    wake_queued: bool,
    /// The writer was stopped for good: nothing more is queued.
    closed: bool,
}

impl ClientQueue {
    fn queued(&self) -> std::sync::MutexGuard<'_, Queued> {
        // A panic while holding the lock left a valid queue.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a client's step and wakes `writer` unless a wake-up is
    /// already in its mailbox. A writer that stopped gets nothing queued.
    pub(super) fn push(&self, writer: &ActorRef<WriterMsg>, step: WriterMsg) -> Result<(), WriterUnavailable> {
        let mut queued = self.queued();
        if queued.closed {
            return Err(WriterUnavailable("the writer was stopped".into()));
        }
        queued.steps.push_back(step);
        if queued.wake_queued {
            return Ok(());
        }
        match writer.cast(WriterMsg::Clients) {
            Ok(()) => {
                queued.wake_queued = true;
                Ok(())
            }
            Err(e) => {
                // Under the lock: ours is still the last one.
                queued.steps.pop_back();
                Err(WriterUnavailable(e.to_string()))
            }
        }
    }

    /// Takes at most `most` queued steps, in order. Steps left behind are
    /// woken for again (one `Clients` more): they go before the message
    /// after it.
    fn take(&self, writer: &ActorRef<WriterMsg>, most: usize) -> Vec<WriterMsg> {
        let mut queued = self.queued();
        let count = queued.steps.len().min(most);
        let taken: Vec<WriterMsg> = queued.steps.drain(..count).collect();
        queued.wake_queued = !queued.steps.is_empty() && writer.cast(WriterMsg::Clients).is_ok();
        taken
    }

    /// Whether no client step waits (a flight then has nothing to overlap
    /// with: `WriterState::handle` finishes it).
    pub(super) fn is_empty(&self) -> bool {
        self.queued().steps.is_empty()
    }

    /// The writer stopped for good (the node shuts down): the steps still
    /// queued are dropped, so their callers are answered that the writer
    /// stopped instead of waiting, and nothing more is queued.
    pub(super) fn close(&self) {
        let dropped = {
            let mut queued = self.queued();
            queued.closed = true;
            std::mem::take(&mut queued.steps)
        };
        // Dropped outside the lock: each drops its caller's reply port.
        drop(dropped);
    }

    /// The writer failed and its restart waits out a backoff
    /// (`writer/supervisor.rs`): the steps queued are answered at once that
    /// the writer stopped (UNAVAILABLE: none of them ran, the caller may
    /// retry) instead of waiting for a writer that may fail on them again,
    /// and a wake-up its mailbox lost is forgotten, so that the next push
    /// tries the dead writer and is refused at once too.
    pub(super) fn refuse_queued(&self) {
        let dropped = {
            let mut queued = self.queued();
            queued.wake_queued = false;
            std::mem::take(&mut queued.steps)
        };
        // Dropped outside the lock: each drops its caller's reply port.
        drop(dropped);
    }

    /// A new incarnation of the writer: its predecessor's wake-up, if any,
    /// died with its mailbox.
    pub(super) fn wake(&self, writer: &ActorRef<WriterMsg>) {
        let mut queued = self.queued();
        queued.wake_queued = !queued.steps.is_empty() && writer.cast(WriterMsg::Clients).is_ok();
    }
}

/// How the flush a step's answer waited for ended.
#[derive(Clone, Copy)]
pub(super) enum Flushed<'a> {
    /// It landed (or nothing needed one).
    Landed,
    /// It failed with this error.
    Failed(&'a CoreError),
    /// The step read what a flight that then failed had written
    /// (`WriterState::finish_flight`): whatever it answers rests on
    /// writes that never landed.
    RestsOnFailed(&'a CoreError),
}

/// Sends a step's answer, given how the group's flush ended.
type SendAnswer = Box<dyn FnOnce(Flushed<'_>) + Send>;

/// A step's answer, sent once the group's flush is known.
pub struct Reply(SendAnswer);

impl Reply {
    /// The step's `result`, unless it succeeded after something of its
    /// group was committed (`after_commit`) and the flush then failed: it
    /// may not be durable, so it answers the flush's error. A step that
    /// read what a failed flight wrote answers that error, refusals too
    /// (a name taken by a create that never landed, say).
    pub(super) fn after_flush<T: Send + 'static>(
        port: RpcReplyPort<Result<T, CoreError>>,
        result: Result<T, CoreError>,
        after_commit: bool,
    ) -> Self {
        Self(Box::new(move |flushed: Flushed<'_>| {
            let result = match (result, flushed) {
                (Ok(_), Flushed::Failed(e)) if after_commit => Err(e.clone()),
                (_, Flushed::RestsOnFailed(e)) => Err(e.clone()),
                (result, _) => result,
            };
            let _ = port.send(result);
        }))
    }

    /// An answer that claims nothing the flush makes durable.
    pub(super) fn now<T: Send + 'static>(port: RpcReplyPort<T>, value: T) -> Self {
        Self(Box::new(move |_: Flushed<'_>| {
            let _ = port.send(value);
        }))
    }

    pub(super) fn send(self, flushed: Flushed<'_>) {
        (self.0)(flushed)
    }
}

/// A group whose flush is in flight (`Store::start_flush`): what it
/// releases once the flight landed, or answers the error if it failed
/// ([`WriterState::finish_flight`]).
pub(super) struct InFlight {
    committed: Vec<super::Committed>,
    /// Its group's replies: sent once it landed, by the store's thread
    /// that saw it land if that came first (`Store::start_flush_then`),
    /// else here.
    replies: Arc<Mutex<Vec<Reply>>>,
    /// `WriteStats::committed` when the flight started: what it makes
    /// durable.
    through: u64,
    /// The writer's count of store failures when the flight started: a
    /// flight that lands ends no episode that began after it.
    failures_before: u64,
    /// Operations whose root waits for other regions' parts, reported
    /// once the root is durable (`WriterState::work`).
    pub(super) awaiting_closure: Vec<cascade_core::OperationId>,
    /// A step of the next group committed on top of it
    /// (`WriterState::commit_unflushed`): its landing leaves that commit
    /// to the next flush.
    pub(super) committed_on_top: bool,
}

/// The replies of a flight not sent yet: each is sent once, by whoever
/// takes it first.
fn take_replies(replies: &Mutex<Vec<Reply>>) -> Vec<Reply> {
    std::mem::take(&mut *replies.lock().unwrap_or_else(PoisonError::into_inner))
}

/// What the steps of the group in progress committed, in order; `None`
/// outside a group (each commit flushes at once).
#[derive(Default)]
pub(super) struct Group {
    pub(super) committed: Vec<super::Committed>,
    /// The flight its steps read past failed
    /// ([`WriterState::finish_flight`]): every reply answers this error.
    pub(super) rests_on_failed: Option<CoreError>,
}

impl WriterState {
    /// Whether the queued client steps are left for the next work step's
    /// group (it takes them when it closes, [`Self::close_group`]): while
    /// a work step's flight flies and the next is queued, on a store that
    /// stages commits on top of a flight (PostgreSQL). Served as a group
    /// of their own, they waited for the flight and held the next work
    /// step back from overlapping it: the server sat idle for a whole
    /// step's compute after each such group (docs/BENCHMARKS.md,
    /// "PostgreSQL: the gap between two flights"). Joining, they wait for
    /// the same flight and the next one, and are answered as soon as it
    /// landed (`Store::start_flush_then`).
    pub(super) fn clients_wait_for_the_next_step(&self) -> bool {
        self.in_flight.is_some()
            && self.work_queued
            && !self.healing.failing()
            && self.ctx.store.commits_on_top_of_a_flight()
    }

    /// Runs the queued client steps as one group (see the module's doc).
    /// Called before every message of the mailbox, and for `Clients`.
    pub(super) fn serve_clients(&mut self, myself: &ActorRef<WriterMsg>) {
        let steps = self.clients.take(myself, MAX_GROUP_STEPS);
        if steps.is_empty() {
            return;
        }
        off_the_workers(self.ctx.store.waits_on_io(), || self.run_group(myself, steps));
    }

    pub(super) fn run_group(&mut self, myself: &ActorRef<WriterMsg>, steps: Vec<WriterMsg>) {
        self.group = Some(Group::default());
        let mut replies = Vec::with_capacity(steps.len());
        self.run_client_steps(myself, steps, &mut replies);
        // Each reply carries the flush's outcome to its caller.
        // On a store whose flush is a transaction on a server (PostgreSQL:
        // the one that reads ahead, as in `work_budget.rs`), a group of
        // client steps flies when a work step is queued (a cascade in
        // progress), which overlaps it: flushed in place, the writer
        // waited for the group's transaction and then the server for the
        // next step, so a cascade's steps hardly overlapped while clients
        // wrote (docs/BENCHMARKS.md, "PostgreSQL: client groups fly
        // during a cascade"). Its replies leave once it landed
        // (`Store::start_flush_then`); its events (a region's release, a
        // peer's notification) when the writer finishes it, after the
        // step's compute. Otherwise it flies only with more client steps
        // queued, and a region's events are not held (P3 on fjall).
        let overlapped_by_work = self.work_queued && self.ctx.store.prefetches();
        let _flushed = self.close_group(myself, replies, overlapped_by_work);
    }

    /// Runs client steps in the group in progress, gathering their replies.
    fn run_client_steps(&mut self, myself: &ActorRef<WriterMsg>, steps: Vec<WriterMsg>, replies: &mut Vec<Reply>) {
        for step in steps {
            let started = crate::clock::monotonic_now();
            let (caller, step) = match step {
                WriterMsg::Traced(span, step) => (span, *step),
                step => (tracing::Span::none(), step),
            };
            let (name, reply) = self.client_step(myself, &caller, step);
            self.ctx.metrics.writer_step(name, started.elapsed());
            replies.extend(reply);
        }
    }

    /// Ends the group in progress: the client steps queued while it ran
    /// join it first (at most [`MAX_GROUP_STEPS`] more), then one flush
    /// makes every commit of the group durable, then the events are
    /// published in commit order and each reply is sent. Returns how long
    /// the flush took, or its error.
    ///
    /// Why the late steps join: a client's write that arrives while a step
    /// runs would otherwise wait for that step's flush and then its own
    /// (two fsyncs in a row); joining, it waits for the rest of the step
    /// and one flush, which also makes the other's durable.
    pub(super) fn close_group(
        &mut self,
        myself: &ActorRef<WriterMsg>,
        mut replies: Vec<Reply>,
        more_work: bool,
    ) -> Result<std::time::Duration, CoreError> {
        let late = self.clients.take(myself, MAX_GROUP_STEPS);
        self.run_client_steps(myself, late, &mut replies);
        let started = crate::clock::monotonic_now();
        // The flight before this group lands first (its failure marks this
        // group, whose steps read past it): one flight at a time, and this
        // group's answers never leave before it. Client steps queued while
        // the writer waited for it join too, once it landed: left for the
        // next group, they would wait for a whole step more.
        let mut started = started;
        if self.finish_flight().is_ok() && replies.len() < MAX_GROUP_STEPS {
            let waited = self.clients.take(myself, MAX_GROUP_STEPS - replies.len());
            let clients_ran = crate::clock::monotonic_now();
            self.run_client_steps(myself, waited, &mut replies);
            // Their steps are theirs, not the flush's (the work budget
            // is fed the step's own time).
            started += clients_ran.elapsed();
        }
        let group = self.group.take().unwrap_or_default();
        let committed = group.committed;
        if let Some(e) = group.rests_on_failed {
            // What its steps committed after the failure is flushed (and
            // published if it lands: it rests on nothing lost); every
            // answer is the failure's. (Its commits on top of the failed
            // flight went with it: `finish_flight` forgot them.)
            let _ = self.flush_and_publish(committed);
            for reply in replies {
                reply.send(Flushed::RestsOnFailed(&e));
            }
            return Err(e);
        }
        if committed.is_empty() {
            // Nothing to flush; what skipped its flush is shown to the
            // other readers (its failure is the store's: counted there,
            // and it claimed nothing, so every step's answer stands).
            let _ = self.land_unflushed();
        }
        // A flight only when a step will overlap it (`more_work`: the step
        // closing this group queues another; a client step queued): with
        // nothing to do meanwhile the writer would wait for it at once
        // (`handle`), and the hand-over to the store's thread and back
        // only adds to what the group's clients and the regions it
        // notifies wait (P3's p99 on fjall: 4.1-4.8 ms flushed in place,
        // 5.3-5.7 ms as flights).
        let overlapped = self.ctx.store.overlaps_flushes() && (more_work || !self.clients.is_empty());
        if committed.is_empty() || !overlapped {
            let flushed = {
                let _span = info_span!("group_flush", steps = replies.len(), commits = committed.len()).entered();
                self.flush_and_publish(committed)
            };
            let took = started.elapsed();
            self.ctx.metrics.writer_step("group_flush", took);
            let outcome = match &flushed {
                Ok(()) => Flushed::Landed,
                Err(e) => Flushed::Failed(e),
            };
            for reply in replies {
                reply.send(outcome);
            }
            return flushed.map(|()| took);
        }
        // Overlapped: the flight starts, and the group waits for it as the
        // writer goes on (`WriterState::finish_flight` answers it).
        let through = self.ctx.stats.committed();
        let steps = replies.len();
        let replies = Arc::new(Mutex::new(replies));
        let flight = {
            let _span = info_span!("group_flight", steps, commits = committed.len()).entered();
            if steps > 0 && *self.ctx.committing.borrow() {
                // Its clients are answered as soon as it landed, not when
                // the writer next looks (after the step it overlaps: issue
                // 28's small-write p99). Only while health is SERVING: a
                // landing after failures is the writer's to report first
                // (health SERVING again, then the answers).
                let answered = replies.clone();
                self.ctx.store.start_flush_then(Box::new(move || {
                    for reply in take_replies(&answered) {
                        reply.send(Flushed::Landed);
                    }
                }))
            } else {
                self.ctx.store.start_flush()
            }
        };
        let took = started.elapsed();
        self.ctx.metrics.writer_step("group_flush", took);
        if let Err(e) = flight {
            self.commit_failed(&e);
            let e = CoreError::Storage(cascade_core::error::StorageError(e.to_string()));
            for reply in take_replies(&replies) {
                reply.send(Flushed::Failed(&e));
            }
            return Err(e);
        }
        self.in_flight = Some(InFlight {
            committed,
            replies,
            through,
            failures_before: self.store_failures,
            awaiting_closure: Vec::new(),
            committed_on_top: false,
        });
        Ok(took)
    }

    /// Waits for the group in flight, if any, and answers it: landed, its
    /// batches are durable (noted, published in order, replies sent, the
    /// roots it left waiting reported); failed, the failure is counted and
    /// logged once, every reply of its group answers the storage error
    /// (UNAVAILABLE; a refusal its own), nothing of it is published, and
    /// the group in progress, whose steps read past it, is marked to
    /// answer the same. The work budget is fed the time the writer waited,
    /// not the flight's.
    ///
    /// Called before anything leaves the node or is committed or flushed
    /// after a flight started: a commit (`commit_unflushed`; not a group's
    /// on a store that takes commits on top of a flight), a flush
    /// (`flush`, so the tick's, the audit's and a lone step's), a healing
    /// retry, the next group's close, the writer's stop, and when the
    /// mailbox holds nothing to overlap with (`handle`).
    pub(super) fn finish_flight(&mut self) -> Result<(), CoreError> {
        let Some(flight) = self.in_flight.take() else {
            return Ok(());
        };
        let waiting = crate::clock::monotonic_now();
        let landed = self.ctx.store.finish_flush();
        let waited = waiting.elapsed();
        self.work_budget.flushed(waited);
        if let Some(landing) = self.ctx.store.last_landing() {
            self.work_budget.landed(landing);
        }
        self.ctx.metrics.writer_step("flight_wait", waited);
        match landed {
            Ok(()) => {
                self.ctx.stats.record_flush(flight.through);
                // Everything committed is durable now, unless a group's
                // step committed on top of the flight since it started.
                if !flight.committed_on_top {
                    self.unflushed = false;
                }
                if self.store_failures == flight.failures_before {
                    self.commit_succeeded();
                }
                for batch in flight.committed {
                    self.publish(batch);
                }
                for reply in take_replies(&flight.replies) {
                    reply.send(Flushed::Landed);
                }
                if !flight.awaiting_closure.is_empty() {
                    self.ctx.closure_checks.report(flight.awaiting_closure);
                }
                Ok(())
            }
            Err(e) => {
                self.commit_failed(&e);
                let e = CoreError::Storage(cascade_core::error::StorageError(e.to_string()));
                for reply in take_replies(&flight.replies) {
                    reply.send(Flushed::Failed(&e));
                }
                if let Some(group) = &mut self.group {
                    group.rests_on_failed.get_or_insert_with(|| e.clone());
                }
                self.forget_commits_on_top_of_a_failed_flight();
                Err(e)
            }
        }
    }

    /// On a store that takes commits on top of a flight, a flight that
    /// failed took them with it (`Store::commits_on_top_of_a_flight`):
    /// every commit of the group in progress so far was one (a group's
    /// commits do not wait for the flight), so none is published, ever;
    /// and the flush that says they were dropped runs here, its failure
    /// being this one (counted once, above). Left for the group's flush,
    /// a group with nothing to flush (its commits claimed nothing) left it
    /// to fail a later flush, counted again; and a flush by anyone else
    /// in between could take it, so that the group's flush landed nothing
    /// and published what never landed (review of the change).
    fn forget_commits_on_top_of_a_failed_flight(&mut self) {
        if !self.ctx.store.commits_on_top_of_a_flight() {
            return;
        }
        if let Some(group) = &mut self.group {
            group.committed.clear();
        }
        // Nothing else is staged: every commit since the flight started
        // was on top of it, and went with it.
        let _ = self.ctx.store.flush();
    }

    /// A writer that starts (`pre_start`) finishes the flight its
    /// predecessor left (a writer that failed mid-flight): before its
    /// first read, so that it never reads writes that then fail to land.
    /// Then it flushes what its predecessor committed after that flight
    /// (staged only, read through the writer's view), and only once that
    /// landed are the events below the next revision published from the
    /// store (its predecessor's replies are gone with it). A failure of
    /// either is the store's (counted there), and nothing is published:
    /// the next event's `publish` catches up on what landed by then.
    ///
    /// Why the flush first: `next_revision_stored` reads through the
    /// writer's view, staged commits included; publishing up to it before
    /// they landed sent events of commits that could still fail, and
    /// moved the published mark past them (review finding M1 of the
    /// overlapped flush).
    pub(super) fn finish_predecessors_flight(&mut self) {
        if !self.ctx.store.overlaps_flushes() {
            return;
        }
        if let Err(e) = self.ctx.store.finish_flush() {
            self.commit_failed(&e);
            // What the predecessor committed on top of it went with it.
            self.forget_commits_on_top_of_a_failed_flight();
            return;
        }
        // Counted there when it fails; it also notes the flush (acks wait
        // for it, `WriteStats::record_flush`).
        if self.flush().is_err() {
            return;
        }
        let state = crate::codec::StoreState {
            store: self.ctx.store.as_ref(),
        };
        if let Ok(next) = state.next_revision_stored() {
            self.publish_landed(next);
        }
    }

    /// Whether a step of the group in progress committed anything yet.
    pub(super) fn group_committed(&self) -> bool {
        self.group.as_ref().is_some_and(|g| !g.committed.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cascade_core::error::{ErrorCode, StorageError};

    /// What a step's reply answers once its flush ended so.
    fn answered(result: Result<u32, CoreError>, after_commit: bool, flushed: Flushed<'_>) -> Result<u32, CoreError> {
        let (port, mut answer) = ractor::concurrency::oneshot();
        Reply::after_flush(RpcReplyPort::from(port), result, after_commit).send(flushed);
        answer.try_recv().expect("answered at once")
    }

    fn refused() -> CoreError {
        CoreError::NotFound(cascade_core::ResourceName::parse("eu-1/project/p").expect("a name"))
    }

    /// Bug 3 of the first overlapped build's review: a step the core
    /// refused, in a group whose flight failed, answers its refusal as
    /// with a flush in place; a success after a commit of its group
    /// answers the flight's error (UNAVAILABLE), one before any commit its
    /// success.
    #[test]
    fn a_failed_flight_answers_its_groups_steps_as_a_failed_flush_does() {
        let failed = CoreError::Storage(StorageError("the flight failed".into()));
        let flushed = Flushed::Failed(&failed);
        assert_eq!(
            answered(Err(refused()), true, flushed).unwrap_err().code(),
            ErrorCode::NotFound
        );
        assert_eq!(
            answered(Ok(1), true, flushed).unwrap_err().code(),
            ErrorCode::Unavailable
        );
        assert_eq!(answered(Ok(1), false, flushed).unwrap(), 1);
        assert_eq!(answered(Ok(1), true, Flushed::Landed).unwrap(), 1);
    }

    /// A step that read past a flight that then failed answers its error
    /// whatever it found, a refusal too: the name it found taken, say, was
    /// taken by a create that never landed.
    #[test]
    fn a_step_that_read_past_a_failed_flight_answers_its_error() {
        let failed = CoreError::Storage(StorageError("the flight failed".into()));
        let flushed = Flushed::RestsOnFailed(&failed);
        assert_eq!(
            answered(Err(refused()), false, flushed).unwrap_err().code(),
            ErrorCode::Unavailable
        );
        assert_eq!(
            answered(Ok(1), false, flushed).unwrap_err().code(),
            ErrorCode::Unavailable
        );
    }
}
