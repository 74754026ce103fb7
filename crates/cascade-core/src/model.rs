//! The records a node keeps: resources, back-references, deletion records,
//! operations and their per-resource outcomes, the retry queue, and events.
//!
//! These are plain data; what may change them, and how, is
//! [`crate::protocol`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::name::{OperationId, ResourceName, Uid};
use crate::schema::OnDelete;

/// Milliseconds since the Unix epoch. The core never reads a clock: every
/// command carries `now`, so tests and simulations control time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub fn plus_millis(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }
}

/// A node-wide, strictly increasing event number. A resource's revision is
/// the revision of the last event that changed it; its etag is that number.
pub type Revision = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ResourceState {
    /// Written durably while a cross-region attach is in flight (never
    /// visible as a valid reference target).
    Creating,
    Active,
    /// Accepted for deletion; purged once nothing refers to it any more.
    Deleting,
}

/// One target of a reference field: the name routes, the uid pins the
/// incarnation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RefTarget {
    pub name: ResourceName,
    pub uid: Uid,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    pub name: ResourceName,
    pub uid: Uid,
    pub state: ResourceState,
    pub attributes: BTreeMap<String, String>,
    /// Reference field → targets (a single reference holds one).
    pub refs: BTreeMap<String, Vec<RefTarget>>,
    pub revision: Revision,
    pub create_time: Timestamp,
    pub update_time: Timestamp,
    /// External cleanups that must finish before purge (seed 004).
    #[serde(default)]
    pub finalizers: Vec<String>,
}

impl Resource {
    pub fn kind(&self) -> &str {
        self.name.kind()
    }
    pub fn etag(&self) -> String {
        self.revision.to_string()
    }
}

/// Primary key of a back-reference. Keyed by the target uid first, so all
/// referrers of one incarnation are one prefix scan and a re-created name
/// never sees the old incarnation's referrers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BackRefKey {
    pub target: Uid,
    pub referrer: Uid,
    pub field: String,
}

/// "`referrer` points at `target` through `field`".
///
/// Kept by the owner of the target. When the referrer lives in another
/// region, the referrer's node keeps a mirror row too (target remote), so
/// that a deletion event from the owner finds the local referrers with the
/// same prefix scan a local deletion uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackRef {
    pub target: RefTarget,
    pub referrer: RefTarget,
    pub field: String,
    pub on_delete: OnDelete,
    /// Cross-region only: the referrer region's generation at attach time. A
    /// release with an older generation is stale and ignored.
    #[serde(default)]
    pub generation: u64,
    /// When it was attached; the periodic check leaves young ones alone (an
    /// attach precedes the referrer's own commit).
    #[serde(default)]
    pub attached_at: Timestamp,
}

impl BackRef {
    pub fn key(&self) -> BackRefKey {
        BackRefKey {
            target: self.target.uid,
            referrer: self.referrer.uid,
            field: self.field.clone(),
        }
    }
}

/// Why a resource entered DELETING.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DeletionReason {
    /// A client asked for it.
    Requested,
    /// A cascade from the deletion of `from` reached it through `field`.
    Cascade { from: ResourceName, field: String },
}

/// A live reference that keeps a deletion from finishing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocker {
    pub referrer: ResourceName,
    pub field: String,
    /// Whether the blocker is itself being deleted; if not, the deletion is
    /// stuck until someone deletes or changes it.
    pub referrer_deleting: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum DeletionStatus {
    /// Work is queued or under way.
    Pending,
    /// Waiting on live `block` references (or finalizers).
    Blocked { blockers: Vec<Blocker>, reason: String },
    /// Gave up after the maximum number of attempts; an operator acts.
    Failed { error: String },
    /// Nothing blocks it, but referrers in other regions have yet to release.
    Waiting { regions: Vec<String>, reason: String },
}

/// The deletion table (seed 000's `deleting_resource`): one row per resource
/// in DELETING, keyed by uid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletionRecord {
    pub target: RefTarget,
    pub deleted_at: Timestamp,
    pub reason: DeletionReason,
    pub requested_by: String,
    pub operation: OperationId,
    pub status: DeletionStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OperationState {
    Running,
    /// Every resource of the closure was purged.
    Succeeded,
    /// Finished, but some deletions failed (see the outcomes).
    Failed,
}

/// Progress counters of a deletion operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Purged.
    pub deleted: u64,
    /// Referrers that survived with a field cleared or a list element removed.
    pub unset: u64,
    /// In DELETING, not yet purged and not failed (includes `blocked`).
    pub pending: u64,
    /// Pending deletions currently held by a blocker.
    pub blocked: u64,
    /// Gave up; still DELETING until an operator acts.
    pub failed: u64,
}

/// A deletion operation: created by an accepted user delete; the cascade it
/// starts reports into it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    pub id: OperationId,
    pub root: RefTarget,
    pub requested_by: String,
    pub cascade: bool,
    pub state: OperationState,
    pub progress: Progress,
    pub create_time: Timestamp,
    pub end_time: Option<Timestamp>,
    /// Other regions this region's part reached: they had `cascade` or
    /// `unset` referrers of its deleting resources, so they have parts of
    /// their own (which may reach further regions). The root's region
    /// keeps the root until those parts are finished too.
    #[serde(default)]
    pub reached: std::collections::BTreeSet<String>,
    /// Bumped by every change of this part's progress: two reads that see
    /// the same number saw no change in between (the node's double collect
    /// of every region's part relies on it, see
    /// [`crate::protocol::confirm_remote_closure`]).
    #[serde(default)]
    pub changes: u64,
    /// The root's region saw every other region's part finished (no
    /// pending deletion anywhere) while its own held only the root: the
    /// root may be purged.
    #[serde(default)]
    pub closure_confirmed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum OutcomeAction {
    Pending,
    Deleted,
    Unset {
        field: String,
    },
    Blocked {
        blockers: Vec<Blocker>,
    },
    Failed {
        error: String,
    },
    /// Pending, waiting on other regions to release their references.
    Waiting {
        regions: Vec<String>,
    },
}

/// What an operation did to one resource (seed 001's 207 body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub resource: RefTarget,
    #[serde(flatten)]
    pub action: OutcomeAction,
    pub time: Timestamp,
}

/// An entry of the durable retry queue: deletion work for one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkItem {
    pub target: RefTarget,
    pub next_attempt_at: Timestamp,
    /// Attempts that found the deletion unable to finish.
    pub attempts: u32,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventType {
    Created,
    Updated,
    Deleting,
    Purged,
    DeletionBlocked,
    DeletionFailed,
}

/// An outbox entry. Committed in the same transaction as the change it
/// describes; watchers resume from a revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub revision: Revision,
    pub event_type: EventType,
    pub resource: RefTarget,
    /// The resource after the change (None once purged).
    pub snapshot: Option<Resource>,
    pub operation: Option<OperationId>,
    pub message: String,
    pub time: Timestamp,
    /// On a DELETING event: the request that deleted the resource did not
    /// allow a cascade (`cascade = false`). Referrers in other regions then
    /// lose the reference instead of being deleted (see
    /// [`RemoteDeletion::no_cascade`]).
    #[serde(default)]
    pub no_cascade: bool,
}

/// A resource of another region that this node saw enter DELETING (from the
/// owner's watch stream). While it exists, nothing here may attach a new
/// reference to that uid; local referrers are cascaded or unset from it.
/// Removed when the owner reports the purge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteDeletion {
    pub target: RefTarget,
    pub operation: OperationId,
    pub seen_at: Timestamp,
    /// The owner already purged it, but local referrers were still being
    /// walked: the tombstone goes when the walk is done.
    #[serde(default)]
    pub purged: bool,
    /// The deletion did not allow a cascade: a `cascade` referrer here loses
    /// the element (a list owner that loses its last one survives, emptied)
    /// instead of being deleted. What a request did not allow is never
    /// deleted by its operation, even when two such deletes race.
    #[serde(default)]
    pub no_cascade: bool,
}

/// References committed here whose owners have not confirmed the attach
/// yet: a durable intent, so a crash between commit and confirmation is
/// finished by the reconciler (attach again, then confirm or revert).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingAttach {
    pub resource: RefTarget,
    pub keys: Vec<BackRefKey>,
}

/// A release of a cross-region back-reference that the owner has yet to
/// acknowledge. Durable, so a crash between the local effect and the
/// owner's acknowledgement only delays the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRelease {
    pub backref: BackRef,
    /// This node's generation when the release was queued.
    pub generation: u64,
}

/// A deletion event of another region, as the importer applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteEvent {
    pub revision: Revision,
    pub event_type: EventType,
    pub resource: RefTarget,
    pub operation: Option<OperationId>,
    /// See [`Event::no_cascade`].
    pub no_cascade: bool,
}
