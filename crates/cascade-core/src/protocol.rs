//! The deletion protocol of one region: state + command → new state + effects.
//!
//! Every public function reads a [`StateRead`] snapshot, validates, and
//! returns a [`Step`]: the value for the caller and the [`WriteSet`] to
//! commit atomically. Nothing here does IO, reads a clock, or mints ids by
//! itself; the caller passes a [`Ctx`] (schema, region, `now`, policy) and
//! an [`IdSource`].
//!
//! The life of a deletion:
//!
//! 1. [`delete`] checks the preconditions (blockers, dependents, etag) and,
//!    in one step, marks the root DELETING, writes its deletion record,
//!    releases its own outgoing references (so cycles unwind), queues work
//!    for it, creates the operation, and emits the event.
//! 2. [`process_work`] takes due queue entries in bounded batches. For each
//!    deletion it walks the back-references: `cascade` referrers enter
//!    DELETING the same way (a list reference only when its last element
//!    goes), `unset` referrers lose the field or element; `block` referrers
//!    hold it.
//! 3. When no back-reference and no finalizer is left it is purged, and its
//!    operation's counters move. An operation's root is purged last, so the
//!    root stays readable until its whole closure is gone.
//! 4. A deletion that cannot finish is retried with exponential backoff and,
//!    after the maximum, marked FAILED with the reason.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::error::{describe_blockers, CoreError, Dependent};
use crate::model::{
    BackRef, BackRefKey, Blocker, DeletionReason, DeletionRecord, DeletionStatus, Event, EventType, Operation,
    OperationState, Outcome, OutcomeAction, PendingAttach, PendingRelease, Progress, RefTarget, Resource,
    ResourceState, Timestamp, WorkItem,
};
use crate::name::{IdSource, OperationId, RegionId, ResourceName, Uid};
use crate::schema::{OnDelete, Schema};
use crate::state::{StateRead, Tx, WriteSet};

/// Tunables of the protocol. Defaults suit a node; tests shrink them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Upper bound on referrer changes in one work step (one transaction).
    pub batch_budget: usize,
    /// Queue entries looked at per work step.
    pub batch_items: usize,
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
    /// Attempts at a deletion that cannot finish before it is marked FAILED.
    pub max_attempts: u32,
    /// Dependents or blockers listed in an error or report.
    pub max_listed: usize,
    /// How often a root whose own region's part is done looks again
    /// whether the other regions' parts are (see `confirm_remote_closure`).
    pub closure_check_ms: u64,
    /// Resources a dry run walks before it reports a truncated plan.
    pub max_plan: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            batch_budget: 512,
            batch_items: 256,
            backoff_base_ms: 1_000,
            backoff_cap_ms: 60_000,
            max_attempts: 20,
            max_listed: 50,
            closure_check_ms: 1_000,
            max_plan: 10_000,
        }
    }
}

impl Policy {
    pub fn backoff(&self, attempts: u32) -> u64 {
        let exp = attempts.saturating_sub(1).min(32);
        self.backoff_base_ms
            .saturating_mul(1u64 << exp)
            .min(self.backoff_cap_ms)
    }
}

/// What a step needs to know about its surroundings.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    pub schema: &'a Schema,
    pub region: &'a RegionId,
    pub now: Timestamp,
    pub policy: &'a Policy,
}

/// The result of one step: the answer and the writes to commit.
#[derive(Debug, Clone, PartialEq)]
pub struct Step<T> {
    pub value: T,
    pub writes: WriteSet,
}

/// A reference target as a client names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefRequest {
    pub name: String,
    /// When set, the target must be this incarnation.
    pub uid: Option<Uid>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceSpec {
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    pub refs: BTreeMap<String, Vec<RefRequest>>,
    pub finalizers: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteRequest {
    pub name: String,
    pub cascade: bool,
    pub dry_run: bool,
    pub allow_missing: bool,
    pub etag: Option<String>,
    pub uid: Option<Uid>,
    pub requested_by: String,
    /// Back-references from list owners in other regions that, as their
    /// region answered just before this request, keep another live target
    /// in that field (see [`crate::peer::keeps_another_target`]). Only read
    /// without `cascade`: such a referrer loses one element, not its last.
    /// A remote `cascade` referrer not in this set counts as a dependent
    /// that would be deleted, so the check errs on refusing.
    pub remote_kept: BTreeSet<BackRefKey>,
}

/// A planned change to a referrer that survives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedUnset {
    pub resource: RefTarget,
    pub field: String,
}

/// A resource of the closure that would wait on a blocker outside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedBlock {
    pub resource: RefTarget,
    pub blocker: Blocker,
}

/// What a delete would do (the dry run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub deleted: Vec<RefTarget>,
    pub unset: Vec<PlannedUnset>,
    pub blocked: Vec<PlannedBlock>,
    /// The walk stopped at `Policy::max_plan` resources.
    pub truncated: bool,
    /// Region → deleted resources referenced from there: that region's own
    /// plan, started from these, continues the closure.
    pub remote_seeds: BTreeMap<String, Vec<RefTarget>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DeleteOutcome {
    /// A new deletion started.
    Accepted(Operation),
    /// The resource was already DELETING: the delete answers OK with its operation.
    AlreadyDeleting(Operation),
    /// `allow_missing` and there was nothing to delete.
    Missing,
    DryRun(Plan),
}

/// What one work step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkReport {
    pub items: usize,
    pub purged: usize,
    pub cascaded: usize,
    pub unset: usize,
    /// More work was due than one step takes: call again at once.
    pub more: bool,
    /// Operations whose root waits only for other regions' parts: the
    /// node asks them and, when all are finished, confirms with
    /// [`confirm_remote_closure`].
    pub awaiting_closure: Vec<OperationId>,
}

const MAX_ATTRIBUTES: usize = 256;
const MAX_ATTRIBUTE_KEY: usize = 128;
const MAX_ATTRIBUTE_VALUE: usize = 4096;
const MAX_TARGETS_PER_FIELD: usize = 1024;
const MAX_FINALIZERS: usize = 32;

/// Creates resources, all or none, in order (a later one may reference an earlier one).
pub fn create<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    ids: &mut dyn IdSource,
    specs: Vec<ResourceSpec>,
) -> Result<Step<Vec<Resource>>, CoreError> {
    let mut tx = Tx::new(state);
    let mut created = Vec::with_capacity(specs.len());
    let many = specs.len() > 1;
    // A batch with any reference into another region is created CREATING as
    // a whole and settled as a whole (see `peer::settle_batch`), so a later
    // member may reference an earlier one and the batch stays all or nothing.
    let batch_crosses = specs.iter().any(|s| {
        s.refs
            .values()
            .flatten()
            .any(|t| t.name.split('/').next().is_some_and(|r| r != ctx.region.as_str()))
    });
    for (i, spec) in specs.into_iter().enumerate() {
        let at = |field: &str| {
            if many {
                format!("resources[{i}].{field}")
            } else {
                field.to_owned()
            }
        };
        let name = local_name(ctx, &spec.name, &at("name"))?;
        validate_attributes(&spec.attributes, &at("attributes"))?;
        validate_finalizers(&spec.finalizers, &at("finalizers"))?;
        if let Some(existing) = tx.resource(&name)? {
            let detail = if existing.state == ResourceState::Deleting {
                " and is being deleted; the name is free again once it is purged"
            } else {
                ""
            };
            return Err(CoreError::AlreadyExists { name, detail });
        }
        let refs = resolve_refs(&tx, ctx, name.kind(), &spec.refs, &at("refs"), None)?;
        let uid = Uid(ids.next_uuid());
        // References into other regions are attached at their owners before
        // the resource becomes ACTIVE (see `peer::activate`).
        let crosses_regions = batch_crosses;
        let resource = Resource {
            name,
            uid,
            state: if crosses_regions {
                ResourceState::Creating
            } else {
                ResourceState::Active
            },
            attributes: spec.attributes,
            refs,
            revision: 0,
            create_time: ctx.now,
            update_time: ctx.now,
            finalizers: spec.finalizers,
        };
        let remote_keys = attach_backrefs(&mut tx, ctx, &resource, None)?;
        let resource = if crosses_regions {
            // Not visible, and no event, until it is ACTIVE.
            let mut resource = resource;
            resource.revision = tx.peek_revision()?;
            tx.put_resource(resource.clone());
            tx.put_pending_attach(PendingAttach {
                resource: target_of(&resource),
                keys: remote_keys,
            });
            resource
        } else {
            put_with_event(&mut tx, ctx, resource, EventType::Created, None, "created")?
        };
        created.push(resource);
    }
    Ok(Step {
        value: created,
        writes: tx.finish(),
    })
}

/// Replaces a resource's attributes, references and finalizers.
///
/// While a resource is DELETING the only update allowed is removing
/// finalizers (the external cleanup reporting that it is done).
pub fn update<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    spec: ResourceSpec,
    etag: Option<&str>,
) -> Result<Step<Resource>, CoreError> {
    let mut tx = Tx::new(state);
    let name = local_name(ctx, &spec.name, "name")?;
    validate_attributes(&spec.attributes, "attributes")?;
    validate_finalizers(&spec.finalizers, "finalizers")?;
    let Some(current) = tx.resource(&name)?.filter(|r| r.state != ResourceState::Creating) else {
        return Err(CoreError::NotFound(name));
    };
    check_etag(&current, etag)?;
    if current.state == ResourceState::Deleting {
        return finish_finalizers(tx, ctx, current, spec);
    }
    let refs = resolve_refs(&tx, ctx, name.kind(), &spec.refs, "refs", Some(&current.refs))?;
    let mut next = current.clone();
    next.attributes = spec.attributes;
    next.refs = refs;
    next.finalizers = spec.finalizers;
    next.update_time = ctx.now;
    // Release what the update drops, attach what it adds.
    let old = tracked_keys(ctx, &current);
    let new = tracked_keys(ctx, &next);
    for b in outgoing_backrefs(ctx, &current) {
        if !new.contains_key(&b.key()) {
            release_ref(&mut tx, ctx, &b)?;
        }
    }
    for (key, (target, _)) in new.iter().filter(|(k, _)| !old.contains_key(*k)) {
        // A release of this very reference may still be queued from an
        // earlier update: it need not be sent (and the owner would ignore
        // it by generation anyway).
        if let Some(region) = remote_region(ctx, target) {
            tx.remove_pending_release(&region, key.clone());
        }
    }
    let added_remote = attach_backrefs(&mut tx, ctx, &next, Some(&old))?;
    // New cross-region references are committed first and confirmed by
    // their owners after (see `peer::settle`); the intent is durable.
    let mut pending = tx.pending_attach(next.uid)?.map(|p| p.keys).unwrap_or_default();
    pending.retain(|k| new.contains_key(k));
    pending.extend(added_remote);
    if pending.is_empty() {
        tx.remove_pending_attach(next.uid);
    } else {
        tx.put_pending_attach(PendingAttach {
            resource: target_of(&next),
            keys: pending,
        });
    }
    let next = put_with_event(&mut tx, ctx, next, EventType::Updated, None, "updated")?;
    Ok(Step {
        value: next,
        writes: tx.finish(),
    })
}

fn finish_finalizers<S: StateRead + ?Sized>(
    mut tx: Tx<'_, S>,
    ctx: Ctx<'_>,
    current: Resource,
    spec: ResourceSpec,
) -> Result<Step<Resource>, CoreError> {
    let refs_unchanged = spec.refs.iter().all(|(f, targets)| {
        current.refs.get(f).is_some_and(|have| {
            have.len() == targets.len() && have.iter().zip(targets).all(|(h, t)| h.name.as_str() == t.name)
        })
    }) && spec.refs.len() == current.refs.len();
    let only_removes = spec.finalizers.iter().all(|f| current.finalizers.contains(f));
    if spec.attributes != current.attributes || !refs_unchanged || !only_removes {
        return Err(CoreError::Deleting { name: current.name });
    }
    let mut next = current;
    next.finalizers = spec.finalizers;
    next.update_time = ctx.now;
    let uid = next.uid;
    let next = put_with_event(&mut tx, ctx, next, EventType::Updated, None, "finalizers removed")?;
    wake_if_deleting(&mut tx, ctx, uid)?;
    Ok(Step {
        value: next,
        writes: tx.finish(),
    })
}

/// Accepts (or plans) the deletion of one resource.
pub fn delete<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    ids: &mut dyn IdSource,
    req: DeleteRequest,
) -> Result<Step<DeleteOutcome>, CoreError> {
    let mut tx = Tx::new(state);
    let name = local_name(ctx, &req.name, "name")?;
    let found = tx
        .resource(&name)?
        .filter(|r| r.state != ResourceState::Creating)
        .filter(|r| req.uid.is_none_or(|uid| uid == r.uid));
    let Some(resource) = found else {
        return if req.allow_missing {
            Ok(Step {
                value: DeleteOutcome::Missing,
                writes: WriteSet::default(),
            })
        } else {
            Err(CoreError::NotFound(name))
        };
    };
    if resource.state == ResourceState::Deleting {
        // Seed 000: a repeated delete answers OK.
        let op = tx
            .deletion(resource.uid)?
            .map(|d| tx.operation(d.operation))
            .transpose()?
            .flatten()
            .ok_or_else(|| {
                CoreError::Storage(crate::error::StorageError(format!(
                    "{name} is DELETING without a deletion record or operation"
                )))
            })?;
        return Ok(Step {
            value: DeleteOutcome::AlreadyDeleting(op),
            writes: WriteSet::default(),
        });
    }
    check_etag(&resource, req.etag.as_deref())?;
    check_preconditions(&tx, ctx, &resource, req.cascade, &req.remote_kept)?;
    if req.dry_run {
        let plan = plan_closure(&tx, ctx, vec![target_of(&resource)], req.cascade)?;
        return Ok(Step {
            value: DeleteOutcome::DryRun(plan),
            writes: WriteSet::default(),
        });
    }
    let op = Operation {
        id: OperationId(ids.next_uuid()),
        root: RefTarget {
            name: resource.name.clone(),
            uid: resource.uid,
        },
        requested_by: req.requested_by.clone(),
        cascade: req.cascade,
        state: OperationState::Running,
        progress: Progress::default(),
        create_time: ctx.now,
        end_time: None,
        reached: BTreeSet::new(),
        changes: 0,
        closure_confirmed: false,
    };
    tx.put_operation(op.clone());
    enter_deleting(
        &mut tx,
        ctx,
        resource,
        DeletionReason::Requested,
        op.id,
        &req.requested_by,
    )?;
    let op = tx.operation(op.id)?.unwrap_or(op);
    Ok(Step {
        value: DeleteOutcome::Accepted(op),
        writes: tx.finish(),
    })
}

/// Refuses a user delete while a live `block` reference exists, or, without
/// `cascade`, while a `cascade` referrer exists that would be deleted: one
/// whose reference is single, or a list owner with no other live target
/// (every other element already DELETING counts as gone: deleting this one
/// would cascade once they finish). Lists them.
fn check_preconditions<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: &Resource,
    cascade: bool,
    remote_kept: &BTreeSet<BackRefKey>,
) -> Result<(), CoreError> {
    let mut blockers = Vec::new();
    let mut dependents = Vec::new();
    let mut more = 0;
    let mut after: Option<BackRefKey> = None;
    loop {
        let page = tx.backrefs(resource.uid, after.as_ref(), 1024)?;
        let Some(last) = page.last() else { break };
        after = Some(last.key());
        for b in page {
            let list = match b.on_delete {
                OnDelete::Block => &mut blockers,
                OnDelete::Cascade if !cascade => {
                    // A list owner that keeps another live element only
                    // loses one. A remote one's region answered for it.
                    let keeps_others = if is_remote(ctx, &b.referrer.name) {
                        remote_kept.contains(&b.key())
                    } else {
                        match tx.resource_by_uid(b.referrer.uid)? {
                            Some(r) => keeps_live_other_target(tx, ctx, &r, &b.field, resource.uid)?,
                            None => false,
                        }
                    };
                    if keeps_others {
                        continue;
                    }
                    &mut dependents
                }
                _ => continue,
            };
            if list.len() < ctx.policy.max_listed {
                list.push(Dependent {
                    referrer: b.referrer.name.clone(),
                    field: b.field.clone(),
                    on_delete: b.on_delete,
                });
            } else {
                more += 1;
            }
        }
    }
    if blockers.is_empty() && dependents.is_empty() {
        return Ok(());
    }
    Err(CoreError::DeleteRefused {
        name: resource.name.clone(),
        blockers,
        dependents,
        more,
    })
}

/// Whether `referrer` holds, in `field`, a live target other than `target`:
/// one that is not being deleted, as far as this region knows (a local
/// target ACTIVE; a remote one not reported DELETING by its owner).
pub(crate) fn keeps_live_other_target<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    referrer: &Resource,
    field: &str,
    target: Uid,
) -> Result<bool, CoreError> {
    let Some(targets) = referrer.refs.get(field) else {
        return Ok(false);
    };
    for t in targets.iter().filter(|t| t.uid != target) {
        let live = if is_remote(ctx, &t.name) {
            tx.remote_deletion(t.uid)?.is_none()
        } else {
            tx.resource_by_uid(t.uid)?
                .is_some_and(|r| r.state == ResourceState::Active)
        };
        if live {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Walks the closure of a delete without changing anything.
///
/// `seeds` are deleted resources to start from: the root of a local delete,
/// or (for another region's plan) its deleted resources that this region's
/// resources reference. Referrers in other regions are not followed here:
/// they become `remote_seeds` for their region's own plan.
pub(crate) fn plan_closure<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    seeds: Vec<RefTarget>,
    cascade: bool,
) -> Result<Plan, CoreError> {
    let mut deleted: BTreeMap<Uid, RefTarget> = BTreeMap::new();
    let mut order = Vec::new();
    let mut remote_seeds: BTreeMap<String, BTreeSet<RefTarget>> = BTreeMap::new();
    let mut queue = VecDeque::new();
    for seed in seeds {
        if !is_remote(ctx, &seed.name) {
            order.push(seed.clone());
        }
        queue.push_back(seed.uid);
        deleted.insert(seed.uid, seed);
    }
    // (referrer uid, field) → elements the closure removes from that list.
    let mut removed: BTreeMap<(Uid, String), usize> = BTreeMap::new();
    let mut unset: BTreeMap<(Uid, String), RefTarget> = BTreeMap::new();
    let mut blocks: Vec<(RefTarget, BackRef)> = Vec::new();
    let mut truncated = false;
    while let Some(uid) = queue.pop_front() {
        let target = deleted[&uid].clone();
        let mut after: Option<BackRefKey> = None;
        loop {
            let page = tx.backrefs(uid, after.as_ref(), 1024)?;
            let Some(last) = page.last() else { break };
            after = Some(last.key());
            for b in page {
                if is_remote(ctx, &b.referrer.name) && b.on_delete != OnDelete::Block {
                    // Without cascade a remote `cascade` referrer still
                    // loses the element (see `apply_to_referrer`).
                    let region = b.referrer.name.region().to_owned();
                    remote_seeds.entry(region).or_default().insert(target.clone());
                    continue;
                }
                match b.on_delete {
                    OnDelete::Block => blocks.push((target.clone(), b)),
                    OnDelete::AllowDangling => {}
                    OnDelete::Unset => {
                        unset.insert((b.referrer.uid, b.field.clone()), b.referrer.clone());
                    }
                    OnDelete::Cascade => {
                        if deleted.contains_key(&b.referrer.uid) {
                            continue;
                        }
                        let Some(q) = tx.resource_by_uid(b.referrer.uid)? else {
                            continue;
                        };
                        if q.state != ResourceState::Active {
                            continue;
                        }
                        let len = q.refs.get(&b.field).map_or(0, Vec::len);
                        let n = removed.entry((q.uid, b.field.clone())).or_default();
                        *n += 1;
                        // Without cascade nothing is deleted: the referrer
                        // loses the element, as an `unset` one would.
                        if *n >= len && cascade {
                            if deleted.len() >= ctx.policy.max_plan {
                                truncated = true;
                                continue;
                            }
                            deleted.insert(q.uid, b.referrer.clone());
                            order.push(b.referrer.clone());
                            queue.push_back(q.uid);
                        } else {
                            unset.insert((q.uid, b.field.clone()), b.referrer.clone());
                        }
                    }
                }
            }
        }
    }
    let unset = unset
        .into_iter()
        .filter(|((uid, _), _)| !deleted.contains_key(uid))
        .map(|((_, field), resource)| PlannedUnset { resource, field })
        .collect();
    let mut blocked = Vec::new();
    for (resource, b) in blocks {
        if deleted.contains_key(&b.referrer.uid) {
            continue;
        }
        let referrer_deleting = tx
            .resource_by_uid(b.referrer.uid)?
            .is_some_and(|r| r.state == ResourceState::Deleting);
        blocked.push(PlannedBlock {
            resource,
            blocker: Blocker {
                referrer: b.referrer.name,
                field: b.field,
                referrer_deleting,
            },
        });
    }
    Ok(Plan {
        deleted: order,
        unset,
        blocked,
        truncated,
        remote_seeds: remote_seeds
            .into_iter()
            .map(|(region, targets)| (region, targets.into_iter().collect()))
            .collect(),
    })
}

/// Runs one bounded batch of due deletion work.
pub fn process_work<S: StateRead + ?Sized>(state: &S, ctx: Ctx<'_>) -> Result<Step<WorkReport>, CoreError> {
    let mut tx = Tx::new(state);
    let due = tx.due_work(ctx.now, ctx.policy.batch_items)?;
    let mut report = WorkReport {
        more: due.len() >= ctx.policy.batch_items,
        ..WorkReport::default()
    };
    let mut budget = ctx.policy.batch_budget;
    for item in due {
        if budget == 0 {
            report.more = true;
            break;
        }
        // An earlier item of this batch may have changed or removed it.
        let Some(work) = tx.work(item.target.uid)? else {
            continue;
        };
        if work.next_attempt_at > ctx.now {
            continue;
        }
        report.items += 1;
        if !step_deletion(&mut tx, ctx, work, &mut budget, &mut report)? {
            report.more = true;
        }
    }
    Ok(Step {
        value: report,
        writes: tx.finish(),
    })
}

/// Advances one deletion. Returns false when the budget ran out before it
/// got through its back-references (its queue entry stays due).
fn step_deletion<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    work: WorkItem,
    budget: &mut usize,
    report: &mut WorkReport,
) -> Result<bool, CoreError> {
    let uid = work.target.uid;
    if is_remote(ctx, &work.target.name) {
        return step_remote_deletion(tx, ctx, work, budget, report);
    }
    let resource = tx.resource_by_uid(uid)?;
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
    // Only an operation's root can be deleted without cascade (nothing else
    // enters DELETING by it), and then its referrers lose the element.
    let no_cascade = tx.operation(record.operation)?.is_some_and(|op| !op.cascade);
    let mut blockers = Vec::new();
    // Region → referrers there that have yet to release (they act on our event).
    let mut waiting: BTreeMap<String, usize> = BTreeMap::new();
    let mut after: Option<BackRefKey> = None;
    loop {
        if *budget == 0 {
            return Ok(false);
        }
        let page = tx.backrefs(uid, after.as_ref(), (*budget).min(256))?;
        let Some(last) = page.last() else { break };
        after = Some(last.key());
        for b in page {
            let remote_referrer = is_remote(ctx, &b.referrer.name);
            match b.on_delete {
                OnDelete::Block => {
                    if blockers.len() < ctx.policy.max_listed {
                        let referrer_deleting = !remote_referrer
                            && tx
                                .resource_by_uid(b.referrer.uid)?
                                .is_some_and(|r| r.state == ResourceState::Deleting);
                        blockers.push(Blocker {
                            referrer: b.referrer.name.clone(),
                            field: b.field.clone(),
                            referrer_deleting,
                        });
                    }
                }
                OnDelete::AllowDangling => tx.remove_backref(b.key()),
                OnDelete::Cascade | OnDelete::Unset if remote_referrer => {
                    *waiting.entry(b.referrer.name.region().to_owned()).or_default() += 1;
                }
                OnDelete::Cascade | OnDelete::Unset => {
                    *budget = budget.saturating_sub(1);
                    let deletion = Applied {
                        target: &target,
                        operation: record.operation,
                        requested_by: &record.requested_by,
                        no_cascade,
                    };
                    apply_to_referrer(tx, ctx, &deletion, b, report)?;
                }
            }
        }
    }
    if !blockers.is_empty() || !resource.finalizers.is_empty() {
        hold(tx, ctx, &resource, record, work, blockers)?;
        return Ok(true);
    }
    if !waiting.is_empty() {
        note_reached(tx, record.operation, waiting.keys(), false)?;
        let reason = waiting
            .iter()
            .map(|(region, n)| format!("waiting on region {region} to release {n} reference(s)"))
            .collect::<Vec<_>>()
            .join("; ");
        let retry_at = ctx.now.plus_millis(ctx.policy.backoff_cap_ms);
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
    let op = tx.operation(record.operation)?;
    // Whether the root itself is counted in `pending` (a failed one is not).
    let root_pending = u64::from(!matches!(record.status, DeletionStatus::Failed { .. }));
    if op
        .as_ref()
        .is_some_and(|op| op.root.uid == uid && op.progress.pending > root_pending)
    {
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
                update_operation(tx, op_id, |p| p.blocked = p.blocked.saturating_sub(1))?;
            }
        }
        return Ok(true);
    }
    if let Some(op) = op.filter(|op| op.root.uid == uid && !op.reached.is_empty() && !op.closure_confirmed) {
        // The root of a cascade that reached other regions stays until
        // their parts are finished too (Kubernetes' foreground rule, across
        // regions): the node asks them, and confirms (see
        // `confirm_remote_closure`); until then it reads DELETING.
        let regions: Vec<String> = op.reached.iter().cloned().collect();
        let reason = format!(
            "its own region's part is done; waiting for the cascade to finish in {} (see operation {})",
            regions.join(", "),
            op.id
        );
        let retry_at = ctx.now.plus_millis(ctx.policy.closure_check_ms);
        wait_for_regions(tx, ctx, &resource, record, work, regions, reason, retry_at)?;
        report.awaiting_closure.push(op.id);
        return Ok(true);
    }
    purge(tx, ctx, resource, record)?;
    report.purged += 1;
    Ok(true)
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
    if changed || op.reached.len() != before {
        op.changes += u64::from(changed);
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
    work: WorkItem,
    budget: &mut usize,
    report: &mut WorkReport,
) -> Result<bool, CoreError> {
    let uid = work.target.uid;
    let Some(tombstone) = tx.remote_deletion(uid)? else {
        tx.remove_work(uid);
        return Ok(true);
    };
    let requested_by = format!("region {}", tombstone.target.name.region());
    let mut after: Option<BackRefKey> = None;
    loop {
        if *budget == 0 {
            return Ok(false);
        }
        let page = tx.backrefs(uid, after.as_ref(), (*budget).min(256))?;
        let Some(last) = page.last() else { break };
        after = Some(last.key());
        for b in page {
            if matches!(b.on_delete, OnDelete::Cascade | OnDelete::Unset) && !is_remote(ctx, &b.referrer.name) {
                *budget = budget.saturating_sub(1);
                let deletion = Applied {
                    target: &tombstone.target,
                    operation: tombstone.operation,
                    requested_by: &requested_by,
                    no_cascade: tombstone.no_cascade,
                };
                apply_to_referrer(tx, ctx, &deletion, b, report)?;
            }
        }
    }
    tx.remove_work(uid);
    if tombstone.purged {
        tx.remove_remote_deletion(uid);
    }
    after_pending_changed(tx, ctx, tombstone.operation)?;
    Ok(true)
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
            update_operation(tx, op, |p| p.blocked = p.blocked.saturating_sub(1))?;
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
    /// The request did not allow a cascade (`cascade = false`).
    no_cascade: bool,
}

/// Applies the deletion of `target` to one referrer: cascade or unset.
///
/// Without cascade (`no_cascade`) a `cascade` referrer is never deleted: it
/// loses the element like an `unset` one, even its last (the acceptance
/// check refuses that case when it can see it; two such deletes of a list
/// owner's last two owners can still race, across regions especially, and
/// then the referrer survives, emptied, rather than being deleted by an
/// operation that did not allow it: invariant 3).
fn apply_to_referrer<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    deletion: &Applied<'_>,
    b: BackRef,
    report: &mut WorkReport,
) -> Result<(), CoreError> {
    let Applied {
        target,
        operation,
        requested_by,
        no_cascade,
    } = *deletion;
    release_ref(tx, ctx, &b)?;
    let Some(mut referrer) = tx.resource_by_uid(b.referrer.uid)? else {
        return Ok(()); // the referrer is gone: the back-reference was stale
    };
    if referrer.state == ResourceState::Creating {
        // Its create has not been confirmed yet: the create fails instead.
        abort_creating(tx, ctx, referrer)?;
        return Ok(());
    }
    if referrer.state != ResourceState::Active {
        return Ok(());
    }
    let Some(targets) = referrer.refs.get_mut(&b.field) else {
        return Ok(());
    };
    let before = targets.len();
    targets.retain(|t| t.uid != target.uid);
    if targets.len() == before {
        return Ok(());
    }
    let emptied = targets.is_empty();
    if emptied {
        referrer.refs.remove(&b.field);
    }
    ensure_operation_part(tx, ctx, operation, target, !no_cascade)?;
    if b.on_delete == OnDelete::Cascade && emptied && !no_cascade {
        let reason = DeletionReason::Cascade {
            from: target.name.clone(),
            field: b.field.clone(),
        };
        enter_deleting(tx, ctx, referrer, reason, operation, requested_by)?;
        report.cascaded += 1;
        return Ok(());
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
    let referrer = put_with_event(tx, ctx, referrer, EventType::Updated, Some(operation), &message)?;
    tx.put_outcome(
        operation,
        Outcome {
            resource: target_of(&referrer),
            action: OutcomeAction::Unset { field: b.field },
            time: ctx.now,
        },
    );
    update_operation(tx, operation, |p| p.unset += 1)?;
    report.unset += 1;
    Ok(())
}

/// Drops the back-reference row of one reference: for a remote target also
/// queues the release to its owner; for a local target being deleted, wakes it.
fn release_ref<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, ctx: Ctx<'_>, b: &BackRef) -> Result<(), CoreError> {
    tx.remove_backref(b.key());
    if is_remote(ctx, &b.target.name) {
        let generation = tx.next_generation()?;
        tx.put_pending_release(
            b.target.name.region(),
            PendingRelease {
                backref: b.clone(),
                generation,
            },
        );
        Ok(())
    } else {
        wake_if_deleting(tx, ctx, b.target.uid)
    }
}

/// Removes a CREATING resource whose cross-region create cannot complete,
/// with its back-reference rows (releases queued for remote targets).
pub(crate) fn abort_creating<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    r: Resource,
) -> Result<(), CoreError> {
    for b in outgoing_backrefs(ctx, &r) {
        release_ref(tx, ctx, &b)?;
    }
    tx.remove_resource(&r.name, r.uid);
    tx.remove_pending_attach(r.uid);
    // Only members of its own batch can reference a CREATING resource, and
    // they are CREATING too: they go with it.
    for b in tx.backrefs(r.uid, None, usize::MAX)? {
        if let Some(sibling) = tx.resource_by_uid(b.referrer.uid)? {
            if sibling.state == ResourceState::Creating {
                abort_creating(tx, ctx, sibling)?;
            }
        }
    }
    Ok(())
}

/// A cascade that reaches this region from another one reports into the
/// same operation id: this region keeps its part of the operation.
fn ensure_operation_part<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    operation: OperationId,
    root: &RefTarget,
    cascade: bool,
) -> Result<(), CoreError> {
    if tx.operation(operation)?.is_none() {
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
        });
    }
    Ok(())
}

/// Takes back cross-region references whose owner refused them: drops them
/// from the resource (an `Updated` event says why) and queues releases.
pub(crate) fn revert_references<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    mut r: Resource,
    keys: &[BackRefKey],
    reason: &str,
) -> Result<Resource, CoreError> {
    let mut reverted = Vec::new();
    for key in keys {
        let Some(row) = tx.backref(key)? else { continue };
        if let Some(targets) = r.refs.get_mut(&key.field) {
            targets.retain(|t| t.uid != key.target);
            if targets.is_empty() {
                r.refs.remove(&key.field);
            }
        }
        reverted.push(row.target.name.to_string());
        release_ref(tx, ctx, &row)?;
    }
    if reverted.is_empty() {
        return Ok(r);
    }
    r.update_time = ctx.now;
    let message = format!("references to {} taken back: {reason}", reverted.join(", "));
    put_with_event(tx, ctx, r, EventType::Updated, None, &message)
}

/// Makes a CREATING resource ACTIVE once its cross-region attach succeeded.
pub(crate) fn activate_creating<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    mut r: Resource,
) -> Result<Resource, CoreError> {
    r.state = ResourceState::Active;
    r.update_time = ctx.now;
    tx.remove_pending_attach(r.uid);
    put_with_event(tx, ctx, r, EventType::Created, None, "created")
}

fn is_remote(ctx: Ctx<'_>, name: &ResourceName) -> bool {
    name.region() != ctx.region.as_str()
}

/// Marks a resource DELETING, in one step with everything that goes with it.
fn enter_deleting<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    mut resource: Resource,
    reason: DeletionReason,
    operation: OperationId,
    requested_by: &str,
) -> Result<(), CoreError> {
    // Release our own outgoing references at once, so cycles unwind and the
    // targets we were holding can finish.
    for b in outgoing_backrefs(ctx, &resource) {
        release_ref(tx, ctx, &b)?;
    }
    // Unconfirmed cross-region references are released with the rest.
    tx.remove_pending_attach(resource.uid);
    resource.state = ResourceState::Deleting;
    resource.update_time = ctx.now;
    let message = match &reason {
        DeletionReason::Requested => format!("deletion requested by {requested_by}"),
        DeletionReason::Cascade { from, field } => format!("cascade from {from} (field {field})"),
    };
    let resource = put_with_event(tx, ctx, resource, EventType::Deleting, Some(operation), &message)?;
    let target = target_of(&resource);
    tx.put_deletion(DeletionRecord {
        target: target.clone(),
        deleted_at: ctx.now,
        reason,
        requested_by: requested_by.to_owned(),
        operation,
        status: DeletionStatus::Pending,
    });
    tx.put_work(WorkItem {
        target: target.clone(),
        next_attempt_at: ctx.now,
        attempts: 0,
        last_error: None,
    });
    // A list owner that first lost an element to this operation and is now
    // deleted by it was not, in the end, an unset referrer.
    let was_unset = matches!(
        tx.outcome(operation, &target.name)?,
        Some(Outcome {
            action: OutcomeAction::Unset { .. },
            ..
        })
    );
    tx.put_outcome(
        operation,
        Outcome {
            resource: target,
            action: OutcomeAction::Pending,
            time: ctx.now,
        },
    );
    update_operation(tx, operation, |p| {
        p.pending += 1;
        if was_unset {
            p.unset = p.unset.saturating_sub(1);
        }
    })?;
    Ok(())
}

/// Keeps a deletion that cannot finish now: blocked (or finalizers pending).
/// Retries with backoff; after the maximum, marks it FAILED.
fn hold<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: &Resource,
    mut record: DeletionRecord,
    mut work: WorkItem,
    blockers: Vec<Blocker>,
) -> Result<(), CoreError> {
    let mut reason = describe_blockers(&blockers);
    if !resource.finalizers.is_empty() {
        if !reason.is_empty() {
            reason += "; ";
        }
        reason += &format!("waiting for finalizers: {}", resource.finalizers.join(", "));
    }
    let target = target_of(resource);
    let op = record.operation;
    if let DeletionStatus::Failed { .. } = record.status {
        // Woken while failed and still unable to finish: stays failed.
        tx.remove_work(resource.uid);
        return Ok(());
    }
    let changed = match &record.status {
        DeletionStatus::Blocked {
            blockers: old,
            reason: old_reason,
        } => old != &blockers || old_reason != &reason,
        _ => true,
    };
    // Attempts count checks that found no progress: a blocker going away
    // (which also wakes this deletion early) starts the count again.
    work.attempts = if changed { 1 } else { work.attempts + 1 };
    if work.attempts > ctx.policy.max_attempts {
        let was_blocked = matches!(record.status, DeletionStatus::Blocked { .. });
        let error = format!("gave up after {} attempts: {reason}", ctx.policy.max_attempts);
        record.status = DeletionStatus::Failed { error: error.clone() };
        tx.put_deletion(record);
        tx.remove_work(resource.uid);
        tx.put_outcome(
            op,
            Outcome {
                resource: target.clone(),
                action: OutcomeAction::Failed { error: error.clone() },
                time: ctx.now,
            },
        );
        emit_only(tx, ctx, EventType::DeletionFailed, resource, op, &error)?;
        update_operation(tx, op, |p| {
            p.pending = p.pending.saturating_sub(1);
            p.failed += 1;
            if was_blocked {
                p.blocked = p.blocked.saturating_sub(1);
            }
        })?;
        after_pending_changed(tx, ctx, op)?;
        return Ok(());
    }
    let newly_blocked = !matches!(record.status, DeletionStatus::Blocked { .. });
    if changed {
        record.status = DeletionStatus::Blocked {
            blockers: blockers.clone(),
            reason: reason.clone(),
        };
        tx.put_deletion(record);
        tx.put_outcome(
            op,
            Outcome {
                resource: target,
                action: OutcomeAction::Blocked { blockers },
                time: ctx.now,
            },
        );
        emit_only(tx, ctx, EventType::DeletionBlocked, resource, op, &reason)?;
        if newly_blocked {
            update_operation(tx, op, |p| p.blocked += 1)?;
        }
    }
    work.next_attempt_at = ctx.now.plus_millis(ctx.policy.backoff(work.attempts));
    work.last_error = Some(reason);
    tx.put_work(work);
    Ok(())
}

/// Removes a deleted resource for good.
fn purge<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    resource: Resource,
    record: DeletionRecord,
) -> Result<(), CoreError> {
    let op = record.operation;
    tx.remove_resource(&resource.name, resource.uid);
    tx.remove_deletion(resource.uid);
    tx.remove_work(resource.uid);
    tx.put_outcome(
        op,
        Outcome {
            resource: target_of(&resource),
            action: OutcomeAction::Deleted,
            time: ctx.now,
        },
    );
    emit_only(tx, ctx, EventType::Purged, &resource, op, "purged")?;
    update_operation(tx, op, |p| {
        match record.status {
            DeletionStatus::Failed { .. } => p.failed = p.failed.saturating_sub(1),
            DeletionStatus::Blocked { .. } => {
                p.blocked = p.blocked.saturating_sub(1);
                p.pending = p.pending.saturating_sub(1);
            }
            DeletionStatus::Pending | DeletionStatus::Waiting { .. } => p.pending = p.pending.saturating_sub(1),
        }
        p.deleted += 1;
    })?;
    after_pending_changed(tx, ctx, op)
}

/// Finishes the operation when nothing is pending, or wakes its root when
/// the root is all that is left.
pub(crate) fn after_pending_changed<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    id: OperationId,
) -> Result<(), CoreError> {
    let Some(mut op) = tx.operation(id)? else {
        return Ok(());
    };
    if op.progress.pending <= 1 {
        // The root may be all that is left (or a failed root, nothing at all).
        wake_if_deleting(tx, ctx, op.root.uid)?;
    }
    if op.progress.pending == 0 {
        op.state = if op.progress.failed > 0 {
            OperationState::Failed
        } else {
            OperationState::Succeeded
        };
        op.end_time = Some(ctx.now);
        tx.put_operation(op);
    }
    Ok(())
}

fn update_operation<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    id: OperationId,
    change: impl FnOnce(&mut Progress),
) -> Result<(), CoreError> {
    if let Some(mut op) = tx.operation(id)? {
        change(&mut op.progress);
        op.changes += 1;
        if op.progress.pending > 0 && op.state != OperationState::Running {
            // More of the cascade reached this region's part after it had
            // finished (a second target of the same operation): running again.
            op.state = OperationState::Running;
            op.end_time = None;
        }
        tx.put_operation(op);
    }
    Ok(())
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
    let mut work = tx.work(uid)?.unwrap_or(WorkItem {
        target: record.target.clone(),
        next_attempt_at: ctx.now,
        attempts: 0,
        last_error: None,
    });
    work.next_attempt_at = ctx.now;
    tx.put_work(work);
    Ok(())
}

/// Writes a resource with a fresh revision and the event describing the change.
fn put_with_event<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    mut resource: Resource,
    event_type: EventType,
    operation: Option<OperationId>,
    message: &str,
) -> Result<Resource, CoreError> {
    // Importers must know whether a deletion allows a cascade: they apply
    // it to their own referrers (see `apply_to_referrer`).
    let no_cascade = match operation {
        Some(id) if event_type == EventType::Deleting => tx.operation(id)?.is_some_and(|op| !op.cascade),
        _ => false,
    };
    resource.revision = tx.peek_revision()?;
    tx.put_resource(resource.clone());
    tx.emit(Event {
        revision: 0,
        event_type,
        resource: target_of(&resource),
        snapshot: Some(resource.clone()),
        operation,
        message: message.to_owned(),
        time: ctx.now,
        no_cascade,
    })?;
    Ok(resource)
}

/// An event about a resource without changing the resource itself.
fn emit_only<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    event_type: EventType,
    resource: &Resource,
    operation: OperationId,
    message: &str,
) -> Result<(), CoreError> {
    tx.emit(Event {
        revision: 0,
        event_type,
        resource: target_of(resource),
        snapshot: None,
        operation: Some(operation),
        message: message.to_owned(),
        time: ctx.now,
        no_cascade: false,
    })?;
    Ok(())
}

fn target_of(r: &Resource) -> RefTarget {
    RefTarget {
        name: r.name.clone(),
        uid: r.uid,
    }
}

fn local_name(ctx: Ctx<'_>, raw: &str, field: &str) -> Result<ResourceName, CoreError> {
    let name = ResourceName::parse(raw).map_err(|e| CoreError::invalid(field, e.to_string()))?;
    if name.region() != ctx.region.as_str() {
        return Err(CoreError::WrongRegion {
            region: name.region().to_owned(),
            local: ctx.region.to_string(),
            name,
        });
    }
    if ctx.schema.kind(name.kind()).is_none() {
        return Err(CoreError::invalid(
            field,
            format!("unknown kind {:?} in {name}", name.kind()),
        ));
    }
    Ok(name)
}

fn check_etag(resource: &Resource, etag: Option<&str>) -> Result<(), CoreError> {
    match etag {
        Some(expected) if !expected.is_empty() && expected != resource.etag() => Err(CoreError::EtagMismatch {
            name: resource.name.clone(),
            expected: expected.to_owned(),
            actual: resource.etag(),
        }),
        _ => Ok(()),
    }
}

fn validate_attributes(attributes: &BTreeMap<String, String>, field: &str) -> Result<(), CoreError> {
    if attributes.len() > MAX_ATTRIBUTES {
        return Err(CoreError::invalid(
            field,
            format!("more than {MAX_ATTRIBUTES} attributes"),
        ));
    }
    for (k, v) in attributes {
        if k.is_empty() || k.len() > MAX_ATTRIBUTE_KEY {
            return Err(CoreError::invalid(
                format!("{field}.{k}"),
                format!("attribute keys must be 1 to {MAX_ATTRIBUTE_KEY} bytes"),
            ));
        }
        if v.len() > MAX_ATTRIBUTE_VALUE {
            return Err(CoreError::invalid(
                format!("{field}.{k}"),
                format!("attribute values must be at most {MAX_ATTRIBUTE_VALUE} bytes"),
            ));
        }
    }
    Ok(())
}

fn validate_finalizers(finalizers: &[String], field: &str) -> Result<(), CoreError> {
    if finalizers.len() > MAX_FINALIZERS {
        return Err(CoreError::invalid(
            field,
            format!("more than {MAX_FINALIZERS} finalizers"),
        ));
    }
    let unique: BTreeSet<&String> = finalizers.iter().collect();
    if unique.len() != finalizers.len() || finalizers.iter().any(|f| f.is_empty() || f.len() > 128) {
        return Err(CoreError::invalid(
            field,
            "finalizers must be unique, non-empty, at most 128 bytes",
        ));
    }
    Ok(())
}

/// Validates requested references against the schema and resolves them to
/// live targets. Every target must exist, be ACTIVE, and (if pinned) have
/// the given uid: nothing attaches to a DELETING resource. An
/// `allow_dangling` target that an update keeps (`existing`) stays pinned
/// to its incarnation, even when it is gone or its name was re-used.
fn resolve_refs<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    kind: &str,
    requested: &BTreeMap<String, Vec<RefRequest>>,
    field_prefix: &str,
    existing: Option<&BTreeMap<String, Vec<RefTarget>>>,
) -> Result<BTreeMap<String, Vec<RefTarget>>, CoreError> {
    let kind_spec = ctx
        .schema
        .kind(kind)
        .ok_or_else(|| CoreError::invalid("name", format!("unknown kind {kind:?}")))?;
    let mut out = BTreeMap::new();
    for (field, targets) in requested {
        let path = format!("{field_prefix}.{field}");
        let spec = kind_spec
            .refs
            .get(field)
            .ok_or_else(|| CoreError::invalid(&path, format!("kind {kind:?} has no reference field {field:?}")))?;
        if targets.is_empty() {
            continue;
        }
        if !spec.many && targets.len() > 1 {
            return Err(CoreError::invalid(
                &path,
                "takes one target (it is not a list reference)",
            ));
        }
        if targets.len() > MAX_TARGETS_PER_FIELD {
            return Err(CoreError::invalid(
                &path,
                format!("more than {MAX_TARGETS_PER_FIELD} targets"),
            ));
        }
        let mut resolved: Vec<RefTarget> = Vec::with_capacity(targets.len());
        for (i, t) in targets.iter().enumerate() {
            let at = if spec.many {
                format!("{path}[{i}]")
            } else {
                path.clone()
            };
            let name = ResourceName::parse(&t.name).map_err(|e| CoreError::invalid(&at, e.to_string()))?;
            if name.kind() != spec.kind {
                return Err(CoreError::invalid(
                    &at,
                    format!("must reference a {}, not a {}", spec.kind, name.kind()),
                ));
            }
            if is_remote(ctx, &name) {
                // The node resolved it at its owner (which refuses missing
                // and DELETING targets); here we only refuse one we saw
                // enter DELETING since.
                let Some(uid) = t.uid else {
                    return Err(CoreError::RemoteReference {
                        field: at,
                        target: name,
                    });
                };
                if tx.remote_deletion(uid)?.is_some() {
                    return Err(CoreError::TargetDeleting {
                        field: at,
                        target: name,
                    });
                }
                if resolved.iter().any(|r| r.name == name) {
                    return Err(CoreError::invalid(&at, format!("{name} is listed twice")));
                }
                resolved.push(RefTarget { name, uid });
                continue;
            }
            if resolved.iter().any(|r| r.name == name) {
                return Err(CoreError::invalid(&at, format!("{name} is listed twice")));
            }
            if spec.on_delete == OnDelete::AllowDangling {
                let kept = existing
                    .and_then(|e| e.get(field))
                    .and_then(|old| old.iter().find(|o| o.name == name && t.uid.is_none_or(|u| u == o.uid)));
                if let Some(kept) = kept {
                    resolved.push(kept.clone());
                    continue;
                }
            }
            let target = match tx.resource(&name)? {
                None => {
                    return Err(CoreError::TargetNotFound {
                        field: at,
                        target: name,
                    })
                }
                // Only a member of the same batch may reference a CREATING
                // resource (it is settled together with it).
                Some(r) if r.state == ResourceState::Creating && !tx.is_written(&name) => {
                    return Err(CoreError::TargetNotFound {
                        field: at,
                        target: name,
                    })
                }
                Some(r) if r.state == ResourceState::Deleting => {
                    return Err(CoreError::TargetDeleting {
                        field: at,
                        target: name,
                    })
                }
                Some(r) => r,
            };
            if let Some(uid) = t.uid {
                if uid != target.uid {
                    return Err(CoreError::TargetUidMismatch {
                        field: at,
                        target: name,
                        expected: uid.to_string(),
                        actual: target.uid.to_string(),
                    });
                }
            }
            resolved.push(RefTarget { name, uid: target.uid });
        }
        out.insert(field.clone(), resolved);
    }
    for (field, spec) in &kind_spec.refs {
        if spec.required && !out.contains_key(field) {
            return Err(CoreError::invalid(
                format!("{field_prefix}.{field}"),
                format!("required reference to a {} is missing", spec.kind),
            ));
        }
    }
    Ok(out)
}

/// Back-reference keys a resource's references hold (tracked kinds only).
fn tracked_keys(ctx: Ctx<'_>, r: &Resource) -> BTreeMap<BackRefKey, (RefTarget, OnDelete)> {
    let mut out = BTreeMap::new();
    for (field, targets) in &r.refs {
        let Some(spec) = ctx.schema.reference(r.kind(), field) else {
            continue;
        };
        if !spec.on_delete.tracked() {
            continue;
        }
        for t in targets {
            out.insert(
                BackRefKey {
                    target: t.uid,
                    referrer: r.uid,
                    field: field.clone(),
                },
                (t.clone(), spec.on_delete),
            );
        }
    }
    out
}

/// The back-reference rows a resource's references hold.
fn outgoing_backrefs(ctx: Ctx<'_>, r: &Resource) -> Vec<BackRef> {
    tracked_keys(ctx, r)
        .into_iter()
        .map(|(key, (target, on_delete))| BackRef {
            target,
            referrer: target_of(r),
            field: key.field,
            on_delete,
            generation: 0,
            attached_at: Timestamp::default(),
        })
        .collect()
}

fn remote_region(ctx: Ctx<'_>, target: &RefTarget) -> Option<String> {
    is_remote(ctx, &target.name).then(|| target.name.region().to_owned())
}

/// Writes the rows of a resource's new references and returns the keys of
/// the cross-region ones (to be attached at their owners). A mirror row
/// gets this node's next release generation: the attach carries it, and a
/// release queued before it is older.
fn attach_backrefs<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    r: &Resource,
    already: Option<&BTreeMap<BackRefKey, (RefTarget, OnDelete)>>,
) -> Result<Vec<BackRefKey>, CoreError> {
    let mut remote = Vec::new();
    for (key, (target, on_delete)) in tracked_keys(ctx, r) {
        if already.is_some_and(|a| a.contains_key(&key)) {
            continue;
        }
        let generation = if is_remote(ctx, &target.name) {
            remote.push(key.clone());
            tx.next_generation()?
        } else {
            0
        };
        tx.put_backref(BackRef {
            target,
            referrer: target_of(r),
            field: key.field,
            on_delete,
            generation,
            attached_at: ctx.now,
        });
    }
    Ok(remote)
}
