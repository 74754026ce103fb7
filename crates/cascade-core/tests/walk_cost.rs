//! What a deletion's walk of its back-references costs in rows read, on a
//! state that keeps removed rows as tombstones the way an LSM engine does.
//!
//! Why these tests exist: the protocol tests run on `MemoryState`, where a
//! removed row is gone, and the node's tests on small closures, so nothing
//! saw that every work step walked a target's rows from the first key.
//! On fjall, whose removed rows stay as tombstones until compaction, step
//! k skipped k pages of them: the 1M cascade took 561 s against 6.7 s at
//! 100k (`docs/BENCHMARKS.md`). Likewise a root waiting on other regions
//! re-read every remaining row on each release that woke it. Here the cost
//! is counted, not timed: rows and tombstones passed per deleted referrer.

#[macro_use]
mod support;

use std::cell::Cell;
use std::collections::BTreeSet;

use cascade_core::memory::MemoryState;
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::protocol::{self, WorkReport};
use cascade_core::state::{StateRead, WriteSet};
use cascade_core::*;

/// A [`MemoryState`] that remembers removed back-reference rows (tombstones
/// until a compaction that never comes here) and counts what scans pass:
/// live rows returned and tombstones skipped on the way.
#[derive(Default)]
struct LsmLike {
    state: MemoryState,
    tombstones: BTreeSet<BackRefKey>,
    rows_returned: Cell<u64>,
    tombstones_skipped: Cell<u64>,
    /// Point reads of a pending attach that reached the state.
    pending_attach_reads: Cell<u64>,
}

impl LsmLike {
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

    fn reset_counts(&self) {
        self.rows_returned.set(0);
        self.tombstones_skipped.set(0);
        self.pending_attach_reads.set(0);
    }
}

impl StateRead for LsmLike {
    forward_state_read!(state => resource, name_of, backref, deletion, operation, work, outcome, due_work, next_revision, remote_deletion, any_pending_attach, remote_deletions, pending_release, cursor, generation);

    fn pending_attach(&self, uid: Uid) -> Result<Option<model::PendingAttach>, error::StorageError> {
        self.pending_attach_reads.set(self.pending_attach_reads.get() + 1);
        self.state.pending_attach(uid)
    }

    fn backrefs(
        &self,
        target: Uid,
        after: Option<&BackRefKey>,
        limit: usize,
    ) -> Result<Vec<BackRef>, error::StorageError> {
        let page = self.state.backrefs(target, after, limit)?;
        // A scan passes every tombstone between its start and the last row
        // it returns, or the end of the prefix when the page is short.
        let passed = self
            .tombstones
            .iter()
            .filter(|k| k.target == target && after.is_none_or(|a| *k > a))
            .filter(|k| page.len() < limit || page.last().is_some_and(|last| **k < last.key()))
            .count();
        self.tombstones_skipped
            .set(self.tombstones_skipped.get() + passed as u64);
        self.rows_returned.set(self.rows_returned.get() + page.len() as u64);
        Ok(page)
    }
}

/// One region's node over an [`LsmLike`] state, with small work steps so
/// that a closure of a few thousand takes many of them.
struct Region {
    state: LsmLike,
    schema: Schema,
    region: RegionId,
    ids: SequentialIds,
    policy: Policy,
    now: Timestamp,
}

impl Region {
    fn new(region: &str) -> Self {
        Region {
            state: LsmLike::default(),
            schema: Schema::from_toml(SCHEMA).expect("the schema loads"),
            region: RegionId::parse(region).expect("a valid region"),
            ids: SequentialIds::default(),
            policy: Policy {
                batch_budget: 32,
                ..Policy::default()
            },
            now: Timestamp(1_000_000),
        }
    }

    fn ctx(&self) -> Ctx<'_> {
        ctx!(self)
    }

    fn name(&self, kind: &str, id: &str) -> String {
        format!("{}/{kind}/{id}", self.region)
    }

    fn create_network_and_ports(&mut self, ports: usize) -> Resource {
        let network = self.name("network", "n");
        let mut specs = vec![ResourceSpec {
            name: network.clone(),
            ..ResourceSpec::default()
        }];
        specs.extend((0..ports).map(|i| {
            ResourceSpec {
                name: self.name("port", &format!("p-{i:05}")),
                refs: [(
                    "network".to_owned(),
                    vec![RefRequest {
                        name: network.clone(),
                        uid: None,
                    }],
                )]
                .into(),
                ..ResourceSpec::default()
            }
        }));
        let step = protocol::create(&self.state, ctx!(self), &mut self.ids, specs).expect("the creates are valid");
        self.state.apply(step.writes);
        step.value.into_iter().next().expect("the network was created")
    }

    fn delete(&mut self, name: &str) {
        let req = DeleteRequest {
            name: name.to_owned(),
            cascade: true,
            dry_run: false,
            allow_missing: false,
            etag: None,
            uid: None,
            requested_by: "walk-cost test".to_owned(),
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

    /// Runs work steps until one does nothing; returns their sum.
    fn run_work(&mut self) -> WorkReport {
        let mut total = WorkReport::default();
        for _ in 0..100_000 {
            let step = protocol::process_work(&self.state, self.ctx()).expect("a work step");
            let report = step.value;
            self.state.apply(step.writes);
            total.items += report.items;
            total.purged += report.purged;
            total.cascaded += report.cascaded;
            if report.items == 0 && !report.more {
                return total;
            }
        }
        panic!("the deletion work did not settle in 100,000 steps");
    }
}

const PORTS: usize = 3_000;

/// Ports of one network, deleted with it.
const SCHEMA: &str = r#"
[kinds.network]
[kinds.port.refs.network]
kind = "network"
on_delete = "cascade"
required = true
[kinds.port.refs.uplink]
kind = "network"
on_delete = "unset"
"#;

/// A local cascade of 3,000 leaves in steps of 32: the walk resumes after
/// the last row it saw, so the tombstones of the rows it removed are
/// passed about once in all (the final full pass), not once per step
/// (before: ≈ PORTS² / (2 · 32) ≈ 140,000 skipped).
#[test]
fn a_resumed_walk_passes_each_tombstone_about_once() {
    let mut r1 = Region::new("r1");
    let network = r1.create_network_and_ports(PORTS);
    r1.state.reset_counts();
    r1.delete(network.name.as_str());
    let report = r1.run_work();

    assert_eq!(report.purged, PORTS + 1, "every port and the network are purged");
    assert!(r1.state.state.resources.is_empty(), "nothing is left");
    assert!(r1.state.state.work.is_empty(), "nothing is left queued");
    let skipped = r1.state.tombstones_skipped.get();
    assert!(
        skipped <= 2 * PORTS as u64,
        "{skipped} tombstones skipped for {PORTS} referrers: the walk restarts from the first row"
    );
}

/// Every purged resource asks for its pending attach (a cross-region
/// create not yet confirmed), nearly always of an empty table: the step
/// asks the state once whether any is pending and, told no, reads none.
/// On sled those reads of absent keys were a tenth of the writer's time in
/// a flat cascade of 1M (`docs/BENCHMARKS.md`, "Reads of empty tables").
/// With one cross-region create unconfirmed, the leaves' reads go to the
/// state again, and the one pending attach is still found and removed
/// when its resource is purged by a cascade.
#[test]
fn a_cascade_reads_no_pending_attach_while_none_is_pending() {
    let mut r1 = Region::new("r1");
    let network = r1.create_network_and_ports(PORTS);
    r1.state.reset_counts();
    r1.delete(network.name.as_str());
    assert_eq!(r1.run_work().purged, PORTS + 1, "every port and the network are purged");
    assert_eq!(
        r1.state.pending_attach_reads.get(),
        0,
        "pending attaches read with none pending"
    );

    // A port of a second network whose uplink is a network of r2 that r2
    // has not confirmed yet: CREATING, with a pending attach.
    let network = r1.create_network_and_ports(PORTS);
    let remote = RefRequest {
        name: "r2/network/m".to_owned(),
        uid: Some(Uid(uuid::Uuid::from_u128(0xfeed))),
    };
    let spec = ResourceSpec {
        name: r1.name("port", "crossing"),
        refs: [
            (
                "network".to_owned(),
                vec![RefRequest {
                    name: network.name.to_string(),
                    uid: None,
                }],
            ),
            ("uplink".to_owned(), vec![remote]),
        ]
        .into(),
        ..ResourceSpec::default()
    };
    let step = protocol::create(&r1.state, ctx!(r1), &mut r1.ids, vec![spec]).expect("a valid create");
    let crossing = step.value[0].uid;
    r1.state.apply(step.writes);
    assert!(
        r1.state.state.pending_attach.contains_key(&crossing),
        "its attach is pending"
    );

    r1.state.reset_counts();
    r1.delete(network.name.as_str());
    assert_eq!(r1.run_work().purged, PORTS + 1, "every port and the network are purged");
    assert!(r1.state.state.resources.is_empty(), "the crossing port is gone too");
    assert!(
        r1.state.pending_attach_reads.get() > 0,
        "no pending attach read with one pending"
    );
    assert!(
        r1.state.state.pending_attach.is_empty(),
        "the purged port's pending attach is left behind"
    );
}

/// A root whose referrers are all in another region waits for their
/// releases, which come in small batches (one per importer work step),
/// each waking it. It reads its rows again only when the count of rows
/// left says it may be done (before: every remaining row on every wake,
/// ≈ PORTS² / (2 · 16) ≈ 280,000 rows for 3,000 referrers).
#[test]
fn a_root_waiting_on_releases_does_not_reread_its_rows_on_every_wake() {
    let mut owner = Region::new("r1");
    let network = owner.create_network_and_ports(0);
    let target = RefTarget {
        name: network.name.clone(),
        uid: network.uid,
    };
    let attached: Vec<PeerBackRef> = (0..PORTS)
        .map(|i| PeerBackRef {
            target: target.clone(),
            referrer: RefTarget {
                name: ResourceName::parse(&format!("r2/port/p-{i:05}")).expect("a valid name"),
                uid: Uid(uuid::Uuid::from_u128(0xa000_0000 + i as u128)),
            },
            field: "network".to_owned(),
            generation: 1,
        })
        .collect();
    let step = peer::attach(&owner.state, owner.ctx(), "r2", attached.clone()).expect("the attach is valid");
    owner.state.apply(step.writes);

    owner.state.reset_counts();
    owner.delete(network.name.as_str());
    owner.run_work();
    let waiting = |owner: &Region| match owner.state.deletion(network.uid).expect("reads") {
        Some(DeletionRecord {
            status: DeletionStatus::Waiting { reason, .. },
            ..
        }) => reason,
        other => panic!("the network should wait for r2: {other:?}"),
    };
    assert_eq!(
        waiting(&owner),
        format!("waiting on region r2 to release {PORTS} reference(s)")
    );

    for (i, batch) in attached.chunks(16).enumerate() {
        owner.now = owner.now.plus_millis(1);
        let step = peer::release(&owner.state, owner.ctx(), Some("r2"), batch.to_vec()).expect("the release is valid");
        assert_eq!(step.value.released, batch.len());
        owner.state.apply(step.writes);
        owner.run_work();
        let left = PORTS - 16 * (i + 1).min(PORTS / 16);
        if left > 0 && i % 50 == 0 {
            // The count in the status follows the releases.
            assert_eq!(
                waiting(&owner),
                format!("waiting on region r2 to release {left} reference(s)")
            );
        }
    }
    // Every row released: the root's own part is done; it waits only for
    // the other region's part of the cascade to be confirmed finished.
    assert!(
        waiting(&owner).contains("its own region's part is done"),
        "{}",
        waiting(&owner)
    );
    let read = owner.state.rows_returned.get() + owner.state.tombstones_skipped.get();
    assert!(
        read <= 4 * PORTS as u64,
        "{read} rows and tombstones read for {PORTS} released referrers: each wake re-reads the rows"
    );
}

/// The importer's side: a remote network's deletion cascades to 3,000
/// local ports in steps of 32, and its walk resumes too.
#[test]
fn an_importers_walk_of_a_remote_deletion_resumes_too() {
    let mut importer = Region::new("r2");
    let target = RefTarget {
        name: ResourceName::parse("r1/network/n").expect("a valid name"),
        uid: Uid(uuid::Uuid::from_u128(0xbeef)),
    };
    // Ports referencing the remote network: created (CREATING until their
    // owner confirms), then settled as the owner accepted the attach.
    let specs: Vec<ResourceSpec> = (0..PORTS)
        .map(|i| ResourceSpec {
            name: importer.name("port", &format!("p-{i:05}")),
            refs: [(
                "network".to_owned(),
                vec![RefRequest {
                    name: target.name.to_string(),
                    uid: Some(target.uid),
                }],
            )]
            .into(),
            ..ResourceSpec::default()
        })
        .collect();
    let step = protocol::create(&importer.state, ctx!(importer), &mut importer.ids, specs).expect("valid creates");
    let created = step.value;
    importer.state.apply(step.writes);
    let members: Vec<(ResourceName, Uid, Vec<BackRefKey>)> = created
        .iter()
        .map(|r| {
            let key = BackRefKey {
                target: target.uid,
                referrer: r.uid,
                field: "network".to_owned(),
            };
            (r.name.clone(), r.uid, vec![key])
        })
        .collect();
    let step = peer::settle_batch(&importer.state, importer.ctx(), members, Ok(())).expect("settles");
    importer.state.apply(step.writes);
    assert!(created
        .iter()
        .all(|r| importer.state.resource(&r.name).ok().flatten().map(|r| r.state) == Some(ResourceState::Active)));

    importer.state.reset_counts();
    let event = RemoteEvent {
        revision: 1,
        event_type: EventType::Deleting,
        resource: target.clone(),
        operation: Some(OperationId(uuid::Uuid::from_u128(0x0fe4))),
        no_cascade: false,
        principal: Default::default(),
        retain_ms: 0,
    };
    let step = peer::apply_remote_events(&importer.state, importer.ctx(), "r1", vec![event]).expect("applies");
    importer.state.apply(step.writes);
    importer.run_work();
    assert!(importer.state.state.resources.is_empty(), "every local port is purged");
    assert!(importer.state.state.work.is_empty(), "nothing is left queued");
    assert_eq!(
        importer.state.state.pending_releases.len(),
        PORTS,
        "a release per port, for r1"
    );
    let skipped = importer.state.tombstones_skipped.get();
    assert!(
        skipped <= 2 * PORTS as u64,
        "{skipped} tombstones skipped for {PORTS} referrers: the importer's walk restarts from the first row"
    );
}
