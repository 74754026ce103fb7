//! Unit tests of the cross-region protocol over in-memory regions.

use super::*;
use crate::memory::MemoryState;
use crate::model::{EventType, RemoteEvent, Resource, ResourceState};
use crate::{OperationId, Policy, RegionId, Schema, SequentialIds, Timestamp, Uid};

fn target(name: &str, ids: &mut SequentialIds) -> RefTarget {
    use crate::IdSource;
    RefTarget {
        name: ResourceName::parse(name).unwrap(),
        uid: Uid(ids.next_uuid()),
    }
}

#[test]
fn resync_replaces_missed_events_and_drops_purged_tombstones() {
    let schema = Schema::from_toml(crate::schema::EXAMPLE_SCHEMA).unwrap();
    let region = RegionId::parse("rb").unwrap();
    let policy = Policy::default();
    let ctx = Ctx {
        schema: &schema,
        region: &region,
        now: Timestamp(10),
        policy: &policy,
        authorizer: &crate::auth::AllowAll,
    };
    let mut ids = SequentialIds::default();
    let mut state = MemoryState::default();
    let op = OperationId(uuid::Uuid::nil());
    let purged_meanwhile = target("ra/network/old", &mut ids);
    let still_deleting = target("ra/network/n", &mut ids);
    let other_region = target("rc/network/x", &mut ids);
    let events = [(&purged_meanwhile, "ra"), (&other_region, "rc")].map(|(t, from)| {
        apply_remote_events(
            &state,
            ctx,
            from,
            vec![RemoteEvent {
                revision: 5,
                event_type: EventType::Deleting,
                resource: t.clone(),
                operation: Some(op),
                no_cascade: false,
                principal: Default::default(),
                retain_ms: 0,
            }],
        )
        .unwrap()
        .writes
    });
    for w in events {
        state.apply(w);
    }
    assert_eq!(state.remote_deletions.len(), 2);

    let listing = vec![RemoteDeleting {
        target: still_deleting.clone(),
        operation: op,
        no_cascade: false,
        forced: false,
        principal: Default::default(),
        retain_ms: 0,
    }];
    let step = resync(&state, ctx, "ra", listing, 40).unwrap();
    assert_eq!(step.value, 1);
    state.apply(step.writes);
    assert!(state.remote_deletions.contains_key(&still_deleting.uid));
    assert!(
        !state.remote_deletions.contains_key(&purged_meanwhile.uid),
        "purged while we were away"
    );
    assert!(
        state.remote_deletions.contains_key(&other_region.uid),
        "other regions untouched"
    );
    assert!(
        state.work.contains_key(&still_deleting.uid),
        "local referrers get processed"
    );
    assert_eq!(state.cursors["ra"], 40);

    // Events at or below the new cursor are not applied again.
    let step = apply_remote_events(
        &state,
        ctx,
        "ra",
        vec![RemoteEvent {
            revision: 40,
            event_type: EventType::Purged,
            resource: still_deleting.clone(),
            operation: Some(op),
            no_cascade: false,
            principal: Default::default(),
            retain_ms: 0,
        }],
    )
    .unwrap();
    assert_eq!(step.value, AppliedEvents::default());
}

/// What the node may commit without a flush of its own: a batch of events
/// that only moves the cursor (a PURGED of a resource nothing here
/// references) or removes a tombstone its walk is done with claims
/// nothing; one that starts a walk does.
#[test]
fn only_a_batch_that_changes_what_others_may_read_needs_a_flush() {
    let schema = Schema::from_toml(crate::schema::EXAMPLE_SCHEMA).unwrap();
    let region = RegionId::parse("rb").unwrap();
    let policy = Policy::default();
    let ctx = Ctx {
        schema: &schema,
        region: &region,
        now: Timestamp(10),
        policy: &policy,
        authorizer: &crate::auth::AllowAll,
    };
    let mut ids = SequentialIds::default();
    let mut state = MemoryState::default();
    let op = OperationId(uuid::Uuid::nil());
    let unreferenced = target("ra/project/leaf", &mut ids);
    let network = target("ra/network/n", &mut ids);
    let event = |revision, event_type, resource: &RefTarget| RemoteEvent {
        revision,
        event_type,
        resource: resource.clone(),
        operation: Some(op),
        no_cascade: false,
        principal: Default::default(),
        retain_ms: 0,
    };

    let step = apply_remote_events(&state, ctx, "ra", vec![event(3, EventType::Purged, &unreferenced)]).unwrap();
    assert_eq!(
        step.value,
        AppliedEvents {
            applied: 0,
            needs_flush: false
        }
    );
    assert!(
        step.writes.remote_deletions.is_empty() && step.writes.work.is_empty(),
        "no blind removals"
    );
    state.apply(step.writes);
    assert_eq!(state.cursors["ra"], 3);

    let step = apply_remote_events(&state, ctx, "ra", vec![event(4, EventType::Deleting, &network)]).unwrap();
    assert_eq!(
        step.value,
        AppliedEvents {
            applied: 1,
            needs_flush: true
        }
    );
    state.apply(step.writes);

    // Nothing here referenced it: its walk ended in the same step, and the
    // PURGED only drops the tombstone.
    let step = apply_remote_events(&state, ctx, "ra", vec![event(5, EventType::Purged, &network)]).unwrap();
    assert_eq!(
        step.value,
        AppliedEvents {
            applied: 1,
            needs_flush: false
        }
    );
    state.apply(step.writes);
    assert!(state.remote_deletions.is_empty());
    assert_eq!(state.cursors["ra"], 5);
}

struct Region {
    schema: Schema,
    region: RegionId,
    policy: Policy,
    ids: SequentialIds,
    state: MemoryState,
    now: u64,
}

impl Region {
    fn new(name: &str) -> Self {
        Self {
            schema: Schema::from_toml(crate::schema::EXAMPLE_SCHEMA).unwrap(),
            region: RegionId::parse(name).unwrap(),
            policy: Policy::default(),
            ids: SequentialIds::default(),
            state: MemoryState::default(),
            now: 1,
        }
    }
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            schema: &self.schema,
            region: &self.region,
            now: Timestamp(self.now),
            policy: &self.policy,
            authorizer: &crate::auth::AllowAll,
        }
    }
    fn create(&mut self, name: &str, refs: &[(&str, &RefTarget)]) -> Resource {
        let spec = spec_of(name, refs);
        let ctx = Ctx {
            schema: &self.schema,
            region: &self.region,
            now: Timestamp(self.now),
            policy: &self.policy,
            authorizer: &crate::auth::AllowAll,
        };
        let step = crate::protocol::create(&self.state, ctx, &mut self.ids, vec![spec]).unwrap();
        let r = step.value[0].clone();
        self.state.apply(step.writes);
        r
    }
    fn settle(&mut self, r: &Resource, attached: Result<(), CoreError>) -> Result<Resource, CoreError> {
        let keys = self.state.pending_attach[&r.uid].keys.clone();
        let step = settle(&self.state, self.ctx(), &r.name, r.uid, &keys, attached).unwrap();
        self.state.apply(step.writes);
        step.value
    }
    fn run_work(&mut self) {
        for _ in 0..100 {
            self.now += 1;
            let step = crate::protocol::process_work(&self.state, self.ctx()).unwrap();
            let idle = step.value.items == 0 && !step.value.more;
            self.state.apply(step.writes);
            if idle {
                return;
            }
        }
        panic!("work did not settle");
    }
}

/// A spec with one target per reference field, given by name and uid.
fn spec_of(name: &str, refs: &[(&str, &RefTarget)]) -> crate::protocol::ResourceSpec {
    crate::protocol::ResourceSpec {
        name: name.into(),
        refs: refs
            .iter()
            .map(|(f, t)| {
                (
                    f.to_string(),
                    vec![crate::protocol::RefRequest {
                        name: t.name.to_string(),
                        uid: Some(t.uid),
                    }],
                )
            })
            .collect(),
        ..Default::default()
    }
}

fn remote(name: &str, n: u128) -> RefTarget {
    RefTarget {
        name: ResourceName::parse(name).unwrap(),
        uid: Uid(uuid::Uuid::from_u128(n)),
    }
}

#[test]
fn purged_in_the_same_batch_as_deleting_still_cascades_local_referrers() {
    let mut rb = Region::new("rb");
    let net = remote("ra/network/n", 7);
    let port = rb.create("rb/port/p", &[("network", &net)]);
    assert_eq!(port.state, ResourceState::Creating);
    let port = rb.settle(&port, Ok(())).unwrap();
    assert_eq!(port.state, ResourceState::Active);
    let op = OperationId(uuid::Uuid::from_u128(99));
    // A reconnect replays both events at once.
    let events = [(1, EventType::Deleting), (2, EventType::Purged)]
        .map(|(revision, event_type)| RemoteEvent {
            revision,
            event_type,
            resource: net.clone(),
            operation: Some(op),
            no_cascade: false,
            principal: Default::default(),
            retain_ms: 0,
        })
        .to_vec();
    let step = apply_remote_events(&rb.state, rb.ctx(), "ra", events).unwrap();
    rb.state.apply(step.writes);
    rb.run_work();
    assert!(
        !rb.state.resources.values().any(|r| r.state == ResourceState::Active),
        "the port was cascaded"
    );
    assert!(rb.state.backrefs.is_empty(), "mirror row released");
    assert!(rb.state.remote_deletions.is_empty(), "tombstone gone after the walk");
    assert_eq!(rb.state.pending_releases.len(), 1, "release queued for the owner");
}

/// Simulation seed 869: a router's gateway (block) attach never reached
/// the owner, which deleted and purged the network; the importer's walk
/// ran (leaving the block row) before PURGED arrived, and the tombstone
/// was kept for a walk that would never come again.
#[test]
fn purged_after_the_walk_drops_the_tombstone_though_a_block_row_remains() {
    let mut rb = Region::new("rb");
    let net = remote("ra/network/n", 7);
    let project = rb.create("rb/project/p", &[]);
    let project = RefTarget {
        name: project.name,
        uid: project.uid,
    };
    let router = rb.create("rb/router/r", &[("project", &project), ("gateway_network", &net)]);
    assert_eq!(router.state, ResourceState::Creating, "attach not answered");
    let op = OperationId(uuid::Uuid::from_u128(99));
    let event = |revision, event_type| RemoteEvent {
        revision,
        event_type,
        resource: net.clone(),
        operation: Some(op),
        no_cascade: false,
        principal: Default::default(),
        retain_ms: 0,
    };
    let step = apply_remote_events(&rb.state, rb.ctx(), "ra", vec![event(1, EventType::Deleting)]).unwrap();
    rb.state.apply(step.writes);
    rb.run_work();
    assert!(!rb.state.backrefs.is_empty(), "the walk leaves the block row");
    let step = apply_remote_events(&rb.state, rb.ctx(), "ra", vec![event(2, EventType::Purged)]).unwrap();
    rb.state.apply(step.writes);
    rb.run_work();
    assert!(
        rb.state.remote_deletions.is_empty(),
        "tombstone gone: the walk already ran"
    );
    // The create is then refused by the owner and removed.
    let refused = rb.settle(&router, Err(CoreError::NotFound(net.name.clone())));
    assert!(refused.is_err());
    assert!(rb.state.backrefs.is_empty());
    assert!(rb.state.remote_deletions.is_empty());
}

#[test]
fn late_release_of_an_earlier_incarnation_does_not_remove_a_newer_attach() {
    let mut ra = Region::new("ra");
    let project = ra.create("ra/project/p", &[]);
    let net = ra.create(
        "ra/network/n",
        &[(
            "project",
            &RefTarget {
                name: project.name.clone(),
                uid: project.uid,
            },
        )],
    );
    let entry = |generation| PeerBackRef {
        target: RefTarget {
            name: net.name.clone(),
            uid: net.uid,
        },
        referrer: remote("rb/port/p", 5),
        field: "network".into(),
        generation,
    };
    let step = attach(&ra.state, ra.ctx(), "rb", vec![entry(5)]).unwrap();
    ra.state.apply(step.writes);
    let step = release(&ra.state, ra.ctx(), Some("rb"), vec![entry(3)]).unwrap();
    assert_eq!(step.value.stale, 1);
    ra.state.apply(step.writes);
    assert_eq!(ra.state.backrefs.len(), 2, "project row + the remote row still there");
    // A region may not release another region's referrers.
    let step = release(&ra.state, ra.ctx(), Some("rc"), vec![entry(9)]).unwrap();
    assert_eq!(step.value.foreign, 1);
    let step = release(&ra.state, ra.ctx(), Some("rb"), vec![entry(5)]).unwrap();
    assert_eq!(step.value.released, 1);
    ra.state.apply(step.writes);
    assert_eq!(ra.state.backrefs.len(), 1);
}

#[test]
fn update_commits_a_cross_region_reference_before_attaching_and_takes_it_back_when_refused() {
    let mut rb = Region::new("rb");
    let project = rb.create("rb/project/p", &[]);
    let project = RefTarget {
        name: project.name,
        uid: project.uid,
    };
    let fip = rb.create("rb/floating_ip/f", &[("project", &project)]);
    let port = remote("ra/port/x", 11);
    let spec = spec_of(fip.name.as_str(), &[("project", &project), ("port", &port)]);
    let step = crate::protocol::update(&rb.state, rb.ctx(), spec, None).unwrap();
    let updated = step.value.clone();
    rb.state.apply(step.writes);
    // Committed (so the owner's check finds it standing) and pending.
    assert_eq!(updated.refs["port"][0].uid, port.uid);
    let key = BackRefKey {
        target: port.uid,
        referrer: fip.uid,
        field: "port".into(),
    };
    assert_eq!(standing(&rb.state, std::slice::from_ref(&key)).unwrap(), vec![true]);
    assert!(
        rb.state.backrefs[&key].generation > 0,
        "mirror row has a writer-assigned generation"
    );
    assert_eq!(rb.state.pending_attach[&fip.uid].keys, vec![key.clone()]);

    let refused = CoreError::AttachRefused {
        region: "ra".into(),
        reason: "ra/port/x is being deleted".into(),
    };
    let answer = rb.settle(&updated, Err(refused));
    assert!(matches!(answer, Err(CoreError::AttachRefused { .. })), "{answer:?}");
    let now = &rb.state.resources[&fip.name];
    assert!(!now.refs.contains_key("port"), "taken back: {:?}", now.refs);
    assert!(rb.state.pending_attach.is_empty());
    assert!(!rb.state.backrefs.contains_key(&key));
    assert_eq!(
        rb.state.pending_releases.len(),
        1,
        "whatever landed at the owner is released"
    );
    let last = rb.state.events.last().unwrap();
    assert!(last.message.contains("taken back"), "{}", last.message);
}

/// Issue 31: a referrer's region that runs a newer schema than the owner
/// (a rolling change) asks it to attach a kind or field the owner does not
/// know. The owner refuses naming itself and what it lacks, as a
/// precondition a reload settles, and writes nothing; a reference its
/// schema knows but that is malformed stays INVALID_ARGUMENT.
#[test]
fn an_attach_of_a_kind_or_field_the_owner_does_not_know_is_refused_as_schema_unknown_and_writes_nothing() {
    let mut ra = Region::new("ra");
    let project = ra.create("ra/project/p", &[]);
    let project = RefTarget {
        name: project.name.clone(),
        uid: project.uid,
    };
    let rows_before = ra.state.backrefs.len();
    let entry = |referrer: &str, field: &str| PeerBackRef {
        target: project.clone(),
        referrer: remote(referrer, 5),
        field: field.into(),
        generation: 1,
    };
    let cases = [
        (entry("rb/volume/v", "project"), "kind \"volume\""),
        (entry("rb/network/n", "owner"), "reference field \"network.owner\""),
    ];
    for (e, what) in cases {
        let refused = attach(&ra.state, ra.ctx(), "rb", vec![entry("rb/network/ok", "project"), e])
            .expect_err("the owner's schema lacks it");
        assert_eq!(refused.code(), crate::ErrorCode::FailedPrecondition, "{refused}");
        assert_eq!(
            refused.to_string(),
            format!("region \"ra\" does not know {what} yet; reload its schema, then retry")
        );
    }
    assert_eq!(ra.state.backrefs.len(), rows_before, "all or none: nothing attached");
    // A peer's Lookup of a volume of ra is refused the same way.
    let lookup = known_kind(&ra.schema, &ra.region, "volume").expect_err("no volume can be in ra");
    assert_eq!(lookup.code(), crate::ErrorCode::FailedPrecondition, "{lookup}");
    assert!(
        lookup
            .to_string()
            .starts_with("region \"ra\" does not know kind \"volume\" yet"),
        "{lookup}"
    );
    assert_eq!(known_kind(&ra.schema, &ra.region, "project"), Ok(()));

    // Known to the owner, but not a reference to a project: the request is wrong.
    let wrong = attach(&ra.state, ra.ctx(), "rb", vec![entry("rb/port/p", "network")]).expect_err("wrong target kind");
    assert_eq!(wrong.code(), crate::ErrorCode::InvalidArgument, "{wrong}");

    // Once the owner runs a schema with the kind, the same attach is taken.
    ra.schema = Schema::from_toml(&format!(
        "{}\n[kinds.volume.refs.project]\nkind = \"project\"\non_delete = \"cascade\"\n",
        crate::schema::EXAMPLE_SCHEMA
    ))
    .unwrap();
    let step = attach(&ra.state, ra.ctx(), "rb", vec![entry("rb/volume/v", "project")]).expect("known now");
    assert_eq!(step.value, 1);
    ra.state.apply(step.writes);
    assert_eq!(ra.state.backrefs.len(), rows_before + 1);
}

/// Issue 31, Build 3's second half, and why it needs no hold: with attach
/// refusing a kind or field the owner does not know, the one way a
/// deletion can reach a region whose schema lacks a kind is an owner that
/// reloaded *back* to a schema without it while it holds the rows of
/// another region's referrers of that kind (its reload check counts its
/// own resources, and it stores none of that kind). The walk does not ask
/// its schema about them: each row carries the `on_delete` it was attached
/// with, and the referrer's own region (whose schema must keep the kind
/// while it stores resources of it) deletes or unsets it. So the member is
/// neither failed nor held: it waits for the release and then finishes.
#[test]
fn an_owner_whose_schema_dropped_a_remote_referrers_kind_still_walks_its_rows_and_finishes() {
    let volumes = Schema::from_toml(&format!(
        "{}\n[kinds.volume.refs.project]\nkind = \"project\"\non_delete = \"cascade\"\n",
        crate::schema::EXAMPLE_SCHEMA
    ))
    .unwrap();
    let mut ra = Region::new("ra");
    ra.schema = volumes;
    let project = ra.create("ra/project/p", &[]);
    let project = RefTarget {
        name: project.name.clone(),
        uid: project.uid,
    };
    let row = PeerBackRef {
        target: project.clone(),
        referrer: remote("rb/volume/v", 5),
        field: "project".into(),
        generation: 1,
    };
    let step = attach(&ra.state, ra.ctx(), "rb", vec![row.clone()]).expect("ra knows volumes");
    ra.state.apply(step.writes);

    // Reloaded back to a schema without volumes.
    ra.schema = Schema::from_toml(crate::schema::EXAMPLE_SCHEMA).unwrap();
    assert!(ra.schema.kind("volume").is_none());
    let req = crate::protocol::DeleteRequest {
        name: project.name.to_string(),
        cascade: true,
        requested_by: "tester".into(),
        ..Default::default()
    };
    let ctx = Ctx {
        schema: &ra.schema,
        region: &ra.region,
        now: Timestamp(ra.now),
        policy: &ra.policy,
        authorizer: &crate::auth::AllowAll,
    };
    let step = crate::protocol::delete(&ra.state, ctx, &mut ra.ids, req).expect("the delete is accepted");
    ra.state.apply(step.writes);
    ra.run_work();
    let status = &ra.state.deletions[&project.uid].status;
    assert!(
        matches!(status, crate::model::DeletionStatus::Waiting { regions, .. } if regions == &["rb".to_owned()]),
        "waits for rb's release, neither held nor failed: {status:?}"
    );

    // rb cascades its volume and releases the row; the node's collect of
    // the operation's parts confirms the closure: the deletion finishes.
    let step = release(&ra.state, ra.ctx(), Some("rb"), vec![row]).unwrap();
    assert_eq!(step.value.released, 1);
    ra.state.apply(step.writes);
    ra.run_work();
    let op = ra.state.operations.values().next().expect("the operation").clone();
    let step = crate::protocol::confirm_remote_closure(&ra.state, ra.ctx(), op.id, op.changes).unwrap();
    assert!(step.value, "the closure is confirmed");
    ra.state.apply(step.writes);
    ra.run_work();
    assert!(
        !ra.state.deletions.contains_key(&project.uid),
        "finished: {:?}",
        ra.state.deletions.get(&project.uid)
    );
    assert!(!ra.state.resources.contains_key(&project.name), "purged");
}
