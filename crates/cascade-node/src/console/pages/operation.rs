//! The operation page: its totals and state as `GetOperation` answers them
//! (the numbers `cascade operation` prints), the rate, the regions that
//! did not answer, its tree across regions from `ExplainDeletion`
//! coloured by state with each held member's reasons, and its outcomes a
//! page at a time. The live part is re-rendered by `live.rs`.

use std::collections::BTreeMap;

use cascade_proto::v1;
use maud::{html, Markup};

use super::super::backend::enum_word;
use super::{instant, layout, operation_href, query_value, resource_href, Page};

/// Tree levels shown open; deeper ones are collapsed (a 100k-member
/// operation's tree stays a page a browser draws at once).
const OPEN_LEVELS: usize = 2;

/// Members of the tree drawn at most; the rest are counted.
pub(crate) const MAX_TREE_MEMBERS: usize = 2_000;

/// How deep the tree is followed (a parent chain longer than this is cut).
const MAX_TREE_DEPTH: usize = 64;

/// How fast members are finished.
#[derive(Debug, Clone, Copy)]
pub(in crate::console) enum Rate {
    /// Over the last reads of a live page (`live.rs`), members per second.
    Live(f64),
    /// From the start to the end of a finished operation.
    Average(f64),
}

/// The whole page; `live` is its live part (`live_operation`).
pub(in crate::console) fn operation_page(region: &str, op: &v1::Operation, live: Markup, outcomes_token: &str) -> Page {
    let root = op.root.as_ref().map(|r| r.name.clone()).unwrap_or_default();
    layout(
        region,
        &format!("Operation {}", op.id),
        html! {
            h1 { "Operation " code #operation-id { (op.id) } }
            dl.facts {
                dt { "Root" } dd { a href=(resource_href(&root)) { (root) } }
                dt { "Requested by" } dd { (op.requested_by) }
                dt { "Cascade" } dd { @if op.cascade { "yes" } @else { "no" } }
                dt { "Started" } dd { (instant(op.create_time_ms)) }
                @if op.max_deletions > 0 { dt { "Budget" } dd { (op.budget_used) " of " (op.max_deletions) } }
                @if op.rate_per_second > 0 { dt { "Rate limit" } dd { (op.rate_per_second) "/s" } }
                @if op.retention_seconds > 0 { dt { "Retention" } dd { (op.retention_seconds) " s" } }
            }
            div #live data-live={(operation_href(&op.id)) "/live"} { (live) }
            section.outcomes {
                h2 { "Outcomes" }
                @if op.outcomes.is_empty() { p.empty { "None on this page." } } @else {
                    table.outcomes {
                        thead { tr { th { "Resource" } th { "Region" } th { "Outcome" } th { "Field" } th { "Message" } } }
                        tbody {
                            @for o in &op.outcomes {
                                @let action = enum_word(o.action().as_str_name(), "OUTCOME_ACTION_").to_lowercase();
                                @let name = o.resource.as_ref().map(|r| r.name.as_str()).unwrap_or_default();
                                tr class={"outcome action-" (action)} {
                                    td { a href=(resource_href(name)) { (name) } }
                                    td { (o.region) }
                                    td { (action) }
                                    td { (o.field) }
                                    td {
                                        (o.message)
                                        @for b in &o.blockers { " blocked by " a href=(resource_href(&b.referrer)) { (b.referrer) } " (field " (b.field) ")" }
                                    }
                                }
                            }
                        }
                    }
                }
                p.pager {
                    @if !outcomes_token.is_empty() { a href=(operation_href(&op.id)) { "First page" } " " }
                    @if !op.next_outcomes_page_token.is_empty() {
                        a.next href={(operation_href(&op.id)) "?outcomes=" (query_value(&op.next_outcomes_page_token))} { "Next page" }
                    }
                }
            }
        },
    )
}

/// The live part: state, totals, rate, unreachable regions, what is in
/// flight per region, and the tree.
pub(in crate::console) fn live_operation(
    op: &v1::Operation,
    explained: Option<Result<&v1::DeletionExplanation, String>>,
    rate: Option<Rate>,
) -> Markup {
    let state = enum_word(op.state().as_str_name(), "OPERATION_STATE_").to_owned();
    let p = op.progress.unwrap_or_default();
    let counts = counters(&p);
    // Each unreachable region once, with the explanation's reason when it has one.
    let mut unreachable: BTreeMap<&str, String> = op
        .unreachable_regions
        .iter()
        .map(|r| (r.as_str(), "its part of the operation could not be read".to_owned()))
        .collect();
    if let Some(Ok(e)) = &explained {
        for u in &e.unreachable {
            let since = match u.last_contact_ms {
                0 => String::new(),
                ms => format!(
                    "; last heard {} ago",
                    cascade_core::time_text::duration(u64::try_from(e.time_ms.saturating_sub(ms)).unwrap_or(0))
                ),
            };
            unreachable.insert(u.region.as_str(), format!("{}{since}", u.reason));
        }
        for r in &e.unreachable_regions {
            unreachable
                .entry(r.as_str())
                .or_insert_with(|| "its part is missing".to_owned());
        }
    }
    html! {
        div.summary {
            span #state class={"state state-" (state.to_lowercase())} data-state=(state) data-done=(if op.done { "true" } else { "false" }) { (state) }
            dl.counts {
                @for (what, n) in counts {
                    div class={"count count-" (what)} {
                        dt { (what) }
                        dd id={"count-" (what)} data-count=(what) { (n) }
                    }
                }
            }
            p #rate {
                @match rate {
                    Some(Rate::Live(r)) => { "Rate: " strong { (format!("{r:.0}")) } " members/s (over the last few seconds)" }
                    Some(Rate::Average(r)) => { "Average rate: " strong { (format!("{r:.0}")) } " members/s" }
                    None => { "Rate: measuring…" }
                }
            }
        }
        (region_progress(op))
        @for (region, why) in &unreachable {
            p.unreachable role="alert" data-region=(region) {
                "Region " strong { (region) } " is unreachable: " (why)
                ". What is shown of it may be stale or missing; the page keeps trying."
            }
        }
        @match &explained {
            None => {}
            Some(Err(why)) => { p.problem { "The tree could not be read: " (why) } }
            Some(Ok(e)) => { (tree(e)) }
        }
    }
}

/// Each region's counters (`Operation.region_progress`, from the same
/// reads as the totals above), a row per region; a region whose part could
/// not be read says so instead of showing zeros.
fn region_progress(op: &v1::Operation) -> Markup {
    html! {
        @if !op.region_progress.is_empty() {
            section.region-progress {
                h2 { "Progress per region" }
                table #region-progress .regions {
                    thead { tr {
                        th { "Region" } th { "State" }
                        @for what in COUNTERS { th { (what) } }
                    } }
                    tbody {
                        @for r in &op.region_progress {
                            @let p = r.progress.unwrap_or_default();
                            @let state = enum_word(r.state().as_str_name(), "OPERATION_STATE_").to_owned();
                            tr data-region-progress=(r.region) data-reachable=(if r.reachable { "true" } else { "false" }) {
                                th { (r.region) }
                                @if r.reachable {
                                    td { span class={"state state-" (state.to_lowercase())} { (state) } }
                                    @for (what, n) in counters(&p) { td.count data-count=(what) { (n) } }
                                } @else {
                                    td.region-unreachable colspan=(1 + COUNTERS.len()) { "unreachable: its counts are unknown" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The counters a page shows, in its order.
const COUNTERS: [&str; 5] = ["deleted", "unset", "pending", "blocked", "failed"];

fn counters(p: &v1::Progress) -> [(&'static str, u64); 5] {
    [
        ("deleted", p.deleted),
        ("unset", p.unset),
        ("pending", p.pending),
        ("blocked", p.blocked),
        ("failed", p.failed),
    ]
}

/// In-flight members per region and status, then the tree by parent.
fn tree(e: &v1::DeletionExplanation) -> Markup {
    let mut per_region: BTreeMap<&str, BTreeMap<String, u64>> = BTreeMap::new();
    let names: std::collections::BTreeSet<&str> = e
        .deletions
        .iter()
        .filter_map(|d| d.resource.as_ref().map(|r| r.name.as_str()))
        .collect();
    let mut children: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut roots = Vec::new();
    for (i, d) in e.deletions.iter().enumerate() {
        if let Some(r) = &d.resource {
            *per_region
                .entry(r.region.as_str())
                .or_default()
                .entry(status_of(d))
                .or_default() += 1;
        }
        if !d.parent.is_empty() && names.contains(d.parent.as_str()) {
            children.entry(d.parent.as_str()).or_default().push(i);
        } else {
            roots.push(i);
        }
    }
    let root_name = e.root.as_ref().map(|r| r.name.as_str()).unwrap_or_default();
    roots.sort_by_key(|&i| e.deletions[i].resource.as_ref().is_none_or(|r| r.name != root_name));
    let mut drawn = 0;
    let forest = html! {
        ul.tree {
            @for &i in &roots { (member(e, i, &children, 0, &mut drawn)) }
        }
    };
    html! {
        @if e.stuck {
            p #stuck .stuck role="alert" {
                "Stuck: a member waits on something only a person can change (a live blocker, a lien, a failure). "
                "Its reasons below say what."
            }
        }
        section.in-flight {
            h2 { "Members still being deleted, per region" }
            @if per_region.is_empty() { p.empty { "None." } } @else {
                table.regions {
                    thead { tr { th { "Region" } th { "Members" } } }
                    tbody {
                        @for (region, statuses) in &per_region {
                            tr data-region=(region) {
                                th { (region) }
                                td { @for (status, n) in statuses { span class={"status-" (status)} { (n) " " (status) } " " } }
                            }
                        }
                    }
                }
            }
            @if e.truncated { p.note { "A region had more members than one answer holds: the tree shows the first of them." } }
        }
        section.tree-section {
            h2 { "Tree across regions" }
            (forest)
            @if drawn >= MAX_TREE_MEMBERS {
                p.note { "The first " (MAX_TREE_MEMBERS) " of " (e.deletions.len()) " members are drawn." }
            }
        }
    }
}

/// A member's deletion status, lower case (`pending`, `blocked`, `waiting`, `failed`).
fn status_of(d: &v1::ExplainedDeletion) -> String {
    d.resource
        .as_ref()
        .and_then(|r| r.deletion.as_ref())
        .map(|del| enum_word(del.status().as_str_name(), "DELETION_STATUS_").to_lowercase())
        .unwrap_or_else(|| "pending".to_owned())
}

fn member(
    e: &v1::DeletionExplanation,
    i: usize,
    children: &BTreeMap<&str, Vec<usize>>,
    depth: usize,
    drawn: &mut usize,
) -> Markup {
    if *drawn >= MAX_TREE_MEMBERS || depth > MAX_TREE_DEPTH {
        return html! {};
    }
    *drawn += 1;
    let d = &e.deletions[i];
    let (name, region) = d
        .resource
        .as_ref()
        .map(|r| (r.name.as_str(), r.region.as_str()))
        .unwrap_or_default();
    let status = status_of(d);
    let line = html! {
        a.name href=(resource_href(name)) { (name) }
        " " span.region { (region) }
        " " span class={"status status-" (status)} { (status) }
        @if !d.field.is_empty() { " " span.field { "via " (d.field) } }
        @if d.stuck { " " span.stuck-flag { "stuck" } }
        @if !d.reasons.is_empty() {
            ul.reasons { @for reason in &d.reasons { li.reason { (reason) } } }
        }
    };
    let kids = children.get(name).map(Vec::as_slice).unwrap_or_default();
    let class = format!("member status-{status}{}", if d.stuck { " stuck" } else { "" });
    html! {
        li class=(class) data-name=(name) data-region=(region) {
            @if kids.is_empty() { (line) } @else {
                details open[depth < OPEN_LEVELS] data-key=(name) {
                    summary { (line) " " span.children { "(" (kids.len()) ")" } }
                    ul { @for &k in kids { (member(e, k, children, depth + 1, drawn)) } }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(
        name: &str,
        parent: &str,
        status: v1::DeletionStatus,
        reasons: &[&str],
        stuck: bool,
    ) -> v1::ExplainedDeletion {
        v1::ExplainedDeletion {
            resource: Some(v1::Resource {
                name: name.to_owned(),
                region: name.split('/').next().unwrap_or_default().to_owned(),
                deletion: Some(v1::Deletion {
                    status: status as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            parent: parent.to_owned(),
            field: if parent.is_empty() {
                String::new()
            } else {
                "network".to_owned()
            },
            reasons: reasons.iter().map(|r| (*r).to_owned()).collect(),
            stuck,
        }
    }

    #[test]
    fn the_live_part_nests_members_by_parent_flags_the_stuck_one_and_names_an_unreachable_region() {
        let blocker =
            "blocked by ap-south/router/r (region ap-south, field gateway_network): live, not being deleted: stuck";
        let e = v1::DeletionExplanation {
            root: Some(v1::ObjectRef {
                name: "eu-west/project/p".into(),
                ..Default::default()
            }),
            deletions: vec![
                member(
                    "eu-west/network/n",
                    "eu-west/project/p",
                    v1::DeletionStatus::Blocked,
                    &[blocker],
                    true,
                ),
                member("eu-west/project/p", "", v1::DeletionStatus::Waiting, &[], false),
                member(
                    "us-east/port/u",
                    "eu-west/network/n",
                    v1::DeletionStatus::Pending,
                    &[],
                    false,
                ),
            ],
            stuck: true,
            unreachable: vec![v1::UnreachableRegion {
                region: "ap-south".into(),
                last_contact_ms: 1_000,
                reason: "did not answer within 0.5s".into(),
            }],
            time_ms: 61_000,
            ..Default::default()
        };
        let op = v1::Operation {
            state: v1::OperationState::Running as i32,
            progress: Some(v1::Progress {
                deleted: 3,
                pending: 2,
                blocked: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let html = live_operation(&op, Some(Ok(&e)), Some(Rate::Live(12.4))).into_string();
        assert!(html.contains(r#"id="count-deleted" data-count="deleted">3<"#), "{html}");
        assert!(html.contains(r#"id="count-blocked" data-count="blocked">1<"#), "{html}");
        assert!(html.contains(r#"data-state="RUNNING""#), "{html}");
        assert!(html.contains("<strong>12</strong>"), "{html}");
        assert!(html.contains(r#"id="stuck""#), "{html}");
        // The root first, the network under it, the port under the network.
        let root = html.find(r#"data-name="eu-west/project/p""#).expect("the root");
        let network = html.find(r#"class="member status-blocked stuck" data-name="eu-west/network/n""#);
        let port = html.find(r#"data-name="us-east/port/u""#).expect("the port");
        assert!(network.is_some_and(|n| root < n && n < port), "{html}");
        assert!(html.contains("region ap-south, field gateway_network"), "{html}");
        assert!(
            html.contains(r#"class="unreachable" role="alert" data-region="ap-south""#),
            "{html}"
        );
        assert!(html.contains("did not answer within 0.5s; last heard 1m ago"), "{html}");
    }

    #[test]
    fn each_region_has_a_row_of_its_counts_and_an_unreachable_one_says_so() {
        let op = v1::Operation {
            state: v1::OperationState::Running as i32,
            region_progress: vec![
                v1::RegionProgress {
                    region: "eu-west".into(),
                    progress: Some(v1::Progress {
                        deleted: 7,
                        pending: 2,
                        ..Default::default()
                    }),
                    reachable: true,
                    state: v1::OperationState::Running as i32,
                },
                v1::RegionProgress {
                    region: "<b>ap</b>".into(),
                    reachable: false,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let html = live_operation(&op, None, None).into_string();
        let row = html
            .find(r#"data-region-progress="eu-west" data-reachable="true""#)
            .expect(&html);
        assert!(html[row..].contains(r#"data-count="deleted">7<"#), "{html}");
        assert!(html[row..].contains(r#"data-count="pending">2<"#), "{html}");
        assert!(
            html.contains(r#"data-region-progress="&lt;b&gt;ap&lt;/b&gt;" data-reachable="false""#),
            "{html}"
        );
        assert!(html.contains("unreachable: its counts are unknown"), "{html}");
    }

    #[test]
    fn a_member_deeper_than_the_open_levels_is_collapsed() {
        let mut deletions = vec![member(
            "eu-west/project/a0",
            "",
            v1::DeletionStatus::Waiting,
            &[],
            false,
        )];
        for i in 1..5 {
            deletions.push(member(
                &format!("eu-west/project/a{i}"),
                &format!("eu-west/project/a{}", i - 1),
                v1::DeletionStatus::Waiting,
                &[],
                false,
            ));
        }
        let e = v1::DeletionExplanation {
            deletions,
            ..Default::default()
        };
        let html = tree(&e).into_string();
        assert_eq!(html.matches("<details open").count(), OPEN_LEVELS, "{html}");
        assert_eq!(html.matches("<details").count(), 4, "{html}");
    }
}
