//! The deletion protocol of one region: state + command → new state + effects.
//!
//! Every public function reads a [`StateRead`] snapshot, validates, and
//! returns a [`Step`]: the value for the caller and the [`WriteSet`] to
//! commit atomically. Nothing here does IO, reads a clock, or mints ids by
//! itself; the caller passes a [`Ctx`] (schema, region, `now`, policy) and
//! an [`IdSource`].
//!
//! The life of a deletion:
//!
//! 1. [`delete`] checks the preconditions (blockers, dependents, etag) and,
//!    in one step, marks the root DELETING, writes its deletion record,
//!    releases its own outgoing references (so cycles unwind), queues work
//!    for it, creates the operation, and emits the event.
//! 2. [`process_work`] takes due queue entries in bounded batches. For each
//!    deletion it walks the back-references: `cascade` referrers enter
//!    DELETING the same way (a list reference only when its last element
//!    goes), `unset` referrers lose the field or element; `block` referrers
//!    hold it.
//! 3. When no back-reference and no finalizer is left it is purged, and its
//!    operation's counters move. An operation's root is purged last, so the
//!    root stays readable until its whole closure is gone.
//! 4. A deletion that cannot finish is retried with exponential backoff and,
//!    after the maximum, marked FAILED with the reason.
//!
//! # Layout
//!
//! The module is cut by what the code does; the request and answer types
//! live here, and every function keeps its path `protocol::…`.
//!
//! - `validate.rs`: checks on what a client sends (names, attributes,
//!   finalizers, etags) and references resolved to live targets.
//! - `create_update.rs`: [`create`] and [`update`], and the end of a
//!   cross-region create (activate, abort, take refused references back).
//! - `delete.rs`: [`delete`]: its preconditions and the dry run's walk of
//!   the closure.
//! - `work.rs`: [`process_work`], the deletion engine, and
//!   [`confirm_remote_closure`].
//! - `control.rs`: an operation's budget, rate, pause and cancel (who may
//!   enter a new member, leases of the budget across regions), and the
//!   steps that set them.
//! - `bookkeeping.rs`: the state changes every path shares: entering
//!   DELETING, holding, purging, the operation's progress counters, events.
//! - `backrefs.rs`: the back-reference rows a resource's references hold:
//!   which are tracked, attaching new ones, releasing one.
//! - `purge.rs`: a filtered purge: what a filter matches, a region's
//!   tally, and [`start_purge`], one region's part of a forced purge.
//!
//! [`StateRead`]: crate::state::StateRead
//! [`IdSource`]: crate::name::IdSource

mod admin;
mod backrefs;
mod bookkeeping;
mod control;
mod create_update;
mod delete;
mod fairness;
mod finalizer;
mod lien;
mod purge;
#[cfg(test)]
mod soft_delete_tests;
mod undelete;
mod validate;
mod work;

use std::collections::{BTreeMap, BTreeSet};

use crate::auth::{Authorize, Principal, Verb};
use crate::model::{BackRefKey, Blocker, Operation, RefTarget, Resource, Timestamp};
use crate::name::{OperationId, RegionId, ResourceName, Uid};
use crate::schema::Schema;
use crate::state::WriteSet;

pub use admin::{force_purge, is_stuck, record_audit, retry_deletion, AdminRequest, MAX_ADMIN_REASON};
pub use control::{
    accept_budget_lease, control_operation, extend_budget, grant_budget, held_by_operation, paced_by_operation,
    register_operation, Bounds, BudgetGrant, Control, LeaseWanted, HELD_BY_OPERATION, HELD_RECHECK_MS, MAX_LEASE,
    PAUSED_RECHECK_MS,
};
pub use create_update::{create, update};
pub use delete::delete;
pub use finalizer::{remove_finalizer, report_finalizer_failure, FinalizerReport, MAX_FAILURE_REASON};
pub use lien::{add_lien, remove_lien, AddLien, MAX_LIENS};
pub use purge::{
    merge_samples, purge_root, start_purge, PurgeFilter, PurgeStarted, PurgeTally, StartPurge, PURGE_ROOT_KIND,
    PURGE_SAMPLE,
};
pub use undelete::{
    finish_undelete_part, remote_targets, start_undelete, undelete_batch, undelete_part, UndeleteBatch, UndeletePhase,
    UndeleteReport,
};
pub use work::{confirm_remote_closure, process_work, process_work_until, UNSET_IN_THE_SAME_STEP};

pub(crate) use bookkeeping::{after_pending_changed, forget_released_row, wake_if_deleting};
pub(crate) use create_update::{abort_creating, activate_creating, revert_references};
pub(crate) use delete::{keeps_live_other_target, plan_closure};
pub(crate) use work::{note_reached, start_queued_work};

/// Tunables of the protocol. Defaults suit a node; tests shrink them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Upper bound on referrer changes in one work step (one transaction).
    pub batch_budget: usize,
    /// Queue entries looked at per work step.
    pub batch_items: usize,
    /// Delay before the first retry of a deletion that cannot finish; it
    /// doubles with every attempt that finds no progress.
    pub backoff_base_ms: u64,
    /// Upper bound on that delay; also the safety-net retry of a deletion
    /// that waits for other regions to release their references.
    pub backoff_cap_ms: u64,
    /// Attempts at a deletion that cannot finish before it is marked FAILED:
    /// looks that found a `block` referrer or a lien still holding it, or
    /// failures a finalizer's controller reported (see `bookkeeping::hold`).
    pub max_attempts: u32,
    /// Dependents or blockers listed in an error or report.
    pub max_listed: usize,
    /// How often a root whose own region's part is done looks again
    /// whether the other regions' parts are (see `confirm_remote_closure`).
    pub closure_check_ms: u64,
    /// Resources a dry run walks before it reports a truncated plan.
    pub max_plan: usize,
    /// Resources the closure check (a dry run for the caller's principal,
    /// under a policy that may refuse) walks in one region. The check must
    /// see every member, so it walks further than a listed dry run; a
    /// closure larger than this is refused (a [`PlannedDenial`] with the
    /// rule [`CLOSURE_TOO_LARGE`]), never half-checked.
    pub max_closure_check: usize,
    /// The longest retention a delete may ask for (`[limits]
    /// max_retention`); the schema's `retain`s are checked against it when
    /// the node loads its configuration.
    pub max_retention_ms: u64,
    /// Due items of one operation a work step takes at most, so that
    /// operations share the writer (see [`process_work`]).
    pub items_per_operation: usize,
}

/// The rule of the denial a closure check reports when the closure is
/// larger than `Policy::max_closure_check`: not every member was checked.
pub const CLOSURE_TOO_LARGE: &str = "closure larger than max_closure_check: not checked";

/// The most denials a plan lists; the rest are counted (`Plan::denied_more`).
pub const MAX_DENIED_LISTED: usize = 100;

impl Default for Policy {
    fn default() -> Self {
        Self {
            batch_budget: 512,
            batch_items: 256,
            backoff_base_ms: 1_000,
            backoff_cap_ms: 60_000,
            max_attempts: 20,
            max_listed: 50,
            closure_check_ms: 1_000,
            max_plan: 10_000,
            max_closure_check: 250_000,
            max_retention_ms: crate::limits::DEFAULT_MAX_RETENTION_MS,
            items_per_operation: 32,
        }
    }
}

impl Policy {
    /// The delay before the next look at a deletion held `attempts` times
    /// in a row: `backoff_base_ms` doubled per attempt after the first, at
    /// most `backoff_cap_ms`.
    pub fn backoff(&self, attempts: u32) -> u64 {
        let exp = attempts.saturating_sub(1).min(32);
        self.backoff_base_ms
            .saturating_mul(1u64 << exp)
            .min(self.backoff_cap_ms)
    }
}

/// What a step needs to know about its surroundings.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    /// The kinds and their reference fields.
    pub schema: &'a Schema,
    /// This node's region: names in it are local, all others remote.
    pub region: &'a RegionId,
    /// The time of this step: the only clock the protocol sees.
    pub now: Timestamp,
    /// The tunables.
    pub policy: &'a Policy,
    /// This region's policy: before a cascade changes a member for a
    /// deletion's principal it asks whether that principal may (`delete`
    /// the member, or `update` a referrer that loses a reference); a
    /// refusal holds the member instead (see `work.rs`). Deciding is an
    /// in-memory call, cheap and deterministic for the policy in force.
    /// [`AllowAll`](crate::auth::AllowAll) when authentication is off.
    pub authorizer: &'a dyn Authorize,
}

impl std::fmt::Debug for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("schema", &self.schema)
            .field("region", &self.region)
            .field("now", &self.now)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The result of one step: the answer and the writes to commit.
#[derive(Debug, Clone, PartialEq)]
pub struct Step<T> {
    /// The answer for the caller, valid once `writes` are committed.
    pub value: T,
    /// What to commit, in one transaction.
    pub writes: WriteSet,
}

/// A reference target as a client names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefRequest {
    /// The target's full name, `{region}/{kind}/{id}`.
    pub name: String,
    /// When set, the target must be this incarnation.
    pub uid: Option<Uid>,
}

/// A resource as a client writes it (create or update).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceSpec {
    /// Full name, `{region}/{kind}/{id}`; the region must be this node's.
    pub name: String,
    /// Free-form key/value data, within the size limits of validation.
    pub attributes: BTreeMap<String, String>,
    /// Reference field → its targets (more than one only in a list field).
    pub refs: BTreeMap<String, Vec<RefRequest>>,
    /// External cleanups that must be removed before the resource is purged.
    pub finalizers: Vec<String>,
}

/// A client's delete of one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteRequest {
    /// Full name of the resource, in this node's region.
    pub name: String,
    /// Whether `cascade` referrers may be deleted with it. Without it a
    /// delete that would delete one is refused, and referrers only lose
    /// the reference.
    pub cascade: bool,
    /// Check and plan only: answer what the delete would do, write nothing.
    pub dry_run: bool,
    /// A missing resource answers [`DeleteOutcome::Missing`] instead of an error.
    pub allow_missing: bool,
    /// When set and not empty, the resource's current etag must equal it.
    pub etag: Option<String>,
    /// When set, only this incarnation of the name is deleted.
    pub uid: Option<Uid>,
    /// Who asked: kept in the operation, the deletion record and the events.
    pub requested_by: String,
    /// Orphan propagation: `cascade` referrers keep living with the
    /// reference cleared instead of being deleted (and do not refuse the
    /// delete, as they do without `cascade`). Excludes `cascade`.
    pub orphan: bool,
    /// Back-references from list owners in other regions that, as their
    /// region answered just before this request, keep another live target
    /// in that field (see [`crate::peer::keeps_another_target`]). Only read
    /// without `cascade`: such a referrer loses one element, not its last.
    /// A remote `cascade` referrer not in this set counts as a dependent
    /// that would be deleted, so the check errs on refusing.
    pub remote_kept: BTreeSet<BackRefKey>,
    /// Who asked, as the node authenticated them (anonymous when
    /// authentication is off): stored with the operation and the deletion
    /// record and carried on its events, so every member the cascade
    /// changes, in every region, is authorized for this principal.
    pub principal: Principal,
    /// Soft delete: keep every member DELETED for at least this long (in
    /// milliseconds; a member's kind may ask for longer) instead of purging
    /// it when its deletion finishes. 0: as the kinds say. At most
    /// `Policy::max_retention_ms`.
    pub retain_ms: u64,
    /// Its budget and rate (issue 29); none by default.
    pub bounds: Bounds,
    /// The operation's id, when the node minted it before the step (to
    /// register a bounded operation in the other regions first); None:
    /// minted by the step.
    pub operation_id: Option<OperationId>,
}

/// A planned change to a referrer that survives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedUnset {
    /// The referrer.
    pub resource: RefTarget,
    /// Its field that would lose the target (or one element of the list).
    pub field: String,
}

/// A resource of the closure that would wait on a blocker outside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedBlock {
    /// The resource of the closure that would wait.
    pub resource: RefTarget,
    /// The `block` reference that would hold it.
    pub blocker: Blocker,
}

/// What a delete would do (the dry run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// This region's resources the delete would delete, in the order the
    /// walk reached them (its seeds first).
    pub deleted: Vec<RefTarget>,
    /// Referrers that would survive with a field cleared or an element removed.
    pub unset: Vec<PlannedUnset>,
    /// Resources of the closure that would wait on a blocker outside it.
    pub blocked: Vec<PlannedBlock>,
    /// The walk stopped at `Policy::max_plan` resources.
    pub truncated: bool,
    /// Region → deleted resources referenced from there: that region's own
    /// plan, started from these, continues the closure.
    pub remote_seeds: BTreeMap<String, Vec<RefTarget>>,
    /// Members of the closure the delete's principal may not change under
    /// the policy of their region (empty under a policy that allows
    /// everything: nobody was asked), at most [`MAX_DENIED_LISTED`].
    pub denied: Vec<PlannedDenial>,
    /// Denials beyond `denied`.
    pub denied_more: u64,
}

/// A member of a closure that the delete's principal may not change: the
/// delete is refused before anything changes (PERMISSION_DENIED), and a
/// dry run lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedDenial {
    /// The member (its region is the one that decided).
    pub resource: ResourceName,
    /// The verb the principal lacks: `delete` for a member the cascade
    /// deletes, `update` for a referrer it unsets or orphans.
    pub verb: Verb,
    /// The rule that refused it.
    pub rule: String,
}

/// The answer to a delete that was not refused.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteOutcome {
    /// A new deletion started.
    Accepted(Operation),
    /// The resource was already DELETING: the delete answers OK with its operation.
    AlreadyDeleting(Operation),
    /// `allow_missing` and there was nothing to delete.
    Missing,
    /// `dry_run`: what the delete would do; nothing was written.
    DryRun(Plan),
}

/// What one work step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkReport {
    /// Due queue entries stepped (stale ones, dropped, included).
    pub items: usize,
    /// Deletions purged.
    pub purged: usize,
    /// Referrers that entered DELETING by a cascade.
    pub cascaded: usize,
    /// Referrers that lost a field or a list element and survive.
    pub unset: usize,
    /// Deletions looked at that could not finish (a `block` referrer, a
    /// lien) and were scheduled again with backoff.
    pub retried: usize,
    /// More work was due than one step takes: call again at once.
    pub more: bool,
    /// The step ended because its caller's `may_go_on` said no
    /// ([`process_work_until`]), before its item and referrer bounds.
    pub stopped_early: bool,
    /// Operations whose root waits only for other regions' parts: the
    /// node asks them and, when all are finished, confirms with
    /// [`confirm_remote_closure`].
    pub awaiting_closure: Vec<OperationId>,
    /// Budget this region needs from the root's region of a bounded
    /// operation before its cascade goes on here: the node asks for it
    /// (`Peer.BudgetLease`) and passes the answer to
    /// [`accept_budget_lease`].
    pub budget_wanted: Vec<LeaseWanted>,
}

/// Whether `name` lives in another region than this node's.
fn is_remote(ctx: Ctx<'_>, name: &ResourceName) -> bool {
    name.region() != ctx.region.as_str()
}

/// The name and incarnation of a resource, as references and records hold it.
fn target_of(r: &Resource) -> RefTarget {
    RefTarget {
        name: r.name.clone(),
        uid: r.uid,
    }
}
