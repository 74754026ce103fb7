//! ExplainDeletion: what a deletion still waits on, across regions, one
//! reason per line, as a tree of its operation's closure (seed 002: Goten
//! cannot tell a deletion stuck by a schema's `block` from one that is
//! merely slow; Cascade names the blocker, its region, and whether anything
//! but a person will ever free it).
//!
//! Sans-IO like [`crate::operation_view`]: the node gathers every region's
//! DELETING resources of the operation ([`Part`]) and what it learnt of
//! each blocker outside them ([`BlockerState`]), and [`explain`] turns them
//! into one [`Explained`] per resource, each with its parent (the resource
//! whose cascade reached it, from its deletion record) so that a client
//! draws the tree.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::describe_liens;
use crate::model::{DeletionReason, DeletionRecord, DeletionStatus, Resource, Timestamp};
use crate::name::ResourceName;
use crate::time_text;

/// One DELETING resource of the operation, as its region keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The resource.
    pub resource: Resource,
    /// Its deletion record.
    pub record: DeletionRecord,
}

/// What the explaining node found of a blocker that is not one of the
/// operation's own DELETING resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockerState {
    /// It is being deleted (by another operation): it will go.
    Deleting,
    /// It lives, and nothing is deleting it: only a person frees the
    /// deletion it blocks (delete it, or change its reference).
    Live,
    /// It is gone already: the next look at the deletion will see it.
    Absent,
    /// Its region could not be asked.
    Unknown,
}

/// One resource of the explanation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explained {
    /// The DELETING resource, with its record.
    pub part: Part,
    /// The resource whose cascade reached it, and through which field;
    /// None for the operation's root, and when that resource is gone
    /// already (its children then hang under the root).
    pub parent: Option<(ResourceName, String)>,
    /// One line per thing it waits on.
    pub reasons: Vec<String>,
    /// Nothing but a person frees it.
    pub stuck: bool,
}

/// Explains every part: its reasons, whether it is stuck, its parent.
/// `unreachable` are the regions whose part is missing; a deletion
/// waiting on one says so. `now` is the explaining node's time: a reason
/// says how soon, not at which epoch millisecond.
pub fn explain(
    parts: Vec<Part>,
    blockers: &BTreeMap<ResourceName, BlockerState>,
    unreachable: &BTreeSet<String>,
    now: Timestamp,
) -> Vec<Explained> {
    let deleting: BTreeSet<ResourceName> = parts.iter().map(|p| p.resource.name.clone()).collect();
    let mut out: Vec<Explained> = parts
        .into_iter()
        .map(|part| {
            let (reasons, stuck) = reasons_of(&part, &deleting, blockers, unreachable, now);
            let parent = match &part.record.reason {
                DeletionReason::Cascade { from, field } if deleting.contains(from) => {
                    Some((from.clone(), field.clone()))
                }
                _ => None,
            };
            Explained {
                part,
                parent,
                reasons,
                stuck,
            }
        })
        .collect();
    // A resource its cascade's deletions hold says so.
    let mut below: BTreeMap<ResourceName, usize> = BTreeMap::new();
    for e in &out {
        if let Some((parent, _)) = &e.parent {
            *below.entry(parent.clone()).or_default() += 1;
        }
    }
    for e in &mut out {
        if let Some(n) = below.get(&e.part.resource.name) {
            e.reasons
                .push(format!("waits for the {n} deletion(s) its cascade started, below"));
        }
    }
    out.sort_by(|a, b| {
        (a.part.resource.name.region(), &a.part.resource.name)
            .cmp(&(b.part.resource.name.region(), &b.part.resource.name))
    });
    out
}

/// How a BLOCKED reason starts each change the deletion's principal may not
/// make (`protocol::process_work` writes them, this module reads them).
pub const REFUSED_BY_POLICY: &str = "refused by policy: ";

/// The parts of a BLOCKED reason that are changes the deletion's principal
/// may not make (each starts with [`REFUSED_BY_POLICY`]).
pub(crate) fn policy_refusals(reason: &str) -> impl Iterator<Item = &str> {
    reason.split("; ").filter(|p| p.starts_with(REFUSED_BY_POLICY))
}

fn reasons_of(
    part: &Part,
    deleting: &BTreeSet<ResourceName>,
    blockers: &BTreeMap<ResourceName, BlockerState>,
    unreachable: &BTreeSet<String>,
    now: Timestamp,
) -> (Vec<String>, bool) {
    let (resource, record) = (&part.resource, &part.record);
    let mut reasons = Vec::new();
    let mut stuck = false;
    if let Some(forced) = &record.forced {
        reasons.push(format!("forced through by {}: {}", forced.by, forced.reason));
    }
    match &record.status {
        DeletionStatus::Pending => {}
        DeletionStatus::Failed { error } => {
            stuck = true;
            reasons.push(format!(
                "FAILED: {error} (an administrator retries or force-purges it; what held it going away also finishes it)"
            ));
        }
        DeletionStatus::Blocked {
            blockers: held_by,
            reason,
        } => {
            // The cascade's principal may not make a change this deletion
            // needs (see `protocol::process_work`): only a policy that
            // allows it, or an administrator, frees it.
            for refusal in policy_refusals(reason) {
                stuck = true;
                reasons.push(format!(
                    "{refusal}: held until the policy allows it, or an administrator retries or force-purges it"
                ));
            }
            if crate::protocol::paced_by_operation(reason) {
                // Its operation's rate, or a budget lease on its way: it
                // goes on by itself, so it is not stuck (the console's
                // pictures once flagged a cascade under `--rate` stuck).
                reasons.push(format!("{reason}: its cascade goes on at that pace"));
            } else if crate::protocol::held_by_operation(reason) {
                // Its operation's budget, pause or cancel holds its
                // cascade: a person raises, resumes or leaves it.
                stuck = true;
                reasons.push(format!(
                    "{reason}: its cascade waits (an administrator extends the budget with `cascade admin \
                     extend-budget`, or the operation is resumed)"
                ));
            }
            for b in held_by {
                let state = if deleting.contains(&b.referrer) {
                    "being deleted by this same operation"
                } else if b.referrer_deleting {
                    "itself being deleted"
                } else {
                    match blockers.get(&b.referrer).copied().unwrap_or(BlockerState::Unknown) {
                        BlockerState::Deleting => "itself being deleted",
                        BlockerState::Absent => "gone: the next look at this deletion will see it",
                        BlockerState::Unknown => "its region could not be asked",
                        BlockerState::Live => {
                            stuck = true;
                            "live, not being deleted, and outside this deletion: stuck until it is deleted or its reference changed"
                        }
                    }
                };
                reasons.push(format!(
                    "blocked by {} (region {}, field {}): {state}",
                    b.referrer,
                    b.referrer.region(),
                    b.field
                ));
            }
        }
        DeletionStatus::Waiting { regions, reason } => {
            reasons.push(reason.clone());
            for region in regions.iter().filter(|r| unreachable.contains(*r)) {
                reasons.push(format!("region {region} is unreachable: it acts once it is back"));
            }
        }
    }
    for finalizer in &resource.finalizers {
        match record.finalizer_failures.iter().find(|f| &f.finalizer == finalizer) {
            Some(f) => reasons.push(format!(
                "finalizer {finalizer} failed {} time(s), last: {}{}",
                f.failures,
                f.last_reason,
                match f.retry_at {
                    Some(at) if at > now => format!("; its controller is asked again {}", time_text::relative(at, now)),
                    Some(_) => "; its controller is due to be asked again".to_owned(),
                    None => String::new(),
                }
            )),
            None => reasons.push(format!(
                "finalizer {finalizer} pending: its controller has not removed it (nor reported a failure)"
            )),
        }
    }
    if !resource.liens.is_empty() {
        stuck = true;
        reasons.push(format!(
            "{} (remove it to let the deletion go on)",
            describe_liens(&resource.liens)
        ));
    }
    (reasons, stuck)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Blocker, RefTarget, ResourceState, Timestamp};
    use crate::name::{OperationId, Uid};

    fn part(name: &str, reason: DeletionReason, status: DeletionStatus) -> Part {
        let name = ResourceName::parse(name).expect("name");
        let target = RefTarget {
            name: name.clone(),
            uid: Uid(uuid::Uuid::from_u128(name.as_str().len() as u128)),
        };
        Part {
            resource: Resource {
                name,
                uid: target.uid,
                state: ResourceState::Deleting,
                attributes: Default::default(),
                refs: Default::default(),
                revision: 1,
                create_time: Timestamp(0),
                update_time: Timestamp(0),
                finalizers: Vec::new(),
                liens: Vec::new(),
                soft_deleted: None,
            },
            record: DeletionRecord {
                target,
                deleted_at: Timestamp(0),
                reason,
                requested_by: "t".into(),
                operation: OperationId(uuid::Uuid::from_u128(1)),
                status,
                finalizer_failures: Vec::new(),
                forced: None,
                principal: Default::default(),
            },
        }
    }

    /// Seed 002's stuck case: a's cascade reached c, which d (another
    /// region's, outside the cascade, live) blocks: c is stuck, a is not,
    /// and c hangs under a.
    #[test]
    fn a_live_blocker_outside_the_cascade_is_named_with_its_region_and_flags_stuck() {
        let a = part("ra/a/x", DeletionReason::Requested, DeletionStatus::Pending);
        let blocked = DeletionStatus::Blocked {
            blockers: vec![Blocker {
                referrer: ResourceName::parse("rb/d/z").expect("name"),
                field: "c".into(),
                referrer_deleting: false,
            }],
            reason: String::new(),
        };
        let cascade = DeletionReason::Cascade {
            from: a.resource.name.clone(),
            field: "a".into(),
        };
        let c = part("ra/c/y", cascade, blocked);
        let states = BTreeMap::from([(ResourceName::parse("rb/d/z").expect("name"), BlockerState::Live)]);
        let out = explain(vec![c.clone(), a.clone()], &states, &BTreeSet::new(), Timestamp(0));
        assert_eq!(out[0].part.resource.name.as_str(), "ra/a/x");
        assert!(!out[0].stuck && out[0].parent.is_none());
        assert_eq!(
            out[0].reasons,
            ["waits for the 1 deletion(s) its cascade started, below"]
        );
        let c_out = &out[1];
        assert_eq!(c_out.parent, Some((a.resource.name.clone(), "a".to_owned())));
        assert!(c_out.stuck);
        assert_eq!(
            c_out.reasons,
            vec!["blocked by rb/d/z (region rb, field c): live, not being deleted, and outside this deletion: stuck until it is deleted or its reference changed".to_owned()]
        );
        // The same blocker being deleted elsewhere: not stuck.
        let deleting = BTreeMap::from([(ResourceName::parse("rb/d/z").expect("name"), BlockerState::Deleting)]);
        let out = explain(vec![c, a], &deleting, &BTreeSet::new(), Timestamp(0));
        assert!(!out[1].stuck, "{:?}", out[1].reasons);
    }

    /// The README's picture of a cascade under `--rate 1` showed it stuck:
    /// a hold by the rate lets go by itself; one by the budget waits for a
    /// person.
    #[test]
    fn a_member_held_by_its_rate_is_not_stuck_and_one_held_by_its_budget_is() {
        let held = |reason: &str| DeletionStatus::Blocked {
            blockers: Vec::new(),
            reason: reason.to_owned(),
        };
        let states = BTreeMap::new();
        for (reason, stuck) in [
            ("rate limit: at most 1 new member(s) a second", false),
            ("waiting for a budget lease from region ra", false),
            ("budget reached (100 of 100)", true),
            ("operation paused by ops", true),
        ] {
            let member = part("ra/c/y", DeletionReason::Requested, held(reason));
            let out = explain(vec![member], &states, &BTreeSet::new(), Timestamp(0));
            assert_eq!(out[0].stuck, stuck, "{reason}: {:?}", out[0].reasons);
            assert!(out[0].reasons[0].starts_with(reason), "{:?}", out[0].reasons);
        }
    }
}
