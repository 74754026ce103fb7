//! Plan-bound deletes (issue 29), as [`Node`] methods: a dry run's merged
//! plan gets its token ([`Node::bind_plan`]), and a delete that expects one,
//! or a cascade above `[limits] confirm_above`, is checked against the
//! closure walked just before the writer's step ([`Node::check_walked`]).
//!
//! The walk is the one the delete's closure check makes
//! (`cluster.rs`, `check_closure`: the dry run's own drive over every
//! region), so a delete walks its closure once, whatever it checks. What it
//! binds is the closure as that walk found it: between the walk and the
//! writer's step a dependent can still be created (in another region, or
//! here in that instant); the cascade deletes it as any other (nothing
//! dangles) and the operation's outcomes list it.

use cascade_core::limits::quote;
use cascade_core::plan::{diff_members, PlanDiff, MAX_PLAN_CHANGES_LISTED};
use cascade_core::protocol::{DeleteRequest, Plan};
use cascade_core::{CoreError, ResourceName};

use crate::error::Fault;
use crate::node::Node;
use crate::plan_tokens::{bind, token_of, Binding, TOKEN_VERSION};

/// Characters of a token an error quotes (the version and two groups of
/// 8 hex digits).
const QUOTED_TOKEN_CHARS: usize = 20;

impl Node {
    /// A dry run's merged plan bound by its token (or why it has none),
    /// with its members remembered so a delete that expects it can be told
    /// what changed.
    pub(crate) fn bind_plan(&self, plan: &Plan, unreachable: &[String]) -> Binding {
        let binding = bind(plan, unreachable);
        if let Ok(token) = &binding.token {
            self.recent_plans.remember(token, binding.members.clone());
        }
        binding
    }

    /// Whether a delete must walk its closure before the writer's step for
    /// its plan: it expects a token, or it is a cascade and the node has a
    /// `confirm_above` threshold.
    pub(crate) fn walks_for_plan(&self, req: &DeleteRequest, expect_plan: Option<&str>) -> bool {
        !req.dry_run && (expect_plan.is_some() || (self.limits.confirm_above.is_some() && req.cascade && !req.orphan))
    }

    /// Checks the closure `plan` (walked just now, every region answered)
    /// against what the delete expects: its token (ABORTED, PLAN_CHANGED,
    /// naming what was added and removed) or, without one, the node's
    /// `confirm_above` (FAILED_PRECONDITION, PLAN_REQUIRED).
    pub(crate) fn check_walked(
        &self,
        req: &DeleteRequest,
        expect_plan: Option<&str>,
        plan: &Plan,
    ) -> Result<(), Fault> {
        let name = ResourceName::parse(&req.name).map_err(|e| CoreError::invalid("name", e.to_string()))?;
        let members = plan.members();
        let count = members.len() as u64;
        if let Some(expected) = expect_plan {
            let now = (!plan.truncated).then(|| token_of(&members));
            if now.as_deref() == Some(expected) {
                return Ok(());
            }
            let before = self.recent_plans.recall(expected);
            let diff = before
                .as_ref()
                .map(|before| diff_members(before, &members, MAX_PLAN_CHANGES_LISTED))
                .unwrap_or_default();
            let why = why_changed(expected, now.is_none(), before.is_some(), &diff, count);
            let prefix: String = expected.chars().take(QUOTED_TOKEN_CHARS).collect();
            let cut = if prefix.len() < expected.len() { "…" } else { "" };
            return Err(CoreError::PlanChanged {
                name,
                expected: format!("{}{cut}", quote(&prefix)),
                why,
                diff: Box::new(diff),
                members: count,
            }
            .into());
        }
        match self.limits.confirm_above {
            Some(most) if req.cascade && !req.orphan && count > most as u64 => Err(CoreError::PlanRequired {
                name,
                members: count,
                at_least: plan.truncated,
                confirm_above: most as u64,
            }
            .into()),
            _ => Ok(()),
        }
    }
}

/// Why the closure is not the expected plan, in words.
fn why_changed(expected: &str, truncated: bool, known: bool, diff: &PlanDiff, members: u64) -> String {
    if !expected.starts_with(TOKEN_VERSION) {
        return format!("not a plan token of this node's version ({TOKEN_VERSION}…)");
    }
    if truncated {
        return format!(
            "the closure is now larger than a dry run walks ({members}+ members): no token binds it; \
             {} added and {} removed among those walked",
            diff.added_total, diff.removed_total
        );
    }
    if !known {
        return format!(
            "the closure has {members} members now; this node does not hold the plan's own members \
             (it restarted, another node took over, or the token is not one of its dry runs), so what changed is not named"
        );
    }
    format!(
        "{} member(s) added, {} removed; {members} now",
        diff.added_total, diff.removed_total
    )
}
