//! Undelete of a whole cascade (issue 29): the flows around the core's
//! `protocol::undelete_batch` steps.
//!
//! The root's region drives it. It makes the undelete's part (audited, with
//! every region of the cluster still to do, durable in the part's record),
//! then asks every region for its part, itself first, in two phases:
//! members (buried members back ACTIVE), then references (unset fields put
//! back, their targets being back by then). A phase goes in rounds: a
//! member whose target in another region is not live yet waits for the
//! next round (its region may restore it in this one); rounds stop when
//! nothing waits or a round changed nothing, and a final round reports
//! what still waits NOT_RESTORED. While a region cannot be asked, nothing
//! is given up: the root's part stays RUNNING with that region left, and
//! the reconciler drives the undelete again (every decision is final and
//! skipped by a later run, so a drive repeats nothing) until it is done.
//!
//! A region's part ([`Node::undelete_part_here`], also `Peer.UndeletePart`)
//! pages through the deletion's outcomes there, asks the owners of the
//! remote targets a page names whether they are live (`Peer.Lookup`, each
//! within what is left of the part's deadline and at most
//! [`crate::peers::PEER_CALL_TIMEOUT`]: [`Deadline`]), runs one writer step per page, then
//! attaches the restored references at their owners (as a create's are:
//! durable intents first, the reconciler finishes what an owner that
//! cannot be asked leaves). Every call to another region is within the
//! caller's deadline, and at most [`UNDELETE_CALL_TIMEOUT`]: a part's
//! deadline is what its drive has left of it (the root's own part), or the
//! `grpc-timeout` the root's call to `Peer.UndeletePart` carries. A final
//! round whose Lookup got no answer (its owner away, or the part's time
//! ran out) decides nothing on that page: the part fails as an unreachable
//! region's does, and the reconciler drives it again, rather than call
//! the target not live and its referrer NOT_RESTORED for good.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cascade_core::model::{Operation, OperationState, Outcome, ResourceState};
use cascade_core::peer;
use cascade_core::protocol::{self, Step, UndeleteBatch, UndeletePhase};
use cascade_core::state::WriteSet;
use cascade_core::{CoreError, OperationId, RefTarget, ResourceName, Timestamp};
use futures::StreamExt;
use tracing::{debug, info, warn};

use crate::audit::{AuditContext, Change};
use crate::cluster::CONCURRENT_LOOKUPS;
use crate::error::Fault;
use crate::node::Node;
use crate::peers::{Deadline, LookupAnswer, RemoteError};

/// One region's round of an undelete, asked by the root's region: the
/// whole part there, a page of outcomes per writer step.
pub(crate) const UNDELETE_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Outcomes of the deletion one writer step decides.
const OUTCOMES_PER_STEP: usize = 500;

/// Rounds of one phase at most: each round must restore something for
/// another to run, so this only bounds a pathological chain.
const MAX_ROUNDS: usize = 16;

/// What the root's region asks of a region's part.
#[derive(Debug, Clone)]
pub(crate) struct PartAsk {
    pub(crate) id: OperationId,
    pub(crate) of: OperationId,
    pub(crate) root: RefTarget,
    pub(crate) phase: UndeletePhase,
    pub(crate) final_round: bool,
    pub(crate) dry_run: bool,
    /// A dry run: what other regions' dry runs would restore.
    pub(crate) would_restore: BTreeSet<RefTarget>,
    pub(crate) requested_by: String,
}

/// What a region's round did (or, a dry run, would do).
#[derive(Debug, Clone, Default)]
pub(crate) struct PartAnswer {
    pub(crate) restored: u64,
    pub(crate) not_restored: u64,
    pub(crate) waiting: u64,
    pub(crate) has_part: bool,
    /// A dry run: the members it would restore (at most
    /// `MAX_UNDELETE_LISTED`), and its decisions.
    pub(crate) would_restore: Vec<RefTarget>,
    pub(crate) planned: Vec<Outcome>,
}

/// What `Resources.Undelete` answers.
pub(crate) struct Undeleted {
    /// The undelete (None for a dry run).
    pub(crate) operation: Option<Operation>,
    /// A dry run's decisions, every region's, at most `MAX_UNDELETE_LISTED`.
    pub(crate) planned: Vec<Outcome>,
    pub(crate) planned_more: u64,
    pub(crate) unreachable: Vec<String>,
    pub(crate) of: OperationId,
}

impl Node {
    /// The soft-deleting operation an undelete names: by id, or the one
    /// that buried the root `name`. Read at the root's region.
    pub(crate) fn deletion_to_undelete(
        &self,
        id: Option<OperationId>,
        name: Option<&ResourceName>,
    ) -> Result<Operation, Fault> {
        let state = self.state();
        let id = match (id, name) {
            (Some(id), _) => id,
            (None, Some(name)) => state
                .get_resource(name)?
                .filter(|r| r.state == ResourceState::Deleted)
                .and_then(|r| r.soft_deleted)
                .map(|s| s.operation)
                .ok_or_else(|| CoreError::NotFound(name.clone()))?,
            (None, None) => return Err(CoreError::invalid("operation_id", "name an operation or its root").into()),
        };
        let op = state
            .get_operation(id)?
            .ok_or_else(|| CoreError::OperationNotFound(id.to_string()))?;
        if op.undelete.is_some() {
            return Err(CoreError::invalid("operation_id", format!("{id} is an undelete, not a deletion")).into());
        }
        if op.state == OperationState::Running {
            return Err(CoreError::OperationControl {
                id: id.to_string(),
                why: "is still running: an undelete takes back a finished (or cancelled) deletion".to_owned(),
            }
            .into());
        }
        Ok(op)
    }

    /// Every region of the cluster, this one first (the root's: the
    /// targets of the others' members are mostly here).
    fn undelete_regions(&self) -> Vec<String> {
        let mut regions = vec![self.region.to_string()];
        regions.extend(self.peers.regions().map(str::to_owned));
        regions
    }

    /// `Resources.Undelete` at the root's region: the undelete's part made
    /// (audited for `audit`), then driven in every region; or a dry run.
    /// Forwarded by a node that gave up at `answer_by`, refused past it in
    /// the step that would make the part: nothing undeleted.
    pub(crate) async fn undelete(
        &self,
        of: Operation,
        dry_run: bool,
        requested_by: String,
        audit: AuditContext,
        deadline: Duration,
        answer_by: Option<Timestamp>,
    ) -> Result<Undeleted, Fault> {
        if dry_run {
            return self.undelete_dry_run(of, requested_by, deadline).await;
        }
        let id = self
            .writer
            .apply(|_, _, ids| {
                Ok(Step {
                    value: OperationId(ids.next_uuid()),
                    writes: WriteSet::default(),
                })
            })
            .await?;
        let regions: BTreeSet<String> = self.undelete_regions().into_iter().collect();
        let batch = self.batch_for(id, &of, requested_by, UndeletePhase::Members);
        self.writer
            .apply_audited(
                move |s, c, _| {
                    crate::peers::still_awaited(answer_by, c.now, c.region.as_str(), "Undelete")?;
                    protocol::start_undelete(s, c, batch, regions)
                },
                audit,
                // The call's entry, in the step that makes the undelete.
                |op: &Operation| {
                    vec![Change {
                        action: "undelete",
                        target: op.root.name.to_string(),
                    }]
                },
            )
            .await?;
        info!(region = %self.region, operation = %id, undelete_of = %of.id, "undelete started");
        let (operation, unreachable) = self.drive_undelete(id, deadline).await?;
        Ok(Undeleted {
            operation: Some(operation),
            planned: Vec::new(),
            planned_more: 0,
            unreachable,
            of: of.id,
        })
    }

    fn batch_for(&self, id: OperationId, of: &Operation, requested_by: String, phase: UndeletePhase) -> UndeleteBatch {
        UndeleteBatch {
            id,
            of: of.id,
            root: of.root.clone(),
            requested_by,
            principal: of.principal.clone(),
            phase,
            outcomes: Vec::new(),
            remote_live: BTreeSet::new(),
            final_round: false,
            dry_run: false,
        }
    }

    /// Drives undelete `id` (its part here at the root's region) in every
    /// region it has left; returns the part and the regions that could not
    /// be asked (the reconciler drives it again for them).
    pub(crate) async fn drive_undelete(
        &self,
        id: OperationId,
        deadline: Duration,
    ) -> Result<(Operation, Vec<String>), Fault> {
        let part = self
            .state()
            .get_operation(id)?
            .ok_or_else(|| CoreError::OperationNotFound(id.to_string()))?;
        let Some(undelete) = part.undelete.as_deref() else {
            return Err(CoreError::invalid("operation_id", format!("{id} is not an undelete")).into());
        };
        let (of, root, requested_by) = (undelete.of, part.root.clone(), part.requested_by.clone());
        let regions = self.undelete_regions();
        let mut unreachable: BTreeSet<String> = BTreeSet::new();
        let mut failed_elsewhere = false;
        let started = crate::clock::monotonic_now();
        for phase in [UndeletePhase::Members, UndeletePhase::References] {
            let mut ask = PartAsk {
                id,
                of,
                root: root.clone(),
                phase,
                final_round: false,
                dry_run: false,
                would_restore: BTreeSet::new(),
                requested_by: requested_by.clone(),
            };
            for _ in 0..MAX_ROUNDS {
                let (mut changed, mut waiting) = (0, 0);
                for region in &regions {
                    if unreachable.contains(region) {
                        continue;
                    }
                    let left = deadline.saturating_sub(started.elapsed());
                    match self.ask_part(region, &ask, left).await {
                        Ok(a) => {
                            changed += a.restored + a.not_restored;
                            waiting += a.waiting;
                            failed_elsewhere |= a.not_restored > 0 && *region != self.region.as_str();
                        }
                        Err(e) => {
                            warn!(region = %region, operation = %id, error = %e, "undelete: region not asked; it finishes later");
                            unreachable.insert(region.clone());
                        }
                    }
                }
                if waiting == 0 || changed == 0 {
                    break;
                }
            }
            if !unreachable.is_empty() {
                // What waits may wait on a region that is away: nothing is
                // given up, the reconciler drives the undelete again.
                break;
            }
            ask.final_round = true;
            for region in &regions {
                let left = deadline.saturating_sub(started.elapsed());
                match self.ask_part(region, &ask, left).await {
                    Ok(a) => failed_elsewhere |= a.not_restored > 0 && *region != self.region.as_str(),
                    Err(_) => {
                        unreachable.insert(region.clone());
                    }
                }
            }
        }
        let left = unreachable.clone();
        let op = self
            .writer
            .apply(move |s, c, _| protocol::finish_undelete_part(s, c, id, left, failed_elsewhere))
            .await?;
        // Not read from the table yet (None): the reconciler's first read
        // finds this one there, its state being durable.
        if let Some(set) = self.undeletes_left.lock().ok().as_mut().and_then(|s| s.as_mut()) {
            if unreachable.is_empty() {
                set.remove(&id);
            } else {
                set.insert(id);
            }
        }
        info!(region = %self.region, operation = %id, state = ?op.state, unreachable = ?unreachable, "undelete driven");
        Ok((op, unreachable.into_iter().collect()))
    }

    async fn ask_part(&self, region: &str, ask: &PartAsk, left: Duration) -> Result<PartAnswer, Fault> {
        let deadline = left.min(UNDELETE_CALL_TIMEOUT);
        if region == self.region.as_str() {
            // Bounded as another region's part is, by what the drive has left.
            return self.undelete_part_here(ask.clone(), &Deadline::within(deadline)).await;
        }
        if deadline.is_zero() {
            return Err(CoreError::RegionUnavailable {
                region: region.to_owned(),
                reason: "no time left of the caller's deadline".to_owned(),
            }
            .into());
        }
        self.peers.undelete_part(region, ask, deadline).await.map_err(|e| {
            Fault::from(match e {
                RemoteError::Unreachable(e) => e,
                other => CoreError::RegionUnavailable {
                    region: region.to_owned(),
                    reason: other.to_string(),
                },
            })
        })
    }

    /// One round of this region's part (the root's own, or
    /// `Peer.UndeletePart`): every outcome of the deletion here, a page
    /// per writer step, its Lookups within `deadline` (see the module doc).
    pub(crate) async fn undelete_part_here(&self, ask: PartAsk, deadline: &Deadline) -> Result<PartAnswer, Fault> {
        let mut answer = PartAnswer::default();
        let mut after: Option<ResourceName> = None;
        let mut live: BTreeMap<RefTarget, bool> = BTreeMap::new();
        loop {
            let page = self.state().outcomes(ask.of, after.as_ref(), OUTCOMES_PER_STEP)?;
            let Some(last) = page.last() else { break };
            after = Some(last.resource.name.clone());
            answer.has_part = true;
            let full = page.len() == OUTCOMES_PER_STEP;
            let wanted =
                protocol::remote_targets(&self.state(), &self.schema(), self.region.as_str(), ask.phase, &page)?;
            let (mut remote_live, unanswered) =
                self.live_remotes(wanted, &mut live, &ask.would_restore, deadline).await;
            if let (true, Some(e)) = (ask.final_round, unanswered) {
                // Not decided without its owners' answers (see the module doc).
                return Err(e.into());
            }
            if ask.dry_run {
                // What any region's dry run would restore, this one's too.
                remote_live.extend(ask.would_restore.iter().cloned());
            }
            let batch = UndeleteBatch {
                id: ask.id,
                of: ask.of,
                root: ask.root.clone(),
                requested_by: ask.requested_by.clone(),
                principal: self
                    .state()
                    .get_operation(ask.of)?
                    .map(|op| op.principal)
                    .unwrap_or_default(),
                phase: ask.phase,
                outcomes: page,
                remote_live,
                final_round: ask.final_round,
                dry_run: ask.dry_run,
            };
            let report = self
                .writer
                .apply(move |s, c, _| protocol::undelete_batch(s, c, batch))
                .await?;
            answer.restored += report.restored.len() as u64;
            answer.not_restored += report.not_restored.len() as u64;
            answer.waiting += report.waiting.len() as u64;
            if ask.dry_run {
                let room = cascade_core::limits::MAX_UNDELETE_LISTED.saturating_sub(answer.would_restore.len());
                answer.would_restore.extend(report.restored.iter().take(room).cloned());
                let room = cascade_core::limits::MAX_UNDELETE_LISTED.saturating_sub(answer.planned.len());
                answer.planned.extend(planned(&report).into_iter().take(room));
            } else if !report.to_attach.is_empty() {
                self.attach_restored(report.to_attach).await;
            }
            if !full {
                break;
            }
        }
        // Another region's part ends with its last round of references
        // (the root's region ends its own once every region is done).
        let last_round = ask.phase == UndeletePhase::References && (ask.final_round || answer.waiting == 0);
        if last_round && answer.has_part && !ask.dry_run && ask.root.name.region() != self.region.as_str() {
            let id = ask.id;
            self.writer
                .apply(move |s, c, _| protocol::finish_undelete_part(s, c, id, BTreeSet::new(), false))
                .await?;
        }
        Ok(answer)
    }

    /// Which of `wanted` (targets in other regions) are live at their
    /// owners, each asked once per round, a few at a time, each within what
    /// is left of `deadline` (not asked when nothing is); for a dry run
    /// also those another region's dry run would restore. With them, why a
    /// Lookup got no answer (its owner could not be asked in time), if one
    /// did not: its target counts as not live (it waits), which a final
    /// round must not decide on.
    async fn live_remotes(
        &self,
        wanted: BTreeSet<RefTarget>,
        known: &mut BTreeMap<RefTarget, bool>,
        would_restore: &BTreeSet<RefTarget>,
        deadline: &Deadline,
    ) -> (BTreeSet<RefTarget>, Option<CoreError>) {
        let ask: Vec<RefTarget> = wanted.iter().filter(|t| !known.contains_key(*t)).cloned().collect();
        let answers: Vec<(RefTarget, Result<bool, CoreError>)> = futures::stream::iter(ask)
            .map(|t| async move {
                let region = t.name.region();
                let answer = match deadline.for_call(region, "Lookup") {
                    Ok(within) => match self.peers.lookup(&t.name, within).await {
                        Ok(LookupAnswer::Live(uid)) => Ok(uid == t.uid),
                        Ok(LookupAnswer::Deleting | LookupAnswer::Absent) => Ok(false),
                        // The owner could not be asked in time: no answer.
                        Err(e) => match deadline.blame_remote(region, "Lookup", e) {
                            RemoteError::Unreachable(e) => Err(e),
                            // An answer of its own, or one that did not
                            // decode: not live, as before.
                            _ => Ok(false),
                        },
                    },
                    Err(e) => Err(e),
                };
                (t, answer)
            })
            .buffer_unordered(CONCURRENT_LOOKUPS)
            .collect()
            .await;
        let mut failed = None;
        for (t, answer) in answers {
            let live = answer.unwrap_or_else(|e| {
                failed.get_or_insert(e);
                false
            });
            known.insert(t, live);
        }
        let live = wanted
            .into_iter()
            .filter(|t| known.get(t).copied().unwrap_or(false) || would_restore.contains(t))
            .collect();
        (live, failed)
    }

    /// Attaches the cross-region references of restored resources at their
    /// owners, all at once, and confirms them in one step. An owner that
    /// refuses (a target deleted since its lookup) is met as an update's
    /// would be: each resource is then settled alone, and the refused
    /// references are taken back. An owner that cannot be asked leaves the
    /// durable intents to the reconciler.
    async fn attach_restored(&self, restored: Vec<RefTarget>) {
        let mut members = Vec::new();
        let mut entries = Vec::new();
        for t in &restored {
            match self.pending_entries(t.uid) {
                Ok((keys, e)) => {
                    members.push((t.name.clone(), t.uid, keys));
                    entries.extend(e);
                }
                Err(e) => {
                    debug!(name = %t.name, error = %e, "undelete: no pending attach read; the reconciler settles it")
                }
            }
        }
        // The part's own bound covers it (its caller, the root's region,
        // asks within UNDELETE_CALL_TIMEOUT, and a reconciler pass has no
        // caller): each attach within PEER_CALL_TIMEOUT.
        match self.attach_at_owners(entries, &Deadline::NONE).await {
            Ok(()) => {
                let settled = self
                    .writer
                    .apply(move |s, c, _| peer::settle_batch(s, c, members, Ok(())))
                    .await;
                if let Err(e) = settled {
                    debug!(error = %e, "undelete: attaches not confirmed here; the reconciler confirms them");
                }
            }
            Err(e @ CoreError::RegionUnavailable { .. }) => {
                debug!(error = %e, "undelete: an owner is away; the reconciler attaches the restored references");
            }
            Err(e) => {
                info!(error = %e, "undelete: an owner refused an attach; each restored resource is settled alone");
                for t in restored {
                    if let Ok(Some(r)) = self.state().get_resource(&t.name) {
                        self.reconcile(&r).await;
                    }
                }
            }
        }
    }

    /// A dry run in every region: rounds of every region's members phase,
    /// each counting live what the others would restore, then the
    /// references phase; nothing is written anywhere.
    async fn undelete_dry_run(
        &self,
        of: Operation,
        requested_by: String,
        deadline: Duration,
    ) -> Result<Undeleted, Fault> {
        let regions = self.undelete_regions();
        let started = crate::clock::monotonic_now();
        let mut unreachable = BTreeSet::new();
        let mut would_restore: BTreeSet<RefTarget> = BTreeSet::new();
        let mut planned: BTreeMap<(String, ResourceName), Outcome> = BTreeMap::new();
        for phase in [UndeletePhase::Members, UndeletePhase::References] {
            for round in 0..regions.len().max(1) {
                let grown = would_restore.len();
                let last = round + 1 == regions.len().max(1);
                for region in &regions {
                    if unreachable.contains(region) {
                        continue;
                    }
                    let ask = PartAsk {
                        id: of.id,
                        of: of.id,
                        root: of.root.clone(),
                        phase,
                        final_round: last,
                        dry_run: true,
                        would_restore: would_restore.clone(),
                        requested_by: requested_by.clone(),
                    };
                    let left = deadline.saturating_sub(started.elapsed());
                    match self.ask_part(region, &ask, left).await {
                        Ok(a) => {
                            would_restore.extend(a.would_restore);
                            for o in a.planned {
                                planned.insert((region.clone(), o.resource.name.clone()), o);
                            }
                        }
                        Err(_) => {
                            unreachable.insert(region.clone());
                        }
                    }
                }
                if would_restore.len() == grown && round > 0 {
                    break;
                }
                if phase == UndeletePhase::References {
                    break; // references wait on members only
                }
            }
        }
        let total = planned.len();
        let planned: Vec<Outcome> = planned
            .into_values()
            .take(cascade_core::limits::MAX_UNDELETE_LISTED)
            .collect();
        Ok(Undeleted {
            operation: None,
            planned_more: (total - planned.len()) as u64,
            planned,
            unreachable: unreachable.into_iter().collect(),
            of: of.id,
        })
    }
}

/// A dry run's decisions as outcomes (RESTORED, NOT_RESTORED with why;
/// what still waits is NOT_RESTORED with what it waits for).
fn planned(report: &protocol::UndeleteReport) -> Vec<Outcome> {
    use cascade_core::model::OutcomeAction;
    let at = cascade_core::Timestamp(0);
    let restored = report.restored.iter().map(|t| Outcome {
        resource: t.clone(),
        action: OutcomeAction::Restored,
        time: at,
    });
    let lost = report
        .not_restored
        .iter()
        .chain(&report.waiting)
        .map(|(t, why)| Outcome {
            resource: t.clone(),
            action: OutcomeAction::NotRestored { reason: why.clone() },
            time: at,
        });
    restored.chain(lost).collect()
}

/// The reconciler's turn: drives again the undeletes this region started
/// that some region has not finished (found once per process in the
/// operations table, then kept in memory by every drive).
pub(crate) async fn reconcile(node: &Node) {
    let known = node.undeletes_left.lock().ok().and_then(|s| s.clone());
    let left = match known {
        Some(left) => left,
        None => {
            let found = running_undeletes(node).unwrap_or_default();
            if let Ok(mut s) = node.undeletes_left.lock() {
                *s = Some(found.clone());
            }
            found
        }
    };
    for id in left {
        if let Err(e) = node.drive_undelete(id, UNDELETE_CALL_TIMEOUT).await {
            debug!(operation = %id, error = %e, "undelete not finished; driven again later");
        }
    }
}

/// The undeletes rooted here with regions left, from the operations table.
fn running_undeletes(node: &Node) -> Result<BTreeSet<OperationId>, Fault> {
    let state = node.state();
    let mut out = BTreeSet::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page: Vec<Operation> = state.scan(crate::store::Table::Operations, &[], after.as_deref(), 1000)?;
        let Some(last) = page.last() else { break };
        after = Some(last.id.0.as_bytes().to_vec());
        let full = page.len() == 1000;
        out.extend(
            page.into_iter()
                .filter(|op| op.undelete.as_ref().is_some_and(|u| !u.regions_left.is_empty()))
                .filter(|op| op.root.name.region() == node.region.as_str())
                .map(|op| op.id),
        );
        if !full {
            break;
        }
    }
    Ok(out)
}
