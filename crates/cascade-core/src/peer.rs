//! The cross-region half of the protocol (seed 002's owner/importer flow).
//!
//! The **owner** of a resource keeps a back-reference row for every
//! referrer, local or remote. A remote referrer's region *attaches* the row
//! before its reference becomes live, and *releases* it once the reference
//! is gone (cascaded, unset, or dropped by an update). The owner purges a
//! deleting resource only when no row is left.
//!
//! The **importer** (the referrer's region) keeps a mirror of each row it
//! attached, keyed the same way (target uid first). When the owner's outbox
//! reports the target DELETING, the importer records a tombstone, and its
//! ordinary deletion work walks the mirror rows: cascade or unset each local
//! referrer and queue a durable release to the owner. The cursor of the
//! owner's outbox advances in the same step as those effects.
//!
//! Why nothing dangles or resurrects:
//! - The owner refuses to attach to a missing, DELETING or re-created
//!   target, so a new reference only lands on a live incarnation.
//! - An attach accepted just before the owner starts deleting is followed
//!   by the DELETING event; the tombstone it leaves makes the importer refuse
//!   to commit the new reference, and a reference committed before the event
//!   is cascaded or unset by it.
//! - A release carries the importer's generation; the owner ignores a
//!   release older than the row's attach (a late release of an earlier
//!   incarnation of the same reference).

use crate::error::{CoreError, StorageError};
use crate::model::{
    BackRef, BackRefKey, EventType, PendingAttach, RefTarget, RemoteDeletion, RemoteEvent, Resource, ResourceState,
    Timestamp, WorkItem,
};
use crate::protocol::{self, Ctx, Plan, Step};
use crate::state::{StateRead, Tx};
use crate::{OnDelete, OperationId, ResourceName, Uid};

/// A back-reference as one region asks another to attach or release it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerBackRef {
    /// The owner's resource referred to.
    pub target: RefTarget,
    /// The calling region's resource that holds the reference.
    pub referrer: RefTarget,
    /// The referrer's field.
    pub field: String,
    /// The referrer region's generation (see [`BackRef::generation`]).
    pub generation: u64,
}

impl PeerBackRef {
    /// The key of the row it names at the owner.
    pub fn key(&self) -> BackRefKey {
        BackRefKey {
            target: self.target.uid,
            referrer: self.referrer.uid,
            field: self.field.clone(),
        }
    }
}

impl From<BackRef> for PeerBackRef {
    /// The row as it is named to its referrer's region, with the generation
    /// the row was attached with.
    fn from(row: BackRef) -> Self {
        PeerBackRef {
            target: row.target,
            referrer: row.referrer,
            field: row.field,
            generation: row.generation,
        }
    }
}

/// Owner side of seed 002's periodic check: of `rows` (a page of this
/// region's back-reference table), the ones to ask region `peer` about:
/// owner rows (the target is in `local`) whose referrer lives in `peer`,
/// attached at or before `cutoff` (a younger row's referrer may still be
/// committing). Asked with generation `u64::MAX`, so a row found no longer
/// standing is released whatever generation it was attached with.
pub fn rows_to_check(
    rows: impl IntoIterator<Item = BackRef>,
    local: &str,
    peer: &str,
    cutoff: Timestamp,
) -> Vec<PeerBackRef> {
    rows.into_iter()
        .filter(|row| {
            row.referrer.name.region() == peer && row.target.name.region() == local && row.attached_at <= cutoff
        })
        .map(|row| PeerBackRef {
            generation: u64::MAX,
            ..PeerBackRef::from(row)
        })
        .collect()
}

/// Owner: records back-references from `from_region`, all or none. Each
/// target must be local, ACTIVE, and the incarnation named; the reference
/// must exist in the schema (its `on_delete` is the owner's schema's).
pub fn attach<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    from_region: &str,
    entries: Vec<PeerBackRef>,
) -> Result<Step<usize>, CoreError> {
    let mut tx = Tx::new(state);
    let n = entries.len();
    for (i, e) in entries.into_iter().enumerate() {
        let at = format!("backrefs[{i}]");
        if e.referrer.name.region() != from_region {
            return Err(CoreError::invalid(
                format!("{at}.referrer"),
                format!("{} is not in region {from_region}", e.referrer.name),
            ));
        }
        if e.target.name.region() != ctx.region.as_str() {
            return Err(CoreError::WrongRegion {
                name: e.target.name.clone(),
                region: e.target.name.region().to_owned(),
                local: ctx.region.to_string(),
            });
        }
        let spec = ctx
            .schema
            .reference(e.referrer.name.kind(), &e.field)
            .filter(|s| s.kind == e.target.name.kind() && s.on_delete.tracked())
            .ok_or_else(|| {
                CoreError::invalid(
                    format!("{at}.field"),
                    format!(
                        "kind {:?} has no tracked reference {:?} to a {}",
                        e.referrer.name.kind(),
                        e.field,
                        e.target.name.kind()
                    ),
                )
            })?;
        let field = format!("refs.{}", e.field);
        match tx.resource(&e.target.name)? {
            Some(r) if r.state == ResourceState::Active && r.uid == e.target.uid => {}
            Some(r) if r.state == ResourceState::Deleting && r.uid == e.target.uid => {
                return Err(CoreError::TargetDeleting {
                    field,
                    target: e.target.name,
                })
            }
            Some(r) if r.state != ResourceState::Creating && r.uid != e.target.uid => {
                return Err(CoreError::TargetUidMismatch {
                    field,
                    target: e.target.name,
                    expected: e.target.uid.to_string(),
                    actual: r.uid.to_string(),
                })
            }
            _ => {
                return Err(CoreError::TargetNotFound {
                    field,
                    target: e.target.name,
                })
            }
        }
        let key = e.key();
        let existing = tx.backref(&key)?;
        let generation = existing.map_or(e.generation, |b| b.generation.max(e.generation));
        tx.put_backref(BackRef {
            target: e.target,
            referrer: e.referrer,
            field: e.field,
            on_delete: spec.on_delete,
            generation,
            attached_at: ctx.now,
        });
    }
    Ok(Step {
        value: n,
        writes: tx.finish(),
    })
}

/// What a release request did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReleaseReport {
    /// Rows dropped.
    pub released: usize,
    /// Already gone (a repeated release).
    pub absent: usize,
    /// Older than the row's attach: a late release of an earlier reference.
    pub stale: usize,
    /// The row's referrer is not in the releasing region (refused).
    pub foreign: usize,
}

/// Owner: drops back-references that `from_region` released. Idempotent.
pub fn release<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    from_region: Option<&str>,
    entries: Vec<PeerBackRef>,
) -> Result<Step<ReleaseReport>, CoreError> {
    let mut tx = Tx::new(state);
    let mut report = ReleaseReport::default();
    for e in entries {
        let key = e.key();
        let found = tx.backref(&key)?;
        let Some(row) = found else {
            report.absent += 1;
            continue;
        };
        if from_region.is_some_and(|r| row.referrer.name.region() != r) {
            report.foreign += 1;
            continue;
        }
        if e.generation < row.generation {
            report.stale += 1;
            continue;
        }
        tx.remove_backref(key);
        let referrer_region = row.referrer.name.region();
        if referrer_region != ctx.region.as_str() && matches!(row.on_delete, OnDelete::Cascade | OnDelete::Unset) {
            // The referrer's region acted on this deletion (or, when the
            // periodic check drops the row, its referrer went some other
            // way, possibly by this very cascade): its part of the operation
            // may have work of its own (see `Operation::reached`).
            if let Some(d) = tx.deletion(row.target.uid)? {
                protocol::note_reached(&mut tx, d.operation, [&referrer_region.to_owned()], true)?;
            }
        }
        wake(&mut tx, ctx, row.target.uid)?;
        report.released += 1;
    }
    Ok(Step {
        value: report,
        writes: tx.finish(),
    })
}

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

/// Importer: applies a batch of the owner's outbox events, in order, and
/// advances the cursor of `from_region` in the same step. Events at or
/// below the cursor were applied before and are skipped.
pub fn apply_remote_events<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    from_region: &str,
    events: Vec<RemoteEvent>,
) -> Result<Step<usize>, CoreError> {
    let mut tx = Tx::new(state);
    let mut cursor = tx.cursor(from_region)?;
    let mut applied = 0;
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
                });
                tx.put_work(WorkItem {
                    target: e.resource,
                    next_attempt_at: ctx.now,
                    attempts: 0,
                    last_error: None,
                });
                applied += 1;
            }
            EventType::Purged => {
                // The owner purged it once every referrer released; local
                // mirror rows can only remain if our walk of its deletion is
                // still to come (both events in one batch): let it run.
                // Whether the walk is still to come is whether its work
                // item is still queued: a mirror row alone does not say so,
                // since the walk leaves `block` rows (and a CREATING
                // referrer's) in place, and a tombstone kept for a walk
                // that already ran would never be removed (simulation seed
                // 869).
                let walk_pending = tx.work(uid)?.is_some() && !tx.backrefs(uid, None, 1)?.is_empty();
                match tx.remote_deletion(uid)? {
                    Some(mut tombstone) if walk_pending => {
                        tombstone.purged = true;
                        tx.put_remote_deletion(tombstone);
                    }
                    tombstone => {
                        tx.remove_remote_deletion(uid);
                        tx.remove_work(uid);
                        if let Some(t) = tombstone {
                            finish_part(&mut tx, ctx, t.operation)?;
                        }
                    }
                }
                applied += 1;
            }
            _ => {}
        }
    }
    tx.set_cursor(from_region, cursor);
    Ok(Step {
        value: applied,
        writes: tx.finish(),
    })
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
    } in deleting
    {
        if target.name.region() != from_region || tx.remote_deletion(target.uid)?.is_some() {
            continue;
        }
        tx.put_remote_deletion(RemoteDeletion {
            target: target.clone(),
            operation,
            seen_at: ctx.now,
            purged: false,
            no_cascade,
        });
        tx.put_work(WorkItem {
            target,
            next_attempt_at: ctx.now,
            attempts: 0,
            last_error: None,
        });
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
    // The failure that decides for the whole batch, if any.
    let mut failure = attached.err();
    if failure.is_none() {
        for (_, uid, _) in &members {
            if let Some(r) = tx.resource_by_uid(*uid)? {
                if r.state == ResourceState::Creating {
                    if let Some((field, target)) = deleting_target(&tx, &r)? {
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
                ResourceState::Deleting => {}
            }
        }
        return Ok(Step {
            value: Err(e),
            writes: tx.finish(),
        });
    }
    let mut out = Vec::with_capacity(members.len());
    for (_, uid, keys) in &members {
        let Some(resource) = tx.resource_by_uid(*uid)? else {
            return Ok(Step {
                value: Err(aborted(first_name)),
                writes: tx.finish(),
            });
        };
        let Some(mut pending) = tx.pending_attach(*uid)? else {
            out.push(resource); // already settled
            continue;
        };
        pending.keys.retain(|k| !keys.contains(k));
        let waits_for_sibling = resource.refs.values().flatten().any(|t| {
            !is_remote(ctx, &t.name)
                && matches!(tx.resource_by_uid(t.uid), Ok(Some(s)) if s.state == ResourceState::Creating)
        });
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

fn is_remote(ctx: Ctx<'_>, name: &ResourceName) -> bool {
    name.region() != ctx.region.as_str()
}

fn store_pending<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, pending: PendingAttach) {
    if pending.keys.is_empty() {
        tx.remove_pending_attach(pending.resource.uid);
    } else {
        tx.put_pending_attach(pending);
    }
}

/// A target of the resource that this node saw enter DELETING.
fn deleting_target<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    r: &Resource,
) -> Result<Option<(String, ResourceName)>, StorageError> {
    for (field, targets) in &r.refs {
        for t in targets {
            if tx.remote_deletion(t.uid)?.is_some() {
                return Ok(Some((field.clone(), t.name.clone())));
            }
        }
    }
    Ok(None)
}

/// Importer: the owner acknowledged these releases. A release queued again
/// since (a newer generation) stays.
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

/// Any region: the part of a delete's closure that starts from `seeds`
/// (resources of other regions being deleted that resources here reference).
pub fn plan_from<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    seeds: Vec<RefTarget>,
    cascade: bool,
) -> Result<Plan, CoreError> {
    protocol::plan_closure(&Tx::new(state), ctx, seeds, cascade)
}

/// A tombstone dropped without its walk's last step (the walk was cut by
/// the budget after its last referrer, then PURGED came): what that step
/// would have done for this region's part of the operation, finishing it
/// when nothing is pending. Found by the multi-region property test: the
/// part stayed RUNNING with nothing pending, so the operation was never
/// done.
fn finish_part<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, ctx: Ctx<'_>, id: OperationId) -> Result<(), CoreError> {
    if tx
        .operation(id)?
        .is_some_and(|op| op.state == crate::model::OperationState::Running)
    {
        protocol::after_pending_changed(tx, ctx, id)?;
    }
    Ok(())
}

fn wake<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, ctx: Ctx<'_>, uid: Uid) -> Result<(), CoreError> {
    protocol::wake_if_deleting(tx, ctx, uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryState;
    use crate::{Policy, RegionId, Schema, SequentialIds, Timestamp};

    fn target(name: &str, ids: &mut SequentialIds) -> RefTarget {
        use crate::IdSource;
        RefTarget {
            name: ResourceName::parse(name).unwrap(),
            uid: Uid(ids.next_uuid()),
        }
    }

    #[test]
    fn resync_replaces_missed_events_and_drops_purged_tombstones() {
        let schema = Schema::from_toml(crate::schema::EXAMPLE_SCHEMA).unwrap();
        let region = RegionId::parse("rb").unwrap();
        let policy = Policy::default();
        let ctx = Ctx {
            schema: &schema,
            region: &region,
            now: Timestamp(10),
            policy: &policy,
        };
        let mut ids = SequentialIds::default();
        let mut state = MemoryState::default();
        let op = OperationId(uuid::Uuid::nil());
        let purged_meanwhile = target("ra/network/old", &mut ids);
        let still_deleting = target("ra/network/n", &mut ids);
        let other_region = target("rc/network/x", &mut ids);
        let events = [(&purged_meanwhile, "ra"), (&other_region, "rc")].map(|(t, from)| {
            apply_remote_events(
                &state,
                ctx,
                from,
                vec![RemoteEvent {
                    revision: 5,
                    event_type: EventType::Deleting,
                    resource: t.clone(),
                    operation: Some(op),
                    no_cascade: false,
                }],
            )
            .unwrap()
            .writes
        });
        for w in events {
            state.apply(w);
        }
        assert_eq!(state.remote_deletions.len(), 2);

        let listing = vec![RemoteDeleting {
            target: still_deleting.clone(),
            operation: op,
            no_cascade: false,
        }];
        let step = resync(&state, ctx, "ra", listing, 40).unwrap();
        assert_eq!(step.value, 1);
        state.apply(step.writes);
        assert!(state.remote_deletions.contains_key(&still_deleting.uid));
        assert!(
            !state.remote_deletions.contains_key(&purged_meanwhile.uid),
            "purged while we were away"
        );
        assert!(
            state.remote_deletions.contains_key(&other_region.uid),
            "other regions untouched"
        );
        assert!(
            state.work.contains_key(&still_deleting.uid),
            "local referrers get processed"
        );
        assert_eq!(state.cursors["ra"], 40);

        // Events at or below the new cursor are not applied again.
        let step = apply_remote_events(
            &state,
            ctx,
            "ra",
            vec![RemoteEvent {
                revision: 40,
                event_type: EventType::Purged,
                resource: still_deleting.clone(),
                operation: Some(op),
                no_cascade: false,
            }],
        )
        .unwrap();
        assert_eq!(step.value, 0);
    }

    struct Region {
        schema: Schema,
        region: RegionId,
        policy: Policy,
        ids: SequentialIds,
        state: MemoryState,
        now: u64,
    }

    impl Region {
        fn new(name: &str) -> Self {
            Self {
                schema: Schema::from_toml(crate::schema::EXAMPLE_SCHEMA).unwrap(),
                region: RegionId::parse(name).unwrap(),
                policy: Policy::default(),
                ids: SequentialIds::default(),
                state: MemoryState::default(),
                now: 1,
            }
        }
        fn ctx(&self) -> Ctx<'_> {
            Ctx {
                schema: &self.schema,
                region: &self.region,
                now: Timestamp(self.now),
                policy: &self.policy,
            }
        }
        fn create(&mut self, name: &str, refs: &[(&str, &RefTarget)]) -> Resource {
            let spec = spec_of(name, refs);
            let ctx = Ctx {
                schema: &self.schema,
                region: &self.region,
                now: Timestamp(self.now),
                policy: &self.policy,
            };
            let step = crate::protocol::create(&self.state, ctx, &mut self.ids, vec![spec]).unwrap();
            let r = step.value[0].clone();
            self.state.apply(step.writes);
            r
        }
        fn settle(&mut self, r: &Resource, attached: Result<(), CoreError>) -> Result<Resource, CoreError> {
            let keys = self.state.pending_attach[&r.uid].keys.clone();
            let step = settle(&self.state, self.ctx(), &r.name, r.uid, &keys, attached).unwrap();
            self.state.apply(step.writes);
            step.value
        }
        fn run_work(&mut self) {
            for _ in 0..100 {
                self.now += 1;
                let step = crate::protocol::process_work(&self.state, self.ctx()).unwrap();
                let idle = step.value.items == 0 && !step.value.more;
                self.state.apply(step.writes);
                if idle {
                    return;
                }
            }
            panic!("work did not settle");
        }
    }

    /// A spec with one target per reference field, given by name and uid.
    fn spec_of(name: &str, refs: &[(&str, &RefTarget)]) -> crate::protocol::ResourceSpec {
        crate::protocol::ResourceSpec {
            name: name.into(),
            refs: refs
                .iter()
                .map(|(f, t)| {
                    (
                        f.to_string(),
                        vec![crate::protocol::RefRequest {
                            name: t.name.to_string(),
                            uid: Some(t.uid),
                        }],
                    )
                })
                .collect(),
            ..Default::default()
        }
    }

    fn remote(name: &str, n: u128) -> RefTarget {
        RefTarget {
            name: ResourceName::parse(name).unwrap(),
            uid: Uid(uuid::Uuid::from_u128(n)),
        }
    }

    #[test]
    fn purged_in_the_same_batch_as_deleting_still_cascades_local_referrers() {
        let mut rb = Region::new("rb");
        let net = remote("ra/network/n", 7);
        let port = rb.create("rb/port/p", &[("network", &net)]);
        assert_eq!(port.state, ResourceState::Creating);
        let port = rb.settle(&port, Ok(())).unwrap();
        assert_eq!(port.state, ResourceState::Active);
        let op = OperationId(uuid::Uuid::from_u128(99));
        // A reconnect replays both events at once.
        let events = [(1, EventType::Deleting), (2, EventType::Purged)]
            .map(|(revision, event_type)| RemoteEvent {
                revision,
                event_type,
                resource: net.clone(),
                operation: Some(op),
                no_cascade: false,
            })
            .to_vec();
        let step = apply_remote_events(&rb.state, rb.ctx(), "ra", events).unwrap();
        rb.state.apply(step.writes);
        rb.run_work();
        assert!(
            !rb.state.resources.values().any(|r| r.state == ResourceState::Active),
            "the port was cascaded"
        );
        assert!(rb.state.backrefs.is_empty(), "mirror row released");
        assert!(rb.state.remote_deletions.is_empty(), "tombstone gone after the walk");
        assert_eq!(rb.state.pending_releases.len(), 1, "release queued for the owner");
    }

    /// Simulation seed 869: a router's gateway (block) attach never reached
    /// the owner, which deleted and purged the network; the importer's walk
    /// ran (leaving the block row) before PURGED arrived, and the tombstone
    /// was kept for a walk that would never come again.
    #[test]
    fn purged_after_the_walk_drops_the_tombstone_though_a_block_row_remains() {
        let mut rb = Region::new("rb");
        let net = remote("ra/network/n", 7);
        let project = rb.create("rb/project/p", &[]);
        let project = RefTarget {
            name: project.name,
            uid: project.uid,
        };
        let router = rb.create("rb/router/r", &[("project", &project), ("gateway_network", &net)]);
        assert_eq!(router.state, ResourceState::Creating, "attach not answered");
        let op = OperationId(uuid::Uuid::from_u128(99));
        let event = |revision, event_type| RemoteEvent {
            revision,
            event_type,
            resource: net.clone(),
            operation: Some(op),
            no_cascade: false,
        };
        let step = apply_remote_events(&rb.state, rb.ctx(), "ra", vec![event(1, EventType::Deleting)]).unwrap();
        rb.state.apply(step.writes);
        rb.run_work();
        assert!(!rb.state.backrefs.is_empty(), "the walk leaves the block row");
        let step = apply_remote_events(&rb.state, rb.ctx(), "ra", vec![event(2, EventType::Purged)]).unwrap();
        rb.state.apply(step.writes);
        rb.run_work();
        assert!(
            rb.state.remote_deletions.is_empty(),
            "tombstone gone: the walk already ran"
        );
        // The create is then refused by the owner and removed.
        let refused = rb.settle(&router, Err(CoreError::NotFound(net.name.clone())));
        assert!(refused.is_err());
        assert!(rb.state.backrefs.is_empty());
        assert!(rb.state.remote_deletions.is_empty());
    }

    #[test]
    fn late_release_of_an_earlier_incarnation_does_not_remove_a_newer_attach() {
        let mut ra = Region::new("ra");
        let project = ra.create("ra/project/p", &[]);
        let net = ra.create(
            "ra/network/n",
            &[(
                "project",
                &RefTarget {
                    name: project.name.clone(),
                    uid: project.uid,
                },
            )],
        );
        let entry = |generation| PeerBackRef {
            target: RefTarget {
                name: net.name.clone(),
                uid: net.uid,
            },
            referrer: remote("rb/port/p", 5),
            field: "network".into(),
            generation,
        };
        let step = attach(&ra.state, ra.ctx(), "rb", vec![entry(5)]).unwrap();
        ra.state.apply(step.writes);
        let step = release(&ra.state, ra.ctx(), Some("rb"), vec![entry(3)]).unwrap();
        assert_eq!(step.value.stale, 1);
        ra.state.apply(step.writes);
        assert_eq!(ra.state.backrefs.len(), 2, "project row + the remote row still there");
        // A region may not release another region's referrers.
        let step = release(&ra.state, ra.ctx(), Some("rc"), vec![entry(9)]).unwrap();
        assert_eq!(step.value.foreign, 1);
        let step = release(&ra.state, ra.ctx(), Some("rb"), vec![entry(5)]).unwrap();
        assert_eq!(step.value.released, 1);
        ra.state.apply(step.writes);
        assert_eq!(ra.state.backrefs.len(), 1);
    }

    #[test]
    fn update_commits_a_cross_region_reference_before_attaching_and_takes_it_back_when_refused() {
        let mut rb = Region::new("rb");
        let project = rb.create("rb/project/p", &[]);
        let project = RefTarget {
            name: project.name,
            uid: project.uid,
        };
        let fip = rb.create("rb/floating_ip/f", &[("project", &project)]);
        let port = remote("ra/port/x", 11);
        let spec = spec_of(fip.name.as_str(), &[("project", &project), ("port", &port)]);
        let step = crate::protocol::update(&rb.state, rb.ctx(), spec, None).unwrap();
        let updated = step.value.clone();
        rb.state.apply(step.writes);
        // Committed (so the owner's check finds it standing) and pending.
        assert_eq!(updated.refs["port"][0].uid, port.uid);
        let key = BackRefKey {
            target: port.uid,
            referrer: fip.uid,
            field: "port".into(),
        };
        assert_eq!(standing(&rb.state, std::slice::from_ref(&key)).unwrap(), vec![true]);
        assert!(
            rb.state.backrefs[&key].generation > 0,
            "mirror row has a writer-assigned generation"
        );
        assert_eq!(rb.state.pending_attach[&fip.uid].keys, vec![key.clone()]);

        let refused = CoreError::AttachRefused {
            region: "ra".into(),
            reason: "ra/port/x is being deleted".into(),
        };
        let answer = rb.settle(&updated, Err(refused));
        assert!(matches!(answer, Err(CoreError::AttachRefused { .. })), "{answer:?}");
        let now = &rb.state.resources[&fip.name];
        assert!(!now.refs.contains_key("port"), "taken back: {:?}", now.refs);
        assert!(rb.state.pending_attach.is_empty());
        assert!(!rb.state.backrefs.contains_key(&key));
        assert_eq!(
            rb.state.pending_releases.len(),
            1,
            "whatever landed at the owner is released"
        );
        let last = rb.state.events.last().unwrap();
        assert!(last.message.contains("taken back"), "{}", last.message);
    }
}
