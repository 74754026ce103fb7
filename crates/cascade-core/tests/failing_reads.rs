//! A cascade's work step over a state whose reads fail for some rows and
//! not others: it finishes or answers a storage error, and never panics.
//!
//! Why this test exists: sled, once a write failed on a full disk, refuses
//! every read that must first split a leaf (a write to its log) and still
//! serves the others. A network's walk read each subnet by name, and a
//! debug build's check then read it by uid too, took the refused read for
//! a disagreement between the two and panicked the node's writer, in every
//! incarnation the supervisor started (`tests/faults/disk_full.rs`, on
//! sled). The step itself does not read by uid there: the check must not
//! turn the store's trouble into a panic.

#[macro_use]
mod support;

use std::collections::BTreeSet;

use cascade_core::memory::MemoryState;
use cascade_core::protocol::{self, DeleteRequest};
use cascade_core::state::StateRead;
use cascade_core::*;

/// A [`MemoryState`] that refuses the uid index's reads of `refused`.
#[derive(Default)]
struct RefusesUids {
    state: MemoryState,
    refused: BTreeSet<Uid>,
}

impl StateRead for RefusesUids {
    forward_state_read!(state => resource, backrefs, backref, deletion, operation, work, outcome, due_work, next_revision, remote_deletion, pending_attach, remote_deletions, pending_release, cursor, generation);

    fn name_of(&self, uid: Uid) -> Result<Option<ResourceName>, error::StorageError> {
        if self.refused.contains(&uid) {
            return Err(error::StorageError("No space left on device (simulated)".to_owned()));
        }
        self.state.name_of(uid)
    }
}

const SCHEMA: &str = r#"
[kinds.network]
[kinds.subnet.refs.network]
kind = "network"
on_delete = "cascade"
required = true
"#;

#[test]
fn a_walk_over_referrers_whose_uids_cannot_be_read_finishes_or_fails_without_a_panic() {
    let schema = Schema::from_toml(SCHEMA).expect("the schema loads");
    let region = RegionId::parse("r1").expect("a valid region");
    let policy = Policy {
        batch_budget: 4,
        ..Policy::default()
    };
    let ctx = Ctx {
        schema: &schema,
        region: &region,
        now: Timestamp(1_000_000),
        policy: &policy,
        authorizer: &cascade_core::auth::AllowAll,
    };
    let mut ids = SequentialIds::default();
    let mut state = RefusesUids::default();
    let mut specs = vec![ResourceSpec {
        name: "r1/network/n".to_owned(),
        ..ResourceSpec::default()
    }];
    specs.extend((0..10).map(|i| {
        ResourceSpec {
            name: format!("r1/subnet/s{i}"),
            refs: [(
                "network".to_owned(),
                vec![RefRequest {
                    name: "r1/network/n".to_owned(),
                    uid: None,
                }],
            )]
            .into(),
            ..ResourceSpec::default()
        }
    }));
    let created = protocol::create(&state, ctx, &mut ids, specs).expect("the creates are valid");
    state.state.apply(created.writes);
    let delete = DeleteRequest {
        name: "r1/network/n".to_owned(),
        cascade: true,
        dry_run: false,
        allow_missing: false,
        etag: None,
        uid: None,
        requested_by: "failing-reads test".to_owned(),
        orphan: false,
        remote_kept: Default::default(),
        principal: Default::default(),
        retain_ms: 0,
        bounds: Default::default(),
        operation_id: None,
    };
    let accepted = protocol::delete(&state, ctx, &mut ids, delete).expect("the delete is accepted");
    state.state.apply(accepted.writes);

    // The subnets' uids read as sled's oversized last leaf does once a
    // write failed: refused, while their rows by name still read.
    state.refused = created.value.iter().skip(1).map(|r| r.uid).collect();
    for _ in 0..10 {
        match protocol::process_work(&state, ctx) {
            Ok(step) => state.state.apply(step.writes),
            // The node's writer retries a step that failed so.
            Err(CoreError::Storage(_)) => {}
            Err(e) => panic!("a work step over refused reads: {e}"),
        }
    }

    // The store reads again (after its reopen): the cascade finishes.
    state.refused.clear();
    for _ in 0..100 {
        let step = protocol::process_work(&state, ctx).expect("a work step");
        let settled = step.value.items == 0 && !step.value.more;
        state.state.apply(step.writes);
        if settled {
            break;
        }
    }
    assert!(
        state.state.resources.is_empty(),
        "the network and its subnets are purged"
    );
    assert!(state.state.work.is_empty(), "nothing is left queued");
}
