//! The invariant checker: one region's state as a [`RegionView`], every
//! region's views in, a [`Report`] of broken invariants (DESIGN.md's
//! invariants 1, 2 and 4, and the consistency of the records behind them)
//! out. Pure: the callers fetch the views.
//!
//! Who calls it: `cascade check` and the client's `check_cluster*` (views
//! converted from `Peer.Dump` by `cascade_proto::convert::region_view`), the
//! simulation and every multi-region test through them, the protocol and
//! multi-region property tests and the stateright model (views of their
//! `MemoryState`s, [`RegionView::from_state`]).
//!
//! # Two sources, one view
//!
//! A view built from a `MemoryState` has everything ([`RegionView::store`]:
//! uid index, retry queue, operations, outcomes, outbox revisions, pending
//! attach intents) but no read marks. A view built from a dump has what a
//! reader sees: the references a read marks `dangling`
//! ([`RegionView::dangling`]), counts of the queues, and no attach times
//! (its rows have `attached_at` 0). A check that needs what a view lacks is
//! not made for that view; nothing else differs.
//!
//! # Quiescence
//!
//! [`check_quiescent`] holds only when nothing is in flight: the caller must
//! wait until no release, attach or deletion step is queued anywhere (tests
//! poll `Peer.Dump` until it is so). A region with pending releases or
//! pending attach intents is reported as `not_quiescent`, and its other
//! findings may be transient. Queued work is not counted: a blocked or
//! failed deletion stays queued for its retries, and a dump does not say
//! which work is which (a view with [`RegionView::store`] is checked for it:
//! `queue_mismatch`).
//!
//! [`check_in_flight`] makes only the checks that hold in every state of a
//! consistent cut of the regions, messages in flight included (the model
//! checker calls it in every state): `dangling` and `missing_backref` for
//! ACTIVE referrers (not for rows whose attach is still pending), the
//! `resurrection` checks that do not depend on a cascade having run, and
//! `region_mismatch`, `inconsistent_index`, `schema_mismatch`.
//!
//! # What is checked (kinds of [`Violation`])
//!
//! - `not_quiescent`: see above.
//! - `dangling`: an ACTIVE or CREATING resource references a uid that no
//!   region holds (or whose name now holds another incarnation), and the
//!   reference is not untracked: a view with read marks says so by not
//!   marking it `dangling` (only `allow_dangling` references are marked);
//!   a view without read marks, by its classification (below). DELETING
//!   resources are exempt: entering DELETING releases every outgoing
//!   reference, so their targets may go.
//! - `resurrection`: a live resource holds a cascade or unset reference to
//!   a DELETING target (the cascade was not applied, or a reference attached
//!   to a deleting resource); a uid held by two resources; a region still
//!   holding a remote deletion of a uid that its owner has live again; an
//!   owner row attached after its target entered DELETING.
//! - `leaked_backref`: an owner row (target in the viewed region) whose
//!   target incarnation is gone, or whose referrer is not an ACTIVE or
//!   CREATING resource holding the target in that field; an importer mirror
//!   row (target in another region) likewise, or one with no owner row, or
//!   one whose referrer is not in the importer's region.
//! - `stale_remote_deletion`: a remote deletion kept for a uid that its
//!   owner no longer holds at all (the PURGED event was not applied).
//! - `missing_backref`: a live tracked reference to an existing target
//!   without its owner row, or (remote target) without its importer mirror
//!   row (a reference to a gone target is `dangling` instead).
//! - `unexplained_deletion`: a DELETING resource without a deletion record,
//!   or one that is neither FAILED with an error nor BLOCKED with a reason
//!   by blockers (or finalizers) that still hold it. A PENDING or WAITING
//!   one is excused only when it is the root of its operation (reason
//!   `requested`) and another member of the operation, in any region, is
//!   explained: the root waits for its closure. An operation held by its
//!   controls (issue 29: BLOCKED with a reason of
//!   `protocol::HELD_BY_OPERATION`, or a part, in a view with its store,
//!   paused, cancelled or out of budget) explains its members, keeps their
//!   queue entries (`queue_mismatch`) and the references of the referrers
//!   it did not start (`resurrection`): a person set the bound.
//! - `unsettled_create`: a CREATING resource.
//! - `region_mismatch`: a region holds a resource of another region (the
//!   client adds: a node answered for another region than asked).
//! - `inconsistent_index`: a resource or row stored under another key than
//!   its own, the uid index and the resources disagreeing, a deletion record
//!   without its DELETING resource (or naming another one).
//! - `schema_mismatch` (with a schema): a resource of an unknown kind or
//!   with an unknown field, an empty field kept, a single reference holding
//!   several targets, a row whose `on_delete` is not the schema's or whose
//!   field is untracked.
//! - `queue_mismatch` (views with a store): a FAILED deletion still queued,
//!   a BLOCKED one not queued, a queued item without a BLOCKED or WAITING
//!   deletion.
//! - `operation_mismatch` (views with a store): a deletion record whose
//!   operation is unknown; an operation part whose counters (pending,
//!   blocked, failed, deleted) disagree with its records and outcomes, or
//!   whose state disagrees with them (RUNNING with nothing pending, done
//!   with something pending or no end time, RUNNING without its DELETING
//!   root).
//! - `event_order` (views with a store): outbox revisions not strictly
//!   increasing, or not below the next revision.
//! - `unreadable`: not found by this module: a caller that could not turn a
//!   region's state into a view reports it (a dump with a malformed name).
//!
//! # Which references are tracked
//!
//! A dump carries no schema, so a reference's `on_delete` is decided, first
//! rule that applies:
//! 1. a target marked `dangling` is `allow_dangling` (the node marks only
//!    untracked references);
//! 2. a row for exactly this (target uid, referrer uid, field) anywhere: the
//!    row's `on_delete`;
//! 3. the schema, when one is given (`cascade check --config` uses the
//!    node's; the tests and the model pass theirs);
//! 4. any row anywhere of the same (referrer kind, field): its `on_delete`;
//! 5. any reference anywhere of the same (referrer kind, field) marked
//!    `dangling`: `allow_dangling`;
//! 6. otherwise unknown: not checked for rows (counted in
//!    [`Report::unclassified_refs`]); the `dangling` check still applies to
//!    a view with read marks.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::{Serialize, Serializer};

use crate::memory::MemoryState;
use crate::model::{
    BackRef, BackRefKey, DeletionReason, DeletionRecord, DeletionStatus, Operation, OperationState, Outcome,
    OutcomeAction, PendingAttach, RefTarget, Resource, ResourceState, Revision, WorkItem,
};
use crate::name::{OperationId, RegionId, ResourceName, Uid};
use crate::schema::{OnDelete, Schema};

/// One region's state, as the checker needs it. Build it with
/// [`RegionView::from_state`] (a `MemoryState`) or from a `Peer.Dump`
/// (`cascade_proto::convert::region_view`).
#[derive(Debug, Clone, PartialEq)]
pub struct RegionView<'a> {
    /// The region whose state this is.
    pub region: RegionId,
    /// Every resource, CREATING and DELETING included, under the name it is
    /// stored as.
    pub resources: Cow<'a, BTreeMap<ResourceName, Resource>>,
    /// Every back-reference row, owner rows and importer mirrors, under the
    /// key it is stored as.
    pub backrefs: Cow<'a, BTreeMap<BackRefKey, BackRef>>,
    /// The deletion table (seed 000), by uid.
    pub deletions: Cow<'a, BTreeMap<Uid, DeletionRecord>>,
    /// Tombstones: remote resources this region saw enter DELETING and not
    /// yet purged.
    pub remote_deletions: Vec<RefTarget>,
    /// Releases queued for other regions and not yet acknowledged.
    pub pending_releases: usize,
    /// Cross-region attach intents not yet settled.
    pub pending_attach: usize,
    /// Entries of the retry queue, not counting the expiries of
    /// soft-deleted (DELETED) resources: those wait for a time.
    pub queued_work: usize,
    /// The references a reader sees marked dangling (a dump's marks), as
    /// (target uid, referrer uid, field); `None` when the source does not
    /// mark references (a `MemoryState`).
    pub dangling: Option<BTreeSet<BackRefKey>>,
    /// What only the full state holds; `None` for a dump.
    pub store: Option<StoreView<'a>>,
}

/// The parts of a region's state that a dump does not carry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreView<'a> {
    /// uid → name of its current incarnation.
    pub uid_index: Cow<'a, BTreeMap<Uid, ResourceName>>,
    /// The retry queue, by uid.
    pub work: Cow<'a, BTreeMap<Uid, WorkItem>>,
    /// This region's parts of deletion operations.
    pub operations: Cow<'a, BTreeMap<OperationId, Operation>>,
    /// Per-resource outcomes of this region's parts.
    pub outcomes: Cow<'a, BTreeMap<(OperationId, ResourceName), Outcome>>,
    /// Unsettled cross-region attach intents, by resource uid.
    pub pending_attach: Cow<'a, BTreeMap<Uid, PendingAttach>>,
    /// Revisions of the outbox events kept, in stored order.
    pub event_revisions: Vec<Revision>,
    /// The revision the next event gets.
    pub next_revision: Revision,
}

impl<'a> RegionView<'a> {
    /// The view of `region`'s `MemoryState`: everything, with no read
    /// marks. It borrows the state's tables.
    pub fn from_state(region: &RegionId, state: &'a MemoryState) -> RegionView<'a> {
        RegionView {
            region: region.clone(),
            resources: Cow::Borrowed(&state.resources),
            backrefs: Cow::Borrowed(&state.backrefs),
            deletions: Cow::Borrowed(&state.deletions),
            remote_deletions: state.remote_deletions.values().map(|d| d.target.clone()).collect(),
            pending_releases: state.pending_releases.len(),
            pending_attach: state.pending_attach.len(),
            // Not the expiries of soft-deleted resources (they wait for a
            // time, see the node's dump).
            queued_work: state.work.len().saturating_sub(
                state
                    .resources
                    .values()
                    .filter(|r| r.state == ResourceState::Deleted)
                    .count(),
            ),
            dangling: None,
            store: Some(StoreView {
                uid_index: Cow::Borrowed(&state.uid_index),
                work: Cow::Borrowed(&state.work),
                operations: Cow::Borrowed(&state.operations),
                outcomes: Cow::Borrowed(&state.outcomes),
                pending_attach: Cow::Borrowed(&state.pending_attach),
                event_revisions: state.events.iter().map(|e| e.revision).collect(),
                next_revision: state.next_revision,
            }),
        }
    }
}

/// What kind of invariant a [`Violation`] breaks. [`ViolationKind::as_str`]
/// is the stable name `cascade check -o json` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViolationKind {
    /// Releases or attaches still queued: the other findings may be transient.
    NotQuiescent,
    /// A tracked reference of a live resource to a gone incarnation.
    Dangling,
    /// A uid live again, or a live reference held to a DELETING target.
    Resurrection,
    /// A back-reference row that no live reference explains.
    LeakedBackref,
    /// A tombstone of a resource its owner no longer holds.
    StaleRemoteDeletion,
    /// A live tracked reference without its owner row or mirror row.
    MissingBackref,
    /// A DELETING resource that is neither finishing nor explained.
    UnexplainedDeletion,
    /// A CREATING resource.
    UnsettledCreate,
    /// A resource or a node of another region than the one asked.
    RegionMismatch,
    /// Records stored under another key, or indexes that disagree.
    InconsistentIndex,
    /// Resources or rows that disagree with the schema.
    SchemaMismatch,
    /// The retry queue disagrees with the deletion records.
    QueueMismatch,
    /// An operation part disagrees with its records and outcomes.
    OperationMismatch,
    /// Outbox revisions out of order.
    EventOrder,
    /// A region's state could not be read as core records (reported by the
    /// caller that converts it).
    Unreadable,
}

impl ViolationKind {
    /// Every kind.
    pub const ALL: [ViolationKind; 15] = [
        ViolationKind::NotQuiescent,
        ViolationKind::Dangling,
        ViolationKind::Resurrection,
        ViolationKind::LeakedBackref,
        ViolationKind::StaleRemoteDeletion,
        ViolationKind::MissingBackref,
        ViolationKind::UnexplainedDeletion,
        ViolationKind::UnsettledCreate,
        ViolationKind::RegionMismatch,
        ViolationKind::InconsistentIndex,
        ViolationKind::SchemaMismatch,
        ViolationKind::QueueMismatch,
        ViolationKind::OperationMismatch,
        ViolationKind::EventOrder,
        ViolationKind::Unreadable,
    ];

    /// The stable name: "dangling", "leaked_backref", … (what `cascade
    /// check` prints and `-o json` carries).
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationKind::NotQuiescent => "not_quiescent",
            ViolationKind::Dangling => "dangling",
            ViolationKind::Resurrection => "resurrection",
            ViolationKind::LeakedBackref => "leaked_backref",
            ViolationKind::StaleRemoteDeletion => "stale_remote_deletion",
            ViolationKind::MissingBackref => "missing_backref",
            ViolationKind::UnexplainedDeletion => "unexplained_deletion",
            ViolationKind::UnsettledCreate => "unsettled_create",
            ViolationKind::RegionMismatch => "region_mismatch",
            ViolationKind::InconsistentIndex => "inconsistent_index",
            ViolationKind::SchemaMismatch => "schema_mismatch",
            ViolationKind::QueueMismatch => "queue_mismatch",
            ViolationKind::OperationMismatch => "operation_mismatch",
            ViolationKind::EventOrder => "event_order",
            ViolationKind::Unreadable => "unreadable",
        }
    }
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ViolationKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

// Ordered by name, so reports list kinds alphabetically.
impl PartialOrd for ViolationKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ViolationKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

/// One broken invariant, with the resources involved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Violation {
    /// Which invariant.
    pub kind: ViolationKind,
    /// The region where it shows (whose state must change to mend it).
    pub region: String,
    /// What is wrong, naming the resources (name and uid) and fields.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<22} {:<12} {}", self.kind.as_str(), self.region, self.message)
    }
}

/// What the checker saw and found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The regions viewed, in the order given.
    pub regions: Vec<String>,
    /// Resources in every view.
    pub resources: usize,
    /// Back-reference rows in every view.
    pub backrefs: usize,
    /// Back-reference rows whose target is in the viewed region.
    pub owner_rows: usize,
    /// Importer mirror rows (target in another region).
    pub mirror_rows: usize,
    /// Resources in DELETING.
    pub deleting: usize,
    /// Live references whose `on_delete` could not be decided (see the
    /// module doc); they were checked for dangling only.
    pub unclassified_refs: usize,
    /// What is broken, ordered by kind name, region and message.
    pub violations: Vec<Violation>,
}

impl Report {
    /// No violation.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations of one kind.
    pub fn of_kind(&self, kind: ViolationKind) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |v| v.kind == kind)
    }

    /// One line per violation.
    pub fn lines(&self) -> String {
        self.violations.iter().map(|v| format!("{v}\n")).collect()
    }
}

/// Checks every region's view at quiescence (see the module doc): every
/// kind of violation. `schema` decides tracked-ness where the rows cannot,
/// and enables the schema checks.
pub fn check_quiescent(views: &[RegionView<'_>], schema: Option<&Schema>) -> Report {
    Checker::new(views, schema, Moment::Quiescent).run()
}

/// Checks the invariants that hold in every state, messages in flight
/// included (see the module doc): a subset of [`check_quiescent`]'s.
pub fn check_in_flight(views: &[RegionView<'_>], schema: Option<&Schema>) -> Report {
    Checker::new(views, schema, Moment::InFlight).run()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Moment {
    Quiescent,
    InFlight,
}

fn describe(t: &RefTarget) -> String {
    format!("{} (uid {})", t.name, t.uid)
}

fn describe_resource(r: &Resource) -> String {
    format!("{} (uid {})", r.name, r.uid)
}

fn is_live(r: &Resource) -> bool {
    matches!(r.state, ResourceState::Active | ResourceState::Creating)
}

fn holds(r: &Resource, field: &str, target: Uid) -> bool {
    r.refs.get(field).is_some_and(|ts| ts.iter().any(|t| t.uid == target))
}

fn state_name(s: ResourceState) -> &'static str {
    match s {
        ResourceState::Creating => "CREATING",
        ResourceState::Active => "ACTIVE",
        ResourceState::Deleting => "DELETING",
        ResourceState::Deleted => "DELETED",
    }
}

fn status_message(s: &DeletionStatus) -> &str {
    match s {
        DeletionStatus::Pending => "",
        DeletionStatus::Blocked { reason, .. } | DeletionStatus::Waiting { reason, .. } => reason,
        DeletionStatus::Failed { error } => error,
    }
}

/// A row and the region holding it.
type Held<'v> = (&'v str, &'v BackRef);

/// A row's (target uid, referrer uid, field), borrowed.
type RowKey<'v> = (Uid, Uid, &'v str);

fn row_key(b: &BackRef) -> RowKey<'_> {
    (b.target.uid, b.referrer.uid, b.field.as_str())
}

mod checker;
#[cfg(test)]
mod tests;

use checker::Checker;
