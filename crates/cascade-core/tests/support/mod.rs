//! What the core's integration tests share: the step context of a test
//! region, and what a user can see of a region once its cascades are done
//! (to compare two runs that cut the same work into steps differently).
//!
//! Each test binary includes this module (`#[macro_use] mod support;`)
//! and uses part of it.
#![allow(dead_code, unused_macros)]

use cascade_core::memory::MemoryState;
use cascade_core::{OperationId, OperationState, Progress, ResourceState};

/// The step context of a test region, by its fields (`schema`, `region`,
/// `now`, `policy`), so that its `ids` and `state` can be borrowed mutably
/// next to it; every decision allowed.
macro_rules! ctx {
    ($r:expr) => {
        ::cascade_core::Ctx {
            schema: &$r.schema,
            region: &$r.region,
            now: $r.now,
            policy: &$r.policy,
            authorizer: &::cascade_core::auth::AllowAll,
        }
    };
}

/// What a user can see of a region once its cascades are done: every
/// resource left (state, references), every outcome, every operation's
/// state and counts, and the events as a multiset. Not the revisions: a
/// step that ends elsewhere lets the work items take turns in another
/// order, so two events of different members may be numbered the other
/// way round.
#[derive(Debug, PartialEq)]
pub struct Seen {
    pub resources: Vec<(String, ResourceState, Vec<String>)>,
    pub outcomes: Vec<(OperationId, String, String)>,
    pub operations: Vec<(OperationId, OperationState, Progress)>,
    pub events: Vec<(String, String, String)>,
    /// Back-reference rows, queue entries and deletion records left.
    pub left_over: (usize, usize, usize),
}

pub fn seen(state: &MemoryState) -> Seen {
    let mut events: Vec<(String, String, String)> = state
        .events
        .iter()
        .map(|e| {
            (
                format!("{:?}", e.event_type),
                e.resource.name.to_string(),
                e.message.clone(),
            )
        })
        .collect();
    events.sort();
    Seen {
        resources: state
            .resources
            .values()
            .map(|r| (r.name.to_string(), r.state, r.refs.keys().cloned().collect()))
            .collect(),
        outcomes: state
            .outcomes
            .iter()
            .map(|((op, name), o)| (*op, name.to_string(), format!("{:?}", o.action)))
            .collect(),
        operations: state
            .operations
            .values()
            .map(|op| (op.id, op.state, op.progress))
            .collect(),
        events,
        left_over: (state.backrefs.len(), state.work.len(), state.deletions.len()),
    }
}

/// Inside an `impl StateRead for Wrapper`: the listed reads answered by
/// the wrapped state in `field`, unchanged, so that a test's wrapper
/// writes out only the reads it counts or fails.
macro_rules! forward_state_read {
    ($field:ident => $($method:ident),+ $(,)?) => {
        $(forward_state_read!(@one $field $method);)+
    };
    (@one $f:ident resource) => {
        fn resource(&self, name: &::cascade_core::ResourceName) -> Result<Option<::cascade_core::Resource>, ::cascade_core::error::StorageError> { self.$f.resource(name) }
    };
    (@one $f:ident name_of) => {
        fn name_of(&self, uid: ::cascade_core::Uid) -> Result<Option<::cascade_core::ResourceName>, ::cascade_core::error::StorageError> { self.$f.name_of(uid) }
    };
    (@one $f:ident backrefs) => {
        fn backrefs(&self, target: ::cascade_core::Uid, after: Option<&::cascade_core::BackRefKey>, limit: usize) -> Result<Vec<::cascade_core::BackRef>, ::cascade_core::error::StorageError> { self.$f.backrefs(target, after, limit) }
    };
    (@one $f:ident backref) => {
        fn backref(&self, key: &::cascade_core::BackRefKey) -> Result<Option<::cascade_core::BackRef>, ::cascade_core::error::StorageError> { self.$f.backref(key) }
    };
    (@one $f:ident deletion) => {
        fn deletion(&self, uid: ::cascade_core::Uid) -> Result<Option<::cascade_core::DeletionRecord>, ::cascade_core::error::StorageError> { self.$f.deletion(uid) }
    };
    (@one $f:ident operation) => {
        fn operation(&self, id: ::cascade_core::OperationId) -> Result<Option<::cascade_core::Operation>, ::cascade_core::error::StorageError> { self.$f.operation(id) }
    };
    (@one $f:ident work) => {
        fn work(&self, uid: ::cascade_core::Uid) -> Result<Option<::cascade_core::WorkItem>, ::cascade_core::error::StorageError> { self.$f.work(uid) }
    };
    (@one $f:ident outcome) => {
        fn outcome(&self, op: ::cascade_core::OperationId, name: &::cascade_core::ResourceName) -> Result<Option<::cascade_core::Outcome>, ::cascade_core::error::StorageError> { self.$f.outcome(op, name) }
    };
    (@one $f:ident due_work) => {
        fn due_work(&self, now: ::cascade_core::Timestamp, limit: usize) -> Result<Vec<::cascade_core::DueWork>, ::cascade_core::error::StorageError> { self.$f.due_work(now, limit) }
    };
    (@one $f:ident next_revision) => {
        fn next_revision(&self) -> Result<::cascade_core::Revision, ::cascade_core::error::StorageError> { self.$f.next_revision() }
    };
    (@one $f:ident remote_deletion) => {
        fn remote_deletion(&self, uid: ::cascade_core::Uid) -> Result<Option<::cascade_core::RemoteDeletion>, ::cascade_core::error::StorageError> { self.$f.remote_deletion(uid) }
    };
    (@one $f:ident pending_attach) => {
        fn pending_attach(&self, uid: ::cascade_core::Uid) -> Result<Option<::cascade_core::model::PendingAttach>, ::cascade_core::error::StorageError> { self.$f.pending_attach(uid) }
    };
    (@one $f:ident any_pending_attach) => {
        fn any_pending_attach(&self) -> Result<bool, ::cascade_core::error::StorageError> { self.$f.any_pending_attach() }
    };
    (@one $f:ident remote_deletions) => {
        fn remote_deletions(&self) -> Result<Vec<::cascade_core::RemoteDeletion>, ::cascade_core::error::StorageError> { self.$f.remote_deletions() }
    };
    (@one $f:ident pending_release) => {
        fn pending_release(&self, region: &str, key: &::cascade_core::BackRefKey) -> Result<Option<::cascade_core::PendingRelease>, ::cascade_core::error::StorageError> { self.$f.pending_release(region, key) }
    };
    (@one $f:ident cursor) => {
        fn cursor(&self, region: &str) -> Result<::cascade_core::Revision, ::cascade_core::error::StorageError> { self.$f.cursor(region) }
    };
    (@one $f:ident generation) => {
        fn generation(&self) -> Result<u64, ::cascade_core::error::StorageError> { self.$f.generation() }
    };
}
