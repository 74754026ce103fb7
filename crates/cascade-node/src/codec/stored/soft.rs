//! The layouts soft delete (issue 29) appends: a DELETED resource's window,
//! an operation's and a tombstone's retention, a DELETING event's
//! retention (and a SOFT_DELETED event's snapshot window), and an unset
//! outcome's undo record. Each wraps the previous layout of its record and
//! is written only when it has something to say, so every record of a
//! deletion without a retention keeps the bytes it always had.

use cascade_core::model;
use cascade_core::name::NameError;
use cascade_core::Timestamp;
use serde::{Deserialize, Serialize};

use super::{op, targets, EventV3, Id, OperationV2, Outcome, RefTarget, RemoteDeletionV3, ResourceV2};

/// [`model::SoftDeletion`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SoftDeletion {
    pub delete_time: u64,
    pub expire_time: u64,
    pub operation: Id,
}

impl From<&model::SoftDeletion> for SoftDeletion {
    fn from(s: &model::SoftDeletion) -> Self {
        SoftDeletion {
            delete_time: s.delete_time.0,
            expire_time: s.expire_time.0,
            operation: *s.operation.0.as_bytes(),
        }
    }
}

impl From<SoftDeletion> for model::SoftDeletion {
    fn from(s: SoftDeletion) -> Self {
        model::SoftDeletion {
            delete_time: Timestamp(s.delete_time),
            expire_time: Timestamp(s.expire_time),
            operation: op(s.operation),
        }
    }
}

/// [`model::Resource`], version 3 (see [`crate::codec::VERSION_POSTCARD_V3`]):
/// version 2's fields, then the soft-deleted window. Written only for a
/// DELETED resource.
#[derive(Debug, Serialize, Deserialize)]
pub struct ResourceV3<'a> {
    #[serde(borrow)]
    pub v2: ResourceV2<'a>,
    pub soft_deleted: Option<SoftDeletion>,
}

impl<'a> From<&'a model::Resource> for ResourceV3<'a> {
    fn from(r: &'a model::Resource) -> Self {
        ResourceV3 {
            v2: ResourceV2::from(r),
            soft_deleted: r.soft_deleted.as_ref().map(SoftDeletion::from),
        }
    }
}

impl TryFrom<ResourceV3<'_>> for model::Resource {
    type Error = NameError;
    fn try_from(r: ResourceV3<'_>) -> Result<Self, NameError> {
        let mut resource = model::Resource::try_from(r.v2)?;
        resource.soft_deleted = r.soft_deleted.map(Into::into);
        Ok(resource)
    }
}

/// [`model::Operation`], version 3: version 2's fields, then the retention
/// the delete asked for. Written only for an operation with one.
#[derive(Debug, Serialize, Deserialize)]
pub struct OperationV3<'a> {
    #[serde(borrow)]
    pub v2: OperationV2<'a>,
    pub retain_ms: u64,
}

impl<'a> From<&'a model::Operation> for OperationV3<'a> {
    fn from(o: &'a model::Operation) -> Self {
        OperationV3 {
            v2: OperationV2::from(o),
            retain_ms: o.retain_ms,
        }
    }
}

impl TryFrom<OperationV3<'_>> for model::Operation {
    type Error = NameError;
    fn try_from(o: OperationV3<'_>) -> Result<Self, NameError> {
        let mut operation = model::Operation::try_from(o.v2)?;
        operation.retain_ms = o.retain_ms;
        Ok(operation)
    }
}

/// [`model::Event`], version 4 (see [`crate::codec::VERSION_POSTCARD_V4`]):
/// version 3's fields, then the retention a DELETING event carries to
/// importers and the window of its snapshot (a SOFT_DELETED event's).
/// Written only when either is there.
#[derive(Debug, Serialize, Deserialize)]
pub struct EventV4<'a> {
    #[serde(borrow)]
    pub v3: EventV3<'a>,
    pub retain_ms: u64,
    pub snapshot_soft_deleted: Option<SoftDeletion>,
}

impl<'a> From<&'a model::Event> for EventV4<'a> {
    fn from(e: &'a model::Event) -> Self {
        EventV4 {
            v3: EventV3::from(e),
            retain_ms: e.retain_ms,
            snapshot_soft_deleted: e
                .snapshot
                .as_ref()
                .and_then(|r| r.soft_deleted.as_ref())
                .map(SoftDeletion::from),
        }
    }
}

impl TryFrom<EventV4<'_>> for model::Event {
    type Error = NameError;
    fn try_from(e: EventV4<'_>) -> Result<Self, NameError> {
        let mut event = model::Event::try_from(e.v3)?;
        event.retain_ms = e.retain_ms;
        if let Some(snapshot) = event.snapshot.as_mut() {
            snapshot.soft_deleted = e.snapshot_soft_deleted.map(Into::into);
        }
        Ok(event)
    }
}

/// [`model::RemoteDeletion`], version 4: version 3's fields, then the
/// owner's retention. Written only for a tombstone with one.
#[derive(Debug, Serialize, Deserialize)]
pub struct RemoteDeletionV4<'a> {
    #[serde(borrow)]
    pub v3: RemoteDeletionV3<'a>,
    pub retain_ms: u64,
}

impl<'a> From<&'a model::RemoteDeletion> for RemoteDeletionV4<'a> {
    fn from(r: &'a model::RemoteDeletion) -> Self {
        RemoteDeletionV4 {
            v3: RemoteDeletionV3::from(r),
            retain_ms: r.retain_ms,
        }
    }
}

impl TryFrom<RemoteDeletionV4<'_>> for model::RemoteDeletion {
    type Error = NameError;
    fn try_from(r: RemoteDeletionV4<'_>) -> Result<Self, NameError> {
        let mut tombstone = model::RemoteDeletion::try_from(r.v3)?;
        tombstone.retain_ms = r.retain_ms;
        Ok(tombstone)
    }
}

/// [`model::UnsetUndo`].
#[derive(Debug, Serialize, Deserialize)]
pub struct UnsetUndo<'a> {
    #[serde(borrow)]
    pub old_targets: Vec<RefTarget<'a>>,
    pub revision: u64,
}

/// [`model::Outcome`], version 2: version 1's fields, then what an unset
/// took from its referrer (written only for an unset whose target is kept
/// with a retention; see [`model::OutcomeAction::Unset`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct OutcomeV2<'a> {
    #[serde(borrow)]
    pub v1: Outcome<'a>,
    #[serde(borrow)]
    pub undo: Option<UnsetUndo<'a>>,
}

impl<'a> From<&'a model::Outcome> for OutcomeV2<'a> {
    fn from(o: &'a model::Outcome) -> Self {
        let undo = match &o.action {
            model::OutcomeAction::Unset { undo: Some(u), .. } => Some(UnsetUndo {
                old_targets: u.old_targets.iter().map(RefTarget::from).collect(),
                revision: u.revision,
            }),
            _ => None,
        };
        OutcomeV2 {
            v1: Outcome::from(o),
            undo,
        }
    }
}

impl TryFrom<OutcomeV2<'_>> for model::Outcome {
    type Error = NameError;
    fn try_from(o: OutcomeV2<'_>) -> Result<Self, NameError> {
        let mut outcome = model::Outcome::try_from(o.v1)?;
        if let (model::OutcomeAction::Unset { undo, .. }, Some(u)) = (&mut outcome.action, o.undo) {
            *undo = Some(model::UnsetUndo {
                old_targets: targets(u.old_targets)?,
                revision: u.revision,
            });
        }
        Ok(outcome)
    }
}
