//! A plan as `delete --cascade` shows it before it starts (issue 29): its
//! size, each region's part by action, and the token the delete is bound
//! to; the token line is `plan_text`'s too.

use std::collections::BTreeMap;

use cascade_proto::v1;

/// A plan as `delete --cascade` shows it before it starts: its size, each
/// region's part by action, and the token the delete is bound to.
pub fn plan_summary(p: &v1::Plan) -> String {
    let region_of = |name: &str| name.split('/').next().unwrap_or("").to_owned();
    let mut parts: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for d in &p.deleted {
        parts.entry(region_of(&d.name)).or_default().0 += 1;
    }
    for u in &p.unset {
        let name = u.resource.as_ref().map(|r| r.name.as_str()).unwrap_or("");
        parts.entry(region_of(name)).or_default().1 += 1;
    }
    let mut out = format!(
        "plan: {} members ({} deleted, {} unset) in {} region(s)\n",
        p.members,
        p.deleted.len(),
        p.unset.len(),
        parts.len()
    );
    let width = parts.keys().map(String::len).max().unwrap_or(0);
    for (region, (deleted, unset)) in &parts {
        let mut actions = Vec::new();
        if *deleted > 0 {
            actions.push(format!("{deleted} deleted"));
        }
        if *unset > 0 {
            actions.push(format!("{unset} unset"));
        }
        out += &format!("  {region:<width$}  {}\n", actions.join(", "));
    }
    out += &token_line(p);
    out
}

/// The plan's token, or why it has none.
pub(super) fn token_line(p: &v1::Plan) -> String {
    if p.token.is_empty() {
        format!("no plan token: {}\n", p.token_missing)
    } else {
        format!("plan token: {}\n", p.token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{plan_json, plan_text};

    #[test]
    fn a_plan_summary_counts_each_regions_members_by_action_and_shows_the_token() {
        let at = |name: &str| v1::ObjectRef {
            name: name.into(),
            ..Default::default()
        };
        let mut plan = v1::Plan {
            deleted: vec![at("ra/network/n"), at("rb/port/p1"), at("rb/port/p2")],
            unset: vec![v1::PlannedUnset {
                resource: Some(at("ap-south/floating_ip/f")),
                field: "port".into(),
            }],
            members: 4,
            token: "p1-abc".into(),
            ..Default::default()
        };
        assert_eq!(
            plan_summary(&plan),
            "plan: 4 members (3 deleted, 1 unset) in 3 region(s)\n  ap-south  1 unset\n  ra        1 deleted\n  rb        2 deleted\nplan token: p1-abc\n"
        );
        assert!(
            plan_text(&plan).ends_with("plan token: p1-abc\n"),
            "{}",
            plan_text(&plan)
        );
        assert_eq!(plan_json(&plan)["token"], "p1-abc");
        assert_eq!(plan_json(&plan)["members"], 4);
        plan.token.clear();
        plan.token_missing = "the plan is truncated".into();
        assert!(plan_summary(&plan).ends_with("no plan token: the plan is truncated\n"));
        assert!(plan_text(&plan).ends_with("no plan token: the plan is truncated\n"));
    }
}
