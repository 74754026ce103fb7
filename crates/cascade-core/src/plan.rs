//! The dry run of a delete across regions, driven to a fixpoint.
//!
//! Each region plans its own part of a closure ([`crate::peer::plan_from`]),
//! starting from *seeds*: resources of the closure, in any region, that its
//! own resources reference. A part names the seeds it hands to other regions
//! (`Plan::remote_seeds`). Two things make a part depend on every seed its
//! region will ever get, not only on the first batch:
//!
//! - a list owner (`many = true`, `cascade`) is deleted with its *last*
//!   element, and its elements may be deleted by different regions' parts
//!   (a port group in C whose ports are in A and C): only a plan of C from
//!   both seeds sees the list emptied;
//! - a `block` referrer holds a resource only if the closure does not
//!   delete the blocker too, which another region's part may do.
//!
//! So [`PlanDriver`] re-plans a region from the union of every seed it has
//! been handed whenever that set grows, until no set grows (or a round
//! bound is hit), and then [`PlanDriver::finish`] merges the last part of
//! every region: deleted resources once each, unsets and blocks only for
//! resources the closure does not delete anywhere. The same merge serves
//! the node (over `Peer.Plan`) and the multi-region property tests (over
//! in-memory regions), which check that the dry run equals the real run.
//!
//! With the caller's principal the same walk is the closure check: every
//! region lists the members of its part its own policy refuses
//! (`Plan::denied`), and the merge keeps them all (bounded), so a delete is
//! refused before anything changes anywhere.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::RefTarget;
use crate::protocol::Plan;
use crate::Uid;

/// Rounds of re-planning before the plan is reported truncated. A round
/// re-plans every region whose seeds grew; a cycle through all regions
/// needs one round per region it crosses.
pub const MAX_PLAN_ROUNDS: usize = 16;

/// One region's part: everything it was handed, and its plan from all of it.
#[derive(Debug, Default)]
struct Part {
    seeds: BTreeSet<RefTarget>,
    /// The seed set `plan` was made from (None: not planned yet).
    planned: Option<BTreeSet<RefTarget>>,
    plan: Plan,
}

/// A cross-region dry run in progress. The caller asks [`Self::next_round`]
/// which regions to (re-)plan with which seeds, answers each with
/// [`Self::answer`], and calls [`Self::finish`] when no round is left.
#[derive(Debug)]
pub struct PlanDriver {
    origin: String,
    parts: BTreeMap<String, Part>,
    unreachable: BTreeSet<String>,
    rounds: usize,
    truncated: bool,
}

impl PlanDriver {
    /// Starts from the origin region's own plan of `root`.
    pub fn new(origin: &str, root: RefTarget, root_plan: Plan) -> Self {
        let mut driver = Self {
            origin: origin.to_owned(),
            parts: BTreeMap::new(),
            unreachable: BTreeSet::new(),
            rounds: 0,
            truncated: false,
        };
        let seeds = BTreeSet::from([root]);
        driver.parts.insert(
            origin.to_owned(),
            Part {
                seeds: seeds.clone(),
                planned: None,
                plan: Plan::default(),
            },
        );
        driver.answer(origin, seeds.into_iter().collect(), Some(root_plan));
        driver
    }

    /// The regions to plan next, each with its whole seed set; empty when
    /// the plan is complete (or the round bound was reached).
    pub fn next_round(&mut self) -> Vec<(String, Vec<RefTarget>)> {
        let due: Vec<(String, Vec<RefTarget>)> = self
            .parts
            .iter()
            .filter(|(region, part)| !self.unreachable.contains(*region) && part.planned.as_ref() != Some(&part.seeds))
            .map(|(region, part)| (region.clone(), part.seeds.iter().cloned().collect()))
            .collect();
        if due.is_empty() {
            return due;
        }
        if self.rounds >= MAX_PLAN_ROUNDS {
            self.truncated = true;
            return Vec::new();
        }
        self.rounds += 1;
        due
    }

    /// A region's plan from `seeds` (None: the region could not be asked).
    pub fn answer(&mut self, region: &str, seeds: Vec<RefTarget>, plan: Option<Plan>) {
        let Some(mut plan) = plan else {
            self.unreachable.insert(region.to_owned());
            return;
        };
        let handed = std::mem::take(&mut plan.remote_seeds);
        let part = self.parts.entry(region.to_owned()).or_default();
        part.planned = Some(seeds.into_iter().collect());
        part.plan = plan;
        for (to, seeds) in handed {
            self.parts.entry(to).or_default().seeds.extend(seeds);
        }
    }

    /// Regions that could not be asked: their part of the plan is missing.
    pub fn unreachable(&self) -> impl Iterator<Item = &str> {
        self.unreachable.iter().map(String::as_str)
    }

    /// The merged plan: the origin's part first, then the others by region.
    pub fn finish(self) -> Plan {
        let mut merged = Plan {
            truncated: self.truncated,
            ..Plan::default()
        };
        let (origin, others): (Vec<_>, Vec<_>) = self.parts.into_iter().partition(|(r, _)| *r == self.origin);
        let parts: Vec<Plan> = origin.into_iter().chain(others).map(|(_, p)| p.plan).collect();
        let mut deleted_uids: BTreeSet<Uid> = BTreeSet::new();
        for part in &parts {
            for d in &part.deleted {
                if deleted_uids.insert(d.uid) {
                    merged.deleted.push(d.clone());
                }
            }
            merged.truncated |= part.truncated;
        }
        let deleted_names: BTreeSet<&crate::ResourceName> = merged.deleted.iter().map(|d| &d.name).collect();
        let mut unset_seen = BTreeSet::new();
        let mut block_seen = BTreeSet::new();
        let (mut unset, mut blocked) = (Vec::new(), Vec::new());
        for part in parts.iter() {
            for u in &part.unset {
                if !deleted_uids.contains(&u.resource.uid) && unset_seen.insert((u.resource.uid, u.field.clone())) {
                    unset.push(u.clone());
                }
            }
            for b in &part.blocked {
                let key = (b.resource.uid, b.blocker.referrer.clone(), b.blocker.field.clone());
                if !deleted_names.contains(&b.blocker.referrer) && block_seen.insert(key) {
                    blocked.push(b.clone());
                }
            }
        }
        merged.unset = unset;
        merged.blocked = blocked;
        // Each region decided on its own members. A referrer some part
        // would unset but another's deletes needs `delete`, which the part
        // that deletes it decided: its `update` denial is dropped.
        let mut denied_seen = BTreeSet::new();
        for part in &parts {
            merged.denied_more += part.denied_more;
            for d in &part.denied {
                let superseded = d.verb == crate::auth::Verb::Update && deleted_names.contains(&d.resource);
                if superseded || !denied_seen.insert((d.resource.clone(), d.verb)) {
                    continue;
                }
                if merged.denied.len() < crate::protocol::MAX_DENIED_LISTED {
                    merged.denied.push(d.clone());
                } else {
                    merged.denied_more += 1;
                }
            }
        }
        merged
    }
}
