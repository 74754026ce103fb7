//! Undelete (issue 29) in one region: members back with their uids and
//! rows, unset references back only at the revision the unset left, the
//! expiry and the undelete racing in the writer, bounded batches, dry runs.

use std::collections::{BTreeMap, BTreeSet};

use crate::auth::{AllowAll, Principal};
use crate::invariants::{self, RegionView};
use crate::memory::MemoryState;
use crate::model::{EventType, OperationState, Outcome, OutcomeAction, RefTarget, ResourceState, Timestamp};
use crate::name::{OperationId, RegionId, ResourceName, SequentialIds, Uid};
use crate::protocol::{self, Ctx, DeleteOutcome, DeleteRequest, Policy, RefRequest, ResourceSpec};
use crate::schema::Schema;
use crate::state::StateRead;

use super::{finish_undelete_part, remote_targets, undelete_batch, UndeleteBatch, UndeletePhase, UndeleteReport};

const HOUR: u64 = 3_600_000;

/// A network's project is `cascade`; a port's network is `unset`; a
/// subnet's network `cascade`.
const SCHEMA: &str = r#"
[kinds.project]
[kinds.network.refs.project]
kind = "project"
on_delete = "cascade"
[kinds.subnet.refs.network]
kind = "network"
on_delete = "cascade"
[kinds.port.refs.network]
kind = "network"
on_delete = "unset"
"#;

struct World {
    state: MemoryState,
    schema: Schema,
    region: RegionId,
    ids: SequentialIds,
    policy: Policy,
    now: Timestamp,
}

fn ctx_of<'a>(schema: &'a Schema, region: &'a RegionId, policy: &'a Policy, now: Timestamp) -> Ctx<'a> {
    Ctx {
        schema,
        region,
        now,
        policy,
        authorizer: &AllowAll,
    }
}

impl World {
    fn new() -> Self {
        World {
            state: MemoryState::default(),
            schema: Schema::from_toml(SCHEMA).unwrap(),
            region: RegionId::parse("r1").unwrap(),
            ids: SequentialIds::default(),
            policy: Policy::default(),
            now: Timestamp(1_000_000),
        }
    }

    fn ctx(&self) -> Ctx<'_> {
        ctx_of(&self.schema, &self.region, &self.policy, self.now)
    }

    fn create(&mut self, name: &str, refs: &[(&str, &str)]) {
        let spec = ResourceSpec {
            name: name.to_owned(),
            refs: refs
                .iter()
                .map(|(f, t)| {
                    (
                        f.to_string(),
                        vec![RefRequest {
                            name: t.to_string(),
                            uid: None,
                        }],
                    )
                })
                .collect(),
            attributes: BTreeMap::from([("k".to_owned(), name.to_owned())]),
            finalizers: Vec::new(),
        };
        let ctx = ctx_of(&self.schema, &self.region, &self.policy, self.now);
        let step = protocol::create(&self.state, ctx, &mut self.ids, vec![spec]).unwrap();
        self.state.apply(step.writes);
    }

    fn delete(&mut self, name: &str, retain_ms: u64) -> OperationId {
        let req = DeleteRequest {
            name: name.to_owned(),
            cascade: true,
            requested_by: "tester".to_owned(),
            retain_ms,
            ..DeleteRequest::default()
        };
        let ctx = ctx_of(&self.schema, &self.region, &self.policy, self.now);
        let step = protocol::delete(&self.state, ctx, &mut self.ids, req).unwrap();
        self.state.apply(step.writes);
        let op = match step.value {
            DeleteOutcome::Accepted(op) => op.id,
            other => panic!("not accepted: {other:?}"),
        };
        self.work();
        op
    }

    fn work(&mut self) {
        for _ in 0..100 {
            let step = protocol::process_work(&self.state, self.ctx()).unwrap();
            let idle = step.writes.is_empty();
            self.state.apply(step.writes);
            if idle {
                return;
            }
        }
        panic!("work did not settle in 100 steps");
    }

    fn get(&self, name: &str) -> Option<crate::model::Resource> {
        self.state.resource(&ResourceName::parse(name).unwrap()).unwrap()
    }

    fn outcomes_of(&self, op: OperationId) -> Vec<Outcome> {
        self.state
            .outcomes
            .iter()
            .filter(|((id, _), _)| *id == op)
            .map(|(_, o)| o.clone())
            .collect()
    }

    fn batch(&self, id: OperationId, of: OperationId, phase: UndeletePhase, outcomes: Vec<Outcome>) -> UndeleteBatch {
        let root = self.state.operations[&of].root.clone();
        UndeleteBatch {
            id,
            of,
            root,
            requested_by: "tester".to_owned(),
            principal: Principal::anonymous(),
            phase,
            outcomes,
            remote_live: BTreeSet::new(),
            final_round: true,
            dry_run: false,
        }
    }

    /// Both phases over every outcome of `of`, `per_batch` at a time.
    fn undelete(&mut self, of: OperationId, per_batch: usize) -> (OperationId, UndeleteReport) {
        let id = OperationId(uuid::Uuid::from_u128(0xfeed));
        let mut total = UndeleteReport::default();
        for phase in [UndeletePhase::Members, UndeletePhase::References] {
            let outcomes = self.outcomes_of(of);
            for page in outcomes.chunks(per_batch) {
                let step = undelete_batch(&self.state, self.ctx(), self.batch(id, of, phase, page.to_vec())).unwrap();
                self.state.apply(step.writes);
                total.restored.extend(step.value.restored);
                total.not_restored.extend(step.value.not_restored);
                total.waiting.extend(step.value.waiting);
            }
        }
        let step = finish_undelete_part(&self.state, self.ctx(), id, BTreeSet::new(), false).unwrap();
        self.state.apply(step.writes);
        (id, total)
    }

    fn violations(&self) -> Vec<String> {
        let views = [RegionView::from_state(&self.region, &self.state)];
        invariants::check_quiescent(&views, Some(&self.schema))
            .violations
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

/// p ← n1, n2 (cascade); x, y ports (unset) on n1.
fn topology() -> World {
    let mut w = World::new();
    w.create("r1/project/p", &[]);
    w.create("r1/network/n1", &[("project", "r1/project/p")]);
    w.create("r1/network/n2", &[("project", "r1/project/p")]);
    w.create("r1/port/x", &[("network", "r1/network/n1")]);
    w.create("r1/port/y", &[("network", "r1/network/n1")]);
    w
}

const MEMBERS: [&str; 3] = ["r1/project/p", "r1/network/n1", "r1/network/n2"];

#[test]
fn an_undelete_brings_every_member_back_with_its_uid_rows_and_unset_references() {
    let mut w = topology();
    let before: BTreeMap<String, crate::model::Resource> = MEMBERS
        .iter()
        .chain(&["r1/port/x"])
        .map(|n| (n.to_string(), w.get(n).unwrap()))
        .collect();
    let rows_before = w.state.backrefs.clone();
    let of = w.delete("r1/project/p", HOUR);
    assert_eq!(w.get("r1/network/n1").unwrap().state, ResourceState::Deleted);
    assert!(!w.get("r1/port/x").unwrap().refs.contains_key("network"));
    assert!(w.violations().is_empty(), "{:?}", w.violations());

    // One outcome per batch, in name order: the networks come before their
    // project in the page order, and bring it back first, in their step.
    let (id, report) = w.undelete(of, 1);
    assert!(report.not_restored.is_empty(), "{:?}", report.not_restored);
    assert_eq!(
        report.restored.len(),
        5,
        "3 members and 2 unset referrers: {:?}",
        report.restored
    );
    for (name, old) in &before {
        let now = w.get(name).unwrap();
        assert_eq!(now.state, ResourceState::Active, "{name}");
        assert_eq!(now.uid, old.uid, "{name} keeps its uid");
        assert_eq!(now.refs, old.refs, "{name} keeps its references");
        assert_eq!(now.attributes, old.attributes, "{name} keeps its attributes");
        assert!(now.soft_deleted.is_none());
    }
    // Every row is back, so a later Delete cascades through them again.
    let keys = |rows: &BTreeMap<crate::model::BackRefKey, crate::model::BackRef>| {
        rows.keys().cloned().collect::<BTreeSet<_>>()
    };
    assert_eq!(keys(&w.state.backrefs), keys(&rows_before));
    assert!(w.violations().is_empty(), "{:?}", w.violations());
    // Nothing left to expire them.
    assert!(w.state.work.is_empty(), "{:?}", w.state.work);
    // UNDELETED events for the members.
    let undeleted: BTreeSet<String> = w
        .state
        .events
        .iter()
        .filter(|e| e.event_type == EventType::Undeleted)
        .map(|e| e.resource.name.to_string())
        .collect();
    assert_eq!(undeleted, MEMBERS.iter().map(|s| s.to_string()).collect());
    let op = &w.state.operations[&id];
    assert_eq!(op.state, OperationState::Succeeded);
    assert_eq!(op.undelete.as_ref().unwrap().restored, 5);
    assert!(w.outcomes_of(id).iter().all(|o| o.action == OutcomeAction::Restored));

    // A later delete cascades through the restored rows again.
    let again = w.delete("r1/project/p", 0);
    assert!(w.get("r1/network/n1").is_none());
    assert!(w.get("r1/port/x").unwrap().refs.is_empty());
    assert_eq!(w.state.operations[&again].state, OperationState::Succeeded);
}

#[test]
fn a_referrer_changed_since_the_unset_keeps_its_field_and_the_outcome_says_why() {
    let mut w = topology();
    let of = w.delete("r1/project/p", HOUR);
    // y is changed after the unset: its revision moves.
    let y = w.get("r1/port/y").unwrap();
    let mut attributes = y.attributes.clone();
    attributes.insert("touched".into(), "yes".into());
    let spec = ResourceSpec {
        name: y.name.to_string(),
        refs: BTreeMap::new(),
        attributes,
        finalizers: Vec::new(),
    };
    let step = protocol::update(&w.state, w.ctx(), spec, None).unwrap();
    w.state.apply(step.writes);
    let y = w.get("r1/port/y").unwrap();

    let (id, report) = w.undelete(of, 100);
    assert_eq!(report.not_restored.len(), 1, "{:?}", report.not_restored);
    let (who, why) = &report.not_restored[0];
    assert_eq!(who.name.to_string(), "r1/port/y");
    assert!(why.contains("changed since the unset"), "{why}");
    assert!(!w.get("r1/port/y").unwrap().refs.contains_key("network"));
    assert_eq!(w.get("r1/port/y").unwrap().revision, y.revision, "not touched");
    assert!(w.get("r1/port/x").unwrap().refs.contains_key("network"));
    let outcome = w.state.outcome(id, &y.name).unwrap().unwrap();
    assert!(matches!(outcome.action, OutcomeAction::NotRestored { .. }));
    assert_eq!(w.state.operations[&id].state, OperationState::Failed);
    assert!(w.violations().is_empty(), "{:?}", w.violations());
}

#[test]
fn the_expiry_and_the_undelete_race_one_way() {
    // The expiry commits first: the member is purged, the undelete says so.
    let mut w = topology();
    let of = w.delete("r1/project/p", 60_000);
    w.now = w.now.plus_millis(60_000);
    w.work();
    assert!(w.get("r1/network/n1").is_none());
    let (_, report) = w.undelete(of, 100);
    assert!(report.restored.is_empty(), "{:?}", report.restored);
    let n1 = report
        .not_restored
        .iter()
        .find(|(t, _)| t.name.to_string() == "r1/network/n1")
        .expect("n1 reported");
    assert!(n1.1.starts_with("expired: purged at"), "{}", n1.1);
    // Its unset referrers are not restored either: their target is gone.
    assert!(report
        .not_restored
        .iter()
        .any(|(t, why)| t.name.to_string() == "r1/port/x" && why.contains("not live")));
    assert!(w.violations().is_empty(), "{:?}", w.violations());

    // The window has passed but the expiry has not run yet: the undelete
    // leaves it as the expiry will (never restored after its window).
    let mut w = topology();
    let of = w.delete("r1/project/p", 60_000);
    w.now = w.now.plus_millis(60_000);
    let (_, report) = w.undelete(of, 100);
    assert!(report.restored.is_empty());
    assert!(report
        .not_restored
        .iter()
        .all(|(_, why)| why.contains("expired") || why.contains("not live")));
    w.work();
    assert!(w.get("r1/network/n1").is_none(), "the expiry purges it");

    // The undelete commits first: the expiry's entry goes with the window.
    let mut w = topology();
    let of = w.delete("r1/project/p", 60_000);
    w.now = w.now.plus_millis(59_999);
    let (_, report) = w.undelete(of, 100);
    assert_eq!(report.restored.len(), 5);
    w.now = w.now.plus_millis(HOUR);
    w.work();
    assert_eq!(w.get("r1/network/n1").unwrap().state, ResourceState::Active);
    assert!(w.violations().is_empty(), "{:?}", w.violations());
}

#[test]
fn a_dry_run_decides_the_same_and_writes_nothing() {
    let mut w = topology();
    let of = w.delete("r1/project/p", HOUR);
    let id = OperationId(uuid::Uuid::from_u128(7));
    let mut batch = w.batch(id, of, UndeletePhase::Members, w.outcomes_of(of));
    batch.dry_run = true;
    let step = undelete_batch(&w.state, w.ctx(), batch).unwrap();
    assert!(step.writes.is_empty());
    assert_eq!(step.value.restored.len(), 3);
    assert!(step.value.to_attach.is_empty());
}

#[test]
fn a_member_whose_remote_target_is_not_live_waits_then_is_reported_in_the_final_round() {
    let mut w = World::new();
    w.create("r1/project/p", &[]);
    let of = w.delete("r1/project/p", HOUR);
    // A buried subnet of r1 on a network of r2 (as a member the cascade
    // reached from another region would be).
    let remote = RefTarget {
        name: ResourceName::parse("r2/network/far").unwrap(),
        uid: Uid(uuid::Uuid::from_u128(99)),
    };
    let mut s = w.get("r1/project/p").unwrap();
    s.name = ResourceName::parse("r1/subnet/s").unwrap();
    s.uid = Uid(uuid::Uuid::from_u128(100));
    s.refs = BTreeMap::from([("network".to_owned(), vec![remote.clone()])]);
    w.state.uid_index.insert(s.uid, s.name.clone());
    w.state.resources.insert(s.name.clone(), s.clone());
    let outcomes = vec![Outcome {
        resource: RefTarget {
            name: s.name.clone(),
            uid: s.uid,
        },
        action: OutcomeAction::Deleted,
        time: w.now,
    }];
    let wanted = remote_targets(&w.state, &w.schema, "r1", UndeletePhase::Members, &outcomes).unwrap();
    assert_eq!(wanted, BTreeSet::from([remote.clone()]));

    let id = OperationId(uuid::Uuid::from_u128(8));
    let mut batch = w.batch(id, of, UndeletePhase::Members, outcomes);
    batch.final_round = false;
    let step = undelete_batch(&w.state, w.ctx(), batch.clone()).unwrap();
    assert_eq!(step.value.waiting.len(), 1, "{:?}", step.value);
    assert!(step.value.not_restored.is_empty());
    w.state.apply(step.writes);
    assert_eq!(w.get("r1/subnet/s").unwrap().state, ResourceState::Deleted);

    // Its owner says it is live: restored, with a durable intent to attach.
    batch.remote_live.insert(remote.clone());
    let step = undelete_batch(&w.state, w.ctx(), batch.clone()).unwrap();
    assert_eq!(step.value.restored.len(), 1);
    assert_eq!(step.value.to_attach.len(), 1);
    let mut after = w.state.clone();
    after.apply(step.writes);
    assert_eq!(after.pending_attach[&s.uid].keys.len(), 1);

    // The final round without it: NOT_RESTORED, naming the target.
    batch.remote_live.clear();
    batch.final_round = true;
    let step = undelete_batch(&w.state, w.ctx(), batch).unwrap();
    assert_eq!(step.value.not_restored.len(), 1);
    assert!(
        step.value.not_restored[0].1.contains("r2/network/far"),
        "{:?}",
        step.value
    );
}

#[test]
fn buried_names_stay_reserved_so_a_restore_never_collides() {
    let mut w = topology();
    let of = w.delete("r1/project/p", HOUR);
    let spec = ResourceSpec {
        name: "r1/network/n1".to_owned(),
        refs: BTreeMap::new(),
        attributes: BTreeMap::new(),
        finalizers: Vec::new(),
    };
    let ctx = ctx_of(&w.schema, &w.region, &w.policy, w.now);
    let refused = protocol::create(&w.state, ctx, &mut w.ids, vec![spec]).unwrap_err();
    assert_eq!(refused.code(), crate::ErrorCode::AlreadyExists);
    let (_, report) = w.undelete(of, 100);
    assert!(report.not_restored.is_empty(), "{:?}", report.not_restored);
}

#[test]
fn an_undelete_run_again_changes_nothing() {
    let mut w = topology();
    let of = w.delete("r1/project/p", HOUR);
    w.undelete(of, 2);
    let events = w.state.events.len();
    let (_, again) = w.undelete(of, 2);
    assert!(again.restored.is_empty() && again.not_restored.is_empty(), "{again:?}");
    assert_eq!(w.state.events.len(), events);
}

/// A floating IP that a project's cascade deletes (`project`, cascade) and
/// that also refers, `unset`, to a network the same cascade deletes: the
/// network, reached first, must not clear the floating IP's reference in
/// its own step (`work.rs`, `unset_in_this_step`), or the floating IP would
/// be buried without it and an Undelete would bring it back without it,
/// reporting nothing (found in review of that change; its first version
/// did this). Without a retention, the floating IP is not cleared first
/// for nothing either: no `UPDATED` event before its `PURGED`.
#[test]
fn a_referrer_the_same_cascade_deletes_keeps_its_reference_through_an_undelete() {
    let schema = format!(
        "{SCHEMA}\n[kinds.fip.refs.project]\nkind = \"project\"\non_delete = \"cascade\"\n\
         [kinds.fip.refs.network]\nkind = \"network\"\non_delete = \"unset\"\n"
    );
    for retain_ms in [HOUR, 0] {
        let mut w = World::new();
        w.schema = Schema::from_toml(&schema).unwrap();
        w.create("r1/project/p", &[]);
        w.create("r1/network/n1", &[("project", "r1/project/p")]);
        w.create("r1/fip/f", &[("project", "r1/project/p"), ("network", "r1/network/n1")]);
        let before = w.get("r1/fip/f").unwrap();
        let of = w.delete("r1/project/p", retain_ms);
        let f_events: Vec<EventType> = w
            .state
            .events
            .iter()
            .filter(|e| e.resource.uid == before.uid)
            .map(|e| e.event_type)
            .collect();
        assert!(
            !f_events.contains(&EventType::Updated),
            "retain {retain_ms}: f was cleared before it was deleted: {f_events:?}"
        );
        assert!(w.violations().is_empty(), "{:?}", w.violations());
        if retain_ms == 0 {
            assert!(w.get("r1/fip/f").is_none(), "f purged");
            continue;
        }
        let buried = w.get("r1/fip/f").unwrap();
        assert_eq!(buried.state, ResourceState::Deleted);
        assert_eq!(
            buried.refs.keys().collect::<Vec<_>>(),
            before.refs.keys().collect::<Vec<_>>()
        );
        let (_, report) = w.undelete(of, 10);
        assert!(report.not_restored.is_empty(), "{:?}", report.not_restored);
        let back = w.get("r1/fip/f").unwrap();
        assert_eq!(back.state, ResourceState::Active);
        assert_eq!(back.refs, before.refs, "f keeps its references");
    }
}
