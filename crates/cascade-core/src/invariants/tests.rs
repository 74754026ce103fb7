//! One small state per violation kind that breaks exactly that invariant,
//! and the rules for classifying references.

use super::*;
use crate::model::{Blocker, Event, EventType, PendingRelease, Progress, RemoteDeletion, Timestamp};
use crate::schema::EXAMPLE_SCHEMA;

const RA: &str = "ra";
const RB: &str = "rb";
const NET: (&str, u128) = ("ra/network/n1", 1);
const SUB: (&str, u128) = ("rb/subnet/s1", 2);
const OP: u128 = 100;

fn uid(n: u128) -> Uid {
    Uid(uuid::Uuid::from_u128(n))
}

fn op_id() -> OperationId {
    OperationId(uuid::Uuid::from_u128(OP))
}

fn rn(name: &str) -> ResourceName {
    ResourceName::parse(name).unwrap()
}

fn t((name, n): (&str, u128)) -> RefTarget {
    RefTarget {
        name: rn(name),
        uid: uid(n),
    }
}

fn schema() -> Schema {
    Schema::from_toml(EXAMPLE_SCHEMA).unwrap()
}

fn res(target: (&str, u128), state: ResourceState, refs: &[(&str, &[(&str, u128)])]) -> Resource {
    Resource {
        name: rn(target.0),
        uid: uid(target.1),
        state,
        attributes: BTreeMap::new(),
        refs: refs
            .iter()
            .map(|(field, ts)| (field.to_string(), ts.iter().map(|x| t(*x)).collect()))
            .collect(),
        revision: 1,
        create_time: Timestamp(1),
        update_time: Timestamp(1),
        finalizers: Vec::new(),
        liens: Vec::new(),
        soft_deleted: None,
    }
}

fn put(s: &mut MemoryState, r: Resource) {
    s.uid_index.insert(r.uid, r.name.clone());
    s.resources.insert(r.name.clone(), r);
}

fn row(s: &mut MemoryState, target: (&str, u128), referrer: (&str, u128), field: &str, on_delete: OnDelete) {
    let b = BackRef {
        target: t(target),
        referrer: t(referrer),
        field: field.into(),
        on_delete,
        generation: 1,
        attached_at: Timestamp(1),
    };
    s.backrefs.insert(b.key(), b);
}

/// Puts a resource in DELETING with a record of operation [`OP`], and
/// makes that operation's part agree with the records.
fn deleting(s: &mut MemoryState, target: (&str, u128), reason: DeletionReason, status: DeletionStatus) {
    let uid = uid(target.1);
    let name = s.uid_index[&uid].clone();
    s.resources.get_mut(&name).unwrap().state = ResourceState::Deleting;
    s.deletions.insert(
        uid,
        DeletionRecord {
            target: t(target),
            deleted_at: Timestamp(5),
            reason,
            requested_by: "test".into(),
            operation: op_id(),
            status,
            finalizer_failures: Vec::new(),
            forced: None,
            principal: Default::default(),
        },
    );
    settle_operation(s, target);
}

fn settle_operation(s: &mut MemoryState, root: (&str, u128)) {
    let records: Vec<&DeletionRecord> = s.deletions.values().filter(|d| d.operation == op_id()).collect();
    let failed = records
        .iter()
        .filter(|d| matches!(d.status, DeletionStatus::Failed { .. }))
        .count() as u64;
    let blocked = records
        .iter()
        .filter(|d| matches!(d.status, DeletionStatus::Blocked { .. }))
        .count() as u64;
    let pending = records.len() as u64 - failed;
    let root = s.operations.get(&op_id()).map_or_else(|| t(root), |o| o.root.clone());
    s.operations.insert(
        op_id(),
        Operation {
            id: op_id(),
            root,
            requested_by: "test".into(),
            cascade: true,
            state: match (pending, failed) {
                (0, 0) => OperationState::Succeeded,
                (0, _) => OperationState::Failed,
                _ => OperationState::Running,
            },
            progress: Progress {
                pending,
                blocked,
                failed,
                ..Progress::default()
            },
            create_time: Timestamp(5),
            end_time: (pending == 0).then_some(Timestamp(6)),
            reached: BTreeSet::new(),
            changes: 0,
            closure_confirmed: false,
            controls: None,
            undelete: None,
            principal: Default::default(),
            retain_ms: 0,
        },
    );
}

/// ra/network/n1 ← rb/subnet/s1 (field network, cascade): owner row in
/// ra, mirror row in rb.
fn healthy() -> [MemoryState; 2] {
    let mut ra = MemoryState::default();
    put(&mut ra, res(NET, ResourceState::Active, &[]));
    row(&mut ra, NET, SUB, "network", OnDelete::Cascade);
    let mut rb = MemoryState::default();
    put(&mut rb, res(SUB, ResourceState::Active, &[("network", &[NET])]));
    row(&mut rb, NET, SUB, "network", OnDelete::Cascade);
    [ra, rb]
}

fn views(states: &[MemoryState]) -> Vec<RegionView<'_>> {
    [RA, RB, "rc"]
        .iter()
        .zip(states)
        .map(|(r, s)| RegionView::from_state(&RegionId::parse(r).unwrap(), s))
        .collect()
}

fn check(states: &[MemoryState]) -> Report {
    check_quiescent(&views(states), Some(&schema()))
}

fn kinds(r: &Report) -> Vec<ViolationKind> {
    r.violations.iter().map(|v| v.kind).collect()
}

/// The report has violations of `kind` only (at least one).
#[track_caller]
fn only(r: &Report, kind: ViolationKind) {
    assert!(
        !r.violations.is_empty() && r.violations.iter().all(|v| v.kind == kind),
        "expected only {kind}:\n{}",
        r.lines()
    );
}

#[test]
fn names_are_stable_and_distinct() {
    let names: BTreeSet<&str> = ViolationKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(names.len(), ViolationKind::ALL.len());
    assert_eq!(ViolationKind::LeakedBackref.to_string(), "leaked_backref");
}

#[test]
fn a_healthy_cluster_has_no_violations() {
    let r = check(&healthy());
    assert!(r.is_clean(), "{}", r.lines());
    assert_eq!((r.resources, r.backrefs, r.owner_rows, r.mirror_rows), (2, 2, 1, 1));
    assert_eq!(r.unclassified_refs, 0);
    assert!(check_in_flight(&views(&healthy()), Some(&schema())).is_clean());
}

#[test]
fn not_quiescent() {
    let mut s = healthy();
    let b = s[1].backrefs.values().next().unwrap().clone();
    s[1].pending_releases.insert(
        (RA.into(), b.key()),
        PendingRelease {
            backref: b,
            generation: 2,
        },
    );
    let r = check(&s);
    only(&r, ViolationKind::NotQuiescent);
    assert_eq!(r.violations[0].region, RB);
}

#[test]
fn dangling() {
    let mut s = healthy();
    // The network is purged, rows gone, the subnet still references it.
    s[0] = MemoryState::default();
    s[1].backrefs.clear();
    let r = check(&s);
    only(&r, ViolationKind::Dangling);
    let v = &r.violations[0];
    assert_eq!(v.region, RB);
    assert!(v.message.contains("rb/subnet/s1") && v.message.contains("ra/network/n1"));
    // An allow_dangling reference to a gone target is fine.
    let mut rb = MemoryState::default();
    put(
        &mut rb,
        res(
            ("rb/port/p", 3),
            ResourceState::Active,
            &[("qos_policy", &[("ra/qos_policy/q", 4)])],
        ),
    );
    assert!(check(&[MemoryState::default(), rb]).is_clean());
}

#[test]
fn dangling_to_a_recreated_name() {
    let mut s = healthy();
    let net = s[0].resources.get_mut(&rn(NET.0)).unwrap();
    net.uid = uid(9);
    s[0].uid_index.clear();
    s[0].uid_index.insert(uid(9), rn(NET.0));
    let r = check(&s);
    assert!(kinds(&r).contains(&ViolationKind::Dangling), "{}", r.lines());
    assert!(kinds(&r).contains(&ViolationKind::LeakedBackref), "{}", r.lines());
}

/// ra/network/n1 ← rb/router/r (field gateway_network, block), the
/// network DELETING and BLOCKED by the router.
fn blocked_by_a_router() -> [MemoryState; 2] {
    const ROUTER: (&str, u128) = ("rb/router/r", 7);
    let mut ra = MemoryState::default();
    put(&mut ra, res(NET, ResourceState::Active, &[]));
    row(&mut ra, NET, ROUTER, "gateway_network", OnDelete::Block);
    let blocked = DeletionStatus::Blocked {
        blockers: vec![Blocker {
            referrer: rn(ROUTER.0),
            field: "gateway_network".into(),
            referrer_deleting: false,
        }],
        reason: "blocked by rb/router/r".into(),
    };
    deleting(&mut ra, NET, DeletionReason::Requested, blocked);
    ra.work.insert(
        uid(NET.1),
        WorkItem {
            attempts: 1,
            ..WorkItem::due_now(t(NET), Timestamp(50))
        },
    );
    let mut rb = MemoryState::default();
    put(
        &mut rb,
        res(ROUTER, ResourceState::Active, &[("gateway_network", &[NET])]),
    );
    row(&mut rb, NET, ROUTER, "gateway_network", OnDelete::Block);
    [ra, rb]
}

#[test]
fn resurrection_live_reference_to_a_deleting_target() {
    // A block reference to a held target is how blocking looks.
    let r = check(&blocked_by_a_router());
    assert!(r.is_clean(), "{}", r.lines());
    // A cascade reference to a DELETING target: the cascade was not applied.
    let mut s = healthy();
    let failed = DeletionStatus::Failed {
        error: "gave up".into(),
    };
    deleting(&mut s[0], NET, DeletionReason::Requested, failed);
    only(&check(&s), ViolationKind::Resurrection);
    // Not while messages are in flight: the DELETING event may be on its way.
    assert!(check_in_flight(&views(&s), Some(&schema())).is_clean());
}

#[test]
fn resurrection_duplicate_uid() {
    let mut s = healthy();
    put(&mut s[1], res(("rb/network/n9", NET.1), ResourceState::Active, &[]));
    only(&check(&s), ViolationKind::Resurrection);
}

#[test]
fn resurrection_revived_remote_deletion() {
    let mut s = healthy();
    s[1].remote_deletions.insert(
        uid(NET.1),
        RemoteDeletion {
            target: t(NET),
            operation: op_id(),
            seen_at: Timestamp(3),
            purged: false,
            no_cascade: false,
            forced: false,
            principal: Default::default(),
            retain_ms: 0,
        },
    );
    let r = check(&s);
    only(&r, ViolationKind::Resurrection);
    only(&check_in_flight(&views(&s), None), ViolationKind::Resurrection);
}

#[test]
fn resurrection_row_attached_after_deleting() {
    let mut s = blocked_by_a_router();
    s[0].backrefs.values_mut().for_each(|b| b.attached_at = Timestamp(9));
    only(&check(&s), ViolationKind::Resurrection);
    only(
        &check_in_flight(&views(&s), Some(&schema())),
        ViolationKind::Resurrection,
    );
}

#[test]
fn leaked_backref() {
    let mut s = healthy();
    // The subnet dropped the reference, both rows stayed.
    s[1].resources.get_mut(&rn(SUB.0)).unwrap().refs.clear();
    let r = check(&s);
    only(&r, ViolationKind::LeakedBackref);
    assert_eq!(r.violations.len(), 2, "{}", r.lines());
    assert!(r
        .violations
        .iter()
        .any(|v| v.region == RA && v.message.contains("owner row")));
    assert!(r
        .violations
        .iter()
        .any(|v| v.region == RB && v.message.contains("mirror row")));
    // Leaks are a quiescence finding: a release may be on its way.
    assert!(check_in_flight(&views(&s), Some(&schema())).is_clean());
}

#[test]
fn leaked_mirror_without_owner_row() {
    let mut s = healthy();
    s[0].backrefs.clear();
    let r = check(&s);
    assert!(kinds(&r).contains(&ViolationKind::MissingBackref), "{}", r.lines());
    assert!(r
        .of_kind(ViolationKind::LeakedBackref)
        .any(|v| v.message.contains("has no owner row in region ra")));
}

#[test]
fn stale_remote_deletion() {
    let mut s = healthy();
    s[0].remote_deletions.insert(
        uid(99),
        RemoteDeletion {
            target: t(("rb/subnet/gone", 99)),
            operation: op_id(),
            seen_at: Timestamp(3),
            purged: false,
            no_cascade: false,
            forced: false,
            principal: Default::default(),
            retain_ms: 0,
        },
    );
    only(&check(&s), ViolationKind::StaleRemoteDeletion);
}

#[test]
fn missing_backref() {
    let mut s = healthy();
    s[1].backrefs.clear();
    let r = check(&s);
    only(&r, ViolationKind::MissingBackref);
    assert!(r
        .violations
        .iter()
        .all(|v| v.region == RB && v.message.contains("mirror")));
    // Without any row, the owner's is missing too (classified by the schema).
    s[0].backrefs.clear();
    let r = check(&s);
    only(&r, ViolationKind::MissingBackref);
    assert!(r.violations.iter().any(|v| v.region == RA));
    only(
        &check_in_flight(&views(&s), Some(&schema())),
        ViolationKind::MissingBackref,
    );
}

#[test]
fn missing_backref_not_in_flight_while_the_attach_is_pending() {
    let mut s = healthy();
    s[0].backrefs.clear();
    let key = s[1].backrefs.keys().next().unwrap().clone();
    s[1].pending_attach.insert(
        uid(SUB.1),
        PendingAttach {
            resource: t(SUB),
            keys: vec![key],
        },
    );
    assert!(check_in_flight(&views(&s), Some(&schema())).is_clean());
    let r = check(&s);
    assert!(kinds(&r).contains(&ViolationKind::MissingBackref), "{}", r.lines());
    assert!(kinds(&r).contains(&ViolationKind::NotQuiescent), "{}", r.lines());
}

#[test]
fn unexplained_deletion() {
    let mut ra = MemoryState::default();
    put(&mut ra, res(("ra/project/p", 5), ResourceState::Active, &[]));
    deleting(
        &mut ra,
        ("ra/project/p", 5),
        DeletionReason::Requested,
        DeletionStatus::Pending,
    );
    only(&check(&[ra.clone()]), ViolationKind::UnexplainedDeletion);
    // A DELETING resource without its record.
    let mut rb = MemoryState::default();
    put(&mut rb, res(("rb/project/q", 6), ResourceState::Deleting, &[]));
    only(
        &check(&[MemoryState::default(), rb]),
        ViolationKind::UnexplainedDeletion,
    );
}

#[test]
fn a_root_waits_for_an_explained_member() {
    // ra/network/n1 (root, PENDING) and its cascaded subnet in rb,
    // BLOCKED by a router in rb.
    let [mut ra, mut rb] = healthy();
    ra.backrefs.clear();
    rb.backrefs.clear();
    deleting(&mut ra, NET, DeletionReason::Requested, DeletionStatus::Pending);
    put(
        &mut rb,
        res(
            ("rb/router/r", 7),
            ResourceState::Active,
            &[("gateway_network", &[SUB])],
        ),
    );
    row(&mut rb, SUB, ("rb/router/r", 7), "gateway_network", OnDelete::Block);
    let cascade = DeletionReason::Cascade {
        from: rn(NET.0),
        field: "network".into(),
    };
    let blocked = DeletionStatus::Blocked {
        blockers: vec![Blocker {
            referrer: rn("rb/router/r"),
            field: "gateway_network".into(),
            referrer_deleting: false,
        }],
        reason: "blocked by rb/router/r".into(),
    };
    rb.operations.insert(op_id(), ra.operations[&op_id()].clone());
    deleting(&mut rb, SUB, cascade.clone(), blocked);
    rb.work.insert(
        uid(SUB.1),
        WorkItem {
            attempts: 1,
            ..WorkItem::due_now(t(SUB), Timestamp(50))
        },
    );
    // The router gateway field targets a network by the schema: the
    // schema check is not what this test is about.
    let r = check_quiescent(&views(&[ra.clone(), rb.clone()]), None);
    assert!(r.is_clean(), "{}", r.lines());
    // A stale blocker explains nothing.
    rb.resources.get_mut(&rn("rb/router/r")).unwrap().refs.clear();
    rb.backrefs.clear();
    let r = check_quiescent(&views(&[ra.clone(), rb.clone()]), None);
    only(&r, ViolationKind::UnexplainedDeletion);
    assert_eq!(r.violations.len(), 2, "{}", r.lines());
    // Nor does an explained member excuse a PENDING member that is not the root.
    rb.resources.get_mut(&rn("rb/router/r")).unwrap().refs = [("gateway_network".to_string(), vec![t(SUB)])].into();
    row(&mut rb, SUB, ("rb/router/r", 7), "gateway_network", OnDelete::Block);
    ra.deletions.get_mut(&uid(NET.1)).unwrap().reason = cascade;
    let r = check_quiescent(&views(&[ra, rb]), None);
    only(&r, ViolationKind::UnexplainedDeletion);
    assert!(r.violations[0].message.contains("ra/network/n1"), "{}", r.lines());
}

#[test]
fn unsettled_create() {
    let mut s = healthy();
    s[1].resources.get_mut(&rn(SUB.0)).unwrap().state = ResourceState::Creating;
    let r = check(&s);
    only(&r, ViolationKind::UnsettledCreate);
    assert!(r.violations[0].message.contains("rb/subnet/s1"));
    // Not a finding while messages are in flight.
    assert!(check_in_flight(&views(&s), Some(&schema())).is_clean());
}

#[test]
fn region_mismatch() {
    let mut s = healthy();
    put(&mut s[0], res(("rb/project/x", 8), ResourceState::Active, &[]));
    only(&check(&s), ViolationKind::RegionMismatch);
}

#[test]
fn inconsistent_index() {
    let mut s = healthy();
    s[0].uid_index.clear();
    only(&check(&s), ViolationKind::InconsistentIndex);
    let mut s = healthy();
    let b = s[0].backrefs.pop_first().unwrap().1;
    let mut key = b.key();
    key.field = "other".into();
    s[0].backrefs.insert(key, b);
    only(&check(&s), ViolationKind::InconsistentIndex);
    // A deletion record without its DELETING resource.
    let mut s = healthy();
    deleting(&mut s[0], NET, DeletionReason::Requested, DeletionStatus::Pending);
    s[0].resources.get_mut(&rn(NET.0)).unwrap().state = ResourceState::Active;
    let r = check(&s);
    assert!(kinds(&r).contains(&ViolationKind::InconsistentIndex), "{}", r.lines());
}

#[test]
fn schema_mismatch() {
    let mut s = healthy();
    s[1].resources
        .get_mut(&rn(SUB.0))
        .unwrap()
        .refs
        .insert("bogus".into(), vec![t(NET)]);
    let r = check(&s);
    only(&r, ViolationKind::SchemaMismatch);
    assert_eq!(r.unclassified_refs, 1);
    // Without a schema it is only unclassified.
    assert!(check_quiescent(&views(&s), None).is_clean());
    let mut s = healthy();
    for st in &mut s {
        st.backrefs.values_mut().for_each(|b| b.on_delete = OnDelete::Unset);
    }
    only(&check(&s), ViolationKind::SchemaMismatch);
    let mut s = healthy();
    let net2 = ("ra/network/n2", 9);
    put(&mut s[0], res(net2, ResourceState::Active, &[]));
    s[1].resources
        .get_mut(&rn(SUB.0))
        .unwrap()
        .refs
        .get_mut("network")
        .unwrap()
        .push(t(net2));
    row(&mut s[0], net2, SUB, "network", OnDelete::Cascade);
    row(&mut s[1], net2, SUB, "network", OnDelete::Cascade);
    only(&check(&s), ViolationKind::SchemaMismatch);
}

#[test]
fn queue_mismatch() {
    let mut ra = MemoryState::default();
    put(&mut ra, res(("ra/project/p", 5), ResourceState::Active, &[]));
    let failed = DeletionStatus::Failed {
        error: "gave up".into(),
    };
    deleting(&mut ra, ("ra/project/p", 5), DeletionReason::Requested, failed);
    assert!(check(&[ra.clone()]).is_clean(), "{}", check(&[ra.clone()]).lines());
    ra.work.insert(
        uid(5),
        WorkItem {
            attempts: 1,
            ..WorkItem::due_now(t(("ra/project/p", 5)), Timestamp(50))
        },
    );
    let r = check(&[ra]);
    only(&r, ViolationKind::QueueMismatch);
    assert_eq!(r.violations.len(), 2, "{}", r.lines());
}

#[test]
fn operation_mismatch() {
    let mut ra = MemoryState::default();
    put(&mut ra, res(("ra/project/p", 5), ResourceState::Active, &[]));
    let failed = DeletionStatus::Failed {
        error: "gave up".into(),
    };
    deleting(&mut ra, ("ra/project/p", 5), DeletionReason::Requested, failed);
    ra.operations.get_mut(&op_id()).unwrap().progress.deleted = 3;
    only(&check(&[ra.clone()]), ViolationKind::OperationMismatch);
    ra.operations.clear();
    only(&check(&[ra]), ViolationKind::OperationMismatch);
}

#[test]
fn event_order() {
    let mut s = healthy();
    let event = |revision| Event {
        revision,
        event_type: EventType::Created,
        resource: t(NET),
        snapshot: None,
        operation: None,
        message: String::new(),
        time: Timestamp(1),
        no_cascade: false,
        cause: None,
        principal: Default::default(),
        retain_ms: 0,
    };
    s[0].events = vec![event(1), event(2)];
    s[0].next_revision = 3;
    assert!(check(&s).is_clean());
    s[0].events = vec![event(2), event(1)];
    only(&check(&s), ViolationKind::EventOrder);
    s[0].events = vec![event(1), event(3)];
    only(&check(&s), ViolationKind::EventOrder);
}

/// A dump's view: read marks decide `dangling`, rows and marks decide
/// tracked-ness where there is no schema.
fn dump_view<'s>(s: &'s MemoryState, region: &str, marks: &[BackRefKey]) -> RegionView<'s> {
    RegionView {
        dangling: Some(marks.iter().cloned().collect()),
        store: None,
        ..RegionView::from_state(&RegionId::parse(region).unwrap(), s)
    }
}

#[test]
fn read_marks_decide_dangling() {
    let mut rb = MemoryState::default();
    put(
        &mut rb,
        res(
            ("rb/port/p", 3),
            ResourceState::Active,
            &[("qos_policy", &[("ra/qos_policy/q", 4)])],
        ),
    );
    let ra = MemoryState::default();
    let key = BackRefKey {
        target: uid(4),
        referrer: uid(3),
        field: "qos_policy".into(),
    };
    // Not marked: a reader would take the gone target for live.
    let unmarked = [dump_view(&ra, RA, &[]), dump_view(&rb, RB, &[])];
    only(&check_quiescent(&unmarked, Some(&schema())), ViolationKind::Dangling);
    let r = check_quiescent(&unmarked, None);
    only(&r, ViolationKind::Dangling);
    assert_eq!(r.unclassified_refs, 1);
    let marked = [dump_view(&ra, RA, &[]), dump_view(&rb, RB, &[key])];
    let r = check_quiescent(&marked, None);
    assert!(r.is_clean(), "{}", r.lines());
    assert_eq!(r.unclassified_refs, 0);
}

#[test]
fn tracked_ness_learned_from_rows_of_the_same_field() {
    let [ra, mut rb] = healthy();
    put(
        &mut rb,
        res(("rb/subnet/s2", 12), ResourceState::Active, &[("network", &[NET])]),
    );
    let v = [dump_view(&ra, RA, &[]), dump_view(&rb, RB, &[])];
    let r = check_quiescent(&v, None);
    only(&r, ViolationKind::MissingBackref);
    assert_eq!(r.violations.len(), 2, "{}", r.lines());
    assert!(r.violations.iter().all(|v| v.message.contains("rb/subnet/s2")));
}

#[test]
fn unknown_tracking_is_counted_or_decided_by_the_schema() {
    let mut ra = MemoryState::default();
    put(&mut ra, res(NET, ResourceState::Active, &[]));
    put(
        &mut ra,
        res(("ra/subnet/s", 3), ResourceState::Active, &[("network", &[NET])]),
    );
    let v = [dump_view(&ra, RA, &[])];
    let r = check_quiescent(&v, None);
    assert!(r.is_clean(), "{}", r.lines());
    assert_eq!(r.unclassified_refs, 1);
    only(&check_quiescent(&v, Some(&schema())), ViolationKind::MissingBackref);
}

#[test]
fn a_creating_referrer_is_checked_at_quiescence_only() {
    let mut s = healthy();
    s[0] = MemoryState::default();
    s[1].backrefs.clear();
    s[1].resources.get_mut(&rn(SUB.0)).unwrap().state = ResourceState::Creating;
    assert!(check_in_flight(&views(&s), Some(&schema())).is_clean());
    let r = check(&s);
    assert_eq!(
        kinds(&r),
        vec![ViolationKind::Dangling, ViolationKind::UnsettledCreate],
        "{}",
        r.lines()
    );
}
