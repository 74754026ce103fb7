//! The Undelete part of the model (issue 29 item 2, behind
//! [`Config::undelete`]): the client's Undelete of the root's soft-deleting
//! operation, driven by ra as the node drives it (`cascade-node`'s
//! `undelete.rs`), racing the expiry and a second Delete.
//!
//! - `UndeleteStart`: once the root's deletion is finished at ra (the node
//!   refuses a running one), `protocol::start_undelete` at ra, and ra's
//!   driver starts (it lives in ra's memory: a crash of ra loses it).
//! - `UndeleteAsk`: the driver asks the next region for one round of the
//!   current phase (members, then references; rounds until nothing waits
//!   or nothing changed, then a final round), as `Peer.UndeletePart`: that
//!   region's lookups of the remote targets (at their owners, as they are
//!   now), its `protocol::undelete_batch` step over every outcome of the
//!   deletion there, the attaches of what it restored (`peer::attach` at
//!   each owner, then `peer::settle`), and, at its last round, its
//!   `finish_undelete_part`. The call is one atomic action (its steps
//!   commit before it answers); its answer may be lost (a fault): the
//!   driver then counts the region unreachable and ends with it left.
//! - `UndeleteRedrive`: the reconciler drives the undelete again while ra's
//!   part has regions left and no drive is under way (after a lost answer
//!   or a crash of ra); every decision is final, so a drive repeats nothing.
//! - `DeleteAgain`: a second client deletes `rc/port_group/g` (a member, a
//!   leaf; its reference to `rb/port/pt` is restored with it), without a
//!   retention, at any moment after the Undelete started: refused while g
//!   is still buried, a new deletion (and a purge) once it is restored.
//! - `TouchReferrer`: a client updates `rb/floating_ip/f` (whose `port` the
//!   cascade unset) at any moment after the root's delete: from then on its
//!   reference may not be put back.
//!
//! The expiry is the existing clock jump (`Work { jump }`): it passes the
//! window of every member buried before it.

use std::collections::BTreeSet;

use cascade_core::model::{Operation, OperationState, Outcome, OutcomeAction};
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::protocol::{self, DeleteOutcome, RefRequest, ResourceSpec, UndeleteBatch, UndeletePhase};
use cascade_core::{CoreError, OperationId, RefTarget, ResourceState, Uid};

use super::{ids_after, region_of, rn, user_delete, Action, CascadeModel, State, CLOSURE, RA, REGIONS};
use cascade_core::IdSource as _;

/// The member the second client deletes again.
pub const AGAIN: &str = "rc/port_group/g";
/// What the second Delete of [`AGAIN`] reaches (a leaf: itself). A member
/// whose second deletion crosses regions would need the closure check the
/// model runs for the root's operation only.
pub const AGAIN_CLOSURE: [&str; 1] = ["rc/port_group/g"];
/// The referrer whose `port` the cascade unsets (to [`AGAIN`]).
pub const REFERRER: &str = "rb/floating_ip/f";

/// Rounds of one phase at most (the node's `MAX_ROUNDS`).
const MAX_ROUNDS: u8 = 16;

/// Ids of the model's clones of its id source (see `ids_after`): the
/// root's delete takes the first, the blocker's the second, the racing
/// create the third, the controls the fourth; these come well after.
const UNDELETE_IDS: usize = 16;
const AGAIN_IDS: usize = 24;

/// ra's driver of the undelete (in its memory, as the node's
/// `drive_undelete` loop).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drive {
    pub id: OperationId,
    pub of: OperationId,
    pub root: RefTarget,
    pub phase: UndeletePhase,
    pub final_round: bool,
    /// The region asked next (index into [`REGIONS`]).
    pub next: usize,
    pub rounds: u8,
    /// Restored plus not restored, this round.
    pub changed: u64,
    /// Left waiting, this round.
    pub waiting: u64,
    /// Regions whose answer was lost: not asked again by this drive.
    pub unreachable: BTreeSet<usize>,
    pub failed_elsewhere: bool,
}

impl Drive {
    fn new(id: OperationId, of: OperationId, root: RefTarget) -> Self {
        Self {
            id,
            of,
            root,
            phase: UndeletePhase::Members,
            final_round: false,
            next: RA,
            rounds: 0,
            changed: 0,
            waiting: 0,
            unreachable: BTreeSet::new(),
            failed_elsewhere: false,
        }
    }
}

/// What a region's round answered: restored, not restored, waiting.
type PartAnswer = (u64, u64, u64);

impl CascadeModel {
    /// The client's Undelete, its drives, and the races against it.
    pub(crate) fn undelete_actions(&self, s: &State, actions: &mut Vec<Action>) {
        if !self.config.undelete {
            return;
        }
        if s.undelete.is_none() && self.deletion_to_undelete(s).is_some() {
            actions.push(Action::UndeleteStart);
        }
        if let Some(drive) = &s.drive {
            actions.push(Action::UndeleteAsk { answered: true });
            if s.faults > 0 && drive.next != RA {
                actions.push(Action::UndeleteAsk { answered: false });
            }
            if s.faults > 0 && !actions.contains(&Action::Crash(RA)) {
                actions.push(Action::Crash(RA));
            }
        } else if self.redrive_due(s) {
            actions.push(Action::UndeleteRedrive);
        }
        if s.undelete.is_some() && s.deleted_again.is_none() {
            actions.push(Action::DeleteAgain);
        }
        if s.root_deleted && s.touched.is_none() {
            actions.push(Action::TouchReferrer);
        }
    }

    /// The root's finished soft-deleting operation at ra (what the node's
    /// `deletion_to_undelete` accepts).
    fn deletion_to_undelete(&self, s: &State) -> Option<Operation> {
        let id = Self::root_operation_id(s)?;
        let op = s.regions[RA].state.operations.get(&id)?;
        (op.state != OperationState::Running).then(|| op.clone())
    }

    /// ra's part of the undelete has regions left and nothing drives it.
    pub(crate) fn redrive_due(&self, s: &State) -> bool {
        s.drive.is_none()
            && s.undelete.is_some_and(|id| {
                s.regions[RA]
                    .state
                    .operations
                    .get(&id)
                    .and_then(|op| op.undelete.as_ref())
                    .is_some_and(|u| !u.regions_left.is_empty())
            })
    }

    pub(crate) fn undelete_step(&self, s: &mut State, action: &Action) -> Option<()> {
        match action {
            Action::UndeleteStart => {
                let of = self.deletion_to_undelete(s)?;
                let id = OperationId(ids_after(&self.ids, UNDELETE_IDS).next_uuid());
                let batch = Self::batch(id, &of, UndeletePhase::Members, Vec::new(), BTreeSet::new(), false);
                let regions = REGIONS.iter().map(|r| (*r).to_owned()).collect();
                let step = protocol::start_undelete(&s.regions[RA].state, self.ctx(s, RA), batch, regions)
                    .unwrap_or_else(|e| panic!("start the undelete: {e}"));
                s.regions[RA].state.apply(step.writes);
                s.undelete = Some(id);
                s.drive = Some(Drive::new(id, of.id, of.root));
            }
            Action::UndeleteRedrive => {
                let id = s.undelete?;
                let op = s.regions[RA].state.operations.get(&id)?;
                let of = op.undelete.as_ref()?.of;
                s.drive = Some(Drive::new(id, of, op.root.clone()));
            }
            Action::UndeleteAsk { answered } => {
                let mut drive = s.drive.take()?;
                let region = drive.next;
                let (restored, not_restored, waiting) = self.part_here(s, region, &drive);
                if *answered {
                    drive.changed += restored + not_restored;
                    drive.waiting += waiting;
                    drive.failed_elsewhere |= not_restored > 0 && region != RA;
                } else {
                    drive.unreachable.insert(region);
                    s.faults -= 1;
                }
                s.drive = self.advance(s, drive);
            }
            Action::DeleteAgain => {
                let mut ids = ids_after(&self.ids, AGAIN_IDS);
                let region = region_of(&rn(AGAIN));
                // Refused while pt is buried (it reads as absent): nothing changes.
                let accepted = match protocol::delete(
                    &s.regions[region].state,
                    self.ctx(s, region),
                    &mut ids,
                    user_delete(AGAIN, 0),
                ) {
                    Ok(step) => {
                        let accepted = matches!(step.value, DeleteOutcome::Accepted(_));
                        s.regions[region].state.apply(step.writes);
                        accepted
                    }
                    Err(_) => false,
                };
                s.deleted_again = Some(accepted);
            }
            Action::TouchReferrer => {
                let name = rn(REFERRER);
                let region = region_of(&name);
                let restored = self.restored_outcome(s, &name).is_some();
                // Only a change after the cascade's unset may keep it unset
                // (the unset's undo names the revision it left).
                let unset = Self::root_operation_id(s).is_some_and(|of| {
                    s.regions[region]
                        .state
                        .outcomes
                        .get(&(of, name.clone()))
                        .is_some_and(|o| matches!(o.action, OutcomeAction::Unset { .. }))
                });
                let r = s.regions[region].state.resources.get(&name)?.clone();
                let mut attributes = r.attributes.clone();
                attributes.insert("touched".to_owned(), "yes".to_owned());
                let spec = ResourceSpec {
                    name: REFERRER.to_owned(),
                    attributes,
                    refs: r
                        .refs
                        .iter()
                        .map(|(field, targets)| {
                            let targets = targets
                                .iter()
                                .map(|t| RefRequest {
                                    name: t.name.to_string(),
                                    uid: Some(t.uid),
                                })
                                .collect();
                            (field.clone(), targets)
                        })
                        .collect(),
                    finalizers: r.finalizers.clone(),
                };
                let touched = match protocol::update(&s.regions[region].state, self.ctx(s, region), spec, None) {
                    Ok(step) => {
                        s.regions[region].state.apply(step.writes);
                        true
                    }
                    Err(_) => false,
                };
                s.touched = Some(touched && unset && !restored);
            }
            _ => return None,
        }
        Some(())
    }

    fn batch(
        id: OperationId,
        of: &Operation,
        phase: UndeletePhase,
        outcomes: Vec<Outcome>,
        remote_live: BTreeSet<RefTarget>,
        final_round: bool,
    ) -> UndeleteBatch {
        UndeleteBatch {
            id,
            of: of.id,
            root: of.root.clone(),
            requested_by: "model".to_owned(),
            principal: of.principal.clone(),
            phase,
            outcomes,
            remote_live,
            final_round,
            dry_run: false,
        }
    }

    /// The driver moves on after an answer: the next region, round, phase,
    /// or the end of the drive (None).
    fn advance(&self, s: &mut State, mut drive: Drive) -> Option<Drive> {
        drive.next += 1;
        while drive.next < REGIONS.len() && !drive.final_round && drive.unreachable.contains(&drive.next) {
            drive.next += 1;
        }
        if drive.next < REGIONS.len() {
            return Some(drive);
        }
        drive.next = RA;
        let (changed, waiting) = (drive.changed, drive.waiting);
        drive.changed = 0;
        drive.waiting = 0;
        if !drive.final_round {
            if waiting == 0 || changed == 0 || drive.rounds + 1 >= MAX_ROUNDS {
                if !drive.unreachable.is_empty() {
                    // What waits may wait on a region that is away: the
                    // reconciler drives it again.
                    self.finish(s, &drive);
                    return None;
                }
                drive.final_round = true;
            } else {
                drive.rounds += 1;
            }
            return Some(drive);
        }
        if drive.phase == UndeletePhase::Members {
            drive.phase = UndeletePhase::References;
            drive.final_round = false;
            drive.rounds = 0;
            return Some(drive);
        }
        self.finish(s, &drive);
        None
    }

    fn finish(&self, s: &mut State, drive: &Drive) {
        let left = drive.unreachable.iter().map(|r| REGIONS[*r].to_owned()).collect();
        let step = protocol::finish_undelete_part(
            &s.regions[RA].state,
            self.ctx(s, RA),
            drive.id,
            left,
            drive.failed_elsewhere,
        )
        .unwrap_or_else(|e| panic!("finish the undelete at ra: {e}"));
        s.regions[RA].state.apply(step.writes);
    }

    /// One region's round (the node's `undelete_part_here`, one page).
    fn part_here(&self, s: &mut State, region: usize, drive: &Drive) -> PartAnswer {
        let st = &s.regions[region].state;
        let outcomes: Vec<Outcome> = st
            .outcomes
            .iter()
            .filter(|((op, _), _)| *op == drive.of)
            .map(|(_, o)| o.clone())
            .collect();
        if outcomes.is_empty() {
            return (0, 0, 0);
        }
        let wanted = protocol::remote_targets(st, &self.schema, REGIONS[region], drive.phase, &outcomes)
            .unwrap_or_else(|e| panic!("remote targets at {}: {e}", REGIONS[region]));
        // `Peer.Lookup` at each owner: live under that uid.
        let remote_live = wanted.into_iter().filter(|t| Self::live(s, t)).collect();
        // The deletion's record here (its principal); a region's part
        // names the same operation.
        let Some(of) = st.operations.get(&drive.of).cloned() else {
            return (0, 0, 0);
        };
        let of = Operation {
            root: drive.root.clone(),
            ..of
        };
        let batch = Self::batch(drive.id, &of, drive.phase, outcomes, remote_live, drive.final_round);
        let step = protocol::undelete_batch(&s.regions[region].state, self.ctx(s, region), batch)
            .unwrap_or_else(|e| panic!("undelete batch at {}: {e}", REGIONS[region]));
        s.regions[region].state.apply(step.writes);
        let report = step.value;
        for t in &report.to_attach {
            self.attach_restored(s, region, t);
        }
        let waiting = report.waiting.len() as u64;
        let last_round = drive.phase == UndeletePhase::References && (drive.final_round || waiting == 0);
        if last_round && region != RA {
            let step = protocol::finish_undelete_part(
                &s.regions[region].state,
                self.ctx(s, region),
                drive.id,
                BTreeSet::new(),
                false,
            )
            .unwrap_or_else(|e| panic!("finish the undelete at {}: {e}", REGIONS[region]));
            s.regions[region].state.apply(step.writes);
        }
        (report.restored.len() as u64, report.not_restored.len() as u64, waiting)
    }

    /// What the owner's `Peer.Lookup` says: live under that uid.
    fn live(s: &State, t: &RefTarget) -> bool {
        s.regions[region_of(&t.name)]
            .state
            .resources
            .get(&t.name)
            .is_some_and(|r| r.uid == t.uid && r.state == ResourceState::Active)
    }

    /// The restored `t`'s cross-region references attached at their owners
    /// and settled (a refusal settles it alone, as the node's
    /// `attach_restored` does).
    fn attach_restored(&self, s: &mut State, region: usize, t: &RefTarget) {
        let st = &s.regions[region].state;
        let Some(pending) = st.pending_attach.get(&t.uid) else {
            return;
        };
        let keys = pending.keys.clone();
        let mut by_owner: std::collections::BTreeMap<usize, Vec<PeerBackRef>> = Default::default();
        for row in st.backrefs.values().filter(|b| b.referrer.uid == t.uid) {
            let entry = PeerBackRef {
                target: row.target.clone(),
                referrer: row.referrer.clone(),
                field: row.field.clone(),
                generation: row.generation,
            };
            if keys.contains(&entry.key()) {
                by_owner.entry(region_of(&row.target.name)).or_default().push(entry);
            }
        }
        let mut attached = Ok(());
        for (owner, entries) in by_owner {
            match peer::attach(&s.regions[owner].state, self.ctx(s, owner), REGIONS[region], entries) {
                Ok(step) => s.regions[owner].state.apply(step.writes),
                Err(e) => {
                    attached = Err(CoreError::AttachRefused {
                        region: REGIONS[owner].to_owned(),
                        reason: e.to_string(),
                    });
                    break;
                }
            }
        }
        let step = peer::settle(
            &s.regions[region].state,
            self.ctx(s, region),
            &t.name,
            t.uid,
            &keys,
            attached,
        )
        .unwrap_or_else(|e| panic!("settle the restored {}: {e}", t.name));
        s.regions[region].state.apply(step.writes);
    }

    /// The undelete's RESTORED outcome of `name`, if any.
    fn restored_outcome(&self, s: &State, name: &cascade_core::ResourceName) -> Option<Outcome> {
        let id = s.undelete?;
        s.regions[region_of(name)]
            .state
            .outcomes
            .get(&(id, name.clone()))
            .filter(|o| o.action == OutcomeAction::Restored)
            .cloned()
    }

    /// The second Delete may have taken `name` again.
    fn deleted_again(s: &State, name: &str) -> bool {
        s.deleted_again == Some(true) && AGAIN_CLOSURE.contains(&name)
    }
}

/// The properties of the Undelete; each returns what violates it.
impl CascadeModel {
    /// Members RESTORED by the undelete and gone from the store, or still
    /// buried (a second Delete may take a restored member again).
    pub fn restored_but_gone(&self, s: &State) -> Vec<String> {
        let Some(id) = s.undelete else { return Vec::new() };
        let mut out = Vec::new();
        for r in &s.regions {
            for ((op, name), o) in &r.state.outcomes {
                if *op != id || o.action != OutcomeAction::Restored || Self::deleted_again(s, name.as_str()) {
                    continue;
                }
                match r.state.resources.get(name).filter(|x| x.uid == o.resource.uid) {
                    None => out.push(format!("{name} is RESTORED and purged")),
                    Some(x) if x.state == ResourceState::Deleted => {
                        out.push(format!("{name} is RESTORED and still buried"))
                    }
                    Some(_) => {}
                }
            }
        }
        out
    }

    /// Once the undelete ended at ra: members of the deletion with no
    /// outcome of the undelete, RESTORED ones not live with their uid, and
    /// NOT_RESTORED ones without a reason.
    pub fn unaccounted(&self, s: &State) -> Vec<String> {
        let Some(id) = s.undelete else { return Vec::new() };
        let Some(op) = s.regions[RA].state.operations.get(&id) else {
            return vec![format!("the undelete {id} has no part at ra")];
        };
        if op.state == OperationState::Running {
            return Vec::new();
        }
        let Some(of) = op.undelete.as_ref().map(|u| u.of) else {
            return vec![format!("{id} is not an undelete")];
        };
        let mut out = Vec::new();
        for r in &s.regions {
            for ((_, name), member) in r.state.outcomes.iter().filter(|((op, _), _)| *op == of) {
                if member.action != OutcomeAction::Deleted {
                    continue;
                }
                match r.state.outcomes.get(&(id, name.clone())).map(|o| &o.action) {
                    None => out.push(format!("{name}: no outcome after the undelete ended")),
                    Some(OutcomeAction::NotRestored { reason }) if reason.is_empty() => {
                        out.push(format!("{name}: NOT_RESTORED without a reason"))
                    }
                    Some(OutcomeAction::Restored) if !Self::deleted_again(s, name.as_str()) => {
                        let live = r
                            .state
                            .resources
                            .get(name)
                            .is_some_and(|x| x.uid == member.resource.uid && x.state == ResourceState::Active);
                        if !live {
                            out.push(format!("{name}: RESTORED but not live with its uid"));
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        out
    }

    /// A closure name held under a new uid (a purged name resurrected),
    /// and an unset reference put back after its referrer changed.
    pub fn restored_wrongly(&self, s: &State) -> Vec<String> {
        let mut out = Vec::new();
        for name in CLOSURE {
            let name = rn(name);
            if let (Some(r), Some(uid)) = (
                s.regions[region_of(&name)].state.resources.get(&name),
                self.initial.get(&name),
            ) {
                if r.uid != *uid {
                    out.push(format!("{name} is held under a new uid"));
                }
            }
        }
        if s.touched == Some(true) && self.restored_outcome(s, &rn(REFERRER)).is_some() {
            out.push(format!("{REFERRER}'s reference was put back after it changed"));
        }
        out
    }

    /// The undelete ended at ra with no drive under way, or (never
    /// started) the world is quiet and it cannot start.
    pub fn undelete_settled(&self, s: &State) -> bool {
        match s.undelete {
            None => s.root_deleted && self.quiescent(s) && self.deletion_to_undelete(s).is_none(),
            Some(id) => {
                s.drive.is_none()
                    && s.regions[RA]
                        .state
                        .operations
                        .get(&id)
                        .is_some_and(|op| op.state != OperationState::Running)
            }
        }
    }

    /// Members of the closure in two regions RESTORED by the undelete.
    pub fn undelete_restored_across_regions(&self, s: &State) -> bool {
        let regions: BTreeSet<&str> = CLOSURE
            .iter()
            .filter(|n| self.restored_outcome(s, &rn(n)).is_some())
            .map(|n| rn(n).region().to_owned())
            .map(|r| REGIONS.iter().copied().find(|x| *x == r).unwrap_or("?"))
            .collect();
        regions.len() >= 2
    }

    /// Some member NOT_RESTORED because its window passed.
    pub fn undelete_met_the_expiry(&self, s: &State) -> bool {
        s.undelete.is_some_and(|id| {
            s.regions.iter().any(|r| {
                r.state.outcomes.iter().any(|((op, _), o)| {
                    *op == id
                        && matches!(&o.action, OutcomeAction::NotRestored { reason } if reason.starts_with("expired"))
                })
            })
        })
    }

    /// Uids the undelete brought back (from the Undeleted events).
    pub(crate) fn record_restored(s: &mut State) {
        for r in &s.regions {
            s.restored.extend(
                r.state
                    .events
                    .iter()
                    .filter(|e| e.event_type == cascade_core::EventType::Undeleted)
                    .map(|e| e.resource.uid),
            );
        }
    }

    /// Another region's tombstone of a member the undelete brought back,
    /// while that region has yet to apply the owner's SoftDeleted event of
    /// it (region, name): the undelete may start as soon as the deletion
    /// finished, before every Watch stream delivered the bury, and the
    /// event removes the tombstone (`peer::apply_remote_events`). Until
    /// then that region refuses new references to the member, as it did
    /// while it was buried; the core checker's in-flight `resurrection`
    /// finding for it is expected (found by this model, seed 29).
    pub(crate) fn tombstones_awaiting_their_event(s: &State) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        for (watcher, r) in s.regions.iter().enumerate() {
            for uid in r.state.remote_deletions.keys().filter(|u| Self::was_restored(s, **u)) {
                let pending = (0..REGIONS.len()).filter(|o| *o != watcher).find_map(|owner| {
                    Self::undelivered(s, owner, watcher).into_iter().find(|e| {
                        e.resource.uid == *uid
                            && matches!(
                                e.event_type,
                                cascade_core::EventType::SoftDeleted | cascade_core::EventType::Purged
                            )
                    })
                });
                if let Some(e) = pending {
                    out.push((REGIONS[watcher], e.resource.name.to_string()));
                }
            }
        }
        out
    }

    /// Whether `uid` was brought back by the undelete.
    pub(crate) fn was_restored(s: &State, uid: Uid) -> bool {
        s.restored.contains(&uid)
    }
}
