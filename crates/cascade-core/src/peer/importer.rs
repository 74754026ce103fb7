//! The importer's half of the cross-region protocol: what a region does
//! with another region's DELETING and PURGED events, a resync after the
//! owner compacted its outbox, the settling of a resource whose references
//! reach other regions (CREATING → ACTIVE, or removed), and its answers to
//! the owner's questions (which rows still stand, which list owners keep
//! another target).

use std::collections::BTreeMap;

use crate::error::{CoreError, StorageError};
use crate::model::{
    BackRefKey, EventType, PendingAttach, RefTarget, RemoteDeletion, RemoteEvent, Resource, ResourceState, WorkItem,
};
use crate::protocol::{self, Ctx, Step};
use crate::state::{StateRead, Tx};
use crate::{OperationId, ResourceName, Uid};

use super::is_remote;

/// Importer: does each back-reference still stand here? A referrer that is
/// ACTIVE or CREATING and holds the target in the field does.
pub fn standing<S: StateRead + ?Sized>(state: &S, keys: &[BackRefKey]) -> Result<Vec<bool>, StorageError> {
    let tx = Tx::new(state);
    keys.iter()
        .map(|k| {
            Ok(tx.resource_by_uid(k.referrer)?.is_some_and(|r| {
                matches!(r.state, ResourceState::Active | ResourceState::Creating)
                    && r.refs
                        .get(&k.field)
                        .is_some_and(|ts| ts.iter().any(|t| t.uid == k.target))
            }))
        })
        .collect()
}

/// Importer, asked by an owner about to accept a delete without cascade:
/// for each back-reference, does its referrer (a list owner here) keep a
/// live target other than the one to be deleted in that field? Only then
/// does losing this one not delete it (see `protocol::delete`).
pub fn keeps_another_target<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    keys: &[BackRefKey],
) -> Result<Vec<bool>, CoreError> {
    let tx = Tx::new(state);
    keys.iter()
        .map(|k| match tx.resource_by_uid(k.referrer)? {
            Some(r) if r.state == ResourceState::Active => {
                protocol::keeps_live_other_target(&tx, ctx, &r, &k.field, k.target)
            }
            _ => Ok(false),
        })
        .collect()
}

/// What [`apply_remote_events`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppliedEvents {
    /// Events that changed anything here besides the cursor.
    pub applied: usize,
    /// Whether the step's writes claim anything, so that they must be
    /// durable before anything leaves the node on their strength. False
    /// when the batch only moved the cursor, removed the tombstone and
    /// queue entry of deletions their owner purged, or marked a tombstone
    /// purged: a crash that loses such writes loses the cursor move with
    /// them, so the owner sends the same events again and they are applied
    /// again, to the same effect (a PURGED without a tombstone does
    /// nothing). Nothing else here depends on them: a removed tombstone
    /// only stops refusing references to a uid its owner no longer has.
    /// Why it matters: in P3 (50 regions) most events an importer applies
    /// are PURGED events of resources nothing here references (every leaf
    /// another region purges), and each was an fsync of its own.
    pub needs_flush: bool,
}

/// Importer: applies a batch of the owner's outbox events, in order, and
/// advances the cursor of `from_region` in the same step. Events at or
/// below the cursor were applied before and are skipped.
pub fn apply_remote_events<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    from_region: &str,
    events: Vec<RemoteEvent>,
) -> Result<Step<AppliedEvents>, CoreError> {
    let mut tx = Tx::new(state);
    let mut cursor = tx.cursor(from_region)?;
    let mut applied = 0;
    let mut needs_flush = false;
    let mut started = Vec::new();
    for e in events {
        if e.revision <= cursor {
            continue;
        }
        cursor = e.revision;
        if e.resource.name.region() != from_region {
            continue; // an owner only speaks for its own resources
        }
        let uid = e.resource.uid;
        match e.event_type {
            // Seen before (a replay): nothing to add.
            EventType::Deleting if tx.remote_deletion(uid)?.is_some() => {}
            EventType::Deleting => {
                let Some(operation) = e.operation else { continue };
                tx.put_remote_deletion(RemoteDeletion {
                    target: e.resource.clone(),
                    operation,
                    seen_at: ctx.now,
                    purged: false,
                    no_cascade: e.no_cascade,
                    forced: false,
                    principal: e.principal,
                    // A peer's retention keeps members here no longer
                    // than this region allows.
                    retain_ms: e.retain_ms.min(ctx.policy.max_retention_ms),
                });
                started.push(uid);
                tx.put_work(WorkItem::due_now(e.resource, ctx.now));
                applied += 1;
                needs_flush = true;
            }
            EventType::DeletionForced => {
                let Some(operation) = e.operation else { continue };
                let retain_ms = e.retain_ms.min(ctx.policy.max_retention_ms);
                if force_tombstone(
                    &mut tx,
                    ctx,
                    e.resource,
                    operation,
                    e.no_cascade,
                    e.principal,
                    retain_ms,
                )? {
                    started.push(uid);
                    applied += 1;
                    needs_flush = true;
                }
            }
            // A soft-deleted resource is gone for another region: its owner
            // refuses any new reference to it (as to a DELETING one).
            EventType::Purged | EventType::SoftDeleted => {
                // The owner purged it once every referrer released; local
                // mirror rows can only remain if our walk of its deletion is
                // still to come (both events in one batch): let it run.
                // Whether the walk is still to come is whether its work
                // item is still queued: a mirror row alone does not say so,
                // since the walk leaves `block` rows (and a CREATING
                // referrer's) in place, and a tombstone kept for a walk
                // that already ran would never be removed (simulation seed
                // 869).
                let queued = tx.work(uid)?.is_some();
                let walk_pending = queued && !tx.backrefs(uid, None, 1)?.is_empty();
                match tx.remote_deletion(uid)? {
                    Some(mut tombstone) if walk_pending => {
                        tombstone.purged = true;
                        tx.put_remote_deletion(tombstone);
                    }
                    // Nothing here references it (a leaf purged at its
                    // owner): nothing to remove.
                    None if !queued => continue,
                    tombstone => {
                        tx.remove_remote_deletion(uid);
                        tx.remove_work(uid);
                        if let Some(t) = tombstone {
                            needs_flush |= finish_part(&mut tx, ctx, t.operation)?;
                        }
                    }
                }
                applied += 1;
            }
            _ => {}
        }
    }
    tx.set_cursor(from_region, cursor);
    // Act on the local referrers in this same step (up to one work step's
    // budget): a leaf referrer is purged in the commit that records the
    // event, with no second write and fsync before other regions see it.
    protocol::start_queued_work(&mut tx, ctx, &started)?;
    Ok(Step {
        value: AppliedEvents { applied, needs_flush },
        writes: tx.finish(),
    })
}

/// Importer: the owner's watch passed through `revision` without an event
/// that concerns this region (a progress mark: `Event::concerns_importers`
/// says which it leaves out), so the cursor of `from_region` moves there.
/// Nothing else changes, and the step needs no flush: a crash that loses
/// it has the owner pass over the same events again. Returns whether the
/// cursor moved (a mark at or below it is a replay).
pub fn pass_through<S: StateRead + ?Sized>(
    state: &S,
    from_region: &str,
    revision: crate::model::Revision,
) -> Result<Step<bool>, CoreError> {
    let mut tx = Tx::new(state);
    let moved = revision > tx.cursor(from_region)?;
    if moved {
        tx.set_cursor(from_region, revision);
    }
    Ok(Step {
        value: moved,
        writes: tx.finish(),
    })
}

/// The owner forced a deletion through: the tombstone says so (made now
/// if this node never saw the DELETING event), and the walk of the local
/// referrers starts again from the first row, so the `block` referrers the
/// first walk left in place lose the reference too. Returns whether
/// anything changed (false for a replay).
fn force_tombstone<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    target: RefTarget,
    operation: OperationId,
    no_cascade: bool,
    principal: crate::auth::Principal,
    retain_ms: u64,
) -> Result<bool, CoreError> {
    let tombstone = match tx.remote_deletion(target.uid)? {
        Some(t) if t.forced => return Ok(false),
        Some(t) => RemoteDeletion { forced: true, ..t },
        None => RemoteDeletion {
            target: target.clone(),
            operation,
            seen_at: ctx.now,
            purged: false,
            no_cascade,
            forced: true,
            principal,
            retain_ms,
        },
    };
    tx.put_remote_deletion(tombstone);
    tx.put_work(WorkItem::due_now(target, ctx.now));
    Ok(true)
}

/// A resource of another region in DELETING, as its owner lists it for a
/// resync (see [`resync`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteDeleting {
    /// The owner's DELETING resource.
    pub target: RefTarget,
    /// The operation deleting it.
    pub operation: OperationId,
    /// See [`RemoteDeletion::no_cascade`].
    pub no_cascade: bool,
    /// See [`RemoteDeletion::forced`].
    pub forced: bool,
    /// See [`RemoteDeletion::principal`]: the owner lists it with the
    /// deletion, so a deletion learnt from a resync acts for whom its
    /// missed DELETING event would have (an owner that lists none gives
    /// the anonymous principal, whom a policy may refuse: its members here
    /// are then held BLOCKED until an administrator retries or forces them).
    pub principal: crate::auth::Principal,
    /// See [`RemoteDeletion::retain_ms`] (0 from an owner that lists none).
    pub retain_ms: u64,
}

/// Importer: the owner compacted its outbox past this node's cursor. The
/// owner's listing of its DELETING resources that this region references
/// replaces the missed events: tombstones and work for those, tombstones of
/// the others dropped (they were purged meanwhile), the cursor moved to the
/// listing's revision.
pub fn resync<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    from_region: &str,
    deleting: Vec<RemoteDeleting>,
    revision: crate::model::Revision,
) -> Result<Step<usize>, CoreError> {
    let mut tx = Tx::new(state);
    let listed: std::collections::BTreeSet<Uid> = deleting.iter().map(|d| d.target.uid).collect();
    for old in tx.remote_deletions_of(from_region)? {
        if !listed.contains(&old.target.uid) {
            tx.remove_remote_deletion(old.target.uid);
            tx.remove_work(old.target.uid);
            finish_part(&mut tx, ctx, old.operation)?;
        }
    }
    let mut added = 0;
    for RemoteDeleting {
        target,
        operation,
        no_cascade,
        forced,
        principal,
        retain_ms,
    } in deleting
    {
        if target.name.region() != from_region {
            continue;
        }
        if forced {
            // A forced deletion whose DELETION_FORCED event was compacted
            // away: the same as applying it.
            let retain_ms = retain_ms.min(ctx.policy.max_retention_ms);
            added += usize::from(force_tombstone(
                &mut tx, ctx, target, operation, no_cascade, principal, retain_ms,
            )?);
            continue;
        }
        if tx.remote_deletion(target.uid)?.is_some() {
            continue;
        }
        tx.put_remote_deletion(RemoteDeletion {
            target: target.clone(),
            operation,
            seen_at: ctx.now,
            purged: false,
            no_cascade,
            forced: false,
            principal,
            retain_ms: retain_ms.min(ctx.policy.max_retention_ms),
        });
        tx.put_work(WorkItem::due_now(target, ctx.now));
        added += 1;
    }
    tx.set_cursor(from_region, revision);
    Ok(Step {
        value: added,
        writes: tx.finish(),
    })
}

/// Importer: the outcome of the owners' attach of a resource's pending
/// cross-region references (`keys`, as the request read them).
///
/// - Success confirms those keys. A CREATING resource becomes ACTIVE once
///   nothing is pending, unless a target was reported DELETING meanwhile.
/// - Failure removes a CREATING resource (releases queued for whatever was
///   attached) and takes the refused references back from an ACTIVE one.
///
/// The step's writes apply either way; the value is the call's answer.
pub fn settle<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    name: &ResourceName,
    uid: Uid,
    keys: &[BackRefKey],
    attached: Result<(), CoreError>,
) -> Result<Step<Result<Resource, CoreError>>, CoreError> {
    let step = settle_batch(state, ctx, vec![(name.clone(), uid, keys.to_vec())], attached)?;
    Ok(Step {
        value: step.value.map(|mut v| v.remove(0)),
        writes: step.writes,
    })
}

/// [`settle`] for the members of one create, all or nothing, in one step:
/// if any owner refused, or any member's target was reported DELETING
/// meanwhile, every CREATING member is removed.
pub fn settle_batch<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    members: Vec<(ResourceName, Uid, Vec<BackRefKey>)>,
    attached: Result<(), CoreError>,
) -> Result<Step<Result<Vec<Resource>, CoreError>>, CoreError> {
    let mut tx = Tx::new(state);
    let first_name = members.first().map(|m| m.0.clone());
    let aborted = |name: Option<ResourceName>| match name {
        Some(name) => CoreError::CreateAborted {
            name,
            reason: "a resource it references was deleted meanwhile".into(),
        },
        None => CoreError::invalid("resources", "nothing to settle"),
    };
    // Each member read once, by the name it was created under (a uid names
    // one resource for ever, so this is the read by uid without the uid
    // index): P5's profile had the settle reading every member four times
    // (by uid, twice) and every member's remote target once more.
    let mut current = Vec::with_capacity(members.len());
    for (name, uid, _) in &members {
        current.push(tx.resource(name)?.filter(|r| r.uid == *uid));
    }
    // The failure that decides for the whole batch, if any.
    let mut failure = attached.err();
    if failure.is_none() {
        // Targets seen DELETING here, asked once each (a batch's members
        // mostly reference the same few targets).
        let mut tombstoned: BTreeMap<Uid, bool> = BTreeMap::new();
        for ((_, uid, _), r) in members.iter().zip(&current) {
            if let Some(r) = r {
                if r.state == ResourceState::Creating {
                    if let Some((field, target)) = deleting_target(&tx, r, &mut tombstoned)? {
                        failure = Some(CoreError::TargetDeleting {
                            field: format!("refs.{field}"),
                            target,
                        });
                        break;
                    }
                }
            } else if tx.pending_attach(*uid)?.is_none() {
                // Gone meanwhile (a cascade from a deleted target aborted it).
                failure = Some(aborted(first_name.clone()));
                break;
            }
        }
    }
    if let Some(e) = failure {
        for (_, uid, keys) in members.iter().rev() {
            let Some(r) = tx.resource_by_uid(*uid)? else { continue };
            match r.state {
                ResourceState::Creating => protocol::abort_creating(&mut tx, ctx, r)?,
                ResourceState::Active => {
                    if let Some(mut pending) = tx.pending_attach(*uid)? {
                        pending.keys.retain(|k| !keys.contains(k));
                        store_pending(&mut tx, pending);
                    }
                    protocol::revert_references(&mut tx, ctx, r, keys, &e.to_string())?;
                }
                ResourceState::Deleting | ResourceState::Deleted => {}
            }
        }
        return Ok(Step {
            value: Err(e),
            writes: tx.finish(),
        });
    }
    let mut out = Vec::with_capacity(members.len());
    for ((_, uid, keys), resource) in members.iter().zip(current) {
        // Read before this loop wrote anything: the loop writes only the
        // member it is at, so the read still holds.
        let Some(resource) = resource else {
            return Ok(Step {
                value: Err(aborted(first_name)),
                writes: tx.finish(),
            });
        };
        // A sibling is read through this step's writes: the members come
        // targets first, so one activated above reads ACTIVE here.
        let waits_for_sibling = resource.refs.values().flatten().any(|t| {
            !is_remote(ctx, &t.name)
                && matches!(tx.resource_by_uid(t.uid), Ok(Some(s)) if s.state == ResourceState::Creating)
        });
        if resource.state == ResourceState::Creating
            && !waits_for_sibling
            && attaches_every_remote_reference(ctx, &resource, keys)
        {
            // What is still pending is a subset of the resource's remote
            // references (a CREATING resource's row holds the keys its
            // create recorded, less those settled since, and it cannot be
            // updated), all of which this settle attached: nothing is left
            // whatever the row holds, so it is removed unread (P5's profile:
            // the read was a fifth of the settle's instructions).
            tx.remove_pending_attach(*uid);
            out.push(protocol::activate_creating(&mut tx, ctx, resource)?);
            continue;
        }
        let Some(mut pending) = tx.pending_attach(*uid)? else {
            out.push(resource); // already settled
            continue;
        };
        pending.keys.retain(|k| !keys.contains(k));
        if resource.state != ResourceState::Creating {
            store_pending(&mut tx, pending);
            out.push(resource);
        } else if pending.keys.is_empty() && !waits_for_sibling {
            tx.remove_pending_attach(*uid);
            out.push(protocol::activate_creating(&mut tx, ctx, resource)?);
        } else {
            // Still waiting (another attach, or a batch sibling it
            // references); the reconciler settles it.
            tx.put_pending_attach(pending);
            out.push(resource);
        }
    }
    Ok(Step {
        value: Ok(out),
        writes: tx.finish(),
    })
}

/// Whether `keys` name every reference of `r` into another region, in
/// every field whatever the schema says of it: a superset of any key its
/// create can have recorded as pending, under the schema of then or now.
fn attaches_every_remote_reference(ctx: Ctx<'_>, r: &Resource, keys: &[BackRefKey]) -> bool {
    r.refs.iter().all(|(field, targets)| {
        targets.iter().filter(|t| is_remote(ctx, &t.name)).all(|t| {
            keys.iter()
                .any(|k| k.target == t.uid && k.referrer == r.uid && k.field == *field)
        })
    })
}

fn store_pending<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, pending: PendingAttach) {
    if pending.keys.is_empty() {
        tx.remove_pending_attach(pending.resource.uid);
    } else {
        tx.put_pending_attach(pending);
    }
}

/// A target of the resource that this node saw enter DELETING; `known`
/// keeps the answer for each target asked in the step.
fn deleting_target<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    r: &Resource,
    known: &mut BTreeMap<Uid, bool>,
) -> Result<Option<(String, ResourceName)>, StorageError> {
    for (field, targets) in &r.refs {
        for t in targets {
            let deleting = match known.get(&t.uid) {
                Some(d) => *d,
                None => {
                    let d = tx.remote_deletion(t.uid)?.is_some();
                    known.insert(t.uid, d);
                    d
                }
            };
            if deleting {
                return Ok(Some((field.clone(), t.name.clone())));
            }
        }
    }
    Ok(None)
}

/// Importer: the owner acknowledged these releases. A release queued again
/// since (a newer generation) stays.
///
/// Its writes claim nothing: a crash that loses them keeps the releases
/// queued, and they are sent again; the owner answers a release of a row
/// it no longer has as absent (and one older than the row's attach as
/// stale), changing nothing. So the node lets this step wait for a later
/// flush instead of one of its own.
pub fn releases_acknowledged<S: StateRead + ?Sized>(
    state: &S,
    region: &str,
    sent: Vec<(BackRefKey, u64)>,
) -> Result<Step<()>, CoreError> {
    let mut tx = Tx::new(state);
    for (key, generation) in sent {
        if tx
            .pending_release(region, &key)?
            .is_some_and(|p| p.generation == generation)
        {
            tx.remove_pending_release(region, key);
        }
    }
    Ok(Step {
        value: (),
        writes: tx.finish(),
    })
}

/// A tombstone dropped without its walk's last step (the walk was cut by
/// the budget after its last referrer, then PURGED came): what that step
/// would have done for this region's part of the operation, finishing it
/// when nothing is pending. Found by the multi-region property test: the
/// part stayed RUNNING with nothing pending, so the operation was never
/// done.
///
/// Returns whether it looked at a running part (and may have changed it).
fn finish_part<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, ctx: Ctx<'_>, id: OperationId) -> Result<bool, CoreError> {
    if tx
        .operation(id)?
        .is_some_and(|op| op.state == crate::model::OperationState::Running)
    {
        protocol::after_pending_changed(tx, ctx, id)?;
        return Ok(true);
    }
    Ok(false)
}
