//! The state changes every path shares: a resource entering DELETING, a
//! deletion held (blocked, waiting for finalizers, failed) or purged, the
//! operation's progress counters and its end, waking a queued deletion,
//! and writing a resource or an event about it.
//!
//! They are written once so that records, counters and events always move
//! together, whichever path (a delete, the work loop, a peer's message)
//! changed them.

use crate::auth::Principal;
use crate::error::{describe_blockers, describe_liens, name_refusals, CoreError};
use crate::model::{
    BackRef, Blocker, DeletionReason, DeletionRecord, DeletionStatus, Event, EventType, OperationState, Outcome,
    OutcomeAction, Progress, RefTarget, Resource, ResourceState, Revision, SoftDeletion, Timestamp, WorkItem,
};
use crate::name::{OperationId, Uid};
use crate::schema::OnDelete;
use crate::state::{StateRead, Tx};

use super::backrefs::{outgoing_backrefs, release_ref};
use super::{target_of, Ctx};

/// Marks a resource DELETING, in one step with everything that goes with it.
pub(super) fn enter_deleting<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    mut resource: Resource,
    reason: DeletionReason,
    operation: OperationId,
    requested_by: &str,
    principal: &Principal,
) -> Result<(), CoreError> {
    release_outgoing(tx, ctx, &resource)?;
    resource.state = ResourceState::Deleting;
    resource.update_time = ctx.now;
    let message = match &reason {
        DeletionReason::Requested => format!("deletion requested by {requested_by}"),
        DeletionReason::Cascade { from, field } => format!("cascade from {from} (field {field})"),
    };
    let target = target_of(&resource);
    put_and_announce(
        tx,
        ctx,
        resource,
        EventType::Deleting,
        Some(operation),
        message,
        Some(reason.clone()),
    )?;
    tx.put_deletion(DeletionRecord {
        target: target.clone(),
        deleted_at: ctx.now,
        reason,
        requested_by: requested_by.to_owned(),
        operation,
        status: DeletionStatus::Pending,
        finalizer_failures: Vec::new(),
        forced: None,
        principal: principal.clone(),
    });
    let was_unset = counted_as_unset(tx, operation, &target.name)?;
    queue_pending(tx, ctx, operation, target);
    update_operation(tx, operation, |p| {
        p.pending += 1;
        if was_unset {
            decrement(&mut p.unset, "unset", operation);
        }
    })?;
    Ok(())
}

/// Queues work on `target`, due now, and reports it PENDING in `operation`
/// (a deletion that starts, or starts again: retried, forced).
pub(super) fn queue_pending<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    operation: OperationId,
    target: crate::model::RefTarget,
) {
    tx.put_work(WorkItem::due_now(target.clone(), ctx.now));
    tx.put_outcome(
        operation,
        Outcome {
            resource: target,
            action: OutcomeAction::Pending,
            time: ctx.now,
        },
    );
}

/// Releases what a resource leaving the live state held: its outgoing
/// references at once, so cycles unwind and the targets it was holding can
/// finish, and the unconfirmed cross-region ones with the rest.
fn release_outgoing<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: &Resource,
) -> Result<(), CoreError> {
    for b in outgoing_backrefs(ctx, resource) {
        release_ref(tx, ctx, &b)?;
    }
    // Only a resource whose cross-region create is unsettled has one: a
    // read spares every other deletion a write.
    if tx.pending_attach(resource.uid)?.is_some() {
        tx.remove_pending_attach(resource.uid);
    }
    Ok(())
}

/// Whether `name` was counted as an unset referrer of `operation`: a list
/// owner that first lost an element to the operation and is now deleted by
/// it was not, in the end, an unset referrer.
fn counted_as_unset<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    operation: OperationId,
    name: &crate::name::ResourceName,
) -> Result<bool, CoreError> {
    // Nothing counted as unset, nothing to take back: the operation's
    // counter answers without the outcome's read (a key built from the
    // name, per deleted leaf). A counter at zero with an unset outcome
    // would be an accounting error that `decrement` saturates anyway.
    if !tx
        .with_operation(operation, |op| op.progress.unset > 0)?
        .unwrap_or(false)
    {
        return Ok(false);
    }
    Ok(matches!(
        tx.outcome(operation, name)?,
        Some(Outcome {
            action: OutcomeAction::Unset { .. },
            ..
        })
    ))
}

/// Whether a resource a cascade reaches can skip DELETING: nothing
/// references it (no back-reference row, in any region: the owner keeps
/// remote referrers' rows too) and no finalizer or lien holds it. Nothing can then
/// wait on it, act on its DELETING event, or block it, so the step that
/// cascades to it purges it at once (see [`purge_leaf`]).
pub(super) fn is_unreferenced_leaf<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    resource: &Resource,
) -> Result<bool, CoreError> {
    Ok(resource.finalizers.is_empty() && resource.liens.is_empty() && tx.backrefs(resource.uid, None, 1)?.is_empty())
}

/// Purges a live resource a cascade reached, in the step that reached it:
/// the same end as [`enter_deleting`] followed by [`purge`], without the
/// writes the second step would undo (the DELETING record, the deletion
/// record, the queue entry, the pending outcome). One `Purged` event per
/// resource, as for any purge; its message says why.
///
/// Architecture invariant: only for [`is_unreferenced_leaf`] resources
/// (one whose few local `unset` referrers the same step cleared first is
/// one: `work.rs`, `unset_in_this_step`). A resource anything else
/// references must pass through DELETING, where importers and `block`
/// referrers see it.
pub(super) fn purge_leaf<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: Resource,
    reason: DeletionReason,
    operation: OperationId,
) -> Result<(), CoreError> {
    debug_assert!(
        is_unreferenced_leaf(tx, &resource).unwrap_or(true),
        "purge_leaf on {} which is referenced or has finalizers",
        resource.name
    );
    release_outgoing(tx, ctx, &resource)?;
    let was_unset = counted_as_unset(tx, operation, &resource.name)?;
    let retain = retention_ms(tx, ctx, operation, resource.kind())?;
    if retain == 0 {
        tx.remove_resource(&resource.name, resource.uid);
    }
    tx.put_outcome(
        operation,
        Outcome {
            resource: target_of(&resource),
            action: OutcomeAction::Deleted,
            time: ctx.now,
        },
    );
    if retain > 0 {
        bury(tx, ctx, resource, operation, retain, Some(reason))?;
    } else {
        // Once per purged leaf: the reason and the name move into the event.
        let message = purged_message(&reason);
        let target = RefTarget {
            name: resource.name,
            uid: resource.uid,
        };
        emit_about(tx, ctx, EventType::Purged, target, operation, message, Some(reason))?;
    }
    update_operation(tx, operation, |p| {
        p.deleted += 1;
        if was_unset {
            decrement(&mut p.unset, "unset", operation);
        }
    })
}

/// Keeps a deletion that cannot finish now: blocked, finalizers pending or
/// failing, or a lien held.
///
/// What counts as an attempt depends on what holds it. A `block`
/// referrer or a lien is looked at again with backoff, and after
/// `max_attempts` looks that found no progress the deletion is FAILED. A
/// deletion held only by finalizers counts no attempt here: a finalizer
/// fails only when its controller says so ([`super::report_finalizer_failure`]
/// counts those), so a slow controller is waited for, not given up on. In
/// both cases a finalizer whose failure's backoff has elapsed is asked
/// again (a `FinalizerRetry` event).
///
/// Returns whether it counted an attempt and scheduled the next one (a
/// retry, `WorkReport::retried`); not when it failed the deletion or waits
/// only for finalizers.
pub(super) fn hold<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: &Resource,
    mut record: DeletionRecord,
    mut work: WorkItem,
    blockers: Vec<Blocker>,
    refusals: &[String],
) -> Result<bool, CoreError> {
    if let DeletionStatus::Failed { .. } = record.status {
        // Woken while failed and still unable to finish: stays failed.
        tx.remove_work(resource.uid);
        return Ok(false);
    }
    // A finalizer whose controller reported the maximum of failures fails
    // the deletion here, after its walk (a report that came mid-walk only
    // recorded it: failing then would drop the walk's queue entry with
    // referrers not yet acted on).
    if let Some(f) = record
        .finalizer_failures
        .iter()
        .find(|f| f.failures >= ctx.policy.max_attempts)
    {
        let error = format!(
            "finalizer {} failed {} times, the maximum: {}",
            f.finalizer, f.failures, f.last_reason
        );
        return fail_deletion(tx, ctx, resource, record, error).map(|()| false);
    }
    let op = record.operation;
    // Ask again the controllers whose retry is due; the earliest still to come.
    let mut next_retry: Option<Timestamp> = None;
    let mut asked_again = false;
    for failure in &mut record.finalizer_failures {
        match failure.retry_at {
            Some(at) if at <= ctx.now => {
                failure.retry_at = None;
                asked_again = true;
                let message = format!(
                    "finalizer {} asked again (attempt {} of {}); last failure: {}",
                    failure.finalizer,
                    failure.failures + 1,
                    ctx.policy.max_attempts,
                    failure.last_reason
                );
                emit_only(tx, ctx, EventType::FinalizerRetry, resource, op, &message, None)?;
            }
            Some(at) => next_retry = Some(next_retry.map_or(at, |n: Timestamp| n.min(at))),
            None => {}
        }
    }
    let reason = hold_reason(resource, &record, &blockers, refusals);
    let held_by_finalizers_only = blockers.is_empty() && resource.liens.is_empty() && refusals.is_empty();
    let changed = match &record.status {
        DeletionStatus::Blocked {
            blockers: old,
            reason: old_reason,
        } => old != &blockers || old_reason != &reason,
        _ => true,
    };
    if held_by_finalizers_only {
        work.attempts = 0;
    } else {
        // Attempts count checks that found no progress: a blocker going
        // away (which also wakes this deletion early) starts the count again.
        work.attempts = if changed { 1 } else { work.attempts + 1 };
        if work.attempts > ctx.policy.max_attempts {
            let error = format!("gave up after {} attempts: {reason}", ctx.policy.max_attempts);
            return fail_deletion(tx, ctx, resource, record, error).map(|()| false);
        }
    }
    if changed {
        mark_blocked(tx, ctx, resource, &mut record, blockers, reason.clone())?;
    }
    if changed || asked_again {
        tx.put_deletion(record);
    }
    let next_check = if held_by_finalizers_only {
        // Nothing to look at until a controller answers (which wakes it);
        // the cap is the safety net.
        ctx.now.plus_millis(ctx.policy.backoff_cap_ms)
    } else {
        ctx.now.plus_millis(ctx.policy.backoff(work.attempts))
    };
    work.next_attempt_at = next_retry.map_or(next_check, |at| at.min(next_check));
    work.last_error = Some(reason);
    tx.put_work(work);
    Ok(!held_by_finalizers_only)
}

/// Why a deletion is held, for a human: the changes its principal may not
/// make (see `work.rs`), its blockers, its finalizers (with the failures
/// their controllers reported), its liens.
pub(super) fn hold_reason(
    resource: &Resource,
    record: &DeletionRecord,
    blockers: &[Blocker],
    refusals: &[String],
) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !refusals.is_empty() {
        parts.push(name_refusals(refusals));
    }
    if !blockers.is_empty() {
        parts.push(describe_blockers(blockers));
    }
    if !resource.finalizers.is_empty() {
        let finalizers: Vec<String> = resource
            .finalizers
            .iter()
            .map(|f| match record.finalizer_failures.iter().find(|x| &x.finalizer == f) {
                Some(failure) => format!(
                    "{f} (failed {} time(s), last: {})",
                    failure.failures, failure.last_reason
                ),
                None => f.clone(),
            })
            .collect();
        parts.push(format!("waiting for finalizers: {}", finalizers.join(", ")));
    }
    if !resource.liens.is_empty() {
        parts.push(describe_liens(&resource.liens));
    }
    parts.join("; ")
}

/// Sets a pending deletion's status to BLOCKED with `reason` (the caller
/// writes the record): its outcome, a `DeletionBlocked` event, and the
/// operation's `blocked` counter when it was not blocked before.
pub(super) fn mark_blocked<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: &Resource,
    record: &mut DeletionRecord,
    blockers: Vec<Blocker>,
    reason: String,
) -> Result<(), CoreError> {
    debug_assert!(
        !matches!(record.status, DeletionStatus::Failed { .. }),
        "mark_blocked on the failed deletion of {}",
        resource.name
    );
    let op = record.operation;
    let newly_blocked = !matches!(record.status, DeletionStatus::Blocked { .. });
    tx.put_outcome(
        op,
        Outcome {
            resource: target_of(resource),
            action: OutcomeAction::Blocked {
                blockers: blockers.clone(),
            },
            time: ctx.now,
        },
    );
    emit_only(tx, ctx, EventType::DeletionBlocked, resource, op, &reason, None)?;
    record.status = DeletionStatus::Blocked { blockers, reason };
    if newly_blocked {
        update_operation(tx, op, |p| p.blocked += 1)?;
    }
    Ok(())
}

/// Gives a pending deletion up: FAILED with `error`, its queue entry
/// removed, a `DeletionFailed` event. It stays DELETING until an operator
/// retries or force-purges it, or what held it goes away (a removed
/// finalizer or lien wakes it, and a step that finds nothing holding it
/// purges it).
pub(super) fn fail_deletion<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: &Resource,
    mut record: DeletionRecord,
    error: String,
) -> Result<(), CoreError> {
    let op = record.operation;
    let was_blocked = matches!(record.status, DeletionStatus::Blocked { .. });
    debug_assert!(
        !matches!(record.status, DeletionStatus::Failed { .. }),
        "fail_deletion on the failed deletion of {}",
        resource.name
    );
    record.status = DeletionStatus::Failed { error: error.clone() };
    for failure in &mut record.finalizer_failures {
        failure.retry_at = None;
    }
    tx.put_deletion(record);
    tx.remove_work(resource.uid);
    tx.put_outcome(
        op,
        Outcome {
            resource: target_of(resource),
            action: OutcomeAction::Failed { error: error.clone() },
            time: ctx.now,
        },
    );
    emit_only(tx, ctx, EventType::DeletionFailed, resource, op, &error, None)?;
    update_operation(tx, op, |p| {
        decrement(&mut p.pending, "pending", op);
        p.failed += 1;
        if was_blocked {
            decrement(&mut p.blocked, "blocked", op);
        }
    })?;
    after_pending_changed(tx, ctx, op)
}

/// Removes a deleted resource for good.
pub(super) fn purge<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: Resource,
    record: DeletionRecord,
) -> Result<(), CoreError> {
    let op = record.operation;
    let retain = retention_ms(tx, ctx, op, resource.kind())?;
    tx.remove_deletion(resource.uid);
    tx.put_outcome(
        op,
        Outcome {
            resource: target_of(&resource),
            action: OutcomeAction::Deleted,
            time: ctx.now,
        },
    );
    if retain > 0 {
        // Its queue entry becomes the expiry's (see `bury`).
        bury(tx, ctx, resource, op, retain, None)?;
    } else {
        tx.remove_resource(&resource.name, resource.uid);
        tx.remove_work(resource.uid);
        emit_only(tx, ctx, EventType::Purged, &resource, op, "purged", None)?;
    }
    update_operation(tx, op, |p| {
        match record.status {
            DeletionStatus::Failed { .. } => decrement(&mut p.failed, "failed", op),
            DeletionStatus::Blocked { .. } => {
                decrement(&mut p.blocked, "blocked", op);
                decrement(&mut p.pending, "pending", op);
            }
            DeletionStatus::Pending | DeletionStatus::Waiting { .. } => decrement(&mut p.pending, "pending", op),
        }
        p.deleted += 1;
    })?;
    after_pending_changed(tx, ctx, op)
}

/// How long a member of `operation` of kind `kind` is kept DELETED when
/// its deletion finishes: the larger of its kind's `retain` and the
/// operation's own retention (0: purged at once).
pub(super) fn retention_ms<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    operation: OperationId,
    kind: &str,
) -> Result<u64, CoreError> {
    // Read without a copy: this runs at every finished member.
    let requested = tx.with_operation(operation, |op| op.retain_ms)?.unwrap_or(0);
    Ok(ctx.schema.retain_ms(kind).max(requested))
}

/// Buries a member whose deletion finished, instead of purging it (soft
/// delete with a window): the record stays under its name, DELETED, with
/// when it was deleted, when it expires and by which operation; its name
/// and uid stay reserved. Its references were released when it left the
/// live state (its `refs` stay in the record, for an Undelete). One
/// `SoftDeleted` event. Its queue entry is the expiry: due at
/// `expire_time`, when [`expire`] purges it (the due index the work loop
/// reads from its floor, so no walk of buried records and no table of its
/// own).
fn bury<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    mut resource: Resource,
    operation: OperationId,
    retain_ms: u64,
    cause: Option<DeletionReason>,
) -> Result<(), CoreError> {
    let expire_time = ctx.now.plus_millis(retain_ms);
    resource.state = ResourceState::Deleted;
    resource.update_time = ctx.now;
    resource.soft_deleted = Some(SoftDeletion {
        delete_time: ctx.now,
        expire_time,
        operation,
    });
    let message = format!(
        "soft-deleted: kept until {} ({}), then purged",
        crate::time_text::rfc3339(expire_time),
        crate::time_text::duration(retain_ms)
    );
    let resource = put_with_caused_event(
        tx,
        ctx,
        resource,
        EventType::SoftDeleted,
        Some(operation),
        &message,
        cause,
    )?;
    tx.put_work(WorkItem {
        target: target_of(&resource),
        next_attempt_at: expire_time,
        attempts: 0,
        last_error: None,
        walk: crate::model::Walk::default(),
    });
    Ok(())
}

/// Purges a DELETED resource whose window has passed (its queue entry is
/// due at `expire_time`): the record and its uid go, and a `Purged` event
/// says so (importers drop their tombstone of it then). Its operation's
/// counters already counted it deleted when it was buried. A queue entry
/// woken early (or of a record whose window is not over) is put back at
/// the expiry. Returns whether it purged.
pub(super) fn expire<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: Resource,
    mut work: WorkItem,
) -> Result<bool, CoreError> {
    let Some(soft) = resource.soft_deleted else {
        // A DELETED record without its window cannot be told when to go:
        // purged now, rather than kept for ever.
        tx.remove_resource(&resource.name, resource.uid);
        tx.remove_work(resource.uid);
        return Ok(true);
    };
    if soft.expire_time > ctx.now {
        if work.next_attempt_at != soft.expire_time {
            work.next_attempt_at = soft.expire_time;
            tx.put_work(work);
        }
        return Ok(false);
    }
    tx.remove_resource(&resource.name, resource.uid);
    tx.remove_work(resource.uid);
    let message = format!(
        "purged: its retention ended (soft-deleted at {})",
        crate::time_text::rfc3339(soft.delete_time)
    );
    emit_only(tx, ctx, EventType::Purged, &resource, soft.operation, &message, None)?;
    Ok(true)
}

/// Finishes the operation when nothing is pending, or wakes its root when
/// the root is all that is left.
pub(crate) fn after_pending_changed<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    id: OperationId,
) -> Result<(), CoreError> {
    // Read without a copy: this runs at every purge of a DELETING member.
    let Some((pending, failed, root)) =
        tx.with_operation(id, |op| (op.progress.pending, op.progress.failed, op.root.uid))?
    else {
        return Ok(());
    };
    if pending <= 1 {
        // The root may be all that is left (or a failed root, nothing at all).
        wake_if_deleting(tx, ctx, root)?;
    }
    if pending == 0 {
        if let Some(op) = tx.operation_mut(id)? {
            if op.state == OperationState::Cancelled {
                // A cancel ended it already; its last members finished.
                return Ok(());
            }
            op.state = if failed > 0 {
                OperationState::Failed
            } else {
                OperationState::Succeeded
            };
            op.end_time = Some(ctx.now);
        }
    }
    Ok(())
}

/// Changes an operation's progress counters, counting a change of its part.
pub(super) fn update_operation<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    id: OperationId,
    change: impl FnOnce(&mut Progress),
) -> Result<(), CoreError> {
    // In place: this runs once per resource a cascade changes.
    if let Some(op) = tx.operation_mut(id)? {
        change(&mut op.progress);
        op.changes += 1;
        if op.progress.pending > 0 && !matches!(op.state, OperationState::Running | OperationState::Cancelled) {
            // More of the cascade reached this region's part after it had
            // finished (a second target of the same operation): running again.
            op.state = OperationState::Running;
            op.end_time = None;
        }
    }
    Ok(())
}

/// Takes one from the progress counter `name` of operation `op`.
///
/// Every decrement undoes an increment made earlier for the same resource
/// (it leaves `pending`, `blocked` or `failed`; a list owner counted as
/// `unset` is deleted after all), so a counter already at zero is an
/// accounting error. Test builds stop on it; a release build keeps the
/// counter at zero, since a wrong number in a report is better than a
/// writer that panics on the same step every time it is retried.
pub(super) fn decrement(counter: &mut u64, name: &str, op: OperationId) {
    debug_assert!(*counter > 0, "{name} of operation {op} would go below zero");
    *counter = counter.saturating_sub(1);
}

/// Queues a deletion to be looked at now (a back-reference to it went away).
pub(crate) fn wake_if_deleting<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    uid: Uid,
) -> Result<(), CoreError> {
    let Some(record) = tx.deletion(uid)? else {
        return Ok(());
    };
    let mut work = tx
        .work(uid)?
        .unwrap_or(WorkItem::due_now(record.target.clone(), ctx.now));
    work.next_attempt_at = ctx.now;
    tx.put_work(work);
    Ok(())
}

/// A back-reference row of a local DELETING target went away (released by
/// its referrer's region, or its local referrer was deleted): the walk of
/// the target's deletion, if it had counted the row, stops waiting for it.
pub(crate) fn forget_released_row<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    row: &BackRef,
) -> Result<(), CoreError> {
    let Some(mut work) = tx.work(row.target.uid)? else {
        return Ok(());
    };
    if work.walk.has_seen(&row.key()) {
        // Only a `block` row is counted differently when forced: read the
        // record for those alone (a release is on the hot path of a
        // cross-region cascade).
        let forced =
            row.on_delete == OnDelete::Block && tx.deletion(row.target.uid)?.is_some_and(|d| d.forced.is_some());
        work.walk.forget(row, ctx.region.as_str(), forced);
        tx.put_work(work);
    }
    Ok(())
}

/// Writes a resource with a fresh revision and the event describing the change.
pub(super) fn put_with_event<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: Resource,
    event_type: EventType,
    operation: Option<OperationId>,
    message: &str,
) -> Result<Resource, CoreError> {
    put_with_caused_event(tx, ctx, resource, event_type, operation, message, None)
}

/// [`put_with_event`], with the deletion's reason in the event.
fn put_with_caused_event<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: Resource,
    event_type: EventType,
    operation: Option<OperationId>,
    message: &str,
    cause: Option<DeletionReason>,
) -> Result<Resource, CoreError> {
    let mut written = resource.clone();
    written.revision = put_and_announce(tx, ctx, resource, event_type, operation, message.to_owned(), cause)?;
    Ok(written)
}

/// [`put_with_caused_event`] for a caller that keeps no copy of the
/// resource: it moves into the event's snapshot, and the revision it got
/// is returned. A cascade's unset referrer and a member entering DELETING
/// each spare a copy of the whole resource this way.
pub(super) fn put_and_announce<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    mut resource: Resource,
    event_type: EventType,
    operation: Option<OperationId>,
    message: String,
    cause: Option<DeletionReason>,
) -> Result<Revision, CoreError> {
    // Importers must know whether a deletion allows a cascade, and whom it
    // acts for: they apply it to their own referrers (see
    // `apply_to_referrer`), authorized for that principal.
    // And the retention, so that members cascaded there are kept for the
    // same window (`Operation::retain_ms`).
    let (no_cascade, principal, retain_ms) = match operation {
        Some(id) if matches!(event_type, EventType::Deleting | EventType::DeletionForced) => tx
            .with_operation(id, |op| (!op.cascade, op.principal.clone(), op.retain_ms))?
            .unwrap_or_else(|| (false, Principal::anonymous(), 0)),
        _ => (false, Principal::anonymous(), 0),
    };
    let revision = tx.peek_revision()?;
    resource.revision = revision;
    tx.put_resource(resource.clone());
    tx.emit(Event {
        revision: 0,
        event_type,
        resource: target_of(&resource),
        snapshot: Some(resource),
        operation,
        message,
        time: ctx.now,
        no_cascade,
        cause,
        principal,
        retain_ms,
    })?;
    Ok(revision)
}

/// An event about a resource without changing the resource itself.
pub(super) fn emit_only<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    event_type: EventType,
    resource: &Resource,
    operation: OperationId,
    message: &str,
    cause: Option<DeletionReason>,
) -> Result<(), CoreError> {
    let resource = target_of(resource);
    emit_about(tx, ctx, event_type, resource, operation, message.to_owned(), cause)
}

/// [`emit_only`], with the event's resource and message given owned (the
/// purge of a leaf has both to give away).
fn emit_about<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    event_type: EventType,
    resource: RefTarget,
    operation: OperationId,
    message: String,
    cause: Option<DeletionReason>,
) -> Result<(), CoreError> {
    tx.emit(Event {
        revision: 0,
        event_type,
        resource,
        snapshot: None,
        operation: Some(operation),
        message,
        time: ctx.now,
        no_cascade: false,
        cause,
        principal: Principal::anonymous(),
        retain_ms: 0,
    })?;
    Ok(())
}

/// The message of the `Purged` event of a leaf purged by a cascade:
/// `purged: cascade from {from} (field {field})`, or `purged`.
fn purged_message(reason: &DeletionReason) -> String {
    match reason {
        DeletionReason::Requested => "purged".to_owned(),
        DeletionReason::Cascade { from, field } => {
            const HEAD: &str = "purged: cascade from ";
            const MID: &str = " (field ";
            let mut message = String::with_capacity(HEAD.len() + from.as_str().len() + MID.len() + field.len() + 1);
            message.push_str(HEAD);
            message.push_str(from.as_str());
            message.push_str(MID);
            message.push_str(field);
            message.push(')');
            message
        }
    }
}
