//! What the cross-region steps of a batch cost in reads of the state: the
//! importer's create of a batch, the owner's attach of it, the importer's
//! settle of it, and the owner's release of a page of rows. Counted, not
//! timed.
//!
//! Why these tests exist: P5 (a thousand ports in one region referencing a
//! network in another, per BatchCreate) read the network once per port in
//! the owner's attach, and every port four times (by uid, twice) plus its
//! target's tombstone once in the importer's settle; P2's owner read the
//! deletion record twice, the operation and the queue entry once per
//! released row (`docs/BENCHMARKS.md`, "Across regions: P5 and P2"); the
//! importer's create read the shared target's tombstone once per member
//! ("P5 (2026-11-27)"). Each
//! of these is now one read per step of what the batch shares, and one
//! read of each member.

#[macro_use]
mod support;

use std::cell::Cell;

use cascade_core::memory::MemoryState;
use cascade_core::model::PendingAttach;
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::protocol;
use cascade_core::state::{StateRead, WriteSet};
use cascade_core::*;

/// A [`MemoryState`] that counts the point reads the steps make, by table.
#[derive(Default)]
struct Counted {
    state: MemoryState,
    resources: Cell<u64>,
    names: Cell<u64>,
    tombstones: Cell<u64>,
    pending: Cell<u64>,
    deletions: Cell<u64>,
    operations: Cell<u64>,
    work: Cell<u64>,
}

fn bump(c: &Cell<u64>) {
    c.set(c.get() + 1);
}

impl Counted {
    fn apply(&mut self, w: WriteSet) {
        self.state.apply(w);
    }

    fn reset(&self) {
        for c in [
            &self.resources,
            &self.names,
            &self.tombstones,
            &self.pending,
            &self.deletions,
            &self.operations,
            &self.work,
        ] {
            c.set(0);
        }
    }
}

impl StateRead for Counted {
    forward_state_read!(state => backrefs, backref, outcome, due_work, next_revision, remote_deletions, pending_release, cursor, generation);

    fn resource(&self, name: &ResourceName) -> Result<Option<Resource>, error::StorageError> {
        bump(&self.resources);
        self.state.resource(name)
    }
    fn name_of(&self, uid: Uid) -> Result<Option<ResourceName>, error::StorageError> {
        bump(&self.names);
        self.state.name_of(uid)
    }
    fn deletion(&self, uid: Uid) -> Result<Option<DeletionRecord>, error::StorageError> {
        bump(&self.deletions);
        self.state.deletion(uid)
    }
    fn operation(&self, id: OperationId) -> Result<Option<Operation>, error::StorageError> {
        bump(&self.operations);
        self.state.operation(id)
    }
    fn work(&self, uid: Uid) -> Result<Option<WorkItem>, error::StorageError> {
        bump(&self.work);
        self.state.work(uid)
    }
    fn remote_deletion(&self, uid: Uid) -> Result<Option<RemoteDeletion>, error::StorageError> {
        bump(&self.tombstones);
        self.state.remote_deletion(uid)
    }
    fn pending_attach(&self, uid: Uid) -> Result<Option<PendingAttach>, error::StorageError> {
        bump(&self.pending);
        self.state.pending_attach(uid)
    }
}

/// Ports of one network, deleted with it.
const SCHEMA: &str = r#"
[kinds.network]
[kinds.port.refs.network]
kind = "network"
on_delete = "cascade"
required = true
"#;

/// One BatchCreate's worth.
const BATCH: usize = 1_000;

struct Region {
    state: Counted,
    schema: Schema,
    region: RegionId,
    ids: SequentialIds,
    policy: Policy,
    now: Timestamp,
}

impl Region {
    fn new(region: &str) -> Self {
        Region {
            state: Counted::default(),
            schema: Schema::from_toml(SCHEMA).expect("the schema loads"),
            region: RegionId::parse(region).expect("a valid region"),
            ids: SequentialIds::default(),
            policy: Policy::default(),
            now: Timestamp(1_000_000),
        }
    }

    fn create(&mut self, specs: Vec<ResourceSpec>) -> Vec<Resource> {
        let step = protocol::create(&self.state, ctx!(self), &mut self.ids, specs).expect("the creates are valid");
        self.state.apply(step.writes);
        step.value
    }

    /// A network of this region.
    fn network(&mut self) -> RefTarget {
        let created = self.create(vec![ResourceSpec {
            name: format!("{}/network/n", self.region),
            ..ResourceSpec::default()
        }]);
        RefTarget {
            name: created[0].name.clone(),
            uid: created[0].uid,
        }
    }
}

/// `BATCH` ports of `region` referencing `target`, as the importer's node
/// creates them (the target's uid resolved at its owner): CREATING.
fn ports_on(importer: &mut Region, target: &RefTarget) -> Vec<Resource> {
    let specs = (0..BATCH)
        .map(|i| ResourceSpec {
            name: format!("{}/port/p-{i:05}", importer.region),
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
    importer.create(specs)
}

/// What the importer attaches for its CREATING ports, as the node reads it.
fn entries_of(importer: &Region, ports: &[Resource]) -> Vec<PeerBackRef> {
    ports
        .iter()
        .flat_map(|p| {
            let pending = importer
                .state
                .state
                .pending_attach(p.uid)
                .expect("reads")
                .expect("pending");
            pending
                .keys
                .iter()
                .map(|k| PeerBackRef::from(importer.state.state.backref(k).expect("reads").expect("a mirror row")))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The owner's attach of a batch reads the target it names once, not once
/// per row (before: 1,000 reads and decodes of the network).
#[test]
fn an_attach_of_a_batch_reads_its_target_once() {
    let mut owner = Region::new("r0");
    let network = owner.network();
    let mut importer = Region::new("r1");
    let ports = ports_on(&mut importer, &network);
    assert!(ports.iter().all(|p| p.state == ResourceState::Creating));
    let entries = entries_of(&importer, &ports);

    owner.state.reset();
    let step = peer::attach(&owner.state, ctx!(owner), "r1", entries).expect("the attach is valid");
    assert_eq!(step.value, BATCH);
    assert_eq!(step.writes.backrefs.len(), BATCH, "one row per reference");
    let reads = owner.state.resources.get();
    assert_eq!(reads, 1, "{reads} reads of the target for one attach of {BATCH} rows");
}

/// An attach whose rows name the same uid under another name is refused:
/// the once-per-step check is of the name and the uid together.
#[test]
fn an_attach_naming_a_known_uid_under_another_name_is_refused() {
    let mut owner = Region::new("r0");
    let network = owner.network();
    let mut importer = Region::new("r1");
    let ports = ports_on(&mut importer, &network);
    let mut entries = entries_of(&importer, &ports[..2]);
    entries[1].target.name = ResourceName::parse("r0/network/other").expect("a valid name");
    let refused = peer::attach(&owner.state, ctx!(owner), "r1", entries);
    assert!(matches!(refused, Err(CoreError::TargetNotFound { .. })), "{refused:?}");
}

/// The importer's settle of a batch reads each member once, by its name,
/// and the tombstone of the target they share once (before: four reads of
/// each member, by uid through the uid index, and one tombstone read each).
#[test]
fn a_settle_of_a_batch_reads_each_member_once() {
    let mut owner = Region::new("r0");
    let network = owner.network();
    let mut importer = Region::new("r1");
    let ports = ports_on(&mut importer, &network);
    let members = ports
        .iter()
        .map(|p| {
            let keys = importer
                .state
                .state
                .pending_attach(p.uid)
                .expect("reads")
                .expect("pending")
                .keys;
            (p.name.clone(), p.uid, keys)
        })
        .collect();

    importer.state.reset();
    let step = peer::settle_batch(&importer.state, ctx!(importer), members, Ok(())).expect("the settle runs");
    let settled = step.value.expect("every member is confirmed");
    assert!(settled.iter().all(|r| r.state == ResourceState::Active));
    importer.state.apply(step.writes);
    assert!(
        importer.state.state.pending_attach.is_empty(),
        "nothing is left pending"
    );

    let (resources, names, tombstones) = (
        importer.state.resources.get(),
        importer.state.names.get(),
        importer.state.tombstones.get(),
    );
    assert!(
        resources <= BATCH as u64 && names == 0 && tombstones == 1,
        "settling {BATCH} members read {resources} resources, {names} uid index entries, {tombstones} tombstones"
    );
}

/// The keys a batch's create recorded as pending for each member.
fn pending_members(importer: &Region, ports: &[Resource]) -> Vec<(ResourceName, Uid, Vec<BackRefKey>)> {
    ports
        .iter()
        .map(|p| {
            let keys = importer
                .state
                .state
                .pending_attach(p.uid)
                .expect("reads")
                .expect("pending")
                .keys;
            (p.name.clone(), p.uid, keys)
        })
        .collect()
}

/// A settle that attached every remote reference of its members removes
/// their pending rows without reading them: whatever a row still holds is
/// among what was attached (before: one read of each member's row, a fifth
/// of the settle's instructions in P5's profile).
#[test]
fn a_settle_that_attached_every_reference_reads_no_pending_row() {
    let mut owner = Region::new("r0");
    let network = owner.network();
    let mut importer = Region::new("r1");
    let ports = ports_on(&mut importer, &network);
    let members = pending_members(&importer, &ports);

    importer.state.reset();
    let step = peer::settle_batch(&importer.state, ctx!(importer), members, Ok(())).expect("the settle runs");
    let settled = step.value.expect("every member is confirmed");
    assert!(settled.iter().all(|r| r.state == ResourceState::Active));
    let pending = importer.state.pending.get();
    assert_eq!(pending, 0, "settling {BATCH} members read {pending} pending rows");
    importer.state.apply(step.writes);
    assert!(
        importer.state.state.pending_attach.is_empty(),
        "nothing is left pending"
    );
}

/// A member whose settle attached only part of its remote references (here
/// none) stays CREATING with its row: what is left is still to attach.
#[test]
fn a_settle_that_attached_part_of_a_members_references_leaves_it_pending() {
    let mut owner = Region::new("r0");
    let network = owner.network();
    let mut importer = Region::new("r1");
    let ports = ports_on(&mut importer, &network);
    let mut members = pending_members(&importer, &ports[..2]);
    let left = members[1].2.clone();
    members[1].2.clear();

    let step = peer::settle_batch(&importer.state, ctx!(importer), members, Ok(())).expect("the settle runs");
    let settled = step.value.expect("nothing was refused");
    assert_eq!(settled[0].state, ResourceState::Active);
    assert_eq!(settled[1].state, ResourceState::Creating);
    importer.state.apply(step.writes);
    let row = importer
        .state
        .state
        .pending_attach(ports[1].uid)
        .expect("reads")
        .expect("the second member is still pending");
    assert_eq!(row.keys, left, "its reference is still to attach");
    assert!(importer
        .state
        .state
        .pending_attach(ports[0].uid)
        .expect("reads")
        .is_none());
}

/// A settle whose target was reported DELETING meanwhile still removes
/// the whole batch (the once-per-target tombstone read decides for all).
#[test]
fn a_settle_after_the_target_was_reported_deleting_removes_the_batch() {
    let mut owner = Region::new("r0");
    let network = owner.network();
    let mut importer = Region::new("r1");
    let ports = ports_on(&mut importer, &network);
    let members: Vec<_> = ports
        .iter()
        .map(|p| {
            let keys = importer
                .state
                .state
                .pending_attach(p.uid)
                .expect("reads")
                .expect("pending")
                .keys;
            (p.name.clone(), p.uid, keys)
        })
        .collect();
    tombstone_of(&mut importer, &network);
    let step = peer::settle_batch(&importer.state, ctx!(importer), members, Ok(())).expect("the settle runs");
    assert!(
        matches!(step.value, Err(CoreError::TargetDeleting { .. })),
        "{:?}",
        step.value
    );
    importer.state.apply(step.writes);
    assert!(
        ports
            .iter()
            .all(|p| importer.state.state.resource(&p.name).expect("reads").is_none()),
        "every member of the batch is removed"
    );
}

/// A tombstone of `target` in `importer`, as the owner's DELETING event
/// leaves it before its walk reaches the referrers.
fn tombstone_of(importer: &mut Region, target: &RefTarget) {
    let mut tombstone = WriteSet::default();
    tombstone.remote_deletions.insert(
        target.uid,
        Some(RemoteDeletion {
            target: target.clone(),
            operation: OperationId(uuid::Uuid::from_u128(7)),
            seen_at: importer.now,
            purged: false,
            no_cascade: false,
            forced: false,
            principal: Default::default(),
            retain_ms: 0,
        }),
    );
    importer.state.apply(tombstone);
}

/// The importer's create of a batch asks whether the remote target the
/// members share was reported DELETING once, not once per member (before:
/// 1,000 tombstone reads for 1,000 ports on one network; P5's profile,
/// docs/BENCHMARKS.md "P5 (2026-11-27)").
#[test]
fn a_create_of_a_batch_reads_its_remote_targets_tombstone_once() {
    let mut owner = Region::new("r0");
    let network = owner.network();
    let mut importer = Region::new("r1");
    importer.state.reset();
    let ports = ports_on(&mut importer, &network);
    assert_eq!(ports.len(), BATCH);
    assert!(ports.iter().all(|p| p.state == ResourceState::Creating));
    let tombstones = importer.state.tombstones.get();
    assert_eq!(
        tombstones, 1,
        "creating {BATCH} ports on one remote network read {tombstones} tombstones"
    );
}

/// The once-per-step answer still refuses: a batch whose remote target was
/// reported DELETING is refused whole, naming the first member's reference
/// as the request names it.
#[test]
fn a_create_of_a_batch_on_a_target_reported_deleting_is_refused_naming_the_first_member() {
    let mut owner = Region::new("r0");
    let network = owner.network();
    let mut importer = Region::new("r1");
    tombstone_of(&mut importer, &network);
    let specs: Vec<ResourceSpec> = (0..3)
        .map(|i| ResourceSpec {
            name: format!("r1/port/p-{i}"),
            refs: [(
                "network".to_owned(),
                vec![RefRequest {
                    name: network.name.to_string(),
                    uid: Some(network.uid),
                }],
            )]
            .into(),
            ..ResourceSpec::default()
        })
        .collect();
    let refused = protocol::create(&importer.state, ctx!(importer), &mut importer.ids, specs);
    match refused {
        Err(CoreError::TargetDeleting { field, target }) => {
            assert_eq!(field, "resources[0].refs.network");
            assert_eq!(target, network.name);
        }
        other => panic!("expected TargetDeleting, got {other:?}"),
    }
}

/// The owner's release of a page of rows of one deleting target reads the
/// target's deletion record, its operation and its queue entry a bounded
/// number of times, not once or twice per row (before: 2 deletion reads, 1
/// operation read and 2 queue-entry reads per row).
#[test]
fn a_release_of_a_page_reads_the_targets_records_once() {
    let mut owner = Region::new("r0");
    let network = owner.network();
    let mut importer = Region::new("r1");
    let ports = ports_on(&mut importer, &network);
    let entries = entries_of(&importer, &ports);
    let step = peer::attach(&owner.state, ctx!(owner), "r1", entries.clone()).expect("the attach is valid");
    owner.state.apply(step.writes);
    let req = DeleteRequest {
        name: network.name.to_string(),
        cascade: true,
        dry_run: false,
        allow_missing: false,
        etag: None,
        uid: None,
        requested_by: "peer-reads test".to_owned(),
        orphan: false,
        remote_kept: Default::default(),
        principal: Default::default(),
        retain_ms: 0,
        bounds: Default::default(),
        operation_id: None,
    };
    let step = protocol::delete(&owner.state, ctx!(owner), &mut owner.ids, req).expect("the delete is accepted");
    owner.state.apply(step.writes);
    // The walk counts the remote rows, then waits for their releases.
    for _ in 0..100 {
        let step = protocol::process_work(&owner.state, ctx!(owner)).expect("a work step");
        let done = step.value.items == 0 && !step.value.more;
        owner.state.apply(step.writes);
        if done {
            break;
        }
    }

    let page: Vec<PeerBackRef> = entries[..500]
        .iter()
        .map(|e| PeerBackRef {
            generation: e.generation + 1_000_000,
            ..e.clone()
        })
        .collect();
    owner.state.reset();
    let step = peer::release(&owner.state, ctx!(owner), Some("r1"), page).expect("the release is valid");
    assert_eq!(step.value.released, 500);
    let op = owner
        .state
        .state
        .deletion(network.uid)
        .expect("reads")
        .expect("the network is deleting")
        .operation;
    let (deletions, operations, work) = (
        owner.state.deletions.get(),
        owner.state.operations.get(),
        owner.state.work.get(),
    );
    assert!(
        deletions <= 2 && operations <= 1 && work <= 1,
        "releasing 500 rows read {deletions} deletion records, {operations} operations, {work} queue entries"
    );
    owner.state.apply(step.writes);
    let reached = &owner
        .state
        .state
        .operation(op)
        .expect("reads")
        .expect("the operation")
        .reached;
    assert!(
        reached.iter().any(|r| r == "r1"),
        "the operation notes the region that released"
    );
    let work = owner.state.state.work(network.uid).expect("reads").expect("queued");
    assert_eq!(work.next_attempt_at, owner.now, "the release woke the deletion");
}
