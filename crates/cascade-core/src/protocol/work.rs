//! The deletion engine: one bounded batch of due queue entries per call.
//! Each deletion's back-references are walked and acted on (`cascade` and
//! `unset` referrers changed, `block` ones hold it, referrers in other
//! regions waited for); the importer applies a remote deletion to its own
//! referrers; an operation's root waits, last, for the other regions' parts
//! of its cascade.
//!
//! Size: a little over 1,000 lines, one file on purpose: one deletion's
//! step is one state machine (its walk's position and counts, its hold, its
//! wait for other regions, its end: a purge, a bury, or a soft-deleted
//! member's expiry) whose parts pass the step's budget and report between
//! them, and the walk of a deletion, its importer's twin and what both do to
//! a referrer are one engine, read together. The state changes they share
//! are in `bookkeeping.rs`, the controls that may hold a walk in
//! `control.rs`, the order of a step's items in `fairness.rs`.

use std::collections::{BTreeMap, BTreeSet};

use crate::auth::{Principal, Target, Verb};
use crate::error::CoreError;
use crate::model::{
    AuditEntry, BackRef, Blocker, DeletionReason, DeletionRecord, DeletionStatus, EventType, Operation, OperationState,
    Outcome, OutcomeAction, Progress, RefTarget, Resource, ResourceState, Timestamp, UnsetUndo, Walk, WorkItem,
};
use crate::name::{OperationId, Uid};
use crate::schema::OnDelete;
use crate::state::{BackRefPages, StateRead, Tx, WriteSet};

use super::backrefs::release_ref;
use super::bookkeeping::{
    after_pending_changed, decrement, enter_deleting, expire, hold, purge, purge_leaf, put_and_announce,
    update_operation, wake_if_deleting,
};
use super::control::{admit, clear_held, defer, has_controls, hold_spreading, paused, Held};
use super::create_update::abort_creating;
use super::fairness::{round_robin, WINDOW_FACTOR};
use super::{is_remote, target_of, Ctx, Step, WorkReport};

/// Runs one bounded batch of due deletion work.
///
/// Fair between operations: the step looks at a window of due items
/// (`Policy::batch_items` × `WINDOW_FACTOR`, `fairness.rs`), takes them round-robin by
/// operation, at most `Policy::items_per_operation` of one operation, and
/// gives each operation its share of the step's budget of referrer
/// changes, so a small delete is not queued behind a cascade of a million
/// (whose walk alone would otherwise take every step's whole budget).
///
/// The share is per operation, not per item: within one operation the
/// items take the share in due order, so a cascade's root walks its
/// back-references with all of it before the members it entered start.
/// Shared per item, the root walked one or two rows a step while the
/// members behind it were purged, and each step's scan of the due index
/// started at the root's entry and passed the tombstone of every member
/// purged so far (P1 unset on fjall, 100k: 8 s → 178 s; see
/// `tests/tombstones.rs`, which runs with small steps for this).
pub fn process_work<S: StateRead + ?Sized>(state: &S, ctx: Ctx<'_>) -> Result<Step<WorkReport>, CoreError> {
    process_work_until(state, ctx, &always)
}

/// Lets a step go on whatever it has done (every caller but the node's
/// work step).
fn always() -> bool {
    true
}

/// [`process_work`], ended early when `may_go_on` says no: asked between
/// two items, and only once the step has done one, so every step makes
/// progress. The step ends at a consistent point, as one that ran out of
/// its item bounds does: what it did commits as usual and the items it
/// did not reach stay due. Also asked between two referrers of a walk
/// resumed from an earlier step's position, once the walk has acted on
/// one in this step: such a walk is counted again from its first row by
/// a full pass before its member can finish whatever this step does
/// (`step_deletion`), so a cut there only moves the position it stores,
/// and the next step resumes after it; no row behind it is read again
/// (`crates/cascade-core/tests/walk_stopped_at_its_time.rs`). A walk that
/// started in this step is not cut: if it ends in this step it is its own
/// full pass, and a cut would send it through one, a re-read of every
/// row (`tests/tombstones.rs` counts them); it stays bounded by the
/// step's referrer budget. So a root whose walk of a million referrers
/// is the step's one item (P1 unset) stops at its time too. The node asks its
/// clock: a step stops at its time target after the item in progress
/// (`writer/work_budget.rs`), so the one step in a hundred whose items
/// cost more than the bounds guessed no longer runs several times its
/// target while a client's small write waits for its end (issue 28).
/// `may_go_on` is the only input here that is not the state and `ctx`:
/// where a step ends changes how the work is cut into steps, never what
/// the steps do (`crates/cascade-core/tests/stopping_early.rs`).
pub fn process_work_until<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    may_go_on: &dyn Fn() -> bool,
) -> Result<Step<WorkReport>, CoreError> {
    let mut tx = Tx::new(state);
    let window = ctx.policy.batch_items.saturating_mul(WINDOW_FACTOR);
    let due = tx.due_work(ctx.now, window)?;
    let mut report = WorkReport {
        more: due.len() >= window,
        ..WorkReport::default()
    };
    let scheduled = round_robin(&tx, ctx, due, &mut report)?;
    let mut budget = ctx.policy.batch_budget;
    // Each operation's share, set when its first item comes: what is left
    // over the operations not yet given one (this one included).
    let mut unshared: BTreeSet<Option<OperationId>> = scheduled.iter().map(|(op, _)| *op).collect();
    let mut shares: BTreeMap<Option<OperationId>, usize> = BTreeMap::new();
    for (op, uid) in scheduled {
        if budget == 0 {
            report.more = true;
            break;
        }
        if report.items > 0 && !may_go_on() {
            report.more = true;
            report.stopped_early = true;
            break;
        }
        let share = shares.entry(op).or_insert_with(|| {
            let share = budget.div_ceil(unshared.len().max(1));
            unshared.remove(&op);
            share
        });
        if *share == 0 {
            // Its operation's share is spent: it stays due, for the next step.
            report.more = true;
            continue;
        }
        // An earlier item of this batch may have changed or removed it,
        // and the index's entry is all the window read of it.
        let Some(work) = tx.work(uid)? else {
            continue;
        };
        if work.next_attempt_at > ctx.now {
            continue;
        }
        report.items += 1;
        let mut item_budget = (*share).min(budget);
        let before = item_budget;
        let finished = step_deletion(&mut tx, ctx, work, &mut item_budget, &mut report, may_go_on)?;
        let spent = before - item_budget;
        budget -= spent;
        *share -= spent;
        if !finished {
            report.more = true;
        }
    }
    Ok(Step {
        value: report,
        writes: tx.finish(),
    })
}

/// Starts the work of deletions queued earlier in the same step (the
/// importer's, for the DELETING events it just applied), within one work
/// step's budget: the event and its local effect commit together, one
/// durable write instead of two. Whatever the budget leaves stays queued
/// and due, for the next work step.
pub(crate) fn start_queued_work<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    uids: &[Uid],
) -> Result<WorkReport, CoreError> {
    let mut report = WorkReport::default();
    let mut budget = ctx.policy.batch_budget;
    for &uid in uids {
        if budget == 0 {
            report.more = true;
            break;
        }
        let Some(work) = tx.work(uid)? else { continue };
        if work.next_attempt_at > ctx.now {
            continue;
        }
        report.items += 1;
        if !step_deletion(tx, ctx, work, &mut budget, &mut report, &always)? {
            report.more = true;
        }
    }
    Ok(report)
}

/// The first step of a deletion accepted in this very step, run at once:
/// the same [`step_deletion`] a work step would run, so a root that
/// nothing references (no back-reference, finalizer or lien: the caller
/// checks) is purged, or buried, or held by its operation's controls or
/// its principal's policy exactly as in its first work step.
///
/// Why: the work steps take due items in due order (`fairness.rs` shares a
/// step between the operations in a window of them), and a cascade of a
/// million makes items due faster than its steps finish them; a
/// one-resource delete accepted meanwhile came due behind that backlog.
/// Measured (`cascade-bench`, P1 at 1M, docs/BENCHMARKS.md, "a delete of
/// a leaf that ends in its own step"): the probe's one-resource deletes
/// were gone after 56–91 ms at p99 (up to 1.1 s at most) on the disk
/// engines before, 14–27 ms after.
pub(crate) fn finish_accepted<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    uid: Uid,
) -> Result<(), CoreError> {
    let Some(work) = tx.work(uid)? else {
        return Ok(());
    };
    if work.next_attempt_at > ctx.now {
        return Ok(());
    }
    let mut budget = ctx.policy.batch_budget;
    let mut report = WorkReport::default();
    // An unfinished step (it cannot be: nothing to walk) stays due, as
    // after any work step; the report's counts are in the writes.
    step_deletion(tx, ctx, work, &mut budget, &mut report, &always)?;
    Ok(())
}

/// Advances one deletion. Returns false when the budget ran out, or
/// `may_go_on` said no inside a resumed walk, before it got through its
/// back-references (its queue entry stays due, and the next step resumes
/// the walk where this one stopped: see [`Walk`]).
fn step_deletion<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    mut work: WorkItem,
    budget: &mut usize,
    report: &mut WorkReport,
    may_go_on: &dyn Fn() -> bool,
) -> Result<bool, CoreError> {
    let uid = work.target.uid;
    if is_remote(ctx, &work.target.name) {
        return step_remote_deletion(tx, ctx, work, budget, report);
    }
    // By the name the entry gives, checked against its uid (a uid names
    // one resource under one name): one read, not the uid index's and then
    // the resource's, for every deletion a step looks at.
    let resource = tx.incarnation(&work.target)?;
    if let Some(buried) = resource.as_ref().filter(|r| r.state == ResourceState::Deleted) {
        // A soft-deleted resource's entry is its expiry (see `bury`): a
        // purge is a change like a referrer's, counted in the step's budget.
        *budget = budget.saturating_sub(1);
        if expire(tx, ctx, buried.clone(), work)? {
            report.purged += 1;
        }
        return Ok(true);
    }
    let record = tx.deletion(uid)?;
    let (Some(resource), Some(record)) = (resource, record) else {
        // Stale entry: the incarnation is gone (or was never deleting).
        tx.remove_work(uid);
        return Ok(true);
    };
    if resource.state != ResourceState::Deleting {
        tx.remove_work(uid);
        return Ok(true);
    }
    let target = target_of(&resource);
    if paused(tx, record.operation)? {
        // Paused: nothing of it moves here, not even a purge; no attempt.
        defer(tx, ctx, work);
        return Ok(true);
    }
    // Only an operation's root can be deleted without cascade (nothing else
    // enters DELETING by it), and then its referrers lose the element.
    let (no_cascade, retain_ms) = tx
        .with_operation(record.operation, |op| (!op.cascade, op.retain_ms))?
        .unwrap_or((false, 0));
    // Owned here (once a step, not per referrer), so the record stays free
    // to change when the operation's controls let a held walk go on.
    let (requested_by, principal) = (record.requested_by.clone(), record.principal.clone());
    let deletion = Applied {
        target: &target,
        operation: record.operation,
        requested_by: &requested_by,
        principal: &principal,
        no_cascade,
        forced: record.forced.is_some(),
        retain_ms,
    };
    // The member itself first: a deletion its principal may no longer make
    // (the policy changed since it started, or the cascade reached a member
    // the principal may not delete) is held BLOCKED with the reason, before
    // its walk changes anything; a policy that allows it again, a retry or
    // an administrator's force (which acts on the administrator's authority)
    // lets it go on.
    if let Some(refusal) = refusal(ctx, &deletion, Verb::Delete, &resource.name) {
        if hold(tx, ctx, &resource, record, work, Vec::new(), &[refusal])? {
            report.retried += 1;
        }
        return Ok(true);
    }
    let mut refusals = Vec::new();
    let mut record = record;
    // Whether this step's walk saw every row, start to end, in this one
    // transaction (see `counted_in_this_step` below).
    let mut walked_whole = false;
    if !work.walk.finished {
        let fresh = work.walk.after.is_none() && work.walk.blocking == 0 && work.walk.remote.is_empty();
        // Only a walk that a full pass will count again anyway may stop
        // at its caller's word (see `process_work_until`): a fresh one
        // that ends in this step needs none, and a cut would force it.
        let may_stop = (!fresh).then_some(may_go_on);
        let end = resume_walk(
            tx,
            ctx,
            &deletion,
            &mut work.walk,
            budget,
            report,
            &mut refusals,
            may_stop,
        )?;
        if !matches!(end, WalkEnd::Held(_)) {
            clear_held(tx, ctx, &resource, &mut record)?;
        }
        match end {
            WalkEnd::Finished => walked_whole = fresh,
            WalkEnd::OutOfBudget => {
                requeue_unfinished(tx, ctx, work);
                return Ok(false);
            }
            WalkEnd::Stopped => {
                report.stopped_early = true;
                requeue_unfinished(tx, ctx, work);
                return Ok(false);
            }
            WalkEnd::Held(held) => {
                hold_spreading(tx, ctx, &resource, record, work, held, report)?;
                return Ok(true);
            }
        }
        work.walk.recount_at = ctx.now.plus_millis(ctx.policy.backoff_cap_ms);
    }
    // Past the last row. Only other regions' releases left to wait for, by
    // the counts: no need to read the rows again (see `Walk`).
    let counted_remote_only = work.walk.blocking == 0
        && resource.finalizers.is_empty()
        && resource.liens.is_empty()
        && work.walk.remote_left() > 0
        && ctx.now < work.walk.recount_at;
    // A walk that started and finished in this step read, in this same
    // transaction, every row the full pass would read, and acted on every
    // local row it could (each removed): what is left is what it counted.
    // The full pass would only read the same rows again (on an LSM engine,
    // first the tombstones of every row the walk removed: a tree's every
    // inner member paid for its referrers twice).
    let counted_in_this_step = walked_whole;
    let (blockers, waiting) = if counted_remote_only {
        (Vec::new(), work.walk.remote.clone())
    } else if counted_in_this_step {
        let blockers = list_blockers(tx, ctx, &deletion, &work.walk)?;
        (blockers, work.walk.remote.clone())
    } else {
        refusals.clear();
        let (counted, blockers) = match full_pass(tx, ctx, &deletion, budget, report, &mut refusals)? {
            PassEnd::Done(counted, blockers) => (counted, blockers),
            PassEnd::OutOfBudget => {
                requeue_unfinished(tx, ctx, work);
                return Ok(false);
            }
            PassEnd::Held(held) => {
                // The next look starts its walk from the first row again.
                work.walk = Walk::default();
                hold_spreading(tx, ctx, &resource, record, work, held, report)?;
                return Ok(true);
            }
        };
        work.walk.remote = counted.remote;
        work.walk.blocking = counted.blocking;
        work.walk.recount_at = ctx.now.plus_millis(ctx.policy.backoff_cap_ms);
        (blockers, work.walk.remote.clone())
    };
    if !blockers.is_empty() || !refusals.is_empty() || !resource.finalizers.is_empty() || !resource.liens.is_empty() {
        if hold(tx, ctx, &resource, record, work, blockers, &refusals)? {
            report.retried += 1;
        }
        return Ok(true);
    }
    if !waiting.is_empty() {
        note_reached(tx, record.operation, waiting.keys(), false)?;
        let reason = waiting
            .iter()
            .map(|(region, n)| format!("waiting on region {region} to release {n} reference(s)"))
            .collect::<Vec<_>>()
            .join("; ");
        // The counts' next full pass is the safety net (the owner's
        // periodic check heals lost releases); a release wakes it sooner.
        let retry_at = work.walk.recount_at;
        wait_for_regions(
            tx,
            ctx,
            &resource,
            record,
            work,
            waiting.into_keys().collect(),
            reason,
            retry_at,
        )?;
        return Ok(true);
    }
    // When this is the operation's root: what is still pending, and whether
    // the cascade reached other regions whose parts are not yet confirmed
    // finished. Looked at without a copy of the operation: this runs at
    // the end of every member's deletion.
    let as_root = tx
        .with_operation(record.operation, |op| {
            (op.root.uid == uid).then_some((op.progress.pending, !op.reached.is_empty() && !op.closure_confirmed))
        })?
        .flatten();
    // Whether the root itself is counted in `pending` (a failed one is not).
    let root_pending = u64::from(!matches!(record.status, DeletionStatus::Failed { .. }));
    if as_root.is_some_and(|(pending, _)| pending > root_pending) {
        // The root goes last; the purge or failure that leaves it alone wakes it.
        tx.remove_work(uid);
        if !matches!(record.status, DeletionStatus::Pending | DeletionStatus::Failed { .. }) {
            // Nothing holds it any more: it only waits for its closure.
            let mut record = record;
            let was_blocked = matches!(record.status, DeletionStatus::Blocked { .. });
            record.status = DeletionStatus::Pending;
            let op_id = record.operation;
            tx.put_deletion(record);
            if was_blocked {
                update_operation(tx, op_id, |p| decrement(&mut p.blocked, "blocked", op_id))?;
            }
        }
        return Ok(true);
    }
    if as_root.is_some_and(|(_, awaits_regions)| awaits_regions) {
        // The root of a cascade that reached other regions stays until
        // their parts are finished too (Kubernetes' foreground rule, across
        // regions): the node asks them, and confirms (see
        // `confirm_remote_closure`); until then it reads DELETING.
        let op_id = record.operation;
        let regions: Vec<String> = tx
            .with_operation(op_id, |op| op.reached.iter().cloned().collect())?
            .unwrap_or_default();
        let reason = format!(
            "its own region's part is done; waiting for the cascade to finish in {} (see operation {op_id})",
            regions.join(", "),
        );
        let retry_at = ctx.now.plus_millis(ctx.policy.closure_check_ms);
        wait_for_regions(tx, ctx, &resource, record, work, regions, reason, retry_at)?;
        report.awaiting_closure.push(op_id);
        return Ok(true);
    }
    purge(tx, ctx, resource, record)?;
    report.purged += 1;
    Ok(true)
}

/// Puts back an item whose step ran out of budget before it finished, due
/// now: behind the items that came due before it, not in front of them.
/// An entry left where it was stays the first of the due index while the
/// items after it finish and leave tombstones (on fjall), and every step's
/// scan of the index, starting at its first live entry, passes all of them
/// again (`tests/tombstones.rs`).
fn requeue_unfinished<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, ctx: Ctx<'_>, mut work: WorkItem) {
    work.next_attempt_at = work.next_attempt_at.max(ctx.now);
    tx.put_work(work);
}

/// How a walk of a deletion's back-references ended.
enum WalkEnd {
    /// Past the last row.
    Finished,
    /// The step's budget ran out first (`Walk` holds the position).
    OutOfBudget,
    /// Its caller's `may_go_on` said no between two referrers (`Walk`
    /// holds the position: the last row acted on or counted).
    Stopped,
    /// The operation's controls hold a referrer it would enter into
    /// deletion: the walk stopped just before that row.
    Held(Held),
}

/// Resumes the walk of a deletion's back-references where the last step
/// left it: acts on the local `cascade`, `unset` and `allow_dangling` rows
/// (each removes its row) and counts the rows that stay. A referrer the
/// deletion's principal may not update keeps its row, counted as blocking,
/// its refusal in `refusals`. Stops when the budget runs out (`walk` then
/// holds the position), or before a referrer the operation's controls do
/// not let it enter into deletion, or, given `may_stop`, before a
/// referrer it would change once it has changed one and `may_stop` says
/// no (the position is then the last row passed, within a page).
#[allow(clippy::too_many_arguments)]
fn resume_walk<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    deletion: &Applied<'_>,
    walk: &mut Walk,
    budget: &mut usize,
    report: &mut WorkReport,
    refusals: &mut Vec<String>,
    may_stop: Option<&dyn Fn() -> bool>,
) -> Result<WalkEnd, CoreError> {
    let resumed_at = walk.after.take();
    let mut pages = BackRefPages::resume(deletion.target.uid, resumed_at.clone());
    // The last row acted on or counted, kept whole: a held walk stops just
    // after it, and its key is built only then (not for every row, which
    // `apply_to_referrer` keys once already to drop it).
    let mut last_done: Option<BackRef> = None;
    // Referrers this call changed (or tried to): a stop is asked only
    // after the first, so every walk a step resumes moves on.
    let mut acted = 0usize;
    let finished = loop {
        if *budget == 0 {
            break false;
        }
        // A page is never larger than the budget left, so a walk stops
        // only between pages and its position is the last key returned.
        let Some(page) = pages.next_page(tx, (*budget).min(256))? else {
            break true;
        };
        let cascades_in_page = page.iter().filter(|b| b.on_delete == OnDelete::Cascade).count() as u64;
        let mut cascades_seen = 0u64;
        for b in page {
            let changes_referrer = match b.on_delete {
                OnDelete::Block => deletion.forced,
                OnDelete::Cascade | OnDelete::Unset => true,
                OnDelete::AllowDangling => false,
            } && !is_remote(ctx, &b.referrer.name);
            if changes_referrer {
                if acted > 0 && may_stop.is_some_and(|may_go_on| !may_go_on()) {
                    // Before this row, after the last one passed: the
                    // rows behind it are acted on or counted in `walk`.
                    walk.after = last_done.as_ref().map(BackRef::key).or(resumed_at);
                    walk.finished = false;
                    return Ok(WalkEnd::Stopped);
                }
                acted += 1;
            }
            if b.on_delete == OnDelete::Cascade {
                cascades_seen += 1;
            }
            match b.on_delete {
                OnDelete::Block if deletion.forced && is_remote(ctx, &b.referrer.name) => {
                    *walk.remote.entry(b.referrer.name.region().to_owned()).or_default() += 1;
                }
                OnDelete::Block if deletion.forced => {
                    *budget = budget.saturating_sub(1);
                    match apply_to_referrer(tx, ctx, deletion, &b, report, 0)? {
                        Acted::Done => {}
                        Acted::Refused(refused) => {
                            walk.blocking += 1;
                            refusals.push(refused);
                        }
                        Acted::Held(held) => {
                            walk.after = last_done.as_ref().map(BackRef::key).or(resumed_at);
                            walk.finished = false;
                            return Ok(WalkEnd::Held(held));
                        }
                    }
                }
                OnDelete::Block => walk.blocking += 1,
                OnDelete::AllowDangling => tx.remove_backref(b.key()),
                OnDelete::Cascade | OnDelete::Unset if is_remote(ctx, &b.referrer.name) => {
                    *walk.remote.entry(b.referrer.name.region().to_owned()).or_default() += 1;
                }
                OnDelete::Cascade | OnDelete::Unset => {
                    *budget = budget.saturating_sub(1);
                    let more = cascades_in_page - cascades_seen + 1;
                    match apply_to_referrer(tx, ctx, deletion, &b, report, more)? {
                        Acted::Done => {}
                        Acted::Refused(refused) => {
                            walk.blocking += 1;
                            refusals.push(refused);
                        }
                        Acted::Held(held) => {
                            // Stop before this row: the next look starts
                            // with it (nothing of it was changed).
                            walk.after = last_done.as_ref().map(BackRef::key).or(resumed_at);
                            walk.finished = false;
                            return Ok(WalkEnd::Held(held));
                        }
                    }
                }
            }
            last_done = Some(b);
        }
    };
    walk.after = pages.position().cloned();
    walk.finished = finished;
    Ok(if finished {
        WalkEnd::Finished
    } else {
        WalkEnd::OutOfBudget
    })
}

/// How a full pass over a deletion's back-references ended.
enum PassEnd {
    /// Its counts and the blockers to list.
    Done(Walk, Vec<Blocker>),
    /// The step's budget ran out first; the next step passes again.
    OutOfBudget,
    /// The operation's controls hold a referrer it would enter.
    Held(Held),
}

/// Reads every back-reference the deletion still has, from the first:
/// the truth its counts are checked against before it finishes or while
/// something holds it. It is the same walk from the start (a local row it
/// meets is acted on; none is expected, since nothing attaches to a
/// DELETING resource), and returns its counts and the blockers to list.
/// It ends early when the budget runs out, or when the operation's
/// controls hold a referrer.
fn full_pass<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    deletion: &Applied<'_>,
    budget: &mut usize,
    report: &mut WorkReport,
    refusals: &mut Vec<String>,
) -> Result<PassEnd, CoreError> {
    let mut counted = Walk::default();
    // Never stopped by its caller: a cut pass would start from the first
    // row again.
    match resume_walk(tx, ctx, deletion, &mut counted, budget, report, refusals, None)? {
        WalkEnd::Finished => {}
        WalkEnd::OutOfBudget | WalkEnd::Stopped => return Ok(PassEnd::OutOfBudget),
        WalkEnd::Held(held) => return Ok(PassEnd::Held(held)),
    }
    let blockers = list_blockers(tx, ctx, deletion, &counted)?;
    Ok(PassEnd::Done(counted, blockers))
}

/// The `block` rows to list as what holds a deletion whose walk counted
/// `counted.blocking` of them (none read when it counted none).
fn list_blockers<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    deletion: &Applied<'_>,
    counted: &Walk,
) -> Result<Vec<Blocker>, CoreError> {
    let mut blockers = Vec::new();
    if counted.blocking > 0 {
        for b in tx.blocking_backrefs(deletion.target.uid, ctx.policy.max_listed)? {
            let referrer_deleting = !is_remote(ctx, &b.referrer.name)
                && tx
                    .incarnation(&b.referrer)?
                    .is_some_and(|r| r.state == ResourceState::Deleting);
            blockers.push(Blocker {
                referrer: b.referrer.name,
                field: b.field,
                referrer_deleting,
            });
        }
    }
    Ok(blockers)
}

/// Records that an operation's part reached other regions. `changed`:
/// count it as a change of the part (a release from a region that acted on
/// the deletion: that region's part may have started after the root's
/// region last looked at it).
pub(crate) fn note_reached<'r, S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    id: OperationId,
    regions: impl IntoIterator<Item = &'r String>,
    changed: bool,
) -> Result<(), CoreError> {
    let Some(mut op) = tx.operation(id)? else {
        return Ok(());
    };
    let before = op.reached.len();
    op.reached.extend(regions.into_iter().cloned());
    let grew = op.reached.len() != before;
    if changed || grew {
        // A longer `reached` is a change of the part too: the closure
        // check's double collect relies on `changes` to see it (`closure`).
        op.changes += 1;
        tx.put_operation(op);
    }
    Ok(())
}

/// The root's region asked every other region for its part of the
/// operation twice in a row and saw no pending deletion and no change
/// between the two reads, and its own part (read before the first) had
/// `local_changes` changes. If its own part is still exactly that, there
/// was an instant when the whole cross-region closure was finished but
/// the root (every region's part was constant over an interval containing
/// it), and nothing can start new work for the operation after that: the
/// only resource of it left in DELETING is the root, whose referrers have
/// all released, and nothing attaches to a DELETING resource. So the root
/// may now be purged: this marks the operation and wakes the root.
/// Returns whether it confirmed.
pub fn confirm_remote_closure<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    id: OperationId,
    local_changes: u64,
) -> Result<Step<bool>, CoreError> {
    let mut tx = Tx::new(state);
    let Some(mut op) = tx.operation(id)? else {
        return Ok(Step {
            value: false,
            writes: WriteSet::default(),
        });
    };
    let unchanged = Step {
        value: false,
        writes: WriteSet::default(),
    };
    if op.changes != local_changes || op.closure_confirmed || op.root.name.region() != ctx.region.as_str() {
        return Ok(unchanged);
    }
    // Its own part must be the root alone, past its walk: DELETING, counted
    // pending unless it failed, and no referrer left to act on its event
    // (a release of one changes the part, see `peer::release`).
    let root = op.root.uid;
    let Some(record) = tx.deletion(root)? else {
        return Ok(unchanged);
    };
    let root_pending = u64::from(!matches!(record.status, DeletionStatus::Failed { .. }));
    let root_deleting = tx
        .resource_by_uid(root)?
        .is_some_and(|r| r.state == ResourceState::Deleting);
    if op.progress.pending != root_pending || !root_deleting || !tx.backrefs(root, None, 1)?.is_empty() {
        return Ok(unchanged);
    }
    op.closure_confirmed = true;
    tx.put_operation(op);
    wake_if_deleting(&mut tx, ctx, root)?;
    Ok(Step {
        value: true,
        writes: tx.finish(),
    })
}

/// The importer's side of a deletion in another region: cascade or unset
/// the local referrers (the mirror rows of the target), queueing a release
/// to the owner for each. Local `block` referrers need nothing here: the
/// owner's own row holds its deletion.
fn step_remote_deletion<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    mut work: WorkItem,
    budget: &mut usize,
    report: &mut WorkReport,
) -> Result<bool, CoreError> {
    let uid = work.target.uid;
    let Some(tombstone) = tx.remote_deletion(uid)? else {
        tx.remove_work(uid);
        return Ok(true);
    };
    if paused(tx, tombstone.operation)? {
        defer(tx, ctx, work);
        return Ok(true);
    }
    let requested_by = format!("region {}", tombstone.target.name.region());
    let mut refusals = Vec::new();
    // Resumed where the last step stopped, like the owner's walk (`Walk`):
    // the rows acted on so far are removed, tombstones in an LSM engine.
    let resumed_at = work.walk.after.take();
    let mut pages = BackRefPages::resume(uid, resumed_at.clone());
    // As in `resume_walk`: the last row passed, keyed only if held there.
    let mut last_done: Option<BackRef> = None;
    loop {
        if *budget == 0 {
            if !refusals.is_empty() {
                // The refused referrers are behind the position this step
                // would save, and nothing in the work item remembers
                // them: a step resumed there that reached the end with no
                // refusal of its own would end this region's part while
                // they still hold the target (and their releases never
                // went). So they end the step as at the end of the walk:
                // from the first row again, after a backoff.
                retry_refused(tx, ctx, work, &refusals);
                return Ok(true);
            }
            work.walk.after = pages.position().cloned();
            requeue_unfinished(tx, ctx, work);
            return Ok(false);
        }
        let Some(page) = pages.next_page(tx, (*budget).min(256))? else {
            break;
        };
        let cascades_in_page = page.iter().filter(|b| b.on_delete == OnDelete::Cascade).count() as u64;
        let mut cascades_seen = 0u64;
        for b in page {
            if b.on_delete == OnDelete::Cascade {
                cascades_seen += 1;
            }
            // A forced deletion's `block` referrers lose the reference too.
            let acted_on = match b.on_delete {
                OnDelete::Cascade | OnDelete::Unset => true,
                OnDelete::Block => tombstone.forced,
                OnDelete::AllowDangling => false,
            };
            if acted_on && !is_remote(ctx, &b.referrer.name) {
                *budget = budget.saturating_sub(1);
                let deletion = Applied {
                    target: &tombstone.target,
                    operation: tombstone.operation,
                    requested_by: &requested_by,
                    principal: &tombstone.principal,
                    no_cascade: tombstone.no_cascade,
                    forced: tombstone.forced,
                    retain_ms: tombstone.retain_ms,
                };
                let more = cascades_in_page - cascades_seen + 1;
                match apply_to_referrer(tx, ctx, &deletion, &b, report, more)? {
                    Acted::Done => {}
                    Acted::Refused(refused) => refusals.push(refused),
                    Acted::Held(held) => {
                        // Stop before this referrer; look again later,
                        // no attempt counted (a bound is not a failure).
                        // Refused referrers passed meanwhile keep their
                        // rows: the next look starts from the first row.
                        work.walk.after = if refusals.is_empty() {
                            last_done.as_ref().map(BackRef::key).or(resumed_at)
                        } else {
                            None
                        };
                        work.walk.finished = false;
                        work.next_attempt_at = held.retry_at;
                        work.last_error = Some(held.reason);
                        if let Some(lease) = held.lease {
                            report.budget_wanted.push(lease);
                        }
                        tx.put_work(work);
                        return Ok(true);
                    }
                }
            }
            last_done = Some(b);
        }
    }
    if !refusals.is_empty() {
        retry_refused(tx, ctx, work, &refusals);
        return Ok(true);
    }
    tx.remove_work(uid);
    if tombstone.purged {
        tx.remove_remote_deletion(uid);
    }
    after_pending_changed(tx, ctx, tombstone.operation)?;
    Ok(true)
}

/// The importer's walk passed referrers the deletion's principal may not
/// update: they keep their rows, so the owner's deletion waits for this
/// region's release (nothing dangles). The walk looks again from its first
/// row, with backoff, an attempt counted and the refusals as its last
/// error: a policy that allows it then, or the owner's force, lets it
/// finish. The only memory of a refusal is this restart (the importer's
/// `Walk` keeps no count of its refused rows), so every path that leaves
/// the walk with refusals passed ends here or starts again from the first
/// row (the `Held` one).
fn retry_refused<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, ctx: Ctx<'_>, mut work: WorkItem, refusals: &[String]) {
    work.attempts = work.attempts.saturating_add(1);
    work.walk = Walk::default();
    work.next_attempt_at = ctx.now.plus_millis(ctx.policy.backoff(work.attempts));
    work.last_error = Some(crate::error::name_refusals(refusals));
    tx.put_work(work);
}

/// Nothing blocks the deletion, but referrers in other regions have yet to
/// act on it. Their release wakes it; a late retry is only a safety net
/// (the owner's periodic check heals lost releases).
#[allow(clippy::too_many_arguments)]
fn wait_for_regions<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: &Resource,
    mut record: DeletionRecord,
    mut work: WorkItem,
    regions: Vec<String>,
    reason: String,
    retry_at: Timestamp,
) -> Result<(), CoreError> {
    let op = record.operation;
    let changed = !matches!(&record.status, DeletionStatus::Waiting { reason: r, .. } if r == &reason);
    if changed && !matches!(record.status, DeletionStatus::Failed { .. }) {
        let was_blocked = matches!(record.status, DeletionStatus::Blocked { .. });
        record.status = DeletionStatus::Waiting {
            regions: regions.clone(),
            reason,
        };
        tx.put_deletion(record);
        tx.put_outcome(
            op,
            Outcome {
                resource: target_of(resource),
                action: OutcomeAction::Waiting { regions },
                time: ctx.now,
            },
        );
        if was_blocked {
            update_operation(tx, op, |p| decrement(&mut p.blocked, "blocked", op))?;
        }
    }
    work.attempts = 0;
    work.next_attempt_at = retry_at;
    tx.put_work(work);
    Ok(())
}

/// The deletion whose effect [`apply_to_referrer`] applies.
#[derive(Clone, Copy)]
struct Applied<'a> {
    target: &'a RefTarget,
    operation: OperationId,
    requested_by: &'a str,
    /// Whom it acts for: every change to a member is authorized for it.
    principal: &'a Principal,
    /// The request did not allow a cascade (`cascade = false`).
    no_cascade: bool,
    /// An administrator forced it through: `block` referrers lose the
    /// reference (like `unset` ones) instead of holding the deletion.
    forced: bool,
    /// The operation's retention (see [`Operation::retain_ms`]): a part
    /// this step starts in another region keeps it.
    retain_ms: u64,
}

/// What [`apply_to_referrer`] did.
enum Acted {
    /// Cascaded, unset, or nothing to do.
    Done,
    /// The deletion's principal may not change it (the refusal): it keeps
    /// its reference and its row.
    Refused(String),
    /// The operation's controls do not let it enter deletion now: nothing
    /// of it or its row changed.
    Held(Held),
}

/// Applies the deletion of `target` to one referrer: cascade or unset.
///
/// Without cascade (`no_cascade`) a `cascade` referrer is never deleted: it
/// loses the element like an `unset` one, even its last (the acceptance
/// check refuses that case when it can see it; two such deletes of a list
/// owner's last two owners can still race, across regions especially, and
/// then the referrer survives, emptied, rather than being deleted by an
/// operation that did not allow it: invariant 3).
///
/// The change is authorized for the deletion's principal first, under this
/// region's policy: a referrer it deletes needs `delete`, one it unsets or
/// orphans `update`. A referrer it may not delete still enters DELETING
/// (so the target is not held by it), and its own step holds it BLOCKED
/// with the refusal before anything else of it changes (see
/// [`step_deletion`]). A referrer it may not update is left as it is, its
/// row in place: the refusal is returned and holds the target instead.
fn apply_to_referrer<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    deletion: &Applied<'_>,
    b: &BackRef,
    report: &mut WorkReport,
    more: u64,
) -> Result<Acted, CoreError> {
    let Applied {
        target,
        operation,
        requested_by,
        principal,
        no_cascade,
        forced: _,
        retain_ms,
    } = *deletion;
    // A referrer the cascade would enter into deletion needs the
    // operation's leave first (budget, rate, not cancelled): without it,
    // nothing of the referrer or its row changes.
    if b.on_delete == OnDelete::Cascade && !no_cascade && has_controls(tx, operation)? {
        if let Some(referrer) = tx.incarnation(&b.referrer)? {
            let holds: Vec<Uid> = referrer
                .refs
                .get(&b.field)
                .map(|ts| ts.iter().map(|t| t.uid).collect())
                .unwrap_or_default();
            let emptied = !holds.is_empty() && holds.iter().all(|&u| u == target.uid);
            if referrer.state == ResourceState::Active && emptied {
                if let Some(held) = admit(tx, ctx, operation, more)? {
                    return Ok(Acted::Held(held));
                }
            }
        }
    }
    let checked = !deletion.forced && !ctx.authorizer.allows_everything();
    let mut delete_refused = false;
    if checked {
        if let Some(referrer) = tx.incarnation(&b.referrer)? {
            let holds: Vec<Uid> = referrer
                .refs
                .get(&b.field)
                .map(|ts| ts.iter().map(|t| t.uid).collect())
                .unwrap_or_default();
            if referrer.state == ResourceState::Active && holds.contains(&target.uid) {
                let emptied = holds.iter().all(|&u| u == target.uid);
                let deletes = b.on_delete == OnDelete::Cascade && emptied && !no_cascade;
                let verb = if deletes { Verb::Delete } else { Verb::Update };
                if let Some(refused) = refusal(ctx, deletion, verb, &referrer.name) {
                    if !deletes {
                        return Ok(Acted::Refused(refused));
                    }
                    delete_refused = true;
                }
            }
        }
    }
    if is_remote(ctx, &b.target.name) {
        // The importer's walk: the owner learns of it by a queued release.
        release_ref(tx, ctx, b)?;
    } else {
        // The owner's walk of the deletion whose own step this is: only the
        // row goes. `release_ref` would also wake this deletion and forget
        // the row in its stored walk, and `step_deletion` overwrites both
        // with the queue entry it puts or removes on every path (a clone of
        // the target's record and two of its queue entry per referrer).
        debug_assert_eq!(b.target.uid, target.uid, "a walk acts on its own target's rows");
        tx.remove_backref(b.key());
    }
    let Some(mut referrer) = tx.incarnation(&b.referrer)? else {
        return Ok(Acted::Done); // the referrer is gone: the back-reference was stale
    };
    if referrer.state == ResourceState::Creating {
        // Its create has not been confirmed yet: the create fails instead.
        abort_creating(tx, ctx, referrer)?;
        return Ok(Acted::Done);
    }
    if referrer.state != ResourceState::Active {
        return Ok(Acted::Done);
    }
    let Some(targets) = referrer.refs.get_mut(&b.field) else {
        return Ok(Acted::Done);
    };
    let before = targets.len();
    // A target kept DELETED can be undeleted: what the field held is kept
    // with the outcome, in this same step (copied only then: this is the
    // hot path of an unset).
    let kept = ctx.schema.retain_ms(target.name.kind()).max(retain_ms) > 0;
    let old_targets = kept.then(|| targets.clone());
    targets.retain(|t| t.uid != target.uid);
    if targets.len() == before {
        return Ok(Acted::Done);
    }
    let emptied = targets.is_empty();
    if emptied {
        referrer.refs.remove(&b.field);
    }
    ensure_operation_part(tx, ctx, operation, target, !no_cascade, principal, retain_ms)?;
    if b.on_delete == OnDelete::Cascade && emptied && !no_cascade {
        let reason = DeletionReason::Cascade {
            from: target.name.clone(),
            field: b.field.clone(),
        };
        if let Some(old_targets) = old_targets {
            // Kept with a retention: the member keeps the reference that
            // cascaded it (its row is gone all the same, and leaving the
            // live state releases nothing twice: the release of an absent
            // row is a no-op), so that its record holds every reference an
            // Undelete re-attaches.
            referrer.refs.insert(b.field.clone(), old_targets);
        }
        report.cascaded += 1;
        if checked && !delete_refused {
            audit_change(tx, ctx, deletion, &referrer.name, "cascade", Verb::Delete);
        }
        if !delete_refused && unset_in_this_step(tx, ctx, deletion, &referrer, report)? {
            purge_leaf(tx, ctx, referrer, reason, operation)?;
            report.purged += 1;
        } else {
            // Refused: DELETING, and its own step holds it BLOCKED.
            enter_deleting(tx, ctx, referrer, reason, operation, requested_by, principal)?;
        }
        return Ok(Acted::Done);
    }
    referrer.update_time = ctx.now;
    let message = if b.on_delete == OnDelete::Cascade && emptied {
        format!(
            "{} cleared: {} is being deleted without cascade, so this resource is kept",
            b.field, target.name
        )
    } else {
        format!("{} cleared: {} is being deleted", b.field, target.name)
    };
    let unset = target_of(&referrer);
    let revision = put_and_announce(tx, ctx, referrer, EventType::Updated, Some(operation), message, None)?;
    if checked {
        let action = if b.on_delete == OnDelete::Cascade {
            "orphan"
        } else {
            "unset"
        };
        audit_change(tx, ctx, deletion, &unset.name, action, Verb::Update);
    }
    // With the revision an Undelete requires the referrer still to have.
    let undo = old_targets.map(|old_targets| UnsetUndo { old_targets, revision });
    tx.put_outcome(
        operation,
        Outcome {
            resource: unset,
            action: OutcomeAction::Unset {
                field: b.field.clone(),
                undo,
            },
            time: ctx.now,
        },
    );
    update_operation(tx, operation, |p| p.unset += 1)?;
    report.unset += 1;
    Ok(Acted::Done)
}

/// The most `unset` referrers a member a cascade reaches may have and still
/// be purged in the step that reached it ([`unset_in_this_step`]): a bound
/// on what one row of a walk may cost.
pub const UNSET_IN_THE_SAME_STEP: usize = 4;

/// Whether `member`, which the deletion `parent` cascades to, ends in this
/// step: nothing holds it (no finalizer, no lien) and every row of its
/// back-references, at most [`UNSET_IN_THE_SAME_STEP`], is a local `unset`
/// referrer's, which this applies here, as the member's own walk would.
/// Then it is an unreferenced leaf, and the caller purges it. Not with a
/// retention in play, nor for a referrer the same walk will delete (both
/// below).
///
/// Passing through DELETING would cost the member a record, a queue entry,
/// an event and a step of its own for a walk that does what this does
/// (issue 28: a port with a floating IP, the unset shape, wrote 15 keys per
/// deleted resource). Nothing outside this region can be waiting for it
/// (an importer, a `block` referrer or a finalizer's controller would keep
/// it on the DELETING path), and the walk's changes and the purge land in
/// one batch, so no reader sees a referrer cleared for a member still
/// alive. A row the principal may not change (a refusal) stops it: the
/// member then enters DELETING, whose own step holds it BLOCKED as before,
/// with the rows already applied gone.
fn unset_in_this_step<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    parent: &Applied<'_>,
    member: &Resource,
    report: &mut WorkReport,
) -> Result<bool, CoreError> {
    if !member.finalizers.is_empty() || !member.liens.is_empty() {
        return Ok(false);
    }
    let rows = tx.backrefs(member.uid, None, UNSET_IN_THE_SAME_STEP + 1)?;
    if rows.is_empty() {
        return Ok(true);
    }
    let local_unsets = rows.len() <= UNSET_IN_THE_SAME_STEP
        && rows.iter().all(|b| {
            b.on_delete == OnDelete::Unset && b.referrer.uid != member.uid && !is_remote(ctx, &b.referrer.name)
        });
    // A referrer this operation may delete later, with a retention, would
    // be buried without the reference cleared here, and an Undelete would
    // bring it back without it (the member's own step, later, leaves a
    // referrer that is no longer live alone). So no retention may be in
    // play, and no referrer may hold the deletion's own target through a
    // `cascade` field: this walk deletes it a few rows on, and it would
    // first be cleared for nothing (`UPDATED`, then `PURGED`).
    if !local_unsets || parent.retain_ms > 0 || rows.iter().any(|b| ctx.schema.retain_ms(b.referrer.name.kind()) > 0) {
        return Ok(false);
    }
    let parent_kind = parent.target.name.kind();
    for row in &rows {
        // Read only when its kind can hold one (the schema says so): a
        // floating IP, referring to its port alone, is not read twice.
        let may_cascade_from_the_parent = ctx.schema.kind(row.referrer.name.kind()).is_some_and(|spec| {
            spec.refs
                .values()
                .any(|r| r.on_delete == OnDelete::Cascade && r.kind == parent_kind)
        });
        if !may_cascade_from_the_parent {
            continue;
        }
        let cascades_with_the_member = tx.incarnation(&row.referrer)?.is_some_and(|referrer| {
            referrer.refs.iter().any(|(field, targets)| {
                ctx.schema
                    .reference(referrer.kind(), field)
                    .is_some_and(|spec| spec.on_delete == OnDelete::Cascade)
                    && targets.iter().any(|t| t.uid == parent.target.uid)
            })
        });
        if cascades_with_the_member {
            return Ok(false);
        }
    }
    let target = target_of(member);
    // The deletion the member's own record would hold (`enter_deleting`):
    // the parent's operation, requester and principal, not forced.
    let deletion = Applied {
        target: &target,
        forced: false,
        ..*parent
    };
    for row in &rows {
        if !matches!(apply_to_referrer(tx, ctx, &deletion, row, report, 1)?, Acted::Done) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Why the deletion's principal may not `verb` the member `name` under this
/// region's policy, for a human (the BLOCKED reason `cascade explain`
/// shows); None when it may, when nobody is asked (a policy that allows
/// everything) or when an administrator forced the deletion through.
fn refusal(ctx: Ctx<'_>, deletion: &Applied<'_>, verb: Verb, name: &crate::name::ResourceName) -> Option<String> {
    if deletion.forced || ctx.authorizer.allows_everything() {
        return None;
    }
    let decision = ctx.authorizer.decide(deletion.principal, verb, Target::Resource(name));
    (!decision.allowed).then(|| {
        format!(
            "{}{} may not {verb} {name} (rule {:?})",
            crate::explain::REFUSED_BY_POLICY,
            deletion.principal.id,
            decision.rule
        )
    })
}

/// The audit entry of a change the cascade made to a member for the
/// deletion's principal, in the step that made it: who (the principal),
/// the action (`cascade`, `unset`, `orphan`), the member, the rule that
/// allowed it. Its id is derived from the step's time, the member and the
/// deletion (the core mints no ids in a work step), time-ordered like the
/// shell's UUID v7 ids, and distinct per member and action.
fn audit_change<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    deletion: &Applied<'_>,
    member: &crate::name::ResourceName,
    action: &str,
    verb: Verb,
) {
    use crate::limits::{cut_stored, MAX_AUDIT_ACTION_BYTES, MAX_AUDIT_TARGET_BYTES, MAX_AUDIT_WHO_BYTES};
    let rule = ctx
        .authorizer
        .decide(deletion.principal, verb, Target::Resource(member))
        .rule;
    let principal = deletion.principal;
    tx.put_audit(AuditEntry {
        id: audit_id(ctx.now, deletion.target.uid, member, action),
        time: ctx.now,
        who: cut_stored(&principal.id, MAX_AUDIT_WHO_BYTES),
        action: cut_stored(action, MAX_AUDIT_ACTION_BYTES),
        target: cut_stored(member.as_str(), MAX_AUDIT_TARGET_BYTES),
        reason: format!(
            "operation {}: cascade from {}",
            deletion.operation, deletion.target.name
        ),
        outcome: "ok".to_owned(),
        groups: principal.groups.clone(),
        via: principal.via.as_str().to_owned(),
        node: String::new(),
        through: deletion.target.name.region().to_owned(),
        rule,
    });
}

/// A UUID v7 layout: the step's milliseconds, then bits of a hash of the
/// deletion's target, the member and the action (FNV-1a: stable across
/// builds, unlike std's hasher).
fn audit_id(now: Timestamp, target: Uid, member: &crate::name::ResourceName, action: &str) -> Uid {
    let mut hash: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for byte in target
        .as_bytes()
        .iter()
        .chain(member.as_str().as_bytes())
        .chain(action.as_bytes())
    {
        hash ^= u128::from(*byte);
        hash = hash.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
    }
    let mut bytes = hash.to_be_bytes();
    bytes[..6].copy_from_slice(&now.0.to_be_bytes()[2..]);
    bytes[6] = 0x70 | (bytes[6] & 0x0f);
    bytes[8] = 0x80 | (bytes[8] & 0x3f);
    Uid(uuid::Uuid::from_bytes(bytes))
}

/// A cascade that reaches this region from another one reports into the
/// same operation id: this region keeps its part of the operation.
fn ensure_operation_part<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    operation: OperationId,
    root: &RefTarget,
    cascade: bool,
    principal: &Principal,
    retain_ms: u64,
) -> Result<(), CoreError> {
    // Asked once per referrer: a look, not a copy of the operation.
    let adopt = tx.with_operation(operation, |op| {
        // A part the root's region created before the cascade came (a
        // bounded operation's registration, a pause): it takes the
        // cascade's principal and retention with its first member.
        op.progress == Progress::default()
            && (op.principal != *principal || op.retain_ms != retain_ms || op.cascade != cascade)
    })?;
    if adopt == Some(true) {
        if let Some(op) = tx.operation_mut(operation)? {
            op.principal = principal.clone();
            op.cascade = cascade;
            op.retain_ms = retain_ms;
        }
        return Ok(());
    }
    if adopt.is_none() {
        tx.put_operation(Operation {
            id: operation,
            root: root.clone(),
            requested_by: format!("region {}", root.name.region()),
            cascade,
            state: OperationState::Running,
            progress: Progress::default(),
            create_time: ctx.now,
            end_time: None,
            reached: BTreeSet::new(),
            changes: 0,
            closure_confirmed: false,
            controls: None,
            undelete: None,
            principal: principal.clone(),
            retain_ms,
        });
    }
    Ok(())
}
