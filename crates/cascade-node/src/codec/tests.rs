//! The value encoding: every stored record round-trips through the binary
//! form, the JSON of earlier versions still reads, and a value of an
//! unknown version is corruption.
//!
//! Size: one file on purpose, as `stored.rs` is: a generator per stored
//! record beside the properties and the pinned bytes of every layout, so
//! that a change of the disk format is reviewed against all of them at once.

use std::collections::{BTreeMap, BTreeSet};

use cascade_core::model::*;
use cascade_core::{OnDelete, OperationId, ResourceName, Uid};
use proptest::prelude::*;
use uuid::Uuid;

use super::{
    backref_key as backref_row_key, decode, encode_writes, records, Record, StoreState, VERSION_POSTCARD_V1,
    VERSION_POSTCARD_V2, VERSION_POSTCARD_V3, VERSION_POSTCARD_V4, VERSION_POSTCARD_V5,
};
use crate::store::{Batch, MemoryStore, Store, StoreError, Table};
use cascade_core::auth::{Principal, Via};

// ---- strategies over the core's records ----

fn name() -> impl Strategy<Value = ResourceName> {
    ("[a-z][a-z0-9-]{0,6}", "[a-z][a-z0-9_]{0,6}", "[a-z0-9][a-z0-9-]{0,8}")
        .prop_map(|(r, k, i)| ResourceName::parse(&format!("{r}/{k}/{i}")).expect("a valid name"))
}

fn uid() -> impl Strategy<Value = Uid> {
    any::<[u8; 16]>().prop_map(|b| Uid(Uuid::from_bytes(b)))
}

fn op_id() -> impl Strategy<Value = OperationId> {
    any::<[u8; 16]>().prop_map(|b| OperationId(Uuid::from_bytes(b)))
}

fn ts() -> impl Strategy<Value = Timestamp> {
    any::<u64>().prop_map(Timestamp)
}

/// Any string, including non-ASCII and JSON's escapes.
fn text() -> impl Strategy<Value = String> {
    any::<String>()
}

fn strings() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(text(), 0..3)
}

fn target() -> impl Strategy<Value = RefTarget> {
    (name(), uid()).prop_map(|(name, uid)| RefTarget { name, uid })
}

fn resource_state() -> impl Strategy<Value = ResourceState> {
    prop_oneof![
        Just(ResourceState::Creating),
        Just(ResourceState::Active),
        Just(ResourceState::Deleting),
    ]
}

fn lien() -> impl Strategy<Value = Lien> {
    (text(), text(), text(), ts()).prop_map(|(id, reason, origin, create_time)| Lien {
        id,
        reason,
        origin,
        create_time,
    })
}

fn resource() -> impl Strategy<Value = Resource> {
    (
        (name(), uid(), resource_state()),
        prop::collection::btree_map(text(), text(), 0..3),
        prop::collection::btree_map(text(), prop::collection::vec(target(), 0..3), 0..3),
        (any::<u64>(), ts(), ts(), strings()),
        prop::collection::vec(lien(), 0..3),
    )
        .prop_map(
            |((name, uid, state), attributes, refs, (revision, create_time, update_time, finalizers), liens)| {
                Resource {
                    name,
                    uid,
                    state,
                    attributes,
                    refs,
                    revision,
                    create_time,
                    update_time,
                    finalizers,
                    liens,
                    soft_deleted: None,
                }
            },
        )
}

fn on_delete() -> impl Strategy<Value = OnDelete> {
    prop_oneof![
        Just(OnDelete::Cascade),
        Just(OnDelete::Unset),
        Just(OnDelete::Block),
        Just(OnDelete::AllowDangling),
    ]
}

fn backref() -> impl Strategy<Value = BackRef> {
    (target(), target(), text(), on_delete(), any::<u64>(), ts()).prop_map(
        |(target, referrer, field, on_delete, generation, attached_at)| BackRef {
            target,
            referrer,
            field,
            on_delete,
            generation,
            attached_at,
        },
    )
}

fn backref_key() -> impl Strategy<Value = BackRefKey> {
    (uid(), uid(), text()).prop_map(|(target, referrer, field)| BackRefKey {
        target,
        referrer,
        field,
    })
}

fn reason() -> impl Strategy<Value = DeletionReason> {
    prop_oneof![
        Just(DeletionReason::Requested),
        (name(), text()).prop_map(|(from, field)| DeletionReason::Cascade { from, field }),
    ]
}

fn blockers() -> impl Strategy<Value = Vec<Blocker>> {
    prop::collection::vec(
        (name(), text(), any::<bool>()).prop_map(|(referrer, field, referrer_deleting)| Blocker {
            referrer,
            field,
            referrer_deleting,
        }),
        0..3,
    )
}

fn status() -> impl Strategy<Value = DeletionStatus> {
    // Not `DeletionStatus::`: `tests/wire_edge.rs` reads `Status::` as a gRPC status.
    use DeletionStatus as Deletion;
    prop_oneof![
        Just(Deletion::Pending),
        (blockers(), text()).prop_map(|(blockers, reason)| Deletion::Blocked { blockers, reason }),
        text().prop_map(|error| Deletion::Failed { error }),
        (strings(), text()).prop_map(|(regions, reason)| Deletion::Waiting { regions, reason }),
    ]
}

fn finalizer_failures() -> impl Strategy<Value = Vec<FinalizerFailure>> {
    prop::collection::vec(
        (text(), any::<u32>(), text(), ts(), prop::option::of(ts())).prop_map(
            |(finalizer, failures, last_reason, last_time, retry_at)| FinalizerFailure {
                finalizer,
                failures,
                last_reason,
                last_time,
                retry_at,
            },
        ),
        0..3,
    )
}

fn deletion() -> impl Strategy<Value = DeletionRecord> {
    let forced =
        prop::option::of((text(), text(), ts()).prop_map(|(by, reason, time)| ForcedPurge { by, reason, time }));
    (
        (target(), ts(), reason(), text()),
        (op_id(), status(), finalizer_failures(), forced),
    )
        .prop_map(
            |((target, deleted_at, reason, requested_by), (operation, status, finalizer_failures, forced))| {
                DeletionRecord {
                    target,
                    deleted_at,
                    reason,
                    requested_by,
                    operation,
                    status,
                    finalizer_failures,
                    forced,
                    principal: Principal::anonymous(),
                }
            },
        )
}

fn operation() -> impl Strategy<Value = Operation> {
    (
        (op_id(), target(), text(), any::<bool>()),
        prop_oneof![
            Just(OperationState::Running),
            Just(OperationState::Succeeded),
            Just(OperationState::Failed),
            Just(OperationState::Cancelled),
        ],
        any::<[u64; 5]>(),
        (ts(), prop::option::of(ts())),
        (prop::collection::btree_set(text(), 0..3), any::<u64>(), any::<bool>()),
    )
        .prop_map(
            |(
                (id, root, requested_by, cascade),
                state,
                [deleted, unset, pending, blocked, failed],
                (create_time, end_time),
                (reached, changes, closure_confirmed),
            )| Operation {
                id,
                root,
                requested_by,
                cascade,
                state,
                progress: Progress {
                    deleted,
                    unset,
                    pending,
                    blocked,
                    failed,
                },
                create_time,
                end_time,
                reached: reached.into_iter().collect::<BTreeSet<_>>(),
                changes,
                closure_confirmed,
                principal: Default::default(),
                retain_ms: 0,
                controls: None,
                undelete: None,
            },
        )
}

fn controls() -> impl Strategy<Value = OperationControls> {
    (
        (prop::option::of(any::<u64>()), any::<u64>(), any::<u64>()),
        (prop::option::of(any::<(u64, u64)>()), prop::option::of(any::<u32>())),
        (ts(), any::<u64>(), any::<bool>(), any::<bool>(), text()),
    )
        .prop_map(
            |(
                (max_deletions, admitted, granted),
                (exhausted, rate_per_s),
                (rate_since, rate_base, paused, cancelled, by),
            )| OperationControls {
                max_deletions,
                admitted,
                granted,
                exhausted,
                rate_per_s,
                rate_since,
                rate_base,
                paused,
                cancelled,
                by,
            },
        )
}

fn action() -> impl Strategy<Value = OutcomeAction> {
    prop_oneof![
        Just(OutcomeAction::Pending),
        Just(OutcomeAction::Deleted),
        text().prop_map(|field| OutcomeAction::Unset { field, undo: None }),
        blockers().prop_map(|blockers| OutcomeAction::Blocked { blockers }),
        text().prop_map(|error| OutcomeAction::Failed { error }),
        strings().prop_map(|regions| OutcomeAction::Waiting { regions }),
        text().prop_map(|reason| OutcomeAction::Held { reason }),
        Just(OutcomeAction::Restored),
        text().prop_map(|reason| OutcomeAction::NotRestored { reason }),
    ]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    (target(), action(), ts()).prop_map(|(resource, action, time)| Outcome { resource, action, time })
}

fn walk() -> impl Strategy<Value = Walk> {
    (
        prop::option::of((uid(), uid(), text()).prop_map(|(target, referrer, field)| BackRefKey {
            target,
            referrer,
            field,
        })),
        any::<bool>(),
        prop::collection::btree_map(text(), any::<u64>(), 0..4),
        any::<u64>(),
        ts(),
    )
        .prop_map(|(after, finished, remote, blocking, recount_at)| Walk {
            after,
            finished,
            remote,
            blocking,
            recount_at,
        })
}

fn work() -> impl Strategy<Value = WorkItem> {
    (target(), ts(), any::<u32>(), prop::option::of(text()), walk()).prop_map(
        |(target, next_attempt_at, attempts, last_error, walk)| WorkItem {
            target,
            next_attempt_at,
            attempts,
            last_error,
            walk,
        },
    )
}

fn event_type() -> impl Strategy<Value = EventType> {
    prop_oneof![
        Just(EventType::Created),
        Just(EventType::Updated),
        Just(EventType::Deleting),
        Just(EventType::Purged),
        Just(EventType::DeletionBlocked),
        Just(EventType::DeletionFailed),
        Just(EventType::Undeleted),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    (
        (any::<u64>(), event_type(), target()),
        prop::option::of(resource()),
        (prop::option::of(op_id()), text(), ts()),
        (any::<bool>(), prop::option::of(reason())),
    )
        .prop_map(
            |((revision, event_type, resource), snapshot, (operation, message, time), (no_cascade, cause))| Event {
                revision,
                event_type,
                resource,
                snapshot,
                operation,
                message,
                time,
                no_cascade,
                cause,
                principal: Principal::anonymous(),
                retain_ms: 0,
            },
        )
}

fn remote_deletion() -> impl Strategy<Value = RemoteDeletion> {
    (target(), op_id(), ts(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(target, operation, seen_at, purged, no_cascade, forced)| RemoteDeletion {
            forced,
            target,
            operation,
            seen_at,
            purged,
            no_cascade,
            principal: Principal::anonymous(),
            retain_ms: 0,
        },
    )
}

/// The anonymous principal (what a node without authentication stores,
/// in the earlier layouts) half the time, any other the rest.
fn principal() -> impl Strategy<Value = Principal> {
    let via = prop_oneof![
        Just(Via::Certificate),
        Just(Via::Jwt),
        Just(Via::Token),
        Just(Via::Unauthenticated),
    ];
    prop_oneof![
        Just(Principal::anonymous()),
        (text(), strings(), via).prop_map(|(id, groups, via)| Principal { id, groups, via }),
    ]
}

fn pending_attach() -> impl Strategy<Value = PendingAttach> {
    (target(), prop::collection::vec(backref_key(), 0..3)).prop_map(|(resource, keys)| PendingAttach { resource, keys })
}

/// Half of them with no field of version 2 set (written as version 1).
fn audit_entry() -> impl Strategy<Value = AuditEntry> {
    let second = prop_oneof![
        Just((Vec::new(), String::new(), String::new(), String::new(), String::new())),
        (strings(), text(), text(), text(), text()),
    ];
    ((uid(), ts(), text(), text(), text(), text(), text()), second).prop_map(
        |((id, time, who, action, target, reason, outcome), (groups, via, node, through, rule))| AuditEntry {
            id,
            time,
            who,
            action,
            target,
            reason,
            outcome,
            groups,
            via,
            node,
            through,
            rule,
        },
    )
}

/// Whether an audit entry needs version 2 (one of its fields is set).
fn audit_second_layout(e: &AuditEntry) -> bool {
    !(e.groups.is_empty() && e.via.is_empty() && e.node.is_empty() && e.through.is_empty() && e.rule.is_empty())
}

fn pending_release() -> impl Strategy<Value = PendingRelease> {
    (backref(), any::<u64>()).prop_map(|(backref, generation)| PendingRelease { backref, generation })
}

// ---- properties ----

/// The value encodes to the version its table writes (2 for a work item,
/// and for a resource with a lien or an event whose snapshot has one; 1
/// for everything else), decodes to itself, and its JSON as an earlier
/// node wrote it decodes to itself too.
fn both_ways<T: Record + serde::Serialize + PartialEq + std::fmt::Debug>(
    table: Table,
    v: &T,
) -> Result<(), TestCaseError> {
    both_ways_as(table, v, table == Table::RetryQueue)
}

fn both_ways_as<T: Record + serde::Serialize + PartialEq + std::fmt::Debug>(
    table: Table,
    v: &T,
    second_layout: bool,
) -> Result<(), TestCaseError> {
    let version = if second_layout {
        VERSION_POSTCARD_V2
    } else {
        VERSION_POSTCARD_V1
    };
    both_ways_in(table, v, version)
}

/// [`both_ways_as`] for a record of three layouts: `version` is the one it
/// must be written in.
fn both_ways_in<T: Record + serde::Serialize + PartialEq + std::fmt::Debug>(
    table: Table,
    v: &T,
    version: u8,
) -> Result<(), TestCaseError> {
    let bytes = v.encode(table).expect("encodes");
    prop_assert_eq!(bytes.first(), Some(&version));
    prop_assert_eq!(bytes.len(), bytes.capacity(), "one exact allocation");
    let back: T = decode(table, &bytes).expect("decodes");
    prop_assert_eq!(&back, v);
    let legacy = json(v);
    let back: T = decode(table, &legacy).expect("legacy JSON decodes");
    prop_assert_eq!(&back, v);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn resources_round_trip(v in resource()) { both_ways_as(Table::Resources, &v, !v.liens.is_empty())?; }

    #[test]
    fn names_round_trip(v in name()) { both_ways(Table::UidIndex, &v)?; }

    #[test]
    fn backrefs_round_trip(v in backref()) { both_ways(Table::Backrefs, &v)?; }

    /// A row of the back-reference table is written without what its key
    /// holds, and reads back whole with the key.
    #[test]
    fn backref_rows_round_trip_through_their_key(v in backref()) {
        let key = v.key();
        let bytes = records::encode_backref(&key, &v).expect("encodes");
        prop_assert_eq!(bytes.first(), Some(&VERSION_POSTCARD_V2));
        prop_assert!(bytes.len() + 32 + v.field.len() <= v.encode(Table::Backrefs).expect("encodes").len());
        let back: BackRef = records::decode_keyed(Table::Backrefs, &backref_row_key(&key), &bytes).expect("decodes");
        prop_assert_eq!(back, v);
    }

    #[test]
    fn deletions_round_trip(v in deletion(), p in principal()) {
        let v = DeletionRecord { principal: p, ..v };
        let version = if v.principal != Principal::anonymous() {
            VERSION_POSTCARD_V3
        } else if !v.finalizer_failures.is_empty() || v.forced.is_some() {
            VERSION_POSTCARD_V2
        } else {
            VERSION_POSTCARD_V1
        };
        both_ways_in(Table::Deletions, &v, version)?;
    }

    #[test]
    fn operations_round_trip(v in operation(), p in principal(), c in prop::option::of(controls())) {
        let v = Operation { principal: p, controls: c.map(Box::new), ..v };
        let version = if v.controls.is_some() {
            VERSION_POSTCARD_V4
        } else if v.principal != Principal::anonymous() {
            VERSION_POSTCARD_V2
        } else {
            VERSION_POSTCARD_V1
        };
        both_ways_in(Table::Operations, &v, version)?;
    }

    #[test]
    fn outcomes_round_trip(v in outcome()) { both_ways(Table::Outcomes, &v)?; }

    #[test]
    fn work_items_round_trip(v in work()) { both_ways(Table::RetryQueue, &v)?; }

    #[test]
    fn events_round_trip(v in event(), p in principal()) {
        let v = Event { principal: p, ..v };
        let liens = v.snapshot.as_ref().is_some_and(|r| !r.liens.is_empty());
        let version = if v.principal != Principal::anonymous() {
            VERSION_POSTCARD_V3
        } else if liens {
            VERSION_POSTCARD_V2
        } else {
            VERSION_POSTCARD_V1
        };
        both_ways_in(Table::Outbox, &v, version)?;
    }

    #[test]
    fn remote_deletions_round_trip(v in remote_deletion(), p in principal()) {
        let v = RemoteDeletion { principal: p, ..v };
        let version = if v.principal != Principal::anonymous() {
            VERSION_POSTCARD_V3
        } else if v.forced {
            VERSION_POSTCARD_V2
        } else {
            VERSION_POSTCARD_V1
        };
        both_ways_in(Table::RemoteDeletions, &v, version)?;
    }

    #[test]
    fn pending_attaches_round_trip(v in pending_attach()) { both_ways(Table::PendingAttach, &v)?; }

    #[test]
    fn pending_releases_round_trip(v in pending_release()) { both_ways(Table::PendingReleases, &v)?; }

    #[test]
    fn audit_entries_round_trip(v in audit_entry()) { both_ways_as(Table::Audit, &v, audit_second_layout(&v))?; }

    /// A row of the audit table is written without its id (its key), and
    /// reads back whole with the key.
    #[test]
    fn audit_rows_round_trip_through_their_key(v in audit_entry()) {
        let (key, bytes) = records::encode_audit_row(&v).expect("encodes");
        prop_assert_eq!(&key[..], v.id.as_bytes());
        prop_assert_eq!(bytes.first(), Some(&VERSION_POSTCARD_V3));
        let back: AuditEntry = records::decode_keyed(Table::Audit, &key, &bytes).expect("decodes");
        prop_assert_eq!(back, v);
    }

    /// Cutting a value short, or adding to its end, is corruption, never a
    /// different record.
    #[test]
    fn a_cut_or_padded_value_is_corrupt(v in event(), cut in any::<prop::sample::Index>()) {
        let bytes = v.encode(Table::Outbox).expect("encodes");
        let short = &bytes[..1 + cut.index(bytes.len() - 1)];
        let corrupt = matches!(decode::<Event>(Table::Outbox, short), Err(StoreError::Corrupt { .. }));
        prop_assert!(corrupt, "a value cut to {} bytes", short.len());
        let mut long = bytes.clone();
        long.push(0);
        let corrupt = matches!(decode::<Event>(Table::Outbox, &long), Err(StoreError::Corrupt { .. }));
        prop_assert!(corrupt, "a value with a byte past its end");
    }
}

// ---- fixed examples ----

fn uid_n(n: u8) -> Uid {
    Uid(Uuid::from_bytes([n; 16]))
}

fn rt(name: &str, n: u8) -> RefTarget {
    RefTarget {
        name: ResourceName::parse(name).expect("name"),
        uid: uid_n(n),
    }
}

/// A port as a node stores it: two attributes, one reference.
fn typical_resource() -> Resource {
    Resource {
        name: ResourceName::parse("eu-west/port/p-0042").expect("name"),
        uid: Uid(Uuid::parse_str("0190f3a2-7c41-7d2e-9a3b-5c6d7e8f9a0b").expect("uuid")),
        state: ResourceState::Active,
        attributes: BTreeMap::from([
            ("mac".to_string(), "fa:16:3e:12:34:56".to_string()),
            ("description".to_string(), "web tier".to_string()),
        ]),
        refs: BTreeMap::from([("network".to_string(), vec![rt("eu-west/network/n-1", 7)])]),
        revision: 18_204,
        create_time: Timestamp(1_760_000_000_000),
        update_time: Timestamp(1_760_000_123_456),
        finalizers: vec![],
        liens: vec![],
        soft_deleted: None,
    }
}

/// The DELETING event of that port, with its snapshot, as a cascade writes it.
fn typical_event() -> Event {
    let mut snapshot = typical_resource();
    snapshot.state = ResourceState::Deleting;
    Event {
        revision: 18_205,
        event_type: EventType::Deleting,
        resource: RefTarget {
            name: snapshot.name.clone(),
            uid: snapshot.uid,
        },
        snapshot: Some(snapshot),
        operation: Some(OperationId(Uuid::from_bytes([9; 16]))),
        message: "cascade from eu-west/network/n-1 (network)".into(),
        time: Timestamp(1_760_000_200_000),
        no_cascade: false,
        cause: Some(DeletionReason::Cascade {
            from: ResourceName::parse("eu-west/network/n-1").expect("name"),
            field: "network".into(),
        }),
        principal: Default::default(),
        retain_ms: 0,
    }
}

fn typical_backref() -> BackRef {
    BackRef {
        target: rt("eu-west/network/n-1", 7),
        referrer: target_of(&typical_resource()),
        field: "network".into(),
        on_delete: OnDelete::Cascade,
        generation: 3,
        attached_at: Timestamp(1_760_000_000_000),
    }
}

fn target_of(r: &Resource) -> RefTarget {
    RefTarget {
        name: r.name.clone(),
        uid: r.uid,
    }
}

/// A value as an earlier node wrote it.
fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("JSON")
}

/// The binary form is less than half the JSON it replaces (version 1, in
/// bytes, binary vs JSON: the resource 144 vs 344, its DELETING event with
/// the snapshot 282 vs 707, the back-reference 89 vs 256).
#[test]
fn binary_values_are_smaller_than_json() {
    fn sizes<T: Record + serde::Serialize>(table: Table, v: &T) -> (usize, usize) {
        (v.encode(table).expect("encodes").len(), json(v).len())
    }
    for (table, (binary, json)) in [
        (Table::Resources, sizes(Table::Resources, &typical_resource())),
        (Table::Outbox, sizes(Table::Outbox, &typical_event())),
        (Table::Backrefs, sizes(Table::Backrefs, &typical_backref())),
    ] {
        assert!(
            binary * 2 < json,
            "{}: {binary} binary bytes, {json} JSON bytes",
            table.name()
        );
    }
}

/// An operation written before issue 29 (versions 1 and 2, no controls)
/// still reads, with no controls; one without controls keeps those bytes.
#[test]
fn an_operation_from_before_budgets_reads_without_controls() {
    let op = Operation {
        id: OperationId(Uuid::from_bytes([9; 16])),
        root: RefTarget {
            name: ResourceName::parse("eu-west/network/n-1").expect("a name"),
            uid: uid_n(7),
        },
        requested_by: "alice".into(),
        cascade: true,
        state: OperationState::Running,
        progress: Progress {
            pending: 2,
            ..Progress::default()
        },
        create_time: Timestamp(1000),
        end_time: None,
        reached: BTreeSet::from(["us-east".to_owned()]),
        changes: 4,
        closure_confirmed: false,
        principal: Principal::anonymous(),
        controls: None,
        undelete: None,
        retain_ms: 0,
    };
    let principal = Principal {
        id: "alice".into(),
        groups: vec!["ops".into()],
        via: Via::Token,
    };
    let with_principal = Operation {
        principal: principal.clone(),
        ..op.clone()
    };
    let mut v1 = vec![VERSION_POSTCARD_V1];
    v1.extend(postcard::to_allocvec(&super::stored::Operation::from(&op)).expect("encodes"));
    let mut v2 = vec![VERSION_POSTCARD_V2];
    v2.extend(postcard::to_allocvec(&super::stored::OperationV2::from(&with_principal)).expect("encodes"));
    let read1: Operation = decode(Table::Operations, &v1).expect("version 1 reads");
    let read2: Operation = decode(Table::Operations, &v2).expect("version 2 reads");
    assert_eq!(read1, op);
    assert_eq!(read2, with_principal);
    assert!(read1.controls.is_none() && read2.controls.is_none());
    assert_eq!(
        op.encode(Table::Operations).expect("encodes"),
        v1,
        "no controls: version 1's bytes"
    );
    let bounded = Operation {
        controls: Some(Box::new(OperationControls {
            max_deletions: Some(100),
            admitted: 3,
            ..OperationControls::default()
        })),
        ..op
    };
    let bytes = bounded.encode(Table::Operations).expect("encodes");
    assert_eq!(bytes[0], VERSION_POSTCARD_V4);
    let back: Operation = decode(Table::Operations, &bytes).expect("version 4 reads");
    assert_eq!(back, bounded);
    // Soft delete's third layout (a retention, no controls) still reads,
    // without controls, and keeps its version.
    let kept = Operation {
        retain_ms: 86_400_000,
        controls: None,
        ..bounded.clone()
    };
    let v3 = kept.encode(Table::Operations).expect("encodes");
    assert_eq!(v3[0], VERSION_POSTCARD_V3, "a retention, no controls: version 3");
    let read3: Operation = decode(Table::Operations, &v3).expect("version 3 reads");
    assert_eq!(read3, kept);
    // The fourth layout wraps the third: its bytes are version 3's body of
    // the same operation, then Some(controls).
    let both = Operation {
        retain_ms: 86_400_000,
        ..bounded
    };
    let v4 = both.encode(Table::Operations).expect("encodes");
    assert_eq!(v4[0], VERSION_POSTCARD_V4);
    let as_v3 = super::records::encode_stored(
        Table::Operations,
        VERSION_POSTCARD_V3,
        &super::stored::OperationV3::from(&both),
    )
    .expect("encodes");
    assert_eq!(&v4[1..as_v3.len()], &as_v3[1..]);
    assert_eq!(v4[as_v3.len()], 0x01, "Some(controls)");
    let read4: Operation = decode(Table::Operations, &v4).expect("version 4 reads");
    assert_eq!(read4, both);
}

/// An undelete is an operation's fifth layout (version byte 5), wrapping
/// the fourth: it reads back whole, and every earlier layout still reads
/// as a deletion (no `undelete`), keeping its version byte.
#[test]
fn an_undelete_is_the_fifth_layout_and_earlier_operations_still_read() {
    let deletion = Operation {
        id: OperationId(Uuid::from_bytes([3; 16])),
        root: RefTarget {
            name: ResourceName::parse("eu-west/network/n-1").expect("a name"),
            uid: uid_n(7),
        },
        requested_by: "alice".into(),
        cascade: true,
        state: OperationState::Succeeded,
        progress: Progress {
            deleted: 5,
            ..Progress::default()
        },
        create_time: Timestamp(1000),
        end_time: Some(Timestamp(2000)),
        reached: BTreeSet::from(["us-east".to_owned()]),
        changes: 9,
        closure_confirmed: true,
        principal: Principal::anonymous(),
        controls: None,
        undelete: None,
        retain_ms: 86_400_000,
    };
    let v3 = deletion.encode(Table::Operations).expect("encodes");
    assert_eq!(v3[0], VERSION_POSTCARD_V3, "a deletion keeps its layout");
    assert_eq!(decode::<Operation>(Table::Operations, &v3).expect("reads"), deletion);

    let undelete = Operation {
        id: OperationId(Uuid::from_bytes([4; 16])),
        cascade: false,
        retain_ms: 0,
        undelete: Some(Box::new(Undeletion {
            of: deletion.id,
            restored: 4,
            not_restored: 1,
            regions_left: BTreeSet::from(["ap-south".to_owned()]),
        })),
        ..deletion.clone()
    };
    let v5 = undelete.encode(Table::Operations).expect("encodes");
    assert_eq!(v5[0], VERSION_POSTCARD_V5);
    let as_v4 = super::records::encode_stored(
        Table::Operations,
        VERSION_POSTCARD_V4,
        &super::stored::OperationV4::from(&undelete),
    )
    .expect("encodes");
    assert_eq!(&v5[1..as_v4.len()], &as_v4[1..], "version 4's body, then the undelete");
    assert_eq!(
        decode::<Operation>(Table::Operations, &v5).expect("version 5 reads"),
        undelete
    );
    // Version 4's bytes of it read as a deletion: nothing before version 5
    // knew undeletes.
    let read4: Operation = decode(Table::Operations, &as_v4).expect("version 4 reads");
    assert!(read4.undelete.is_none());

    // The outcome actions and the event type undelete appends round-trip,
    // and an outcome an older node wrote reads as it did.
    for action in [
        OutcomeAction::Restored,
        OutcomeAction::NotRestored {
            reason: "expired: purged at 2026-11-26T17:00:00Z".into(),
        },
    ] {
        let o = Outcome {
            resource: undelete.root.clone(),
            action,
            time: Timestamp(5),
        };
        let bytes = o.encode(Table::Outcomes).expect("encodes");
        assert_eq!(bytes[0], VERSION_POSTCARD_V1);
        assert_eq!(decode::<Outcome>(Table::Outcomes, &bytes).expect("reads"), o);
    }
}

/// Version 1's bytes are pinned: reordering, retyping or removing a field of
/// a storage type changes them, and that is a new version, not an edit.
#[test]
fn version_1_bytes_are_pinned() {
    let bytes = typical_backref().encode(Table::Backrefs).expect("encodes");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, PINNED_BACKREF);
}

const PINNED_BACKREF: &str = concat!(
    "01",                                     // the version byte
    "13",                                     // target.name: 19 bytes,
    "65752d776573742f6e6574776f726b2f6e2d31", //   "eu-west/network/n-1"
    "07070707070707070707070707070707",       // target.uid: 16 bytes, no length
    "13",                                     // referrer.name: 19 bytes,
    "65752d776573742f706f72742f702d30303432", //   "eu-west/port/p-0042"
    "0190f3a27c417d2e9a3b5c6d7e8f9a0b",       // referrer.uid
    "07",                                     // field: 7 bytes,
    "6e6574776f726b",                         //   "network"
    "00",                                     // on_delete: variant 0, Cascade
    "03",                                     // generation: varint
    "8080b3c19c33",                           // attached_at: varint of 1_760_000_000_000
);

/// An audit row's version 3 is version 2 without the id its key is;
/// version 2 still reads, and version 3 without its key is corruption.
#[test]
fn audit_row_version_3_is_version_2_without_its_id() {
    let entry = typical_audit_entry();
    let (key, v3) = records::encode_audit_row(&entry).expect("encodes");
    let v2 = entry.encode(Table::Audit).expect("encodes");
    assert_eq!(v2.first(), Some(&VERSION_POSTCARD_V2));
    assert_eq!(v3.first(), Some(&VERSION_POSTCARD_V3));
    assert_eq!(v3[1..], v2[17..], "the same fields after the id");
    for value in [&v2, &v3] {
        let read: AuditEntry = records::decode_keyed(Table::Audit, &key, value).expect("reads with its key");
        assert_eq!(read, entry);
    }
    let err = records::decode_keyed::<AuditEntry>(Table::Audit, &key[..15], &v3).expect_err("no id");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
}

/// A back-reference row's version 2 is version 1 without the two uids
/// and the field its key holds: 49 bytes where version 1 has 89.
#[test]
fn backref_row_version_2_bytes_are_pinned() {
    let row = typical_backref();
    let bytes = records::encode_backref(&row.key(), &row).expect("encodes");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, PINNED_BACKREF_ROW_V2);
    let key = backref_row_key(&row.key());
    let back: BackRef = records::decode_keyed(Table::Backrefs, &key, &bytes).expect("reads with its key");
    assert_eq!(back, row);
}

const PINNED_BACKREF_ROW_V2: &str = concat!(
    "02",                                     // the version byte
    "13",                                     // target's name: 19 bytes,
    "65752d776573742f6e6574776f726b2f6e2d31", //   "eu-west/network/n-1"
    "13",                                     // referrer's name: 19 bytes,
    "65752d776573742f706f72742f702d30303432", //   "eu-west/port/p-0042"
    "00",                                     // on_delete: variant 0, Cascade
    "03",                                     // generation: varint
    "8080b3c19c33",                           // attached_at: varint of 1_760_000_000_000
);

/// A store written before version 2 keeps its rows in version 1, which
/// read as they are; a version-2 value read without its key, or under a
/// key too short to hold the uids, is corruption, never a wrong row.
#[test]
fn backref_rows_of_version_1_still_read_and_version_2_needs_its_key() {
    let row = typical_backref();
    let key = backref_row_key(&row.key());
    let v1 = row.encode(Table::Backrefs).expect("encodes");
    assert_eq!(v1.first(), Some(&VERSION_POSTCARD_V1));
    let read: BackRef = records::decode_keyed(Table::Backrefs, &key, &v1).expect("version 1 reads");
    assert_eq!(read, row);

    let v2 = records::encode_backref(&row.key(), &row).expect("encodes");
    for key in [&[][..], &key[..20]] {
        let err = records::decode_keyed::<BackRef>(Table::Backrefs, key, &v2).expect_err("not a row");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    }

    // A row filed under another row's key (never written) keeps its uids.
    let mut other = row.key();
    other.field = "subnet".into();
    let bytes = records::encode_backref(&other, &row).expect("encodes");
    assert_eq!(bytes.first(), Some(&VERSION_POSTCARD_V1));
}

/// An audit entry's version 2 appends the principal's groups, `via`, the
/// node, the region it came through and the rule to version 1's fields.
#[test]
fn audit_entry_version_2_bytes_are_pinned() {
    let bytes = typical_audit_entry().encode(Table::Audit).expect("encodes");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, PINNED_AUDIT_ENTRY_V2);
}

fn typical_audit_entry() -> AuditEntry {
    AuditEntry {
        id: uid_n(1),
        time: Timestamp(1000),
        who: "alice".into(),
        action: "create".into(),
        target: "eu-west/network/n-1".into(),
        reason: String::new(),
        outcome: "ok".into(),
        groups: vec!["ops".into()],
        via: "jwt".into(),
        node: "n0".into(),
        through: "eu-west".into(),
        rule: "r1".into(),
    }
}

const PINNED_AUDIT_ENTRY_V2: &str = concat!(
    "02",                                     // the version byte
    "01010101010101010101010101010101",       // id: 16 bytes, no length
    "e807",                                   // time: varint of 1000
    "05616c696365",                           // who: "alice"
    "06637265617465",                         // action: "create"
    "13",                                     // target: 19 bytes,
    "65752d776573742f6e6574776f726b2f6e2d31", //   "eu-west/network/n-1"
    "00",                                     // reason: empty
    "026f6b",                                 // outcome: "ok"
    "01036f7073",                             // groups: one, "ops"
    "036a7774",                               // via: "jwt"
    "026e30",                                 // node: "n0"
    "0765752d77657374",                       // through: "eu-west"
    "027231",                                 // rule: "r1"
);

/// An audit entry written before issue 27 (version 1: id, time, who,
/// action, target, reason, outcome) still reads, with the new fields
/// empty; one that has none of them keeps version 1's bytes.
#[test]
fn a_version_1_audit_entry_reads_with_the_new_fields_empty() {
    let full = typical_audit_entry();
    let old = AuditEntry {
        groups: Vec::new(),
        via: String::new(),
        node: String::new(),
        through: String::new(),
        rule: String::new(),
        ..full.clone()
    };
    let v1 = super::stored::AuditEntry::from(&full);
    let mut bytes = vec![VERSION_POSTCARD_V1];
    bytes.extend(postcard::to_allocvec(&v1).expect("encodes"));
    let read: AuditEntry = decode(Table::Audit, &bytes).expect("version 1 reads");
    assert_eq!(read, old);
    assert_eq!(
        old.encode(Table::Audit).expect("encodes"),
        bytes,
        "no new field: version 1's bytes"
    );
}

#[test]
fn an_unknown_version_byte_is_corruption_of_its_table() {
    let mut bytes = typical_resource().encode(Table::Resources).expect("encodes");
    for version in [0x00, 0x02, 0x7f, 0xff, b'[', b' '] {
        bytes[0] = version;
        match decode::<Resource>(Table::Resources, &bytes) {
            Err(StoreError::Corrupt { table, message }) => {
                assert_eq!(table, "resources");
                assert!(message.contains(&format!("0x{version:02x}")), "{message}");
            }
            other => panic!("version 0x{version:02x}: {other:?}"),
        }
    }
    assert!(matches!(
        decode::<Resource>(Table::Resources, &[]),
        Err(StoreError::Corrupt { table: "resources", .. })
    ));
    // Bad JSON and a bad binary body are corruption too.
    assert!(matches!(
        decode::<Resource>(Table::Resources, b"{\"name\":"),
        Err(StoreError::Corrupt { table: "resources", .. })
    ));
    assert!(matches!(
        decode::<Resource>(Table::Resources, &[VERSION_POSTCARD_V1, 0xff, 0xff]),
        Err(StoreError::Corrupt { table: "resources", .. })
    ));
}

/// A name that no longer parses is corruption, as it was in JSON.
#[test]
fn an_invalid_stored_name_is_corruption() {
    let mut bytes = vec![VERSION_POSTCARD_V1];
    bytes.push(7);
    bytes.extend_from_slice(b"no-name");
    match decode::<ResourceName>(Table::UidIndex, &bytes) {
        Err(StoreError::Corrupt { table, message }) => {
            assert_eq!(table, "uid_index");
            assert!(message.contains("no-name"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// A store written by an earlier node (JSON values throughout) reads
/// through `StoreState`, and a step's writes over it are binary.
#[test]
fn a_store_of_json_values_opens_and_new_writes_are_binary() {
    let store = MemoryStore::default();
    let r = typical_resource();
    let b = typical_backref();
    let e = typical_event();
    let w = WorkItem {
        target: target_of(&r),
        next_attempt_at: Timestamp(5),
        attempts: 1,
        last_error: Some("blocked".into()),
        walk: Walk::default(),
    };
    let mut batch = Batch::default();
    batch.put(Table::Resources, r.name.as_str().as_bytes().to_vec(), json(&r));
    batch.put(Table::UidIndex, r.uid.as_bytes().to_vec(), json(&r.name));
    batch.put(Table::Backrefs, super::backref_key(&b.key()), json(&b));
    batch.put(Table::Outbox, super::revision_key(e.revision), json(&e));
    batch.put(Table::RetryQueue, r.uid.as_bytes().to_vec(), json(&w));
    store.commit(batch).expect("commit");

    let state = StoreState { store: &store };
    assert_eq!(state.get_resource(&r.name).expect("reads"), Some(r.clone()));
    assert_eq!(
        cascade_core::state::StateRead::name_of(&state, r.uid).expect("reads"),
        Some(r.name.clone())
    );
    assert_eq!(state.backrefs_of(b.target.uid).expect("reads"), vec![b.clone()]);
    assert_eq!(state.events_from(0, 10).expect("reads"), vec![e.clone()]);
    assert_eq!(
        cascade_core::state::StateRead::work(&state, r.uid).expect("reads"),
        Some(w.clone())
    );

    // A step that rewrites the resource and reschedules the work: the new
    // values are binary, and read back the same.
    let mut r2 = r.clone();
    r2.revision += 1;
    let mut w2 = w.clone();
    w2.next_attempt_at = Timestamp(9);
    let mut writes = cascade_core::state::WriteSet::default();
    writes.resources.insert(r2.name.clone(), Some(r2.clone()));
    writes.work.insert(r2.uid, Some(w2.clone()));
    let batch = encode_writes(&state, &writes).expect("encodes");
    // The due index's value is a tag of its own (`due_value`), not a record.
    for (table, _, v) in batch.ops.iter().filter(|(t, _, _)| *t != Table::DueIndex) {
        if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
            let expected = match table {
                Table::RetryQueue => VERSION_POSTCARD_V2,
                // A resource's row, without the name its key holds.
                Table::Resources => VERSION_POSTCARD_V4,
                _ => VERSION_POSTCARD_V1,
            };
            assert_eq!(v[0], expected, "{}", table.name());
        }
    }
    store.commit(batch).expect("commit");
    assert_eq!(state.get_resource(&r.name).expect("reads"), Some(r2));
    assert_eq!(
        cascade_core::state::StateRead::work(&state, r.uid).expect("reads"),
        Some(w2)
    );
}

/// A value that does not decode is reported with its table by the reads.
#[test]
fn a_read_of_a_corrupt_value_names_its_table() {
    let store = MemoryStore::default();
    let r = typical_resource();
    let mut batch = Batch::default();
    batch.put(
        Table::Resources,
        r.name.as_str().as_bytes().to_vec(),
        vec![0x02, 1, 2, 3],
    );
    store.commit(batch).expect("commit");
    let state = StoreState { store: &store };
    let err = state.get_resource(&r.name).expect_err("corrupt");
    assert!(
        err.to_string().contains("resources") && err.to_string().contains("0x02"),
        "{err}"
    );
}

/// A work item written before the walk's position (version 1: target, due
/// time, attempts, last error) still reads, as a walk from the first row;
/// it is rewritten as version 2.
#[test]
fn a_version_1_work_item_reads_as_a_walk_from_the_start() {
    let r = typical_resource();
    let target = target_of(&r);
    let v1 = super::stored::WorkItemV1 {
        target: (&target).into(),
        next_attempt_at: 5,
        attempts: 2,
        last_error: Some("blocked".into()),
    };
    let mut bytes = vec![VERSION_POSTCARD_V1];
    bytes.extend(postcard::to_allocvec(&v1).expect("encodes"));
    let read: WorkItem = decode(Table::RetryQueue, &bytes).expect("version 1 reads");
    assert_eq!(
        read,
        WorkItem {
            target: target_of(&r),
            next_attempt_at: Timestamp(5),
            attempts: 2,
            last_error: Some("blocked".into()),
            walk: Walk::default(),
        }
    );
    let rewritten = read.encode(Table::RetryQueue).expect("encodes");
    assert_eq!(rewritten[0], VERSION_POSTCARD_V2);
    assert_eq!(decode::<WorkItem>(Table::RetryQueue, &rewritten).expect("reads"), read);
    // Version 2's body under version 1's byte is not silently misread.
    let mut walked = read.clone();
    walked.walk.finished = true;
    walked.walk.remote.insert("us-east".into(), 3);
    let mut wrong_walked = walked.encode(Table::RetryQueue).expect("encodes");
    wrong_walked[0] = VERSION_POSTCARD_V1;
    assert!(matches!(
        decode::<WorkItem>(Table::RetryQueue, &wrong_walked),
        Err(StoreError::Corrupt {
            table: "retry_queue",
            ..
        })
    ));
}

/// A memory store that remembers where each scan of the outbox started,
/// and, reading ahead as PostgreSQL does when `reads_ahead`, how many
/// keys each table was asked for.
#[derive(Default)]
struct RecordingStore {
    inner: MemoryStore,
    outbox_scans_after: std::sync::Mutex<Vec<Option<Vec<u8>>>>,
    reads_ahead: bool,
    asked_ahead: std::sync::Mutex<BTreeMap<Table, usize>>,
}

impl Store for RecordingStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<crate::store::Entry>, StoreError> {
        if table == Table::Outbox {
            if let Ok(mut scans) = self.outbox_scans_after.lock() {
                scans.push(after.map(<[u8]>::to_vec));
            }
        }
        self.inner.scan(table, prefix, after, limit)
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.inner.commit(batch)
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn prefetches(&self) -> bool {
        self.reads_ahead
    }
    fn prefetch(&self, reads: &crate::store::Prefetch) -> Result<(), StoreError> {
        let mut asked = self
            .asked_ahead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (table, keys) in &reads.keys {
            *asked.entry(*table).or_default() += keys.len();
        }
        Ok(())
    }
}

/// Compacting the outbox reads from the floor, not from the first key.
/// MemoryStore forgets a removed key, so nothing else could tell; an LSM
/// engine (fjall) keeps it as a tombstone, and a compaction that scanned
/// from the start stepped over every event compacted before: 16 % of the
/// writer's CPU in a 1M cascade (`perf record`, docs/BENCHMARKS.md).
#[test]
fn outbox_compaction_reads_from_the_floor_not_over_what_it_removed_before() {
    let store = RecordingStore::default();
    let mut batch = Batch::default();
    for rev in 1..=30u64 {
        batch.put(Table::Outbox, super::revision_key(rev), b"{}".to_vec());
    }
    store.commit(batch).expect("commits");
    let state = StoreState { store: &store };
    assert_eq!(state.compact_outbox(11, 100).expect("compacts"), 10);
    assert_eq!(state.outbox_floor().expect("reads"), 11);
    assert_eq!(state.compact_outbox(21, 100).expect("compacts"), 10);
    assert_eq!(state.outbox_floor().expect("reads"), 21);
    let scans = store.outbox_scans_after.lock().expect("not poisoned").clone();
    assert_eq!(
        scans,
        vec![Some(super::revision_key(0)), Some(super::revision_key(10))],
        "each compaction starts at its floor: the first at revision 1, the second after revision 10"
    );
    assert_eq!(
        store.inner.scan(Table::Outbox, &[], None, 100).expect("scans").len(),
        10
    );
}

/// A resource without a lien is written exactly as before liens existed
/// (version 1: nothing on disk grows); one with a lien is version 2, whose
/// body under version 1's byte is corruption, not a resource that silently
/// lost its protection.
#[test]
fn a_resource_is_version_2_only_while_it_holds_a_lien() {
    let plain = typical_resource();
    let bytes = plain.encode(Table::Resources).expect("encodes");
    assert_eq!(bytes[0], VERSION_POSTCARD_V1);
    let mut held = plain.clone();
    held.liens.push(Lien {
        id: "legal-hold".into(),
        reason: "audit".into(),
        origin: "alice".into(),
        create_time: Timestamp(7),
    });
    let held_bytes = held.encode(Table::Resources).expect("encodes");
    assert_eq!(held_bytes[0], VERSION_POSTCARD_V2);
    assert_eq!(
        &held_bytes[1..bytes.len()],
        &bytes[1..],
        "version 2 is version 1's fields, then the liens"
    );
    assert_eq!(decode::<Resource>(Table::Resources, &held_bytes).expect("reads"), held);
    let mut misread = held_bytes.clone();
    misread[0] = VERSION_POSTCARD_V1;
    assert!(matches!(
        decode::<Resource>(Table::Resources, &misread),
        Err(StoreError::Corrupt { table: "resources", .. })
    ));
    let mut event = typical_event();
    event.snapshot = Some(held.clone());
    let event_bytes = event.encode(Table::Outbox).expect("encodes");
    assert_eq!(event_bytes[0], VERSION_POSTCARD_V2);
    assert_eq!(decode::<Event>(Table::Outbox, &event_bytes).expect("reads"), event);
}

// ---- soft delete's layouts (issue 29) ----

fn soft_deletion() -> impl Strategy<Value = SoftDeletion> {
    (ts(), 1..=30 * 86_400_000u64, op_id()).prop_map(|(delete_time, window, operation)| SoftDeletion {
        delete_time,
        expire_time: delete_time.plus_millis(window),
        operation,
    })
}

fn undo() -> impl Strategy<Value = UnsetUndo> {
    (prop::collection::vec(target(), 1..3), any::<u64>())
        .prop_map(|(old_targets, revision)| UnsetUndo { old_targets, revision })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A DELETED resource is written in its third layout (its window
    /// appended), and reads back whole, liens and all.
    #[test]
    fn soft_deleted_resources_round_trip(v in resource(), soft in soft_deletion()) {
        let v = Resource { state: ResourceState::Deleted, soft_deleted: Some(soft), ..v };
        both_ways_in(Table::Resources, &v, VERSION_POSTCARD_V3)?;
    }

    #[test]
    fn operations_with_a_retention_round_trip(v in operation(), p in principal(), retain in 1..u64::MAX) {
        let v = Operation { principal: p, retain_ms: retain, ..v };
        both_ways_in(Table::Operations, &v, VERSION_POSTCARD_V3)?;
    }

    /// An operation with a retention and controls (a bounded soft delete)
    /// is the operation's fourth layout, which wraps the third.
    #[test]
    fn operations_with_a_retention_and_controls_round_trip(
        v in operation(),
        p in principal(),
        retain in 0..u64::MAX,
        c in controls(),
    ) {
        let v = Operation { principal: p, retain_ms: retain, controls: Some(Box::new(c)), ..v };
        both_ways_in(Table::Operations, &v, VERSION_POSTCARD_V4)?;
    }

    /// A DELETING event's retention, and a SOFT_DELETED event's snapshot
    /// window, are the event's fourth layout.
    #[test]
    fn events_with_a_retention_or_a_window_round_trip(
        v in event(),
        p in principal(),
        retain in 0..u64::MAX,
        soft in soft_deletion(),
    ) {
        let mut v = Event { principal: p, retain_ms: retain, ..v };
        if retain == 0 {
            let Some(snapshot) = v.snapshot.as_mut() else { return Ok(()) };
            snapshot.state = ResourceState::Deleted;
            snapshot.soft_deleted = Some(soft);
        }
        both_ways_in(Table::Outbox, &v, VERSION_POSTCARD_V4)?;
    }

    #[test]
    fn remote_deletions_with_a_retention_round_trip(v in remote_deletion(), p in principal(), retain in 1..u64::MAX) {
        let v = RemoteDeletion { principal: p, retain_ms: retain, ..v };
        both_ways_in(Table::RemoteDeletions, &v, VERSION_POSTCARD_V4)?;
    }

    /// An unset outcome with what it took from its referrer is the
    /// outcome's second layout; any other outcome keeps version 1.
    #[test]
    fn unset_outcomes_with_an_undo_record_round_trip(v in outcome(), field in text(), undo in undo()) {
        let v = Outcome { action: OutcomeAction::Unset { field, undo: Some(undo) }, ..v };
        both_ways_in(Table::Outcomes, &v, VERSION_POSTCARD_V2)?;
    }
}

/// Soft delete's layouts append to the ones before: a DELETED resource's
/// bytes are its second layout's (liens) then its window, so what an
/// older node wrote is read by the same decoders as before, and a record
/// without a retention keeps the bytes it always had.
#[test]
fn soft_delete_layouts_append_to_the_earlier_ones() {
    let before = typical_resource();
    let v1 = before.encode(Table::Resources).expect("encodes");
    assert_eq!(v1[0], VERSION_POSTCARD_V1, "no window, no lien: version 1's bytes");
    let buried = Resource {
        state: ResourceState::Deleted,
        soft_deleted: Some(SoftDeletion {
            delete_time: Timestamp(1_000),
            expire_time: Timestamp(2_000),
            operation: OperationId(Uuid::from_u128(9)),
        }),
        ..before.clone()
    };
    let v3 = buried.encode(Table::Resources).expect("encodes");
    assert_eq!(v3[0], VERSION_POSTCARD_V3);
    // Version 2's body of the same resource (state DELETED), then
    // Some(window): 0x01, two varints and the operation's 16 bytes.
    let as_v2 = super::records::encode_stored(
        Table::Resources,
        VERSION_POSTCARD_V2,
        &super::stored::ResourceV2::from(&buried),
    )
    .expect("encodes");
    assert_eq!(&v3[1..as_v2.len()], &as_v2[1..]);
    let tail = &v3[as_v2.len()..];
    assert_eq!(tail[0], 0x01, "Some");
    assert_eq!(&tail[tail.len() - 16..], Uuid::from_u128(9).as_bytes());
    // An older node's records read as they did: no window, no retention.
    let back: Resource = decode(Table::Resources, &v1).expect("decodes");
    assert_eq!(back.soft_deleted, None);
    let event = typical_event().encode(Table::Outbox).expect("encodes");
    assert_eq!(
        event[0], VERSION_POSTCARD_V1,
        "an event without a retention keeps version 1"
    );
    let back: Event = decode(Table::Outbox, &event).expect("decodes");
    assert_eq!(back.retain_ms, 0);
}

// ---- reading less than the whole value ----

/// `bytes` with the first occurrence of `from` replaced by `to` (the same
/// length, so the value's framing is unchanged).
fn replaced(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let at = bytes
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .expect("the value holds it");
    let mut out = bytes.to_vec();
    out[at..at + to.len()].copy_from_slice(to.as_bytes());
    out
}

/// A reference target read back without the per-character checks of a
/// request's name still has to be a name: a value whose target is not one
/// is corruption of its table, naming what it holds instead.
#[test]
fn a_stored_reference_target_that_is_not_a_name_is_corruption() {
    let bytes = typical_resource().encode(Table::Resources).expect("encodes");
    let bad = replaced(&bytes, "eu-west/network/n-1", "eu-west-network-n-1");
    match decode::<Resource>(Table::Resources, &bad) {
        Err(StoreError::Corrupt { table, message }) => {
            assert_eq!(table, "resources");
            assert!(message.contains("eu-west-network-n-1"), "{message}");
            assert!(message.contains("{region}/{kind}/{id}"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // The same target in an event's snapshot, and as the event's resource.
    let event = typical_event().encode(Table::Outbox).expect("encodes");
    for (from, to) in [
        ("eu-west/network/n-1", "eu-west-network-n-1"),
        ("eu-west/port/p-0042", "eu-west//portp-0042"),
    ] {
        let bad = replaced(&event, from, to);
        assert!(
            matches!(
                decode::<Event>(Table::Outbox, &bad),
                Err(StoreError::Corrupt { table: "outbox", .. })
            ),
            "{to}"
        );
    }
}

/// An outbox holding `events` (any layout, and one in legacy JSON when
/// `legacy` is given) at their revisions.
fn outbox_of(events: &[Event], legacy: Option<&Event>) -> MemoryStore {
    let store = MemoryStore::default();
    let mut batch = Batch::default();
    for e in events {
        batch.put(
            Table::Outbox,
            super::revision_key(e.revision),
            e.encode(Table::Outbox).expect("encodes"),
        );
    }
    if let Some(e) = legacy {
        batch.put(Table::Outbox, super::revision_key(e.revision), json(e));
    }
    store.commit(batch).expect("commits");
    store
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A filtered read sees each event's revision, type and name as the
    /// event has them, and whether other regions are sent it (a PURGED's
    /// cause, read in place), whatever its layout (each later one wraps the
    /// first) or a legacy JSON one; it returns the events it wanted, whole,
    /// and the others by revision, in revision order.
    #[test]
    fn a_filtered_outbox_read_sees_each_events_head_and_decodes_only_what_it_keeps(
        events in prop::collection::vec((event(), principal(), 0..3u64), 1..6),
        legacy in event(),
    ) {
        let events: Vec<Event> = events
            .into_iter()
            .enumerate()
            .map(|(i, (e, p, retain))| Event { revision: i as u64 + 1, principal: p, retain_ms: retain, ..e })
            .collect();
        let legacy = Event { revision: events.len() as u64 + 1, ..legacy };
        let store = outbox_of(&events, Some(&legacy));
        let state = StoreState { store: &store };
        let all: Vec<&Event> = events.iter().chain([&legacy]).collect();
        let seen = std::cell::RefCell::new(Vec::new());
        let odd = |h: &super::EventHead<'_>| {
            seen.borrow_mut().push((
                h.revision,
                h.event_type,
                h.resource.to_string(),
                h.kind().to_string(),
                h.concerns_importers(),
            ));
            h.revision % 2 == 1
        };
        let listed = state.events_wanted(1, 100, &odd).expect("reads");
        let heads: Vec<_> = all
            .iter()
            .map(|e| {
                (
                    e.revision,
                    e.event_type,
                    e.resource.name.to_string(),
                    e.resource.name.kind().to_string(),
                    e.concerns_importers(),
                )
            })
            .collect();
        prop_assert_eq!(seen.into_inner(), heads);
        prop_assert_eq!(listed.len(), all.len());
        for (entry, e) in listed.iter().zip(&all) {
            match entry {
                super::Listed::Event(read) => {
                    prop_assert!(e.revision % 2 == 1);
                    prop_assert_eq!(&**read, *e);
                }
                super::Listed::Passed(r) => {
                    prop_assert!(e.revision % 2 == 0);
                    prop_assert_eq!(*r, e.revision);
                }
            }
        }
    }
}

/// What the filter passes over is not decoded past its head: an event
/// whose snapshot is damaged is passed over by revision, and still
/// refused as corruption by a read that wants it.
#[test]
fn a_filtered_outbox_read_passes_over_an_unwanted_event_without_decoding_its_body() {
    let event = typical_event();
    let store = outbox_of(&[], None);
    let damaged = replaced(
        &event.encode(Table::Outbox).expect("encodes"),
        "eu-west/network/n-1",
        "eu-west-network-n-1",
    );
    let mut batch = Batch::default();
    batch.put(Table::Outbox, super::revision_key(event.revision), damaged);
    store.commit(batch).expect("commits");
    let state = StoreState { store: &store };
    let listed = state.events_wanted(0, 10, &|_| false).expect("passed over");
    assert!(
        matches!(listed.as_slice(), [super::Listed::Passed(r)] if *r == event.revision),
        "{listed:?}"
    );
    assert!(matches!(
        state.events_wanted(0, 10, &|_| true),
        Err(StoreError::Corrupt { table: "outbox", .. })
    ));
    // A head that does not read is corruption whatever the filter says.
    let mut batch = Batch::default();
    batch.put(Table::Outbox, super::revision_key(1), vec![VERSION_POSTCARD_V1, 0xff]);
    store.commit(batch).expect("commits");
    assert!(matches!(
        state.events_wanted(0, 10, &|_| false),
        Err(StoreError::Corrupt { table: "outbox", .. })
    ));
}

// ---- a resource's row without its name (issue 28, P4) ----

/// The key of a resource's row: its name's bytes.
fn resource_row_key(r: &Resource) -> Vec<u8> {
    r.name.as_str().as_bytes().to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// A row of the resources table is written without the name its key
    /// holds (version 4; version 5 with a lien or a window), exactly that
    /// many bytes shorter than the resource's layout with the name, and
    /// reads back whole with the key.
    #[test]
    fn resource_rows_round_trip_through_their_key(v in resource(), soft in prop::option::of(soft_deletion())) {
        let v = match soft {
            Some(soft) => Resource { state: ResourceState::Deleted, soft_deleted: Some(soft), ..v },
            None => v,
        };
        let bytes = records::encode_resource_row(&v.name, &v).expect("encodes");
        let named = v.encode(Table::Resources).expect("encodes");
        let version = if v.liens.is_empty() && v.soft_deleted.is_none() {
            prop_assert_eq!(named[0], VERSION_POSTCARD_V1);
            VERSION_POSTCARD_V4
        } else {
            VERSION_POSTCARD_V5
        };
        prop_assert_eq!(bytes.first(), Some(&version));
        prop_assert_eq!(bytes.len(), bytes.capacity(), "one exact allocation");
        // The name's length (one varint byte for any name within the
        // limits) and its bytes.
        let name_bytes = 1 + v.name.as_str().len();
        let layout_bytes = if version == VERSION_POSTCARD_V5 && named[0] != VERSION_POSTCARD_V3 {
            1 // version 5 always writes the window, version 2 has none
        } else {
            0
        };
        prop_assert_eq!(bytes.len() + name_bytes, named.len() + layout_bytes);
        let back: Resource = records::decode_keyed(Table::Resources, &resource_row_key(&v), &bytes).expect("decodes");
        prop_assert_eq!(back, v);
    }
}

/// Version 4 of the pinned port: version 1's bytes without the name.
#[test]
fn resource_row_version_4_bytes_are_pinned() {
    let r = typical_resource();
    let bytes = records::encode_resource_row(&r.name, &r).expect("encodes");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, PINNED_RESOURCE_ROW_V4);
    let back: Resource = records::decode_keyed(Table::Resources, &resource_row_key(&r), &bytes).expect("reads");
    assert_eq!(back, r);
}

/// A resource row as every node before issue 28's P4 wrote it (version 1,
/// with its name), checked in: a store of such rows opens and reads.
#[test]
fn a_resource_row_of_version_1_still_reads_under_its_key() {
    let r = typical_resource();
    let v1 = hex_bytes(PINNED_RESOURCE_V1);
    let back: Resource = records::decode_keyed(Table::Resources, &resource_row_key(&r), &v1).expect("reads");
    assert_eq!(back, r);
    assert_eq!(
        r.encode(Table::Resources).expect("encodes"),
        v1,
        "a resource encoded without its key keeps version 1"
    );
    // And through the store, as every read of a resource goes.
    let store = MemoryStore::default();
    let mut batch = Batch::default();
    batch.put(Table::Resources, resource_row_key(&r), v1);
    store.commit(batch).expect("commits");
    let state = StoreState { store: &store };
    assert_eq!(state.get_resource(&r.name).expect("reads"), Some(r.clone()));
    let all: Vec<Resource> = state.all(Table::Resources, 10).expect("scans");
    assert_eq!(all, vec![r]);
}

/// Every layout a resource had before the row left its name out (with a
/// lien: 2; DELETED: 3; legacy JSON) reads under its own key.
#[test]
fn every_earlier_resource_layout_reads_under_its_key() {
    let mut r = typical_resource();
    r.liens.push(Lien {
        id: "legal-hold".into(),
        reason: "audit".into(),
        origin: "alice".into(),
        create_time: Timestamp(7),
    });
    let held = r.encode(Table::Resources).expect("encodes");
    assert_eq!(held[0], VERSION_POSTCARD_V2);
    r.state = ResourceState::Deleted;
    r.soft_deleted = Some(SoftDeletion {
        delete_time: Timestamp(1_000),
        expire_time: Timestamp(2_000),
        operation: OperationId(Uuid::from_u128(9)),
    });
    let buried = r.encode(Table::Resources).expect("encodes");
    assert_eq!(buried[0], VERSION_POSTCARD_V3);
    let key = resource_row_key(&r);
    let read_held: Resource = records::decode_keyed(Table::Resources, &key, &held).expect("version 2 reads");
    assert_eq!(read_held.liens, r.liens);
    let read_buried: Resource = records::decode_keyed(Table::Resources, &key, &buried).expect("version 3 reads");
    assert_eq!(read_buried, r);
    let read_json: Resource = records::decode_keyed(Table::Resources, &key, &json(&r)).expect("JSON reads");
    assert_eq!(read_json, r);
    // Written again, the row is version 5 (liens, window) and reads the same.
    let row = records::encode_resource_row(&r.name, &r).expect("encodes");
    assert_eq!(row[0], VERSION_POSTCARD_V5);
    assert_eq!(
        records::decode_keyed::<Resource>(Table::Resources, &key, &row).expect("reads"),
        r
    );
}

/// A row that holds a name (an earlier layout, or legacy JSON) read under
/// the key of another name is corruption of the resources table quoting
/// both, never the resource of either; a row without one under a key
/// that is no name (cut, empty, not UTF-8) is corruption too.
#[test]
fn a_resource_row_under_another_names_key_is_corruption() {
    let r = typical_resource();
    let other = b"eu-west/port/p-0043".to_vec();
    for (layout, value) in [
        ("version 1", r.encode(Table::Resources).expect("encodes")),
        ("legacy JSON", json(&r)),
    ] {
        match records::decode_keyed::<Resource>(Table::Resources, &other, &value) {
            Err(StoreError::Corrupt { table, message }) => {
                assert_eq!(table, "resources", "{layout}");
                assert!(
                    message.contains("\"eu-west/port/p-0042\"") && message.contains("\"eu-west/port/p-0043\""),
                    "{layout}: {message}"
                );
            }
            other => panic!("{layout}: {other:?}"),
        }
    }
    let row = records::encode_resource_row(&r.name, &r).expect("encodes");
    let long = vec![b'x'; 10_000];
    for key in [&b""[..], b"eu-west/port", b"eu-west/\xffport/p-1", &long] {
        match records::decode_keyed::<Resource>(Table::Resources, key, &row) {
            Err(StoreError::Corrupt { table, message }) => {
                assert_eq!(table, "resources");
                assert!(
                    message.len() < 300,
                    "a short prefix of the key, not all of it: {message}"
                );
            }
            other => panic!("{key:?}: {other:?}"),
        }
    }
    // Read without a key (as a record on its own), version 4 is corruption.
    assert!(matches!(
        decode::<Resource>(Table::Resources, &row),
        Err(StoreError::Corrupt { table: "resources", .. })
    ));
    // Through the store: a read by name refuses the row, naming the table.
    let store = MemoryStore::default();
    let mut batch = Batch::default();
    batch.put(
        Table::Resources,
        other.clone(),
        r.encode(Table::Resources).expect("encodes"),
    );
    store.commit(batch).expect("commits");
    let state = StoreState { store: &store };
    let err = state
        .get_resource(&ResourceName::parse("eu-west/port/p-0043").expect("a name"))
        .expect_err("not this key's resource");
    assert!(err.to_string().contains("resources"), "{err}");
}

/// A step writes each resource under its own name: a write set that files
/// one under another's name is refused, not stored as that name's.
#[test]
fn a_resource_written_under_another_name_is_refused() {
    let store = MemoryStore::default();
    let state = StoreState { store: &store };
    let r = typical_resource();
    let mut writes = cascade_core::state::WriteSet::default();
    writes.resources.insert(
        ResourceName::parse("eu-west/port/p-0043").expect("a name"),
        Some(r.clone()),
    );
    match encode_writes(&state, &writes) {
        Err(StoreError::Corrupt { table, message }) => {
            assert_eq!(table, "resources");
            assert!(message.contains("p-0042") && message.contains("p-0043"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Under its own name, the row is version 4 and reads back.
    let mut writes = cascade_core::state::WriteSet::default();
    writes.resources.insert(r.name.clone(), Some(r.clone()));
    let batch = encode_writes(&state, &writes).expect("encodes");
    assert!(batch
        .ops
        .iter()
        .all(|(table, _, v)| *table != Table::Resources || v.as_ref().is_some_and(|v| v[0] == VERSION_POSTCARD_V4)));
    store.commit(batch).expect("commits");
    assert_eq!(state.get_resource(&r.name).expect("reads"), Some(r));
}

// ---- an outcome's row without its resource's name (issue 28, P4) ----

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// A row of the outcomes table is written without the resource's name
    /// its key holds (version 3; version 4 with an unset's undo record),
    /// exactly the name's bytes shorter, and reads back whole with the key.
    #[test]
    fn outcome_rows_round_trip_through_their_key(v in outcome(), op in op_id(), undo in prop::option::of(undo())) {
        let v = match undo {
            Some(undo) => Outcome { action: OutcomeAction::Unset { field: "network".into(), undo: Some(undo) }, ..v },
            None => v,
        };
        let bytes = records::encode_outcome_row(&v.resource.name, &v).expect("encodes");
        let named = v.encode(Table::Outcomes).expect("encodes");
        let version = if named[0] == VERSION_POSTCARD_V2 { VERSION_POSTCARD_V4 } else { VERSION_POSTCARD_V3 };
        prop_assert_eq!(bytes.first(), Some(&version));
        prop_assert_eq!(bytes.len(), bytes.capacity(), "one exact allocation");
        prop_assert_eq!(bytes.len() + 1 + v.resource.name.as_str().len(), named.len());
        let key = super::outcome_key(op, &v.resource.name);
        let back: Outcome = records::decode_keyed(Table::Outcomes, &key, &bytes).expect("decodes");
        prop_assert_eq!(back, v);
    }
}

/// The port's outcome in a cascade: deleted.
fn typical_outcome() -> Outcome {
    Outcome {
        resource: target_of(&typical_resource()),
        action: OutcomeAction::Deleted,
        time: Timestamp(1_760_000_200_000),
    }
}

/// An outcome row as every node before issue 28's P4 wrote it (version 1,
/// with the name), checked in, still reads under its key; its row since
/// is version 3, the same bytes without the name.
#[test]
fn outcome_row_bytes_are_pinned_and_version_1_still_reads() {
    let o = typical_outcome();
    let op = OperationId(Uuid::from_bytes([9; 16]));
    let key = super::outcome_key(op, &o.resource.name);
    let v1 = hex_bytes(PINNED_OUTCOME_V1);
    assert_eq!(o.encode(Table::Outcomes).expect("encodes"), v1);
    let read: Outcome = records::decode_keyed(Table::Outcomes, &key, &v1).expect("version 1 reads");
    assert_eq!(read, o);
    let row = records::encode_outcome_row(&o.resource.name, &o).expect("encodes");
    let hex: String = row.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, PINNED_OUTCOME_ROW_V3);
    let read: Outcome = records::decode_keyed(Table::Outcomes, &key, &row).expect("version 3 reads");
    assert_eq!(read, o);
    // Through the store, as the operation's outcomes are listed.
    let store = MemoryStore::default();
    let mut batch = Batch::default();
    batch.put(Table::Outcomes, key.clone(), v1);
    let other = Outcome {
        resource: rt("eu-west/port/p-0043", 8),
        ..o.clone()
    };
    batch.put(
        Table::Outcomes,
        super::outcome_key(op, &other.resource.name),
        records::encode_outcome_row(&other.resource.name, &other).expect("encodes"),
    );
    store.commit(batch).expect("commits");
    let state = StoreState { store: &store };
    assert_eq!(state.outcomes(op, None, 10).expect("lists"), vec![o, other]);
}

/// An outcome row that holds a name read under the key of another
/// resource is corruption of the outcomes table quoting both; a row
/// without one under a key too short to hold a name is corruption too; a
/// step's outcome filed under another resource's name is refused.
#[test]
fn an_outcome_row_under_another_names_key_is_corruption() {
    let o = typical_outcome();
    let op = OperationId(Uuid::from_bytes([9; 16]));
    let other = ResourceName::parse("eu-west/port/p-0043").expect("a name");
    let key = super::outcome_key(op, &other);
    for value in [o.encode(Table::Outcomes).expect("encodes"), json(&o)] {
        match records::decode_keyed::<Outcome>(Table::Outcomes, &key, &value) {
            Err(StoreError::Corrupt { table, message }) => {
                assert_eq!(table, "outcomes");
                assert!(message.contains("p-0042") && message.contains("p-0043"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    let row = records::encode_outcome_row(&o.resource.name, &o).expect("encodes");
    for short in [&key[..0], &key[..16]] {
        assert!(matches!(
            records::decode_keyed::<Outcome>(Table::Outcomes, short, &row),
            Err(StoreError::Corrupt { table: "outcomes", .. })
        ));
    }
    let store = MemoryStore::default();
    let state = StoreState { store: &store };
    let mut writes = cascade_core::state::WriteSet::default();
    writes.outcomes.insert((op, other), o);
    assert!(matches!(
        encode_writes(&state, &writes),
        Err(StoreError::Corrupt { table: "outcomes", .. })
    ));
}

const PINNED_OUTCOME_V1: &str = concat!(
    "01",                                     // the version byte
    "13",                                     // resource.name: 19 bytes,
    "65752d776573742f706f72742f702d30303432", //   "eu-west/port/p-0042"
    "0190f3a27c417d2e9a3b5c6d7e8f9a0b",       // resource.uid
    "01",                                     // action: variant 1, Deleted
    "c09abfc19c33",                           // time: varint of 1_760_000_200_000
);

const PINNED_OUTCOME_ROW_V3: &str = concat!(
    "03",                               // the version byte
    "0190f3a27c417d2e9a3b5c6d7e8f9a0b", // the resource's uid
    "01",                               // action: variant 1, Deleted
    "c09abfc19c33",                     // time: varint of 1_760_000_200_000
);

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The pinned port's fields after its name, the same in versions 1 and 4.
macro_rules! pinned_resource_after_its_name {
    () => {
        concat!(
            "0190f3a27c417d2e9a3b5c6d7e8f9a0b",       // uid: 16 bytes, no length
            "01",                                     // state: variant 1, Active
            "02",                                     // attributes: two, in key order:
            "0b6465736372697074696f6e",               //   "description"
            "087765622074696572",                     //   "web tier"
            "036d6163",                               //   "mac"
            "1166613a31363a33653a31323a33343a3536",   //   "fa:16:3e:12:34:56"
            "01",                                     // refs: one field,
            "076e6574776f726b",                       //   "network",
            "01",                                     //   one target:
            "13",                                     //   its name, 19 bytes,
            "65752d776573742f6e6574776f726b2f6e2d31", //     "eu-west/network/n-1"
            "07070707070707070707070707070707",       //   its uid
            "9c8e01",                                 // revision: varint of 18_204
            "8080b3c19c33",                           // create_time: varint of 1_760_000_000_000
            "c0c4bac19c33",                           // update_time: varint of 1_760_000_123_456
            "00",                                     // finalizers: none
        )
    };
}

/// Version 1 of the pinned port, as `encode` wrote every resource row
/// before issue 28's P4 (and still writes a resource without its key).
const PINNED_RESOURCE_V1: &str = concat!(
    "01",                                     // the version byte
    "13",                                     // name: 19 bytes,
    "65752d776573742f706f72742f702d30303432", //   "eu-west/port/p-0042"
    pinned_resource_after_its_name!(),
);

/// Its row since: version 4, the same fields without the name (20 bytes
/// fewer: 124 where version 1 has 144).
const PINNED_RESOURCE_ROW_V4: &str = concat!(
    "04", // the version byte
    pinned_resource_after_its_name!(),
);

/// A walk reads a referrer's outcome only once its operation counted an
/// unset referrer (`bookkeeping::counted_as_unset`), so a page's
/// read-ahead asks for outcomes only then: before, a flat cascade on
/// PostgreSQL sent a statement of absent outcome keys per page (2 µs of
/// the server per deleted leaf, a tenth of its flushes').
#[test]
fn a_walks_read_ahead_asks_for_outcomes_only_once_its_operation_counted_an_unset() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut generated = |unset: u64| {
        let mut record = deletion().new_tree(&mut runner).expect("a deletion").current();
        let mut op = operation().new_tree(&mut runner).expect("an operation").current();
        op.progress.unset = unset;
        record.operation = op.id;
        (record, op)
    };
    for (unset, outcomes_asked) in [(0, 0), (3, 2)] {
        let store = RecordingStore {
            reads_ahead: true,
            ..RecordingStore::default()
        };
        let state = StoreState { store: &store };
        let (record, op) = generated(unset);
        let target = record.target.clone();
        let mut writes = cascade_core::state::WriteSet::default();
        for i in 0..2u8 {
            let mut row = typical_backref();
            row.target = target.clone();
            row.referrer = rt(&format!("eu-west/port/p-{i}"), i + 100);
            writes.backrefs.insert(row.key(), Some(row));
        }
        writes.deletions.insert(target.uid, Some(record));
        writes.operations.insert(op.id, Some(op));
        store
            .commit(encode_writes(&state, &writes).expect("encodes"))
            .expect("commits");

        let page = cascade_core::state::StateRead::backrefs(&state, target.uid, None, 10).expect("reads");
        assert_eq!(page.len(), 2);
        let asked = store.asked_ahead.lock().expect("not poisoned").clone();
        assert_eq!(asked.get(&Table::Resources), Some(&2), "{asked:?}");
        assert_eq!(
            asked.get(&Table::Outcomes).copied().unwrap_or(0),
            outcomes_asked,
            "outcomes read ahead with {unset} unset: {asked:?}"
        );
    }
}

/// A fresh store's first audited write starts the audit log's count, so
/// the node's first retention step (its first tick) has nothing to write.
/// It counted the log then, in a batch of its own: a write nobody asked
/// for, at a moment nobody chose (`writer_load`'s group-commit test saw it
/// as one batch more than its creates, under CI's load). A log from before
/// the count is still counted by the first retention step.
#[test]
fn a_fresh_stores_first_audited_write_starts_the_count_and_its_first_retention_step_writes_nothing() {
    let store = MemoryStore::default();
    let state = StoreState { store: &store };
    assert_eq!(state.audit_count().expect("reads"), None);
    let mut writes = cascade_core::state::WriteSet::default();
    writes.audit.push(typical_audit_entry());
    store
        .commit(encode_writes(&state, &writes).expect("encodes"))
        .expect("commits");
    assert_eq!(state.audit_count().expect("reads"), Some(1));
    let (batch, pruned) = state.prune_audit(None, None, 100).expect("prunes");
    assert!(
        batch.is_empty(),
        "a retention step with nothing to remove writes nothing"
    );
    assert_eq!((pruned.removed, pruned.entries), (0, 1));

    // A log from before the count: entries and no count. The next audited
    // write leaves the count to retention, which counts every entry.
    let old = MemoryStore::default();
    let state = StoreState { store: &old };
    let (key, value) = records::encode_audit_row(&typical_audit_entry()).expect("encodes");
    let mut batch = Batch::default();
    batch.put(Table::Audit, key, value);
    old.commit(batch).expect("commits");
    let mut writes = cascade_core::state::WriteSet::default();
    writes.audit.push(AuditEntry {
        id: uid_n(2),
        ..typical_audit_entry()
    });
    old.commit(encode_writes(&state, &writes).expect("encodes"))
        .expect("commits");
    assert_eq!(state.audit_count().expect("reads"), None, "not guessed from an old log");
    let (batch, pruned) = state.prune_audit(None, None, 100).expect("prunes");
    old.commit(batch).expect("commits");
    assert_eq!(pruned.entries, 2);
    assert_eq!(state.audit_count().expect("reads"), Some(2));
}

// ---- the blocking index ----

/// A back-reference row of target `t` from referrer `r` (small uids, so
/// that batches meet the same rows again).
fn small_backref(t: u8, r: u8, on_delete: OnDelete) -> BackRef {
    let target = |n: u8, kind: &str| RefTarget {
        name: ResourceName::parse(&format!("r1/{kind}/n{n}")).expect("a valid name"),
        uid: Uid(Uuid::from_u128(u128::from(n) + 1)),
    };
    BackRef {
        target: target(t, "network"),
        referrer: target(r.wrapping_add(100), "port"),
        field: "network".to_owned(),
        on_delete,
        generation: 0,
        attached_at: Timestamp(1),
    }
}

proptest! {
    /// The blocking index holds exactly the `block` rows however rows of a
    /// few targets are put and removed, in batches that touch several rows
    /// of one target at once: `encode_writes` asks once per batch whether
    /// the index has any key, and a remove must still find every one.
    #[test]
    fn the_blocking_index_holds_exactly_the_block_rows(
        batches in prop::collection::vec(
            prop::collection::btree_map((0u8..3, 0u8..4), prop::option::of(on_delete()), 1..8),
            1..12,
        )
    ) {
        let store = MemoryStore::default();
        let state = StoreState { store: &store };
        let mut rows: BTreeMap<(u8, u8), OnDelete> = BTreeMap::new();
        for batch in batches {
            let mut writes = cascade_core::state::WriteSet::default();
            for (&(t, r), class) in &batch {
                let row = small_backref(t, r, class.unwrap_or(OnDelete::Cascade));
                writes.backrefs.insert(row.key(), class.map(|_| row.clone()));
                match class {
                    Some(class) => rows.insert((t, r), *class),
                    None => rows.remove(&(t, r)),
                };
            }
            store.commit(encode_writes(&state, &writes).expect("encodes")).expect("commits");
            let indexed: BTreeSet<Vec<u8>> = store
                .scan(Table::BlockingBackrefs, &[], None, usize::MAX)
                .expect("scans")
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            let blocking: BTreeSet<Vec<u8>> = rows
                .iter()
                .filter(|(_, class)| **class == OnDelete::Block)
                .map(|(&(t, r), class)| backref_row_key(&small_backref(t, r, *class).key()))
                .collect();
            prop_assert_eq!(indexed, blocking);
        }
    }
}
