//! Undelete of a whole cascade (issue 29): one region's part of taking a
//! soft-deleting operation back, one bounded batch per step.
//!
//! The shell reads a page of the deletion's outcomes in this region (the
//! core cannot scan) and, for the references that point into other
//! regions, asks their owners which targets are live; the step decides
//! every outcome of the page, in the writer, so that it races the expiry
//! and a new Delete one way:
//!
//! - [`UndeletePhase::Members`]: every member the deletion buried here
//!   (its outcome DELETED, the record DELETED by that operation) comes back
//!   ACTIVE with its uid, attributes and references, an `Undeleted` event
//!   in the same step. Targets come first: a member's local target that
//!   the same deletion buried is brought back before it, in the same step
//!   (a cycle is brought back whole, the step commits it at once); a
//!   remote target must be live at its owner (the shell's lookups), else
//!   the member waits for a later round (its region may not have restored
//!   it yet). Its rows are written as a create writes them: local ones in
//!   the step, cross-region ones with a durable `PendingAttach` the shell
//!   attaches after the commit (and the reconciler, if it cannot).
//! - [`UndeletePhase::References`]: every reference the deletion unset
//!   here (its outcome UNSET with an undo record) is put back, only where
//!   the referrer still exists at the revision the unset left (nothing
//!   changed it since) and every old target is live.
//!
//! Whatever cannot come back is NOT_RESTORED with the reason, and the rest
//! goes on. A member whose window has passed never comes back: expired but
//! not purged yet, it is reported as the expiry will leave it (the expiry
//! and the undelete are steps of this writer: whichever commits first
//! wins, and an undelete that commits first removes the expiry's queue
//! entry with the window). Names of buried members stay reserved, so a
//! restore never meets another resource under its name.
//!
//! Every outcome the undelete decided is final: a batch run again (the
//! reconciler's retry, a second round) skips them, so an undelete is
//! idempotent, and a dry run decides the same way without writing.

use std::collections::{BTreeMap, BTreeSet};

use crate::auth::Principal;
use crate::error::CoreError;
use crate::model::{
    EventType, Operation, OperationState, Outcome, OutcomeAction, PendingAttach, Progress, RefTarget, Resource,
    ResourceState, Undeletion,
};
use crate::name::{OperationId, Uid};
use crate::schema::Schema;
use crate::state::{StateRead, Tx};
use crate::time_text::rfc3339;

use super::backrefs::{attach_backrefs, tracked_keys};
use super::bookkeeping::put_with_event;
use super::{target_of, Ctx, Step};

#[cfg(test)]
mod tests;

/// Which half of an undelete a batch does (members first, in every
/// region; then the unset references, whose targets are back by then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UndeletePhase {
    /// Buried members back to ACTIVE.
    Members,
    /// Unset references put back.
    References,
}

/// One batch of one region's part of an undelete.
#[derive(Debug, Clone)]
pub struct UndeleteBatch {
    /// The undelete operation (its part here is made by the first batch).
    pub id: OperationId,
    /// The soft-deleting operation it takes back.
    pub of: OperationId,
    /// The deletion's root (the undelete's root too).
    pub root: RefTarget,
    /// Who asked (the root's region vouches for it in other regions).
    pub requested_by: String,
    /// The caller, as the root's region authenticated it.
    pub principal: Principal,
    /// Members or references.
    pub phase: UndeletePhase,
    /// A page of the deletion's outcomes in this region, as the shell read
    /// them (the step reads every resource again itself).
    pub outcomes: Vec<Outcome>,
    /// Targets in other regions whose owners answered that they are live
    /// (for a dry run: also those any region's dry run would restore,
    /// this one's included).
    pub remote_live: BTreeSet<RefTarget>,
    /// No later round will come: what still waits is NOT_RESTORED now.
    /// False while some region could not be asked (what waits on it waits
    /// for the reconciler's next drive).
    pub final_round: bool,
    /// Decide and report, write nothing.
    pub dry_run: bool,
}

/// What a batch decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UndeleteReport {
    /// Restored by this batch (or, in a dry run, that would be).
    pub restored: Vec<RefTarget>,
    /// NOT_RESTORED by this batch, with why.
    pub not_restored: Vec<(RefTarget, String)>,
    /// Left for a later round: a target in another region is not live yet.
    pub waiting: Vec<(RefTarget, String)>,
    /// Restored resources with references into other regions, to attach
    /// at their owners now (their `PendingAttach` is committed).
    pub to_attach: Vec<RefTarget>,
}

/// The targets in other regions that the batch's members and unset
/// references point at: the shell asks their owners which are live before
/// the step. Read-only, and cheap to get wrong: the step checks again.
pub fn remote_targets<S: StateRead + ?Sized>(
    state: &S,
    schema: &Schema,
    region: &str,
    phase: UndeletePhase,
    outcomes: &[Outcome],
) -> Result<BTreeSet<RefTarget>, CoreError> {
    let mut out = BTreeSet::new();
    for o in outcomes {
        match (&o.action, phase) {
            (OutcomeAction::Deleted, UndeletePhase::Members) => {
                let Some(r) = state.resource(&o.resource.name)? else {
                    continue;
                };
                if r.uid != o.resource.uid || r.state != ResourceState::Deleted {
                    continue;
                }
                for (field, targets) in &r.refs {
                    if !schema.reference(r.kind(), field).is_some_and(|s| s.on_delete.tracked()) {
                        continue;
                    }
                    out.extend(targets.iter().filter(|t| t.name.region() != region).cloned());
                }
            }
            (OutcomeAction::Unset { undo: Some(undo), .. }, UndeletePhase::References) => {
                out.extend(undo.old_targets.iter().filter(|t| t.name.region() != region).cloned());
            }
            _ => {}
        }
    }
    Ok(out)
}

/// What one member came to in this batch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    /// Back.
    Back,
    /// Being decided higher up this step's walk: a member that reaches it
    /// again is on a reference cycle of buried members, and waits (a cycle
    /// is never brought back half: the final round reports it).
    Deciding,
    /// A target in another region is not live yet.
    Waits(String),
    /// Cannot come back.
    Lost(String),
}

/// One batch of an undelete's part in this region (see the module doc).
pub fn undelete_batch<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    batch: UndeleteBatch,
) -> Result<Step<UndeleteReport>, CoreError> {
    let mut tx = Tx::new(state);
    if !batch.dry_run {
        ensure_part(&mut tx, ctx, &batch)?;
    }
    let mut walk = Walker {
        batch: &batch,
        fates: BTreeMap::new(),
        report: UndeleteReport::default(),
    };
    for o in &batch.outcomes {
        if decided(&tx, batch.id, &o.resource)? {
            continue;
        }
        match (&o.action, batch.phase) {
            (OutcomeAction::Deleted, UndeletePhase::Members) => {
                walk.member(&mut tx, ctx, &o.resource)?;
            }
            (
                OutcomeAction::Unset {
                    field,
                    undo: Some(undo),
                },
                UndeletePhase::References,
            ) => {
                walk.reference(&mut tx, ctx, &o.resource, field, &undo.old_targets, undo.revision)?;
            }
            _ => {}
        }
    }
    let report = walk.report;
    if batch.dry_run {
        return Ok(Step {
            value: report,
            writes: Default::default(),
        });
    }
    Ok(Step {
        value: report,
        writes: tx.finish(),
    })
}

/// Whether this undelete already decided `resource` (an earlier batch or
/// round): its outcome is final.
fn decided<S: StateRead + ?Sized>(tx: &Tx<'_, S>, id: OperationId, resource: &RefTarget) -> Result<bool, CoreError> {
    Ok(tx.outcome(id, &resource.name)?.is_some_and(|o| {
        o.resource.uid == resource.uid
            && matches!(o.action, OutcomeAction::Restored | OutcomeAction::NotRestored { .. })
    }))
}

/// The undelete's part in this region, made by its first batch.
fn ensure_part<S: StateRead + ?Sized>(
    tx: &mut Tx<'_, S>,
    ctx: Ctx<'_>,
    batch: &UndeleteBatch,
) -> Result<(), CoreError> {
    if let Some(op) = tx.operation(batch.id)? {
        if op.undelete.as_ref().is_some_and(|u| u.of == batch.of) {
            return Ok(());
        }
        return Err(CoreError::invalid(
            "operation_id",
            format!("operation {} exists and is not an undelete of {}", batch.id, batch.of),
        ));
    }
    tx.put_operation(undelete_part(
        ctx,
        batch.id,
        batch.of,
        batch.root.clone(),
        &batch.requested_by,
        &batch.principal,
    ));
    Ok(())
}

/// A fresh part of undelete `id` of deletion `of`, RUNNING.
pub fn undelete_part(
    ctx: Ctx<'_>,
    id: OperationId,
    of: OperationId,
    root: RefTarget,
    requested_by: &str,
    principal: &Principal,
) -> Operation {
    Operation {
        id,
        root,
        requested_by: requested_by.to_owned(),
        cascade: false,
        state: OperationState::Running,
        progress: Progress::default(),
        create_time: ctx.now,
        end_time: None,
        reached: BTreeSet::new(),
        changes: 0,
        closure_confirmed: false,
        principal: principal.clone(),
        retain_ms: 0,
        controls: None,
        undelete: Some(Box::new(Undeletion {
            of,
            restored: 0,
            not_restored: 0,
            regions_left: BTreeSet::new(),
        })),
    }
}

struct Walker<'b> {
    batch: &'b UndeleteBatch,
    /// Members decided (or being decided) in this step, by uid.
    fates: BTreeMap<Uid, Fate>,
    report: UndeleteReport,
}

impl Walker<'_> {
    /// Brings one buried member back, its local buried targets first.
    fn member<S: StateRead + ?Sized>(
        &mut self,
        tx: &mut Tx<'_, S>,
        ctx: Ctx<'_>,
        member: &RefTarget,
    ) -> Result<Fate, CoreError> {
        if let Some(fate) = self.fates.get(&member.uid) {
            if *fate == Fate::Deciding {
                return Ok(self.wait_or_lose(format!("{} is on a reference cycle of buried members", member.name)));
            }
            return Ok(fate.clone());
        }
        let fate = self.decide_member(tx, ctx, member)?;
        self.fates.insert(member.uid, fate.clone());
        match &fate {
            Fate::Back | Fate::Deciding => {}
            Fate::Waits(why) => self.report.waiting.push((member.clone(), why.clone())),
            Fate::Lost(why) => self.not_restored(tx, ctx, member, why.clone())?,
        }
        Ok(fate)
    }

    fn decide_member<S: StateRead + ?Sized>(
        &mut self,
        tx: &mut Tx<'_, S>,
        ctx: Ctx<'_>,
        member: &RefTarget,
    ) -> Result<Fate, CoreError> {
        let Some(r) = tx.resource(&member.name)?.filter(|r| r.uid == member.uid) else {
            return Ok(Fate::Lost(self.gone(tx, ctx, member)?));
        };
        match r.state {
            ResourceState::Deleted => {}
            // Brought back by an earlier undelete of the same deletion
            // (another id): nothing to do, and nothing lost.
            ResourceState::Active => return Ok(Fate::Lost("already live".to_owned())),
            ResourceState::Deleting => return Ok(Fate::Lost("being deleted again".to_owned())),
            ResourceState::Creating => return Ok(Fate::Lost("not a buried member".to_owned())),
        }
        let Some(soft) = r.soft_deleted else {
            return Ok(Fate::Lost("kept without a window: it is purged".to_owned()));
        };
        if soft.operation != self.batch.of {
            return Ok(Fate::Lost(format!("buried by another operation, {}", soft.operation)));
        }
        if soft.expire_time <= ctx.now {
            return Ok(Fate::Lost(format!(
                "expired: its window ended at {}; it is purged",
                rfc3339(soft.expire_time)
            )));
        }
        self.fates.insert(member.uid, Fate::Deciding);
        for (field, targets) in &r.refs {
            let tracked = ctx
                .schema
                .reference(r.kind(), field)
                .is_some_and(|s| s.on_delete.tracked());
            if !tracked {
                continue; // allow_dangling: pinned by uid, nothing to attach
            }
            for t in targets {
                if let Some(fate) = self.target_fate(tx, ctx, field, t)? {
                    return Ok(fate);
                }
            }
        }
        if !self.batch.dry_run {
            self.revive(tx, ctx, r)?;
        }
        self.restored(tx, ctx, member)?;
        Ok(Fate::Back)
    }

    /// Whether reference `field` → `t` keeps a member from coming back now
    /// (None: it can be attached).
    fn target_fate<S: StateRead + ?Sized>(
        &mut self,
        tx: &mut Tx<'_, S>,
        ctx: Ctx<'_>,
        field: &str,
        t: &RefTarget,
    ) -> Result<Option<Fate>, CoreError> {
        if t.name.region() != ctx.region.as_str() {
            return Ok(self
                .remote_wait(tx, t)?
                .map(|why| self.wait_or_lose(format!("{field}: {why}"))));
        }
        let target = tx.resource(&t.name)?.filter(|x| x.uid == t.uid);
        match target.as_ref().map(|x| (x.state, x.soft_deleted)) {
            Some((ResourceState::Active, _)) => Ok(None),
            Some((ResourceState::Deleted, Some(soft))) if soft.operation == self.batch.of => {
                match self.member(tx, ctx, t)? {
                    Fate::Back => Ok(None),
                    Fate::Deciding => Ok(Some(Fate::Waits(format!("{field}: {} is being decided", t.name)))),
                    Fate::Waits(why) => Ok(Some(Fate::Waits(format!("{field}: {} waits: {why}", t.name)))),
                    Fate::Lost(why) => Ok(Some(Fate::Lost(format!(
                        "its reference {field} to {} cannot be restored: {why}",
                        t.name
                    )))),
                }
            }
            Some((ResourceState::Deleting, _)) => Ok(Some(Fate::Lost(format!(
                "its reference {field} targets {}, which is being deleted",
                t.name
            )))),
            _ => Ok(Some(Fate::Lost(format!(
                "its reference {field} targets {}, which is gone",
                t.name
            )))),
        }
    }

    /// Why a target in another region cannot be attached now (None: its
    /// owner said it is live and no deletion of it is known here).
    fn remote_wait<S: StateRead + ?Sized>(&self, tx: &Tx<'_, S>, t: &RefTarget) -> Result<Option<String>, CoreError> {
        if tx.remote_deletion(t.uid)?.is_some() {
            return Ok(Some(format!("{} is being deleted in its region", t.name)));
        }
        if !self.batch.remote_live.contains(t) {
            return Ok(Some(format!("{} is not live in region {}", t.name, t.name.region())));
        }
        Ok(None)
    }

    /// Waits for a later round, or (the final round) is lost.
    fn wait_or_lose(&self, why: String) -> Fate {
        if self.batch.final_round {
            Fate::Lost(format!("cannot be re-attached: {why}"))
        } else {
            Fate::Waits(why)
        }
    }

    /// Why a member that is not buried under its name any more is lost.
    fn gone<S: StateRead + ?Sized>(
        &self,
        tx: &Tx<'_, S>,
        ctx: Ctx<'_>,
        member: &RefTarget,
    ) -> Result<String, CoreError> {
        // When it was due: its burial's time plus the deletion's retention
        // (the kind's own may be longer: then "at the latest" would lie).
        let outcome_time = tx.outcome(self.batch.of, &member.name)?.map(|o| o.time);
        let retain = tx.with_operation(self.batch.of, |op| op.retain_ms)?.unwrap_or(0);
        let retain = ctx.schema.retain_ms(member.name.kind()).max(retain);
        Ok(match outcome_time {
            Some(t) if retain > 0 => format!("expired: purged at {}", rfc3339(t.plus_millis(retain))),
            _ => "purged: it was deleted without a retention".to_owned(),
        })
    }

    /// Writes a member back ACTIVE with its rows (cross-region ones to
    /// attach after the commit), without its expiry.
    fn revive<S: StateRead + ?Sized>(
        &mut self,
        tx: &mut Tx<'_, S>,
        ctx: Ctx<'_>,
        mut r: Resource,
    ) -> Result<(), CoreError> {
        r.state = ResourceState::Active;
        r.soft_deleted = None;
        r.update_time = ctx.now;
        tx.remove_work(r.uid); // the expiry's entry
        let message = format!(
            "undeleted by operation {} (taking back {})",
            self.batch.id, self.batch.of
        );
        let r = put_with_event(tx, ctx, r, EventType::Undeleted, Some(self.batch.id), &message)?;
        self.attach(tx, ctx, &r, None)
    }

    /// Writes the rows of `r`'s references not in `already`; a durable
    /// intent for the cross-region ones.
    fn attach<S: StateRead + ?Sized>(
        &mut self,
        tx: &mut Tx<'_, S>,
        ctx: Ctx<'_>,
        r: &Resource,
        already: Option<&BTreeMap<crate::model::BackRefKey, (RefTarget, crate::schema::OnDelete)>>,
    ) -> Result<(), CoreError> {
        let remote = attach_backrefs(tx, ctx, r, already)?;
        if remote.is_empty() {
            return Ok(());
        }
        let mut pending = tx.pending_attach(r.uid)?.unwrap_or(PendingAttach {
            resource: target_of(r),
            keys: Vec::new(),
        });
        for key in remote {
            if !pending.keys.contains(&key) {
                pending.keys.push(key);
            }
        }
        tx.put_pending_attach(pending);
        self.report.to_attach.push(target_of(r));
        Ok(())
    }

    /// Puts back one unset reference, if its referrer did not change since.
    fn reference<S: StateRead + ?Sized>(
        &mut self,
        tx: &mut Tx<'_, S>,
        ctx: Ctx<'_>,
        referrer: &RefTarget,
        field: &str,
        old_targets: &[RefTarget],
        revision: u64,
    ) -> Result<(), CoreError> {
        let current = tx.resource(&referrer.name)?.filter(|r| r.uid == referrer.uid);
        let Some(mut r) = current else {
            return self.not_restored(tx, ctx, referrer, format!("{field} not restored: the referrer is gone"));
        };
        if r.state != ResourceState::Active {
            return self.not_restored(
                tx,
                ctx,
                referrer,
                format!("{field} not restored: the referrer is not live ({:?})", r.state),
            );
        }
        if r.revision != revision {
            let why = format!(
                "{field} not restored: the referrer changed since the unset (revision {revision} then, {} now)",
                r.revision
            );
            return self.not_restored(tx, ctx, referrer, why);
        }
        for t in old_targets {
            let why = if t.name.region() != ctx.region.as_str() {
                self.remote_wait(tx, t)?
            } else {
                match tx.resource(&t.name)?.filter(|x| x.uid == t.uid) {
                    Some(x) if x.state == ResourceState::Active => None,
                    // A dry run: a member its members phase would restore.
                    Some(x)
                        if x.state == ResourceState::Deleted
                            && self.batch.dry_run
                            && self.batch.remote_live.contains(t) =>
                    {
                        None
                    }
                    Some(x) if x.state == ResourceState::Deleted && !self.batch.final_round => {
                        Some(format!("{} is not restored yet", t.name))
                    }
                    _ => {
                        let why = format!("{field} not restored: its target {} is not live", t.name);
                        return self.not_restored(tx, ctx, referrer, why);
                    }
                }
            };
            if let Some(why) = why {
                match self.wait_or_lose(why) {
                    Fate::Lost(why) => {
                        return self.not_restored(tx, ctx, referrer, format!("{field} not restored: {why}"))
                    }
                    _ => {
                        self.report.waiting.push((referrer.clone(), format!("{field}: waits")));
                        return Ok(());
                    }
                }
            }
        }
        if !self.batch.dry_run {
            let already = tracked_keys(ctx, &r);
            r.refs.insert(field.to_owned(), old_targets.to_vec());
            r.update_time = ctx.now;
            let message = format!(
                "{field} restored by undelete {} (taking back {})",
                self.batch.id, self.batch.of
            );
            let r = put_with_event(tx, ctx, r, EventType::Updated, Some(self.batch.id), &message)?;
            self.attach(tx, ctx, &r, Some(&already))?;
        }
        self.restored(tx, ctx, referrer)
    }

    fn restored<S: StateRead + ?Sized>(
        &mut self,
        tx: &mut Tx<'_, S>,
        ctx: Ctx<'_>,
        who: &RefTarget,
    ) -> Result<(), CoreError> {
        self.report.restored.push(who.clone());
        self.record(tx, ctx, who, OutcomeAction::Restored, |u| u.restored += 1)
    }

    fn not_restored<S: StateRead + ?Sized>(
        &mut self,
        tx: &mut Tx<'_, S>,
        ctx: Ctx<'_>,
        who: &RefTarget,
        reason: String,
    ) -> Result<(), CoreError> {
        self.report.not_restored.push((who.clone(), reason.clone()));
        self.record(tx, ctx, who, OutcomeAction::NotRestored { reason }, |u| {
            u.not_restored += 1
        })
    }

    /// The outcome and the counter, in the undelete's part (not in a dry run).
    fn record<S: StateRead + ?Sized>(
        &mut self,
        tx: &mut Tx<'_, S>,
        ctx: Ctx<'_>,
        who: &RefTarget,
        action: OutcomeAction,
        count: impl FnOnce(&mut Undeletion),
    ) -> Result<(), CoreError> {
        if self.batch.dry_run {
            return Ok(());
        }
        tx.put_outcome(
            self.batch.id,
            Outcome {
                resource: who.clone(),
                action,
                time: ctx.now,
            },
        );
        if let Some(op) = tx.operation_mut(self.batch.id)? {
            if let Some(u) = op.undelete.as_mut() {
                count(u);
            }
            op.changes += 1;
        }
        Ok(())
    }
}

/// Ends this region's part of an undelete: SUCCEEDED when everything was
/// restored, FAILED when something was not (the outcomes say what and
/// why). At the root's region `regions_left` are the regions still to
/// finish: while there are some the part stays RUNNING (the reconciler
/// drives it again). Returns the part.
pub fn finish_undelete_part<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    id: OperationId,
    regions_left: BTreeSet<String>,
    failed_elsewhere: bool,
) -> Result<Step<Operation>, CoreError> {
    let mut tx = Tx::new(state);
    let Some(op) = tx.operation_mut(id)? else {
        return Err(CoreError::OperationNotFound(id.to_string()));
    };
    let Some(u) = op.undelete.as_mut() else {
        return Err(CoreError::invalid(
            "operation_id",
            format!("operation {id} is not an undelete"),
        ));
    };
    let failed = u.not_restored > 0 || failed_elsewhere;
    u.regions_left = regions_left;
    if u.regions_left.is_empty() {
        op.state = if failed {
            OperationState::Failed
        } else {
            OperationState::Succeeded
        };
        op.end_time.get_or_insert(ctx.now);
    } else {
        op.state = OperationState::Running;
        op.end_time = None;
    }
    op.changes += 1;
    let value = op.clone();
    Ok(Step {
        value,
        writes: tx.finish(),
    })
}

/// Starts an undelete at the root's region: its part, with every region
/// still to do, and the reached regions the operation view reads.
pub fn start_undelete<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    batch: UndeleteBatch,
    regions: BTreeSet<String>,
) -> Result<Step<Operation>, CoreError> {
    let mut tx = Tx::new(state);
    ensure_part(&mut tx, ctx, &batch)?;
    let Some(op) = tx.operation_mut(batch.id)? else {
        return Err(CoreError::OperationNotFound(batch.id.to_string()));
    };
    op.reached = regions
        .iter()
        .filter(|r| r.as_str() != ctx.region.as_str())
        .cloned()
        .collect();
    if let Some(u) = op.undelete.as_mut() {
        u.regions_left = regions;
    }
    let value = op.clone();
    Ok(Step {
        value,
        writes: tx.finish(),
    })
}
