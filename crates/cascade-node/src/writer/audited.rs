//! The writer's side of the audit log: a client's change and its audit
//! entry commit in one batch (`run_audited`), and retention prunes the log
//! in bounded steps between other writes (`retain_audit`).

use cascade_core::limits::{cut_stored, MAX_AUDIT_TARGET_BYTES};
use cascade_core::protocol::{self, DeleteOutcome, DeleteRequest};
use cascade_core::{CoreError, Ctx, IdSource, Resource};
use ractor::ActorRef;
use tracing::{debug, warn};

use super::{WriterHandle, WriterMsg, WriterState};
use crate::audit::{AuditContext, Change};
use crate::codec::StoreState;
use crate::error::Fault;

impl WriterState {
    /// Runs a step and, when it is audited, appends to its writes one
    /// entry per change `changes` reads from its value (and stamps the
    /// context's details on the entries the core wrote: an Admin action's),
    /// so the change and its audit entry commit in one batch. A step the
    /// core refuses writes nothing, its entry neither.
    pub(super) fn run_audited<T>(
        &mut self,
        myself: &ActorRef<WriterMsg>,
        step: impl FnOnce(&StoreState<'_>, Ctx<'_>, &mut dyn IdSource) -> Result<protocol::Step<T>, CoreError>,
        audit: Option<&AuditContext>,
        changes: impl FnOnce(&T) -> Vec<Change>,
    ) -> Result<T, CoreError> {
        self.run_step(myself, step, audit, changes, |_| true)
    }

    /// [`Self::run_audited`], with `needs_flush` saying of the step's value
    /// whether its writes claim anything (see `WriterState::commit_as`).
    pub(super) fn run_step<T>(
        &mut self,
        myself: &ActorRef<WriterMsg>,
        step: impl FnOnce(&StoreState<'_>, Ctx<'_>, &mut dyn IdSource) -> Result<protocol::Step<T>, CoreError>,
        audit: Option<&AuditContext>,
        changes: impl FnOnce(&T) -> Vec<Change>,
        needs_flush: impl FnOnce(&T) -> bool,
    ) -> Result<T, CoreError> {
        let WriterState {
            ctx: wctx, ids, reads, ..
        } = self;
        // Read through `reads`: a read the engine refused is the store in
        // trouble (`writer/healing.rs`), not this step's alone.
        let state = StoreState { store: &*reads };
        // Loaded once: the step sees one schema from start to end.
        let in_force = wctx.schema.current();
        let ctx = Ctx {
            schema: &in_force.schema,
            region: &wctx.region,
            now: wctx.clock.now(),
            policy: &wctx.policy,
            authorizer: &*wctx.authorizer,
        };
        let now = ctx.now;
        let stepped = step(&state, ctx, ids);
        let refused = reads.take_refused();
        let mut step = match stepped {
            Ok(step) => step,
            Err(e) => {
                if let (CoreError::Storage(_), Some(refused)) = (&e, refused) {
                    self.read_refused(&refused);
                }
                return Err(e);
            }
        };
        // The entries a core step wrote know neither this node nor, in a
        // step no call asked for (a cascade's members, audited in a work
        // step), anything else of the shell's: the node is stamped on all.
        let unstamped = step.writes.audit.iter_mut().filter(|e| e.node.is_empty());
        match audit {
            Some(audit) => unstamped.for_each(|entry| audit.stamp(entry)),
            None => {
                let node = cut_stored(&wctx.audit_node.name(), MAX_AUDIT_TARGET_BYTES);
                unstamped.for_each(|entry| entry.node = node.clone());
            }
        }
        if let Some(audit) = audit {
            for change in changes(&step.value) {
                let id = cascade_core::Uid(ids.next_uuid());
                step.writes
                    .audit
                    .push(audit.entry(id, now, change.action, &change.target, "ok"));
            }
        }
        let needs_flush = needs_flush(&step.value);
        if self.commit_as(step.writes, needs_flush)? {
            self.kick(myself);
        }
        Ok(step.value)
    }

    /// One retention step of the audit log (`[audit] retain`,
    /// `max_entries`): at most [`crate::audit::PRUNE_STEP_KEYS`] of the
    /// oldest entries removed in one batch with the count. Run on every
    /// tick; a step that stopped at its limit queues one `PruneAudit`, so
    /// the next step runs after whatever the mailbox already holds (a
    /// client's write waits behind one bounded step at most).
    pub(super) fn retain_audit(&mut self, myself: &ActorRef<WriterMsg>) {
        let retention = self.ctx.audit_retention;
        let cutoff = retention.cutoff(self.ctx.clock.now());
        // Read through `reads`, as a step's: a read the engine refused is
        // the store in trouble, and it must count as one. Read past it,
        // a flight that then landed ended an episode that began after it
        // (`faults::flights::a_flight_that_lands_after_a_later_failure_does_not_end_its_episode`
        // failed in CI on that race: the tick's retention read during a
        // flight, and only logged a warning).
        let planned =
            StoreState { store: &self.reads }.prune_audit(cutoff, retention.max_entries, crate::audit::PRUNE_STEP_KEYS);
        if let Some(refused) = self.reads.take_refused() {
            self.read_refused(&refused);
        }
        let planned = planned.map_err(|e| e.to_string());
        let pruned = planned.and_then(|(batch, pruned)| {
            if !batch.is_empty() {
                // The writer's own commit and flush: a failure is the
                // store's, noted as any other (health, healing, takebacks).
                self.finish_flight().map_err(|e| e.to_string())?;
                self.ctx.stats.record(&batch);
                if let Err(e) = self.ctx.store.commit(batch) {
                    self.commit_failed(&e);
                    return Err(e.to_string());
                }
                self.flush().map_err(|e| e.to_string())?;
            }
            Ok(pruned)
        });
        match pruned {
            Ok(pruned) => {
                self.prune_failed.reset();
                self.ctx.metrics.audit_pruned(pruned.removed);
                if pruned.removed > 0 {
                    debug!(region = %self.ctx.region, removed = pruned.removed, entries = pruned.entries, "audit log pruned");
                }
                if pruned.more && !self.prune_queued && myself.cast(WriterMsg::PruneAudit).is_ok() {
                    self.prune_queued = true;
                }
            }
            Err(e) => {
                if let Some(more) = self.prune_failed.admit() {
                    warn!(region = %self.ctx.region, error = %e, suppressed = more.count(), "audit log retention failed{more}");
                }
            }
        }
    }
}

/// Each resource a create made, for the audit log. (A `&Vec`: it reads
/// the create step's value, which is one.)
#[allow(clippy::ptr_arg)]
pub(super) fn created(created: &Vec<Resource>) -> Vec<Change> {
    created
        .iter()
        .map(|r| Change {
            action: "create",
            target: r.name.to_string(),
        })
        .collect()
}

/// The resource an update changed.
pub(super) fn updated(updated: &Resource) -> Vec<Change> {
    vec![Change {
        action: "update",
        target: updated.name.to_string(),
    }]
}

/// What a delete changed: a deletion that started, named `cascade`,
/// `orphan` or `delete` as it was asked for; a dry run, a resource already
/// DELETING or absent changed nothing.
pub(super) fn deletion_started(req: &DeleteRequest) -> impl FnOnce(&DeleteOutcome) -> Vec<Change> {
    let action = if req.orphan {
        "orphan"
    } else if req.cascade {
        "cascade"
    } else {
        "delete"
    };
    let target = req.name.clone();
    move |outcome| match outcome {
        DeleteOutcome::Accepted(_) => vec![Change { action, target }],
        _ => Vec::new(),
    }
}

impl WriterHandle {
    /// Runs a protocol step audited for `audit`: one entry per change
    /// `changes` reads from the step's value, in the step's batch.
    pub async fn apply_audited<T, F, C>(&self, step: F, audit: AuditContext, changes: C) -> Result<T, Fault>
    where
        T: Send + 'static,
        F: FnOnce(&StoreState<'_>, Ctx<'_>, &mut dyn IdSource) -> Result<protocol::Step<T>, CoreError> + Send + 'static,
        C: FnOnce(&T) -> Vec<Change> + Send + 'static,
    {
        self.call(|reply| {
            WriterMsg::Apply(Box::new(
                move |state: &mut WriterState, myself: &ActorRef<WriterMsg>| {
                    let result = state.run_audited(myself, step, Some(&audit), changes);
                    super::Reply::after_flush(reply, result, state.group_committed())
                },
            ))
        })
        .await
    }
}
