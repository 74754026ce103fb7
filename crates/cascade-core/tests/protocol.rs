//! Integration tests of the deletion protocol, driven through `MemoryState`.
//!
//! Every scenario builds a [`World`] (state, schema, region, ids, policy and
//! a controlled clock), runs commands and deletion work to quiescence, and
//! ends with [`check_invariants`].
//!
//! Size: one file of about 1,800 lines on purpose: every scenario shares the
//! `World` fixture and its helpers, and the scenarios follow DESIGN.md's
//! sections in order. A section that grows a fixture of its own is the one to
//! move out.

use std::collections::BTreeSet;

use cascade_core::invariants::{self, RegionView};
use cascade_core::memory::MemoryState;
use cascade_core::protocol::{self, PlannedUnset, WorkReport};
use cascade_core::schema::EXAMPLE_SCHEMA;
use cascade_core::state::StateRead;
use cascade_core::*;
use proptest::prelude::*;

const REGION: &str = "r1";

fn n(kind: &str, id: &str) -> String {
    format!("{REGION}/{kind}/{id}")
}

fn rn(name: &str) -> ResourceName {
    ResourceName::parse(name).unwrap()
}

fn spec_owned(name: &str, refs: Vec<(String, Vec<String>)>) -> ResourceSpec {
    ResourceSpec {
        name: name.to_owned(),
        refs: refs
            .into_iter()
            .map(|(field, targets)| {
                let targets = targets.into_iter().map(|t| RefRequest { name: t, uid: None }).collect();
                (field, targets)
            })
            .collect(),
        ..ResourceSpec::default()
    }
}

fn spec(name: &str, refs: &[(&str, &[&str])]) -> ResourceSpec {
    spec_owned(
        name,
        refs.iter()
            .map(|(f, ts)| (f.to_string(), ts.iter().map(|t| t.to_string()).collect()))
            .collect(),
    )
}

fn del(name: &str, cascade: bool) -> DeleteRequest {
    DeleteRequest {
        name: name.to_owned(),
        cascade,
        dry_run: false,
        allow_missing: false,
        etag: None,
        uid: None,
        requested_by: "tester".to_owned(),
        orphan: false,
        remote_kept: Default::default(),
        principal: Default::default(),
        retain_ms: 0,
        bounds: Default::default(),
        operation_id: None,
    }
}

macro_rules! ctx {
    ($w:expr) => {
        Ctx {
            schema: &$w.schema,
            region: &$w.region,
            now: $w.now,
            policy: &$w.policy,
            authorizer: &$w.authorizer,
        }
    };
}

/// A policy for the tests: everything is allowed but the `(verb, name)`
/// pairs in `denied`. It is not `AllowAll`, so every scenario runs the
/// cascade's per-member checks and audit entries (allowed, by default).
#[derive(Default)]
struct DenySet {
    denied: BTreeSet<(auth::Verb, String)>,
}

impl DenySet {
    const DENY_RULE: &'static str = "test deny-set";
    const ALLOW_RULE: &'static str = "test allow";
}

impl auth::Authorize for DenySet {
    fn decide(&self, _: &auth::Principal, verb: auth::Verb, target: auth::Target<'_>) -> auth::Decision {
        match target {
            auth::Target::Resource(name) if self.denied.contains(&(verb, name.to_string())) => {
                auth::Decision::deny(Self::DENY_RULE)
            }
            _ => auth::Decision::allow(Self::ALLOW_RULE),
        }
    }
}

fn alice() -> auth::Principal {
    auth::Principal {
        id: "alice".to_owned(),
        groups: vec!["net-admins".to_owned()],
        via: auth::Via::Token,
    }
}

struct World {
    state: MemoryState,
    schema: Schema,
    region: RegionId,
    ids: SequentialIds,
    policy: Policy,
    now: Timestamp,
    authorizer: DenySet,
}

impl World {
    fn new(schema_text: &str) -> Self {
        World {
            state: MemoryState::default(),
            schema: Schema::from_toml(schema_text).expect("schema"),
            region: RegionId::parse(REGION).unwrap(),
            ids: SequentialIds::default(),
            policy: Policy::default(),
            now: Timestamp(1_000_000),
            authorizer: DenySet::default(),
        }
    }

    fn neutron() -> Self {
        Self::new(EXAMPLE_SCHEMA)
    }

    fn with_policy(mut self, change: impl FnOnce(&mut Policy)) -> Self {
        change(&mut self.policy);
        self
    }

    fn try_create_all(&mut self, specs: Vec<ResourceSpec>) -> Result<Vec<Resource>, CoreError> {
        let step = protocol::create(&self.state, ctx!(self), &mut self.ids, specs)?;
        self.state.apply(step.writes);
        Ok(step.value)
    }

    fn try_create(&mut self, name: &str, refs: &[(&str, &[&str])]) -> Result<Resource, CoreError> {
        self.try_create_spec(spec(name, refs))
    }

    fn try_create_spec(&mut self, s: ResourceSpec) -> Result<Resource, CoreError> {
        Ok(self.try_create_all(vec![s])?.remove(0))
    }

    fn create(&mut self, name: &str, refs: &[(&str, &[&str])]) -> Resource {
        self.try_create(name, refs)
            .unwrap_or_else(|e| panic!("create {name}: {e}"))
    }

    fn try_update(&mut self, s: ResourceSpec, etag: Option<&str>) -> Result<Resource, CoreError> {
        let step = protocol::update(&self.state, ctx!(self), s, etag)?;
        self.state.apply(step.writes);
        Ok(step.value)
    }

    fn delete_req(&mut self, req: DeleteRequest) -> Result<DeleteOutcome, CoreError> {
        let dry_run = req.dry_run;
        let step = protocol::delete(&self.state, ctx!(self), &mut self.ids, req)?;
        if dry_run {
            assert!(step.writes.is_empty(), "a dry run must write nothing");
        }
        self.state.apply(step.writes);
        Ok(step.value)
    }

    fn delete(&mut self, name: &str, cascade: bool) -> Result<DeleteOutcome, CoreError> {
        self.delete_req(del(name, cascade))
    }

    fn delete_accepted(&mut self, name: &str, cascade: bool) -> Operation {
        match self.delete(name, cascade) {
            Ok(DeleteOutcome::Accepted(op)) => op,
            other => panic!("delete {name} (cascade {cascade}): expected Accepted, got {other:?}"),
        }
    }

    fn dry_run(&mut self, name: &str, cascade: bool) -> Result<Plan, CoreError> {
        let mut req = del(name, cascade);
        req.dry_run = true;
        match self.delete_req(req)? {
            DeleteOutcome::DryRun(plan) => Ok(plan),
            other => panic!("dry run of {name}: got {other:?}"),
        }
    }

    /// One process_work step, applied.
    fn step(&mut self) -> WorkReport {
        let step = protocol::process_work(&self.state, ctx!(self)).expect("process_work");
        self.state.apply(step.writes);
        step.value
    }

    /// Runs due work until a step finds nothing; returns the number of steps
    /// that did something. Never moves the clock.
    fn run_until_quiet(&mut self) -> usize {
        for busy in 0..10_000 {
            let report = self.step();
            if report.items == 0 && !report.more {
                return busy;
            }
        }
        panic!("deletion work did not quiesce in 10000 steps");
    }

    /// Moves the clock to the earliest scheduled work item, if any.
    fn advance_to_next_due(&mut self) -> Option<Timestamp> {
        let next = self.state.work.values().map(|w| w.next_attempt_at).min()?;
        self.now = self.now.max(next);
        Some(next)
    }

    fn get(&self, name: &str) -> Option<Resource> {
        self.state.resource(&rn(name)).unwrap()
    }

    fn active(&self, name: &str) -> Resource {
        let r = self.get(name).unwrap_or_else(|| panic!("{name} is gone"));
        assert_eq!(r.state, ResourceState::Active, "{name}");
        r
    }

    fn op(&self, id: OperationId) -> Operation {
        self.state.operation(id).unwrap().expect("operation")
    }

    fn record(&self, name: &str) -> DeletionRecord {
        let r = self.get(name).unwrap_or_else(|| panic!("{name} is gone"));
        self.state
            .deletion(r.uid)
            .unwrap()
            .unwrap_or_else(|| panic!("{name} has no deletion record"))
    }

    fn outcome(&self, op: OperationId, name: &str) -> Option<OutcomeAction> {
        self.state.outcomes.get(&(op, rn(name))).map(|o| o.action.clone())
    }

    fn check(&self) {
        check_invariants(&self.state, &self.schema);
    }
}

fn targets(r: &Resource, field: &str) -> Vec<String> {
    r.refs
        .get(field)
        .map(|ts| ts.iter().map(|t| t.name.to_string()).collect())
        .unwrap_or_default()
}

/// The invariants of DESIGN.md, checked on a quiescent state: the core's
/// checker (`cascade_core::invariants`), plus what holds only in a test of
/// one region with no compaction.
fn check_invariants(state: &MemoryState, schema: &Schema) {
    let region = RegionId::parse(REGION).unwrap();
    let report = invariants::check_quiescent(&[RegionView::from_state(&region, state)], Some(schema));
    assert!(report.is_clean(), "invariants broken:\n{}", report.lines());
    // Across regions a race can empty a required field (a list owner
    // emptied by racing deletes without cascade, a reference taken back
    // after a refused attach: ARCHITECTURE.md), and an orphan delete
    // empties one on purpose, so the checker cannot require it of a
    // cluster; in one region only an orphan delete empties one.
    for r in state.resources.values().filter(|r| r.state == ResourceState::Active) {
        for (field, spec) in &schema.kind(r.kind()).expect("kind").refs {
            if spec.required {
                assert!(r.refs.contains_key(field), "{}: required {field} missing", r.name);
            }
        }
    }
    // Nothing waits on another region in a single-region test.
    for d in state.deletions.values() {
        assert!(
            !matches!(d.status, DeletionStatus::Waiting { .. }),
            "{}: waiting on another region in a single-region test",
            d.target.name
        );
    }
    // Nothing compacts the outbox here: the next revision follows the last.
    if let Some(last) = state.events.last() {
        assert_eq!(state.next_revision, last.revision + 1);
    }
}

// ---------------------------------------------------------------------------
// The neutron network

struct Neutron {
    w: World,
    project: String,
    net: String,
    sg: String,
    fip: String,
    /// Everything a cascade delete of `net` removes.
    closure: Vec<String>,
    /// Everything that must survive it.
    survivors: Vec<String>,
}

fn neutron_network() -> Neutron {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let net = n("network", "net1");
    let s1 = n("subnet", "s1");
    let s2 = n("subnet", "s2");
    let sg = n("security_group", "sg1");
    let qos = n("qos_policy", "q1");
    let router = n("router", "r1");
    let ri = n("router_interface", "ri1");
    let trunk = n("trunk", "t1");
    let fip = n("floating_ip", "fip1");
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    w.create(&s1, &[("network", &[&net])]);
    w.create(&s2, &[("network", &[&net])]);
    w.create(&sg, &[("project", &[&project])]);
    w.create(&qos, &[]);
    let mut closure = vec![net.clone(), s1.clone(), s2.clone()];
    for i in 0..10 {
        let port = n("port", &format!("port-{i}"));
        let mut refs = vec![("network".to_owned(), vec![net.clone()])];
        match i {
            0 | 1 => refs.push(("subnet".to_owned(), vec![s1.clone()])),
            2 | 3 => refs.push(("subnet".to_owned(), vec![s2.clone()])),
            _ => {}
        }
        if i % 2 == 0 {
            refs.push(("security_groups".to_owned(), vec![sg.clone()]));
        }
        if i == 5 {
            refs.push(("qos_policy".to_owned(), vec![qos.clone()]));
        }
        w.try_create_spec(spec_owned(&port, refs)).unwrap();
        closure.push(port);
    }
    let port = |i: u32| n("port", &format!("port-{i}"));
    w.create(&trunk, &[("parent_port", &[&port(0)])]);
    let sp1 = n("subport", "sp1");
    let sp2 = n("subport", "sp2");
    w.create(&sp1, &[("trunk", &[&trunk]), ("port", &[&port(1)])]);
    w.create(&sp2, &[("trunk", &[&trunk]), ("port", &[&port(2)])]);
    w.create(&router, &[("project", &[&project])]);
    w.create(&ri, &[("router", &[&router]), ("subnet", &[&s1])]);
    w.create(&fip, &[("project", &[&project]), ("port", &[&port(3)])]);
    closure.extend([trunk, sp1, sp2, ri]);
    let survivors = vec![project.clone(), sg.clone(), qos, router, fip.clone()];
    w.check();
    Neutron {
        w,
        project,
        net,
        sg,
        fip,
        closure,
        survivors,
    }
}

#[test]
fn neutron_network_delete_without_cascade_is_refused_listing_dependents() {
    let Neutron { mut w, net, .. } = neutron_network();
    let before = w.state.clone();
    let err = w.delete(&net, false).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    let CoreError::DeleteRefused {
        name,
        blockers,
        dependents,
        more,
    } = &err
    else {
        panic!("expected DeleteRefused, got {err:?}");
    };
    assert_eq!(name.as_str(), net);
    assert!(blockers.is_empty(), "{blockers:?}");
    assert_eq!(*more, 0);
    let listed: BTreeSet<String> = dependents.iter().map(|d| d.referrer.to_string()).collect();
    let mut expected: BTreeSet<String> = (0..10).map(|i| n("port", &format!("port-{i}"))).collect();
    expected.insert(n("subnet", "s1"));
    expected.insert(n("subnet", "s2"));
    assert_eq!(listed, expected);
    assert!(dependents
        .iter()
        .all(|d| d.field == "network" && d.on_delete == OnDelete::Cascade));
    assert!(err.to_string().contains("pass --cascade"), "{err}");
    assert_eq!(w.state, before, "a refused delete writes nothing");
    w.check();
}

#[test]
fn neutron_network_cascade_purges_closure_keeps_unset_referrers_and_root_goes_last() {
    let Neutron {
        mut w,
        net,
        sg,
        fip,
        closure,
        survivors,
        ..
    } = neutron_network();
    let op = w.delete_accepted(&net, true);
    assert_eq!(op.root.name.as_str(), net);
    assert!(op.cascade);
    assert_eq!(op.state, OperationState::Running);
    assert_eq!(op.progress.pending, 1);
    assert_eq!(op.requested_by, "tester");
    assert_eq!(w.get(&net).unwrap().state, ResourceState::Deleting);
    assert_eq!(w.record(&net).reason, DeletionReason::Requested);

    // Step by step: the root stays readable, DELETING, until all else is purged.
    let mut steps = 0;
    loop {
        let report = w.step();
        if report.items == 0 && !report.more {
            break;
        }
        steps += 1;
        assert!(steps < 1000);
        let others_left: Vec<&String> = closure[1..].iter().filter(|c| w.get(c).is_some()).collect();
        match w.get(&net) {
            Some(root) => assert_eq!(root.state, ResourceState::Deleting),
            None => assert!(others_left.is_empty(), "root purged before {others_left:?}"),
        }
    }
    for c in &closure {
        assert!(w.get(c).is_none(), "{c} survived the cascade");
        assert_eq!(w.outcome(op.id, c), Some(OutcomeAction::Deleted), "{c}");
    }
    for s in &survivors {
        w.active(s);
    }
    let fip_now = w.active(&fip);
    assert!(
        !fip_now.refs.contains_key("port"),
        "floating ip keeps {:?}",
        fip_now.refs
    );
    assert_eq!(targets(&fip_now, "project"), vec![n("project", "p1")]);
    assert_eq!(
        w.outcome(op.id, &fip),
        Some(OutcomeAction::Unset {
            field: "port".to_owned(),
            undo: None,
        })
    );
    assert!(w.state.backrefs.keys().all(|k| k.target != w.active(&sg).uid));

    let op = w.op(op.id);
    assert_eq!(op.state, OperationState::Succeeded);
    assert_eq!(op.progress.deleted, closure.len() as u64);
    assert_eq!(op.progress.pending, 0);
    assert_eq!(op.progress.blocked, 0);
    assert_eq!(op.progress.failed, 0);
    assert!(op.progress.unset >= 1);
    assert!(op.end_time.is_some());
    let purged: BTreeSet<String> = w
        .state
        .events
        .iter()
        .filter(|e| e.event_type == EventType::Purged)
        .map(|e| e.resource.name.to_string())
        .collect();
    assert_eq!(purged, closure.iter().cloned().collect());
    // The root's purge is the last one.
    let last_purge = w
        .state
        .events
        .iter()
        .rev()
        .find(|e| e.event_type == EventType::Purged)
        .unwrap();
    assert_eq!(last_purge.resource.name.as_str(), net);
    assert!(w.state.work.is_empty());
    assert!(w.state.deletions.is_empty());
    w.check();
}

/// What a Watch shows of a leaf a cascade purged in the step that reached
/// it (no DELETING first): one `Purged` event naming the leaf's incarnation,
/// with where the cascade came from and through which field, both in its
/// cause and in its message.
#[test]
fn a_leaf_purged_by_a_cascade_says_where_the_cascade_came_from() {
    let Neutron { mut w, net, .. } = neutron_network();
    // Referenced by nothing, holding only its network: a leaf.
    let leaf = n("port", "port-9");
    let uid = w.active(&leaf).uid;
    let op = w.delete_accepted(&net, true);
    w.run_until_quiet();

    let about_leaf: Vec<&Event> = w.state.events.iter().filter(|e| e.resource.uid == uid).collect();
    let types: Vec<EventType> = about_leaf.iter().map(|e| e.event_type).collect();
    assert_eq!(types, vec![EventType::Created, EventType::Purged], "{about_leaf:?}");
    let purged = about_leaf[1];
    assert_eq!(purged.resource.name.as_str(), leaf);
    assert_eq!(purged.operation, Some(op.id));
    assert_eq!(purged.message, format!("purged: cascade from {net} (field network)"));
    assert_eq!(
        purged.cause,
        Some(DeletionReason::Cascade {
            from: rn(&net),
            field: "network".to_owned(),
        })
    );
    assert!(purged.snapshot.is_none(), "a purged resource has no snapshot");
}

/// A member a cascade reaches whose only referrers are a few local `unset`
/// ones ends in the step that reaches it, as a leaf does: its referrers are
/// cleared and it is purged in the same batch, with no DELETING, no
/// deletion record and no queue entry (issue 28: the unset shape wrote 15
/// keys per deleted resource). A watcher sees each referrer cleared before
/// the member goes; the outcomes are those of the DELETING path.
#[test]
fn a_member_with_only_a_few_local_unset_referrers_is_purged_in_the_step_that_reaches_it() {
    let Neutron { mut w, net, fip, .. } = neutron_network();
    let port = n("port", "port-3");
    let port_uid = w.active(&port).uid;
    let fip_uid = w.active(&fip).uid;
    let op = w.delete_accepted(&net, true);
    let mut records_seen = false;
    for _ in 0..1_000 {
        let report = w.step();
        records_seen |= w.state.deletions.contains_key(&port_uid) || w.state.work.contains_key(&port_uid);
        if report.items == 0 && !report.more {
            break;
        }
    }
    assert!(!records_seen, "{port} had a deletion record or a queue entry");

    let about = |uid: Uid| -> Vec<(EventType, u64)> {
        w.state
            .events
            .iter()
            .filter(|e| e.resource.uid == uid)
            .map(|e| (e.event_type, e.revision))
            .collect()
    };
    let port_events = about(port_uid);
    let types: Vec<EventType> = port_events.iter().map(|(t, _)| *t).collect();
    assert_eq!(types, vec![EventType::Created, EventType::Purged], "{port}");
    let fip_events = about(fip_uid);
    let cleared = fip_events.last().expect("the floating IP's events");
    assert_eq!(cleared.0, EventType::Updated, "{fip}: {fip_events:?}");
    assert!(
        cleared.1 < port_events[1].1,
        "{fip} was cleared after {port} was purged"
    );
    assert!(targets(&w.active(&fip), "port").is_empty(), "{fip} still holds {port}");
    assert_eq!(w.outcome(op.id, &port), Some(OutcomeAction::Deleted));
    assert!(
        matches!(w.outcome(op.id, &fip), Some(OutcomeAction::Unset { field, .. }) if field == "port"),
        "{:?}",
        w.outcome(op.id, &fip)
    );
    let progress = w.op(op.id).progress;
    assert_eq!((progress.unset, progress.pending), (1, 0), "{progress:?}");
    w.check();
}

/// With more local `unset` referrers than a step clears for a member it
/// reaches, or with one the deletion's principal may not change, the
/// member passes through DELETING, whose own step deals with them, and the
/// cascade still ends.
#[test]
fn a_member_with_many_unset_referrers_or_a_refused_one_passes_through_deleting() {
    let Neutron {
        mut w, net, project, ..
    } = neutron_network();
    let many = n("port", "port-4");
    let refused = n("port", "port-6");
    for i in 0..=protocol::UNSET_IN_THE_SAME_STEP {
        w.create(
            &n("floating_ip", &format!("many-{i}")),
            &[("project", &[&project]), ("port", &[&many])],
        );
    }
    let denied_fip = n("floating_ip", "denied");
    w.create(&denied_fip, &[("project", &[&project]), ("port", &[&refused])]);
    w.authorizer.denied.insert((auth::Verb::Update, denied_fip.clone()));
    let uids = [w.active(&many).uid, w.active(&refused).uid];
    let denied_uid = w.active(&denied_fip).uid;
    let op = w.delete_accepted(&net, true);
    w.run_until_quiet();

    let types = |uid: Uid| -> Vec<EventType> {
        w.state
            .events
            .iter()
            .filter(|e| e.resource.uid == uid)
            .map(|e| e.event_type)
            .collect()
    };
    assert_eq!(
        types(uids[0]),
        vec![EventType::Created, EventType::Deleting, EventType::Purged],
        "{many}"
    );
    for i in 0..=protocol::UNSET_IN_THE_SAME_STEP {
        let fip = n("floating_ip", &format!("many-{i}"));
        assert!(targets(&w.active(&fip), "port").is_empty(), "{fip}");
    }
    // Refused: DELETING, held BLOCKED by its own step, its referrer kept.
    assert_eq!(
        types(uids[1])[..2],
        [EventType::Created, EventType::Deleting],
        "{refused}"
    );
    assert_eq!(w.get(&refused).expect("held").state, ResourceState::Deleting);
    assert_eq!(targets(&w.active(&denied_fip), "port"), vec![refused.clone()]);
    assert!(types(denied_uid).iter().all(|t| *t == EventType::Created));
    // Allowed again: the retry finishes it.
    w.authorizer.denied.clear();
    while w.get(&refused).is_some() {
        w.advance_to_next_due().expect("the held port is due again");
        w.run_until_quiet();
    }
    assert!(targets(&w.active(&denied_fip), "port").is_empty());
    assert_eq!(w.outcome(op.id, &refused), Some(OutcomeAction::Deleted));
    w.check();
}

#[test]
fn dry_run_plans_exactly_the_closure_and_writes_nothing() {
    let Neutron {
        mut w,
        net,
        fip,
        closure,
        ..
    } = neutron_network();
    let before = w.state.clone();
    let plan = w.dry_run(&net, true).unwrap();
    assert!(!plan.truncated);
    let planned: Vec<String> = plan.deleted.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(planned[0], net, "the root comes first");
    let planned_set: BTreeSet<String> = planned.iter().cloned().collect();
    assert_eq!(planned.len(), planned_set.len(), "duplicates in {planned:?}");
    assert_eq!(planned_set, closure.iter().cloned().collect());
    for t in &plan.deleted {
        assert_eq!(w.get(t.name.as_str()).unwrap().uid, t.uid);
    }
    assert_eq!(
        plan.unset,
        vec![PlannedUnset {
            resource: RefTarget {
                name: rn(&fip),
                uid: w.get(&fip).unwrap().uid
            },
            field: "port".to_owned()
        }]
    );
    assert!(plan.blocked.is_empty());
    assert_eq!(w.state, before, "a dry run changes nothing");
    // Without cascade the dry run is refused like the delete.
    assert!(matches!(w.dry_run(&net, false), Err(CoreError::DeleteRefused { .. })));
    assert_eq!(w.state, before);
    // The plan matches what the delete then does.
    let op = w.delete_accepted(&net, true);
    w.run_until_quiet();
    assert_eq!(w.op(op.id).progress.deleted, plan.deleted.len() as u64);
    w.check();
}

/// What a plan token binds (issue 29): the dry run's members are what the
/// closure check's walk (`peer::plan_from`, from the root) finds, in one
/// canonical text; a dependent created since is named as added; and the
/// delete then does exactly the members, as its outcomes say.
#[test]
fn a_plans_members_are_the_closure_walk_and_what_the_delete_then_does() {
    let Neutron { mut w, net, .. } = neutron_network();
    let plan = w.dry_run(&net, true).unwrap();
    let members = plan.members();
    assert_eq!(members.len(), plan.deleted.len() + plan.unset.len());
    let root = RefTarget {
        name: rn(&net),
        uid: w.get(&net).unwrap().uid,
    };
    let walked = peer::plan_from(&w.state, ctx!(w), vec![root.clone()], true, None).unwrap();
    assert_eq!(
        cascade_core::plan::canonical_text(&walked.members()),
        cascade_core::plan::canonical_text(&members),
        "the check's walk is the dry run's"
    );

    let late = n("port", "late");
    w.create(&late, &[("network", &[&net])]);
    let now = peer::plan_from(&w.state, ctx!(w), vec![root], true, None).unwrap();
    let diff = cascade_core::plan::diff_members(&members, &now.members(), cascade_core::plan::MAX_PLAN_CHANGES_LISTED);
    let added: Vec<(String, String)> = diff
        .added
        .iter()
        .map(|m| (m.name.to_string(), m.action.to_string()))
        .collect();
    assert_eq!(added, [(late.clone(), "delete".to_owned())]);
    assert!(diff.removed.is_empty());

    let plan = w.dry_run(&net, true).unwrap();
    let op = w.delete_accepted(&net, true);
    w.run_until_quiet();
    let done: BTreeSet<(String, String)> = w
        .state
        .outcomes
        .iter()
        .filter(|((id, _), _)| *id == op.id)
        .filter_map(|((_, name), o)| match &o.action {
            OutcomeAction::Deleted => Some((name.to_string(), "delete".to_owned())),
            OutcomeAction::Unset { field, .. } => Some((name.to_string(), format!("unset {field}"))),
            _ => None,
        })
        .collect();
    let planned: BTreeSet<(String, String)> = plan
        .members()
        .iter()
        .map(|m| (m.name.to_string(), m.action.to_string()))
        .collect();
    assert_eq!(done, planned);
    w.check();
}

#[test]
fn deleting_a_security_group_unsets_it_from_port_lists_without_cascade() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let net = n("network", "net1");
    let sg1 = n("security_group", "sg1");
    let sg2 = n("security_group", "sg2");
    let pa = n("port", "pa");
    let pb = n("port", "pb");
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    w.create(&sg1, &[("project", &[&project])]);
    w.create(&sg2, &[("project", &[&project])]);
    w.create(&pa, &[("network", &[&net]), ("security_groups", &[&sg1, &sg2])]);
    w.create(&pb, &[("network", &[&net]), ("security_groups", &[&sg1])]);
    let pa_etag = w.get(&pa).unwrap().etag();

    let plan = w.dry_run(&sg1, false).unwrap();
    assert_eq!(plan.deleted.len(), 1);
    assert_eq!(plan.unset.len(), 2);

    let op = w.delete_accepted(&sg1, false);
    w.run_until_quiet();
    assert!(w.get(&sg1).is_none());
    let pa_now = w.active(&pa);
    assert_eq!(targets(&pa_now, "security_groups"), vec![sg2.clone()]);
    assert_ne!(pa_now.etag(), pa_etag, "the change moves the etag");
    let pb_now = w.active(&pb);
    assert!(!pb_now.refs.contains_key("security_groups"), "{:?}", pb_now.refs);
    w.active(&sg2);
    let op = w.op(op.id);
    assert_eq!(op.state, OperationState::Succeeded);
    assert_eq!((op.progress.deleted, op.progress.unset), (1, 2));
    for p in [&pa, &pb] {
        assert_eq!(
            w.outcome(op.id, p),
            Some(OutcomeAction::Unset {
                field: "security_groups".to_owned(),
                undo: None,
            })
        );
    }
    w.check();
}

#[test]
fn allow_dangling_reference_outlives_its_target() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let net = n("network", "net1");
    let qos = n("qos_policy", "q1");
    let port = n("port", "x");
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    let q = w.create(&qos, &[]);
    w.create(&port, &[("network", &[&net]), ("qos_policy", &[&qos])]);
    assert!(
        w.state.backrefs.keys().all(|k| k.target != q.uid),
        "no back-reference for allow_dangling"
    );
    let op = w.delete_accepted(&qos, false);
    w.run_until_quiet();
    assert!(w.get(&qos).is_none());
    let p = w.active(&port);
    assert_eq!(
        p.refs["qos_policy"][0].uid, q.uid,
        "the dangling reference is kept as it was"
    );
    assert_eq!(w.op(op.id).progress.unset, 0);
    // A re-created policy is a different incarnation.
    let q2 = w.create(&qos, &[]);
    assert_ne!(q2.uid, q.uid);
    w.check();
}

#[test]
fn list_owner_survives_until_its_last_element_goes() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let net = n("network", "net1");
    let p1 = n("port", "p1");
    let p2 = n("port", "p2");
    let group = n("port_group", "g");
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    w.create(&p1, &[("network", &[&net])]);
    w.create(&p2, &[("network", &[&net])]);
    w.create(&group, &[("ports", &[&p1, &p2])]);

    // The plan says the group only loses an element.
    let plan = w.dry_run(&p1, true).unwrap();
    assert_eq!(plan.deleted.len(), 1);
    assert_eq!(plan.unset.len(), 1);
    assert_eq!(plan.unset[0].resource.name.as_str(), group);
    assert_eq!(plan.unset[0].field, "ports");

    let op1 = w.delete_accepted(&p1, true);
    w.run_until_quiet();
    assert!(w.get(&p1).is_none());
    assert_eq!(targets(&w.active(&group), "ports"), vec![p2.clone()]);
    let o1 = w.op(op1.id);
    assert_eq!(
        (o1.state, o1.progress.deleted, o1.progress.unset),
        (OperationState::Succeeded, 1, 1)
    );
    w.check();

    let plan = w.dry_run(&p2, true).unwrap();
    let planned: BTreeSet<String> = plan.deleted.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(planned, BTreeSet::from([p2.clone(), group.clone()]));
    let op2 = w.delete_accepted(&p2, true);
    w.run_until_quiet();
    assert!(w.get(&p2).is_none());
    assert!(w.get(&group).is_none(), "the group goes with its last port");
    let o2 = w.op(op2.id);
    assert_eq!((o2.state, o2.progress.deleted), (OperationState::Succeeded, 2));
    // Nothing referenced the group, so it was purged in the step that
    // reached it; its PURGED event says why.
    match w.deletion_cause(&group) {
        Some(DeletionReason::Cascade { from, field }) => {
            assert_eq!((from.as_str(), field.as_str()), (p2.as_str(), "ports"))
        }
        other => panic!("expected a cascade from {p2}, got {other:?}"),
    }
    w.active(&net);
    w.check();
}

impl World {
    /// The message of the last DELETING event of `name`.
    /// Why `name` was last deleted, from its DELETING event (or the PURGED
    /// event of a resource that skipped DELETING).
    fn deletion_cause(&self, name: &str) -> Option<DeletionReason> {
        self.state
            .events
            .iter()
            .rev()
            .filter(|e| matches!(e.event_type, EventType::Deleting | EventType::Purged))
            .find(|e| e.resource.name.as_str() == name && e.cause.is_some())
            .and_then(|e| e.cause.clone())
    }
}

#[test]
fn list_owner_whose_elements_all_go_in_one_cascade_is_deleted() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let net = n("network", "net1");
    let other = n("network", "net2");
    let p1 = n("port", "p1");
    let p2 = n("port", "p2");
    let p3 = n("port", "p3");
    let g = n("port_group", "g");
    let keep = n("port_group", "keep");
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    w.create(&other, &[("project", &[&project])]);
    w.create(&p1, &[("network", &[&net])]);
    w.create(&p2, &[("network", &[&net])]);
    w.create(&p3, &[("network", &[&other])]);
    w.create(&g, &[("ports", &[&p1, &p2])]);
    w.create(&keep, &[("ports", &[&p1, &p3])]);
    let plan = w.dry_run(&net, true).unwrap();
    let planned: BTreeSet<String> = plan.deleted.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(
        planned,
        BTreeSet::from([net.clone(), p1.clone(), p2.clone(), g.clone()])
    );
    assert_eq!(plan.unset.len(), 1);
    assert_eq!(plan.unset[0].resource.name.as_str(), keep);

    let op = w.delete_accepted(&net, true);
    w.run_until_quiet();
    for gone in [&net, &p1, &p2, &g] {
        assert!(w.get(gone).is_none(), "{gone} survived");
    }
    assert_eq!(targets(&w.active(&keep), "ports"), vec![p3.clone()]);
    let op = w.op(op.id);
    assert_eq!((op.state, op.progress.deleted), (OperationState::Succeeded, 4));
    w.check();
}

#[test]

fn unset_counter_excludes_list_owners_deleted_by_the_same_operation() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let net = n("network", "net1");
    let p1 = n("port", "p1");
    let p2 = n("port", "p2");
    let g = n("port_group", "g");
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    w.create(&p1, &[("network", &[&net])]);
    w.create(&p2, &[("network", &[&net])]);
    w.create(&g, &[("ports", &[&p1, &p2])]);
    let plan = w.dry_run(&net, true).unwrap();
    assert!(plan.unset.is_empty(), "the plan has no survivor");
    let op = w.delete_accepted(&net, true);
    w.run_until_quiet();
    assert!(w.get(&g).is_none());
    // Progress::unset is "referrers that survived with a field cleared or a
    // list element removed": the group did not survive.
    assert_eq!(w.op(op.id).progress.unset, plan.unset.len() as u64);
    w.check();
}

#[test]
fn block_reference_refuses_user_delete_even_with_cascade() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let net = n("network", "ext");
    let subnet = n("subnet", "s1");
    let router = n("router", "gw");
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    w.create(&subnet, &[("network", &[&net])]);
    w.create(&router, &[("project", &[&project]), ("gateway_network", &[&net])]);
    let before = w.state.clone();
    let blocker = error::Dependent {
        referrer: rn(&router),
        field: "gateway_network".to_owned(),
        on_delete: OnDelete::Block,
    };
    for cascade in [true, false] {
        let err = w.delete(&net, cascade).unwrap_err();
        assert_eq!(err.code(), ErrorCode::FailedPrecondition);
        let CoreError::DeleteRefused {
            blockers, dependents, ..
        } = &err
        else {
            panic!("expected DeleteRefused, got {err:?}");
        };
        assert_eq!(blockers, &vec![blocker.clone()]);
        if cascade {
            assert!(dependents.is_empty(), "{dependents:?}");
        } else {
            assert_eq!(dependents.len(), 1);
            assert_eq!(dependents[0].referrer.as_str(), subnet);
        }
        assert!(err.to_string().contains("blocked by r1/router/gw"), "{err}");
        assert!(matches!(w.dry_run(&net, cascade), Err(CoreError::DeleteRefused { .. })));
    }
    assert_eq!(w.state, before);
    w.check();
}

/// Two projects; a router of p2 uses a network of p1 as its gateway.
fn blocked_cascade_world() -> (World, [String; 6]) {
    let mut w = World::neutron();
    let p1 = n("project", "p1");
    let p2 = n("project", "p2");
    let net = n("network", "net1");
    let subnet = n("subnet", "s1");
    let port = n("port", "x");
    let router = n("router", "r2");
    w.create(&p1, &[]);
    w.create(&p2, &[]);
    w.create(&net, &[("project", &[&p1])]);
    w.create(&subnet, &[("network", &[&net])]);
    w.create(&port, &[("network", &[&net]), ("subnet", &[&subnet])]);
    w.create(&router, &[("project", &[&p2]), ("gateway_network", &[&net])]);
    (w, [p1, p2, net, subnet, port, router])
}

#[test]
fn blocked_cascade_waits_for_a_blocker_from_another_project() {
    let (mut w, [p1, p2, net, subnet, port, router]) = blocked_cascade_world();
    let plan = w.dry_run(&p1, true).unwrap();
    assert_eq!(plan.blocked.len(), 1);
    assert_eq!(plan.blocked[0].resource.name.as_str(), net);
    assert_eq!(plan.blocked[0].blocker.referrer.as_str(), router);
    assert!(!plan.blocked[0].blocker.referrer_deleting);

    let op1 = w.delete_accepted(&p1, true);
    w.run_until_quiet();
    assert!(w.get(&subnet).is_none());
    assert!(w.get(&port).is_none());
    assert_eq!(w.get(&net).unwrap().state, ResourceState::Deleting);
    assert_eq!(w.get(&p1).unwrap().state, ResourceState::Deleting, "the root waits");
    let record = w.record(&net);
    assert_eq!(
        record.reason,
        DeletionReason::Cascade {
            from: rn(&p1),
            field: "project".to_owned()
        }
    );
    assert_eq!(record.operation, op1.id);
    let DeletionStatus::Blocked { blockers, reason } = &record.status else {
        panic!("expected Blocked, got {:?}", record.status);
    };
    assert_eq!(
        blockers,
        &vec![Blocker {
            referrer: rn(&router),
            field: "gateway_network".to_owned(),
            referrer_deleting: false,
        }]
    );
    assert!(reason.contains(&router) && reason.contains("stuck"), "{reason}");
    assert!(matches!(w.outcome(op1.id, &net), Some(OutcomeAction::Blocked { .. })));
    assert!(w
        .state
        .events
        .iter()
        .any(|e| e.event_type == EventType::DeletionBlocked && e.resource.name.as_str() == net));
    let o = w.op(op1.id);
    assert_eq!(o.state, OperationState::Running);
    assert_eq!((o.progress.pending, o.progress.blocked, o.progress.deleted), (2, 1, 2));
    w.check();

    // Deleting the blocker lets the whole first operation finish.
    let op2 = w.delete_accepted(&router, true);
    w.run_until_quiet();
    for gone in [&router, &net, &p1] {
        assert!(w.get(gone).is_none(), "{gone} survived");
    }
    w.active(&p2);
    let o1 = w.op(op1.id);
    assert_eq!(o1.state, OperationState::Succeeded);
    assert_eq!(
        (o1.progress.deleted, o1.progress.pending, o1.progress.blocked),
        (4, 0, 0)
    );
    let o2 = w.op(op2.id);
    assert_eq!((o2.state, o2.progress.deleted), (OperationState::Succeeded, 1));
    w.check();
}

#[test]
fn blocked_cascade_resumes_when_the_blocker_drops_its_reference() {
    let (mut w, [p1, p2, net, _, _, router]) = blocked_cascade_world();
    let op = w.delete_accepted(&p1, true);
    w.run_until_quiet();
    assert_eq!(w.op(op.id).state, OperationState::Running);
    w.try_update(spec(&router, &[("project", &[&p2])]), None).unwrap();
    w.run_until_quiet();
    assert!(w.get(&net).is_none());
    assert!(w.get(&p1).is_none());
    assert!(!w.active(&router).refs.contains_key("gateway_network"));
    assert_eq!(w.op(op.id).state, OperationState::Succeeded);
    w.check();
}

const CYCLE_SCHEMA: &str = r#"
[kinds.a.refs.b]
kind = "b"
on_delete = "cascade"

[kinds.b.refs.a]
kind = "a"
on_delete = "cascade"
"#;

#[test]
fn cascade_cycle_unwinds() {
    let mut w = World::new(CYCLE_SCHEMA);
    let a = n("a", "a1");
    let b = n("b", "b1");
    w.create(&a, &[]);
    w.create(&b, &[("a", &[&a])]);
    w.try_update(spec(&a, &[("b", &[&b])]), None).unwrap();
    w.check();
    assert!(matches!(w.delete(&a, false), Err(CoreError::DeleteRefused { .. })));
    let plan = w.dry_run(&a, true).unwrap();
    assert_eq!(plan.deleted.len(), 2);
    let op = w.delete_accepted(&a, true);
    w.run_until_quiet();
    assert!(w.get(&a).is_none());
    assert!(w.get(&b).is_none());
    let op = w.op(op.id);
    assert_eq!((op.state, op.progress.deleted), (OperationState::Succeeded, 2));
    assert!(w.state.backrefs.is_empty());
    w.check();
}

#[test]
fn cascade_self_reference_unwinds() {
    let mut w = World::new("[kinds.a.refs.me]\nkind = \"a\"\non_delete = \"cascade\"\n");
    let a = n("a", "a1");
    w.create(&a, &[]);
    w.try_update(spec(&a, &[("me", &[&a])]), None).unwrap();
    w.check();
    let op = w.delete_accepted(&a, true);
    w.run_until_quiet();
    assert!(w.get(&a).is_none());
    assert_eq!(w.op(op.id).state, OperationState::Succeeded);
    w.check();
}

#[test]
fn repeated_delete_answers_already_deleting_with_the_same_operation() {
    let Neutron { mut w, net, .. } = neutron_network();
    let op = w.delete_accepted(&net, true);
    let before = w.state.clone();
    for cascade in [true, false] {
        let step = protocol::delete(&w.state, ctx!(w), &mut w.ids, del(&net, cascade)).unwrap();
        assert!(step.writes.is_empty());
        match step.value {
            DeleteOutcome::AlreadyDeleting(again) => assert_eq!(again.id, op.id),
            other => panic!("expected AlreadyDeleting, got {other:?}"),
        }
    }
    assert_eq!(w.state, before);
    // A resource reached by the cascade answers with the same operation too
    // (port-0: the trunk references it, so it passes through DELETING).
    w.step();
    let port = n("port", "port-0");
    assert_eq!(w.get(&port).unwrap().state, ResourceState::Deleting);
    match w.delete(&port, false).unwrap() {
        DeleteOutcome::AlreadyDeleting(again) => assert_eq!(again.id, op.id),
        other => panic!("expected AlreadyDeleting, got {other:?}"),
    }
    // A dry run of a deleting resource answers the same way, writing nothing.
    let mut req = del(&net, true);
    req.dry_run = true;
    assert!(matches!(w.delete_req(req).unwrap(), DeleteOutcome::AlreadyDeleting(_)));
    w.run_until_quiet();
    w.check();
}

#[test]
fn create_and_update_under_a_deleting_parent_are_refused() {
    let Neutron {
        mut w,
        project,
        net,
        sg,
        ..
    } = neutron_network();
    let port0 = n("port", "port-0");
    let port_etag = w.get(&port0).unwrap().etag();
    w.delete_accepted(&net, true);
    let before = w.state.clone();

    let err = w.try_create(&n("port", "late"), &[("network", &[&net])]).unwrap_err();
    assert_eq!(
        err,
        CoreError::TargetDeleting {
            field: "refs.network".to_owned(),
            target: rn(&net)
        }
    );
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    // In a batch the field names the position; nothing of the batch is written.
    let err = w
        .try_create_all(vec![
            spec(&n("security_group", "ok"), &[("project", &[&project])]),
            spec(&n("subnet", "late"), &[("network", &[&net])]),
        ])
        .unwrap_err();
    assert!(
        matches!(&err, CoreError::TargetDeleting { field, .. } if field == "resources[1].refs.network"),
        "{err:?}"
    );
    // The name of a deleting resource is not free yet.
    let err = w.try_create(&net, &[("project", &[&project])]).unwrap_err();
    assert!(
        matches!(&err, CoreError::AlreadyExists { detail, .. } if detail.contains("being deleted")),
        "{err:?}"
    );
    // Updating a child before the work ran is refused: it still points at the deleting network.
    let mut s = spec(&port0, &[("network", &[&net]), ("security_groups", &[&sg])]);
    s.attributes.insert("mtu".to_owned(), "9000".to_owned());
    let err = w.try_update(s, Some(&port_etag)).unwrap_err();
    assert!(
        matches!(&err, CoreError::TargetDeleting { field, target } if field == "refs.network" && target.as_str() == net),
        "{err:?}"
    );
    // Updating the deleting resource itself is refused.
    let mut s = spec(&net, &[("project", &[&project])]);
    s.attributes.insert("x".to_owned(), "y".to_owned());
    let err = w.try_update(s, None).unwrap_err();
    assert_eq!(err, CoreError::Deleting { name: rn(&net) });
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert_eq!(w.state, before, "refused commands write nothing");
    w.run_until_quiet();
    w.check();
}

#[test]
fn recreate_after_purge_gets_a_new_uid_and_stale_uids_do_not_touch_it() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let net = n("network", "net1");
    let port = n("port", "x");
    w.create(&project, &[]);
    let old_net = w.create(&net, &[("project", &[&project])]);
    let old_port = w.create(&port, &[("network", &[&net])]);
    let op = w.delete_accepted(&net, true);
    let stale_work = w.state.work.get(&old_net.uid).cloned().expect("queued work");
    w.run_until_quiet();
    assert!(w.get(&net).is_none());
    assert!(w.get(&port).is_none());
    assert_eq!(w.op(op.id).state, OperationState::Succeeded);

    let new_net = w.create(&net, &[("project", &[&project])]);
    assert_ne!(new_net.uid, old_net.uid);
    let new_port = w.create(&port, &[("network", &[&net])]);
    assert_ne!(new_port.uid, old_port.uid);
    assert_eq!(new_port.refs["network"][0].uid, new_net.uid);
    for k in w.state.backrefs.keys() {
        for old in [old_net.uid, old_port.uid] {
            assert!(
                k.target != old && k.referrer != old,
                "back-reference with an old uid: {k:?}"
            );
        }
    }
    // A reference pinned to the old incarnation is refused.
    let mut s = spec(&n("port", "pinned"), &[]);
    s.refs.insert(
        "network".to_owned(),
        vec![RefRequest {
            name: net.clone(),
            uid: Some(old_net.uid),
        }],
    );
    let err = w.try_create_spec(s).unwrap_err();
    assert!(matches!(err, CoreError::TargetUidMismatch { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    // A delete pinned to the old uid does not reach the new one.
    let mut req = del(&net, true);
    req.uid = Some(old_net.uid);
    assert_eq!(w.delete_req(req.clone()).unwrap_err(), CoreError::NotFound(rn(&net)));
    req.allow_missing = true;
    assert_eq!(w.delete_req(req).unwrap(), DeleteOutcome::Missing);
    // A stale queue entry of the old incarnation is dropped without effect.
    let events = w.state.events.len();
    w.state.work.insert(old_net.uid, stale_work);
    let busy = w.run_until_quiet();
    assert!(busy >= 1);
    assert!(w.state.work.is_empty());
    assert_eq!(w.state.events.len(), events, "a stale entry emits nothing");
    assert_eq!(w.active(&net).uid, new_net.uid);
    assert_eq!(w.active(&port).uid, new_port.uid);
    w.check();
}

#[test]
fn delete_preconditions_missing_etag_and_uid() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let r = w.create(&project, &[]);
    let missing = n("project", "nope");

    let mut req = del(&missing, false);
    assert_eq!(
        w.delete_req(req.clone()).unwrap_err(),
        CoreError::NotFound(rn(&missing))
    );
    req.allow_missing = true;
    let step = protocol::delete(&w.state, ctx!(w), &mut w.ids, req).unwrap();
    assert_eq!(step.value, DeleteOutcome::Missing);
    assert!(step.writes.is_empty());

    let mut req = del(&project, false);
    req.etag = Some("999".to_owned());
    let err = w.delete_req(req.clone()).unwrap_err();
    assert_eq!(
        err,
        CoreError::EtagMismatch {
            name: rn(&project),
            expected: "999".to_owned(),
            actual: r.etag()
        }
    );
    assert_eq!(err.code(), ErrorCode::Aborted);

    let mut req = del(&project, false);
    req.uid = Some(Uid(uuid_like(42)));
    assert_eq!(w.delete_req(req).unwrap_err(), CoreError::NotFound(rn(&project)));
    w.active(&project);

    // An empty etag is no precondition; the right etag and uid are accepted.
    let mut req = del(&project, false);
    req.etag = Some(r.etag());
    req.uid = Some(r.uid);
    assert!(matches!(w.delete_req(req).unwrap(), DeleteOutcome::Accepted(_)));
    w.run_until_quiet();
    assert!(w.get(&project).is_none());
    let other = n("project", "p2");
    w.create(&other, &[]);
    let mut req = del(&other, false);
    req.etag = Some(String::new());
    assert!(matches!(w.delete_req(req).unwrap(), DeleteOutcome::Accepted(_)));
    w.run_until_quiet();
    w.check();
}

fn uuid_like(n: u8) -> uuid::Uuid {
    uuid::Uuid::from_bytes([n; 16])
}

#[test]
fn update_etag_mismatch_is_aborted() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let r = w.create(&project, &[]);
    let err = w.try_update(spec(&project, &[]), Some("12345")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Aborted);
    let updated = w.try_update(spec(&project, &[]), Some(&r.etag())).unwrap();
    assert_ne!(updated.etag(), r.etag());
    w.check();
}

#[test]
fn batching_spreads_a_large_cascade_over_several_steps() {
    let mut w = World::neutron().with_policy(|p| p.batch_budget = 3);
    let project = n("project", "p1");
    let net = n("network", "net1");
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    for i in 0..20 {
        w.create(&n("port", &format!("p{i}")), &[("network", &[&net])]);
    }
    let op = w.delete_accepted(&net, true);
    let mut busy = 0;
    for _ in 0..10_000 {
        let report = w.step();
        if report.items == 0 && !report.more {
            break;
        }
        assert!(
            report.cascaded + report.unset <= 3,
            "a step changed {} referrers with a budget of 3",
            report.cascaded + report.unset
        );
        busy += 1;
    }
    assert!(busy > 1, "expected several steps, got {busy}");
    assert!(
        busy >= 20 / 3,
        "20 cascades at 3 per step need at least 7 steps, got {busy}"
    );
    assert!(w.get(&net).is_none());
    for i in 0..20 {
        assert!(w.get(&n("port", &format!("p{i}"))).is_none());
    }
    let op = w.op(op.id);
    assert_eq!((op.state, op.progress.deleted), (OperationState::Succeeded, 21));
    w.active(&project);
    w.check();
}

#[test]
fn batching_by_queue_items_reports_more() {
    let mut w = World::neutron().with_policy(|p| p.batch_items = 2);
    let project = n("project", "p1");
    w.create(&project, &[]);
    for i in 0..6 {
        // A port each, so the networks pass through DELETING and the queue
        // (an unreferenced one would be purged in the project's step).
        let net = n("network", &format!("n{i}"));
        w.create(&net, &[("project", &[&project])]);
        w.create(&n("port", &format!("p{i}")), &[("network", &[&net])]);
    }
    let op = w.delete_accepted(&project, true);
    let first = w.step();
    assert_eq!(first.cascaded, 6);
    let second = w.step();
    assert!(second.more, "two of six due entries were taken: {second:?}");
    w.run_until_quiet();
    assert!(w.get(&project).is_none());
    assert_eq!(
        w.op(op.id).progress.deleted,
        13,
        "the project, six networks and their six ports"
    );
    w.check();
}

#[test]
fn retry_backoff_marks_a_stuck_deletion_failed() {
    let (w, [p1, _p2, net, subnet, port, router]) = blocked_cascade_world();
    let mut w = w.with_policy(|p| p.max_attempts = 2);
    let op = w.delete_accepted(&p1, true);
    let t0 = w.now;
    w.run_until_quiet();
    let work = w.state.work[&w.get(&net).unwrap().uid].clone();
    assert_eq!(work.attempts, 1);
    assert_eq!(work.next_attempt_at, t0.plus_millis(w.policy.backoff(1)));
    assert!(work.last_error.as_deref().is_some_and(|e| e.contains(&router)));

    // Nothing happens before the backoff expires.
    w.now = t0.plus_millis(w.policy.backoff(1) - 1);
    assert_eq!(w.run_until_quiet(), 0);

    assert_eq!(w.advance_to_next_due(), Some(t0.plus_millis(1_000)));
    w.run_until_quiet();
    let work = w.state.work[&w.get(&net).unwrap().uid].clone();
    assert_eq!(work.attempts, 2);
    assert_eq!(work.next_attempt_at, t0.plus_millis(1_000 + 2_000));
    assert!(matches!(w.record(&net).status, DeletionStatus::Blocked { .. }));
    assert_eq!(w.op(op.id).state, OperationState::Running);

    w.advance_to_next_due();
    w.run_until_quiet();
    let record = w.record(&net);
    let DeletionStatus::Failed { error } = &record.status else {
        panic!("expected Failed, got {:?}", record.status);
    };
    assert!(
        error.contains("gave up after 2 attempts") && error.contains(&router),
        "{error}"
    );
    assert!(!w.state.work.contains_key(&record.target.uid));
    assert!(w
        .state
        .events
        .iter()
        .any(|e| e.event_type == EventType::DeletionFailed && e.resource.name.as_str() == net));
    assert!(matches!(w.outcome(op.id, &net), Some(OutcomeAction::Failed { .. })));
    for gone in [&p1, &subnet, &port] {
        assert!(w.get(gone).is_none(), "{gone} survived");
    }
    let o = w.op(op.id);
    assert_eq!(o.state, OperationState::Failed);
    assert_eq!(
        (
            o.progress.failed,
            o.progress.pending,
            o.progress.blocked,
            o.progress.deleted
        ),
        (1, 0, 0, 3)
    );
    assert!(o.end_time.is_some());
    assert_eq!(w.advance_to_next_due(), None, "nothing is scheduled any more");
    w.check();

    // Removing the blocker later still lets the failed deletion finish.
    w.delete_accepted(&router, true);
    w.run_until_quiet();
    assert!(w.get(&net).is_none());
    let o = w.op(op.id);
    assert_eq!((o.progress.failed, o.progress.deleted), (0, 4));
    assert_eq!(o.state, OperationState::Succeeded);
    w.check();
}

#[test]
fn backoff_grows_exponentially_up_to_the_cap() {
    let p = Policy {
        backoff_base_ms: 100,
        backoff_cap_ms: 1_000,
        ..Policy::default()
    };
    assert_eq!(
        (1..=6).map(|a| p.backoff(a)).collect::<Vec<_>>(),
        vec![100, 200, 400, 800, 1_000, 1_000]
    );
    assert_eq!(p.backoff(u32::MAX), 1_000);
}

#[test]
fn finalizers_hold_the_purge_until_removed() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    let mut s = spec(&project, &[]);
    s.finalizers = vec!["dns".to_owned(), "billing".to_owned()];
    w.try_create_spec(s).unwrap();
    let op = w.delete_accepted(&project, false);
    w.run_until_quiet();
    let record = w.record(&project);
    let DeletionStatus::Blocked { blockers, reason } = &record.status else {
        panic!("expected Blocked, got {:?}", record.status);
    };
    assert!(blockers.is_empty());
    assert!(reason.contains("dns"), "{reason}");
    // Adding a finalizer while deleting is refused; removing one is allowed.
    let mut s = spec(&project, &[]);
    s.finalizers = vec!["dns".to_owned(), "billing".to_owned(), "new".to_owned()];
    assert_eq!(
        w.try_update(s, None).unwrap_err(),
        CoreError::Deleting { name: rn(&project) }
    );
    let mut s = spec(&project, &[]);
    s.finalizers = vec!["billing".to_owned()];
    w.try_update(s, None).unwrap();
    w.run_until_quiet();
    assert_eq!(w.get(&project).unwrap().state, ResourceState::Deleting);
    w.try_update(spec(&project, &[]), None).unwrap();
    w.run_until_quiet();
    assert!(w.get(&project).is_none());
    assert_eq!(w.op(op.id).state, OperationState::Succeeded);
    w.check();
}

#[test]

fn root_stays_until_its_closure_is_done_even_after_it_failed() {
    let (w, [p1, _p2, net, _, _, router]) = blocked_cascade_world();
    let mut w = w.with_policy(|p| p.max_attempts = 1);
    // Give the root p1 a finalizer (it has no references).
    let mut s = spec(&p1, &[]);
    s.finalizers = vec!["dns".to_owned()];
    w.try_update(s, None).unwrap();
    let t0 = w.now;
    let op = w.delete_accepted(&p1, true);
    // t0: p1 holds on its finalizer and cascades into net1.
    w.step();
    // t0 + 500: net1 walks its children and holds on the router (attempt 1).
    w.now = t0.plus_millis(500);
    w.run_until_quiet();
    assert!(matches!(w.record(&net).status, DeletionStatus::Blocked { .. }));
    // t0 + 1000: p1's finalizer controller fails (the maximum, 1); net1 is
    // still pending (due at t0 + 1500).
    w.now = t0.plus_millis(1_000);
    report_failure(&mut w, &p1, "dns", "zone locked").unwrap();
    w.run_until_quiet();
    assert!(matches!(w.record(&p1).status, DeletionStatus::Failed { .. }));
    assert!(matches!(w.record(&net).status, DeletionStatus::Blocked { .. }));
    assert_eq!(w.op(op.id).progress.pending, 1);
    // The finalizer is done: p1 must still wait for net1.
    w.try_update(spec(&p1, &[]), None).unwrap();
    w.run_until_quiet();
    assert!(w.get(&net).is_some());
    assert!(
        w.get(&p1).is_some(),
        "the root of a running operation was purged while {net} is still pending (blocked by {router})"
    );
    w.check();
}

#[test]

fn wakes_from_blockers_going_away_do_not_exhaust_the_attempts() {
    let mut w = World::neutron().with_policy(|p| {
        p.max_attempts = 3;
        p.batch_budget = 1;
    });
    let p1 = n("project", "p1");
    let net = n("network", "ext");
    let p2 = n("project", "p2");
    w.create(&p1, &[]);
    w.create(&net, &[("project", &[&p1])]);
    w.create(&p2, &[]);
    for i in 0..6 {
        w.create(
            &n("router", &format!("r{i}")),
            &[("project", &[&p2]), ("gateway_network", &[&net])],
        );
    }
    let op1 = w.delete_accepted(&p1, true);
    w.run_until_quiet();
    assert!(matches!(w.record(&net).status, DeletionStatus::Blocked { .. }));
    // The six blockers go, one per step, without the clock moving.
    let op2 = w.delete_accepted(&p2, true);
    w.run_until_quiet();
    assert!(w.get(&net).is_none());
    assert_eq!(w.op(op2.id).state, OperationState::Succeeded);
    let failed: Vec<&Event> = w
        .state
        .events
        .iter()
        .filter(|e| e.event_type == EventType::DeletionFailed)
        .collect();
    assert!(
        failed.is_empty(),
        "{net} was marked FAILED at the same instant it was blocked (no backoff elapsed): {:?}",
        failed.iter().map(|e| &e.message).collect::<Vec<_>>()
    );
    let o1 = w.op(op1.id);
    assert_eq!((o1.state, o1.progress.failed), (OperationState::Succeeded, 0));
    w.check();
}

#[test]
fn root_waiting_for_its_closure_is_not_reported_blocked() {
    let (mut w, [p1, _p2, net, _, _, router]) = blocked_cascade_world();
    let mut s = spec(&p1, &[]);
    s.finalizers = vec!["dns".to_owned()];
    w.try_update(s, None).unwrap();
    let op = w.delete_accepted(&p1, true);
    w.run_until_quiet();
    assert!(matches!(w.record(&p1).status, DeletionStatus::Blocked { .. }));
    assert!(matches!(w.record(&net).status, DeletionStatus::Blocked { .. }));
    assert_eq!(w.op(op.id).progress.blocked, 2);
    // The root's finalizer is done; it now only waits for net1 (held by the router).
    w.try_update(spec(&p1, &[]), None).unwrap();
    w.run_until_quiet();
    assert_eq!(w.get(&p1).unwrap().state, ResourceState::Deleting);
    let status = w.record(&p1).status;
    assert!(
        !matches!(&status, DeletionStatus::Blocked { reason, .. } if reason.contains("finalizers")),
        "stale status on the root: {status:?}"
    );
    assert_eq!(w.op(op.id).progress.blocked, 1, "only {net} is held (by {router})");
    w.check();
}

#[test]
fn error_codes_map_to_status_classes() {
    let mut w = World::neutron();
    let project = n("project", "p1");
    w.create(&project, &[]);

    let err = w.try_create("not a name", &[]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(
        matches!(&err, CoreError::InvalidArgument { field, .. } if field == "name"),
        "{err:?}"
    );

    let err = w
        .try_create_all(vec![spec(&n("project", "ok"), &[]), spec("r1/project/Bad", &[])])
        .unwrap_err();
    assert!(
        matches!(&err, CoreError::InvalidArgument { field, .. } if field == "resources[1].name"),
        "{err:?}"
    );
    assert!(w.get(&n("project", "ok")).is_none(), "a refused batch writes nothing");

    let err = w
        .try_create(&n("network", "x"), &[("project", &["garbage"])])
        .unwrap_err();
    assert!(
        matches!(&err, CoreError::InvalidArgument { field, .. } if field == "refs.project"),
        "{err:?}"
    );
    let err = w.try_create(&n("network", "x"), &[]).unwrap_err();
    assert!(
        matches!(&err, CoreError::InvalidArgument { field, message } if field == "refs.project" && message.contains("required")),
        "{err:?}"
    );
    let err = w
        .try_create(&n("network", "x"), &[("project", &[&project]), ("colour", &[&project])])
        .unwrap_err();
    assert!(
        matches!(&err, CoreError::InvalidArgument { field, .. } if field == "refs.colour"),
        "{err:?}"
    );
    let err = w
        .try_create(&n("network", "x"), &[("project", &[&n("qos_policy", "q")])])
        .unwrap_err();
    assert!(
        matches!(&err, CoreError::InvalidArgument { message, .. } if message.contains("must reference a project")),
        "{err:?}"
    );
    let err = w.try_create(&n("gizmo", "x"), &[]).unwrap_err();
    assert!(
        matches!(&err, CoreError::InvalidArgument { field, .. } if field == "name"),
        "{err:?}"
    );
    let err = w.try_create("r2/project/x", &[]).unwrap_err();
    assert!(matches!(err, CoreError::WrongRegion { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = w
        .try_create(&n("network", "x"), &[("project", &["r2/project/p"])])
        .unwrap_err();
    // A cross-region target must reach the core resolved (with its uid) by the node.
    assert!(matches!(err, CoreError::RemoteReference { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::Internal);
    let mut s = spec(&n("project", "attrs"), &[]);
    s.attributes.insert(String::new(), "v".to_owned());
    let err = w.try_create_spec(s).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);

    let err = w.delete("nope", false).unwrap_err();
    assert!(
        matches!(&err, CoreError::InvalidArgument { field, .. } if field == "name"),
        "{err:?}"
    );

    let err = w
        .try_create(&n("network", "x"), &[("project", &[&n("project", "ghost")])])
        .unwrap_err();
    assert_eq!(
        err,
        CoreError::TargetNotFound {
            field: "refs.project".to_owned(),
            target: rn(&n("project", "ghost"))
        }
    );
    assert_eq!(err.code(), ErrorCode::NotFound);
    let err = w.delete(&n("project", "ghost"), false).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    let err = w.try_update(spec(&n("project", "ghost"), &[]), None).unwrap_err();
    assert_eq!(err, CoreError::NotFound(rn(&n("project", "ghost"))));
    assert_eq!(CoreError::OperationNotFound("x".to_owned()).code(), ErrorCode::NotFound);

    let err = w.try_create(&project, &[]).unwrap_err();
    assert!(matches!(&err, CoreError::AlreadyExists { detail: "", .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::AlreadyExists);

    w.create(&n("network", "x"), &[("project", &[&project])]);
    let err = w.delete(&project, false).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);

    let mut req = del(&project, true);
    req.etag = Some("0".to_owned());
    assert_eq!(w.delete_req(req).unwrap_err().code(), ErrorCode::Aborted);
    assert_eq!(
        CoreError::Storage(error::StorageError("disk".to_owned())).code(),
        ErrorCode::Unavailable
    );
    w.check();
}

// ---------------------------------------------------------------------------
// Property: random forests and random deletes keep every invariant.

const PROP_SCHEMA: &str = r#"
[kinds.root]
[kinds.tag]

[kinds.mid.refs.parent]
kind = "root"
on_delete = "cascade"
required = true
[kinds.mid.refs.tags]
kind = "tag"
on_delete = "unset"
many = true

[kinds.leaf.refs.mid]
kind = "mid"
on_delete = "cascade"
required = true
[kinds.leaf.refs.tag]
kind = "tag"
on_delete = "unset"
[kinds.leaf.refs.note]
kind = "tag"
on_delete = "allow_dangling"

[kinds.lock.refs.mid]
kind = "mid"
on_delete = "block"
required = true
[kinds.lock.refs.owner]
kind = "root"
on_delete = "cascade"

[kinds.group.refs.leaves]
kind = "leaf"
on_delete = "cascade"
many = true
required = true
"#;

const PROP_KINDS: [&str; 6] = ["root", "tag", "mid", "leaf", "lock", "group"];
/// Deletes favour the kinds with the largest closures.
const DELETE_KINDS: [&str; 8] = ["root", "root", "mid", "mid", "tag", "leaf", "lock", "group"];

#[derive(Debug, Clone)]
enum Cmd {
    Create {
        kind: usize,
        id: u8,
        picks: [u8; 4],
        set: [bool; 3],
    },
    Update {
        pick: u8,
        picks: [u8; 4],
        set: [bool; 3],
    },
    /// Deletes a resource of `DELETE_KINDS[kind]` (any kind when there is none).
    Delete {
        kind: usize,
        pick: u8,
        cascade: bool,
    },
    /// Move the clock to the next scheduled retry.
    Tick,
    /// The external cleanup of a deleting resource reports done.
    Finish {
        pick: u8,
    },
}

fn create_cmd() -> impl Strategy<Value = Cmd> {
    (0..PROP_KINDS.len(), 0u8..6, any::<[u8; 4]>(), any::<[bool; 3]>()).prop_map(|(kind, id, picks, set)| Cmd::Create {
        kind,
        id,
        picks,
        set,
    })
}

fn cmd() -> impl Strategy<Value = Cmd> {
    prop_oneof![
        4 => create_cmd(),
        1 => (any::<u8>(), any::<[u8; 4]>(), any::<[bool; 3]>())
            .prop_map(|(pick, picks, set)| Cmd::Update { pick, picks, set }),
        3 => (0..DELETE_KINDS.len(), any::<u8>(), any::<bool>())
            .prop_map(|(kind, pick, cascade)| Cmd::Delete { kind, pick, cascade }),
        1 => Just(Cmd::Tick),
        1 => any::<u8>().prop_map(|pick| Cmd::Finish { pick }),
    ]
}

/// A forest first, then a random mix of commands.
fn script() -> impl Strategy<Value = Vec<Cmd>> {
    (
        prop::collection::vec(create_cmd(), 10..40),
        prop::collection::vec(cmd(), 1..50),
    )
        .prop_map(|(mut forest, rest)| {
            forest.extend(rest);
            forest
        })
}

/// References for a resource of `kind`, chosen among ACTIVE targets; None
/// when a required one has no candidate.
fn pick_refs(w: &World, kind: &str, picks: [u8; 4], set: [bool; 3]) -> Option<Vec<(String, Vec<String>)>> {
    let mut out = Vec::new();
    let spec = w.schema.kind(kind).unwrap();
    for (i, (field, r)) in spec.refs.iter().enumerate() {
        if !r.required && !set[i % 3] {
            continue;
        }
        let candidates: Vec<String> = w
            .state
            .resources
            .values()
            .filter(|c| c.kind() == r.kind && c.state == ResourceState::Active)
            .map(|c| c.name.to_string())
            .collect();
        if candidates.is_empty() {
            if r.required {
                return None;
            }
            continue;
        }
        let first = picks[i % 4] as usize % candidates.len();
        let mut chosen = vec![candidates[first].clone()];
        let second = picks[(i + 1) % 4] as usize % candidates.len();
        if r.many && second != first {
            chosen.push(candidates[second].clone());
        }
        out.push((field.clone(), chosen));
    }
    Some(out)
}

/// Runs a script; with `finalizers`, a quarter of the creates carry one.
fn prop_run(cmds: Vec<Cmd>, batch_budget: usize, batch_items: usize, finalizers: bool) {
    let mut w = World::new(PROP_SCHEMA).with_policy(|p| {
        p.batch_budget = batch_budget;
        p.batch_items = batch_items;
        p.max_attempts = 2;
    });
    for cmd in cmds {
        match cmd {
            Cmd::Create { kind, id, picks, set } => {
                let kind = PROP_KINDS[kind];
                let Some(refs) = pick_refs(&w, kind, picks, set) else {
                    continue;
                };
                let name = n(kind, &format!("x{id}"));
                let mut s = spec_owned(&name, refs);
                if finalizers && picks[3] % 4 == 0 {
                    s.finalizers = vec!["cleanup".to_owned()];
                }
                match w.try_create_spec(s) {
                    Ok(_) | Err(CoreError::AlreadyExists { .. }) => {}
                    Err(e) => panic!("create {name}: {e}"),
                }
            }
            Cmd::Update { pick, picks, set } => {
                let active: Vec<Resource> = w
                    .state
                    .resources
                    .values()
                    .filter(|r| r.state == ResourceState::Active)
                    .cloned()
                    .collect();
                if active.is_empty() {
                    continue;
                }
                let r = &active[pick as usize % active.len()];
                let Some(refs) = pick_refs(&w, r.kind(), picks, set) else {
                    continue;
                };
                w.try_update(spec_owned(r.name.as_str(), refs), Some(&r.etag()))
                    .unwrap_or_else(|e| panic!("update {}: {e}", r.name));
                w.run_until_quiet();
            }
            Cmd::Delete { kind, pick, cascade } => {
                let mut all: Vec<Resource> = w.state.resources.values().cloned().collect();
                if all.iter().any(|r| r.kind() == DELETE_KINDS[kind]) {
                    all.retain(|r| r.kind() == DELETE_KINDS[kind]);
                }
                if all.is_empty() {
                    continue;
                }
                let r = all[pick as usize % all.len()].clone();
                let name = r.name.to_string();
                if r.state == ResourceState::Deleting {
                    let record = w.record(&name);
                    match w.delete(&name, cascade) {
                        Ok(DeleteOutcome::AlreadyDeleting(op)) => {
                            assert_eq!(op.id, record.operation)
                        }
                        other => panic!("delete of deleting {name}: {other:?}"),
                    }
                    continue;
                }
                let before = w.state.clone();
                let planned = w.dry_run(&name, cascade);
                assert_eq!(w.state, before);
                let outcome = w.delete(&name, cascade);
                let plan = match (planned, outcome) {
                    (Err(a), Err(b)) => {
                        assert_eq!(a, b, "dry run and delete disagree");
                        assert!(matches!(a, CoreError::DeleteRefused { .. }), "{a:?}");
                        assert_eq!(w.state, before);
                        continue;
                    }
                    (Ok(plan), Ok(DeleteOutcome::Accepted(_))) => plan,
                    (p, o) => panic!("dry run {p:?} but delete {o:?}"),
                };
                assert!(!plan.truncated);
                w.run_until_quiet();
                // No over-deletion, nothing planned left live, unset referrers survive.
                let planned: BTreeSet<Uid> = plan.deleted.iter().map(|t| t.uid).collect();
                let alive = |uid: Uid| {
                    w.state
                        .uid_index
                        .get(&uid)
                        .and_then(|n| w.state.resources.get(n))
                        .filter(|r| r.uid == uid && r.state == ResourceState::Active)
                        .is_some()
                };
                for old in before.resources.values().filter(|r| r.state == ResourceState::Active) {
                    if !alive(old.uid) {
                        assert!(planned.contains(&old.uid), "{} deleted but not planned", old.name);
                    }
                }
                for t in &plan.deleted {
                    assert!(!alive(t.uid), "{} planned but still ACTIVE", t.name);
                }
                for u in &plan.unset {
                    assert!(
                        alive(u.resource.uid),
                        "{} planned to survive, but is gone",
                        u.resource.name
                    );
                }
            }
            Cmd::Finish { pick } => {
                let held: Vec<Resource> = w
                    .state
                    .resources
                    .values()
                    .filter(|r| r.state == ResourceState::Deleting && !r.finalizers.is_empty())
                    .cloned()
                    .collect();
                if held.is_empty() {
                    continue;
                }
                let r = &held[pick as usize % held.len()];
                let mut s = spec_owned(
                    r.name.as_str(),
                    r.refs
                        .iter()
                        .map(|(f, ts)| (f.clone(), ts.iter().map(|t| t.name.to_string()).collect()))
                        .collect(),
                );
                s.attributes = r.attributes.clone();
                w.try_update(s, Some(&r.etag()))
                    .unwrap_or_else(|e| panic!("finish {}: {e}", r.name));
                w.run_until_quiet();
            }
            Cmd::Tick => {
                if w.advance_to_next_due().is_some() {
                    w.run_until_quiet();
                }
            }
        }
        w.check();
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases_or(64),
        // Keep the tree clean: no regression files next to the test.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_forests_and_deletes_keep_the_invariants(
        cmds in script(),
        batch_budget in 1usize..6,
        batch_items in 1usize..6,
    ) {
        prop_run(cmds, batch_budget, batch_items, false);
    }

    #[test]

    fn random_forests_with_finalizers_keep_the_invariants(
        cmds in script(),
        batch_budget in 1usize..6,
        batch_items in 1usize..6,
    ) {
        prop_run(cmds, batch_budget, batch_items, true);
    }
}

/// Cases per property: `PROPTEST_CASES` for a deeper run, else the default.
fn cases_or(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------
// Liens and orphan deletes
// ---------------------------------------------------------------------------

fn add_lien(w: &mut World, name: &str, id: &str) -> Result<Resource, CoreError> {
    let req = protocol::AddLien {
        name: name.to_owned(),
        id: id.to_owned(),
        reason: format!("{id} reason"),
        requested_by: "tester".to_owned(),
        etag: None,
    };
    let step = protocol::add_lien(&w.state, ctx!(w), req)?;
    w.state.apply(step.writes);
    Ok(step.value)
}

fn remove_lien(w: &mut World, name: &str, id: &str) -> Result<Resource, CoreError> {
    let step = protocol::remove_lien(&w.state, ctx!(w), name, id, None)?;
    w.state.apply(step.writes);
    Ok(step.value)
}

/// An unreferenced leaf skips DELETING (`purge_leaf`): a lien must stop
/// that shortcut too, or the cascade would purge what the lien protects.
#[test]
fn a_lien_holds_an_unreferenced_leaf_that_a_cascade_would_purge_at_once() {
    let mut w = World::neutron();
    let project = n("project", "p");
    let net = n("network", "net");
    let (free, held) = (n("port", "free"), n("port", "held"));
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    w.create(&free, &[("network", &[&net])]);
    w.create(&held, &[("network", &[&net])]);
    add_lien(&mut w, &held, "in-use").unwrap();
    let before = w.state.clone();
    let err = w.delete(&held, false).unwrap_err();
    assert!(
        matches!(&err, CoreError::Liened { liens, .. } if liens[0].id == "in-use"),
        "{err:?}"
    );
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(matches!(w.dry_run(&held, false), Err(CoreError::Liened { .. })));
    assert_eq!(w.state, before, "a refused delete writes nothing");

    let op = w.delete_accepted(&net, true);
    w.run_until_quiet();
    assert!(w.get(&free).is_none(), "the leaf without a lien is purged");
    let r = w.get(&held).expect("the leaf with a lien stays");
    assert_eq!(r.state, ResourceState::Deleting);
    let DeletionStatus::Blocked { reason, blockers } = w.record(&held).status else {
        panic!("expected BLOCKED: {:?}", w.record(&held));
    };
    assert!(blockers.is_empty());
    assert_eq!(reason, "held by lien in-use (in-use reason)");
    assert!(matches!(w.outcome(op.id, &held), Some(OutcomeAction::Blocked { .. })));
    assert_eq!(w.op(op.id).state, OperationState::Running);
    w.check();

    remove_lien(&mut w, &held, "in-use").unwrap();
    w.run_until_quiet();
    assert!(w.get(&held).is_none() && w.get(&net).is_none());
    assert_eq!(w.op(op.id).state, OperationState::Succeeded);
    assert_eq!(
        remove_lien(&mut w, &held, "in-use").unwrap_err().code(),
        ErrorCode::NotFound,
        "the resource is gone"
    );
    w.check();
}

#[test]
fn orphan_delete_clears_required_and_list_references_and_deletes_only_the_root() {
    let mut w = World::neutron();
    let project = n("project", "p");
    let net = n("network", "net");
    let subnet = n("subnet", "s");
    let port = n("port", "x");
    let group = n("port_group", "g");
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    w.create(&subnet, &[("network", &[&net])]);
    w.create(&port, &[("network", &[&net]), ("subnet", &[&subnet])]);
    w.create(&group, &[("ports", &[&port])]);
    let orphan = |dry_run| DeleteRequest {
        orphan: true,
        dry_run,
        ..del(&net, false)
    };
    let DeleteOutcome::DryRun(plan) = w.delete_req(orphan(true)).unwrap() else {
        panic!("dry run");
    };
    assert_eq!(
        plan.deleted.iter().map(|t| t.name.to_string()).collect::<Vec<_>>(),
        std::slice::from_ref(&net)
    );
    let mut unset: Vec<String> = plan.unset.iter().map(|u| u.resource.name.to_string()).collect();
    unset.sort();
    assert_eq!(unset, [port.clone(), subnet.clone()]);
    let err = w
        .delete_req(DeleteRequest {
            cascade: true,
            ..orphan(false)
        })
        .unwrap_err();
    assert!(
        matches!(&err, CoreError::InvalidArgument { field, .. } if field == "propagation"),
        "{err:?}"
    );

    let DeleteOutcome::Accepted(op) = w.delete_req(orphan(false)).unwrap() else {
        panic!("accepted");
    };
    assert!(!op.cascade);
    w.run_until_quiet();
    assert!(w.get(&net).is_none());
    assert!(
        targets(&w.active(&subnet), "network").is_empty(),
        "a required reference is cleared too"
    );
    assert!(targets(&w.active(&port), "network").is_empty());
    assert_eq!(targets(&w.active(&port), "subnet"), std::slice::from_ref(&subnet));
    assert_eq!(targets(&w.active(&group), "ports"), std::slice::from_ref(&port));
    let done = w.op(op.id);
    assert_eq!(done.state, OperationState::Succeeded);
    assert_eq!((done.progress.deleted, done.progress.unset), (1, 2));
    assert!(matches!(w.outcome(op.id, &subnet), Some(OutcomeAction::Unset { field, .. }) if field == "network"));
    // The required field must be set again by the next update.
    let err = w.try_update(spec(&subnet, &[]), None).unwrap_err();
    assert!(
        matches!(&err, CoreError::InvalidArgument { field, .. } if field == "refs.network"),
        "{err:?}"
    );
    // The core's checker, not `check_invariants`: an orphan delete empties
    // required references on purpose.
    let report = invariants::check_quiescent(&[RegionView::from_state(&w.region, &w.state)], Some(&w.schema));
    assert!(report.is_clean(), "invariants broken:\n{}", report.lines());
}

// ---------------------------------------------------------------------------
// Finalizer controllers
// ---------------------------------------------------------------------------

fn report(name: &str, finalizer: &str, reason: &str) -> protocol::FinalizerReport {
    protocol::FinalizerReport {
        name: name.to_owned(),
        uid: None,
        finalizer: finalizer.to_owned(),
        reason: reason.to_owned(),
    }
}

fn report_failure(w: &mut World, name: &str, finalizer: &str, reason: &str) -> Result<Resource, CoreError> {
    let step = protocol::report_finalizer_failure(&w.state, ctx!(w), report(name, finalizer, reason))?;
    w.state.apply(step.writes);
    Ok(step.value)
}

fn remove_finalizer(w: &mut World, name: &str, finalizer: &str) -> Result<Resource, CoreError> {
    let step = protocol::remove_finalizer(&w.state, ctx!(w), report(name, finalizer, ""))?;
    w.state.apply(step.writes);
    Ok(step.value)
}

/// The `FinalizerRetry` events so far, as (time, message).
fn retries(w: &World) -> Vec<(Timestamp, String)> {
    w.state
        .events
        .iter()
        .filter(|e| e.event_type == EventType::FinalizerRetry)
        .map(|e| (e.time, e.message.clone()))
        .collect()
}

fn with_finalizer_world(max_attempts: u32) -> (World, String) {
    let mut w = World::neutron().with_policy(|p| {
        p.backoff_base_ms = 100;
        p.backoff_cap_ms = 10_000;
        p.max_attempts = max_attempts;
    });
    let project = n("project", "p1");
    let mut s = spec(&project, &[]);
    s.finalizers = vec!["dns".to_owned()];
    w.try_create_spec(s).unwrap();
    (w, project)
}

/// Seed 004's failing external deletion: the controller fails three times,
/// is asked again after each backoff (100, 200, 400 ms: not before), then
/// succeeds, and the deletion finishes.
#[test]
fn a_finalizer_that_fails_three_times_is_asked_again_after_each_backoff_then_finishes() {
    let (mut w, project) = with_finalizer_world(5);
    let op = w.delete_accepted(&project, false);
    w.run_until_quiet();
    let mut asked_at = Vec::new();
    for (attempt, backoff) in [(1u32, 100u64), (2, 200), (3, 400)] {
        let failed_at = w.now;
        report_failure(&mut w, &project, "dns", &format!("timeout {attempt}")).unwrap();
        let DeletionStatus::Blocked { reason, .. } = w.record(&project).status else {
            panic!("a failing finalizer holds the deletion BLOCKED");
        };
        assert!(
            reason.contains(&format!("dns (failed {attempt} time(s), last: timeout {attempt})")),
            "{reason}"
        );
        // Not asked again before the backoff has elapsed ...
        w.now = failed_at.plus_millis(backoff - 1);
        w.run_until_quiet();
        assert_eq!(retries(&w).len(), asked_at.len(), "asked again too early");
        // ... and asked again once it has.
        assert_eq!(w.advance_to_next_due(), Some(failed_at.plus_millis(backoff)));
        w.run_until_quiet();
        let all = retries(&w);
        assert_eq!(all.len(), asked_at.len() + 1, "asked again once per failure");
        let (time, message) = all.last().unwrap().clone();
        assert_eq!(time, failed_at.plus_millis(backoff));
        assert!(
            message.contains(&format!("attempt {} of 5", attempt + 1)) && message.contains("timeout"),
            "{message}"
        );
        asked_at.push(time);
    }
    let record = w.record(&project);
    assert_eq!(record.finalizer_failures[0].failures, 3);
    remove_finalizer(&mut w, &project, "dns").unwrap();
    w.run_until_quiet();
    assert!(w.get(&project).is_none(), "purged once the controller succeeded");
    assert_eq!(w.op(op.id).state, OperationState::Succeeded);
    w.check();
}

/// A controller that always fails: FAILED after the maximum, with a
/// DELETION_FAILED event carrying its last reason; a later RemoveFinalizer
/// still finishes the deletion.
#[test]
fn a_finalizer_that_always_fails_ends_failed_with_its_last_reason_and_a_removal_still_finishes_it() {
    let (mut w, project) = with_finalizer_world(3);
    let op = w.delete_accepted(&project, false);
    w.run_until_quiet();
    for attempt in 1..=3 {
        report_failure(&mut w, &project, "dns", &format!("zone locked {attempt}")).unwrap();
        w.advance_to_next_due();
        w.run_until_quiet();
    }
    let DeletionStatus::Failed { error } = w.record(&project).status else {
        panic!("FAILED after three failures: {:?}", w.record(&project).status);
    };
    assert!(
        error.contains("zone locked 3") && error.contains("failed 3 times"),
        "{error}"
    );
    let failed: Vec<&Event> = w
        .state
        .events
        .iter()
        .filter(|e| e.event_type == EventType::DeletionFailed)
        .collect();
    assert_eq!(failed.len(), 1);
    assert!(failed[0].message.contains("zone locked 3"));
    assert_eq!(
        retries(&w).len(),
        2,
        "asked again after failures 1 and 2, not after the last"
    );
    assert_eq!(w.op(op.id).progress.failed, 1);
    // A report about a failed deletion only updates what it shows.
    report_failure(&mut w, &project, "dns", "still locked").unwrap();
    assert!(matches!(w.record(&project).status, DeletionStatus::Failed { .. }));
    remove_finalizer(&mut w, &project, "dns").unwrap();
    w.run_until_quiet();
    assert!(w.get(&project).is_none());
    let o = w.op(op.id);
    assert_eq!(
        (o.state, o.progress.failed, o.progress.deleted),
        (OperationState::Succeeded, 0, 1)
    );
    w.check();
}

/// Waiting is not failing: a finalizer nobody reported a failure for holds
/// its deletion however often the engine looks, and is never given up.
#[test]
fn a_finalizer_nobody_reports_on_is_waited_for_not_given_up() {
    let (mut w, project) = with_finalizer_world(1);
    w.delete_accepted(&project, false);
    for _ in 0..5 {
        w.run_until_quiet();
        w.advance_to_next_due();
    }
    w.run_until_quiet();
    let DeletionStatus::Blocked { reason, .. } = w.record(&project).status else {
        panic!("still waiting: {:?}", w.record(&project).status);
    };
    assert_eq!(reason, "waiting for finalizers: dns");
    assert!(retries(&w).is_empty());
    w.check();
}

#[test]
fn finalizer_reports_are_checked_and_a_repeated_removal_changes_nothing() {
    let (mut w, project) = with_finalizer_world(3);
    let err = report_failure(&mut w, &project, "dns", "early").unwrap_err();
    assert!(matches!(err, CoreError::NoSuchDeletion { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    w.delete_accepted(&project, false);
    w.run_until_quiet();
    let err = report_failure(&mut w, &project, "billing", "x").unwrap_err();
    assert!(matches!(&err, CoreError::FinalizerNotFound { finalizer, .. } if finalizer == "billing"));
    assert_eq!(err.code(), ErrorCode::NotFound);
    let err = report_failure(&mut w, &project, "dns", " ").unwrap_err();
    assert!(matches!(&err, CoreError::InvalidArgument { field, .. } if field == "reason"));
    let mut other_incarnation = report(&project, "dns", "x");
    other_incarnation.uid = Some(Uid(uuid::Uuid::from_u128(7)));
    let err = protocol::report_finalizer_failure(&w.state, ctx!(w), other_incarnation).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    // Removing a finalizer twice: the second answers the resource, writing nothing.
    let step = protocol::remove_finalizer(&w.state, ctx!(w), report(&project, "dns", "")).unwrap();
    w.state.apply(step.writes);
    let again = protocol::remove_finalizer(&w.state, ctx!(w), report(&project, "dns", "")).unwrap();
    assert!(again.writes.is_empty());
    w.run_until_quiet();
    assert!(w.get(&project).is_none());
    w.check();
}

fn admin_request(who: &str, reason: &str) -> protocol::AdminRequest {
    protocol::AdminRequest {
        who: who.to_owned(),
        action: "RetryDeletion".to_owned(),
        target: String::new(),
        reason: reason.to_owned(),
    }
}

/// RetryDeletion: only a FAILED deletion; it is PENDING again from zero,
/// its operation runs again, its controllers are asked again, and the
/// step writes its audit entry.
#[test]
fn a_retried_deletion_starts_from_zero_and_is_audited_in_the_same_step() {
    let (mut w, project) = with_finalizer_world(2);
    let op = w.delete_accepted(&project, false);
    w.run_until_quiet();
    let err =
        protocol::retry_deletion(&w.state, ctx!(w), &mut w.ids, &project, admin_request("ops", "early")).unwrap_err();
    assert!(
        matches!(&err, CoreError::NoSuchDeletion { why, .. } if why.contains("BLOCKED")),
        "{err:?}"
    );
    for i in 1..=2 {
        report_failure(&mut w, &project, "dns", &format!("down {i}")).unwrap();
    }
    w.run_until_quiet();
    assert!(matches!(w.record(&project).status, DeletionStatus::Failed { .. }));
    assert_eq!(w.op(op.id).state, OperationState::Failed);
    let step = protocol::retry_deletion(
        &w.state,
        ctx!(w),
        &mut w.ids,
        &project,
        admin_request("ops", "dns is back"),
    )
    .unwrap();
    assert_eq!(
        step.writes.audit.len(),
        1,
        "the action and its audit entry commit together"
    );
    assert_eq!(
        (
            step.writes.audit[0].who.as_str(),
            step.writes.audit[0].reason.as_str(),
            step.writes.audit[0].outcome.as_str()
        ),
        ("ops", "dns is back", "ok")
    );
    w.state.apply(step.writes);
    let record = w.record(&project);
    assert_eq!(record.status, DeletionStatus::Pending);
    assert!(record.finalizer_failures.is_empty());
    let o = w.op(op.id);
    assert_eq!(
        (o.state, o.progress.failed, o.progress.pending),
        (OperationState::Running, 0, 1)
    );
    assert!(retries(&w).last().unwrap().1.contains("retried by ops"));
    // From zero: the maximum (2) takes two failures again.
    report_failure(&mut w, &project, "dns", "down again").unwrap();
    assert!(matches!(w.record(&project).status, DeletionStatus::Blocked { .. }));
    remove_finalizer(&mut w, &project, "dns").unwrap();
    w.run_until_quiet();
    assert!(w.get(&project).is_none());
    assert_eq!(w.op(op.id).state, OperationState::Succeeded);
    w.check();
}

fn force(w: &mut World, name: &str, reason: &str, min_age_ms: u64, force: bool) -> Result<Resource, CoreError> {
    let req = protocol::AdminRequest {
        who: "ops".to_owned(),
        action: "ForcePurge".to_owned(),
        target: name.to_owned(),
        reason: reason.to_owned(),
    };
    let step = protocol::force_purge(&w.state, ctx!(w), &mut w.ids, name, req, min_age_ms, force)?;
    assert_eq!(step.writes.audit.len(), 1, "a force purge is audited in its own step");
    w.state.apply(step.writes);
    Ok(step.value.0)
}

/// ForcePurge of a deletion held by a live `block` referrer, a finalizer
/// and a lien, after it FAILED: the blocker loses its reference (and
/// survives), the finalizer and the lien are dropped, the resource is
/// purged, the operation succeeds, and the checker finds nothing.
#[test]
fn a_forced_deletion_unsets_its_blockers_drops_its_finalizers_and_liens_and_is_purged() {
    let (w, [p1, _p2, net, _subnet, _port, router]) = blocked_cascade_world();
    let mut w = w.with_policy(|p| {
        p.max_attempts = 2;
        p.backoff_base_ms = 10;
    });
    let mut s = spec(&net, &[("project", &[&p1])]);
    s.finalizers = vec!["dns".to_owned()];
    w.try_update(s, None).unwrap();
    add_lien(&mut w, &net, "hold").unwrap();
    let op = w.delete_accepted(&p1, true);
    for _ in 0..4 {
        w.run_until_quiet();
        w.advance_to_next_due();
    }
    w.run_until_quiet();
    assert!(matches!(w.record(&net).status, DeletionStatus::Failed { .. }));
    // Refused: no reason; too young without force; not a deletion.
    assert!(
        matches!(force(&mut w, &net, " ", 0, false), Err(CoreError::InvalidArgument { field, .. }) if field == "reason")
    );
    let err = force(&mut w, &net, "stuck", 3_600_000, false).unwrap_err();
    assert!(matches!(err, CoreError::ForceTooEarly { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(matches!(
        force(&mut w, &router, "x", 0, true),
        Err(CoreError::NoSuchDeletion { .. })
    ));
    let forced = force(&mut w, &net, "the router is decommissioned", 3_600_000, true).unwrap();
    assert!(forced.finalizers.is_empty() && forced.liens.is_empty());
    assert_eq!(w.record(&net).forced.as_ref().map(|f| f.by.as_str()), Some("ops"));
    w.run_until_quiet();
    assert!(w.get(&net).is_none(), "purged");
    let r = w.active(&router);
    assert!(
        !r.refs.contains_key("gateway_network"),
        "the blocker lost the reference: {r:?}"
    );
    let o = w.op(op.id);
    assert_eq!(o.state, OperationState::Succeeded, "{o:?}");
    assert_eq!(o.progress.failed, 0);
    assert!(w
        .state
        .events
        .iter()
        .any(|e| e.event_type == EventType::DeletionForced && e.message.contains("decommissioned")));
    w.check();
}

/// Review finding: the failure that reached the maximum while the
/// deletion was still walking its referrers used to mark it FAILED at once
/// and drop its queue entry with the walk in it: referrers past the walk's
/// position were never unset. Now the report only records it, and the
/// step after the walk fails the deletion; every referrer is acted on.
#[test]
fn the_last_finalizer_failure_reported_mid_walk_fails_the_deletion_only_after_its_walk() {
    let mut w = World::neutron().with_policy(|p| {
        p.max_attempts = 2;
        p.batch_budget = 3;
    });
    let (project, net, port) = (n("project", "p"), n("network", "n"), n("port", "x"));
    w.create(&project, &[]);
    w.create(&net, &[("project", &[&project])]);
    let mut s = spec(&port, &[("network", &[&net])]);
    s.finalizers = vec!["dns".to_owned()];
    w.try_create_spec(s).unwrap();
    let fips: Vec<String> = (0..10).map(|i| n("floating_ip", &format!("f{i}"))).collect();
    for f in &fips {
        w.create(f, &[("project", &[&project]), ("port", &[&port])]);
    }
    let op = w.delete_accepted(&port, false);
    w.step();
    assert!(
        !w.state.work.values().next().expect("queued").walk.finished,
        "the walk is under way"
    );
    for i in 1..=2 {
        report_failure(&mut w, &port, "dns", &format!("down {i}")).unwrap();
    }
    w.run_until_quiet();
    for f in &fips {
        assert!(
            !w.active(f).refs.contains_key("port"),
            "{f} still references the failed {port}"
        );
    }
    let DeletionStatus::Failed { error } = w.record(&port).status else {
        panic!("FAILED after the walk: {:?}", w.record(&port).status);
    };
    assert!(error.contains("down 2"), "{error}");
    assert_eq!(w.op(op.id).progress.unset, 10);
    w.check();
}

// Issue 27: a cascade acts for its caller's principal, member by member.

/// Alice may delete the network but not one of its subnets: the cascade
/// deletes everything else, holds that subnet BLOCKED with a reason naming
/// her, the verb and the rule (DELETING, so the network is not held by its
/// reference), keeps the root until it is done, and nothing dangles. Every
/// member it changed is audited for her. An administrator's force purge
/// finishes it.
#[test]
fn a_member_its_principal_may_not_delete_is_held_blocked_while_the_rest_finishes() {
    let mut w = World::neutron();
    w.create(&n("project", "p"), &[]);
    w.create(&n("network", "net"), &[("project", &[&n("project", "p")])]);
    w.create(&n("subnet", "s1"), &[("network", &[&n("network", "net")])]);
    w.create(&n("subnet", "s2"), &[("network", &[&n("network", "net")])]);
    w.create(
        &n("port", "p1"),
        &[("network", &[&n("network", "net")]), ("subnet", &[&n("subnet", "s1")])],
    );
    w.authorizer.denied.insert((auth::Verb::Delete, n("subnet", "s2")));
    let mut req = del(&n("network", "net"), true);
    req.principal = alice();
    let DeleteOutcome::Accepted(op) = w.delete_req(req).expect("delete") else {
        panic!("accepted");
    };
    w.run_until_quiet();
    assert!(w.get(&n("subnet", "s1")).is_none(), "s1 is deleted");
    assert!(w.get(&n("port", "p1")).is_none(), "p1 is deleted");
    let held = w.record(&n("subnet", "s2"));
    let DeletionStatus::Blocked { reason, .. } = &held.status else {
        panic!("s2 is held BLOCKED, got {:?}", held.status);
    };
    assert!(
        reason.contains("alice may not delete r1/subnet/s2") && reason.contains(DenySet::DENY_RULE),
        "{reason}"
    );
    assert_eq!(held.principal, alice(), "the cascaded member keeps the principal");
    assert_eq!(w.get(&n("subnet", "s2")).unwrap().state, ResourceState::Deleting);
    assert_eq!(
        w.get(&n("network", "net")).unwrap().state,
        ResourceState::Deleting,
        "the root goes last"
    );
    assert_eq!(w.op(op.id).progress.blocked, 1);
    w.check();
    let audited: BTreeSet<(String, String, String)> = w
        .state
        .audit
        .iter()
        .map(|e| (e.who.clone(), e.action.clone(), e.target.clone()))
        .collect();
    for member in [n("subnet", "s1"), n("port", "p1")] {
        assert!(
            audited.contains(&("alice".to_owned(), "cascade".to_owned(), member.clone())),
            "{member} audited: {audited:?}"
        );
    }
    assert!(
        w.state.audit.iter().all(|e| e.target != n("subnet", "s2")),
        "the refused member is not audited as changed"
    );
    assert!(w
        .state
        .audit
        .iter()
        .all(|e| e.rule == DenySet::ALLOW_RULE && e.via == "token"));
    // The refusal stands at every look until someone acts.
    w.advance_to_next_due();
    w.run_until_quiet();
    assert!(matches!(
        w.record(&n("subnet", "s2")).status,
        DeletionStatus::Blocked { .. }
    ));
    force(&mut w, &n("subnet", "s2"), "alice's cascade, approved", 0, true).expect("force");
    w.run_until_quiet();
    assert!(w.get(&n("subnet", "s2")).is_none(), "forced through");
    assert!(w.get(&n("network", "net")).is_none(), "the root follows");
    assert_eq!(w.op(op.id).state, OperationState::Succeeded);
    w.check();
}

/// Alice may delete a security group but not update the port that lists
/// it: the port keeps its reference (its row stays, so nothing dangles)
/// and the group is held BLOCKED naming the port and the verb; once the
/// policy allows it the next look finishes the deletion.
#[test]
fn a_referrer_its_principal_may_not_update_keeps_its_reference_and_holds_the_target() {
    let mut w = World::neutron();
    w.create(&n("project", "p"), &[]);
    w.create(&n("network", "net"), &[("project", &[&n("project", "p")])]);
    w.create(&n("security_group", "sg"), &[("project", &[&n("project", "p")])]);
    w.create(
        &n("port", "port"),
        &[
            ("network", &[&n("network", "net")]),
            ("security_groups", &[&n("security_group", "sg")]),
        ],
    );
    w.authorizer.denied.insert((auth::Verb::Update, n("port", "port")));
    let mut req = del(&n("security_group", "sg"), false);
    req.principal = alice();
    w.delete_req(req).expect("delete");
    w.run_until_quiet();
    assert_eq!(
        targets(&w.active(&n("port", "port")), "security_groups"),
        vec![n("security_group", "sg")]
    );
    let DeletionStatus::Blocked { reason, .. } = w.record(&n("security_group", "sg")).status else {
        panic!("sg is held BLOCKED");
    };
    assert!(reason.contains("alice may not update r1/port/port"), "{reason}");
    w.check();
    w.authorizer.denied.clear();
    w.advance_to_next_due();
    w.run_until_quiet();
    assert!(w.get(&n("security_group", "sg")).is_none());
    assert!(targets(&w.active(&n("port", "port")), "security_groups").is_empty());
    assert!(w
        .state
        .audit
        .iter()
        .any(|e| e.action == "unset" && e.target == n("port", "port") && e.who == "alice"));
    w.check();
}

/// The owner's side of the importer's liveness bug (an importer's walk
/// forgot a refusal when its budget ran out right after it, see
/// `importer_retries_a_referrer_refused_before_its_walk_ran_out_of_budget`
/// in `multi_region.rs`): the owner's walk, cut by its budget after a
/// refused referrer, still holds the target for it (the walk counts it as
/// blocking, and a count above zero sends it through a full pass from the
/// first row before it finishes), and lets it go once the policy allows.
#[test]
fn a_refused_referrer_before_the_owners_walk_ran_out_of_budget_still_holds_the_target() {
    let mut w = World::neutron().with_policy(|p| p.batch_budget = 2);
    w.create(&n("project", "p"), &[]);
    w.create(&n("network", "net"), &[("project", &[&n("project", "p")])]);
    w.create(&n("security_group", "sg"), &[("project", &[&n("project", "p")])]);
    // Five ports, the first (its row is the walk's first) refused.
    for i in 0..5 {
        w.create(
            &n("port", &format!("port{i}")),
            &[
                ("network", &[&n("network", "net")]),
                ("security_groups", &[&n("security_group", "sg")]),
            ],
        );
    }
    w.authorizer.denied.insert((auth::Verb::Update, n("port", "port0")));
    let mut req = del(&n("security_group", "sg"), false);
    req.principal = alice();
    w.delete_req(req).expect("delete");
    w.run_until_quiet();
    for i in 1..5 {
        assert!(targets(&w.active(&n("port", &format!("port{i}"))), "security_groups").is_empty());
    }
    assert_eq!(
        targets(&w.active(&n("port", "port0")), "security_groups"),
        vec![n("security_group", "sg")]
    );
    let DeletionStatus::Blocked { reason, .. } = w.record(&n("security_group", "sg")).status else {
        panic!("sg is held BLOCKED");
    };
    assert!(reason.contains("alice may not update r1/port/port0"), "{reason}");
    w.check();
    w.authorizer.denied.clear();
    w.advance_to_next_due();
    w.run_until_quiet();
    assert!(w.get(&n("security_group", "sg")).is_none());
    assert!(targets(&w.active(&n("port", "port0")), "security_groups").is_empty());
    w.check();
}

/// The dry run for a principal lists what it may not change (the members
/// it would delete: `delete`; the referrers it would unset: `update`), and
/// nothing else; for a principal refused nothing it lists nothing.
#[test]
fn the_dry_run_lists_the_members_its_principal_may_not_change() {
    let mut w = World::neutron();
    w.create(&n("project", "p"), &[]);
    w.create(&n("network", "net"), &[("project", &[&n("project", "p")])]);
    w.create(&n("subnet", "s1"), &[("network", &[&n("network", "net")])]);
    w.create(&n("security_group", "sg"), &[("project", &[&n("project", "p")])]);
    w.create(&n("port", "kept"), &[("network", &[&n("network", "net")])]);
    let mut req = del(&n("network", "net"), true);
    req.dry_run = true;
    req.principal = alice();
    let DeleteOutcome::DryRun(plan) = w.delete_req(req.clone()).unwrap() else {
        panic!("dry run");
    };
    assert!(plan.denied.is_empty(), "{:?}", plan.denied);
    w.authorizer.denied.insert((auth::Verb::Delete, n("subnet", "s1")));
    w.authorizer.denied.insert((auth::Verb::Delete, n("port", "kept")));
    w.authorizer
        .denied
        .insert((auth::Verb::Delete, n("security_group", "sg")));
    let DeleteOutcome::DryRun(plan) = w.delete_req(req).unwrap() else {
        panic!("dry run");
    };
    let denied: BTreeSet<(String, auth::Verb)> = plan.denied.iter().map(|d| (d.resource.to_string(), d.verb)).collect();
    assert_eq!(
        denied,
        BTreeSet::from([
            (n("subnet", "s1"), auth::Verb::Delete),
            (n("port", "kept"), auth::Verb::Delete),
        ]),
        "sg is outside the closure"
    );
    assert!(plan.denied.iter().all(|d| d.rule == DenySet::DENY_RULE));
    assert_eq!(plan.denied_more, 0);
}
