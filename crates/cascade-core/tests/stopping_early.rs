//! A work step its caller stops early (`process_work_until`) changes where
//! the cascade is cut into steps, never what the steps do.
//!
//! Why: the node ends a work step at its time target, between two items,
//! whatever its bounds in items would still allow (the small write's p99
//! during a long cascade, issue 28). A step stopped after k items must
//! commit what a step bounded to k items commits, and the items it did not
//! reach must stay due: one skipped would leave its resource DELETING for
//! ever. A step whose caller always says stop must still do something, or
//! a slow machine would never end a cascade.

#[macro_use]
mod support;

use support::{seen, Seen};

use std::cell::Cell;

use cascade_core::memory::MemoryState;
use cascade_core::protocol::{self, WorkReport};
use cascade_core::*;

/// Networks with ports (`cascade`) and floating IPs on some of the ports
/// (`unset`): a tree with referrers that survive.
const SCHEMA: &str = r#"
[kinds.network]
[kinds.port.refs.network]
kind = "network"
on_delete = "cascade"
required = true
[kinds.floating_ip.refs.port]
kind = "port"
on_delete = "unset"
"#;

const NETWORKS: usize = 7;
const PORTS_PER_NETWORK: usize = 90;
/// On every third port: one more than a cascade unsets in the step that
/// reaches the port (`protocol::UNSET_IN_THE_SAME_STEP`).
const FIPS_PER_PORT: usize = protocol::UNSET_IN_THE_SAME_STEP + 1;

struct Region {
    state: MemoryState,
    schema: Schema,
    region: RegionId,
    ids: SequentialIds,
    policy: Policy,
    now: Timestamp,
}

impl Region {
    fn new() -> Self {
        Region {
            state: MemoryState::default(),
            schema: Schema::from_toml(SCHEMA).expect("the schema loads"),
            region: RegionId::parse("r1").expect("a valid region"),
            ids: SequentialIds::default(),
            // Steps of 64 referrers: the walks of a network's 90 ports and
            // of the root's 7 networks span steps even when nothing stops them.
            policy: Policy {
                batch_budget: 64,
                ..Policy::default()
            },
            now: Timestamp(1_000_000),
        }
    }

    fn ctx(&self) -> Ctx<'_> {
        ctx!(self)
    }

    fn create(&mut self, specs: Vec<ResourceSpec>) {
        let step = protocol::create(&self.state, ctx!(self), &mut self.ids, specs).expect("the creates are valid");
        self.state.apply(step.writes);
    }

    /// The networks, their ports, and floating IPs on every third port.
    fn populate(&mut self) {
        let spec = |name: String, refs: Vec<(&str, String)>| ResourceSpec {
            name,
            refs: refs
                .into_iter()
                .map(|(field, target)| {
                    (
                        field.to_owned(),
                        vec![RefRequest {
                            name: target,
                            uid: None,
                        }],
                    )
                })
                .collect(),
            ..ResourceSpec::default()
        };
        for n in 0..NETWORKS {
            let network = format!("r1/network/n{n}");
            self.create(vec![spec(network.clone(), vec![])]);
            let ports: Vec<ResourceSpec> = (0..PORTS_PER_NETWORK)
                .map(|p| spec(format!("r1/port/n{n}-p{p:03}"), vec![("network", network.clone())]))
                .collect();
            self.create(ports);
            // Floating IPs on every third port, more than a cascade
            // unsets in the step that reaches a port: those ports enter
            // DELETING, and their own walks unset referrers that survive.
            let fips: Vec<ResourceSpec> = (0..PORTS_PER_NETWORK)
                .step_by(3)
                .flat_map(|p| (0..FIPS_PER_PORT).map(move |f| (p, f)))
                .map(|(p, f)| {
                    spec(
                        format!("r1/floating_ip/n{n}-f{p:03}-{f}"),
                        vec![("port", format!("r1/port/n{n}-p{p:03}"))],
                    )
                })
                .collect();
            self.create(fips);
        }
    }

    fn delete(&mut self, name: &str) {
        let req = DeleteRequest {
            name: name.to_owned(),
            cascade: true,
            dry_run: false,
            allow_missing: false,
            etag: None,
            uid: None,
            requested_by: "stopping-early test".to_owned(),
            orphan: false,
            remote_kept: Default::default(),
            principal: Default::default(),
            retain_ms: 0,
            bounds: Default::default(),
            operation_id: None,
        };
        let step = protocol::delete(&self.state, ctx!(self), &mut self.ids, req).expect("the delete is accepted");
        self.state.apply(step.writes);
    }

    /// Runs work steps, each asking `may_go_on` between items, until one does nothing. Returns the steps' reports.
    fn run_work(&mut self, may_go_on: &dyn Fn() -> bool) -> Vec<WorkReport> {
        let mut reports = Vec::new();
        for _ in 0..100_000 {
            let step = protocol::process_work_until(&self.state, self.ctx(), may_go_on).expect("a work step");
            self.state.apply(step.writes);
            let report = step.value;
            let idle = report.items == 0 && !report.more;
            reports.push(report);
            if idle {
                return reports;
            }
        }
        panic!("the deletion work did not settle in 100,000 steps");
    }
}

/// Deletes every network, one cascade after another, each run to its end
/// with `may_go_on` asked between items; returns what is
/// seen at the end and the steps' reports.
fn cascade_every_network(may_go_on: &dyn Fn() -> bool) -> (Seen, Vec<WorkReport>) {
    let mut r1 = Region::new();
    r1.populate();
    let mut reports = Vec::new();
    for n in 0..NETWORKS {
        r1.delete(&format!("r1/network/n{n}"));
        reports.extend(r1.run_work(may_go_on));
    }
    (seen(&r1.state), reports)
}

#[test]
fn a_cascade_stopped_between_any_two_items_ends_as_one_never_stopped() {
    let (never, never_reports) = cascade_every_network(&|| true);
    let fips = NETWORKS * PORTS_PER_NETWORK.div_ceil(3) * FIPS_PER_PORT;
    assert_eq!(never.resources.len(), fips, "only the floating IPs survive");
    assert!(never
        .resources
        .iter()
        .all(|(_, state, refs)| *state == ResourceState::Active && refs.is_empty()));
    assert_eq!(
        never.left_over,
        (0, 0, 0),
        "no row, queue entry or deletion record is left"
    );
    assert_eq!(never.operations.len(), NETWORKS);
    assert!(never_reports.iter().all(|r| !r.stopped_early));

    // Stopped as soon as the step has done one item: a step per item.
    let (always, always_reports) = cascade_every_network(&|| false);
    assert!(
        always == never,
        "a step per item ends unlike steps of many:\n{always:?}\n{never:?}"
    );
    assert!(
        always_reports.len() > 4 * never_reports.len(),
        "stopped every time, the cascade took {} steps against {}",
        always_reports.len(),
        never_reports.len()
    );
    assert!(always_reports.iter().any(|r| r.stopped_early && r.more));

    // Stopped at points a counter picks.
    let calls = Cell::new(0u64);
    let (sometimes, sometimes_reports) = cascade_every_network(&|| {
        calls.set(calls.get() + 1);
        !calls.get().wrapping_mul(0x9E37_79B9_7F4A_7C15).is_multiple_of(7)
    });
    assert!(sometimes == never, "stopped at pseudo-random points, it ends otherwise");
    assert!(sometimes_reports.iter().filter(|r| r.stopped_early).count() > 10);
}

/// A region with one network's cascade started and its root's walk done,
/// under the policy's default bounds: every port entered (the 60 without
/// a floating IP purged at once), so the next step has the other 30, of
/// one operation, to take.
fn ports_due() -> Region {
    let mut r1 = Region::new();
    r1.policy = Policy::default();
    r1.populate();
    r1.delete("r1/network/n0");
    let step = protocol::process_work(&r1.state, r1.ctx()).expect("the root's step");
    assert_eq!(
        step.value.cascaded, PORTS_PER_NETWORK,
        "the root's walk entered every port"
    );
    r1.state.apply(step.writes);
    r1
}

#[test]
fn a_step_stopped_after_k_items_writes_what_a_step_of_k_items_writes() {
    let r1 = ports_due();
    for k in [1, 2, 5, 20] {
        // Says no from the k-th time it is asked: a port's walk (its
        // floating IPs) starts and ends in the step, so it is asked only
        // between items, first before the second.
        let asked = Cell::new(0usize);
        let stopped = protocol::process_work_until(&r1.state, r1.ctx(), &|| {
            asked.set(asked.get() + 1);
            asked.get() < k
        })
        .expect("a stopped step");
        let policy = Policy {
            batch_items: k,
            ..Policy::default()
        };
        let bounded = protocol::process_work(
            &r1.state,
            Ctx {
                policy: &policy,
                ..r1.ctx()
            },
        )
        .expect("a bounded step");
        assert_eq!(stopped.value.items, k, "stopped after {k} items");
        assert!(
            stopped.value.stopped_early && stopped.value.more,
            "k = {k}: {:?}",
            stopped.value
        );
        assert!(
            !bounded.value.stopped_early && bounded.value.more,
            "k = {k}: {:?}",
            bounded.value
        );
        assert_eq!(
            (
                stopped.value.items,
                stopped.value.purged,
                stopped.value.unset,
                stopped.value.cascaded
            ),
            (
                bounded.value.items,
                bounded.value.purged,
                bounded.value.unset,
                bounded.value.cascaded
            ),
            "k = {k}"
        );
        assert!(stopped.value.purged > 0, "k = {k}: its ports were purged");
        assert!(
            stopped.writes == bounded.writes,
            "k = {k}: a step stopped after its items writes otherwise than one bounded to them"
        );
    }
}

#[test]
fn a_step_that_may_never_go_on_still_does_one_item() {
    let mut r1 = ports_due();
    let mut steps = 0;
    for _ in 0..10_000 {
        let step = protocol::process_work_until(&r1.state, r1.ctx(), &|| false).expect("a step");
        if step.value.items == 0 && !step.value.more {
            break;
        }
        assert_eq!(step.value.items, 1, "{:?}", step.value);
        steps += 1;
        r1.state.apply(step.writes);
    }
    // The 30 ports with floating IPs, one a step, then the root, which
    // the last of them woke.
    assert_eq!(steps, PORTS_PER_NETWORK / 3 + 1);
    assert!(
        !r1.state
            .resources
            .keys()
            .any(|name| name.to_string().starts_with("r1/port/n0-") || name.to_string() == "r1/network/n0"),
        "the cascade ended: n0 and every port of it are gone"
    );
}
