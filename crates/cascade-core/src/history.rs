//! A resource's history: its region's outbox events read as what happened
//! to it (`Resources.GetHistory`; README, "The console").
//!
//! The outbox is the one record a node keeps of every change, in revision
//! order, each event with the resource after it, the operation that caused
//! it and its account; it keeps the newest `outbox_retention` events, so a
//! history is honest about where it starts. This module only reads:
//! it turns one resource's events, oldest first, into entries of a
//! history, newest first. The node finds the events (`history.rs` there).

use crate::model::{Event, EventType, Revision, Timestamp};
use crate::OperationId;

/// What kind of thing happened, as a person asks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryKind {
    /// It became visible (created, or a CREATING one settled).
    Created,
    /// Attributes, finalizers or liens changed; references did not.
    Updated,
    /// An update added references (it may have removed others too).
    ReferenceAdded,
    /// An update removed references.
    ReferenceRemoved,
    /// A cascade cleared one of its references (`on_delete = unset`).
    UnsetByCascade,
    /// It entered DELETING: asked for, or reached by a cascade.
    DeletionRequested,
    /// Its deletion is held by blockers.
    DeletionBlocked,
    /// Its deletion was given up after its maximum attempts.
    DeletionFailed,
    /// A finalizer's controller is asked again.
    FinalizerRetry,
    /// An administrator forced its deletion through.
    DeletionForced,
    /// Its deletion finished with a retention: DELETED, kept until purged.
    SoftDeleted,
    /// Removed for good.
    Deleted,
    /// An undelete brought it back.
    Undeleted,
}

/// One entry of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// Its event's revision in the region's outbox.
    pub revision: Revision,
    /// When it happened.
    pub time: Timestamp,
    /// What happened.
    pub kind: HistoryKind,
    /// The event's own account.
    pub message: String,
    /// Who, when the event knows: the principal of a deletion or a forced
    /// purge. None otherwise (an update's event does not name its caller).
    pub by: Option<String>,
    /// The operation that caused it.
    pub operation: Option<OperationId>,
}

/// The entries of `events` (one resource's, oldest first), newest first.
/// `before` is the resource's event just older than the first of `events`,
/// when known: an update is compared with it to tell a reference added or
/// removed from another change.
pub fn entries(before: Option<&Event>, events: &[Event]) -> Vec<HistoryEntry> {
    let mut previous = before;
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        out.push(entry(previous, event));
        previous = Some(event);
    }
    out.reverse();
    out
}

fn entry(previous: Option<&Event>, event: &Event) -> HistoryEntry {
    let kind = match event.event_type {
        EventType::Created => HistoryKind::Created,
        // A cascade's unset carries its operation; a client's update none.
        EventType::Updated if event.operation.is_some() && event.message.contains(" cleared: ") => {
            HistoryKind::UnsetByCascade
        }
        EventType::Updated => references_changed(previous, event),
        EventType::Deleting => HistoryKind::DeletionRequested,
        EventType::Purged => HistoryKind::Deleted,
        EventType::DeletionBlocked => HistoryKind::DeletionBlocked,
        EventType::DeletionFailed => HistoryKind::DeletionFailed,
        EventType::FinalizerRetry => HistoryKind::FinalizerRetry,
        EventType::DeletionForced => HistoryKind::DeletionForced,
        EventType::SoftDeleted => HistoryKind::SoftDeleted,
        EventType::Undeleted => HistoryKind::Undeleted,
    };
    let by = matches!(event.event_type, EventType::Deleting | EventType::DeletionForced)
        .then(|| event.principal.id.clone())
        .filter(|id| !id.is_empty());
    HistoryEntry {
        revision: event.revision,
        time: event.time,
        kind,
        message: event.message.clone(),
        by,
        operation: event.operation,
    }
}

/// An update, by what it did to the references: added some (it may also
/// have removed others: added is named first), removed some, or neither.
/// Without the state before, an update is only "updated".
fn references_changed(previous: Option<&Event>, event: &Event) -> HistoryKind {
    let (Some(before), Some(after)) = (previous.and_then(|e| e.snapshot.as_ref()), event.snapshot.as_ref()) else {
        return HistoryKind::Updated;
    };
    let targets = |r: &crate::model::Resource| {
        r.refs
            .iter()
            .flat_map(|(field, targets)| targets.iter().map(move |t| (field.clone(), t.uid)))
            .collect::<std::collections::BTreeSet<_>>()
    };
    let (before, after) = (targets(before), targets(after));
    if after.difference(&before).next().is_some() {
        HistoryKind::ReferenceAdded
    } else if before.difference(&after).next().is_some() {
        HistoryKind::ReferenceRemoved
    } else {
        HistoryKind::Updated
    }
}
