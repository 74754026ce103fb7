//! One region's part of a purge over `MemoryState`: what a filter matches,
//! the tally a scan makes, and the part's step, run to quiescence and
//! checked by the invariant checker.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::auth::AllowAll;
use crate::invariants::{self, RegionView};
use crate::memory::MemoryState;
use crate::model::{DeletionStatus, Lien};
use crate::name::SequentialIds;
use crate::protocol::{self, Policy, RefRequest, ResourceSpec};
use crate::schema::Schema;

/// Networks whose ports cascade; a port's firewall rule blocks it, its
/// DNS record loses the reference.
const SCHEMA: &str = r#"
[kinds.network]

[kinds.port.refs.network]
kind = "network"
on_delete = "cascade"

[kinds.firewall.refs.port]
kind = "port"
on_delete = "block"

[kinds.dns.refs.port]
kind = "port"
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

macro_rules! ctx {
    ($w:expr) => {
        Ctx {
            schema: &$w.schema,
            region: &$w.region,
            now: $w.now,
            policy: &$w.policy,
            authorizer: &AllowAll,
        }
    };
}

impl World {
    fn new() -> Self {
        World {
            state: MemoryState::default(),
            schema: Schema::from_toml(SCHEMA).expect("schema"),
            region: RegionId::parse("r1").expect("region"),
            ids: SequentialIds::default(),
            policy: Policy::default(),
            now: Timestamp(1_000_000),
        }
    }

    fn create(&mut self, name: &str, attributes: &[(&str, &str)], refs: &[(&str, &str)]) -> Resource {
        let spec = ResourceSpec {
            name: name.to_owned(),
            attributes: attributes
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            refs: refs
                .iter()
                .map(|(field, target)| {
                    (
                        (*field).to_owned(),
                        vec![RefRequest {
                            name: (*target).to_owned(),
                            uid: None,
                        }],
                    )
                })
                .collect::<BTreeMap<_, _>>(),
            finalizers: Vec::new(),
        };
        let step = protocol::create(&self.state, ctx!(self), &mut self.ids, vec![spec]).expect("create");
        self.state.apply(step.writes);
        step.value.into_iter().next().expect("created")
    }

    fn resource(&self, name: &str) -> Option<Resource> {
        self.state
            .resource(&ResourceName::parse(name).expect("name"))
            .expect("read")
    }

    /// The scan a node makes: every resource in name order, tallied.
    fn tally(&self, filter: &PurgeFilter, keep: usize) -> PurgeTally {
        let mut tally = PurgeTally::keeping(keep);
        for r in self.state.resources.values() {
            tally.examine(filter, r, self.now);
        }
        tally
    }

    fn start(&mut self, filter: &PurgeFilter, members: Vec<RefTarget>, id: Option<OperationId>) -> Step<PurgeStarted> {
        let req = StartPurge {
            operation: id,
            root_region: self.region.clone(),
            filter: filter.clone(),
            members,
            reached: BTreeSet::new(),
            requested_by: format!("purge {}", filter.describe()),
            principal: Principal::anonymous(),
            audit: AdminRequest {
                who: "token".to_owned(),
                action: "Purge (force)".to_owned(),
                target: filter.describe(),
                reason: "test".to_owned(),
            },
        };
        let step = start_purge(&self.state, ctx!(self), &mut self.ids, req).expect("start_purge");
        self.state.apply(step.writes.clone());
        step
    }

    fn run_until_quiet(&mut self) {
        for _ in 0..1_000 {
            let step = protocol::process_work(&self.state, ctx!(self)).expect("process_work");
            let report = step.value.clone();
            self.state.apply(step.writes);
            if report.items == 0 && !report.more {
                return;
            }
        }
        panic!("deletion work did not quiesce");
    }

    fn check(&self) {
        let report =
            invariants::check_quiescent(&[RegionView::from_state(&self.region, &self.state)], Some(&self.schema));
        assert!(report.is_clean(), "invariants broken:\n{}", report.lines());
    }
}

fn filter(kind: &str, prefix: &str, selector: &str, older_than_ms: u64) -> PurgeFilter {
    PurgeFilter::new(kind, prefix, selector, older_than_ms).expect("filter")
}

#[test]
fn an_empty_filter_is_refused_and_so_is_a_selector_that_does_not_parse() {
    let empty = PurgeFilter::new("", "", "  ", 3_600_000).expect_err("empty");
    assert_eq!(empty.code(), crate::ErrorCode::InvalidArgument);
    assert!(empty.to_string().starts_with("kind: a purge needs a kind"), "{empty}");
    let bad = PurgeFilter::new("port", "", "env in (dev", 0).expect_err("bad selector");
    assert!(bad.to_string().starts_with("attribute_selector:"), "{bad}");
    let kind = PurgeFilter::new("Port!", "", "", 0).expect_err("bad kind");
    assert!(kind.to_string().starts_with("kind:"), "{kind}");
    assert_eq!(
        filter("port", "web-", "env=dev", 7 * 86_400_000).describe(),
        "kind=port prefix=web- selector=\"env=dev\" older_than=7d"
    );
    assert_eq!(filter("port", "", "", 90_000).describe(), "kind=port older_than=90s");
    assert_eq!(filter("", "a", "", 1_500).describe(), "prefix=a older_than=1500ms");
}

#[test]
fn a_filter_matches_active_unprotected_resources_by_kind_prefix_selector_and_age() {
    let mut w = World::new();
    w.create("r1/network/n1", &[], &[]);
    w.now = Timestamp(w.now.0 + 10_000);
    let dev = w.create("r1/port/web-1", &[("env", "dev")], &[("network", "r1/network/n1")]);
    let now = w.now;
    assert!(filter("port", "", "", 0).matches(&dev, now));
    assert!(filter("", "web-", "", 0).matches(&dev, now));
    assert!(filter("", "", "env=dev", 0).matches(&dev, now));
    assert!(!filter("", "", "env=prod", 0).matches(&dev, now));
    assert!(!filter("network", "", "", 0).matches(&dev, now));
    assert!(!filter("port", "db-", "", 0).matches(&dev, now));
    // Age: created 10 s before the network's now, 0 s before its own.
    assert!(!filter("port", "", "", 1).matches(&dev, now));
    assert!(filter("port", "", "", 5_000).matches(&dev, Timestamp(now.0 + 5_000)));
    let n1 = w.resource("r1/network/n1").expect("n1");
    assert!(filter("network", "", "", 10_000).matches(&n1, now));
    assert!(!filter("network", "", "", 10_001).matches(&n1, now));
    // A lien protects it; a DELETING one is on its way already.
    let mut liened = dev.clone();
    liened.liens.push(Lien {
        id: "keep".into(),
        reason: "audit".into(),
        origin: "ops".into(),
        create_time: now,
    });
    assert!(!filter("port", "", "", 0).matches(&liened, now));
    let mut deleting = dev;
    deleting.state = ResourceState::Deleting;
    assert!(!filter("port", "", "", 0).matches(&deleting, now));
}

#[test]
fn a_tally_counts_every_match_samples_the_first_by_name_and_keeps_what_it_may() {
    let mut w = World::new();
    w.create("r1/network/n1", &[], &[]);
    for i in 0..25 {
        w.create(&format!("r1/port/p{i:02}"), &[], &[("network", "r1/network/n1")]);
    }
    let tally = w.tally(&filter("port", "", "", 0), 5);
    assert_eq!(tally.count, 25);
    let sample: Vec<String> = tally.sample.iter().map(ToString::to_string).collect();
    let first: Vec<String> = (0..PURGE_SAMPLE).map(|i| format!("r1/port/p{i:02}")).collect();
    assert_eq!(sample, first);
    assert_eq!(tally.members.len(), 5);
    assert!(!tally.count_is_lower_bound);
    // Several regions' samples: the first names of them all.
    let a = vec!["r2/port/b".to_owned(), "r2/port/d".to_owned()];
    let b = vec!["r1/port/z".to_owned(), "r2/port/a".to_owned(), "r2/port/b".to_owned()];
    assert_eq!(
        merge_samples([a.as_slice(), b.as_slice()]),
        vec!["r1/port/z", "r2/port/a", "r2/port/b", "r2/port/d"]
    );
}

/// The members enter DELETING in one step, each with its own cascade by
/// the schema: a `block` referrer holds its port, an `unset` one loses
/// the reference, a `cascade` one goes too; the operation finishes when
/// the last member does, and the invariants hold throughout.
#[test]
fn a_part_starts_every_matched_member_and_each_cascades_by_the_schema() {
    let mut w = World::new();
    w.create("r1/network/n1", &[("env", "dev")], &[]);
    w.create("r1/network/n2", &[("env", "prod")], &[]);
    w.create("r1/port/p1", &[], &[("network", "r1/network/n1")]);
    w.create("r1/port/p2", &[], &[("network", "r1/network/n1")]);
    w.create("r1/dns/d1", &[], &[("port", "r1/port/p1")]);
    w.create("r1/firewall/f2", &[], &[("port", "r1/port/p2")]);
    w.create("r1/port/p3", &[], &[("network", "r1/network/n2")]);
    let dev = filter("network", "", "env=dev", 0);
    let tally = w.tally(&dev, 100);
    assert_eq!((tally.count, tally.members.len()), (1, 1));
    let step = w.start(&dev, tally.members, None);
    let op = step.value.operation.clone();
    assert!(op.is_purge(), "{op:?}");
    assert_eq!(op.root.name.to_string(), format!("r1/purge/{}", op.id));
    assert_eq!(step.value.started.len(), 1);
    assert_eq!(step.value.skipped, 0);
    assert_eq!(op.state, OperationState::Running);
    assert_eq!(op.progress.pending, 1);
    let audit: Vec<&AuditEntry> = step.writes.audit.iter().collect();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0].outcome, format!("ok: 1 started in operation {}", op.id));
    assert_eq!(audit[0].target, "kind=network selector=\"env=dev\"");
    let n1 = w.resource("r1/network/n1").expect("n1");
    assert_eq!(n1.state, ResourceState::Deleting);

    w.run_until_quiet();
    // p1 went with n1 and d1 lost its reference; p2 is held by f2 (block),
    // so n1 waits for it; n2 and its port are untouched.
    assert!(w.resource("r1/port/p1").is_none());
    let d1 = w.resource("r1/dns/d1").expect("d1");
    assert!(d1.refs.get("port").is_none_or(Vec::is_empty), "{d1:?}");
    assert_eq!(w.resource("r1/port/p2").expect("p2").state, ResourceState::Deleting);
    let p2_uid = w.resource("r1/port/p2").expect("p2").uid;
    let record = w.state.deletion(p2_uid).expect("read").expect("p2's record");
    assert!(matches!(record.status, DeletionStatus::Blocked { .. }), "{record:?}");
    assert_eq!(w.resource("r1/network/n2").expect("n2").state, ResourceState::Active);
    assert_eq!(w.resource("r1/port/p3").expect("p3").state, ResourceState::Active);
    let running = w.state.operation(op.id).expect("read").expect("op");
    assert_eq!(running.state, OperationState::Running);
    w.check();

    // The blocker goes: everything finishes, and so does the operation.
    let f2 = w.resource("r1/firewall/f2").expect("f2");
    let del = protocol::DeleteRequest {
        name: f2.name.to_string(),
        requested_by: "tester".into(),
        ..Default::default()
    };
    let step = protocol::delete(&w.state, ctx!(w), &mut w.ids, del).expect("delete f2");
    w.state.apply(step.writes);
    for _ in 0..5 {
        w.now = Timestamp(w.now.0 + 120_000);
        w.run_until_quiet();
    }
    assert!(w.resource("r1/network/n1").is_none());
    assert!(w.resource("r1/port/p2").is_none());
    let done = w.state.operation(op.id).expect("read").expect("op");
    assert_eq!(done.state, OperationState::Succeeded, "{done:?}");
    assert_eq!(done.progress.deleted, 3, "{done:?}");
    w.check();
}

/// What changed between the scan and the step is left alone: a member
/// that no longer matches, one re-created under another uid, one of
/// another region, one named twice. A part with nothing left to start is
/// finished at once; a part started again changes nothing.
#[test]
fn a_part_leaves_alone_what_changed_since_the_scan_and_is_idempotent() {
    let mut w = World::new();
    w.create("r1/network/n1", &[("env", "dev")], &[]);
    let dev = filter("network", "", "env=dev", 0);
    let mut members = w.tally(&dev, 100).members;
    // Now prod: it no longer matches.
    let spec = ResourceSpec {
        name: "r1/network/n1".into(),
        attributes: [("env".to_owned(), "prod".to_owned())].into_iter().collect(),
        ..Default::default()
    };
    let step = protocol::update(&w.state, ctx!(w), spec, None).expect("update");
    w.state.apply(step.writes);
    members.push(members[0].clone());
    members.push(RefTarget {
        name: ResourceName::parse("r2/network/n9").expect("name"),
        uid: Uid(uuid::Uuid::from_u128(9)),
    });
    let step = w.start(&dev, members, None);
    assert!(step.value.started.is_empty());
    assert_eq!(step.value.skipped, 3);
    let op = step.value.operation;
    assert_eq!(op.state, OperationState::Succeeded);
    assert!(op.end_time.is_some());
    assert_eq!(w.resource("r1/network/n1").expect("n1").state, ResourceState::Active);
    w.check();

    // Another region's part of the same operation, asked twice.
    w.create("r1/network/n3", &[("env", "dev")], &[]);
    let members = w.tally(&dev, 100).members;
    let other = OperationId(uuid::Uuid::from_u128(77));
    let first = w.start(&dev, members.clone(), Some(other));
    assert_eq!(first.value.started.len(), 1);
    assert!(!first.value.already_started);
    let again = w.start(&dev, members, Some(other));
    assert!(again.value.already_started);
    assert!(again.writes.is_empty(), "a part started again writes nothing");
    // A part that a cascade from another region's member made here before
    // this region's part was asked for is this purge's: it takes the
    // purge's root and the members start in it.
    w.create("r1/network/n4", &[("env", "dev")], &[]);
    let members: Vec<RefTarget> = w
        .tally(&dev, 100)
        .members
        .into_iter()
        .filter(|m| m.name.id() == "n4")
        .collect();
    let early = OperationId(uuid::Uuid::from_u128(78));
    let mut tx = Tx::new(&w.state);
    tx.put_operation(Operation {
        id: early,
        root: RefTarget {
            name: ResourceName::parse("r2/network/far").expect("name"),
            uid: Uid(uuid::Uuid::from_u128(5)),
        },
        requested_by: "region r2".into(),
        cascade: true,
        state: OperationState::Succeeded,
        progress: Progress {
            unset: 1,
            ..Progress::default()
        },
        create_time: w.now,
        end_time: Some(w.now),
        reached: BTreeSet::new(),
        changes: 1,
        closure_confirmed: false,
        controls: None,
        undelete: None,
        principal: Principal::anonymous(),
        retain_ms: 0,
    });
    let writes = tx.finish();
    w.state.apply(writes);
    let adopted = w.start(&dev, members, Some(early));
    assert_eq!(adopted.value.started.len(), 1);
    assert!(adopted.value.operation.is_purge(), "{:?}", adopted.value.operation);
    assert_eq!(adopted.value.operation.progress.unset, 1);
    assert_eq!(adopted.value.operation.state, OperationState::Running);

    // An id that is not a purge's is refused.
    let del = protocol::DeleteRequest {
        name: "r1/network/n1".into(),
        requested_by: "tester".into(),
        ..Default::default()
    };
    let step = protocol::delete(&w.state, ctx!(w), &mut w.ids, del).expect("delete n1");
    let protocol::DeleteOutcome::Accepted(plain) = step.value.clone() else {
        panic!("{:?}", step.value);
    };
    w.state.apply(step.writes);
    let req = StartPurge {
        operation: Some(plain.id),
        root_region: w.region.clone(),
        filter: dev.clone(),
        members: Vec::new(),
        reached: BTreeSet::new(),
        requested_by: String::new(),
        principal: Principal::anonymous(),
        audit: AdminRequest::default(),
    };
    let refused = start_purge(&w.state, ctx!(w), &mut w.ids, req).expect_err("not a purge's");
    assert_eq!(refused.code(), crate::ErrorCode::InvalidArgument);
    w.run_until_quiet();
    w.check();
}
