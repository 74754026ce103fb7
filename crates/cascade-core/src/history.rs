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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::auth::Principal;
    use crate::model::{RefTarget, Resource, ResourceState};
    use crate::{ResourceName, Uid};

    const PORT: &str = "eu-west/port/p";
    const GROUP_UID: &str = "00000000-0000-4000-8000-000000000002";

    fn event(
        revision: Revision,
        event_type: EventType,
        groups: &[&str],
        operation: Option<&str>,
        message: &str,
    ) -> Event {
        let name = ResourceName::parse(PORT).unwrap();
        let uid = Uid::parse("00000000-0000-4000-8000-000000000001").unwrap();
        let targets: Vec<RefTarget> = groups
            .iter()
            .map(|g| RefTarget {
                name: ResourceName::parse(g).unwrap(),
                uid: Uid::parse(GROUP_UID).unwrap(),
            })
            .collect();
        let refs = if targets.is_empty() {
            BTreeMap::new()
        } else {
            BTreeMap::from([("security_groups".to_owned(), targets)])
        };
        Event {
            revision,
            event_type,
            resource: RefTarget {
                name: name.clone(),
                uid,
            },
            snapshot: Some(Resource {
                name,
                uid,
                state: ResourceState::Active,
                attributes: BTreeMap::new(),
                refs,
                revision,
                create_time: Timestamp(1),
                update_time: Timestamp(revision),
                finalizers: Vec::new(),
                liens: Vec::new(),
                soft_deleted: None,
            }),
            operation: operation.map(|o| OperationId::parse(o).unwrap()),
            message: message.to_owned(),
            time: Timestamp(revision),
            no_cascade: false,
            cause: None,
            principal: Principal::anonymous(),
            retain_ms: 0,
        }
    }

    #[test]
    fn updates_are_told_apart_by_what_they_did_to_the_references_newest_first() {
        let op = "00000000-0000-4000-8000-0000000000aa";
        let group = "us-east/security_group/g";
        let events = [
            event(3, EventType::Created, &[], None, "created"),
            event(5, EventType::Updated, &[], None, "updated"),
            event(8, EventType::Updated, &[group], None, "updated"),
            event(
                13,
                EventType::Updated,
                &[],
                Some(op),
                "security_groups cleared: us-east/security_group/g is being deleted",
            ),
            event(21, EventType::Updated, &[group], None, "updated"),
            event(34, EventType::Updated, &[], None, "updated"),
        ];
        let kinds: Vec<(Revision, HistoryKind)> = entries(None, &events).iter().map(|e| (e.revision, e.kind)).collect();
        assert_eq!(
            kinds,
            [
                (34, HistoryKind::ReferenceRemoved),
                (21, HistoryKind::ReferenceAdded),
                (13, HistoryKind::UnsetByCascade),
                (8, HistoryKind::ReferenceAdded),
                (5, HistoryKind::Updated),
                (3, HistoryKind::Created),
            ]
        );
        // Without the event before it, an update is only "updated".
        assert_eq!(entries(None, &events[4..5])[0].kind, HistoryKind::Updated);
        assert_eq!(
            entries(Some(&events[3]), &events[4..5])[0].kind,
            HistoryKind::ReferenceAdded
        );
    }
}
