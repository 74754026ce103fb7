//! A work step its caller stops between two referrers of a walk
//! (`process_work_until`'s `may_go_on`, asked inside a walk resumed from an
//! earlier step's position) changes where the walk is cut into steps,
//! never what it does, and reads no row behind its position again.
//!
//! Why: the node stops a work step at its time target (issue 28's small
//! write p99 during a long cascade). Between items alone that never cut
//! the one item of P1 unset, a root walking a million referrers in pages
//! of the step's budget (docs/BENCHMARKS.md, "fjall: a step that stops at
//! its time"). A first attempt also cut walks that started in the step:
//! such a walk, cut, is counted again from its first row by a full pass
//! before its member finishes, a re-read of every row (on fjall, of every
//! tombstone), which `tests/tombstones.rs` caught under the debug build's
//! slow steps. So only a walk resumed from a stored position, which the
//! full pass reads again at its end whatever happens, is cut; these tests
//! count the scans from a target's first row and the tombstones they pass.
//! And the position is only safe if no row can appear behind it: nothing
//! attaches to a DELETING target, by a create, an update or a peer's attach.

#[macro_use]
mod support;

use support::{seen, Seen};

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};

use cascade_core::memory::MemoryState;
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::protocol::{self, WorkReport};
use cascade_core::state::{StateRead, WriteSet};
use cascade_core::*;

/// A network whose referrers are ports (`cascade`, each with floating IPs
/// that are `unset`, so a port is walked too) and addresses (`unset`).
const SCHEMA: &str = r#"
[kinds.network]
[kinds.port.refs.network]
kind = "network"
on_delete = "cascade"
required = true
[kinds.address.refs.network]
kind = "network"
on_delete = "unset"
[kinds.floating_ip.refs.port]
kind = "port"
on_delete = "unset"
"#;

const PORTS: usize = 60;
const FIPS_PER_PORT: usize = 3;
const ADDRESSES: usize = 200;
/// Referrer changes per step: the root's walk of 260 rows spans steps.
const BUDGET: usize = 64;

/// A [`MemoryState`] that keeps removed back-reference rows as tombstones,
/// as an LSM engine does, and counts per target the scans that start at
/// its first row and the tombstones scans pass.
#[derive(Default)]
struct Counted {
    state: MemoryState,
    tombstones: BTreeSet<BackRefKey>,
    scans_from_first_row: RefCell<BTreeMap<Uid, u64>>,
    tombstones_passed: RefCell<BTreeMap<Uid, u64>>,
    rows_returned: Cell<u64>,
}

impl Counted {
    fn apply(&mut self, w: WriteSet) {
        for (k, v) in &w.backrefs {
            if v.is_none() {
                self.tombstones.insert(k.clone());
            } else {
                self.tombstones.remove(k);
            }
        }
        self.state.apply(w);
    }
}

impl StateRead for Counted {
    forward_state_read!(state => resource, name_of, backref, deletion, operation, work, outcome, due_work, next_revision, remote_deletion, pending_attach, remote_deletions, pending_release, cursor, generation);

    fn backrefs(
        &self,
        target: Uid,
        after: Option<&BackRefKey>,
        limit: usize,
    ) -> Result<Vec<BackRef>, error::StorageError> {
        let page = self.state.backrefs(target, after, limit)?;
        if after.is_none() {
            *self.scans_from_first_row.borrow_mut().entry(target).or_default() += 1;
        }
        // A scan passes every tombstone between its start and the last row
        // it returns, or the end of the prefix when the page is short.
        let passed = self
            .tombstones
            .iter()
            .filter(|k| k.target == target && after.is_none_or(|a| *k > a))
            .filter(|k| page.len() < limit || page.last().is_some_and(|last| **k < last.key()))
            .count() as u64;
        *self.tombstones_passed.borrow_mut().entry(target).or_default() += passed;
        self.rows_returned.set(self.rows_returned.get() + page.len() as u64);
        Ok(page)
    }
}

struct Region {
    state: Counted,
    schema: Schema,
    region: RegionId,
    ids: SequentialIds,
    policy: Policy,
    now: Timestamp,
}

fn reference(field: &str, target: &str) -> (String, Vec<RefRequest>) {
    (
        field.to_owned(),
        vec![RefRequest {
            name: target.to_owned(),
            uid: None,
        }],
    )
}

impl Region {
    fn new() -> Self {
        Region {
            state: Counted::default(),
            schema: Schema::from_toml(SCHEMA).expect("the schema loads"),
            region: RegionId::parse("r1").expect("a valid region"),
            ids: SequentialIds::default(),
            policy: Policy {
                batch_budget: BUDGET,
                ..Policy::default()
            },
            now: Timestamp(1_000_000),
        }
    }

    fn ctx(&self) -> Ctx<'_> {
        ctx!(self)
    }

    fn create(&mut self, specs: Vec<ResourceSpec>) -> Result<(), CoreError> {
        let step = protocol::create(&self.state, ctx!(self), &mut self.ids, specs)?;
        self.state.apply(step.writes);
        Ok(())
    }

    /// The network `r1/network/n` with its ports, their floating IPs and
    /// its addresses; returns the network.
    fn populate(&mut self, ports: usize, addresses: usize) -> Resource {
        let network = "r1/network/n";
        let spec = |name: String, refs: Vec<(String, Vec<RefRequest>)>| ResourceSpec {
            name,
            refs: refs.into_iter().collect(),
            ..ResourceSpec::default()
        };
        self.create(vec![spec(network.to_owned(), vec![])])
            .expect("the network is created");
        let mut specs: Vec<ResourceSpec> = (0..ports)
            .map(|p| spec(format!("r1/port/p{p:03}"), vec![reference("network", network)]))
            .collect();
        specs.extend((0..addresses).map(|a| spec(format!("r1/address/a{a:03}"), vec![reference("network", network)])));
        self.create(specs).expect("the referrers are created");
        let fips: Vec<ResourceSpec> = (0..ports)
            .flat_map(|p| {
                (0..FIPS_PER_PORT).map(move |f| {
                    spec(
                        format!("r1/floating_ip/p{p:03}-f{f}"),
                        vec![reference("port", &format!("r1/port/p{p:03}"))],
                    )
                })
            })
            .collect();
        self.create(fips).expect("the floating IPs are created");
        self.resource(network).expect("the network exists")
    }

    fn resource(&self, name: &str) -> Option<Resource> {
        let name = ResourceName::parse(name).expect("a valid name");
        self.state.state.resources.get(&name).cloned()
    }

    fn delete(&mut self, name: &str) {
        let req = DeleteRequest {
            name: name.to_owned(),
            cascade: true,
            dry_run: false,
            allow_missing: false,
            etag: None,
            uid: None,
            requested_by: "walk-stopped test".to_owned(),
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

    /// One work step, `may_go_on` asked by it.
    fn step(&mut self, may_go_on: &dyn Fn() -> bool) -> WorkReport {
        let step = protocol::process_work_until(&self.state, self.ctx(), may_go_on).expect("a work step");
        self.state.apply(step.writes);
        step.value
    }

    /// Work steps until one does nothing; returns their reports.
    fn run_work(&mut self, may_go_on: &dyn Fn() -> bool) -> Vec<WorkReport> {
        let mut reports = Vec::new();
        for _ in 0..100_000 {
            let report = self.step(may_go_on);
            let idle = report.items == 0 && !report.more;
            reports.push(report);
            if idle {
                return reports;
            }
        }
        panic!("the deletion work did not settle in 100,000 steps");
    }
}

/// What one cascade of the network did, and what its root's scans read.
struct Run {
    seen: Seen,
    reports: Vec<WorkReport>,
    root_scans_from_first_row: u64,
    root_tombstones_passed: u64,
    rows_returned: u64,
}

fn cascade_the_network(may_go_on: &dyn Fn() -> bool) -> Run {
    let mut r1 = Region::new();
    let network = r1.populate(PORTS, ADDRESSES);
    r1.delete(network.name.as_str());
    let reports = r1.run_work(may_go_on);
    let count = |counts: &RefCell<BTreeMap<Uid, u64>>| counts.borrow().get(&network.uid).copied().unwrap_or(0);
    Run {
        seen: seen(&r1.state.state),
        reports,
        root_scans_from_first_row: count(&r1.state.scans_from_first_row),
        root_tombstones_passed: count(&r1.state.tombstones_passed),
        rows_returned: r1.state.rows_returned.get(),
    }
}

#[test]
fn a_walk_stopped_between_any_two_referrers_ends_as_one_never_stopped() {
    let never = cascade_the_network(&|| true);
    let survivors = ADDRESSES + PORTS * FIPS_PER_PORT;
    assert_eq!(
        never.seen.resources.len(),
        survivors,
        "only the addresses and floating IPs survive"
    );
    assert!(never
        .seen
        .resources
        .iter()
        .all(|(_, state, refs)| *state == ResourceState::Active && refs.is_empty()));
    assert_eq!(never.seen.left_over, (0, 0, 0), "no row, queue entry or record is left");
    assert!(never.reports.iter().all(|r| !r.stopped_early));

    let calls = Cell::new(0u64);
    let runs = [
        ("stopped every time it is asked", cascade_the_network(&|| false)),
        (
            "stopped at points a counter picks",
            cascade_the_network(&|| {
                calls.set(calls.get() + 1);
                !calls.get().wrapping_mul(0x9E37_79B9_7F4A_7C15).is_multiple_of(5)
            }),
        ),
    ];
    // Stopped every time, the root's resumed walk changes one referrer a
    // step (a port's walk, three floating IPs, is never cut: it starts in
    // its step): about one step per root's referrer past the first step's.
    let one_change = runs[0]
        .1
        .reports
        .iter()
        .filter(|r| r.stopped_early && r.items == 1 && r.unset + r.cascaded == 1)
        .count();
    assert!(
        one_change > ADDRESSES + PORTS - 2 * BUDGET,
        "{one_change} steps stopped inside the root's walk"
    );
    for (how, run) in runs {
        assert!(
            run.seen == never.seen,
            "{how}, it ends otherwise:\n{:?}\n{:?}",
            run.seen,
            never.seen
        );
        assert!(run.reports.iter().filter(|r| r.stopped_early).count() > 10, "{how}");
        // (Fewer may be: a root woken again after its walk passes its
        // rows once more, as the steps fall.)
        assert!(
            run.root_scans_from_first_row <= never.root_scans_from_first_row,
            "{how}: the root's walk was read again from its first row: {} scans against {}",
            run.root_scans_from_first_row,
            never.root_scans_from_first_row
        );
        // A walk read again from its first row would pass every one of
        // the root's 260 removed rows again; a few are passed by scans
        // that start elsewhere as the steps fall otherwise (3 of 516 when
        // stopped every time).
        assert!(
            run.root_tombstones_passed <= never.root_tombstones_passed + FIPS_PER_PORT as u64 * 2,
            "{how}: the root's scans passed the rows it had removed again: {} against {}",
            run.root_tombstones_passed,
            never.root_tombstones_passed
        );
        // A stop within a page leaves the page's rest to the next step:
        // rows ahead of the position, read again, at most a page a stop.
        let stops = run.reports.iter().filter(|r| r.stopped_early).count() as u64;
        assert!(
            run.rows_returned <= never.rows_returned + stops * BUDGET as u64,
            "{how}: {} rows returned against {} never stopped, {stops} stops",
            run.rows_returned,
            never.rows_returned
        );
    }
}

#[test]
fn a_walk_that_starts_in_the_step_is_not_cut_and_needs_no_second_pass() {
    // 40 addresses, within one step's budget: the root's walk starts and
    // ends in its first step even when the step may never go on, and reads
    // the rows as often as when it may always go on.
    let first_step = |may_go_on: &dyn Fn() -> bool| {
        let mut r1 = Region::new();
        let network = r1.populate(0, 40);
        r1.delete(network.name.as_str());
        let report = r1.step(may_go_on);
        assert_eq!(report.unset, 40, "{report:?}");
        assert!(
            r1.resource(network.name.as_str()).is_none(),
            "the network is purged in the step its walk ended"
        );
        let scans = r1.state.scans_from_first_row.borrow().get(&network.uid).copied();
        let passed = r1.state.tombstones_passed.borrow().get(&network.uid).copied();
        (scans, passed)
    };
    assert_eq!(
        first_step(&|| false),
        first_step(&|| true),
        "a cut would have sent it through a full pass from its first row"
    );
}

#[test]
fn a_referrer_that_would_attach_behind_a_stopped_walks_position_is_refused() {
    let mut r1 = Region::new();
    let network = r1.populate(0, ADDRESSES);
    r1.delete(network.name.as_str());
    // The root's first step (budget-bound), then two stopped in its walk.
    r1.step(&|| false);
    for _ in 0..2 {
        let report = r1.step(&|| false);
        assert!(report.stopped_early && report.more, "{report:?}");
    }
    let position = r1
        .state
        .work(network.uid)
        .expect("reads")
        .expect("the root is still due")
        .walk
        .after
        .expect("its walk keeps a position");
    // a000 was unset by the first step: its row is behind the position.
    let behind = r1.resource("r1/address/a000").expect("a000 survives");
    assert!(behind.refs.is_empty(), "a000 was unset");
    assert!(
        BackRefKey {
            target: network.uid,
            referrer: behind.uid,
            field: "network".to_owned(),
        } < position
    );

    // Pointed at the network again by an update, a create, a peer's attach.
    let again = ResourceSpec {
        name: "r1/address/a000".to_owned(),
        refs: [reference("network", network.name.as_str())].into(),
        ..ResourceSpec::default()
    };
    let update = protocol::update(&r1.state, r1.ctx(), again, None);
    assert!(
        matches!(update, Err(CoreError::TargetDeleting { .. })),
        "an update re-attaching behind the position: {update:?}"
    );
    let create = r1.create(vec![ResourceSpec {
        name: "r1/address/late".to_owned(),
        refs: [reference("network", network.name.as_str())].into(),
        ..ResourceSpec::default()
    }]);
    assert!(
        matches!(create, Err(CoreError::TargetDeleting { .. })),
        "a create: {create:?}"
    );
    let attach = peer::attach(
        &r1.state,
        r1.ctx(),
        "r2",
        vec![PeerBackRef {
            target: RefTarget {
                name: network.name.clone(),
                uid: network.uid,
            },
            referrer: RefTarget {
                name: ResourceName::parse("r2/address/a").expect("a valid name"),
                // Sorts before every row of r1's referrers.
                uid: Uid(uuid::Uuid::nil()),
            },
            field: "network".to_owned(),
            generation: 1,
        }],
    );
    assert!(
        matches!(attach, Err(CoreError::TargetDeleting { .. })),
        "a peer's attach: {attach:?}"
    );

    r1.run_work(&|| false);
    assert!(r1.resource(network.name.as_str()).is_none(), "the network is purged");
    let seen = seen(&r1.state.state);
    assert_eq!(seen.left_over, (0, 0, 0));
    assert_eq!(seen.resources.len(), ADDRESSES);
    assert!(seen
        .resources
        .iter()
        .all(|(_, state, refs)| *state == ResourceState::Active && refs.is_empty()));
}
