//! What an administrator may do to a deletion that does not finish (seed
//! 000: an admin acts on a deletion stuck too long; seed 004: a failed
//! deletion is retried by an operator), and the audit log every such
//! action, and every refused attempt at one, is written to.
//!
//! Who is an administrator is the node's business (its Admin service
//! checks the caller before it calls anything here); the core records
//! what was asked, by whom and why, in the same step as the change.

use crate::error::CoreError;
use crate::limits::{
    cut_stored, MAX_AUDIT_ACTION_BYTES, MAX_AUDIT_OUTCOME_BYTES, MAX_AUDIT_TARGET_BYTES, MAX_AUDIT_WHO_BYTES,
};
use crate::model::{
    AuditEntry, DeletionRecord, DeletionStatus, EventType, ForcedPurge, OperationState, Resource, ResourceState,
};
use crate::name::{IdSource, Uid};
use crate::state::{StateRead, Tx};

use super::bookkeeping::{decrement, emit_only, put_with_event, queue_pending, update_operation};
use super::validate::{local_name, too_long};
use super::{target_of, Ctx, Step};

/// Longest reason an administrator may give (it is kept in the log).
pub const MAX_ADMIN_REASON: usize = crate::limits::MAX_REASON_BYTES;

/// Who asks for an administrative action, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminRequest {
    /// The administrator, as the node authenticated them.
    pub who: String,
    /// The method (`RetryDeletion`, ...), for the log.
    pub action: String,
    /// The resource or region the action is about.
    pub target: String,
    /// The reason they gave.
    pub reason: String,
}

/// Whether a deletion will not finish until someone acts: FAILED, held by
/// a `block` referrer that is not itself being deleted, or by a lien. A
/// pending finalizer is not stuck: its controller may still answer.
pub fn is_stuck(resource: &Resource, record: &DeletionRecord) -> bool {
    match &record.status {
        DeletionStatus::Failed { .. } => true,
        DeletionStatus::Blocked { blockers, .. } => {
            !resource.liens.is_empty() || blockers.iter().any(|b| !b.referrer_deleting)
        }
        DeletionStatus::Pending | DeletionStatus::Waiting { .. } => false,
    }
}

/// Starts a FAILED deletion again from zero: PENDING, its queue entry due
/// now with no attempt counted, its finalizers' failure counts forgotten,
/// its operation running again. Logged with `req`.
pub fn retry_deletion<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    ids: &mut dyn IdSource,
    name: &str,
    req: AdminRequest,
) -> Result<Step<(Resource, DeletionRecord)>, CoreError> {
    let mut tx = Tx::new(state);
    check_reason(&req.reason)?;
    let (resource, record) = deleting(&tx, ctx, name, "is not being deleted")?;
    let DeletionStatus::Failed { .. } = &record.status else {
        return Err(CoreError::NoSuchDeletion {
            name: resource.name,
            why: format!(
                "has not failed: its deletion is {} (only a FAILED deletion is retried)",
                record.status.name()
            ),
        });
    };
    let mut record = record;
    let op = record.operation;
    record.status = DeletionStatus::Pending;
    record.finalizer_failures.clear();
    // The finalizers' controllers are asked again, as after a failure.
    for finalizer in &resource.finalizers {
        let message = format!(
            "finalizer {finalizer} asked again (attempt 1 of {}): the deletion was retried by {}",
            ctx.policy.max_attempts, req.who
        );
        emit_only(&mut tx, ctx, EventType::FinalizerRetry, &resource, op, &message, None)?;
    }
    tx.put_deletion(record.clone());
    queue_pending(&mut tx, ctx, op, target_of(&resource));
    reopen_failed(&mut tx, op)?;
    audit(&mut tx, ctx, ids, req, "ok".to_owned());
    Ok(Step {
        value: (resource, record),
        writes: tx.finish(),
    })
}

/// Forces a DELETING resource's deletion through (seed 000: an admin
/// force-purges a deletion stuck longer than a threshold): its finalizers
/// and liens are dropped, and its `block` referrers, in every region, lose
/// the reference as `unset` ones do (a list its element; a `required` one
/// too, as an orphan delete clears it), instead of holding it. What a purge
/// does to every other referrer it has done already (its walk cascaded and
/// unset them) or does now. The resource is then purged as any deletion
/// is: once the referrers in other regions have acted on the
/// `DeletionForced` event and released, so nothing is left dangling
/// (invariants 1 to 4 hold). Refused for a deletion younger than
/// `min_age_ms` unless `force`; a reason is required. Forcing a forced
/// deletion again changes nothing. Logged with `req`.
#[allow(clippy::too_many_arguments)]
pub fn force_purge<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    ids: &mut dyn IdSource,
    name: &str,
    req: AdminRequest,
    min_age_ms: u64,
    force: bool,
) -> Result<Step<(Resource, DeletionRecord)>, CoreError> {
    let mut tx = Tx::new(state);
    if req.reason.trim().is_empty() {
        return Err(CoreError::invalid(
            "reason",
            "a force purge needs a reason (kept in the audit log)",
        ));
    }
    check_reason(&req.reason)?;
    let (resource, mut record) = deleting(
        &tx,
        ctx,
        name,
        "is not being deleted: ForcePurge finishes a deletion, it does not start one",
    )?;
    let age_ms = ctx.now.0.saturating_sub(record.deleted_at.0);
    if !force && age_ms < min_age_ms {
        return Err(CoreError::ForceTooEarly {
            name: resource.name,
            age_ms,
            threshold_ms: min_age_ms,
        });
    }
    if record.forced.is_some() {
        audit(&mut tx, ctx, ids, req, "ok (already forced)".to_owned());
        return Ok(Step {
            value: (resource, record),
            writes: tx.finish(),
        });
    }
    let op = record.operation;
    match record.status {
        DeletionStatus::Failed { .. } => {
            reopen_failed(&mut tx, op)?;
        }
        DeletionStatus::Blocked { .. } => {
            update_operation(&mut tx, op, |p| decrement(&mut p.blocked, "blocked", op))?;
        }
        DeletionStatus::Pending | DeletionStatus::Waiting { .. } => {}
    }
    record.status = DeletionStatus::Pending;
    record.finalizer_failures.clear();
    record.forced = Some(ForcedPurge {
        by: req.who.clone(),
        reason: req.reason.clone(),
        time: ctx.now,
    });
    tx.put_deletion(record.clone());
    let mut dropped = Vec::new();
    if !resource.finalizers.is_empty() {
        dropped.push(format!("finalizers {}", resource.finalizers.join(", ")));
    }
    if !resource.liens.is_empty() {
        let ids: Vec<&str> = resource.liens.iter().map(|l| l.id.as_str()).collect();
        dropped.push(format!("liens {}", ids.join(", ")));
    }
    let mut resource = resource;
    resource.finalizers.clear();
    resource.liens.clear();
    resource.update_time = ctx.now;
    let message = format!(
        "deletion forced by {}: {}{}",
        req.who,
        req.reason,
        if dropped.is_empty() {
            String::new()
        } else {
            format!(" (dropped {})", dropped.join("; "))
        }
    );
    let resource = put_with_event(&mut tx, ctx, resource, EventType::DeletionForced, Some(op), &message)?;
    // A fresh walk: the `block` rows the first one counted are acted on now.
    queue_pending(&mut tx, ctx, op, target_of(&resource));
    audit(&mut tx, ctx, ids, req, "ok".to_owned());
    Ok(Step {
        value: (resource, record),
        writes: tx.finish(),
    })
}

/// Only the audit entry: an administrative call that changes nothing (a
/// listing), or one that was refused (`outcome` says with what).
pub fn record_audit<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    ids: &mut dyn IdSource,
    req: AdminRequest,
    outcome: String,
) -> Step<()> {
    let mut tx = Tx::new(state);
    audit(&mut tx, ctx, ids, req, outcome);
    Step {
        value: (),
        writes: tx.finish(),
    }
}

pub(super) fn audit<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    ids: &mut dyn IdSource,
    req: AdminRequest,
    outcome: String,
) {
    // Every field is cut to its limit (with a marker and the original
    // length): a refusal is audited with what the caller sent, and the
    // caller decides how much that is.
    tx.put_audit(AuditEntry {
        id: Uid(ids.next_uuid()),
        time: ctx.now,
        who: cut_stored(&req.who, MAX_AUDIT_WHO_BYTES),
        action: cut_stored(&req.action, MAX_AUDIT_ACTION_BYTES),
        target: cut_stored(&req.target, MAX_AUDIT_TARGET_BYTES),
        reason: cut_stored(&req.reason, MAX_ADMIN_REASON),
        outcome: cut_stored(&outcome, MAX_AUDIT_OUTCOME_BYTES),
        ..AuditEntry::default()
    });
}

/// A FAILED deletion of operation `op` is pending again: the counters
/// move back, and an operation that had ended runs again.
fn reopen_failed<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, op: crate::name::OperationId) -> Result<(), CoreError> {
    update_operation(tx, op, |p| {
        decrement(&mut p.failed, "failed", op);
        p.pending += 1;
    })?;
    if let Some(mut operation) = tx.operation(op)? {
        if operation.state != OperationState::Running {
            operation.state = OperationState::Running;
            operation.end_time = None;
            tx.put_operation(operation);
        }
    }
    Ok(())
}

/// The DELETING resource of this region that `raw` names, with its
/// deletion record: NOT_FOUND when there is none, `NoSuchDeletion` with
/// `not_deleting` when it lives.
fn deleting<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    raw: &str,
    not_deleting: &str,
) -> Result<(Resource, DeletionRecord), CoreError> {
    let name = local_name(ctx, raw, "name")?;
    let resource = tx
        .resource(&name)?
        .filter(|r| r.state != ResourceState::Creating)
        .ok_or_else(|| CoreError::NotFound(name.clone()))?;
    match tx.deletion(resource.uid)? {
        Some(record) if resource.state == ResourceState::Deleting => Ok((resource, record)),
        _ => Err(CoreError::NoSuchDeletion {
            name,
            why: not_deleting.to_owned(),
        }),
    }
}

fn check_reason(reason: &str) -> Result<(), CoreError> {
    if reason.len() > MAX_ADMIN_REASON {
        return Err(too_long("reason", reason, MAX_ADMIN_REASON));
    }
    Ok(())
}
