//! The records a node keeps: resources, back-references, deletion records,
//! operations and their per-resource outcomes, the retry queue, and events.
//!
//! These are plain data; what may change them, and how, is
//! [`crate::protocol`].
//!
//! Size: a little over 800 lines, one file on purpose: it is the one list
//! of the stored records and their fields (30 types, each field with why
//! it is kept), which the node's codec versions layout by layout; split by
//! feature, a reader would have to gather a record's fields from several
//! files to know what one stored value holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::name::{OperationId, ResourceName, Uid};
use crate::schema::OnDelete;

// An operation's budget, rate, pause and cancel (issue 29).
mod controls;
pub use controls::OperationControls;

/// Milliseconds since the Unix epoch. The core never reads a clock: every
/// command carries `now`, so tests and simulations control time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// `ms` milliseconds later (saturating): retry and backoff times.
    pub fn plus_millis(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }
}

/// A node-wide, strictly increasing event number. A resource's revision is
/// the revision of the last event that changed it; its etag is that number.
pub type Revision = u64;

/// Where a resource is in its life: CREATING (cross-region only) → ACTIVE →
/// DELETING → purged (no record left); with a retention, DELETING →
/// DELETED (buried, hidden, its name reserved) → purged at its expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ResourceState {
    /// Written durably while a cross-region attach is in flight (never
    /// visible as a valid reference target).
    Creating,
    /// Live: readable, referable, updatable.
    Active,
    /// Accepted for deletion; purged once nothing refers to it any more.
    Deleting,
    /// Soft-deleted: its deletion finished, but a retention keeps the
    /// record (see [`Resource::soft_deleted`]) until its expiry purges it.
    /// Not live: hidden from reads, never a reference target, its name and
    /// uid reserved, and it holds no back-reference row anywhere.
    Deleted,
}

impl ResourceState {
    /// Whether a request reads a resource in this state as absent:
    /// CREATING (not settled yet) and DELETED (soft-deleted: only a read
    /// that asks with `show_deleted` sees it).
    pub fn reads_as_absent(self) -> bool {
        matches!(self, ResourceState::Creating | ResourceState::Deleted)
    }
}

/// Why a DELETED resource is kept, and until when (issue 29: soft delete
/// with a window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoftDeletion {
    /// When its deletion finished (the step that buried it).
    pub delete_time: Timestamp,
    /// When it is purged for good: `delete_time` plus its retention.
    pub expire_time: Timestamp,
    /// The operation that deleted it.
    pub operation: OperationId,
}

/// One target of a reference field: the name routes, the uid pins the
/// incarnation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RefTarget {
    /// The target's name; its region says which node owns it.
    pub name: ResourceName,
    /// The incarnation referred to: a re-created name has another uid.
    pub uid: Uid,
}

/// A stored resource: one incarnation of a name, with its references.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    /// `{region}/{kind}/{id}`; the region is the node that owns it.
    pub name: ResourceName,
    /// Minted at create; distinguishes this incarnation from an earlier or
    /// later resource of the same name.
    pub uid: Uid,
    /// Its life-cycle state.
    pub state: ResourceState,
    /// Free-form string attributes; the protocol never interprets them.
    pub attributes: BTreeMap<String, String>,
    /// Reference field → targets (a single reference holds one).
    pub refs: BTreeMap<String, Vec<RefTarget>>,
    /// The revision of the last event that changed it (also its etag).
    pub revision: Revision,
    /// When it was created (the step's `now`).
    pub create_time: Timestamp,
    /// When it last changed (the step's `now`).
    pub update_time: Timestamp,
    /// External cleanups that must finish before purge (seed 004).
    #[serde(default)]
    pub finalizers: Vec<String>,
    /// Protections against deletion (Google Cloud's liens): while one is
    /// held a user delete is refused and a cascade that reaches the
    /// resource waits, BLOCKED, until it is removed.
    #[serde(default)]
    pub liens: Vec<Lien>,
    /// Set exactly when `state` is DELETED: when it was buried, when it
    /// expires, and by which operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_deleted: Option<SoftDeletion>,
}

/// A lien: one named protection of a resource against deletion, with the
/// reason a person gave for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lien {
    /// Unique among the resource's liens; names it in RemoveLien.
    pub id: String,
    /// Why the resource is protected (required, shown in every refusal).
    pub reason: String,
    /// Who placed it (the request's `requested_by`).
    pub origin: String,
    /// When it was placed.
    pub create_time: Timestamp,
}

impl Resource {
    /// Its kind, from the name: selects the schema's reference fields.
    pub fn kind(&self) -> &str {
        self.name.kind()
    }
    /// The etag an update or delete precondition compares: the revision,
    /// as a string.
    pub fn etag(&self) -> String {
        self.revision.to_string()
    }
}

/// Primary key of a back-reference. Keyed by the target uid first, so all
/// referrers of one incarnation are one prefix scan and a re-created name
/// never sees the old incarnation's referrers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BackRefKey {
    /// The referred-to incarnation.
    pub target: Uid,
    /// The referring incarnation.
    pub referrer: Uid,
    /// The referrer's field (one row per field, however many elements of a
    /// list point at the same target).
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
    /// The referred-to resource.
    pub target: RefTarget,
    /// The resource holding the reference.
    pub referrer: RefTarget,
    /// The referrer's reference field.
    pub field: String,
    /// What deleting the target does to the referrer (the schema's
    /// `on_delete` of `field`, copied so the owner of a remote target knows it).
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
    /// Its primary key (target uid, referrer uid, field).
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
    Cascade {
        /// The DELETING resource the cascade came from.
        from: ResourceName,
        /// This resource's reference field that pointed at `from`.
        field: String,
    },
}

/// A live reference that keeps a deletion from finishing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocker {
    /// The resource holding the `block` reference.
    pub referrer: ResourceName,
    /// Its field that points at the deleting resource.
    pub field: String,
    /// Whether the blocker is itself being deleted; if not, the deletion is
    /// stuck until someone deletes or changes it.
    pub referrer_deleting: bool,
}

/// Where a DELETING resource's deletion stands, as its record and
/// `GetOperation` report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum DeletionStatus {
    /// Work is queued or under way.
    Pending,
    /// Waiting on live `block` references (or finalizers).
    Blocked {
        /// The references holding it (empty when only finalizers do).
        blockers: Vec<Blocker>,
        /// The blockers described for a human (see
        /// [`crate::error::describe_blockers`]).
        reason: String,
    },
    /// Gave up after the maximum number of attempts; an operator acts.
    Failed {
        /// Why it could not finish (the last reason it was held).
        error: String,
    },
    /// Nothing blocks it, but referrers in other regions have yet to release.
    Waiting {
        /// The regions it waits for.
        regions: Vec<String>,
        /// What it waits for, for a human.
        reason: String,
    },
}

impl DeletionStatus {
    /// The status as the API and messages name it (`PENDING`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            DeletionStatus::Pending => "PENDING",
            DeletionStatus::Blocked { .. } => "BLOCKED",
            DeletionStatus::Failed { .. } => "FAILED",
            DeletionStatus::Waiting { .. } => "WAITING",
        }
    }
}

/// The deletion table (seed 000's `deleting_resource`): one row per resource
/// in DELETING, keyed by uid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletionRecord {
    /// The DELETING resource.
    pub target: RefTarget,
    /// When it entered DELETING.
    pub deleted_at: Timestamp,
    /// Whether a client asked, or a cascade reached it (and from where).
    pub reason: DeletionReason,
    /// Who asked for the deletion that reached it (the request's
    /// `requested_by`; `region {r}` when a remote cascade did).
    pub requested_by: String,
    /// The operation it reports into.
    pub operation: OperationId,
    /// Pending, blocked, waiting on other regions, or failed.
    pub status: DeletionStatus,
    /// The failures finalizer controllers reported for this deletion
    /// (`ReportFinalizerFailure`), one entry per failing finalizer, in the
    /// order they first failed. Removing the finalizer drops its entry.
    #[serde(default)]
    pub finalizer_failures: Vec<FinalizerFailure>,
    /// An administrator's ForcePurge: the deletion no longer waits for
    /// `block` referrers (they lose the reference, in every region),
    /// finalizers or liens (dropped).
    #[serde(default)]
    pub forced: Option<ForcedPurge>,
    /// Who the deletion acts for: the caller of the delete that started
    /// its operation (vouched by the root's region when a cascade reached
    /// it from there). Every member the cascade changes is authorized for
    /// this principal, under this region's policy. Records written before
    /// principals were stored read as [`Principal::anonymous`].
    #[serde(default = "Principal::anonymous")]
    pub principal: Principal,
}

/// Who forced a deletion through, when, and why (seed 000: an admin
/// force-purges a deletion stuck too long).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForcedPurge {
    /// The administrator, as the node authenticated them.
    pub by: String,
    /// The reason they gave (required).
    pub reason: String,
    /// When.
    pub time: Timestamp,
}

/// A finalizer whose controller reported that its external cleanup failed
/// (seed 004: a failing external deletion is retried with backoff, up to a
/// maximum, then marked failed for a person).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalizerFailure {
    /// The finalizer, as the resource lists it.
    pub finalizer: String,
    /// Failures reported in a row (the attempt count of its backoff).
    pub failures: u32,
    /// The reason the controller gave last.
    pub last_reason: String,
    /// When the last failure was reported.
    pub last_time: Timestamp,
    /// When the controller is to be asked again (the `FinalizerRetry`
    /// event): the last failure's time plus the backoff of `failures`.
    /// None once it has been asked, or once the deletion failed.
    pub retry_at: Option<Timestamp>,
}

/// Where an operation stands as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OperationState {
    /// Some deletion of its closure is still pending.
    Running,
    /// Every resource of the closure was purged.
    Succeeded,
    /// Finished, but some deletions failed (see the outcomes).
    Failed,
    /// A person cancelled it (`CancelOperation`): it spreads to no new
    /// member; members already DELETING finish where they need no new
    /// one, the others stay DELETING, held with the reason.
    Cancelled,
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
    /// Its id, the same in every region its cascade reaches.
    pub id: OperationId,
    /// The resource the delete request named.
    pub root: RefTarget,
    /// Who asked (the request's `requested_by`; in another region's part,
    /// `region {r}` of the root's region).
    pub requested_by: String,
    /// Whether the request allowed a cascade.
    pub cascade: bool,
    /// Running, or how it ended.
    pub state: OperationState,
    /// Counters of this region's part.
    pub progress: Progress,
    /// When the delete was accepted (or the part started here).
    pub create_time: Timestamp,
    /// When its last pending deletion finished (None while running).
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
    /// The caller of the delete (in another region's part, as the root's
    /// region vouched for it): the principal its cascade acts for.
    #[serde(default = "Principal::anonymous")]
    pub principal: Principal,
    /// The retention the delete asked for, in milliseconds (0: none). A
    /// member is kept DELETED for the larger of this and its kind's
    /// `retain` instead of being purged (see [`SoftDeletion`]). Carried to
    /// other regions' parts on the DELETING event, so members cascaded
    /// there keep the same window.
    #[serde(default)]
    pub retain_ms: u64,
    /// Its budget, rate, pause and cancel (issue 29): None for an
    /// operation nobody bounded or controlled, which spreads freely.
    #[serde(default)]
    pub controls: Option<Box<OperationControls>>,
    /// Set on an undelete operation (issue 29, `Resources.Undelete`): which
    /// deletion it takes back, and how far this region's part got. None on
    /// a deletion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undelete: Option<Box<Undeletion>>,
}

/// What makes an operation an undelete (see [`Operation::undelete`]): the
/// soft-deleting operation it takes back and this region's counters. Each
/// region the deletion reached keeps a part, with one outcome per member
/// or unset referrer it decided (RESTORED or NOT_RESTORED with the reason).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Undeletion {
    /// The deletion taken back.
    pub of: OperationId,
    /// Members brought back ACTIVE and unset references put back, here.
    pub restored: u64,
    /// Members and references that could not be (each outcome says why).
    pub not_restored: u64,
    /// At the root's region: the regions whose part is not finished yet
    /// (unreachable, or waiting on one that is). The reconciler drives the
    /// undelete again until it is empty. Empty in other regions' parts.
    #[serde(default)]
    pub regions_left: std::collections::BTreeSet<String>,
}

/// What an unset took from a referrer, recorded (with a retention) in the
/// same step, so an Undelete can put it back: only while the referrer
/// still exists at `revision` (nothing changed it since).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnsetUndo {
    /// The field's targets before the unset.
    pub old_targets: Vec<RefTarget>,
    /// The referrer's revision right after the unset.
    pub revision: Revision,
}

/// What an operation did, or is doing, to one resource of its closure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum OutcomeAction {
    /// DELETING, work under way.
    Pending,
    /// Purged, or buried DELETED with a retention (counted alike: the
    /// member is gone for every reader).
    Deleted,
    /// Survived: the reference to a deleted resource was cleared.
    Unset {
        /// The field cleared (or the list it lost an element from).
        field: String,
        /// What the field held before, when the deleted target is kept
        /// with a retention (an Undelete restores it from here).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        undo: Option<UnsetUndo>,
    },
    /// DELETING, held by live `block` references (or finalizers).
    Blocked {
        /// The references holding it.
        blockers: Vec<Blocker>,
    },
    /// Given up (still DELETING; an operator acts).
    Failed {
        /// Why.
        error: String,
    },
    /// Pending, waiting on other regions to release their references.
    Waiting {
        /// The regions it waits for.
        regions: Vec<String>,
    },
    /// DELETING, and its cascade is held by its operation's controls
    /// (budget reached, rate, paused, cancelled): the referrers it would
    /// enter into deletion wait, ACTIVE. Reported BLOCKED with the reason.
    Held {
        /// Why, for a human (`budget reached (100 of 100)`).
        reason: String,
    },
    /// An undelete brought it back: a buried member ACTIVE again with its
    /// uid and references, or an unset referrer's field put back.
    Restored,
    /// An undelete could not bring it back; the rest went on.
    NotRestored {
        /// Why, for a human (`expired: purged at ...`, `the referrer
        /// changed since the unset ...`).
        reason: String,
    },
}

/// What an operation did to one resource (seed 001's 207 body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The resource concerned.
    pub resource: RefTarget,
    /// The latest thing the operation did to it.
    #[serde(flatten)]
    pub action: OutcomeAction,
    /// When that was recorded.
    pub time: Timestamp,
}

/// An entry of the durable retry queue: deletion work for one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkItem {
    /// The DELETING resource to work on.
    pub target: RefTarget,
    /// Not processed before this time (backoff after a blocked attempt).
    pub next_attempt_at: Timestamp,
    /// Attempts that found the deletion unable to finish.
    pub attempts: u32,
    /// Why the last attempt could not finish.
    pub last_error: Option<String>,
    /// How far the walk of the target's back-references has got.
    #[serde(default)]
    pub walk: Walk,
}

/// A due queue entry as the due index lists it: the resource it works on,
/// and whose operation it works for as recorded when it was queued or
/// last moved. A work step looks at many more entries than it takes (to
/// share itself between operations, `protocol/fairness.rs`), so what it
/// needs of each comes from the index's one scan, not a read per entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueWork {
    /// The DELETING resource (its retry-queue entry is read only if taken).
    pub uid: Uid,
    /// Whose item it is, if the index says.
    pub operation: DueOperation,
}

/// Whose operation a due entry works for, as its index entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueOperation {
    /// Recorded: this operation's, or (`None`) no operation's (a
    /// soft-deleted member's expiry, whose deletion already finished).
    Recorded(Option<OperationId>),
    /// Not recorded (an entry an older node wrote): the step reads the
    /// deletion record or the tombstone.
    Unrecorded,
}

impl WorkItem {
    /// Work on `target`, due at `now`, not yet attempted.
    pub fn due_now(target: RefTarget, now: Timestamp) -> Self {
        WorkItem {
            target,
            next_attempt_at: now,
            attempts: 0,
            last_error: None,
            walk: Walk::default(),
        }
    }
}

/// How far a deletion's walk of its target's back-references has got, kept
/// in its work item so that each step resumes after the last row it saw.
///
/// Why: a step acts on a bounded page of referrers, and every row it acts
/// on is removed. A walk that started again from the first key each step
/// would pass every row removed so far, and in an LSM engine (fjall) a
/// removed row is a tombstone until compaction: step k would skip about
/// k pages of them, and a million referrers would cost 10⁹ skips (measured:
/// 561 s at 1M on fjall before this, 6.7 s at 100k).
///
/// The walk acts on the local `cascade`, `unset` and `allow_dangling` rows
/// and counts the ones that stay (referrers in other regions, `block`).
/// Once it is past the last row, the counts say whether a full pass is
/// needed: rows only leave a DELETING target (nothing attaches to one),
/// so a deletion that waits only on other regions' releases need not read
/// its rows again until the count of one region reaches 0. The full pass
/// is the truth: it runs before the target is finished, while `block` rows
/// or finalizers hold it, and every `Policy::backoff_cap_ms` in any case,
/// and it sets the counts afresh. A walk that started and finished in one
/// step needs none: it read every row in that step's one transaction, so
/// its counts are what a full pass would find.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Walk {
    /// Every row at or before this key has been seen (acted on or counted).
    pub after: Option<BackRefKey>,
    /// The walk is past the last row.
    pub finished: bool,
    /// Rows seen that stay until a referrer in another region releases
    /// them, by that region (owner side only).
    pub remote: BTreeMap<String, u64>,
    /// `block` rows seen (owner side only).
    pub blocking: u64,
    /// When the next full pass is due even if the counts say it is not.
    pub recount_at: Timestamp,
}

impl Walk {
    /// Whether the row `key` was seen by this walk (so it is counted).
    pub fn has_seen(&self, key: &BackRefKey) -> bool {
        self.finished || self.after.as_ref().is_some_and(|after| key <= after)
    }

    /// Referrer rows in other regions still to be released.
    pub fn remote_left(&self) -> u64 {
        self.remote.values().sum()
    }

    /// A row counted by this walk went away: one fewer to wait for. A
    /// `forced` deletion counts a remote `block` row as a remote one (its
    /// region unsets the referrer and releases it, see
    /// [`DeletionRecord::forced`]).
    pub fn forget(&mut self, row: &BackRef, local_region: &str, forced: bool) {
        if !self.has_seen(&row.key()) {
            return;
        }
        let region = row.referrer.name.region();
        if row.on_delete == OnDelete::Block && !forced {
            self.blocking = self.blocking.saturating_sub(1);
        } else if region != local_region {
            if let Some(n) = self.remote.get_mut(region) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.remote.remove(region);
                }
            }
        }
    }
}

/// What an [`Event`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventType {
    /// A resource became visible (created ACTIVE, or a CREATING one settled).
    Created,
    /// A resource changed: by a client update, or a cascade unset one of its
    /// references (the message says which).
    Updated,
    /// A resource entered DELETING. Other regions' importers act on it.
    Deleting,
    /// A resource was removed for good. Importers drop their tombstone.
    Purged,
    /// A deletion is held by blockers (emitted when the blockers change).
    DeletionBlocked,
    /// A deletion was given up after its maximum attempts.
    DeletionFailed,
    /// A finalizer's controller is asked again to do its cleanup: its last
    /// attempt failed (`ReportFinalizerFailure`) and the backoff elapsed.
    /// The message names the finalizer and the attempt.
    FinalizerRetry,
    /// An administrator forced a DELETING resource's deletion through
    /// (ForcePurge): importers unset their `block` referrers of it too.
    DeletionForced,
    /// A deletion finished with a retention: the resource is DELETED
    /// (kept, hidden) until its expiry, when a `Purged` event follows. A
    /// controller treats it as gone. To importers it is a `Purged` (the
    /// wire sends it as one): they drop their tombstone, as the owner
    /// refuses any reference to a buried uid itself.
    SoftDeleted,
    /// An undelete brought a DELETED resource back, ACTIVE, with its uid,
    /// attributes and references (the snapshot): a controller treats it as
    /// a re-creation with the same uid. Concerns this region's clients
    /// only: the importers dropped their tombstone at `SoftDeleted`, and
    /// the restored references are attached as a create's are.
    Undeleted,
}

impl EventType {
    /// Whether other regions' nodes are sent events of this type over
    /// `Peer.Watch`: what their importers act on. The others (creates,
    /// updates, blocked, ...) concern this region's clients only.
    pub fn concerns_importers(self) -> bool {
        matches!(
            self,
            EventType::Deleting | EventType::DeletionForced | EventType::Purged | EventType::SoftDeleted
        )
    }

    /// [`Event::concerns_importers`] of an event of this type whose
    /// `cause` is set or not: for a reader of a stored event that looks at
    /// its type and cause without decoding the rest.
    pub fn concerns_importers_given_cause(self, has_cause: bool) -> bool {
        self.concerns_importers() && !(self == EventType::Purged && has_cause)
    }
}

/// One administrative action, or one refused attempt at one (the Admin
/// API's audit log). Written in the step that acts, so an action and its
/// record commit together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Minted by the shell (a UUID v7: the log's order is the ids' order).
    pub id: Uid,
    /// When it was asked for.
    pub time: Timestamp,
    /// Who asked: the administrator's certificate name or token holder, or
    /// what a refused caller presented.
    pub who: String,
    /// The method (`RetryDeletion`, ...).
    pub action: String,
    /// The resource or region it was about.
    pub target: String,
    /// The reason the caller gave.
    pub reason: String,
    /// `ok`, or the error it was refused with.
    pub outcome: String,
    /// The principal's groups when it was decided.
    #[serde(default)]
    pub groups: Vec<String>,
    /// How the principal proved who it is (`certificate`, `jwt`, `token`,
    /// `unauthenticated`; [`crate::auth::Via::as_str`]).
    #[serde(default)]
    pub via: String,
    /// The node of this region that wrote it.
    #[serde(default)]
    pub node: String,
    /// The region the call came through: this one for a direct call, the
    /// forwarding or originating region for a vouched one.
    #[serde(default)]
    pub through: String,
    /// The policy rule that allowed or refused it (`authentication off`
    /// when nobody is asked).
    #[serde(default)]
    pub rule: String,
}

/// An outbox entry. Committed in the same transaction as the change it
/// describes; watchers resume from a revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Its place in the node's outbox (strictly increasing).
    pub revision: Revision,
    /// What happened.
    pub event_type: EventType,
    /// The resource it happened to.
    pub resource: RefTarget,
    /// The resource after the change (None once purged).
    pub snapshot: Option<Resource>,
    /// The deletion operation that caused it, if any.
    pub operation: Option<OperationId>,
    /// A human-readable account (which field was unset, why it is blocked).
    pub message: String,
    /// When (the step's `now`).
    pub time: Timestamp,
    /// On a DELETING event: the request that deleted the resource did not
    /// allow a cascade (`cascade = false`). Referrers in other regions then
    /// lose the reference instead of being deleted (see
    /// [`RemoteDeletion::no_cascade`]).
    #[serde(default)]
    pub no_cascade: bool,
    /// Why the resource is being deleted: on a DELETING event (its deletion
    /// record's reason), and on the PURGED event of a resource that skipped
    /// DELETING (an unreferenced leaf a cascade purged in the step that
    /// reached it: it never had a deletion record, so this is the only
    /// place its reason is kept). None on other events.
    #[serde(default)]
    pub cause: Option<DeletionReason>,
    /// On a DELETING or DELETION_FORCED event: the principal the deletion
    /// acts for (its operation's), which importers' cascades act for in
    /// turn. Anonymous on other events.
    #[serde(default = "Principal::anonymous")]
    pub principal: Principal,
    /// On a DELETING event: its operation's retention (see
    /// [`Operation::retain_ms`]); 0 on other events.
    #[serde(default)]
    pub retain_ms: u64,
}

impl Event {
    /// Whether other regions' nodes are sent this event over `Peer.Watch`:
    /// its type concerns importers ([`EventType::concerns_importers`]), and
    /// it is not the PURGED event of a leaf a cascade purged in the step
    /// that reached it (`cause` set: it skipped DELETING).
    ///
    /// Why such a PURGED changes nothing in any other region: the leaf had
    /// no back-reference when it was purged (`protocol::purge_leaf`'s
    /// invariant), and the owner holds every region's, so no region was
    /// referring to it through the owner; and it was ACTIVE until that
    /// step, never announced as DELETING or forced, so no region holds a
    /// tombstone or a queued walk of it from this life, which is all an
    /// importer's PURGED acts on (`peer::apply_remote_events`: "a PURGED
    /// without a tombstone does nothing"). A tombstone from an earlier
    /// life was dropped at its SOFT_DELETED before an undelete made it
    /// ACTIVE again, or is marked purged already. In a cascade over
    /// several regions these are most of the events (every leaf port of
    /// every region, sent to every other region: issue 28's P2), and each
    /// was read, encoded, sent, decoded and applied by every peer only to
    /// move its cursor, which a watch's progress mark now moves instead.
    pub fn concerns_importers(&self) -> bool {
        self.event_type.concerns_importers_given_cause(self.cause.is_some())
    }
}

/// A resource of another region that this node saw enter DELETING (from the
/// owner's watch stream). While it exists, nothing here may attach a new
/// reference to that uid; local referrers are cascaded or unset from it.
/// Removed when the owner reports the purge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteDeletion {
    /// The remote DELETING resource.
    pub target: RefTarget,
    /// The owner's operation; local cascades report into the same id.
    pub operation: OperationId,
    /// When this node applied the DELETING event.
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
    /// The owner forced the deletion through (a `DeletionForced` event):
    /// local `block` referrers lose the reference too, instead of holding it.
    #[serde(default)]
    pub forced: bool,
    /// The principal the owner's deletion acts for (from its DELETING
    /// event): this region's cascade of its own referrers acts for it,
    /// under this region's policy.
    #[serde(default = "Principal::anonymous")]
    pub principal: Principal,
    /// The owner's operation's retention (from its DELETING event): this
    /// region's part keeps its members for the same window.
    #[serde(default)]
    pub retain_ms: u64,
}

/// References committed here whose owners have not confirmed the attach
/// yet: a durable intent, so a crash between commit and confirmation is
/// finished by the reconciler (attach again, then confirm or revert).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingAttach {
    /// The local resource whose references await confirmation.
    pub resource: RefTarget,
    /// The mirror rows to attach at their owners (the new references only).
    pub keys: Vec<BackRefKey>,
}

/// A release of a cross-region back-reference that the owner has yet to
/// acknowledge. Durable, so a crash between the local effect and the
/// owner's acknowledgement only delays the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRelease {
    /// The row the owner is to drop.
    pub backref: BackRef,
    /// This node's generation when the release was queued.
    pub generation: u64,
}

/// A deletion event of another region, as the importer applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteEvent {
    /// Its revision in the owner's outbox (the importer's cursor advances to it).
    pub revision: Revision,
    /// DELETING or PURGED (the importer ignores the others).
    pub event_type: EventType,
    /// The owner's resource.
    pub resource: RefTarget,
    /// The owner's operation, for a DELETING event.
    pub operation: Option<OperationId>,
    /// See [`Event::no_cascade`].
    pub no_cascade: bool,
    /// See [`Event::principal`].
    pub principal: Principal,
    /// See [`Event::retain_ms`].
    pub retain_ms: u64,
}
