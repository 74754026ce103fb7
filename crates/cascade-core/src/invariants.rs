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
//!   explained: the root waits for its closure.
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
    /// Entries of the retry queue.
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
            queued_work: state.work.len(),
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
    }
}

fn status_name(s: &DeletionStatus) -> &'static str {
    match s {
        DeletionStatus::Pending => "PENDING",
        DeletionStatus::Blocked { .. } => "BLOCKED",
        DeletionStatus::Failed { .. } => "FAILED",
        DeletionStatus::Waiting { .. } => "WAITING",
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

struct Checker<'v> {
    views: &'v [RegionView<'v>],
    schema: Option<&'v Schema>,
    moment: Moment,
    viewed: BTreeSet<&'v str>,
    /// uid → (region, resource): the first holder.
    by_uid: HashMap<Uid, (&'v str, &'v Resource)>,
    owner_rows: BTreeMap<RowKey<'v>, Held<'v>>,
    mirror_rows: BTreeMap<RowKey<'v>, Held<'v>>,
    /// (referrer kind, field) → on_delete, learned from rows.
    kind_field: BTreeMap<(&'v str, &'v str), OnDelete>,
    /// (referrer kind, field) seen with a reference marked dangling.
    dangling_fields: BTreeSet<(&'v str, &'v str)>,
    report: Report,
    found: BTreeSet<Violation>,
}

impl<'v> Checker<'v> {
    fn new(views: &'v [RegionView<'v>], schema: Option<&'v Schema>, moment: Moment) -> Self {
        Checker {
            views,
            schema,
            moment,
            viewed: views.iter().map(|v| v.region.as_str()).collect(),
            by_uid: HashMap::new(),
            owner_rows: BTreeMap::new(),
            mirror_rows: BTreeMap::new(),
            kind_field: BTreeMap::new(),
            dangling_fields: BTreeSet::new(),
            report: Report {
                regions: views.iter().map(|v| v.region.to_string()).collect(),
                ..Report::default()
            },
            found: BTreeSet::new(),
        }
    }

    fn quiescent(&self) -> bool {
        self.moment == Moment::Quiescent
    }

    fn push(&mut self, kind: ViolationKind, region: &str, message: String) {
        self.found.insert(Violation {
            kind,
            region: region.to_owned(),
            message,
        });
    }

    /// The resource of exactly this incarnation, in any viewed region.
    fn find(&self, t: &RefTarget) -> Option<&'v Resource> {
        self.by_uid.get(&t.uid).map(|(_, r)| *r).filter(|r| r.name == t.name)
    }

    fn run(mut self) -> Report {
        self.index();
        let explained_ops = self.explained_operations();
        for view in self.views {
            self.check_resources(view, &explained_ops);
            self.check_remote_deletions(view);
            self.check_attached_after_deleting(view);
            if let Some(store) = &view.store {
                self.check_store(view, store);
            }
        }
        if self.quiescent() {
            self.check_rows();
        }
        if let Some(schema) = self.schema {
            self.check_schema(schema);
        }
        self.report.violations = std::mem::take(&mut self.found).into_iter().collect();
        self.report
    }

    /// Counts, the uid and row indexes, and what they find on the way.
    fn index(&mut self) {
        for view in self.views {
            let region = view.region.as_str();
            if self.quiescent() && (view.pending_releases > 0 || view.pending_attach > 0) {
                self.push(
                    ViolationKind::NotQuiescent,
                    region,
                    format!(
                        "region {region} is not quiescent: pending_releases={} pending_attach={} \
                         (findings may be transient)",
                        view.pending_releases, view.pending_attach
                    ),
                );
            }
            self.report.resources += view.resources.len();
            self.report.backrefs += view.backrefs.len();
            for (name, r) in view.resources.iter() {
                if *name != r.name {
                    self.push(
                        ViolationKind::InconsistentIndex,
                        region,
                        format!(
                            "{} is stored in region {region} under the name {name}",
                            describe_resource(r)
                        ),
                    );
                }
                if r.name.region() != region {
                    self.push(
                        ViolationKind::RegionMismatch,
                        region,
                        format!(
                            "region {region} holds {}, a resource of another region",
                            describe_resource(r)
                        ),
                    );
                }
                if let Some((other_region, other)) = self.by_uid.get(&r.uid).copied() {
                    self.push(
                        ViolationKind::Resurrection,
                        region,
                        format!(
                            "uid {} is held twice: {} in region {other_region} and {} in region {region}",
                            r.uid, other.name, r.name
                        ),
                    );
                } else {
                    self.by_uid.insert(r.uid, (region, r));
                }
                if let Some(marks) = &view.dangling {
                    for (field, targets) in &r.refs {
                        let marked = targets.iter().any(|t| {
                            marks.contains(&BackRefKey {
                                target: t.uid,
                                referrer: r.uid,
                                field: field.clone(),
                            })
                        });
                        if marked {
                            self.dangling_fields.insert((r.kind(), field.as_str()));
                        }
                    }
                }
            }
            for (key, b) in view.backrefs.iter() {
                if *key != b.key() {
                    self.push(
                        ViolationKind::InconsistentIndex,
                        region,
                        format!(
                            "the row {} → {} (field {}) is stored in region {region} under another key ({key:?})",
                            describe(&b.referrer),
                            describe(&b.target),
                            b.field
                        ),
                    );
                }
                self.kind_field
                    .entry((b.referrer.name.kind(), b.field.as_str()))
                    .or_insert(b.on_delete);
                let owner = b.target.name.region() == region;
                let rows = if owner {
                    self.report.owner_rows += 1;
                    &mut self.owner_rows
                } else {
                    self.report.mirror_rows += 1;
                    &mut self.mirror_rows
                };
                if let Some((other, _)) = rows.insert(row_key(b), (region, b)) {
                    let message = format!(
                        "regions {other} and {region} both hold the {} row {} → {} (field {})",
                        if owner { "owner" } else { "mirror" },
                        describe(&b.referrer),
                        describe(&b.target),
                        b.field
                    );
                    self.push(ViolationKind::LeakedBackref, region, message);
                }
            }
        }
    }

    /// A deletion explained on its own: FAILED with an error, or BLOCKED
    /// with a reason by blockers (or finalizers) that still hold it.
    fn explained_alone(&self, resource: &Resource, record: &DeletionRecord) -> bool {
        match &record.status {
            DeletionStatus::Failed { error } => !error.is_empty(),
            DeletionStatus::Blocked { blockers, reason } => {
                !reason.is_empty()
                    && (!blockers.is_empty() || !resource.finalizers.is_empty())
                    && blockers.iter().all(|b| {
                        let Some(view) = self.views.iter().find(|v| v.region.as_str() == b.referrer.region()) else {
                            return true; // not viewed: cannot tell
                        };
                        view.resources
                            .get(&b.referrer)
                            .is_some_and(|x| holds(x, &b.field, resource.uid))
                    })
            }
            DeletionStatus::Pending | DeletionStatus::Waiting { .. } => false,
        }
    }

    /// Operations with a member that explains why they cannot finish.
    fn explained_operations(&self) -> BTreeSet<OperationId> {
        let mut out = BTreeSet::new();
        for view in self.views {
            for r in view.resources.values().filter(|r| r.state == ResourceState::Deleting) {
                if let Some(d) = view.deletions.get(&r.uid) {
                    if self.explained_alone(r, d) {
                        out.insert(d.operation);
                    }
                }
            }
        }
        out
    }

    fn check_resources(&mut self, view: &'v RegionView<'v>, explained_ops: &BTreeSet<OperationId>) {
        let region = view.region.as_str();
        for r in view.resources.values() {
            let here = || format!("{} in region {region}", describe_resource(r));
            match r.state {
                ResourceState::Creating if self.quiescent() => {
                    self.push(
                        ViolationKind::UnsettledCreate,
                        region,
                        format!("{} is still CREATING", here()),
                    );
                }
                ResourceState::Deleting => {
                    self.report.deleting += 1;
                    if self.quiescent() {
                        self.check_deletion(view, r, explained_ops);
                    }
                }
                _ => {}
            }
            let live = match self.moment {
                Moment::Quiescent => is_live(r),
                Moment::InFlight => r.state == ResourceState::Active,
            };
            if live {
                self.check_references(view, r);
            }
        }
        for (uid, d) in view.deletions.iter() {
            if *uid != d.target.uid {
                self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!(
                        "the deletion record of {} is stored under uid {uid}",
                        describe(&d.target)
                    ),
                );
            }
            let resource = self.by_uid.get(uid).filter(|(at, _)| *at == region).map(|(_, r)| *r);
            match resource {
                Some(r) if r.state == ResourceState::Deleting && r.name == d.target.name => {}
                Some(r) => self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!(
                        "region {region} keeps a deletion record of {}, but holds {} {}",
                        describe(&d.target),
                        state_name(r.state),
                        describe_resource(r)
                    ),
                ),
                None => self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!(
                        "region {region} keeps a deletion record of {} without the resource",
                        describe(&d.target)
                    ),
                ),
            }
        }
    }

    fn check_deletion(&mut self, view: &RegionView<'_>, r: &Resource, explained_ops: &BTreeSet<OperationId>) {
        let region = view.region.as_str();
        let here = format!("{} in region {region}", describe_resource(r));
        let Some(d) = view.deletions.get(&r.uid) else {
            self.push(
                ViolationKind::UnexplainedDeletion,
                region,
                format!("{here} is DELETING without a deletion record"),
            );
            return;
        };
        let explained = self.explained_alone(r, d)
            || (matches!(d.status, DeletionStatus::Pending | DeletionStatus::Waiting { .. })
                && d.reason == DeletionReason::Requested
                && explained_ops.contains(&d.operation));
        if !explained {
            self.push(
                ViolationKind::UnexplainedDeletion,
                region,
                format!(
                    "{here} is DELETING with status {} and message {:?} at quiescence (operation {})",
                    status_name(&d.status),
                    status_message(&d.status),
                    d.operation
                ),
            );
        }
    }

    /// The references of a live resource: dangling, tracked-ness, and
    /// their rows.
    fn check_references(&mut self, view: &'v RegionView<'v>, r: &'v Resource) {
        let region = view.region.as_str();
        let here = || format!("{} in region {region}", describe_resource(r));
        let attaching: Option<&PendingAttach> = view.store.as_ref().and_then(|s| s.pending_attach.get(&r.uid));
        for (field, targets) in &r.refs {
            for t in targets {
                let key: RowKey<'_> = (t.uid, r.uid, field.as_str());
                let full_key = || BackRefKey {
                    target: t.uid,
                    referrer: r.uid,
                    field: field.clone(),
                };
                let target_region = t.name.region();
                let target = self.find(t);
                let marked = view.dangling.as_ref().map(|m| m.contains(&full_key()));
                // Tracked-ness (module doc).
                let exact = self.owner_rows.get(&key).or_else(|| self.mirror_rows.get(&key));
                let by_kind = (r.kind(), field.as_str());
                let on_delete = if marked == Some(true) {
                    Some(OnDelete::AllowDangling)
                } else if let Some((_, b)) = exact {
                    Some(b.on_delete)
                } else if let Some(s) = self.schema.and_then(|s| s.reference(r.kind(), field)) {
                    Some(s.on_delete)
                } else if let Some(o) = self.kind_field.get(&by_kind) {
                    Some(*o)
                } else if self.dangling_fields.contains(&by_kind) {
                    Some(OnDelete::AllowDangling)
                } else {
                    None
                };
                let gone = target.is_none() && self.viewed.contains(target_region);
                let dangles = match marked {
                    Some(marked) => !marked,
                    None => on_delete.is_some_and(OnDelete::tracked),
                };
                if gone && dangles {
                    self.push(
                        ViolationKind::Dangling,
                        region,
                        format!(
                            "{} references {} through field {field}, which no region holds, \
                             and the reference is not marked dangling",
                            here(),
                            describe(t)
                        ),
                    );
                }
                let Some(on_delete) = on_delete else {
                    self.report.unclassified_refs += 1;
                    continue;
                };
                if !on_delete.tracked() {
                    continue;
                }
                if self.quiescent() {
                    if let Some(target) = target {
                        if target.state == ResourceState::Deleting && on_delete != OnDelete::Block {
                            self.push(
                                ViolationKind::Resurrection,
                                region,
                                format!(
                                    "{} still references DELETING {} through field {field} (on_delete {on_delete})",
                                    here(),
                                    describe(t)
                                ),
                            );
                        }
                    }
                }
                if self.moment == Moment::InFlight && attaching.is_some_and(|p| p.keys.contains(&full_key())) {
                    continue; // committed before its attach (ARCHITECTURE "Commit before attach")
                }
                // A gone target is `dangling` (or untracked): its rows are not missing.
                if target.is_some() && !self.owner_rows.contains_key(&key) {
                    self.push(
                        ViolationKind::MissingBackref,
                        target_region,
                        format!(
                            "{} references {} through field {field}, but region {target_region} has no \
                             owner back-reference for it",
                            here(),
                            describe(t)
                        ),
                    );
                }
                if !gone && target_region != region && self.mirror_rows.get(&key).is_none_or(|(at, _)| *at != region) {
                    self.push(
                        ViolationKind::MissingBackref,
                        region,
                        format!(
                            "{} references {} in region {target_region} through field {field}, but region \
                             {region} has no importer mirror row for it",
                            here(),
                            describe(t)
                        ),
                    );
                }
            }
        }
    }

    /// Tombstones of a uid its owner has live again, or no longer holds.
    fn check_remote_deletions(&mut self, view: &RegionView<'_>) {
        let region = view.region.as_str();
        for t in &view.remote_deletions {
            let owner = t.name.region();
            if !self.viewed.contains(owner) {
                continue;
            }
            match self.find(t) {
                Some(target) if is_live(target) => self.push(
                    ViolationKind::Resurrection,
                    region,
                    format!(
                        "region {region} saw {} enter DELETING, but region {owner} has it {} again",
                        describe(t),
                        state_name(target.state)
                    ),
                ),
                Some(_) => {}
                None if self.quiescent() => self.push(
                    ViolationKind::StaleRemoteDeletion,
                    region,
                    format!(
                        "region {region} still keeps the remote deletion of {}, which region {owner} no longer holds",
                        describe(t)
                    ),
                ),
                None => {}
            }
        }
    }

    /// An owner row attached after its target entered DELETING (a dump's
    /// rows carry no attach time: never for them).
    fn check_attached_after_deleting(&mut self, view: &RegionView<'_>) {
        let region = view.region.as_str();
        for b in view.backrefs.values() {
            if let Some(d) = view.deletions.get(&b.target.uid) {
                if b.attached_at > d.deleted_at {
                    self.push(
                        ViolationKind::Resurrection,
                        region,
                        format!(
                            "region {region} attached {} → {} (field {}) at {} ms, after the target entered \
                             DELETING at {} ms",
                            describe(&b.referrer),
                            describe(&b.target),
                            b.field,
                            b.attached_at.0,
                            d.deleted_at.0
                        ),
                    );
                }
            }
        }
    }

    /// Why a row is leaked, if it is.
    fn leak(&self, b: &BackRef, at: &str, owner: bool) -> Option<String> {
        let what = format!(
            "{} row in region {at}: {} → {} (field {}, on_delete {})",
            if owner { "owner" } else { "mirror" },
            describe(&b.referrer),
            describe(&b.target),
            b.field,
            b.on_delete
        );
        if !owner && b.referrer.name.region() != at {
            return Some(format!("{what}: the referrer is not local to the importer"));
        }
        if (owner || self.viewed.contains(b.target.name.region())) && self.find(&b.target).is_none() {
            return Some(format!("{what}: the target incarnation no longer exists"));
        }
        if self.viewed.contains(b.referrer.name.region()) {
            match self.find(&b.referrer) {
                None => return Some(format!("{what}: the referrer no longer exists")),
                Some(r) if !is_live(r) => {
                    return Some(format!(
                        "{what}: the referrer is {}, and released its references",
                        state_name(r.state)
                    ))
                }
                Some(r) if !holds(r, &b.field, b.target.uid) => {
                    return Some(format!("{what}: the referrer does not hold the target in that field"))
                }
                Some(_) => {}
            }
        }
        None
    }

    /// Leaked rows, and owner rows of remote referrers without their mirror.
    fn check_rows(&mut self) {
        let mut found = Vec::new();
        for (key, (at, b)) in &self.owner_rows {
            if let Some(m) = self.leak(b, at, true) {
                found.push((ViolationKind::LeakedBackref, at.to_string(), m));
                continue;
            }
            let referrer_region = b.referrer.name.region();
            if referrer_region != *at
                && self.viewed.contains(referrer_region)
                && self.mirror_rows.get(key).is_none_or(|(m, _)| *m != referrer_region)
            {
                found.push((
                    ViolationKind::MissingBackref,
                    referrer_region.to_owned(),
                    format!(
                        "region {at} has an owner row {} → {} (field {}), but region {referrer_region} has no \
                         importer mirror row for it",
                        describe(&b.referrer),
                        describe(&b.target),
                        b.field
                    ),
                ));
            }
        }
        for (key, (at, b)) in &self.mirror_rows {
            if let Some(m) = self.leak(b, at, false) {
                found.push((ViolationKind::LeakedBackref, at.to_string(), m));
                continue;
            }
            let owner = b.target.name.region();
            if self.viewed.contains(owner) && self.owner_rows.get(key).is_none_or(|(o, _)| *o != owner) {
                found.push((
                    ViolationKind::LeakedBackref,
                    at.to_string(),
                    format!(
                        "mirror row in region {at}: {} → {} (field {}) has no owner row in region {owner}",
                        describe(&b.referrer),
                        describe(&b.target),
                        b.field
                    ),
                ));
            }
        }
        for (kind, region, message) in found {
            self.push(kind, &region, message);
        }
    }

    /// Resources and rows against the schema.
    fn check_schema(&mut self, schema: &Schema) {
        let mut found = Vec::new();
        for view in self.views {
            let region = view.region.as_str();
            for r in view.resources.values().filter(|r| r.state == ResourceState::Active) {
                let Some(kind) = schema.kind(r.kind()) else {
                    found.push((
                        region,
                        format!("{} is of a kind the schema does not know", describe_resource(r)),
                    ));
                    continue;
                };
                for (field, targets) in &r.refs {
                    let Some(spec) = kind.refs.get(field) else {
                        found.push((
                            region,
                            format!(
                                "{} holds field {field}, which the schema does not know",
                                describe_resource(r)
                            ),
                        ));
                        continue;
                    };
                    if targets.is_empty() {
                        found.push((region, format!("{} keeps field {field} empty", describe_resource(r))));
                    }
                    if !spec.many && targets.len() > 1 {
                        found.push((
                            region,
                            format!(
                                "{} holds {} targets in the single reference {field}",
                                describe_resource(r),
                                targets.len()
                            ),
                        ));
                    }
                }
            }
            for b in view.backrefs.values() {
                let spec = schema.reference(b.referrer.name.kind(), &b.field);
                let why = match spec {
                    None => Some("a field the schema does not know".to_owned()),
                    Some(s) if !s.on_delete.tracked() => Some(format!("an untracked ({}) field", s.on_delete)),
                    Some(s) if s.on_delete != b.on_delete => Some(format!(
                        "on_delete {} where the schema says {}",
                        b.on_delete, s.on_delete
                    )),
                    Some(_) => None,
                };
                if let Some(why) = why {
                    found.push((
                        region,
                        format!(
                            "the row {} → {} (field {}) in region {region} is for {why}",
                            describe(&b.referrer),
                            describe(&b.target),
                            b.field
                        ),
                    ));
                }
            }
        }
        for (region, message) in found {
            self.push(ViolationKind::SchemaMismatch, region, message);
        }
    }

    /// What only a full state can show: the uid index, the retry queue,
    /// operation parts, the outbox.
    fn check_store(&mut self, view: &RegionView<'_>, store: &StoreView<'_>) {
        let region = view.region.as_str();
        for r in view.resources.values() {
            if store.uid_index.get(&r.uid) != Some(&r.name) {
                self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!(
                        "the uid index of region {region} does not point {} at its name",
                        describe_resource(r)
                    ),
                );
            }
        }
        for (uid, name) in store.uid_index.iter() {
            if view.resources.get(name).is_none_or(|r| r.uid != *uid) {
                self.push(
                    ViolationKind::InconsistentIndex,
                    region,
                    format!(
                        "the uid index of region {region} points {uid} at {name}, which is another incarnation or none"
                    ),
                );
            }
        }
        if !self.quiescent() {
            return;
        }
        // The retry queue.
        for (uid, d) in view.deletions.iter() {
            let queued = store.work.contains_key(uid);
            let wrong = match &d.status {
                DeletionStatus::Failed { .. } if queued => Some("FAILED but still queued"),
                DeletionStatus::Blocked { .. } if !queued => Some("BLOCKED but not queued for a retry"),
                _ => None,
            };
            if let Some(wrong) = wrong {
                self.push(
                    ViolationKind::QueueMismatch,
                    region,
                    format!("the deletion of {} in region {region} is {wrong}", describe(&d.target)),
                );
            }
            if !store.operations.contains_key(&d.operation) {
                self.push(
                    ViolationKind::OperationMismatch,
                    region,
                    format!(
                        "the deletion record of {} names operation {}, which region {region} does not have",
                        describe(&d.target),
                        d.operation
                    ),
                );
            }
        }
        for (uid, w) in store.work.iter() {
            let status = view.deletions.get(uid).map(|d| &d.status);
            let ok = *uid == w.target.uid
                && matches!(
                    status,
                    Some(DeletionStatus::Blocked { .. } | DeletionStatus::Waiting { .. })
                );
            if !ok {
                self.push(
                    ViolationKind::QueueMismatch,
                    region,
                    format!(
                        "region {region} queues work for {} at quiescence, whose deletion is {}",
                        describe(&w.target),
                        status.map_or("missing", status_name)
                    ),
                );
            }
        }
        // Operation parts against their records and outcomes.
        for op in store.operations.values() {
            let records: Vec<&DeletionRecord> = view.deletions.values().filter(|d| d.operation == op.id).collect();
            let count = |f: fn(&DeletionStatus) -> bool| records.iter().filter(|d| f(&d.status)).count() as u64;
            let failed = count(|s| matches!(s, DeletionStatus::Failed { .. }));
            let blocked = count(|s| matches!(s, DeletionStatus::Blocked { .. }));
            let pending = records.len() as u64 - failed;
            let deleted = store
                .outcomes
                .iter()
                .filter(|((id, _), o)| *id == op.id && o.action == OutcomeAction::Deleted)
                .count() as u64;
            let p = op.progress;
            let label = format!(
                "the part of operation {} (root {}) in region {region}",
                op.id, op.root.name
            );
            if (p.pending, p.blocked, p.failed, p.deleted) != (pending, blocked, failed, deleted) {
                self.push(
                    ViolationKind::OperationMismatch,
                    region,
                    format!(
                        "{label} counts pending={} blocked={} failed={} deleted={}, its records and outcomes \
                         say {pending}, {blocked}, {failed}, {deleted}",
                        p.pending, p.blocked, p.failed, p.deleted
                    ),
                );
            }
            let wrong = match op.state {
                OperationState::Running if p.pending == 0 => Some("RUNNING with nothing pending"),
                OperationState::Running if op.end_time.is_some() => Some("RUNNING with an end time"),
                OperationState::Running
                    if op.root.name.region() == region
                        && !self.find(&op.root).is_some_and(|r| r.state == ResourceState::Deleting) =>
                {
                    Some("RUNNING, but its root is not DELETING")
                }
                OperationState::Succeeded if (p.pending, p.failed) != (0, 0) => {
                    Some("SUCCEEDED with deletions pending or failed")
                }
                OperationState::Failed if p.pending != 0 || p.failed == 0 => {
                    Some("FAILED with deletions pending or none failed")
                }
                OperationState::Succeeded | OperationState::Failed if op.end_time.is_none() => {
                    Some("done without an end time")
                }
                _ => None,
            };
            if let Some(wrong) = wrong {
                self.push(ViolationKind::OperationMismatch, region, format!("{label} is {wrong}"));
            }
        }
        // The outbox.
        if let Some(w) = store.event_revisions.windows(2).find(|w| w[0] >= w[1]) {
            self.push(
                ViolationKind::EventOrder,
                region,
                format!("the outbox of region {region} holds revision {} before {}", w[0], w[1]),
            );
        }
        if let Some(last) = store.event_revisions.last().filter(|l| **l >= store.next_revision) {
            self.push(
                ViolationKind::EventOrder,
                region,
                format!(
                    "the outbox of region {region} holds revision {last}, but its next revision is {}",
                    store.next_revision
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Blocker, Event, EventType, PendingRelease, Progress, RemoteDeletion, Timestamp};
    use crate::schema::EXAMPLE_SCHEMA;

    const RA: &str = "ra";
    const RB: &str = "rb";
    const NET: (&str, u128) = ("ra/network/n1", 1);
    const SUB: (&str, u128) = ("rb/subnet/s1", 2);
    const OP: u128 = 100;

    fn uid(n: u128) -> Uid {
        Uid(uuid::Uuid::from_u128(n))
    }

    fn op_id() -> OperationId {
        OperationId(uuid::Uuid::from_u128(OP))
    }

    fn rn(name: &str) -> ResourceName {
        ResourceName::parse(name).unwrap()
    }

    fn t((name, n): (&str, u128)) -> RefTarget {
        RefTarget {
            name: rn(name),
            uid: uid(n),
        }
    }

    fn schema() -> Schema {
        Schema::from_toml(EXAMPLE_SCHEMA).unwrap()
    }

    fn res(target: (&str, u128), state: ResourceState, refs: &[(&str, &[(&str, u128)])]) -> Resource {
        Resource {
            name: rn(target.0),
            uid: uid(target.1),
            state,
            attributes: BTreeMap::new(),
            refs: refs
                .iter()
                .map(|(field, ts)| (field.to_string(), ts.iter().map(|x| t(*x)).collect()))
                .collect(),
            revision: 1,
            create_time: Timestamp(1),
            update_time: Timestamp(1),
            finalizers: Vec::new(),
        }
    }

    fn put(s: &mut MemoryState, r: Resource) {
        s.uid_index.insert(r.uid, r.name.clone());
        s.resources.insert(r.name.clone(), r);
    }

    fn row(s: &mut MemoryState, target: (&str, u128), referrer: (&str, u128), field: &str, on_delete: OnDelete) {
        let b = BackRef {
            target: t(target),
            referrer: t(referrer),
            field: field.into(),
            on_delete,
            generation: 1,
            attached_at: Timestamp(1),
        };
        s.backrefs.insert(b.key(), b);
    }

    /// Puts a resource in DELETING with a record of operation [`OP`], and
    /// makes that operation's part agree with the records.
    fn deleting(s: &mut MemoryState, target: (&str, u128), reason: DeletionReason, status: DeletionStatus) {
        let uid = uid(target.1);
        let name = s.uid_index[&uid].clone();
        s.resources.get_mut(&name).unwrap().state = ResourceState::Deleting;
        s.deletions.insert(
            uid,
            DeletionRecord {
                target: t(target),
                deleted_at: Timestamp(5),
                reason,
                requested_by: "test".into(),
                operation: op_id(),
                status,
            },
        );
        settle_operation(s, target);
    }

    fn settle_operation(s: &mut MemoryState, root: (&str, u128)) {
        let records: Vec<&DeletionRecord> = s.deletions.values().filter(|d| d.operation == op_id()).collect();
        let failed = records
            .iter()
            .filter(|d| matches!(d.status, DeletionStatus::Failed { .. }))
            .count() as u64;
        let blocked = records
            .iter()
            .filter(|d| matches!(d.status, DeletionStatus::Blocked { .. }))
            .count() as u64;
        let pending = records.len() as u64 - failed;
        let root = s.operations.get(&op_id()).map_or_else(|| t(root), |o| o.root.clone());
        s.operations.insert(
            op_id(),
            Operation {
                id: op_id(),
                root,
                requested_by: "test".into(),
                cascade: true,
                state: match (pending, failed) {
                    (0, 0) => OperationState::Succeeded,
                    (0, _) => OperationState::Failed,
                    _ => OperationState::Running,
                },
                progress: Progress {
                    pending,
                    blocked,
                    failed,
                    ..Progress::default()
                },
                create_time: Timestamp(5),
                end_time: (pending == 0).then_some(Timestamp(6)),
                reached: BTreeSet::new(),
                changes: 0,
                closure_confirmed: false,
            },
        );
    }

    /// ra/network/n1 ← rb/subnet/s1 (field network, cascade): owner row in
    /// ra, mirror row in rb.
    fn healthy() -> [MemoryState; 2] {
        let mut ra = MemoryState::default();
        put(&mut ra, res(NET, ResourceState::Active, &[]));
        row(&mut ra, NET, SUB, "network", OnDelete::Cascade);
        let mut rb = MemoryState::default();
        put(&mut rb, res(SUB, ResourceState::Active, &[("network", &[NET])]));
        row(&mut rb, NET, SUB, "network", OnDelete::Cascade);
        [ra, rb]
    }

    fn views(states: &[MemoryState]) -> Vec<RegionView<'_>> {
        [RA, RB, "rc"]
            .iter()
            .zip(states)
            .map(|(r, s)| RegionView::from_state(&RegionId::parse(r).unwrap(), s))
            .collect()
    }

    fn check(states: &[MemoryState]) -> Report {
        check_quiescent(&views(states), Some(&schema()))
    }

    fn kinds(r: &Report) -> Vec<ViolationKind> {
        r.violations.iter().map(|v| v.kind).collect()
    }

    /// The report has violations of `kind` only (at least one).
    #[track_caller]
    fn only(r: &Report, kind: ViolationKind) {
        assert!(
            !r.violations.is_empty() && r.violations.iter().all(|v| v.kind == kind),
            "expected only {kind}:\n{}",
            r.lines()
        );
    }

    #[test]
    fn names_are_stable_and_distinct() {
        let names: BTreeSet<&str> = ViolationKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), ViolationKind::ALL.len());
        assert_eq!(ViolationKind::LeakedBackref.to_string(), "leaked_backref");
    }

    #[test]
    fn a_healthy_cluster_has_no_violations() {
        let r = check(&healthy());
        assert!(r.is_clean(), "{}", r.lines());
        assert_eq!((r.resources, r.backrefs, r.owner_rows, r.mirror_rows), (2, 2, 1, 1));
        assert_eq!(r.unclassified_refs, 0);
        assert!(check_in_flight(&views(&healthy()), Some(&schema())).is_clean());
    }

    #[test]
    fn not_quiescent() {
        let mut s = healthy();
        let b = s[1].backrefs.values().next().unwrap().clone();
        s[1].pending_releases.insert(
            (RA.into(), b.key()),
            PendingRelease {
                backref: b,
                generation: 2,
            },
        );
        let r = check(&s);
        only(&r, ViolationKind::NotQuiescent);
        assert_eq!(r.violations[0].region, RB);
    }

    #[test]
    fn dangling() {
        let mut s = healthy();
        // The network is purged, rows gone, the subnet still references it.
        s[0] = MemoryState::default();
        s[1].backrefs.clear();
        let r = check(&s);
        only(&r, ViolationKind::Dangling);
        let v = &r.violations[0];
        assert_eq!(v.region, RB);
        assert!(v.message.contains("rb/subnet/s1") && v.message.contains("ra/network/n1"));
        // An allow_dangling reference to a gone target is fine.
        let mut rb = MemoryState::default();
        put(
            &mut rb,
            res(
                ("rb/port/p", 3),
                ResourceState::Active,
                &[("qos_policy", &[("ra/qos_policy/q", 4)])],
            ),
        );
        assert!(check(&[MemoryState::default(), rb]).is_clean());
    }

    #[test]
    fn dangling_to_a_recreated_name() {
        let mut s = healthy();
        let net = s[0].resources.get_mut(&rn(NET.0)).unwrap();
        net.uid = uid(9);
        s[0].uid_index.clear();
        s[0].uid_index.insert(uid(9), rn(NET.0));
        let r = check(&s);
        assert!(kinds(&r).contains(&ViolationKind::Dangling), "{}", r.lines());
        assert!(kinds(&r).contains(&ViolationKind::LeakedBackref), "{}", r.lines());
    }

    /// ra/network/n1 ← rb/router/r (field gateway_network, block), the
    /// network DELETING and BLOCKED by the router.
    fn blocked_by_a_router() -> [MemoryState; 2] {
        const ROUTER: (&str, u128) = ("rb/router/r", 7);
        let mut ra = MemoryState::default();
        put(&mut ra, res(NET, ResourceState::Active, &[]));
        row(&mut ra, NET, ROUTER, "gateway_network", OnDelete::Block);
        let blocked = DeletionStatus::Blocked {
            blockers: vec![Blocker {
                referrer: rn(ROUTER.0),
                field: "gateway_network".into(),
                referrer_deleting: false,
            }],
            reason: "blocked by rb/router/r".into(),
        };
        deleting(&mut ra, NET, DeletionReason::Requested, blocked);
        ra.work.insert(
            uid(NET.1),
            WorkItem {
                target: t(NET),
                next_attempt_at: Timestamp(50),
                attempts: 1,
                last_error: None,
            },
        );
        let mut rb = MemoryState::default();
        put(
            &mut rb,
            res(ROUTER, ResourceState::Active, &[("gateway_network", &[NET])]),
        );
        row(&mut rb, NET, ROUTER, "gateway_network", OnDelete::Block);
        [ra, rb]
    }

    #[test]
    fn resurrection_live_reference_to_a_deleting_target() {
        // A block reference to a held target is how blocking looks.
        let r = check(&blocked_by_a_router());
        assert!(r.is_clean(), "{}", r.lines());
        // A cascade reference to a DELETING target: the cascade was not applied.
        let mut s = healthy();
        let failed = DeletionStatus::Failed {
            error: "gave up".into(),
        };
        deleting(&mut s[0], NET, DeletionReason::Requested, failed);
        only(&check(&s), ViolationKind::Resurrection);
        // Not while messages are in flight: the DELETING event may be on its way.
        assert!(check_in_flight(&views(&s), Some(&schema())).is_clean());
    }

    #[test]
    fn resurrection_duplicate_uid() {
        let mut s = healthy();
        put(&mut s[1], res(("rb/network/n9", NET.1), ResourceState::Active, &[]));
        only(&check(&s), ViolationKind::Resurrection);
    }

    #[test]
    fn resurrection_revived_remote_deletion() {
        let mut s = healthy();
        s[1].remote_deletions.insert(
            uid(NET.1),
            RemoteDeletion {
                target: t(NET),
                operation: op_id(),
                seen_at: Timestamp(3),
                purged: false,
                no_cascade: false,
            },
        );
        let r = check(&s);
        only(&r, ViolationKind::Resurrection);
        only(&check_in_flight(&views(&s), None), ViolationKind::Resurrection);
    }

    #[test]
    fn resurrection_row_attached_after_deleting() {
        let mut s = blocked_by_a_router();
        s[0].backrefs.values_mut().for_each(|b| b.attached_at = Timestamp(9));
        only(&check(&s), ViolationKind::Resurrection);
        only(
            &check_in_flight(&views(&s), Some(&schema())),
            ViolationKind::Resurrection,
        );
    }

    #[test]
    fn leaked_backref() {
        let mut s = healthy();
        // The subnet dropped the reference, both rows stayed.
        s[1].resources.get_mut(&rn(SUB.0)).unwrap().refs.clear();
        let r = check(&s);
        only(&r, ViolationKind::LeakedBackref);
        assert_eq!(r.violations.len(), 2, "{}", r.lines());
        assert!(r
            .violations
            .iter()
            .any(|v| v.region == RA && v.message.contains("owner row")));
        assert!(r
            .violations
            .iter()
            .any(|v| v.region == RB && v.message.contains("mirror row")));
        // Leaks are a quiescence finding: a release may be on its way.
        assert!(check_in_flight(&views(&s), Some(&schema())).is_clean());
    }

    #[test]
    fn leaked_mirror_without_owner_row() {
        let mut s = healthy();
        s[0].backrefs.clear();
        let r = check(&s);
        assert!(kinds(&r).contains(&ViolationKind::MissingBackref), "{}", r.lines());
        assert!(r
            .of_kind(ViolationKind::LeakedBackref)
            .any(|v| v.message.contains("has no owner row in region ra")));
    }

    #[test]
    fn stale_remote_deletion() {
        let mut s = healthy();
        s[0].remote_deletions.insert(
            uid(99),
            RemoteDeletion {
                target: t(("rb/subnet/gone", 99)),
                operation: op_id(),
                seen_at: Timestamp(3),
                purged: false,
                no_cascade: false,
            },
        );
        only(&check(&s), ViolationKind::StaleRemoteDeletion);
    }

    #[test]
    fn missing_backref() {
        let mut s = healthy();
        s[1].backrefs.clear();
        let r = check(&s);
        only(&r, ViolationKind::MissingBackref);
        assert!(r
            .violations
            .iter()
            .all(|v| v.region == RB && v.message.contains("mirror")));
        // Without any row, the owner's is missing too (classified by the schema).
        s[0].backrefs.clear();
        let r = check(&s);
        only(&r, ViolationKind::MissingBackref);
        assert!(r.violations.iter().any(|v| v.region == RA));
        only(
            &check_in_flight(&views(&s), Some(&schema())),
            ViolationKind::MissingBackref,
        );
    }

    #[test]
    fn missing_backref_not_in_flight_while_the_attach_is_pending() {
        let mut s = healthy();
        s[0].backrefs.clear();
        let key = s[1].backrefs.keys().next().unwrap().clone();
        s[1].pending_attach.insert(
            uid(SUB.1),
            PendingAttach {
                resource: t(SUB),
                keys: vec![key],
            },
        );
        assert!(check_in_flight(&views(&s), Some(&schema())).is_clean());
        let r = check(&s);
        assert!(kinds(&r).contains(&ViolationKind::MissingBackref), "{}", r.lines());
        assert!(kinds(&r).contains(&ViolationKind::NotQuiescent), "{}", r.lines());
    }

    #[test]
    fn unexplained_deletion() {
        let mut ra = MemoryState::default();
        put(&mut ra, res(("ra/project/p", 5), ResourceState::Active, &[]));
        deleting(
            &mut ra,
            ("ra/project/p", 5),
            DeletionReason::Requested,
            DeletionStatus::Pending,
        );
        only(&check(&[ra.clone()]), ViolationKind::UnexplainedDeletion);
        // A DELETING resource without its record.
        let mut rb = MemoryState::default();
        put(&mut rb, res(("rb/project/q", 6), ResourceState::Deleting, &[]));
        only(
            &check(&[MemoryState::default(), rb]),
            ViolationKind::UnexplainedDeletion,
        );
    }

    #[test]
    fn a_root_waits_for_an_explained_member() {
        // ra/network/n1 (root, PENDING) and its cascaded subnet in rb,
        // BLOCKED by a router in rb.
        let [mut ra, mut rb] = healthy();
        ra.backrefs.clear();
        rb.backrefs.clear();
        deleting(&mut ra, NET, DeletionReason::Requested, DeletionStatus::Pending);
        put(
            &mut rb,
            res(
                ("rb/router/r", 7),
                ResourceState::Active,
                &[("gateway_network", &[SUB])],
            ),
        );
        row(&mut rb, SUB, ("rb/router/r", 7), "gateway_network", OnDelete::Block);
        let cascade = DeletionReason::Cascade {
            from: rn(NET.0),
            field: "network".into(),
        };
        let blocked = DeletionStatus::Blocked {
            blockers: vec![Blocker {
                referrer: rn("rb/router/r"),
                field: "gateway_network".into(),
                referrer_deleting: false,
            }],
            reason: "blocked by rb/router/r".into(),
        };
        rb.operations.insert(op_id(), ra.operations[&op_id()].clone());
        deleting(&mut rb, SUB, cascade.clone(), blocked);
        rb.work.insert(
            uid(SUB.1),
            WorkItem {
                target: t(SUB),
                next_attempt_at: Timestamp(50),
                attempts: 1,
                last_error: None,
            },
        );
        // The router gateway field targets a network by the schema: the
        // schema check is not what this test is about.
        let r = check_quiescent(&views(&[ra.clone(), rb.clone()]), None);
        assert!(r.is_clean(), "{}", r.lines());
        // A stale blocker explains nothing.
        rb.resources.get_mut(&rn("rb/router/r")).unwrap().refs.clear();
        rb.backrefs.clear();
        let r = check_quiescent(&views(&[ra.clone(), rb.clone()]), None);
        only(&r, ViolationKind::UnexplainedDeletion);
        assert_eq!(r.violations.len(), 2, "{}", r.lines());
        // Nor does an explained member excuse a PENDING member that is not the root.
        rb.resources.get_mut(&rn("rb/router/r")).unwrap().refs = [("gateway_network".to_string(), vec![t(SUB)])].into();
        row(&mut rb, SUB, ("rb/router/r", 7), "gateway_network", OnDelete::Block);
        ra.deletions.get_mut(&uid(NET.1)).unwrap().reason = cascade;
        let r = check_quiescent(&views(&[ra, rb]), None);
        only(&r, ViolationKind::UnexplainedDeletion);
        assert!(r.violations[0].message.contains("ra/network/n1"), "{}", r.lines());
    }

    #[test]
    fn unsettled_create() {
        let mut s = healthy();
        s[1].resources.get_mut(&rn(SUB.0)).unwrap().state = ResourceState::Creating;
        let r = check(&s);
        only(&r, ViolationKind::UnsettledCreate);
        assert!(r.violations[0].message.contains("rb/subnet/s1"));
        // Not a finding while messages are in flight.
        assert!(check_in_flight(&views(&s), Some(&schema())).is_clean());
    }

    #[test]
    fn region_mismatch() {
        let mut s = healthy();
        put(&mut s[0], res(("rb/project/x", 8), ResourceState::Active, &[]));
        only(&check(&s), ViolationKind::RegionMismatch);
    }

    #[test]
    fn inconsistent_index() {
        let mut s = healthy();
        s[0].uid_index.clear();
        only(&check(&s), ViolationKind::InconsistentIndex);
        let mut s = healthy();
        let b = s[0].backrefs.pop_first().unwrap().1;
        let mut key = b.key();
        key.field = "other".into();
        s[0].backrefs.insert(key, b);
        only(&check(&s), ViolationKind::InconsistentIndex);
        // A deletion record without its DELETING resource.
        let mut s = healthy();
        deleting(&mut s[0], NET, DeletionReason::Requested, DeletionStatus::Pending);
        s[0].resources.get_mut(&rn(NET.0)).unwrap().state = ResourceState::Active;
        let r = check(&s);
        assert!(kinds(&r).contains(&ViolationKind::InconsistentIndex), "{}", r.lines());
    }

    #[test]
    fn schema_mismatch() {
        let mut s = healthy();
        s[1].resources
            .get_mut(&rn(SUB.0))
            .unwrap()
            .refs
            .insert("bogus".into(), vec![t(NET)]);
        let r = check(&s);
        only(&r, ViolationKind::SchemaMismatch);
        assert_eq!(r.unclassified_refs, 1);
        // Without a schema it is only unclassified.
        assert!(check_quiescent(&views(&s), None).is_clean());
        let mut s = healthy();
        for st in &mut s {
            st.backrefs.values_mut().for_each(|b| b.on_delete = OnDelete::Unset);
        }
        only(&check(&s), ViolationKind::SchemaMismatch);
        let mut s = healthy();
        let net2 = ("ra/network/n2", 9);
        put(&mut s[0], res(net2, ResourceState::Active, &[]));
        s[1].resources
            .get_mut(&rn(SUB.0))
            .unwrap()
            .refs
            .get_mut("network")
            .unwrap()
            .push(t(net2));
        row(&mut s[0], net2, SUB, "network", OnDelete::Cascade);
        row(&mut s[1], net2, SUB, "network", OnDelete::Cascade);
        only(&check(&s), ViolationKind::SchemaMismatch);
    }

    #[test]
    fn queue_mismatch() {
        let mut ra = MemoryState::default();
        put(&mut ra, res(("ra/project/p", 5), ResourceState::Active, &[]));
        let failed = DeletionStatus::Failed {
            error: "gave up".into(),
        };
        deleting(&mut ra, ("ra/project/p", 5), DeletionReason::Requested, failed);
        assert!(check(&[ra.clone()]).is_clean(), "{}", check(&[ra.clone()]).lines());
        ra.work.insert(
            uid(5),
            WorkItem {
                target: t(("ra/project/p", 5)),
                next_attempt_at: Timestamp(50),
                attempts: 1,
                last_error: None,
            },
        );
        let r = check(&[ra]);
        only(&r, ViolationKind::QueueMismatch);
        assert_eq!(r.violations.len(), 2, "{}", r.lines());
    }

    #[test]
    fn operation_mismatch() {
        let mut ra = MemoryState::default();
        put(&mut ra, res(("ra/project/p", 5), ResourceState::Active, &[]));
        let failed = DeletionStatus::Failed {
            error: "gave up".into(),
        };
        deleting(&mut ra, ("ra/project/p", 5), DeletionReason::Requested, failed);
        ra.operations.get_mut(&op_id()).unwrap().progress.deleted = 3;
        only(&check(&[ra.clone()]), ViolationKind::OperationMismatch);
        ra.operations.clear();
        only(&check(&[ra]), ViolationKind::OperationMismatch);
    }

    #[test]
    fn event_order() {
        let mut s = healthy();
        let event = |revision| Event {
            revision,
            event_type: EventType::Created,
            resource: t(NET),
            snapshot: None,
            operation: None,
            message: String::new(),
            time: Timestamp(1),
            no_cascade: false,
        };
        s[0].events = vec![event(1), event(2)];
        s[0].next_revision = 3;
        assert!(check(&s).is_clean());
        s[0].events = vec![event(2), event(1)];
        only(&check(&s), ViolationKind::EventOrder);
        s[0].events = vec![event(1), event(3)];
        only(&check(&s), ViolationKind::EventOrder);
    }

    /// A dump's view: read marks decide `dangling`, rows and marks decide
    /// tracked-ness where there is no schema.
    fn dump_view<'s>(s: &'s MemoryState, region: &str, marks: &[BackRefKey]) -> RegionView<'s> {
        RegionView {
            dangling: Some(marks.iter().cloned().collect()),
            store: None,
            ..RegionView::from_state(&RegionId::parse(region).unwrap(), s)
        }
    }

    #[test]
    fn read_marks_decide_dangling() {
        let mut rb = MemoryState::default();
        put(
            &mut rb,
            res(
                ("rb/port/p", 3),
                ResourceState::Active,
                &[("qos_policy", &[("ra/qos_policy/q", 4)])],
            ),
        );
        let ra = MemoryState::default();
        let key = BackRefKey {
            target: uid(4),
            referrer: uid(3),
            field: "qos_policy".into(),
        };
        // Not marked: a reader would take the gone target for live.
        let unmarked = [dump_view(&ra, RA, &[]), dump_view(&rb, RB, &[])];
        only(&check_quiescent(&unmarked, Some(&schema())), ViolationKind::Dangling);
        let r = check_quiescent(&unmarked, None);
        only(&r, ViolationKind::Dangling);
        assert_eq!(r.unclassified_refs, 1);
        let marked = [dump_view(&ra, RA, &[]), dump_view(&rb, RB, &[key])];
        let r = check_quiescent(&marked, None);
        assert!(r.is_clean(), "{}", r.lines());
        assert_eq!(r.unclassified_refs, 0);
    }

    #[test]
    fn tracked_ness_learned_from_rows_of_the_same_field() {
        let [ra, mut rb] = healthy();
        put(
            &mut rb,
            res(("rb/subnet/s2", 12), ResourceState::Active, &[("network", &[NET])]),
        );
        let v = [dump_view(&ra, RA, &[]), dump_view(&rb, RB, &[])];
        let r = check_quiescent(&v, None);
        only(&r, ViolationKind::MissingBackref);
        assert_eq!(r.violations.len(), 2, "{}", r.lines());
        assert!(r.violations.iter().all(|v| v.message.contains("rb/subnet/s2")));
    }

    #[test]
    fn unknown_tracking_is_counted_or_decided_by_the_schema() {
        let mut ra = MemoryState::default();
        put(&mut ra, res(NET, ResourceState::Active, &[]));
        put(
            &mut ra,
            res(("ra/subnet/s", 3), ResourceState::Active, &[("network", &[NET])]),
        );
        let v = [dump_view(&ra, RA, &[])];
        let r = check_quiescent(&v, None);
        assert!(r.is_clean(), "{}", r.lines());
        assert_eq!(r.unclassified_refs, 1);
        only(&check_quiescent(&v, Some(&schema())), ViolationKind::MissingBackref);
    }

    #[test]
    fn a_creating_referrer_is_checked_at_quiescence_only() {
        let mut s = healthy();
        s[0] = MemoryState::default();
        s[1].backrefs.clear();
        s[1].resources.get_mut(&rn(SUB.0)).unwrap().state = ResourceState::Creating;
        assert!(check_in_flight(&views(&s), Some(&schema())).is_clean());
        let r = check(&s);
        assert_eq!(
            kinds(&r),
            vec![ViolationKind::Dangling, ViolationKind::UnsettledCreate],
            "{}",
            r.lines()
        );
    }
}
