//! Create and update, and the end of a cross-region create: a CREATING
//! resource made ACTIVE, aborted, or its refused references taken back.
//!
//! Each writes a resource together with the back-reference rows of its
//! references in one step. A DELETING resource only takes the removal of
//! finalizers here; deletion itself is `delete.rs` and `work.rs`.

use std::collections::BTreeMap;

use crate::error::CoreError;
use crate::model::{BackRefKey, EventType, PendingAttach, Resource, ResourceState};
use crate::name::{IdSource, Uid};
use crate::state::{StateRead, Tx};

use super::backrefs::{attach_backrefs, outgoing_backrefs, release_ref, remote_region, tracked_keys};
use super::bookkeeping::put_with_event;
use super::validate::{check_etag, local_name, resolve_refs, validate_attributes, validate_finalizers, MemberField};
use super::{target_of, Ctx, ResourceSpec, Step};

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
    // Remote targets seen DELETING, read once per target for the batch.
    let mut deleting = BTreeMap::new();
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
        let at = |field| MemberField {
            member: many.then_some(i),
            field,
        };
        let name = local_name(ctx, &spec.name, &at("name"))?;
        validate_attributes(&spec.attributes, &at("attributes"))?;
        validate_finalizers(&spec.finalizers, &at("finalizers"))?;
        if let Some(existing) = tx.resource(&name)? {
            if existing.state == ResourceState::Creating {
                // Nobody can read it yet: the caller settles it first
                // (`CoreError::CreateUnsettled`), ALREADY_EXISTS is only
                // for what a Get returns.
                return Err(CoreError::CreateUnsettled {
                    name,
                    uid: existing.uid,
                });
            }
            if let (ResourceState::Deleted, Some(soft)) = (existing.state, existing.soft_deleted) {
                // Soft-deleted: the name stays reserved until it is purged.
                return Err(CoreError::SoftDeleted {
                    name,
                    uid: existing.uid,
                    expire_time: soft.expire_time,
                    operation: soft.operation,
                    exists: true,
                });
            }
            let detail = if existing.state == ResourceState::Deleting {
                " and is being deleted; the name is free again once it is purged"
            } else {
                ""
            };
            return Err(CoreError::AlreadyExists { name, detail });
        }
        let refs = resolve_refs(&tx, ctx, name.kind(), &spec.refs, &at("refs"), None, &mut deleting)?;
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
            liens: Vec::new(),
            soft_deleted: None,
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
    let Some(current) = tx.resource(&name)?.filter(|r| !r.state.reads_as_absent()) else {
        return Err(CoreError::NotFound(name));
    };
    check_etag(&current, etag)?;
    if current.state == ResourceState::Deleting {
        return finish_finalizers(tx, ctx, current, spec);
    }
    let refs = resolve_refs(
        &tx,
        ctx,
        name.kind(),
        &spec.refs,
        "refs",
        Some(&current.refs),
        &mut BTreeMap::new(),
    )?;
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

/// The one update a DELETING resource takes: finalizers removed, nothing
/// else changed. It wakes the deletion, which may now finish.
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
    let next = put_with_event(&mut tx, ctx, next, EventType::Updated, None, "finalizers removed")?;
    super::finalizer::after_finalizers_removed(&mut tx, ctx, &next)?;
    Ok(Step {
        value: next,
        writes: tx.finish(),
    })
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
        if let Some(sibling) = tx.incarnation(&b.referrer)? {
            if sibling.state == ResourceState::Creating {
                abort_creating(tx, ctx, sibling)?;
            }
        }
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
