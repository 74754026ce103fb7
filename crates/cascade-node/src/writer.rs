//! The single writer of a node: a ractor actor that runs every protocol step
//! and commits its writes, and the supervisor that restarts it.
//!
//! Architecture invariant: every mutation of a node's store goes through
//! this one actor, one step at a time. That is what makes "read the
//! back-references, then mark DELETING" atomic against a concurrent create
//! that attaches a new reference (sled transactions cannot scan), and it is
//! why the core can read a snapshot and return a write set.
//!
//! Architecture invariant: nothing leaves the node before it is durable. A
//! step's batch is committed and flushed before its reply is sent and
//! before its events are published, so a client or watcher never sees a
//! revision that a crash could take back.
//!
//! Size: the actor's message loop, its commit path and its store healing
//! share `WriterState`'s private fields; what splits off cleanly is already
//! in `writer/` (groups, healing's account, audit, schema swaps).

mod audited;
mod closure_checks;
mod compat;
mod durable;
mod group;
mod handle;
mod healing;
mod publish;
mod release_hints;
mod schema_swap;
mod supervisor;
mod work_budget;
mod write_stats;

use std::sync::Arc;
use std::time::Duration;

use cascade_core::protocol::{self, DeleteOutcome, DeleteRequest, ResourceSpec};
use cascade_core::state::WriteSet;
use cascade_core::{CoreError, Ctx, IdSource, Policy, RegionId, Resource, Timestamp};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::broadcast;
use tracing::{debug, error, info, info_span, warn};

use crate::audit::{AuditContext, Retention};
use crate::clock::Clock;
use crate::codec::{encode_writes, StoreState};
use crate::entropy::UidSource;
use crate::metrics::NodeMetrics;
use crate::peers::still_awaited;
use crate::store::Store;
use crate::trace_context::TraceMarks;
use cascade_core::model::Event;
pub use closure_checks::ClosureChecks;
pub(crate) use compat::{compat_check, Judged};
pub use group::Reply;
pub(crate) use handle::OUTBOX_COMPACTION_BATCH;
pub use handle::{WriterHandle, WriterThread};
pub(crate) use healing::{FIRST_RETRY, MAX_RETRY};
pub use release_hints::ReleaseHints;
pub use schema_swap::ReloadCause;
pub(crate) use schema_swap::{
    Swapped, COMPAT_SCAN_LIMIT, OPERATOR as SCHEMA_OPERATOR, RELOAD_ACTION as SCHEMA_RELOAD_ACTION,
};
pub use write_stats::{WriteStats, WriteStatsSnapshot};

/// What the writer needs; shared by every incarnation of the actor.
#[derive(Clone)]
pub struct WriterContext {
    pub region: RegionId,
    /// The schema in force: every step loads it once when it starts, and
    /// only this writer swaps it, between two steps (`writer/schema_swap.rs`).
    pub schema: Arc<crate::schema_in_force::SchemaHolder>,
    pub policy: Policy,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    /// Where uids and operation ids come from (injected for simulations).
    pub ids: Arc<dyn UidSource>,
    /// Committed events, for Watch and WatchOperation streams.
    pub events: broadcast::Sender<Arc<Event>>,
    /// How often the writer looks at the retry queue when nothing wakes it.
    pub tick: Duration,
    /// Operations whose root waits for other regions' parts (from work
    /// reports); the reconciler asks those regions (see `links.rs`).
    pub closure_checks: ClosureChecks,
    /// Budget this region's work steps need from the root's region of a
    /// bounded operation (from work reports); the reconciler leases it
    /// (`operation_control.rs`).
    pub budget_wants: BudgetWants,
    /// What the writer has committed so far (read by benchmarks and metrics).
    pub stats: Arc<WriteStats>,
    /// Where each peer link's next send of queued releases must start.
    pub release_hints: Arc<ReleaseHints>,
    /// The node's Prometheus metrics (steps, batches, resources by state).
    pub metrics: Arc<NodeMetrics>,
    /// Whether the last commit succeeded: gRPC health reports NOT_SERVING
    /// while it is false (`api/server.rs`). Only the writer sets it.
    pub committing: Arc<tokio::sync::watch::Sender<bool>>,
    /// The trace context of each committed event peers are sent, for their
    /// Watch streams (`trace_context.rs`).
    pub trace_marks: Arc<TraceMarks>,
    /// How far streams may read the outbox: moved after each flush, and
    /// after a reopen (`outbox.rs`).
    pub published: Arc<crate::outbox::Published>,
    /// What the audit log keeps (`[audit] retain`, `max_entries`): the
    /// writer prunes it a bounded step a tick (`writer/audited.rs`).
    pub audit_retention: Retention,
    /// Who this node is in the audit log: stamped on the entries of steps
    /// no call carries a context into (a cascade's members).
    pub(crate) audit_node: crate::audit::AuditNode,
    // Issue 27 lands in steps: what reads these follows.
    #[allow(dead_code)]
    /// The policy a cascade asks about each member it would change (the
    /// same the API asks; `auth/`).
    pub authorizer: Arc<dyn cascade_core::auth::Authorize>,
}

/// Leases to ask the root's region of a bounded operation for, by
/// operation (the latest ask of each). In memory: a member waiting for
/// one is looked at again by the writer, which asks again (also after a
/// restart).
pub type BudgetWants =
    Arc<std::sync::Mutex<std::collections::BTreeMap<cascade_core::OperationId, protocol::LeaseWanted>>>;

/// A client's change carries who it is audited for (None: a step nobody
/// asked for by name, such as settling a create, which is not audited);
/// the writer appends one audit entry per change to the step's writes, so
/// the change and its entry commit in one batch. It also carries, when
/// another region's node forwarded it, the instant that node gave up on it
/// (`api/forward.rs`'s `ANSWER_BY`): the step refuses itself past it,
/// writing nothing (`crate::peers::still_awaited`).
pub enum WriterMsg {
    Create(
        Vec<ResourceSpec>,
        Option<AuditContext>,
        Option<Timestamp>,
        RpcReplyPort<Result<Vec<Resource>, CoreError>>,
    ),
    Update(
        ResourceSpec,
        Option<String>,
        Option<AuditContext>,
        Option<Timestamp>,
        RpcReplyPort<Result<Resource, CoreError>>,
    ),
    Delete(
        DeleteRequest,
        Option<AuditContext>,
        Option<Timestamp>,
        RpcReplyPort<Result<DeleteOutcome, CoreError>>,
    ),
    /// Run one batch of due deletion work. At most one is in the mailbox
    /// at a time (`WriterState::work_queued`): a client's write queued
    /// behind it waits for one step, not for a backlog of them.
    Work,
    /// The periodic tick: queues a `Work` unless one is already queued (for
    /// work that became due with time: retries, backoff, closure checks).
    Tick,
    /// Any other protocol step; the closure runs it and sends the reply.
    Apply(ApplyFn),
    /// One more retention step of the audit log, queued by the last one
    /// when it stopped at its limit (`writer/audited.rs`). At most one is
    /// in the mailbox: client writes queued meanwhile go first.
    PruneAudit,
    /// A message sent from within `span` (the caller's): the step's span
    /// is its child, so a step belongs to the trace of the call that asked
    /// for it (`WriterHandle` wraps every call).
    Traced(tracing::Span, Box<WriterMsg>),
    /// Client steps are queued (`writer/group.rs`): run them as one group.
    /// At most one is in the mailbox; every other message runs the queued
    /// client steps first too.
    Clients,
}

/// A protocol step packaged with its reply port (see [`WriterHandle::apply`]):
/// runs the step and answers the reply to send once the step's group is
/// flushed.
pub type ApplyFn = Box<dyn FnOnce(&mut WriterState, &ActorRef<WriterMsg>) -> Reply + Send>;

struct Writer;

pub struct WriterState {
    ctx: WriterContext,
    ids: SharedIds,
    /// A `Work` message is already in the mailbox; don't queue another.
    /// Only [`WriterState::kick`] casts `Work`: a second sender (the tick
    /// once did) would add a `Work` that each step then replaces with
    /// another, so the backlog grew by one per tick for a whole cascade and
    /// a create waited behind all of it (cascade-bench: 20 steps, 150 ms,
    /// four seconds into a 300k cascade; 14 s at 1M on sled).
    work_queued: bool,
    /// The periodic tick; aborted when the actor stops.
    ticker: Option<tokio::task::JoinHandle<()>>,
    /// A work step that fails fails again on every kick while the store
    /// refuses commits: one line a window, with the count.
    work_failed: crate::log_throttle::Throttle,
    /// While the store refuses commits or reads: since when, how often,
    /// when to retry and whether to reopen the engine first
    /// (`writer/healing.rs`).
    healing: healing::Healing,
    /// The store as steps read it: tells a read the engine refused from a
    /// record that does not decode (`store/watched.rs`).
    reads: crate::store::WatchedReads,
    /// A `PruneAudit` is already in the mailbox.
    prune_queued: bool,
    /// Audit retention fails on every tick while the store refuses commits.
    prune_failed: crate::log_throttle::Throttle,
    /// Client steps waiting for their group (`writer/group.rs`); shared
    /// with the handle, and with the next incarnation after a restart.
    clients: Arc<group::ClientQueue>,
    /// The group of client steps in progress: its commits wait for one
    /// flush. None outside a group: a commit flushes at once.
    group: Option<group::Group>,
    /// How much one work step may do, kept to a time budget
    /// (`writer/work_budget.rs`).
    work_budget: work_budget::WorkBudget,
    /// A commit that claims nothing skipped its flush and no flush has
    /// covered it yet ([`WriterState::commit_as`]).
    unflushed: bool,
    /// The last group, its flush in flight on a store that overlaps
    /// flushes (`Store::overlaps_flushes`, `writer/group.rs`): its replies
    /// and events wait for [`WriterState::finish_flight`].
    in_flight: Option<group::InFlight>,
    /// Failed commits, flushes, reads and retries noted so far
    /// ([`WriterState::store_failed`]): a flight that lands ends an
    /// episode of failures only if none was noted since it started.
    store_failures: u64,
}

/// A batch committed and not yet published: what its flush releases.
pub(crate) struct Committed {
    events: Vec<Event>,
    /// The first queued release of each region the batch wrote.
    first_releases: Vec<(String, Vec<u8>)>,
}

/// The meta key the writer's health probe writes (see
/// [`WriterState::heal`]); nothing reads it.
const HEALTH_PROBE_KEY: &[u8] = b"health_probe";

/// The core's `IdSource` over the node's injected [`UidSource`].
struct SharedIds(Arc<dyn UidSource>);

impl IdSource for SharedIds {
    fn next_uuid(&mut self) -> uuid::Uuid {
        self.0.next_uuid()
    }
}

impl WriterState {
    /// Commits, flushes, then publishes. Returns whether deletion work was queued.
    ///
    /// A commit that fails answers an error, and nothing of it is
    /// published, but it may have landed all the same (fjall applies a
    /// batch whose journal write failed when it reopens; sled's commit may
    /// succeed and its flush fail): like a step cut by a crash, it is known
    /// whole or not at all. A client reads UNAVAILABLE, which may have
    /// happened; a work step is recomputed from the store by the next one;
    /// an event that landed reaches watchers from the store (a stream
    /// replays the revisions it missed).
    fn commit(&mut self, writes: WriteSet) -> Result<bool, CoreError> {
        self.commit_as(writes, true)
    }

    /// [`Self::commit`], for a step that says whether its writes claim
    /// anything (`needs_flush`): one that claims nothing, emits no event,
    /// queues no release and writes no audit entry skips its flush
    /// (`writer/durable.rs` says when that is safe, and why).
    fn commit_as(&mut self, writes: WriteSet, needs_flush: bool) -> Result<bool, CoreError> {
        if writes.is_empty() {
            return Ok(false);
        }
        let queued_work = writes.work.values().any(Option::is_some);
        let claims_nothing = !needs_flush
            && writes.events.is_empty()
            && writes.audit.is_empty()
            && !writes.pending_releases.values().any(Option::is_some);
        let committed = self.commit_unflushed(writes)?;
        if claims_nothing {
            // Nothing to publish: a later flush makes it durable.
            self.unflushed = true;
            if self.group.is_none() {
                self.land_unflushed()?;
            }
            return Ok(queued_work);
        }
        match &mut self.group {
            // The group's flush publishes it, after its later steps.
            Some(group) => group.committed.push(committed),
            None => self.flush_and_publish(vec![committed])?,
        }
        Ok(queued_work)
    }

    /// Encodes and commits `writes` (readers and the next step see them),
    /// without a flush: nothing of it is published yet.
    fn commit_unflushed(&mut self, writes: WriteSet) -> Result<Committed, CoreError> {
        // Encoded while the flight in progress (if any) still flies: the
        // encoding only reads, through the writer's view, which sees the
        // flight's writes as the step that made `writes` did. Encoded
        // after the wait, the server (or the commit thread) sat idle for
        // it: on PostgreSQL a P1 step's encoding was about 0.7 ms of its
        // 4 ms (docs/BENCHMARKS.md, "PostgreSQL: client groups fly during
        // a cascade"). A flight that fails meanwhile (another thread may
        // end it) may leave the encoding reading a mix: `finish_flight`
        // then reports the failure and the batch is dropped.
        let encoded = encode_writes(
            &StoreState {
                store: self.ctx.store.as_ref(),
            },
            &writes,
        );
        // A group's commit is staged on top of the flight in progress
        // (`writer/group.rs`): the step may have read the flight's
        // writes, and the store drops it if the flight fails, which the
        // group's flush then answers. The group's steps, their commits and
        // the plan of its flight run while the server works on the
        // flight; waiting here, the server sat idle between two flights
        // for a third of a step (docs/BENCHMARKS.md, "PostgreSQL: the gap
        // between two flights"). Any other commit waits for the flight
        // first (its failure was counted there; what was encoded is
        // dropped).
        let on_top = self.in_flight.is_some() && self.group.is_some() && self.ctx.store.commits_on_top_of_a_flight();
        if !on_top {
            self.finish_flight()?;
        }
        let traced = self.note_trace(&writes);
        let state = StoreState {
            store: self.ctx.store.as_ref(),
        };
        // Its debug check compares the step's note with the store, which
        // a flight failing meanwhile would fail: after the wait only.
        let committed = self.replaced_states(&state, &writes, !on_top).and_then(|before| {
            let batch = encoded?;
            let batch_keys = batch.len();
            self.ctx.stats.record(&batch);
            self.ctx.store.commit(batch)?;
            Ok((before, batch_keys))
        });
        match committed {
            Ok((before, batch_keys)) => {
                // Counted once committed: a failed flush does not take the
                // write back from readers.
                self.ctx.metrics.record_commit(&writes, &before, batch_keys);
            }
            Err(e) => {
                if let Some(first) = traced {
                    self.ctx.trace_marks.forget_from(first);
                }
                // On top of a flight that failed: refused for it, and
                // counted once, by the flight's end.
                if !on_top || self.finish_flight().is_ok() {
                    self.commit_failed(&e);
                }
                return Err(CoreError::Storage(cascade_core::error::StorageError(e.to_string())));
            }
        }
        if let Some(flight) = self.in_flight.as_mut().filter(|_| on_top) {
            flight.committed_on_top = true;
        }
        // The map is ordered by (region, key): the first queued release of
        // each region is its lowest.
        let mut first_releases: Vec<(String, Vec<u8>)> = Vec::new();
        for ((region, key), release) in &writes.pending_releases {
            if release.is_some() && first_releases.last().is_none_or(|(r, _)| r != region.as_str()) {
                first_releases.push((region.to_string(), crate::codec::release_key(region, key)));
            }
        }
        Ok(Committed {
            events: writes.events,
            first_releases,
        })
    }

    /// Flushes (once, for every batch in `committed`), then publishes each
    /// batch's events and release hints in order. A failed flush publishes
    /// nothing: the batches may have landed, and are known whole or not at
    /// all, as a step cut by a crash.
    fn flush_and_publish(&mut self, committed: Vec<Committed>) -> Result<(), CoreError> {
        if committed.is_empty() {
            return Ok(());
        }
        // The flight in progress first: `finish_flight` feeds the budget
        // its own wait, which must not be counted twice.
        self.finish_flight()?;
        let started = crate::clock::monotonic_now();
        self.flush()?;
        self.work_budget.flushed(started.elapsed());
        self.commit_succeeded();
        for batch in committed {
            self.publish(batch);
        }
        Ok(())
    }

    /// Publishes one flushed batch: the outbox's published mark, the
    /// links' release hints, and its events on the live feed.
    fn publish(&mut self, batch: Committed) {
        if let Some(first) = batch.events.first().map(|e| e.revision) {
            // Events of earlier commits that failed but landed come first.
            self.publish_landed(first);
        }
        if let Some(last) = batch.events.last().map(|e| e.revision) {
            self.ctx.published.advance(last + 1);
        }
        for (region, key) in batch.first_releases {
            self.ctx.release_hints.note(&region, key);
        }
        for e in batch.events {
            // The uid (and operation) is what ties one deletion together
            // across regions' logs.
            debug!(
                region = %self.ctx.region,
                name = %e.resource.name,
                uid = %e.resource.uid,
                operation = e.operation.map(|o| o.to_string()).unwrap_or_default(),
                revision = e.revision,
                event = ?e.event_type,
                "{}",
                e.message
            );
            // No receiver is fine: nobody is watching.
            let _ = self.ctx.events.send(Arc::new(e));
        }
    }

    /// The engine refused a commit or a flush: counted, and health goes
    /// NOT_SERVING; the first failure of an episode is an error line, the
    /// next ones a warning a window with their count.
    fn commit_failed(&mut self, e: &crate::store::StoreError) {
        self.ctx.metrics.commit_failed();
        self.store_failed(e, healing::Refused::Write);
    }

    /// A step's read was refused by the engine (`store::WatchedReads`; not
    /// a record that does not decode, nor a name that is not found): the
    /// store is in trouble as when a commit fails, and the episode ends
    /// only once a retry's work step reads through (`writer/healing.rs`).
    fn read_refused(&mut self, e: &crate::store::StoreError) {
        self.store_failed(e, healing::Refused::Read);
    }

    /// The store failed a commit, a read, a retry or a reopen (see [`Self::commit_failed`]).
    fn store_failed(&mut self, e: &crate::store::StoreError, refused: healing::Refused) {
        self.store_failures += 1;
        self.ctx.committing.send_if_modified(|ok| std::mem::replace(ok, false));
        if refused == healing::Refused::Write {
            // A failed commit or flush may have taken back commits that
            // skipped their flush (PostgreSQL drops what it staged): links
            // follow again from the stored cursors, and send releases
            // again from the first key (`WriteStats::takebacks`).
            self.ctx.stats.note_takeback();
            self.ctx.release_hints.start_over();
        }
        let (what, until) = match refused {
            healing::Refused::Write => ("commit", "one succeeds"),
            healing::Refused::Read => ("read", "a retry reads and commits"),
        };
        match self.healing.failed(e, refused, crate::clock::monotonic_now()) {
            healing::Noted::First => error!(
                region = %self.ctx.region,
                error = %e,
                may_clear = e.may_clear(),
                "the store refused a {what}: health is NOT_SERVING until {until}; retrying with backoff"
            ),
            healing::Noted::Again(Some(more)) => warn!(
                region = %self.ctx.region,
                error = %e,
                suppressed = more.count(),
                "the store still refuses commits or reads{more}"
            ),
            healing::Noted::Again(None) => {}
        }
    }

    /// A commit succeeded: an episode of failures, if any, is over (one
    /// line with its figures) and health is SERVING again; unless a read
    /// was refused, which only a retry's step that reads through mends.
    fn commit_succeeded(&mut self) {
        if self.healing.awaits_a_read() {
            return;
        }
        let Some(healed) = self.healing.healed(crate::clock::monotonic_now()) else {
            return;
        };
        self.ctx.committing.send_if_modified(|ok| !std::mem::replace(ok, true));
        if healed.restart_only {
            // Not news at each restart of a writer that keeps failing: the supervisor logs those (throttled).
            return debug!(region = %self.ctx.region, "a restarted writer commits: health is SERVING");
        }
        let unlogged = self.work_failed.reset().count();
        info!(
            region = %self.ctx.region,
            failures = healed.failures,
            reopens = healed.reopens,
            lasted_ms = u64::try_from(healed.lasted.as_millis()).unwrap_or(u64::MAX),
            unlogged_work_failures = unlogged,
            "the store commits again: health is SERVING"
        );
    }

    /// While the store fails, each tick whose retry is due tries again:
    /// reopens the engine when a failure that may clear was seen (its old
    /// handles refuse for good), or when three retries failed on the same
    /// handles, then commits a small batch (a heartbeat in the meta table):
    /// a node with nothing to write would otherwise stay NOT_SERVING after
    /// its disk recovered. When a read was refused, one work step follows
    /// the heartbeat, and the episode ends once it read through. A retry
    /// that fails doubles the wait for the next, from 100 ms to 2 s
    /// (`writer/healing.rs`).
    fn heal(&mut self, myself: &ActorRef<WriterMsg>) {
        let now = crate::clock::monotonic_now();
        if !self.healing.due(now) {
            return;
        }
        // A retry commits and flushes: the flight in progress ends first
        // (its failure is counted there, as this retry's).
        if self.finish_flight().is_err() {
            self.healing.retry_failed(crate::clock::monotonic_now());
            return;
        }
        if self.healing.reopen_wanted() {
            match self.ctx.store.reopen() {
                Ok(()) => self.reopened(),
                Err(e) => {
                    if !e.may_clear() {
                        self.healing.stop_reopening();
                        error!(region = %self.ctx.region, error = %e,
                            "the store could not be reopened, and this error does not clear by itself: \
                             the node needs an operator (restart it once the cause is fixed); \
                             it is tried again after more failed retries");
                    }
                    self.store_failed(&e, healing::Refused::Write);
                    self.healing.retry_failed(crate::clock::monotonic_now());
                    return;
                }
            }
        }
        let mut batch = crate::store::Batch::default();
        batch.put(
            crate::store::Table::Meta,
            HEALTH_PROBE_KEY.to_vec(),
            self.ctx.clock.now().0.to_be_bytes().to_vec(),
        );
        let through = self.ctx.stats.committed();
        match self.ctx.store.commit(batch).and_then(|()| self.ctx.store.flush()) {
            Ok(()) => {
                self.ctx.stats.record_flush(through);
                self.unflushed = false;
                self.commit_succeeded();
                // The flush made durable what failed commits left behind.
                let state = StoreState {
                    store: self.ctx.store.as_ref(),
                };
                if let Ok(next) = state.next_revision_stored() {
                    self.publish_landed(next);
                }
                if self.healing.awaits_a_read() {
                    self.read_again(myself);
                }
            }
            Err(e) => {
                self.commit_failed(&e);
                self.healing.retry_failed(crate::clock::monotonic_now());
            }
        }
    }

    /// A retry of a store that refused a read, once it commits: one work
    /// step (no other runs while the store fails), which reads what the
    /// cascades under way need, and one step of the audit log's retention
    /// (the other reader on the writer). Both ran with no refused read: the episode
    /// is over (the step's own failure, a record that does not decode, is
    /// the work's to report). A read refused again: the next retry waits.
    fn read_again(&mut self, myself: &ActorRef<WriterMsg>) {
        let failures = self.healing.failures();
        let ran = self.work(myself);
        // The audit log's retention reads outside any step, on each tick:
        // a refusal there starts an episode too, and a work step that
        // read through says nothing of it.
        self.retain_audit(myself);
        if self.healing.failures() > failures {
            self.healing.retry_failed(crate::clock::monotonic_now());
            return;
        }
        if let Err(e) = ran {
            if let Some(more) = self.work_failed.admit() {
                warn!(error = %e, suppressed = more.count(), "deletion work step failed; will retry{more}");
            }
        }
        self.healing.read_through();
        self.commit_succeeded();
    }

    /// The engine was reopened from its files: what the node keeps in
    /// memory about the store is brought back to them, as after a restart
    /// (resources by state recounted, the links' sends of queued releases
    /// started from the first key).
    fn reopened(&mut self) {
        self.healing.reopened();
        // The engine holds what reached its files: commits that skipped
        // their flush since may be gone (`WriteStats::takebacks`).
        self.ctx.stats.note_takeback();
        self.ctx.metrics.store_reopened();
        self.ctx.release_hints.start_over();
        let state = StoreState {
            store: self.ctx.store.as_ref(),
        };
        if let Err(e) = self.ctx.metrics.count_resources(&state) {
            debug!(error = %e, "resources not recounted after the reopen; the next reopen or restart will");
        }
        // What the engine kept is durable: the events of failed commits
        // among it are published (a flush that failed and was lost with
        // the reopen never was, and its revisions are given again).
        match state.next_revision_stored() {
            Ok(next) => self.publish_landed(next),
            Err(e) => debug!(error = %e, "the outbox's end not read after the reopen; the next commit publishes"),
        }
        debug!(region = %self.ctx.region, "the store's engine was reopened from its files");
    }

    /// Notes the current span's trace context for each event of `writes`
    /// peers are sent, before the commit (a Watch stream may read the
    /// event from the store as soon as it is committed). Returns the first
    /// revision noted.
    ///
    /// An event of a deletion operation whose trace is known carries that
    /// trace (see `TraceMarks`); otherwise the current span's, which the
    /// operation then belongs to.
    fn note_trace(&self, writes: &WriteSet) -> Option<u64> {
        let marks = &self.ctx.trace_marks;
        let mut sent = writes.events.iter().filter(|e| e.concerns_importers()).peekable();
        let first = sent.peek()?.revision;
        let current = crate::trace_context::current_traceparent();
        if current.is_none() && !marks.knows_operations() {
            // Nothing traces (no OpenTelemetry subscriber): no lookups.
            return None;
        }
        for e in sent {
            let known = e.operation.and_then(|op| marks.operation_trace(op));
            let Some(traceparent) = known.or_else(|| current.clone()) else {
                continue;
            };
            if let Some(op) = e.operation {
                marks.remember_operation(op, &traceparent);
            }
            marks.note(e.revision, &traceparent);
        }
        Some(first)
    }

    /// The stored state of each resource `writes` puts or removes, in its
    /// order (None: not stored), for the metrics' resources by state: as
    /// the step read it (`WriteSet::stored_states`), else read back (a
    /// create, or a write the step made without reading).
    fn replaced_states(
        &self,
        state: &StoreState<'_>,
        writes: &WriteSet,
        check_note: bool,
    ) -> Result<Vec<Option<cascade_core::model::ResourceState>>, crate::store::StoreError> {
        writes
            .resources
            .keys()
            .map(|name| match writes.stored_states.get(name) {
                Some(read) => {
                    // What the step says it read is what the store holds
                    // (every debug build's test checks the core's note; a
                    // read that fails is the store in trouble, not a wrong note).
                    debug_assert!(
                        !check_note
                            || state
                                .get_resource(name)
                                .map_or(true, |stored| stored.map(|r| r.state) == Some(*read)),
                        "the step's note of {name}'s stored state"
                    );
                    Ok(Some(*read))
                }
                None => Ok(state.get_resource(name)?.map(|r| r.state)),
            })
            .collect()
    }

    fn kick(&mut self, myself: &ActorRef<WriterMsg>) {
        if !self.work_queued && myself.cast(WriterMsg::Work).is_ok() {
            self.work_queued = true;
        }
    }

    fn run<T>(
        &mut self,
        myself: &ActorRef<WriterMsg>,
        step: impl FnOnce(&StoreState<'_>, Ctx<'_>, &mut dyn IdSource) -> Result<protocol::Step<T>, CoreError>,
    ) -> Result<T, CoreError> {
        self.run_audited(myself, step, None, |_| Vec::new())
    }
}

impl Actor for Writer {
    type Msg = WriterMsg;
    type State = WriterState;
    type Arguments = (WriterContext, Arc<group::ClientQueue>);

    async fn pre_start(
        &self,
        myself: ActorRef<WriterMsg>,
        (ctx, clients): Self::Arguments,
    ) -> Result<WriterState, ActorProcessingErr> {
        let ticker = myself.send_interval(ctx.tick, || WriterMsg::Tick);
        let reads = crate::store::WatchedReads::new(ctx.store.clone());
        let mut state = WriterState {
            reads,
            ids: SharedIds(ctx.ids.clone()),
            ctx,
            work_queued: false,
            ticker: Some(ticker),
            work_failed: crate::log_throttle::Throttle::default(),
            healing: healing::Healing::default(),
            prune_queued: false,
            prune_failed: crate::log_throttle::Throttle::default(),
            clients,
            group: None,
            work_budget: work_budget::WorkBudget::new(),
            unflushed: false,
            in_flight: None,
            store_failures: 0,
        };
        state.unflushed = state.ctx.stats.unflushed(); // A predecessor that failed may have left one.
                                                       // Before the first read: a predecessor that failed mid-flight left
                                                       // its flight to land or fail (`writer/group.rs`).
        off_the_workers(state.ctx.store.waits_on_io(), || state.finish_predecessors_flight());
        if !*state.ctx.committing.borrow() {
            // Restarted mid-episode or after a failure: the store is retried first (`writer/supervisor.rs`).
            state.healing = healing::Healing::resumed(crate::clock::monotonic_now());
            off_the_workers(state.ctx.store.waits_on_io(), || state.heal(&myself));
        }
        // Client steps queued for a predecessor that failed are this one's.
        state.clients.wake(&myself);
        // Resume whatever was accepted before a restart or crash.
        state.kick(&myself);
        Ok(state)
    }

    async fn post_stop(&self, _: ActorRef<WriterMsg>, state: &mut WriterState) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        // A graceful stop leaves nothing for the restart to send again,
        // and answers the group in flight.
        off_the_workers(state.ctx.store.waits_on_io(), || {
            let _ = state.finish_flight();
            state.flush_leftovers();
        });
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<WriterMsg>,
        msg: WriterMsg,
        state: &mut WriterState,
    ) -> Result<(), ActorProcessingErr> {
        // Client steps queued meanwhile go before whatever woke the writer
        // (a `Work` queued ahead of them included): fairness, and one
        // flush for all of them (`writer/group.rs`). Except while a
        // cascade's flight flies: they join the next work step's group
        // (`clients_wait_for_the_next_step`).
        if !state.clients_wait_for_the_next_step() {
            state.serve_clients(&myself);
        }
        let region = state.ctx.region.to_string();
        let started = crate::clock::monotonic_now();
        let skip_work = state.healing.failing();
        let step = match &msg {
            WriterMsg::Work if skip_work => None,
            WriterMsg::Work => Some("deletion_work"),
            WriterMsg::PruneAudit => Some("audit_retention"),
            _ => None,
        };
        match msg {
            // Served above.
            WriterMsg::Clients => {}
            // A client step sent to the mailbox instead of the queue: a
            // group of one.
            msg @ (WriterMsg::Create(..)
            | WriterMsg::Update(..)
            | WriterMsg::Delete(..)
            | WriterMsg::Apply(_)
            | WriterMsg::Traced(..)) => {
                off_the_workers(state.ctx.store.waits_on_io(), || state.run_group(&myself, vec![msg]))
            }
            WriterMsg::PruneAudit => {
                state.prune_queued = false;
                let span = info_span!("audit_retention", %region);
                let _g = span.enter();
                off_the_workers(state.ctx.store.waits_on_io(), || state.retain_audit(&myself));
            }
            WriterMsg::Tick => {
                // While the store fails, work steps would only fail again:
                // the tick retries the store instead, and work resumes
                // once a retry succeeds.
                if state.healing.failing() {
                    off_the_workers(state.ctx.store.waits_on_io(), || state.heal(&myself));
                }
                if !state.healing.failing() {
                    off_the_workers(state.ctx.store.waits_on_io(), || state.flush_leftovers());
                    state.kick(&myself);
                    state.retain_audit(&myself);
                }
            }
            // No work step while the store fails (`writer/healing.rs` says why).
            WriterMsg::Work if skip_work => state.work_queued = false,
            WriterMsg::Work => {
                state.work_queued = false;
                let span = info_span!("deletion_work", %region);
                let _g = span.enter();
                match off_the_workers(state.ctx.store.waits_on_io(), || state.work(&myself)) {
                    Ok(r) if r.items > 0 => debug!(
                        items = r.items,
                        purged = r.purged,
                        cascaded = r.cascaded,
                        unset = r.unset,
                        "deletion work step"
                    ),
                    Ok(_) => {}
                    // Storage trouble: the queue is durable, the tick retries.
                    Err(e) => {
                        if let Some(more) = state.work_failed.admit() {
                            warn!(error = %e, suppressed = more.count(), "deletion work step failed; will retry{more}");
                        }
                    }
                }
            }
        }
        if let Some(step) = step {
            state.ctx.metrics.writer_step(step, started.elapsed());
        }
        // Clients that waited for a work step that did not take them (it
        // failed, or was skipped) are not left for the next message.
        if !state.clients_wait_for_the_next_step() {
            state.serve_clients(&myself);
        }
        // A flight overlaps the next step only: with none queued, it is
        // answered now (its failure was counted and logged there).
        if state.in_flight.is_some() && !state.work_queued && state.clients.is_empty() {
            off_the_workers(state.ctx.store.waits_on_io(), || {
                let _ = state.finish_flight();
            });
        }
        // On the caller's runtime (`WriterThread::CallersRuntime`), the
        // step's replies woke their callers on this worker's LIFO slot,
        // which no other worker may steal: without a yield they would wait
        // until the mailbox runs dry, behind every queued work step
        // (cascade-bench measured creates held for seconds by a cascade).
        // On the writer's own thread they run on the node's workers; the
        // yield lets the supervisor and the timers of this runtime run.
        tokio::task::yield_now().await;
        Ok(())
    }
}

impl WriterState {
    /// Runs one client step of a group: its commit waits for the group's
    /// flush, and so does the reply it answers (None: not a client step).
    fn client_step(
        &mut self,
        myself: &ActorRef<WriterMsg>,
        caller: &tracing::Span,
        msg: WriterMsg,
    ) -> (&'static str, Option<Reply>) {
        let region = self.ctx.region.to_string();
        match msg {
            WriterMsg::Create(specs, audit, answer_by, reply) => {
                let span = info_span!(parent: caller, "create", %region, count = specs.len(), name = specs.first().map(|s| s.name.as_str()).unwrap_or(""));
                let _g = span.enter();
                let result = self.run_audited(
                    myself,
                    |s, c, ids| {
                        still_awaited(answer_by, c.now, c.region.as_str(), "Create")?;
                        protocol::create(s, c, ids, specs)
                    },
                    audit.as_ref(),
                    audited::created,
                );
                match &result {
                    Ok(created) => {
                        for r in created.iter().take(1) {
                            debug!(name = %r.name, uid = %r.uid, "created");
                        }
                    }
                    Err(e) => debug!(error = %e, "create refused"),
                }
                (
                    "create",
                    Some(Reply::after_flush(reply, result, self.group_committed())),
                )
            }
            WriterMsg::Update(spec, etag, audit, answer_by, reply) => {
                let span = info_span!(parent: caller, "update", %region, name = %spec.name);
                let _g = span.enter();
                let result = self.run_audited(
                    myself,
                    |s, c, _| {
                        still_awaited(answer_by, c.now, c.region.as_str(), "Update")?;
                        protocol::update(s, c, spec, etag.as_deref())
                    },
                    audit.as_ref(),
                    audited::updated,
                );
                (
                    "update",
                    Some(Reply::after_flush(reply, result, self.group_committed())),
                )
            }
            WriterMsg::Delete(req, audit, answer_by, reply) => {
                let span = info_span!(parent: caller, "delete", %region, name = %req.name, cascade = req.cascade, dry_run = req.dry_run);
                let _g = span.enter();
                let started = audited::deletion_started(&req);
                let result = self.run_audited(
                    myself,
                    |s, c, ids| {
                        still_awaited(answer_by, c.now, c.region.as_str(), "Delete")?;
                        protocol::delete(s, c, ids, req)
                    },
                    audit.as_ref(),
                    started,
                );
                match &result {
                    Ok(DeleteOutcome::Accepted(op)) => {
                        self.ctx.metrics.deletion_accepted();
                        info!(operation = %op.id, uid = %op.root.uid, "deletion accepted")
                    }
                    Ok(_) => {}
                    Err(e) => info!(error = %e, "delete refused"),
                }
                (
                    "delete",
                    Some(Reply::after_flush(reply, result, self.group_committed())),
                )
            }
            WriterMsg::Apply(apply) => {
                let span = info_span!(parent: caller, "step", %region);
                let _g = span.enter();
                ("apply", Some(apply(self, myself)))
            }
            // Traced once (a message traced twice is not sent), and the
            // writer's own messages are never queued as a client's.
            WriterMsg::Traced(..) | WriterMsg::Clients | WriterMsg::Work | WriterMsg::Tick | WriterMsg::PruneAudit => {
                ("tick", None)
            }
        }
    }
}

/// Runs a step (its reads, its commit and its flush, which wait on the
/// engine) where it does not hold a runtime worker: on a multi-thread
/// runtime the worker's other tasks move to another thread meanwhile
/// (`block_in_place`). Why: a step that waits on an fsync holds every task
/// queued on its worker. cascade-bench's mailbox trace of P2 (five nodes
/// in one process, two workers) saw a create wait 349 ms while its own
/// writer was busy 38.5 ms of it: the other nodes' commits held both
/// workers. With the hand-over, P2's Delete call at 1M answers in 8.3 ms
/// on sled and 8.9 ms on fjall (108 and 46.9 ms at 100k before). A step
/// on an engine in memory (`Store::waits_on_io` false) runs in place: it
/// never waits, and the hand-over cost it latency (P3 on the memory
/// engine, p99 at 50 regions: 9.2 ms with it). A current-thread runtime
/// cannot hand its only worker over; there the step runs in place. The
/// writer's own thread is one (`writer/handle.rs`): its steps block only
/// that thread, which has no other work; so are the turmoil simulation's
/// hosts and some tests' runtimes.
pub(crate) fn off_the_workers<R>(waits_on_io: bool, step: impl FnOnce() -> R) -> R {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if waits_on_io && multi_thread {
        tokio::task::block_in_place(step)
    } else {
        step()
    }
}
