//! Liens: named protections of one resource against deletion (Google
//! Cloud's liens, Pulumi's `protect`, Crossplane's Usage).
//!
//! A lien is kept in the resource itself, so the cascade that reaches a
//! resource reads whether it is protected with the resource, at no extra
//! read. While a resource holds one:
//! - a user delete of it is refused, FAILED_PRECONDITION naming every lien
//!   and its reason ([`check_liens`], called by `delete`);
//! - a cascade that reaches it marks it DELETING (its references are
//!   released as for any deletion) but does not purge it: the deletion is
//!   held BLOCKED with the lien in its reason, like a `block` referrer, and
//!   removing the lien wakes it.
//!
//! A lien cannot be added to a DELETING resource (it would protect nothing
//! the deletion has not already done); it can be removed from one.

use crate::error::CoreError;
use crate::model::{EventType, Lien, Resource, ResourceState};
use crate::state::{StateRead, Tx};

use super::bookkeeping::{put_with_event, wake_if_deleting};
use super::validate::{check_etag, local_name, too_long};
use super::{Ctx, Step};

/// Liens one resource may hold.
pub const MAX_LIENS: usize = 16;
use crate::limits::{MAX_LIEN_ID_BYTES as MAX_LIEN_ID, MAX_REASON_BYTES as MAX_LIEN_REASON, MAX_REQUESTED_BY_BYTES};

/// A client's AddLien.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddLien {
    /// The resource to protect, in this node's region.
    pub name: String,
    /// The lien's id: 1 to 128 bytes, unique among the resource's liens.
    pub id: String,
    /// Why: 1 to 1024 bytes, shown in every refusal it causes.
    pub reason: String,
    /// Who asks (kept in the lien).
    pub requested_by: String,
    /// When set and not empty, the resource's current etag must equal it.
    pub etag: Option<String>,
}

/// Protects a resource with a lien. Adding a lien it already holds with
/// the same reason answers the resource unchanged (a retried request);
/// with another reason, ALREADY_EXISTS.
pub fn add_lien<S: StateRead + ?Sized>(state: &S, ctx: Ctx<'_>, req: AddLien) -> Result<Step<Resource>, CoreError> {
    let mut tx = Tx::new(state);
    let name = local_name(ctx, &req.name, "name")?;
    if req.id.is_empty() || req.id.len() > MAX_LIEN_ID || req.id.chars().any(char::is_control) {
        return Err(CoreError::invalid(
            "lien_id",
            format!("must be 1 to {MAX_LIEN_ID} bytes without control characters"),
        ));
    }
    if req.requested_by.len() > MAX_REQUESTED_BY_BYTES {
        return Err(too_long("requested_by", &req.requested_by, MAX_REQUESTED_BY_BYTES));
    }
    if req.reason.trim().is_empty() || req.reason.len() > MAX_LIEN_REASON {
        return Err(CoreError::invalid(
            "reason",
            format!("a lien needs a reason of 1 to {MAX_LIEN_REASON} bytes"),
        ));
    }
    let mut resource = live_resource(&tx, &name)?;
    check_etag(&resource, req.etag.as_deref())?;
    if let Some(held) = resource.liens.iter().find(|l| l.id == req.id) {
        if held.reason == req.reason {
            return Ok(Step {
                value: resource,
                writes: Default::default(),
            });
        }
        return Err(CoreError::LienExists {
            name,
            id: req.id,
            reason: held.reason.clone(),
        });
    }
    if resource.state == ResourceState::Deleting {
        return Err(CoreError::Deleting { name });
    }
    if resource.liens.len() >= MAX_LIENS {
        return Err(CoreError::invalid(
            "lien_id",
            format!("{name} already holds {MAX_LIENS} liens, the most a resource may hold"),
        ));
    }
    let message = format!("lien {} added: {}", req.id, req.reason);
    resource.liens.push(Lien {
        id: req.id,
        reason: req.reason,
        origin: req.requested_by,
        create_time: ctx.now,
    });
    resource.update_time = ctx.now;
    let resource = put_with_event(&mut tx, ctx, resource, EventType::Updated, None, &message)?;
    Ok(Step {
        value: resource,
        writes: tx.finish(),
    })
}

/// Removes a lien. A deletion it held is woken: it may now finish.
pub fn remove_lien<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    name: &str,
    id: &str,
    etag: Option<&str>,
) -> Result<Step<Resource>, CoreError> {
    let mut tx = Tx::new(state);
    let name = local_name(ctx, name, "name")?;
    if id.len() > MAX_LIEN_ID {
        return Err(too_long("lien_id", id, MAX_LIEN_ID));
    }
    let mut resource = live_resource(&tx, &name)?;
    check_etag(&resource, etag)?;
    let before = resource.liens.len();
    resource.liens.retain(|l| l.id != id);
    if resource.liens.len() == before {
        return Err(CoreError::LienNotFound {
            name,
            id: id.to_owned(),
        });
    }
    resource.update_time = ctx.now;
    let uid = resource.uid;
    let resource = put_with_event(
        &mut tx,
        ctx,
        resource,
        EventType::Updated,
        None,
        &format!("lien {id} removed"),
    )?;
    wake_if_deleting(&mut tx, ctx, uid)?;
    Ok(Step {
        value: resource,
        writes: tx.finish(),
    })
}

/// Refuses the user delete of a resource that holds liens, naming them.
pub(super) fn check_liens(resource: &Resource) -> Result<(), CoreError> {
    if resource.liens.is_empty() {
        return Ok(());
    }
    Err(CoreError::Liened {
        name: resource.name.clone(),
        liens: resource.liens.clone(),
    })
}

/// The resource a lien call names: it must exist (a CREATING one reads as
/// absent, as for every client call).
fn live_resource<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    name: &crate::name::ResourceName,
) -> Result<Resource, CoreError> {
    tx.resource(name)?
        .filter(|r| !r.state.reads_as_absent())
        .ok_or_else(|| CoreError::NotFound(name.clone()))
}
