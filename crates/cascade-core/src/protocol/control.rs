//! Bounds and controls of a running operation (issue 29): its budget of
//! members (`max_deletions`, leased across regions by the root's region),
//! its rate, pause, resume and cancel.
//!
//! What counts against the budget: every member the operation enters into
//! deletion, the root included, in any region (a leaf purged in the step
//! that reached it too). Referrers that only lose a reference (`unset`,
//! orphaned) are not members and do not count: they survive.
//!
//! How it holds: before a cascade enters a referrer into deletion,
//! [`admit`] asks the operation's controls. Without a unit of budget (or a
//! token of the rate, or while cancelled) the referrer stays ACTIVE with
//! its reference, so the DELETING member it refers to cannot finish: that
//! member is held BLOCKED with the reason (`budget reached (100 of 100)`),
//! its walk stopped just before the referrer, and looked at again later
//! without counting an attempt (a budget is not a failure). Raising the
//! budget ([`extend_budget`]) lets the next look go on.
//!
//! Across regions: the root's region owns the budget. Another region
//! spends only what it leased ([`grant_budget`] at the root's region,
//! [`accept_budget_lease`] here; the node carries them over
//! `Peer.BudgetLease`), so the members entered, summed over the regions,
//! never exceed the budget. A region that has none asks for it
//! ([`crate::protocol::WorkReport::budget_wanted`]) and waits, saying so.
//! It knows the operation is bounded because the root's region registered
//! it there before the delete ([`register_operation`]).
//!
//! Pause: a region's work step skips the items of a paused operation (they
//! stay queued, re-looked at every [`PAUSED_RECHECK_MS`], no attempt
//! counted), so nothing of it is deleted, spread or purged while paused.
//! Cancel: no new member is entered; members already DELETING finish
//! where that needs no new member (their unset referrers, other regions'
//! releases, their purge), the others stay DELETING, held with the reason.
//! The operation ends CANCELLED.

use std::collections::BTreeSet;

use crate::error::CoreError;
use crate::model::{
    DeletionRecord, DeletionStatus, Operation, OperationControls, OperationState, Outcome, OutcomeAction, Progress,
    RefTarget, Resource, Timestamp, WorkItem,
};
use crate::name::{IdSource, OperationId};
use crate::state::{StateRead, Tx};

use super::admin::audit;
use super::bookkeeping::{decrement, update_operation};
use super::{target_of, AdminRequest, Ctx, Step, WorkReport};

/// How often the items of a paused operation are looked at again.
pub const PAUSED_RECHECK_MS: u64 = 1_000;
/// How often a member held by a budget, a cancel or a missing lease is
/// looked at again (no attempt counted).
pub const HELD_RECHECK_MS: u64 = 1_000;
/// The most units of budget a region asks the root's region for at once.
pub const MAX_LEASE: u64 = 1_024;

/// How a hold by an operation's controls starts its reason: the invariant
/// checker and the explanation take such a hold as explained (a person
/// set the bound, and raises, resumes or leaves it).
pub const HELD_BY_OPERATION: [&str; 5] = [
    "budget reached",
    "rate limit",
    "operation paused",
    "operation cancelled",
    "waiting for a budget lease",
];

/// Whether a hold by the operation's controls lets go by itself: its
/// rate admits the next members a moment later, and a lease of budget is
/// on its way from the root's region. Not stuck: nobody has to act.
pub fn paced_by_operation(reason: &str) -> bool {
    ["rate limit", "waiting for a budget lease"]
        .iter()
        .any(|p| reason.starts_with(p))
}

/// Whether a BLOCKED reason is a hold by the operation's controls.
pub fn held_by_operation(reason: &str) -> bool {
    HELD_BY_OPERATION.iter().any(|p| reason.starts_with(p))
}

/// The controls a delete asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bounds {
    /// The most members the operation enters into deletion, the root
    /// included; None: unbounded.
    pub max_deletions: Option<u64>,
    /// The most new members per second each region enters.
    pub rate_per_s: Option<u32>,
}

impl Bounds {
    /// Whether the delete is bounded at all.
    pub fn any(&self) -> bool {
        self.max_deletions.is_some() || self.rate_per_s.is_some()
    }

    /// Refuses a budget or rate of zero (nothing could ever be deleted).
    pub fn check(&self) -> Result<(), CoreError> {
        if self.max_deletions == Some(0) {
            return Err(CoreError::invalid(
                "max_deletions",
                "must be at least 1 (the root counts): leave it unset for no budget",
            ));
        }
        if self.rate_per_s == Some(0) {
            return Err(CoreError::invalid(
                "rate_per_second",
                "must be at least 1: leave it unset for no rate",
            ));
        }
        Ok(())
    }

    /// The controls of the root's part of a new operation.
    pub(crate) fn root_controls(&self, now: Timestamp) -> Option<Box<OperationControls>> {
        self.any().then(|| {
            Box::new(OperationControls {
                max_deletions: self.max_deletions,
                rate_per_s: self.rate_per_s,
                rate_since: now,
                ..OperationControls::default()
            })
        })
    }
}

/// Why a member was not entered, and when to look again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Held {
    /// For a human; starts with one of [`HELD_BY_OPERATION`].
    pub reason: String,
    /// When to look again.
    pub retry_at: Timestamp,
    /// A lease to ask the root's region for (non-root, budget spent).
    pub lease: Option<LeaseWanted>,
}

/// Budget a region asks the root's region for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseWanted {
    /// The operation.
    pub operation: OperationId,
    /// The root's region, which owns the budget.
    pub root_region: String,
    /// How many units.
    pub wanted: u64,
}

/// Asks the operation's controls whether the cascade may enter one more
/// member into deletion now, and counts it against the budget and the
/// rate when it may. `more` is how many more the caller sees coming (the
/// size of a lease to ask for).
pub(super) fn admit<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    id: OperationId,
    more: u64,
) -> Result<Option<Held>, CoreError> {
    // Read without a copy: asked once per member a cascade enters.
    if !tx.with_operation(id, |op| op.controls.is_some())?.unwrap_or(false) {
        return Ok(None);
    }
    let Some(op) = tx.operation_mut(id)? else {
        return Ok(None);
    };
    let is_root_region = op.root.name.region() == ctx.region.as_str();
    let root_region = op.root.name.region().to_owned();
    let Some(c) = op.controls.as_mut() else {
        return Ok(None);
    };
    let later = |ms: u64| ctx.now.plus_millis(ms);
    if c.cancelled {
        return Ok(Some(Held {
            reason: format!("operation cancelled by {}: no new member is deleted", c.by),
            retry_at: later(ctx.policy.backoff_cap_ms),
            lease: None,
        }));
    }
    if c.paused {
        return Ok(Some(Held {
            reason: format!("operation paused by {}", c.by),
            retry_at: later(PAUSED_RECHECK_MS),
            lease: None,
        }));
    }
    if c.left() == 0 {
        let max = c.max_deletions.unwrap_or_default();
        let held = if is_root_region {
            Held {
                reason: format!("budget reached ({} of {max})", c.used()),
                retry_at: later(HELD_RECHECK_MS),
                lease: None,
            }
        } else {
            let reason = match c.exhausted {
                Some((used, max)) => format!("budget reached ({used} of {max}, as region {root_region} owns it)"),
                None => format!("waiting for a budget lease from region {root_region}"),
            };
            Held {
                reason,
                retry_at: later(HELD_RECHECK_MS),
                lease: Some(LeaseWanted {
                    operation: id,
                    root_region,
                    wanted: more.clamp(1, MAX_LEASE),
                }),
            }
        };
        return Ok(Some(held));
    }
    if let Some(rate) = c.rate_per_s {
        let elapsed_ms = ctx.now.0.saturating_sub(c.rate_since.0);
        // One member at once, then `rate` a second.
        let allowed = c
            .rate_base
            .saturating_add(1)
            .saturating_add(u64::from(rate).saturating_mul(elapsed_ms) / 1_000);
        if c.admitted >= allowed {
            // The next token comes when elapsed × rate / 1000 grows by one.
            let next_ms = (c.admitted - c.rate_base)
                .saturating_mul(1_000)
                .div_ceil(u64::from(rate));
            let retry_at = Timestamp(c.rate_since.0.saturating_add(next_ms).max(ctx.now.0 + 1));
            return Ok(Some(Held {
                reason: format!("rate limit: at most {rate} new member(s) a second"),
                retry_at,
                lease: None,
            }));
        }
    }
    c.admitted += 1;
    op.changes += 1;
    Ok(None)
}

/// Whether the operation's items are to be skipped now (paused).
pub(super) fn paused<S: StateRead + ?Sized>(tx: &Tx<'_, S>, id: OperationId) -> Result<bool, CoreError> {
    Ok(tx
        .with_operation(id, |op| op.controls.as_ref().is_some_and(|c| c.paused))?
        .unwrap_or(false))
}

/// What a person asks of a running operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Stop working on it, in every region, until resumed.
    Pause,
    /// Work on it again.
    Resume,
    /// Enter no new member; it ends CANCELLED.
    Cancel,
}

impl Control {
    /// The method, as the audit log names it.
    pub fn action(self) -> &'static str {
        match self {
            Control::Pause => "PauseOperation",
            Control::Resume => "ResumeOperation",
            Control::Cancel => "CancelOperation",
        }
    }
}

/// Pauses, resumes or cancels this region's part of an operation, audited
/// with `req` in the same step. `root`: the operation's root, to create
/// the part when the cascade has not reached this region yet (a control
/// from the root's region), so a part that starts later starts paused or
/// cancelled. Idempotent; a resume or pause of a cancelled operation is
/// refused (FAILED_PRECONDITION), as any control of one that ended.
pub fn control_operation<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    ids: &mut dyn IdSource,
    id: OperationId,
    control: Control,
    root: Option<RefTarget>,
    req: AdminRequest,
) -> Result<Step<Operation>, CoreError> {
    let mut tx = Tx::new(state);
    let mut op = match (tx.operation(id)?, root) {
        (Some(op), _) => op,
        (None, Some(root)) => empty_part(ctx, id, root, None),
        (None, None) => return Err(CoreError::OperationNotFound(id.to_string())),
    };
    // Only the root's region refuses a control of an operation that ended:
    // another region's part may finish before the cascade reaches it again.
    let is_root_region = op.root.name.region() == ctx.region.as_str();
    let ended = matches!(op.state, OperationState::Succeeded | OperationState::Failed) && op.progress.pending == 0;
    if ended && is_root_region {
        return Err(CoreError::OperationControl {
            id: id.to_string(),
            why: format!("has ended ({:?}): there is nothing to {}", op.state, control.action()),
        });
    }
    let c = op.controls.get_or_insert_with(|| {
        Box::new(OperationControls {
            rate_since: ctx.now,
            ..OperationControls::default()
        })
    });
    if c.cancelled && control != Control::Cancel {
        return Err(CoreError::OperationControl {
            id: id.to_string(),
            why: format!("was cancelled by {}: it cannot be paused or resumed", c.by),
        });
    }
    match control {
        Control::Pause => c.paused = true,
        Control::Resume => {
            if c.paused {
                // The rate counts from now: a pause saves up no burst.
                c.rate_since = ctx.now;
                c.rate_base = c.admitted;
            }
            c.paused = false;
        }
        Control::Cancel => {
            c.cancelled = true;
            c.paused = false;
            if op.state != OperationState::Cancelled {
                op.state = OperationState::Cancelled;
                op.end_time = Some(ctx.now);
            }
        }
    }
    if let Some(c) = op.controls.as_mut() {
        c.by = crate::limits::cut_stored(&req.who, crate::limits::MAX_AUDIT_WHO_BYTES);
    }
    op.changes += 1;
    tx.put_operation(op.clone());
    audit(&mut tx, ctx, ids, req, "ok".to_owned());
    Ok(Step {
        value: op,
        writes: tx.finish(),
    })
}

/// The part a region keeps of an operation none of whose members it holds
/// yet: finished (nothing pending), with `controls`.
fn empty_part(ctx: Ctx<'_>, id: OperationId, root: RefTarget, controls: Option<Box<OperationControls>>) -> Operation {
    Operation {
        id,
        requested_by: format!("region {}", root.name.region()),
        root,
        cascade: true,
        state: OperationState::Succeeded,
        progress: Progress::default(),
        create_time: ctx.now,
        end_time: Some(ctx.now),
        reached: BTreeSet::new(),
        changes: 0,
        closure_confirmed: false,
        principal: crate::auth::Principal::anonymous(),
        controls,
        undelete: None,
        // The cascade's first member here brings the operation's retention
        // (see `ensure_operation_part`).
        retain_ms: 0,
    }
}

/// The root's region registers a bounded operation here before its delete
/// starts (so this region never spreads it unbounded): the part starts
/// with no budget of its own (it leases from the root's region) and the
/// operation's rate. Idempotent.
pub fn register_operation<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    id: OperationId,
    root: RefTarget,
    bounds: Bounds,
) -> Result<Step<()>, CoreError> {
    let mut tx = Tx::new(state);
    bounds.check()?;
    if root.name.region() == ctx.region.as_str() {
        return Err(CoreError::invalid(
            "root",
            "the root's own region keeps the budget: it registers nowhere but elsewhere",
        ));
    }
    let controls = Box::new(OperationControls {
        max_deletions: bounds.max_deletions.map(|_| 0),
        rate_per_s: bounds.rate_per_s,
        rate_since: ctx.now,
        ..OperationControls::default()
    });
    match tx.operation(id)? {
        Some(mut op) => {
            if op.controls.is_none() {
                op.controls = Some(controls);
                op.changes += 1;
                tx.put_operation(op);
            }
        }
        None => tx.put_operation(empty_part(ctx, id, root, Some(controls))),
    }
    Ok(Step {
        value: (),
        writes: tx.finish(),
    })
}

/// What the root's region answered a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetGrant {
    /// Units granted (0: none left).
    pub granted: u64,
    /// The operation's budget.
    pub max_deletions: u64,
    /// What was used of it, this grant included.
    pub used: u64,
}

/// The root's region grants `wanted` units of an operation's budget, or
/// what is left of it, to another region (counted as used here).
pub fn grant_budget<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    id: OperationId,
    wanted: u64,
) -> Result<Step<BudgetGrant>, CoreError> {
    let mut tx = Tx::new(state);
    let Some(mut op) = tx.operation(id)? else {
        return Err(CoreError::OperationNotFound(id.to_string()));
    };
    if op.root.name.region() != ctx.region.as_str() {
        return Err(CoreError::invalid(
            "operation",
            format!("region {} owns the budget of {id}, not this one", op.root.name.region()),
        ));
    }
    let Some(c) = op.controls.as_mut().filter(|c| c.max_deletions.is_some()) else {
        // Unbounded: as much as asked (a region registered for a rate only
        // does not ask; a stale ask is harmless).
        return Ok(Step {
            value: BudgetGrant {
                granted: wanted,
                max_deletions: u64::MAX,
                used: 0,
            },
            writes: tx.finish(),
        });
    };
    let granted = if c.cancelled {
        0
    } else {
        wanted.min(c.left()).min(MAX_LEASE)
    };
    c.granted += granted;
    let answer = BudgetGrant {
        granted,
        max_deletions: c.max_deletions.unwrap_or_default(),
        used: c.used(),
    };
    if granted > 0 {
        op.changes += 1;
        tx.put_operation(op);
    }
    Ok(Step {
        value: answer,
        writes: tx.finish(),
    })
}

/// A region takes the units the root's region granted it (none: the
/// budget is spent, and its held members say so).
pub fn accept_budget_lease<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    id: OperationId,
    grant: BudgetGrant,
) -> Result<Step<()>, CoreError> {
    let _ = ctx;
    let mut tx = Tx::new(state);
    if let Some(mut op) = tx.operation(id)? {
        if let Some(c) = op.controls.as_mut().filter(|c| c.max_deletions.is_some()) {
            c.max_deletions = Some(c.max_deletions.unwrap_or_default().saturating_add(grant.granted));
            c.exhausted = (grant.granted == 0).then_some((grant.used, grant.max_deletions));
            op.changes += 1;
            tx.put_operation(op);
        }
    }
    Ok(Step {
        value: (),
        writes: tx.finish(),
    })
}

/// Raises (or lowers, not below what was used) an operation's budget at
/// the root's region, audited with `req`. The members it held go on at
/// their next look (within [`HELD_RECHECK_MS`]); other regions lease again.
pub fn extend_budget<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    ids: &mut dyn IdSource,
    id: OperationId,
    max_deletions: u64,
    req: AdminRequest,
) -> Result<Step<Operation>, CoreError> {
    let mut tx = Tx::new(state);
    let Some(mut op) = tx.operation(id)? else {
        return Err(CoreError::OperationNotFound(id.to_string()));
    };
    if op.root.name.region() != ctx.region.as_str() {
        return Err(CoreError::invalid(
            "operation",
            format!("region {} owns the budget of {id}, not this one", op.root.name.region()),
        ));
    }
    let Some(c) = op.controls.as_mut().filter(|c| c.max_deletions.is_some()) else {
        return Err(CoreError::OperationControl {
            id: id.to_string(),
            why: "has no budget (it was started without max_deletions)".to_owned(),
        });
    };
    if c.cancelled {
        return Err(CoreError::OperationControl {
            id: id.to_string(),
            why: format!("was cancelled by {}", c.by),
        });
    }
    if max_deletions < c.used() {
        return Err(CoreError::invalid(
            "max_deletions",
            format!(
                "{max_deletions} is below what the operation used already ({})",
                c.used()
            ),
        ));
    }
    c.max_deletions = Some(max_deletions);
    op.changes += 1;
    tx.put_operation(op.clone());
    audit(&mut tx, ctx, ids, req, "ok".to_owned());
    Ok(Step {
        value: op,
        writes: tx.finish(),
    })
}

// The work step's side of the controls: what `work.rs` calls when the
// controls hold a member, and when they let it go on again.

/// Whether an operation has controls to ask (read without a copy: asked
/// per cascaded referrer).
pub(super) fn has_controls<S: StateRead + ?Sized>(tx: &Tx<'_, S>, id: OperationId) -> Result<bool, CoreError> {
    Ok(tx.with_operation(id, |op| op.controls.is_some())?.unwrap_or(false))
}

/// A member held by its operation's controls whose walk goes on again
/// (the budget was raised, the rate allows it): PENDING again.
pub(super) fn clear_held<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: &Resource,
    record: &mut DeletionRecord,
) -> Result<(), CoreError> {
    let DeletionStatus::Blocked { reason, .. } = &record.status else {
        return Ok(());
    };
    if !held_by_operation(reason) {
        return Ok(());
    }
    let op = record.operation;
    record.status = DeletionStatus::Pending;
    tx.put_deletion(record.clone());
    tx.put_outcome(
        op,
        Outcome {
            resource: target_of(resource),
            action: OutcomeAction::Pending,
            time: ctx.now,
        },
    );
    update_operation(tx, op, |p| decrement(&mut p.blocked, "blocked", op))
}

/// A paused operation's item: looked at again later, no attempt counted,
/// its status and walk as they were.
pub(super) fn defer<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, ctx: Ctx<'_>, mut work: WorkItem) {
    work.next_attempt_at = ctx.now.plus_millis(PAUSED_RECHECK_MS);
    tx.put_work(work);
}

/// A DELETING member whose cascade the operation's controls hold (budget
/// reached, rate, cancelled): BLOCKED with the reason, looked at again at
/// `held.retry_at` with no attempt counted (a bound a person set is not a
/// failure, and never turns into FAILED), its walk where it stopped.
pub(super) fn hold_spreading<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: &Resource,
    mut record: DeletionRecord,
    mut work: WorkItem,
    held: Held,
    report: &mut WorkReport,
) -> Result<(), CoreError> {
    if let Some(lease) = held.lease.clone() {
        report.budget_wanted.push(lease);
    }
    if let DeletionStatus::Failed { .. } = record.status {
        // Woken while failed: it stays failed, as `hold` keeps it.
        tx.remove_work(resource.uid);
        return Ok(());
    }
    let changed = !matches!(&record.status, DeletionStatus::Blocked { reason, .. } if *reason == held.reason);
    if changed {
        let op = record.operation;
        let newly_blocked = !matches!(record.status, DeletionStatus::Blocked { .. });
        tx.put_outcome(
            op,
            Outcome {
                resource: target_of(resource),
                action: OutcomeAction::Held {
                    reason: held.reason.clone(),
                },
                time: ctx.now,
            },
        );
        record.status = DeletionStatus::Blocked {
            blockers: Vec::new(),
            reason: held.reason.clone(),
        };
        tx.put_deletion(record);
        if newly_blocked {
            update_operation(tx, op, |p| p.blocked += 1)?;
        }
    }
    work.attempts = 0;
    work.next_attempt_at = held.retry_at;
    work.last_error = Some(held.reason);
    tx.put_work(work);
    Ok(())
}

#[cfg(test)]
mod tests;
