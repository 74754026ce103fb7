//! Whether a cascade's whole closure, in every region it touched, is
//! finished: asked of the regions the cascade spread to, transitively, and
//! of no other.
//!
//! The root of a cross-region cascade stays DELETING (readable, with its
//! progress) until every region's part of its operation is done
//! (Kubernetes' foreground rule across regions). Its region learns that
//! from the parts themselves: each region's part records the regions it
//! handed work to ([`Operation::reached`]: it had `cascade` or `unset`
//! referrers there, or one of them released a row of the deletion). The
//! check starts from the root's own `reached`, reads those regions' parts,
//! adds the regions *they* reached, and so on until no new region comes
//! up; a region outside that set holds no part and is never asked, so an
//! unreachable region that the cascade never touched delays no one
//! (Dijkstra–Scholten's idea: termination is detected along the tree of
//! regions that handed each other work, not over the whole cluster).
//!
//! # Why a double collect over that set is enough
//!
//! The set is read twice ([`Phase::First`], then [`Phase::Second`] over
//! exactly the regions the first found). The check confirms only if every
//! part had nothing pending and each part's (pending, changes, reached)
//! was the same in both reads. A part's `changes` grows with every change
//! of its progress or of its `reached`, so each part was constant over an
//! interval from its first read to its second; every first read came
//! before every second read, so there is an instant `t` inside all those
//! intervals. At `t`:
//!
//! - every part of the set had nothing pending;
//! - the set was closed under `reached`, as read;
//! - a region `X` with a part got it from a deletion in some region `Y`
//!   whose resource `X` imports. `Y`'s deletion is finished at `t` (if `Y`
//!   is in the set: nothing pending there), and a deletion finishes only
//!   after every region holding rows of it released them, each release or
//!   walk noting that region in `Y`'s `reached` (`protocol::note_reached`,
//!   `peer::release`). So `X` is in `Y.reached`, hence in the set. By
//!   induction from the root's region, every region with a part is in the
//!   set, and none had anything pending at `t`.
//!
//! After `t` nothing can start new work for the operation (the root is the
//! only DELETING resource of it, its referrers have all released, and
//! nothing attaches to a DELETING resource): the root may go, which
//! [`crate::protocol::confirm_remote_closure`] checks against the root
//! region's own part (its `changes` read before the first collect).
//!
//! A node of an earlier version does not report what its part reached
//! ([`PartSummary::reached`] is None); the check then asks every region of
//! the cluster, as every version before this one did.
//!
//! The driver is sans-IO, like [`crate::plan::PlanDriver`]: the node asks
//! [`ClosureCheck::next_round`] which regions to read (all of one round at
//! once), hands each answer to [`ClosureCheck::answer`], and reads
//! [`ClosureCheck::verdict`] when no round is left. The model checker
//! drives the same code one read at a time, interleaved with everything
//! else that can happen.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::Operation;

/// What one region's part of an operation says about its progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartSummary {
    /// Deletions of the part not finished yet.
    pub pending: u64,
    /// The part's change counter ([`Operation::changes`]).
    pub changes: u64,
    /// The regions the part handed work to; None when the region's node
    /// does not say (an earlier version): then every region is asked.
    pub reached: Option<BTreeSet<String>>,
}

impl PartSummary {
    /// The summary of a stored part.
    pub fn of(op: &Operation) -> Self {
        Self {
            pending: op.progress.pending,
            changes: op.changes,
            reached: Some(op.reached.clone()),
        }
    }
}

/// What a region answered when asked for its part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartAnswer {
    /// Its part.
    Part(PartSummary),
    /// It holds no part of the operation (it never started one, or a
    /// periodic check dropped its rows before it acted on them).
    NoPart,
    /// It could not be asked, or did not answer in time; why.
    Unreachable(String),
}

/// Which read of the double collect is under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Finding the regions the cascade touched, reading each once.
    First,
    /// Reading the same regions again.
    Second,
    /// Both reads done, or the check gave up early.
    Done,
}

/// Why the root cannot go yet: one entry per region that holds it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holdup {
    /// The region's part has deletions pending.
    Pending {
        /// The region.
        region: String,
        /// How many.
        pending: u64,
    },
    /// The region's part changed between the two reads.
    Changed {
        /// The region.
        region: String,
    },
    /// The region could not be asked.
    Unreachable {
        /// The region.
        region: String,
        /// Why.
        reason: String,
    },
}

impl std::fmt::Display for Holdup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holdup::Pending { region, pending } => write!(f, "region {region} has {pending} deletion(s) pending"),
            Holdup::Changed { region } => write!(f, "region {region}'s part changed while it was read"),
            Holdup::Unreachable { region, reason } => write!(f, "region {region} could not be asked: {reason}"),
        }
    }
}

/// The outcome of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every region the cascade touched is finished: confirm with the root
    /// region's own change count read before the first collect.
    Finished {
        /// For [`crate::protocol::confirm_remote_closure`].
        local_changes: u64,
        /// The regions that were read (each twice).
        touched: BTreeSet<String>,
    },
    /// Not now; the reasons (never empty).
    NotYet(Vec<Holdup>),
}

/// One double collect over the regions an operation's cascade touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosureCheck {
    own_region: String,
    every_region: BTreeSet<String>,
    local_changes: u64,
    phase: Phase,
    /// Regions known to be touched, not asked yet in this phase.
    frontier: BTreeSet<String>,
    /// Asked in this phase, answer not in yet.
    asked: BTreeSet<String>,
    first: BTreeMap<String, Option<PartSummary>>,
    second: BTreeMap<String, Option<PartSummary>>,
    holdups: Vec<Holdup>,
}

impl ClosureCheck {
    /// Starts a check of `local` (the root region's own part, read now)
    /// in `own_region`, whose peers are `peers` (asked only when a part
    /// does not say what it reached).
    pub fn start<'p>(own_region: &str, peers: impl IntoIterator<Item = &'p str>, local: &Operation) -> Self {
        let mut check = Self {
            own_region: own_region.to_owned(),
            every_region: peers.into_iter().map(str::to_owned).collect(),
            local_changes: local.changes,
            phase: Phase::First,
            frontier: BTreeSet::new(),
            asked: BTreeSet::new(),
            first: BTreeMap::new(),
            second: BTreeMap::new(),
            holdups: Vec::new(),
        };
        check.every_region.remove(own_region);
        let reached = local.reached.clone();
        check.discover(Some(&reached));
        check
    }

    /// The regions to ask now (all at once); empty when the check is done
    /// or waits for answers already asked for.
    pub fn next_round(&mut self) -> Vec<String> {
        if self.phase == Phase::Done || !self.asked.is_empty() {
            return Vec::new();
        }
        let round: Vec<String> = std::mem::take(&mut self.frontier).into_iter().collect();
        self.asked.extend(round.iter().cloned());
        round
    }

    /// The regions asked in this round whose answers are not in yet.
    pub fn awaiting(&self) -> impl Iterator<Item = &str> {
        self.asked.iter().map(String::as_str)
    }

    /// Which read is under way.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// `region`'s answer to this phase's read. An answer for a region not
    /// asked in this phase is ignored.
    pub fn answer(&mut self, region: &str, answer: PartAnswer) {
        if !self.asked.remove(region) {
            return;
        }
        let part = match answer {
            PartAnswer::Part(p) => Some(p),
            PartAnswer::NoPart => None,
            PartAnswer::Unreachable(reason) => {
                self.holdups.push(Holdup::Unreachable {
                    region: region.to_owned(),
                    reason,
                });
                None
            }
        };
        if let Some(p) = part.as_ref().filter(|p| p.pending > 0) {
            self.holdups.push(Holdup::Pending {
                region: region.to_owned(),
                pending: p.pending,
            });
        }
        match self.phase {
            Phase::First => {
                let reached = part.as_ref().map(|p| p.reached.clone());
                self.first.insert(region.to_owned(), part);
                match reached {
                    Some(reached) => self.discover(reached.as_ref()),
                    None => self.discover(Some(&BTreeSet::new())),
                }
            }
            Phase::Second => {
                if self.first.get(region) != Some(&part) {
                    self.holdups.push(Holdup::Changed {
                        region: region.to_owned(),
                    });
                }
                self.second.insert(region.to_owned(), part);
            }
            Phase::Done => {}
        }
        self.advance();
    }

    /// The outcome, once [`ClosureCheck::phase`] is [`Phase::Done`].
    pub fn verdict(&self) -> Option<Verdict> {
        if self.phase != Phase::Done {
            return None;
        }
        if !self.holdups.is_empty() {
            return Some(Verdict::NotYet(self.holdups.clone()));
        }
        Some(Verdict::Finished {
            local_changes: self.local_changes,
            touched: self.first.keys().cloned().collect(),
        })
    }

    /// Adds the regions a part reached (every region when it does not say)
    /// to what this phase still has to ask.
    fn discover(&mut self, reached: Option<&BTreeSet<String>>) {
        let regions = match reached {
            // A region that is not a peer is asked all the same: the node's
            // call fails and the root waits, visibly, rather than going
            // before a part nobody could read.
            Some(r) => r.iter().cloned().collect::<Vec<_>>(),
            None => self.every_region.iter().cloned().collect(),
        };
        for region in regions {
            if region != self.own_region && !self.first.contains_key(&region) && !self.asked.contains(&region) {
                self.frontier.insert(region);
            }
        }
    }

    /// Moves to the next phase when this one has nothing left to ask or to
    /// hear. A holdup in the first read ends the check early: the second
    /// read could not change the verdict.
    fn advance(&mut self) {
        if !self.asked.is_empty() {
            return;
        }
        if !self.holdups.is_empty() {
            self.phase = Phase::Done;
            return;
        }
        match self.phase {
            Phase::First if self.frontier.is_empty() => {
                self.phase = Phase::Second;
                self.frontier = self.first.keys().cloned().collect();
                if self.frontier.is_empty() {
                    self.phase = Phase::Done;
                }
            }
            Phase::Second if self.frontier.is_empty() => self.phase = Phase::Done,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{OperationState, Progress};
    use crate::name::{OperationId, ResourceName, Uid};
    use crate::RefTarget;

    fn op(reached: &[&str], changes: u64) -> Operation {
        Operation {
            id: OperationId(uuid::Uuid::from_u128(1)),
            root: RefTarget {
                name: ResourceName::parse("ra/image/i").unwrap(),
                uid: Uid(uuid::Uuid::from_u128(2)),
            },
            requested_by: "test".into(),
            cascade: true,
            state: OperationState::Running,
            progress: Progress {
                pending: 1,
                ..Progress::default()
            },
            create_time: crate::model::Timestamp(0),
            end_time: None,
            reached: reached.iter().map(|r| (*r).to_owned()).collect(),
            changes,
            closure_confirmed: false,
            controls: None,
            undelete: None,
            principal: Default::default(),
            retain_ms: 0,
        }
    }

    fn part(pending: u64, changes: u64, reached: &[&str]) -> PartAnswer {
        PartAnswer::Part(PartSummary {
            pending,
            changes,
            reached: Some(reached.iter().map(|r| (*r).to_owned()).collect()),
        })
    }

    const PEERS: [&str; 4] = ["rb", "rc", "rd", "re"];

    /// Drives a check to its end; `answers(phase, region)` answers each read.
    fn run(local: &Operation, mut answers: impl FnMut(Phase, &str) -> PartAnswer) -> (Verdict, Vec<Vec<String>>) {
        let mut check = ClosureCheck::start("ra", PEERS, local);
        let mut rounds = Vec::new();
        while check.phase() != Phase::Done {
            let round = check.next_round();
            assert!(!round.is_empty(), "a check that is not done has something to ask");
            let phase = check.phase();
            for region in &round {
                check.answer(region, answers(phase, region));
            }
            rounds.push(round);
        }
        (check.verdict().unwrap(), rounds)
    }

    #[test]
    fn only_the_regions_the_cascade_touched_are_asked_transitively() {
        // ra reached rb; rb reached rc; rd and re hold nothing and are never asked.
        let (verdict, rounds) = run(&op(&["rb"], 7), |_, r| match r {
            "rb" => part(0, 3, &["rc", "ra"]),
            "rc" => part(0, 2, &[]),
            other => panic!("asked {other}, which the cascade never touched"),
        });
        assert_eq!(rounds, vec![vec!["rb"], vec!["rc"], vec!["rb", "rc"]]);
        assert_eq!(
            verdict,
            Verdict::Finished {
                local_changes: 7,
                touched: ["rb", "rc"].iter().map(|s| (*s).to_owned()).collect()
            }
        );
    }

    #[test]
    fn an_unreachable_region_the_cascade_touched_holds_the_root() {
        let (verdict, _) = run(&op(&["rb"], 1), |_, r| match r {
            "rb" => part(0, 3, &["rc"]),
            "rc" => PartAnswer::Unreachable("no answer within 2s".into()),
            other => panic!("asked {other}"),
        });
        assert_eq!(
            verdict,
            Verdict::NotYet(vec![Holdup::Unreachable {
                region: "rc".into(),
                reason: "no answer within 2s".into()
            }])
        );
    }

    #[test]
    fn a_pending_part_ends_the_check_after_the_first_read() {
        let (verdict, rounds) = run(&op(&["rb"], 1), |_, _| part(2, 3, &[]));
        assert_eq!(rounds.len(), 1);
        assert_eq!(
            verdict,
            Verdict::NotYet(vec![Holdup::Pending {
                region: "rb".into(),
                pending: 2
            }])
        );
    }

    #[test]
    fn a_part_that_changed_between_the_reads_holds_the_root() {
        let (verdict, _) = run(&op(&["rb"], 1), |phase, _| {
            part(0, if phase == Phase::First { 3 } else { 4 }, &[])
        });
        assert_eq!(verdict, Verdict::NotYet(vec![Holdup::Changed { region: "rb".into() }]));
    }

    #[test]
    fn a_part_that_reached_a_new_region_between_the_reads_holds_the_root() {
        // Same counters, a longer `reached`: the set read first was not closed.
        let (verdict, _) = run(&op(&["rb"], 1), |phase, r| match (phase, r) {
            (Phase::First, "rb") => part(0, 3, &[]),
            (Phase::Second, "rb") => part(0, 3, &["rc"]),
            other => panic!("asked {other:?}"),
        });
        assert_eq!(verdict, Verdict::NotYet(vec![Holdup::Changed { region: "rb".into() }]));
    }

    #[test]
    fn a_region_that_does_not_say_what_it_reached_makes_the_check_ask_everyone() {
        let (verdict, rounds) = run(&op(&["rb"], 1), |_, r| match r {
            "rb" => PartAnswer::Part(PartSummary {
                pending: 0,
                changes: 1,
                reached: None,
            }),
            _ => PartAnswer::NoPart,
        });
        assert_eq!(rounds[1], vec!["rc", "rd", "re"]);
        assert!(matches!(verdict, Verdict::Finished { .. }), "{verdict:?}");
    }

    #[test]
    fn a_region_outside_the_cluster_named_in_reached_is_asked_and_holds_the_root() {
        let (verdict, rounds) = run(&op(&["rb", "zz"], 1), |_, r| match r {
            "zz" => PartAnswer::Unreachable("not a peer of this node".into()),
            _ => part(0, 1, &[]),
        });
        assert_eq!(rounds, vec![vec!["rb", "zz"]]);
        assert!(matches!(verdict, Verdict::NotYet(_)), "{verdict:?}");
    }
}
