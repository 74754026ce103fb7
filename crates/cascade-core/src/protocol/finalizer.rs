//! Finalizer controllers: the external cleanups a DELETING resource waits
//! for before it is purged (seed 004's asynchronous deletion of what lives
//! outside the store; Kubernetes' finalizers).
//!
//! A controller watches the deletion events of its kinds. For a resource
//! that lists its finalizer it does its cleanup, then answers with
//! [`remove_finalizer`] (done: the deletion goes on) or
//! [`report_finalizer_failure`] (failed, with a reason). A failure is
//! counted per finalizer; the deletion stays BLOCKED, naming it, and once
//! the backoff of that many failures has elapsed the work loop asks the
//! controller again with a `FinalizerRetry` event (`bookkeeping::hold`).
//! The failure that reaches `Policy::max_attempts` marks the deletion
//! FAILED (in its next step, once its walk of the referrers is done) with
//! the controller's last reason and a `DeletionFailed` event. Every report
//! counts, whether or not a retry asked for it;
//! a later `RemoveFinalizer` still finishes it (the removal wakes it, and a
//! step that finds nothing holding it purges it, failed or not).
//!
//! Waiting is not failing: a finalizer nobody reported a failure for holds
//! its deletion as long as it takes (the controller may be slow or down;
//! `ExplainDeletion` and `ListDeletions` show it, and an administrator can
//! force-purge it).

use crate::error::CoreError;
use crate::model::{DeletionStatus, EventType, FinalizerFailure, Resource, ResourceState, WorkItem};
use crate::name::Uid;
use crate::state::{StateRead, Tx};

use super::bookkeeping::{hold_reason, mark_blocked, put_with_event, wake_if_deleting};
use super::validate::{local_name, too_long};
use super::{target_of, Ctx, Step};

/// Longest reason a controller may report (it is stored and shown).
pub const MAX_FAILURE_REASON: usize = crate::limits::MAX_REASON_BYTES;

/// A finalizer controller's report about one finalizer of one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinalizerReport {
    /// The resource, in this node's region.
    pub name: String,
    /// When set, the incarnation the controller worked on: a report about a
    /// purged resource must not touch a new one of the same name.
    pub uid: Option<Uid>,
    /// The finalizer, as the resource lists it.
    pub finalizer: String,
    /// Why the cleanup failed (failure reports only).
    pub reason: String,
}

/// Removes a finalizer: its controller's cleanup is done. A deletion it
/// held is woken (even a FAILED one) and may now finish. Removing a
/// finalizer the resource does not list answers the resource unchanged,
/// so a controller may retry the call.
pub fn remove_finalizer<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    req: FinalizerReport,
) -> Result<Step<Resource>, CoreError> {
    let mut tx = Tx::new(state);
    let mut resource = the_incarnation(&tx, ctx, &req)?;
    if !resource.finalizers.contains(&req.finalizer) {
        return Ok(Step {
            value: resource,
            writes: Default::default(),
        });
    }
    resource.finalizers.retain(|f| f != &req.finalizer);
    resource.update_time = ctx.now;
    let message = format!("finalizer {} removed", req.finalizer);
    let resource = put_with_event(&mut tx, ctx, resource, EventType::Updated, None, &message)?;
    after_finalizers_removed(&mut tx, ctx, &resource)?;
    Ok(Step {
        value: resource,
        writes: tx.finish(),
    })
}

/// Records that a finalizer's cleanup failed (see the module doc): BLOCKED
/// naming it until the backoff elapses and its controller is asked again,
/// FAILED once the failures reach the maximum. A report about a FAILED
/// deletion only updates the failure it shows.
pub fn report_finalizer_failure<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    req: FinalizerReport,
) -> Result<Step<Resource>, CoreError> {
    let mut tx = Tx::new(state);
    if req.reason.trim().is_empty() || req.reason.len() > MAX_FAILURE_REASON {
        return Err(CoreError::invalid(
            "reason",
            format!("a failure needs a reason of 1 to {MAX_FAILURE_REASON} bytes"),
        ));
    }
    let resource = the_incarnation(&tx, ctx, &req)?;
    if !resource.finalizers.contains(&req.finalizer) {
        return Err(CoreError::FinalizerNotFound {
            name: resource.name,
            finalizer: req.finalizer,
        });
    }
    let record = match tx.deletion(resource.uid)? {
        Some(record) if resource.state == ResourceState::Deleting => record,
        _ => {
            return Err(CoreError::NoSuchDeletion {
                name: resource.name,
                why: "is not being deleted: a finalizer fails only during a deletion".to_owned(),
            })
        }
    };
    let mut record = record;
    let index = match record
        .finalizer_failures
        .iter()
        .position(|f| f.finalizer == req.finalizer)
    {
        Some(i) => i,
        None => {
            record.finalizer_failures.push(FinalizerFailure {
                finalizer: req.finalizer.clone(),
                failures: 0,
                last_reason: String::new(),
                last_time: ctx.now,
                retry_at: None,
            });
            record.finalizer_failures.len() - 1
        }
    };
    let failure = &mut record.finalizer_failures[index];
    failure.failures = failure.failures.saturating_add(1);
    failure.last_reason = req.reason.clone();
    failure.last_time = ctx.now;
    let failures = failure.failures;
    if let DeletionStatus::Failed { .. } = record.status {
        failure.retry_at = None;
        tx.put_deletion(record);
        return Ok(Step {
            value: resource,
            writes: tx.finish(),
        });
    }
    // At the maximum the controller is not asked again: the deletion's next
    // step, past its walk, marks it FAILED (`bookkeeping::hold`).
    let exhausted = failures >= ctx.policy.max_attempts;
    let retry_at = if exhausted {
        ctx.now
    } else {
        ctx.now.plus_millis(ctx.policy.backoff(failures))
    };
    failure.retry_at = (!exhausted).then_some(retry_at);
    let blockers = match &record.status {
        DeletionStatus::Blocked { blockers, .. } => blockers.clone(),
        _ => Vec::new(),
    };
    let reason = hold_reason(&resource, &record, &blockers, &[]);
    mark_blocked(&mut tx, ctx, &resource, &mut record, blockers, reason)?;
    tx.put_deletion(record);
    // The work loop asks the controller again when the backoff elapses
    // (sooner if it was due anyway). A held deletion is always queued; the
    // entry is made if it were not, or the retry would never be asked.
    match tx.work(resource.uid)? {
        Some(mut work) if work.next_attempt_at > retry_at => {
            work.next_attempt_at = retry_at;
            tx.put_work(work);
        }
        Some(_) => {}
        None => tx.put_work(WorkItem::due_now(target_of(&resource), retry_at)),
    }
    Ok(Step {
        value: resource,
        writes: tx.finish(),
    })
}

/// After a resource lost finalizers (RemoveFinalizer, or an Update that
/// removed some): the failures of the ones it no longer lists are
/// forgotten, and its deletion, if any, is woken.
pub(super) fn after_finalizers_removed<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: &Resource,
) -> Result<(), CoreError> {
    if let Some(mut record) = tx.deletion(resource.uid)? {
        let before = record.finalizer_failures.len();
        record
            .finalizer_failures
            .retain(|f| resource.finalizers.contains(&f.finalizer));
        if record.finalizer_failures.len() != before {
            tx.put_deletion(record);
        }
    }
    wake_if_deleting(tx, ctx, resource.uid)
}

/// The resource a report is about: of this region, visible (not
/// CREATING), and the incarnation the report names if it names one.
fn the_incarnation<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    req: &FinalizerReport,
) -> Result<Resource, CoreError> {
    let name = local_name(ctx, &req.name, "name")?;
    if req.finalizer.is_empty() {
        return Err(CoreError::invalid("finalizer", "names the finalizer: required"));
    }
    if req.finalizer.len() > crate::limits::MAX_FINALIZER_BYTES {
        return Err(too_long(
            "finalizer",
            &req.finalizer,
            crate::limits::MAX_FINALIZER_BYTES,
        ));
    }
    tx.resource(&name)?
        .filter(|r| !r.state.reads_as_absent())
        .filter(|r| req.uid.is_none_or(|uid| uid == r.uid))
        .ok_or(CoreError::NotFound(name))
}
