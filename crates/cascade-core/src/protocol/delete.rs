//! Accepting a delete: the preconditions (a lien; a live `block`
//! reference, or without `cascade` a dependent that would be deleted; the
//! etag), the operation, and the root entering DELETING, all in one step;
//! and the dry run's walk of the closure, which changes nothing.
//!
//! An orphan delete (`DeleteRequest::orphan`) is a delete without cascade
//! that is not refused for its `cascade` referrers: they lose the reference
//! (a list element, or the field, even a `required` one) and survive,
//! reported UNSET, in every region, exactly as the referrers of a delete
//! without cascade do.
//!
//! What an accepted delete then does to the closure is `work.rs`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::auth::{Principal, Target, Verb};
use crate::error::{CoreError, Dependent};
use crate::model::{
    BackRef, BackRefKey, Blocker, DeletionReason, Operation, OperationState, Progress, RefTarget, Resource,
    ResourceState,
};
use crate::name::{IdSource, OperationId, Uid};
use crate::schema::OnDelete;
use crate::state::{BackRefPages, StateRead, Tx, WriteSet};

use super::bookkeeping::{enter_deleting, is_unreferenced_leaf};
use super::lien::check_liens;
use super::validate::{check_etag, local_name};
use super::{
    is_remote, target_of, Ctx, DeleteOutcome, DeleteRequest, Plan, PlannedBlock, PlannedDenial, PlannedUnset, Step,
    CLOSURE_TOO_LARGE, MAX_DENIED_LISTED,
};

/// Accepts (or plans) the deletion of one resource.
pub fn delete<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    ids: &mut dyn IdSource,
    req: DeleteRequest,
) -> Result<Step<DeleteOutcome>, CoreError> {
    let mut tx = Tx::new(state);
    let name = local_name(ctx, &req.name, "name")?;
    let most = crate::limits::MAX_REQUESTED_BY_BYTES;
    if req.requested_by.len() > most {
        return Err(super::validate::too_long("requested_by", &req.requested_by, most));
    }
    if req.retain_ms > ctx.policy.max_retention_ms {
        return Err(CoreError::invalid(
            "retention_seconds",
            format!(
                "{} is longer than this node's maximum retention ({}, [limits] max_retention)",
                crate::time_text::duration(req.retain_ms),
                crate::time_text::duration(ctx.policy.max_retention_ms)
            ),
        ));
    }
    if req.orphan && req.cascade {
        return Err(CoreError::invalid(
            "propagation",
            "orphan keeps every referrer: it cannot be combined with cascade = true",
        ));
    }
    let found = tx
        .resource(&name)?
        .filter(|r| !r.state.reads_as_absent())
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
    req.bounds.check()?;
    check_etag(&resource, req.etag.as_deref())?;
    check_liens(&resource)?;
    // An orphan delete refuses only for `block` referrers: its `cascade`
    // referrers lose the reference instead of being deleted.
    let cascade = req.cascade && !req.orphan;
    check_preconditions(&tx, ctx, &resource, req.cascade || req.orphan, &req.remote_kept)?;
    if req.dry_run {
        let plan = plan_closure(&tx, ctx, vec![target_of(&resource)], cascade, Some(&req.principal))?;
        return Ok(Step {
            value: DeleteOutcome::DryRun(plan),
            writes: WriteSet::default(),
        });
    }
    // The root is the first member counted against a budget.
    let controls = req.bounds.root_controls(ctx.now).map(|mut c| {
        c.admitted = 1;
        c
    });
    let op = Operation {
        id: req.operation_id.unwrap_or_else(|| OperationId(ids.next_uuid())),
        root: RefTarget {
            name: resource.name.clone(),
            uid: resource.uid,
        },
        requested_by: req.requested_by.clone(),
        cascade,
        state: OperationState::Running,
        progress: Progress::default(),
        create_time: ctx.now,
        end_time: None,
        reached: BTreeSet::new(),
        changes: 0,
        closure_confirmed: false,
        controls,
        undelete: None,
        principal: req.principal.clone(),
        retain_ms: req.retain_ms,
    };
    tx.put_operation(op.clone());
    let leaf = is_unreferenced_leaf(&tx, &resource)?;
    let root = resource.uid;
    enter_deleting(
        &mut tx,
        ctx,
        resource,
        DeletionReason::Requested,
        op.id,
        &req.requested_by,
        &req.principal,
    )?;
    if leaf {
        // Nothing references it, so its deletion's first work step has
        // nothing to wait for: it runs here, and the delete of a leaf ends
        // in the step that accepts it, instead of waiting behind every
        // item a running cascade has made due (`work::finish_accepted`).
        super::work::finish_accepted(&mut tx, ctx, root)?;
    }
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
    let mut list = |list: &mut Vec<Dependent>, b: BackRef| {
        if list.len() < ctx.policy.max_listed {
            list.push(Dependent {
                referrer: b.referrer.name,
                field: b.field,
                on_delete: b.on_delete,
            });
        } else {
            more += 1;
        }
    };
    if cascade {
        // Only `block` rows can refuse it: read those alone (the store
        // keeps an index of them), not every referrer of a root whose
        // closure may be a million resources.
        for b in tx.blocking_backrefs(resource.uid, usize::MAX)? {
            list(&mut blockers, b);
        }
    } else {
        let mut pages = BackRefPages::new(resource.uid);
        while let Some(page) = pages.next_page(tx, 1024)? {
            for b in page {
                match b.on_delete {
                    OnDelete::Block => list(&mut blockers, b),
                    OnDelete::Cascade => {
                        // A list owner that keeps another live element only
                        // loses one. A remote one's region answered for it.
                        let keeps_others = if is_remote(ctx, &b.referrer.name) {
                            remote_kept.contains(&b.key())
                        } else {
                            match tx.incarnation(&b.referrer)? {
                                Some(r) => keeps_live_other_target(tx, ctx, &r, &b.field, resource.uid)?,
                                None => false,
                            }
                        };
                        if !keeps_others {
                            list(&mut dependents, b);
                        }
                    }
                    OnDelete::Unset | OnDelete::AllowDangling => {}
                }
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
///
/// With a `principal`, under a policy that may refuse, it is also the
/// closure check: every member of this region the delete would change is
/// decided under this region's policy (`delete` for one it deletes, seeds
/// of this region included; `update` for a referrer it unsets or orphans),
/// and the refusals are listed in `Plan::denied`. The check walks up to
/// `Policy::max_closure_check` resources (a larger closure is a denial,
/// [`super::CLOSURE_TOO_LARGE`]); the plan still lists at most
/// `Policy::max_plan` deleted resources.
pub(crate) fn plan_closure<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    seeds: Vec<RefTarget>,
    cascade: bool,
    principal: Option<&Principal>,
) -> Result<Plan, CoreError> {
    let checked = principal.filter(|_| !ctx.authorizer.allows_everything());
    let limit = if checked.is_some() {
        ctx.policy.max_closure_check.max(ctx.policy.max_plan)
    } else {
        ctx.policy.max_plan
    };
    let mut stopped_at: Option<RefTarget> = None;
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
        let mut pages = BackRefPages::new(uid);
        while let Some(page) = pages.next_page(tx, 1024)? {
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
                        let Some(q) = tx.incarnation(&b.referrer)? else {
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
                            if deleted.len() >= limit {
                                truncated = true;
                                stopped_at.get_or_insert_with(|| b.referrer.clone());
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
    let unset: Vec<PlannedUnset> = unset
        .into_iter()
        .filter(|((uid, _), _)| !deleted.contains_key(uid))
        .map(|((_, field), resource)| PlannedUnset { resource, field })
        .collect();
    let (denied, denied_more) = match checked {
        Some(principal) => denials(ctx, principal, &order, &unset, stopped_at),
        None => (Vec::new(), 0),
    };
    if order.len() > ctx.policy.max_plan {
        order.truncate(ctx.policy.max_plan);
        truncated = true;
    }
    let mut blocked = Vec::new();
    for (resource, b) in blocks {
        if deleted.contains_key(&b.referrer.uid) {
            continue;
        }
        let referrer_deleting = tx
            .incarnation(&b.referrer)?
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
        denied,
        denied_more,
        remote_seeds: remote_seeds
            .into_iter()
            .map(|(region, targets)| (region, targets.into_iter().collect()))
            .collect(),
    })
}

/// The closure check of one region's part: what `principal` may not do to
/// the members of this region the delete changes (deleted: `delete`;
/// unset or orphaned: `update`), in walk order, at most
/// [`MAX_DENIED_LISTED`] listed and the rest counted. A walk that stopped
/// at its bound (`stopped_at`) is a denial of its own: the rest of the
/// closure was not checked.
fn denials(
    ctx: Ctx<'_>,
    principal: &Principal,
    deleted: &[RefTarget],
    unset: &[PlannedUnset],
    stopped_at: Option<RefTarget>,
) -> (Vec<PlannedDenial>, u64) {
    let mut denied = Vec::new();
    let mut more = 0u64;
    let mut note = |resource: &RefTarget, verb: Verb, rule: String| {
        if denied.len() < MAX_DENIED_LISTED {
            denied.push(PlannedDenial {
                resource: resource.name.clone(),
                verb,
                rule,
            });
        } else {
            more += 1;
        }
    };
    let changes = deleted
        .iter()
        .filter(|d| !is_remote(ctx, &d.name))
        .map(|d| (d, Verb::Delete))
        .chain(unset.iter().map(|u| (&u.resource, Verb::Update)));
    for (member, verb) in changes {
        let decision = ctx.authorizer.decide(principal, verb, Target::Resource(&member.name));
        if !decision.allowed {
            note(member, verb, decision.rule);
        }
    }
    if let Some(member) = stopped_at {
        note(&member, Verb::Delete, CLOSURE_TOO_LARGE.to_owned());
    }
    (denied, more)
}
