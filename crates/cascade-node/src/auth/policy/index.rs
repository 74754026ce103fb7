//! The policy in force filed by what a request can match, so a decision
//! evaluates only the policies that can apply to it.
//!
//! Cedar evaluates every policy of the set it is given for each request
//! (it has no index), so a file of a thousand rules cost a thousand
//! evaluations a decision (docs/BENCHMARKS.md, "Authorization decision").
//! A policy's scope says which requests it can match at all: its action
//! constraint names the verbs, its principal constraint the user or the
//! group. A policy is filed under each verb it names (under every verb
//! when it names none, an action Cedar does not know as a verb, an action
//! group, or more than [`MAX_VERBS_FILED`] verbs) and under its principal
//! (its user, its group, or any principal), and a decision evaluates the
//! few sets its verb and principal select.
//!
//! The answer is the whole set's, rule included: a policy whose scope does
//! not match a request evaluates to false in Cedar (the scope is checked
//! before the conditions, so it cannot err either), so leaving it out
//! changes nothing; a forbid that holds in any selected set denies, a
//! permit in any set allows otherwise, and the rule is the smallest name
//! among the satisfied policies of the deciding effect, as over the whole
//! set. `tests.rs` compares the two over random policies and requests.

use std::collections::HashMap;

use cascade_core::auth::{Principal, Verb};
use cedar_policy::{ActionConstraint, EntityUid, Policy, PolicySet, PrincipalConstraint};

use super::Names;

/// A policy naming more verbs than this is filed once, under every verb,
/// rather than once per verb: the index holds at most this many copies of
/// a policy (each carries its text), so its memory stays within a few times
/// the file's.
pub(super) const MAX_VERBS_FILED: usize = 4;

/// The policies of one verb (or of every verb) by principal.
#[derive(Default)]
struct ByPrincipal {
    /// Policies of any principal (no principal constraint, `is`, or one the
    /// index does not key).
    any: PolicySet,
    /// `principal == Cascade::User::"<id>"` (or `in`, `is .. in` that user).
    users: HashMap<String, PolicySet>,
    /// `principal in Cascade::Group::"<group>"`.
    groups: HashMap<String, PolicySet>,
}

/// Whom a policy's principal scope can match.
enum PrincipalKey {
    Any,
    User(String),
    Group(String),
}

impl ByPrincipal {
    /// Files `policy`; an error (a duplicate id, which a parsed file cannot
    /// hold) is Cedar's message.
    fn add(&mut self, key: &PrincipalKey, policy: Policy) -> Result<(), String> {
        let set = match key {
            PrincipalKey::Any => &mut self.any,
            PrincipalKey::User(id) => self.users.entry(id.clone()).or_default(),
            PrincipalKey::Group(group) => self.groups.entry(group.clone()).or_default(),
        };
        set.add(policy).map_err(|e| e.to_string())
    }

    /// The sets that can hold a policy matching `principal`.
    fn sets<'a>(&'a self, principal: &'a Principal) -> impl Iterator<Item = &'a PolicySet> {
        std::iter::once(&self.any)
            .filter(|set| !set.is_empty())
            .chain(self.users.get(principal.id.as_str()))
            .chain(principal.groups.iter().filter_map(|g| self.groups.get(g.as_str())))
    }
}

/// The policy in force, filed by verb and principal.
#[derive(Default)]
pub(super) struct PolicyIndex {
    /// Policies that may apply to any verb.
    every_verb: ByPrincipal,
    /// Policies of one verb each, in the order of [`Verb::ALL`].
    by_verb: Vec<ByPrincipal>,
    /// Policies filed, copies counted (a policy of three verbs is three).
    filed: usize,
}

impl PolicyIndex {
    /// Files every policy of `policies` (static policies only: templates
    /// are refused at load).
    pub(super) fn new(policies: &PolicySet, names: &Names) -> Result<PolicyIndex, String> {
        let mut index = PolicyIndex {
            by_verb: Verb::ALL.iter().map(|_| ByPrincipal::default()).collect(),
            ..PolicyIndex::default()
        };
        for policy in policies.policies() {
            let principal = principal_key(policy, names);
            match verbs_of(policy, names) {
                Some(verbs) => {
                    for verb in verbs {
                        if let Some(filed) = index.by_verb.get_mut(verb) {
                            filed.add(&principal, policy.clone())?;
                            index.filed += 1;
                        }
                    }
                }
                None => {
                    index.every_verb.add(&principal, policy.clone())?;
                    index.filed += 1;
                }
            }
        }
        Ok(index)
    }

    /// The sets a request of `principal` for `verb` evaluates: every policy
    /// that can match it is in exactly one of them.
    pub(super) fn sets<'a>(&'a self, principal: &'a Principal, verb: Verb) -> impl Iterator<Item = &'a PolicySet> {
        let of_verb = Verb::ALL
            .iter()
            .position(|v| *v == verb)
            .and_then(|i| self.by_verb.get(i));
        self.every_verb
            .sets(principal)
            .chain(of_verb.into_iter().flat_map(|filed| filed.sets(principal)))
    }

    /// Policies filed, copies counted.
    pub(super) fn filed(&self) -> usize {
        self.filed
    }
}

/// The verbs (indexes into [`Verb::ALL`]) a policy's action scope names,
/// or None when it may apply to any verb.
fn verbs_of(policy: &Policy, names: &Names) -> Option<Vec<usize>> {
    let named = match policy.action_constraint() {
        ActionConstraint::Any => return None,
        ActionConstraint::Eq(action) => vec![action],
        ActionConstraint::In(actions) => actions,
    };
    if named.len() > MAX_VERBS_FILED {
        return None;
    }
    let mut verbs = Vec::with_capacity(named.len());
    for action in &named {
        // An action that is not one verb (an action group of a future
        // schema, which `in` would widen): any verb, to be safe.
        let verb = names.verb_of(action)?;
        if !verbs.contains(&verb) {
            verbs.push(verb);
        }
    }
    Some(verbs)
}

/// Whom a policy's principal scope can match: a principal is always a
/// `Cascade::User`, a member of its groups and of nothing else, so `in` a
/// user is that user and `in` a group is that group's members.
fn principal_key(policy: &Policy, names: &Names) -> PrincipalKey {
    let keyed = |uid: &EntityUid, groups_too: bool| {
        let id = uid.id().unescaped().to_owned();
        if uid.type_name() == &names.user {
            PrincipalKey::User(id)
        } else if groups_too && uid.type_name() == &names.group {
            PrincipalKey::Group(id)
        } else {
            PrincipalKey::Any
        }
    };
    match policy.principal_constraint() {
        PrincipalConstraint::Any | PrincipalConstraint::Is(_) => PrincipalKey::Any,
        // `principal == Group::".."` never matches a user: evaluated anyway.
        PrincipalConstraint::Eq(uid) => keyed(&uid, false),
        PrincipalConstraint::In(uid) | PrincipalConstraint::IsIn(_, uid) => keyed(&uid, true),
    }
}

#[cfg(test)]
mod tests;
