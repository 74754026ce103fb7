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

/// What a delete does to one member of its closure, as a plan token binds
/// it. A referrer that loses two fields is two members.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PlanAction {
    /// The member is deleted.
    Delete,
    /// The member survives, and its reference field loses the target (or
    /// one element of a list).
    Unset(String),
}

impl std::fmt::Display for PlanAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanAction::Delete => f.write_str("delete"),
            PlanAction::Unset(field) => write!(f, "unset {field}"),
        }
    }
}

/// One member of a plan as its token binds it: the region, the name, the
/// incarnation and what the delete does to it. Ordered as the canonical
/// list is: by region, then name, uid and action.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PlanMember {
    /// The member's region (the owner of its name).
    pub region: String,
    /// The member's full name.
    pub name: crate::ResourceName,
    /// The incarnation the plan found: a name deleted and created again
    /// between the dry run and the delete is another member.
    pub uid: Uid,
    /// What the delete does to it.
    pub action: PlanAction,
}

/// The most members a refusal for a changed plan names (added and removed
/// together); the rest are counted.
pub const MAX_PLAN_CHANGES_LISTED: usize = 50;

impl Plan {
    /// Every resource this plan changes, once each, in the canonical order
    /// ([`PlanMember`]'s): what a plan token digests (the node hashes
    /// [`canonical_text`] of it). Members a blocker outside the closure
    /// would hold are members all the same; the blockers themselves are not
    /// (they change nothing), nor are the denials (the delete is refused
    /// while there is one).
    pub fn members(&self) -> Vec<PlanMember> {
        let deleted = self.deleted.iter().map(|d| PlanMember {
            region: d.name.region().to_owned(),
            name: d.name.clone(),
            uid: d.uid,
            action: PlanAction::Delete,
        });
        let unset = self.unset.iter().map(|u| PlanMember {
            region: u.resource.name.region().to_owned(),
            name: u.resource.name.clone(),
            uid: u.resource.uid,
            action: PlanAction::Unset(u.field.clone()),
        });
        let members: BTreeSet<PlanMember> = deleted.chain(unset).collect();
        members.into_iter().collect()
    }
}

/// The canonical text of a plan's members, the input of its token: one
/// line per member in the canonical order, `region TAB name TAB uid TAB
/// action NEWLINE` (no region, name, uid or field can hold a tab or a
/// newline, so the text is unambiguous).
pub fn canonical_text(members: &[PlanMember]) -> String {
    let mut text = String::with_capacity(members.len() * 96);
    for m in members {
        text.push_str(&m.region);
        text.push('\t');
        text.push_str(m.name.as_str());
        text.push('\t');
        text.push_str(&m.uid.to_string());
        text.push('\t');
        text.push_str(&m.action.to_string());
        text.push('\n');
    }
    text
}

/// What changed between the members a plan bound and the members the
/// closure has now: each side in the canonical order, at most `most` of
/// both together listed (added first), the rest counted in `more`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanDiff {
    /// Members the closure has now that the plan did not.
    pub added: Vec<PlanMember>,
    /// Members of the plan the closure no longer has.
    pub removed: Vec<PlanMember>,
    /// Changed members beyond those listed.
    pub more: u64,
    /// How many were added, listed or not.
    pub added_total: u64,
    /// How many were removed, listed or not.
    pub removed_total: u64,
}

impl PlanDiff {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added_total == 0 && self.removed_total == 0
    }
}

/// Compares two canonical member lists (both sorted, as
/// [`Plan::members`] makes them) in one pass.
pub fn diff_members(before: &[PlanMember], after: &[PlanMember], most: usize) -> PlanDiff {
    use std::cmp::Ordering;
    let mut added = Vec::new();
    let mut removed = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < before.len() || j < after.len() {
        let order = match (before.get(i), after.get(j)) {
            (Some(b), Some(a)) => b.cmp(a),
            (Some(_), None) => Ordering::Less,
            (None, _) => Ordering::Greater,
        };
        match order {
            Ordering::Equal => {
                i += 1;
                j += 1;
            }
            Ordering::Less => {
                removed.push(&before[i]);
                i += 1;
            }
            Ordering::Greater => {
                added.push(&after[j]);
                j += 1;
            }
        }
    }
    let (added_total, removed_total) = (added.len() as u64, removed.len() as u64);
    let listed_added: Vec<PlanMember> = added.into_iter().take(most).cloned().collect();
    let room = most - listed_added.len();
    let listed_removed: Vec<PlanMember> = removed.into_iter().take(room).cloned().collect();
    let listed = (listed_added.len() + listed_removed.len()) as u64;
    PlanDiff {
        added: listed_added,
        removed: listed_removed,
        more: added_total + removed_total - listed,
        added_total,
        removed_total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::PlannedUnset;
    use crate::{ResourceName, Uid};

    fn target(name: &str, n: u128) -> RefTarget {
        RefTarget {
            name: ResourceName::parse(name).unwrap(),
            uid: Uid(uuid::Uuid::from_u128(n)),
        }
    }

    fn plan(deleted: &[(&str, u128)], unset: &[(&str, u128, &str)]) -> Plan {
        Plan {
            deleted: deleted.iter().map(|(n, u)| target(n, *u)).collect(),
            unset: unset
                .iter()
                .map(|(n, u, f)| PlannedUnset {
                    resource: target(n, *u),
                    field: (*f).to_owned(),
                })
                .collect(),
            ..Plan::default()
        }
    }

    #[test]
    fn members_are_canonical_whatever_order_the_walk_found_them_in() {
        let one = plan(
            &[("rb/port/p", 2), ("ra/network/n", 1), ("a-b/port/q", 3)],
            &[("rc/floating_ip/f", 4, "port")],
        );
        let other = plan(
            &[
                ("a-b/port/q", 3),
                ("ra/network/n", 1),
                ("rb/port/p", 2),
                ("ra/network/n", 1),
            ],
            &[("rc/floating_ip/f", 4, "port")],
        );
        assert_eq!(one.members(), other.members());
        let regions: Vec<String> = one.members().into_iter().map(|m| m.region).collect();
        // By region first: "a-b" before "ra", though "a-b/…" sorts after "a/…" as a name would.
        assert_eq!(regions, ["a-b", "ra", "rb", "rc"]);
        assert_eq!(canonical_text(&one.members()), canonical_text(&other.members()));
        let text = canonical_text(&one.members());
        assert!(
            text.ends_with("rc\trc/floating_ip/f\t00000000-0000-0000-0000-000000000004\tunset port\n"),
            "{text}"
        );
    }

    #[test]
    fn another_incarnation_field_or_action_is_another_member() {
        let base = plan(&[("ra/network/n", 1)], &[("ra/port/p", 2, "security_groups")]);
        let recreated = plan(&[("ra/network/n", 9)], &[("ra/port/p", 2, "security_groups")]);
        let other_field = plan(&[("ra/network/n", 1)], &[("ra/port/p", 2, "qos_policy")]);
        let deleted_instead = plan(&[("ra/network/n", 1), ("ra/port/p", 2)], &[]);
        for changed in [&recreated, &other_field, &deleted_instead] {
            assert_ne!(canonical_text(&base.members()), canonical_text(&changed.members()));
        }
    }

    #[test]
    fn a_diff_names_what_was_added_and_removed_within_its_bound() {
        let before = plan(&[("ra/network/n", 1), ("rb/port/p", 2)], &[]).members();
        let after = plan(&[("ra/network/n", 1), ("rc/port/q", 3)], &[("rb/port/p", 2, "network")]).members();
        let diff = diff_members(&before, &after, 10);
        let names = |list: &[PlanMember]| {
            list.iter()
                .map(|m| format!("{} {}", m.name, m.action))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&diff.added), ["rb/port/p unset network", "rc/port/q delete"]);
        assert_eq!(names(&diff.removed), ["rb/port/p delete"]);
        assert_eq!((diff.added_total, diff.removed_total, diff.more), (2, 1, 0));
        assert!(diff_members(&before, &before, 10).is_empty());

        let bounded = diff_members(&before, &after, 2);
        assert_eq!((bounded.added.len(), bounded.removed.len(), bounded.more), (2, 0, 1));
        let none_listed = diff_members(&before, &after, 0);
        assert_eq!(none_listed.more, 3);
        assert!(!none_listed.is_empty());
    }
}
