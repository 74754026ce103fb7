//! Soft delete with a window (issue 29): a member whose deletion finishes
//! with a retention is buried DELETED instead of purged, its unset
//! referrers' old values are recorded with the outcome, and its expiry
//! purges it at `expire_time`.

use std::collections::BTreeMap;

use crate::auth::AllowAll;
use crate::invariants::{self, RegionView};
use crate::memory::MemoryState;
use crate::model::{EventType, OperationState, OutcomeAction, ResourceState, Timestamp};
use crate::name::{OperationId, RegionId, ResourceName, SequentialIds};
use crate::protocol::{self, Ctx, DeleteOutcome, DeleteRequest, Policy, RefRequest, ResourceSpec};
use crate::schema::Schema;
use crate::state::StateRead;
use crate::{CoreError, ErrorCode};

const HOUR: u64 = 3_600_000;

/// Projects are kept an hour by their kind; networks and ports only when a
/// delete asks. A port's network is `unset`, a network's project `cascade`.
const SCHEMA: &str = r#"
[kinds.project]
retain = "1h"
[kinds.network.refs.project]
kind = "project"
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
        Ctx {
            schema: &self.schema,
            region: &self.region,
            now: self.now,
            policy: &self.policy,
            authorizer: &AllowAll,
        }
    }

    fn create(&mut self, name: &str, refs: &[(&str, &str)]) -> Result<(), CoreError> {
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
            attributes: BTreeMap::new(),
            finalizers: Vec::new(),
        };
        let ctx = Ctx {
            schema: &self.schema,
            region: &self.region,
            now: self.now,
            policy: &self.policy,
            authorizer: &AllowAll,
        };
        let step = protocol::create(&self.state, ctx, &mut self.ids, vec![spec])?;
        self.state.apply(step.writes);
        Ok(())
    }

    fn delete(&mut self, name: &str, retain_ms: u64) -> Result<OperationId, CoreError> {
        let req = DeleteRequest {
            name: name.to_owned(),
            cascade: true,
            requested_by: "tester".to_owned(),
            retain_ms,
            ..DeleteRequest::default()
        };
        let ctx = Ctx {
            schema: &self.schema,
            region: &self.region,
            now: self.now,
            policy: &self.policy,
            authorizer: &AllowAll,
        };
        let step = protocol::delete(&self.state, ctx, &mut self.ids, req)?;
        self.state.apply(step.writes);
        match step.value {
            DeleteOutcome::Accepted(op) => Ok(op.id),
            other => panic!("not accepted: {other:?}"),
        }
    }

    /// Work steps at the current time until nothing due is left.
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

    fn violations(&self) -> Vec<String> {
        let views = [RegionView::from_state(&self.region, &self.state)];
        invariants::check_quiescent(&views, Some(&self.schema))
            .violations
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn events_of(&self, event_type: EventType) -> Vec<String> {
        self.state
            .events
            .iter()
            .filter(|e| e.event_type == event_type)
            .map(|e| e.resource.name.to_string())
            .collect()
    }
}

/// p ← n (cascade) ← x (unset); p ← leaf (cascade, nothing refers to it).
fn topology() -> World {
    let mut w = World::new();
    w.create("r1/project/p", &[]).unwrap();
    w.create("r1/network/n", &[("project", "r1/project/p")]).unwrap();
    w.create("r1/network/leaf", &[("project", "r1/project/p")]).unwrap();
    w.create("r1/port/x", &[("network", "r1/network/n")]).unwrap();
    w
}

#[test]
fn members_with_a_retention_are_buried_not_purged() {
    let mut w = topology();
    let deleted_at = w.now;
    let op = w.delete("r1/project/p", 60_000).unwrap();
    w.work();

    // Each member is kept DELETED for the longer of its kind's retention
    // and the delete's: the project an hour, the networks a minute. The
    // leaf (purged in the step that reached it without a retention) too.
    for (name, window) in [
        ("r1/project/p", HOUR),
        ("r1/network/n", 60_000),
        ("r1/network/leaf", 60_000),
    ] {
        let r = w.get(name).unwrap_or_else(|| panic!("{name} was purged"));
        assert_eq!(r.state, ResourceState::Deleted, "{name}");
        let soft = r.soft_deleted.unwrap();
        assert_eq!(soft.operation, op);
        assert_eq!(soft.delete_time, deleted_at);
        assert_eq!(soft.expire_time, deleted_at.plus_millis(window), "{name}");
        // Its references stay in the record (what an Undelete re-attaches),
        // but it holds no back-reference row anywhere.
        assert!(w
            .state
            .backrefs
            .values()
            .all(|b| b.referrer.uid != r.uid && b.target.uid != r.uid));
    }
    assert!(!w.get("r1/network/n").unwrap().refs.is_empty());

    // The unset referrer survives, and its outcome keeps what it held.
    let x = w.get("r1/port/x").unwrap();
    assert_eq!(x.state, ResourceState::Active);
    assert!(!x.refs.contains_key("network"));
    let outcome = w.state.outcome(op, &x.name).unwrap().unwrap();
    match outcome.action {
        OutcomeAction::Unset {
            field,
            undo: Some(undo),
        } => {
            assert_eq!(field, "network");
            assert_eq!(undo.old_targets.len(), 1);
            assert_eq!(undo.old_targets[0].name.as_str(), "r1/network/n");
            assert_eq!(
                undo.revision, x.revision,
                "the referrer's revision right after the unset"
            );
        }
        other => panic!("no undo record: {other:?}"),
    }

    // The operation counts them deleted and is done.
    let operation = w.state.operation(op).unwrap().unwrap();
    assert_eq!(operation.state, OperationState::Succeeded);
    assert_eq!(operation.progress.deleted, 3);
    assert_eq!(operation.progress.unset, 1);
    assert_eq!(operation.progress.pending, 0);

    // One SOFT_DELETED event each, no PURGED yet.
    let mut soft = w.events_of(EventType::SoftDeleted);
    soft.sort();
    assert_eq!(soft, ["r1/network/leaf", "r1/network/n", "r1/project/p"]);
    assert!(w.events_of(EventType::Purged).is_empty());

    assert_eq!(w.violations(), Vec::<String>::new());
}

#[test]
fn a_buried_name_stays_reserved_and_is_no_target() {
    let mut w = topology();
    w.delete("r1/project/p", 60_000).unwrap();
    w.work();

    // Create of the name: ALREADY_EXISTS, soft-deleted until its expiry.
    let e = w.create("r1/network/n", &[("project", "r1/project/q")]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::AlreadyExists);
    assert!(
        matches!(&e, CoreError::SoftDeleted { exists: true, expire_time, .. } if *expire_time == w.now.plus_millis(60_000)),
        "{e:?}"
    );
    assert!(e.to_string().contains("soft-deleted"), "{e}");

    // A reference to it: refused as to a DELETING target.
    let e = w.create("r1/port/y", &[("network", "r1/network/n")]).unwrap_err();
    assert!(matches!(e, CoreError::TargetDeleting { .. }), "{e:?}");

    // A delete or an update of it: not found (it reads as absent).
    let e = w.delete("r1/network/n", 0).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
}

#[test]
fn expiry_purges_each_member_when_its_window_ends() {
    let mut w = topology();
    let start = w.now;
    w.delete("r1/project/p", 60_000).unwrap();
    w.work();

    // A moment before the window ends: nothing moves.
    w.now = start.plus_millis(59_999);
    w.work();
    assert_eq!(w.get("r1/network/n").unwrap().state, ResourceState::Deleted);

    // At the networks' expiry they are purged for real (PURGED events); the
    // project, kept an hour by its kind, stays.
    w.now = start.plus_millis(60_000);
    w.work();
    assert!(w.get("r1/network/n").is_none());
    assert!(w.get("r1/network/leaf").is_none());
    assert_eq!(w.get("r1/project/p").unwrap().state, ResourceState::Deleted);
    let mut purged = w.events_of(EventType::Purged);
    purged.sort();
    assert_eq!(purged, ["r1/network/leaf", "r1/network/n"]);
    assert_eq!(w.violations(), Vec::<String>::new());

    // The name is free again; the project's is not, until its own expiry.
    w.create("r1/network/n", &[]).unwrap();
    assert_eq!(
        w.create("r1/project/p", &[]).unwrap_err().code(),
        ErrorCode::AlreadyExists
    );
    w.now = start.plus_millis(HOUR);
    w.work();
    assert!(w.get("r1/project/p").is_none());
    assert!(w.state.work.is_empty(), "no expiry left queued");
    w.create("r1/project/p", &[]).unwrap();
    assert_eq!(w.violations(), Vec::<String>::new());
}

#[test]
fn without_a_retention_members_are_purged_as_before() {
    let mut w = World::new();
    w.schema = Schema::from_toml(&SCHEMA.replace("retain = \"1h\"", "")).unwrap();
    w.create("r1/project/p", &[]).unwrap();
    w.create("r1/network/n", &[("project", "r1/project/p")]).unwrap();
    w.create("r1/port/x", &[("network", "r1/network/n")]).unwrap();
    let op = w.delete("r1/project/p", 0).unwrap();
    w.work();
    assert!(w.get("r1/project/p").is_none() && w.get("r1/network/n").is_none());
    assert!(w.events_of(EventType::SoftDeleted).is_empty());
    assert!(w.state.work.is_empty());
    // No undo record without a retention (nothing could be undeleted).
    let outcome = w
        .state
        .outcome(op, &ResourceName::parse("r1/port/x").unwrap())
        .unwrap()
        .unwrap();
    assert!(
        matches!(outcome.action, OutcomeAction::Unset { undo: None, .. }),
        "{outcome:?}"
    );
    assert_eq!(w.violations(), Vec::<String>::new());
}

#[test]
fn a_retention_above_the_maximum_is_refused() {
    let mut w = topology();
    w.policy.max_retention_ms = HOUR;
    let e = w.delete("r1/project/p", HOUR + 1).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.to_string().starts_with("retention_seconds: "), "{e}");
    assert_eq!(w.get("r1/project/p").unwrap().state, ResourceState::Active);
}

#[test]
fn the_checker_finds_a_buried_resource_without_its_expiry() {
    let mut w = topology();
    w.delete("r1/project/p", 60_000).unwrap();
    w.work();
    let uid = w.get("r1/network/n").unwrap().uid;
    w.state.work.remove(&uid);
    let found = w.violations();
    assert!(
        found
            .iter()
            .any(|v| v.contains("DELETED until") && v.contains("r1/network/n")),
        "{found:?}"
    );
}
