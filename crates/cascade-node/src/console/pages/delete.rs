//! The dry-run page of a cascade from a resource (`/resources/NAME/delete`):
//! the plan the API answered the caller, listed per region with the
//! operation page's classes and colours (each member deleted, each field
//! unset, each member a blocker would hold, with the blocker), its token
//! and its size; the members the caller may not change; and the delete
//! button, only when the API's own answer says the delete would be
//! allowed. Also what a delete the API refused shows: its reason, and the
//! members that changed since the plan or that the caller may not change.
//!
//! A plan has no parent links (the API answers its members, not how the
//! walk reached them), so it is a list per region, not a nested tree.

use std::collections::{BTreeMap, BTreeSet};

use axum::response::Response;
use cascade_proto::v1;
use maud::{html, Markup};

use super::super::error::{ConsoleError, Refusal};
use super::operation::MAX_TREE_MEMBERS;
use super::{delete_href, layout, operation_href, resource_href, Page};

/// A plan's members in one region.
#[derive(Debug, Default)]
struct RegionPart<'a> {
    deleted: BTreeSet<&'a str>,
    /// (resource, field).
    unset: BTreeSet<(&'a str, &'a str)>,
    /// Resource → what holds it (referrer, field, whether the referrer is
    /// being deleted itself).
    blocked: BTreeMap<&'a str, Vec<&'a v1::Blocker>>,
}

impl<'a> RegionPart<'a> {
    /// Its deleted members by name, the cascade's root first where it is.
    fn deleted_root_first(&self, root: &str) -> Vec<&'a str> {
        let (first, rest): (Vec<&'a str>, Vec<&'a str>) = self.deleted.iter().copied().partition(|n| *n == root);
        first.into_iter().chain(rest).collect()
    }
}

fn region_of(name: &str) -> &str {
    name.split('/').next().unwrap_or_default()
}

/// The plan's members by region, each once (a merged plan may name a
/// member in more than one region's part).
fn parts(plan: &v1::Plan) -> BTreeMap<&str, RegionPart<'_>> {
    let mut parts: BTreeMap<&str, RegionPart<'_>> = BTreeMap::new();
    for r in &plan.deleted {
        parts.entry(region_of(&r.name)).or_default().deleted.insert(&r.name);
    }
    for u in &plan.unset {
        let name = u.resource.as_ref().map(|r| r.name.as_str()).unwrap_or_default();
        parts
            .entry(region_of(name))
            .or_default()
            .unset
            .insert((name, u.field.as_str()));
    }
    for b in &plan.blocked {
        let name = b.resource.as_ref().map(|r| r.name.as_str()).unwrap_or_default();
        let held = parts
            .entry(region_of(name))
            .or_default()
            .blocked
            .entry(name)
            .or_default();
        if let Some(blocker) = &b.blocker {
            held.push(blocker);
        }
    }
    parts
}

/// Why the page shows no delete button, from the API's answer; None when
/// the delete the button sends would be allowed. The dry run is authorized
/// as the delete is (`cascade` on the root) and lists, in `denied`, every
/// member the caller may not change, which the delete's closure check
/// refuses: an answer with none is the API's own yes.
fn no_button(answer: &v1::DeleteResponse) -> Option<Markup> {
    if let Some(op) = &answer.operation {
        return Some(html! {
            "It is already being deleted, by operation "
            a href=(operation_href(&op.id)) { code { (op.id) } } "."
        });
    }
    let Some(plan) = &answer.plan else {
        return Some(html! { "The API answered no plan: there is nothing to delete." });
    };
    let denied = plan.denied.len() as u64 + plan.denied_more;
    if denied > 0 {
        return Some(html! {
            "You may not delete this: the node's policy refuses you " (denied)
            " of its members (listed above), and the API would refuse the delete (PERMISSION_DENIED)."
        });
    }
    if plan.token.is_empty() {
        return Some(html! {
            "This plan has no token, so a delete bound to it cannot be sent: " (plan.token_missing)
            ". Reload when every region answers."
        });
    }
    None
}

/// The dry run's page: `answer` is the API's answer to the caller's
/// `Delete{dry_run, cascade}` of `name`.
pub(in crate::console) fn dry_run(region: &str, name: &str, answer: &v1::DeleteResponse) -> Page {
    let refused = no_button(answer);
    layout(
        region,
        &format!("Delete {name}?"),
        html! {
            h1 { "Delete " code.name { (name) } "?" }
            p.help {
                "A dry run of the cascade, made as you (what "
                code { "cascade delete " (name) " --cascade --dry-run" }
                " prints): nothing has changed yet. The delete below is bound to this plan: if the closure "
                "changes before you press it, the node refuses it and nothing is deleted."
            }
            @if let Some(plan) = &answer.plan { (plan_body(name, plan)) }
            section.delete-action {
                @match &refused {
                    Some(why) => { p #no-delete .note { (why) } }
                    None => {
                        @let (token, members) = answer.plan.as_ref().map(|p| (p.token.as_str(), p.members)).unwrap_or_default();
                        form #delete-form method="post" action=(delete_href(name)) {
                            input type="hidden" name="plan" value=(token);
                            button #delete-button .danger type="submit" {
                                "Delete " (name) " and its cascade (" (members) " members)"
                            }
                        }
                    }
                }
                p { a href=(resource_href(name)) { "Back to " (name) } }
            }
        },
    )
}

fn plan_body(root: &str, plan: &v1::Plan) -> Markup {
    let parts = parts(plan);
    let mut drawn = 0;
    let total: usize = parts
        .values()
        .map(|p| p.deleted.len() + p.unset.len() + p.blocked.len())
        .sum();
    html! {
        @for unreachable in &plan.unreachable_regions {
            p.unreachable role="alert" data-region=(unreachable) {
                "Region " strong { (unreachable) } " could not be asked: its part of the plan is missing."
            }
        }
        dl.facts {
            dt { "Members" } dd #plan-members { (plan.members) }
            dt { "Plan token" }
            dd {
                @if plan.token.is_empty() { span #plan-token-missing .problem { "none: " (plan.token_missing) } }
                @else { code #plan-token { (plan.token) } }
            }
        }
        @if plan.truncated {
            p.note { "The walk stopped at its bound: the plan is not the whole closure." }
        }
        @if !plan.denied.is_empty() {
            section #denied .denied {
                h2 { "Members you may not change" }
                ul {
                    @for d in &plan.denied {
                        li.denied data-name=(d.name) data-region=(d.region) {
                            a.name href=(resource_href(&d.name)) { (d.name) }
                            " " span.region { (d.region) } ": may not " strong { (d.verb) }
                            " (rule " code { (d.rule) } ")"
                        }
                    }
                }
                @if plan.denied_more > 0 { p.note { "And " (plan.denied_more) " more." } }
            }
        }
        section.plan-regions {
            h2 { "Per region" }
            table.regions #plan-regions {
                thead { tr { th { "Region" } th { "Deleted" } th { "Unset" } th { "Blocked" } } }
                tbody {
                    @for (r, part) in &parts {
                        tr data-region=(r) {
                            th { (r) }
                            td.count data-count="deleted" { (part.deleted.len()) }
                            td.count data-count="unset" { (part.unset.len()) }
                            td.count data-count="blocked" { (part.blocked.len()) }
                        }
                    }
                }
            }
        }
        section.tree-section.plan {
            h2 { "Members, per region" }
            @for (r, part) in &parts {
                h3 { (r) }
                ul.tree data-region=(r) {
                    @for name in part.deleted_root_first(root) {
                        @if next(&mut drawn) {
                            li.member.status-delete data-name=(name) data-region=(r) data-action="delete" {
                                a.name href=(resource_href(name)) { (name) }
                                " " span.region { (r) } " " span.status.status-delete { "deleted" }
                            }
                        }
                    }
                    @for (name, field) in &part.unset {
                        @if next(&mut drawn) {
                            li.member.status-unset data-name=(name) data-region=(r) data-action="unset" {
                                a.name href=(resource_href(name)) { (name) }
                                " " span.region { (r) } " " span.status.status-unset { "unset" }
                                " " span.field { "field " (field) }
                            }
                        }
                    }
                    @for (name, blockers) in &part.blocked {
                        @if next(&mut drawn) {
                            li.member.status-blocked data-name=(name) data-region=(r) data-action="blocked" {
                                a.name href=(resource_href(name)) { (name) }
                                " " span.region { (r) } " " span.status.status-blocked { "blocked" }
                                ul.reasons {
                                    @for b in blockers {
                                        li.reason {
                                            "blocked by " a href=(resource_href(&b.referrer)) { (b.referrer) }
                                            " (region " (region_of(&b.referrer)) ", field " (b.field) ")"
                                            @if b.referrer_deleting { ", which is being deleted itself" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if total > MAX_TREE_MEMBERS {
                p.note { "The first " (MAX_TREE_MEMBERS) " of " (total) " members are drawn; the counts above are whole." }
            }
        }
    }
}

/// One more member drawn, if the page has room for it.
fn next(drawn: &mut usize) -> bool {
    *drawn += 1;
    *drawn <= MAX_TREE_MEMBERS
}

/// The dry run refused (the caller may not start this cascade, the
/// resource is gone, the node did not answer): the API's words, and no
/// button.
pub(in crate::console) fn dry_run_refused(region: &str, name: &str, error: &ConsoleError) -> Response {
    layout(
        region,
        error.title(),
        html! {
            h1 { "Delete " code.name { (name) } "?" }
            p.problem #refusal role="alert" { (error.to_string()) }
            @match error {
                ConsoleError::Forbidden(_) => {
                    p #no-delete .note {
                        "The API refused you the dry run: it is authorized as the delete is (verb "
                        code { "cascade" } " on the resource), so you may not delete it either. "
                        code { "cascade auth can-i" } " says what you may."
                    }
                }
                ConsoleError::Unauthenticated(_) => {
                    p { a href={"/login?next=" (super::query_value(&delete_href(name)))} { "Sign in" } " with a token this cluster accepts." }
                }
                ConsoleError::Unavailable(_) => {
                    p { "The node did not answer in time. Reload to try again." }
                }
                _ => {}
            }
            p { a href=(resource_href(name)) { "Back to " (name) } }
        },
    )
    .into_response_with(error.status())
}

/// A delete the API refused: why, the members that changed since the plan
/// (ABORTED, PLAN_CHANGED) or that the caller may not change
/// (PERMISSION_DENIED), and whether anything changed.
pub(in crate::console) fn delete_refused(region: &str, name: &str, refusal: &Refusal) -> Response {
    let error = &refusal.error;
    let details = refusal.details.clone().unwrap_or_default();
    let plan_changed = details.reason == v1::ErrorReason::PlanChanged as i32;
    let heading = match error {
        ConsoleError::Conflict(_) if plan_changed => "Not deleted: the plan changed",
        ConsoleError::Forbidden(_) => "Not deleted: not allowed",
        ConsoleError::Unavailable(_) => "No answer",
        _ => "Not deleted",
    };
    layout(
        region,
        heading,
        html! {
            h1 { (heading) }
            p.problem #refusal role="alert" { (error.to_string()) }
            @if !details.plan_changes.is_empty() {
                section #plan-changes {
                    h2 { "What changed since the dry run" }
                    table.changes {
                        thead { tr { th { "" } th { "Member" } th { "Region" } th { "Action" } } }
                        tbody {
                            @for c in &details.plan_changes {
                                tr class={"change " (if c.added { "added" } else { "removed" })} data-name=(c.name) {
                                    td { @if c.added { "added" } @else { "removed" } }
                                    td { a.name href=(resource_href(&c.name)) { (c.name) } }
                                    td { (c.region) }
                                    td { (c.action) }
                                }
                            }
                        }
                    }
                    @if details.more > 0 { p.note { "And " (details.more) " more." } }
                    @if details.plan_members > 0 { p { "The closure has " (details.plan_members) " members now." } }
                }
            }
            @if !details.denied.is_empty() {
                section #denied .denied {
                    h2 { "Members you may not change" }
                    ul {
                        @for d in &details.denied {
                            li.denied data-name=(d.name) data-region=(d.region) {
                                a.name href=(resource_href(&d.name)) { (d.name) }
                                " " span.region { (d.region) } ": may not " strong { (d.verb) }
                                " (rule " code { (d.rule) } ")"
                            }
                        }
                    }
                }
            }
            @match error {
                ConsoleError::Unavailable(_) => {
                    p { "The node did not answer in time, so whether the delete started is not known here: "
                        a href=(resource_href(name)) { "the resource's page" } " says (it shows its deletion when it is being deleted)." }
                }
                ConsoleError::Unauthenticated(_) => {
                    p { "Nothing was deleted. " a href={"/login?next=" (super::query_value(&delete_href(name)))} { "Sign in" } " again." }
                }
                _ => { p #nothing-deleted { "Nothing was deleted." } }
            }
            p { a #dry-run-again href=(delete_href(name)) { "Run the dry run again" } }
        },
    )
    .into_response_with(error.status())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> Option<v1::ObjectRef> {
        Some(v1::ObjectRef {
            name: name.to_owned(),
            ..Default::default()
        })
    }

    fn plan() -> v1::Plan {
        v1::Plan {
            deleted: [
                "us-east/port/p",
                "eu-west/network/n",
                "eu-west/address/a",
                "us-east/port/p",
            ]
            .iter()
            .map(|n| named(n).unwrap_or_default())
            .collect(),
            unset: vec![v1::PlannedUnset {
                resource: named("ap-south/network/peer"),
                field: "peer".into(),
            }],
            blocked: vec![v1::PlannedBlock {
                resource: named("eu-west/network/n"),
                blocker: Some(v1::Blocker {
                    referrer: "ap-south/router/r".into(),
                    field: "gateway_network".into(),
                    referrer_deleting: false,
                }),
            }],
            token: "p1-0123".into(),
            members: 4,
            ..Default::default()
        }
    }

    #[test]
    fn the_plan_is_counted_per_region_each_member_once_the_root_first_with_the_button() {
        let answer = v1::DeleteResponse {
            plan: Some(plan()),
            ..Default::default()
        };
        let html = dry_run("us-east", "eu-west/network/n", &answer).0.into_string();
        let row = |region: &str, counts: [usize; 3]| {
            format!(
                r#"<tr data-region="{region}"><th>{region}</th><td class="count" data-count="deleted">{}</td><td class="count" data-count="unset">{}</td><td class="count" data-count="blocked">{}</td></tr>"#,
                counts[0], counts[1], counts[2]
            )
        };
        assert!(html.contains(&row("eu-west", [2, 0, 1])), "{html}");
        assert!(html.contains(&row("us-east", [1, 0, 0])), "{html}");
        assert!(html.contains(&row("ap-south", [0, 1, 0])), "{html}");
        let root = html.find(r#"data-name="eu-west/network/n" data-region="eu-west" data-action="delete""#);
        // Before a member whose name sorts first.
        let address = html.find(r#"data-name="eu-west/address/a""#);
        assert!(root.is_some_and(|r| address.is_some_and(|a| r < a)), "{html}");
        assert!(html.contains("field peer"), "{html}");
        assert!(html.contains("(region ap-south, field gateway_network)"), "{html}");
        assert!(html.contains(r#"<code id="plan-token">p1-0123</code>"#), "{html}");
        assert!(
            html.contains(r#"<input type="hidden" name="plan" value="p1-0123">"#),
            "{html}"
        );
        assert!(html.contains(r#"id="delete-button""#), "{html}");
    }

    #[test]
    fn no_button_when_the_api_says_a_member_is_refused_or_the_plan_has_no_token() {
        let mut denied = plan();
        denied.denied.push(v1::DeniedMember {
            region: "us-east".into(),
            name: "us-east/port/p".into(),
            verb: "delete".into(),
            rule: "net-admins-no-ports".into(),
        });
        let mut unbound = plan();
        unbound.token = String::new();
        unbound.token_missing = "region ap-south could not be asked".into();
        unbound.unreachable_regions = vec!["ap-south".into()];
        for (plan, why) in [
            (denied, "net-admins-no-ports"),
            (unbound, "region ap-south could not be asked"),
        ] {
            let answer = v1::DeleteResponse {
                plan: Some(plan),
                ..Default::default()
            };
            let html = dry_run("us-east", "eu-west/network/n", &answer).0.into_string();
            assert!(!html.contains("delete-button"), "{html}");
            assert!(!html.contains("<form id=\"delete-form\""), "{html}");
            assert!(html.contains(r#"id="no-delete""#), "{html}");
            assert!(html.contains(why), "{why} in {html}");
        }
    }

    #[test]
    fn a_refused_bound_delete_names_the_members_that_changed_and_says_nothing_was_deleted() {
        let refusal = Refusal {
            error: ConsoleError::Conflict("Aborted: eu-west/network/n: the closure changed".into()),
            details: Some(v1::ErrorDetails {
                reason: v1::ErrorReason::PlanChanged as i32,
                plan_changes: vec![v1::PlanChange {
                    region: "ap-south".into(),
                    name: "ap-south/port/<late>".into(),
                    action: "delete".into(),
                    added: true,
                    ..Default::default()
                }],
                plan_members: 5,
                ..Default::default()
            }),
        };
        let response = delete_refused("us-east", "eu-west/network/n", &refusal);
        assert_eq!(response.status(), axum::http::StatusCode::CONFLICT);
        let body = futures::executor::block_on(axum::body::to_bytes(response.into_body(), 1 << 20)).expect("the page");
        let html = String::from_utf8_lossy(&body);
        assert!(html.contains("Not deleted: the plan changed"), "{html}");
        assert!(html.contains(r#"data-name="ap-south/port/&lt;late&gt;""#), "{html}");
        assert!(html.contains("Nothing was deleted."), "{html}");
        assert!(html.contains("5 members now"), "{html}");
    }
}
