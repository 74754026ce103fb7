//! Plan tokens (issue 29): a dry run's merged plan bound by a digest of
//! its members, and the plans this node bound lately, so that a delete
//! whose closure changed since its dry run is told what changed.
//!
//! The core lists a plan's members in a canonical order
//! ([`cascade_core::plan::canonical_text`]: region, name, uid, action); the
//! token is [`TOKEN_VERSION`] and the hex SHA-256 of that text, in groups
//! of 8 digits (ring's,
//! already the node's for the tokens file: the core stays free of
//! digests). The version prefix lets a later canonical form refuse an
//! older token as another version instead of as a changed closure.
//!
//! A token names no member, so the refusal of a changed closure can name
//! what was added and removed only from the members of the plan that made
//! the token: [`RecentPlans`] keeps them, in memory, for the last plans
//! this node answered (bounded in plans and members). A delete is answered
//! by its owner, as its dry run was, so it is the same node unless the node
//! restarted or another took the region's lease: then the refusal says the
//! closure changed without naming members.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use cascade_core::plan::{canonical_text, PlanMember};
use cascade_core::protocol::Plan;

use crate::auth::identity::{hex, sha256};

/// What every token of this node's canonical form starts with.
pub(crate) const TOKEN_VERSION: &str = "p1-";

/// Plans whose members a node keeps to name what changed.
pub(crate) const REMEMBERED_PLANS: usize = 256;

/// Members a node keeps over all the plans it remembers (about 15 MB at
/// most); a plan larger than this alone is not kept.
pub(crate) const REMEMBERED_MEMBERS: usize = 100_000;

/// A merged plan bound (or not) by a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Binding {
    /// The token, or why the plan has none.
    pub(crate) token: Result<String, String>,
    /// The plan's members, in the canonical order.
    pub(crate) members: Vec<PlanMember>,
}

/// The token of a plan's members: the version, then the digest's 64 hex
/// digits in groups of 8 (read and compared more easily, and never a run
/// of digits long enough to read as a time).
pub(crate) fn token_of(members: &[PlanMember]) -> String {
    let digest = hex(&sha256(canonical_text(members).as_bytes()));
    let groups: Vec<&str> = (0..digest.len())
        .step_by(8)
        .map(|at| &digest[at..(at + 8).min(digest.len())])
        .collect();
    format!("{TOKEN_VERSION}{}", groups.join("-"))
}

/// Binds a merged plan: its token, unless the plan is not the whole
/// closure (a region could not be asked, or the walk stopped at its bound).
pub(crate) fn bind(plan: &Plan, unreachable: &[String]) -> Binding {
    let members = plan.members();
    let token = if !unreachable.is_empty() {
        Err(format!(
            "region(s) {} could not be asked: their part of the closure is missing, and a token binds only a whole closure",
            unreachable.join(", ")
        ))
    } else if plan.truncated {
        Err(
            "the plan is truncated (the closure is larger than a dry run walks): a token binds only a whole closure"
                .to_owned(),
        )
    } else {
        Ok(token_of(&members))
    };
    Binding { token, members }
}

/// The members of the plans this node bound lately, by token, oldest
/// first (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct RecentPlans {
    plans: Mutex<VecDeque<(String, Arc<Vec<PlanMember>>)>>,
}

impl RecentPlans {
    /// Keeps `members` under `token`, forgetting the oldest plans beyond
    /// the bounds.
    pub(crate) fn remember(&self, token: &str, members: Vec<PlanMember>) {
        if members.len() > REMEMBERED_MEMBERS {
            return;
        }
        // A panic elsewhere while holding the lock leaves a list that is
        // still whole: every change below is one push or one pop.
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.retain(|(t, _)| t != token);
        plans.push_back((token.to_owned(), Arc::new(members)));
        let mut total: usize = plans.iter().map(|(_, m)| m.len()).sum();
        while plans.len() > REMEMBERED_PLANS || total > REMEMBERED_MEMBERS {
            match plans.pop_front() {
                Some((_, m)) => total -= m.len(),
                None => break,
            }
        }
    }

    /// The members of the plan `token` bound, if this node still has them.
    pub(crate) fn recall(&self, token: &str) -> Option<Arc<Vec<PlanMember>>> {
        let plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.iter().rev().find(|(t, _)| t == token).map(|(_, m)| m.clone())
    }
}

#[cfg(test)]
mod tests {
    use cascade_core::protocol::PlannedUnset;
    use cascade_core::{RefTarget, ResourceName, Uid};

    use super::*;

    fn target(name: &str, n: u128) -> RefTarget {
        RefTarget {
            name: ResourceName::parse(name).unwrap(),
            uid: Uid(uuid::Uuid::from_u128(n)),
        }
    }

    fn plan_of(deleted: &[(&str, u128)]) -> Plan {
        Plan {
            deleted: deleted.iter().map(|(n, u)| target(n, *u)).collect(),
            ..Plan::default()
        }
    }

    #[test]
    fn a_token_is_the_digest_of_the_canonical_members_whatever_the_walk_order() {
        let one = bind(&plan_of(&[("ra/network/n", 1), ("rb/port/p", 2)]), &[]);
        let other = bind(&plan_of(&[("rb/port/p", 2), ("ra/network/n", 1)]), &[]);
        let token = one.token.clone().unwrap();
        assert_eq!(one.token, other.token);
        assert!(token.starts_with(TOKEN_VERSION), "{token}");
        assert_eq!(token.len(), TOKEN_VERSION.len() + 64 + 7, "{token}");
        assert_eq!(token.split('-').count(), 9, "p1 and 8 groups: {token}");
        assert!(token.len() <= cascade_core::limits::MAX_PLAN_TOKEN_BYTES);

        let mut unset = plan_of(&[("ra/network/n", 1), ("rb/port/p", 2)]);
        unset.unset.push(PlannedUnset {
            resource: target("rc/floating_ip/f", 3),
            field: "port".into(),
        });
        assert_ne!(bind(&unset, &[]).token, one.token, "an unset member changes the token");
        let recreated = bind(&plan_of(&[("ra/network/n", 1), ("rb/port/p", 9)]), &[]);
        assert_ne!(recreated.token, one.token, "another incarnation changes the token");
    }

    #[test]
    fn a_partial_plan_has_no_token_and_says_why() {
        let mut truncated = plan_of(&[("ra/network/n", 1)]);
        truncated.truncated = true;
        let why = bind(&truncated, &[]).token.unwrap_err();
        assert!(why.contains("truncated"), "{why}");
        let why = bind(&plan_of(&[("ra/network/n", 1)]), &["rc".to_owned()])
            .token
            .unwrap_err();
        assert!(why.contains("rc could not be asked"), "{why}");
    }

    #[test]
    fn recent_plans_are_bounded_and_recalled_by_token() {
        let recent = RecentPlans::default();
        let members = |n: usize| bind(&plan_of(&[("ra/network/n", n as u128)]), &[]).members;
        for i in 0..REMEMBERED_PLANS + 10 {
            recent.remember(&format!("t{i}"), members(i));
        }
        assert!(recent.recall("t0").is_none(), "the oldest plans are forgotten");
        let last = format!("t{}", REMEMBERED_PLANS + 9);
        assert_eq!(
            recent.recall(&last).unwrap().as_slice(),
            members(REMEMBERED_PLANS + 9).as_slice()
        );

        let one = members(0).remove(0);
        let big: Vec<PlanMember> = (0..=REMEMBERED_MEMBERS as u128)
            .map(|n| PlanMember {
                uid: Uid(uuid::Uuid::from_u128(n)),
                ..one.clone()
            })
            .collect();
        recent.remember("too-big", big);
        assert!(
            recent.recall("too-big").is_none(),
            "a plan over the member bound is not kept"
        );
        assert!(recent.recall(&last).is_some(), "and does not push the others out");
    }
}
