//! The back-reference rows a resource's references hold: which references
//! are tracked, writing the rows of new ones, and releasing one (through a
//! queued release to its owner when the target is in another region).
//!
//! A row is written or dropped with the reference it mirrors, in the same
//! step, by every path that changes references.

use std::collections::BTreeMap;

use crate::error::CoreError;
use crate::model::{BackRef, BackRefKey, PendingRelease, RefTarget, Resource, Timestamp};
use crate::schema::OnDelete;
use crate::state::{StateRead, Tx};

use super::bookkeeping::{forget_released_row, wake_if_deleting};
use super::{is_remote, target_of, Ctx};

/// Drops the back-reference row of one reference: for a remote target also
/// queues the release to its owner; for a local target being deleted, wakes it.
pub(super) fn release_ref<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    b: &BackRef,
) -> Result<(), CoreError> {
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
        forget_released_row(tx, ctx, b)?;
        wake_if_deleting(tx, ctx, b.target.uid)
    }
}

/// Back-reference keys a resource's references hold (tracked kinds only).
pub(super) fn tracked_keys(ctx: Ctx<'_>, r: &Resource) -> BTreeMap<BackRefKey, (RefTarget, OnDelete)> {
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
pub(super) fn outgoing_backrefs(ctx: Ctx<'_>, r: &Resource) -> Vec<BackRef> {
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

/// The region of `target` when it is not this one.
pub(super) fn remote_region(ctx: Ctx<'_>, target: &RefTarget) -> Option<String> {
    is_remote(ctx, &target.name).then(|| target.name.region().to_owned())
}

/// Writes the rows of a resource's new references and returns the keys of
/// the cross-region ones (to be attached at their owners). A mirror row
/// gets this node's next release generation: the attach carries it, and a
/// release queued before it is older.
pub(super) fn attach_backrefs<S: StateRead + ?Sized>(
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
