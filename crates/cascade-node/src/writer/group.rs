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
use std::sync::{Mutex, PoisonError};

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

/// Sends a step's answer, given the group's flush error if it failed.
type SendAnswer = Box<dyn FnOnce(Option<&CoreError>) + Send>;

/// A step's answer, sent once the group's flush is known.
pub struct Reply(SendAnswer);

impl Reply {
    /// The step's `result`, unless it succeeded after something of its
    /// group was committed (`after_commit`) and the flush then failed: it
    /// may not be durable, so it answers the flush's error.
    pub(super) fn after_flush<T: Send + 'static>(
        port: RpcReplyPort<Result<T, CoreError>>,
        result: Result<T, CoreError>,
        after_commit: bool,
    ) -> Self {
        Self(Box::new(move |flush_failed| {
            let result = match (result, flush_failed) {
                (Ok(_), Some(e)) if after_commit => Err(e.clone()),
                (result, _) => result,
            };
            let _ = port.send(result);
        }))
    }

    /// An answer that claims nothing the flush makes durable.
    pub(super) fn now<T: Send + 'static>(port: RpcReplyPort<T>, value: T) -> Self {
        Self(Box::new(move |_| {
            let _ = port.send(value);
        }))
    }

    fn send(self, flush_failed: Option<&CoreError>) {
        (self.0)(flush_failed)
    }
}

/// What the steps of the group in progress committed, in order; `None`
/// outside a group (each commit flushes at once).
#[derive(Default)]
pub(super) struct Group {
    pub(super) committed: Vec<super::Committed>,
}

impl WriterState {
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
        let _flushed = self.close_group(myself, replies);
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
    ) -> Result<std::time::Duration, CoreError> {
        let late = self.clients.take(myself, MAX_GROUP_STEPS);
        self.run_client_steps(myself, late, &mut replies);
        let committed = self.group.take().map(|g| g.committed).unwrap_or_default();
        let started = crate::clock::monotonic_now();
        let flushed = {
            let _span = info_span!("group_flush", steps = replies.len(), commits = committed.len()).entered();
            self.flush_and_publish(committed)
        };
        let took = started.elapsed();
        self.ctx.metrics.writer_step("group_flush", took);
        for reply in replies {
            reply.send(flushed.as_ref().err());
        }
        flushed.map(|()| took)
    }

    /// Whether a step of the group in progress committed anything yet.
    pub(super) fn group_committed(&self) -> bool {
        self.group.as_ref().is_some_and(|g| !g.committed.is_empty())
    }
}
