//! The cluster page: every region as the serving node sees it (the data
//! of `cascade status`: address, whether it answers, its link and how far
//! behind it is, its writer and nodes, versions, deletions in flight),
//! and a region's audit log, filtered. A region that does not answer is a
//! row that says so and why; an audit log the caller may not read is a
//! note, and the rest of the page is still shown.

use cascade_core::time_text::duration;
use cascade_proto::v1;
use maud::{html, Markup};

use super::{instant, layout, query_value, resource_href, Page};
use crate::console::backend::cluster::AuditFilter;

/// The cluster page, from what the two calls answered.
pub(in crate::console) fn cluster_page(
    region: &str,
    status: Result<&v1::ClusterStatus, String>,
    audit: Result<&v1::ListAuditResponse, String>,
    filter: &AuditFilter,
) -> Page {
    layout(
        region,
        "Cluster",
        html! {
            h1 { "Cluster" }
            @match status {
                Ok(status) => (regions_table(status)),
                Err(why) => p.problem role="alert" { "The regions could not be read: " (why) },
            }
            h2 #audit { "Audit log" }
            (audit_filters(filter))
            @match audit {
                Ok(page) => (audit_table(page, filter)),
                Err(why) => p.problem role="alert" { "The audit log could not be read: " (why) },
            }
        },
    )
}

fn regions_table(status: &v1::ClusterStatus) -> Markup {
    let unreachable: Vec<&str> = status
        .regions
        .iter()
        .filter(|r| !r.reachable)
        .map(|r| r.region.as_str())
        .collect();
    let versions: std::collections::BTreeSet<&str> = status
        .regions
        .iter()
        .filter_map(|r| r.figures.as_ref())
        .map(|f| f.binary_version.as_str())
        .filter(|v| !v.is_empty())
        .collect();
    let schemas: std::collections::BTreeSet<&str> = status
        .regions
        .iter()
        .filter_map(|r| r.figures.as_ref())
        .map(|f| f.schema_version.as_str())
        .filter(|v| !v.is_empty())
        .collect();
    html! {
        p.note {
            "As " code { (status.answered_by) }
            @if !status.answered_by_node.is_empty() { " (node " code { (status.answered_by_node) } ")" }
            " sees it at " (instant(status.time_ms)) "."
        }
        @for name in &unreachable {
            p.unreachable role="alert" data-region=(name) { "Region " strong { (name) } " does not answer." }
        }
        @if versions.len() > 1 {
            p.note.versions { "The regions run different binaries: " (versions.iter().copied().collect::<Vec<_>>().join(", ")) "." }
        }
        @if schemas.len() > 1 {
            p.note.schemas { "The regions run different schemas: " (schemas.iter().copied().collect::<Vec<_>>().join(", ")) "." }
        }
        table.regions {
            thead { tr {
                th { "Region" } th { "Address" } th { "Answers" } th { "Link" } th { "Behind" }
                th { "Last contact" } th { "Resources" } th { "Pending" } th { "Blocked" } th { "Waiting" }
                th { "Failed" } th { "Oldest deletion" } th { "Writer" } th { "Protocol" } th { "Binary" } th { "Schema" }
            } }
            tbody {
                @for r in &status.regions {
                    @let f = r.figures.as_ref();
                    tr data-region=(r.region) data-reachable=(r.reachable) {
                        td { code { (r.region) } }
                        td { (r.address) }
                        td.answers {
                            @if r.reachable { "yes" } @else { "no: " (r.error) }
                        }
                        td.link { @if r.region == status.answered_by { "self" } @else if r.link_connected { "up" } @else { "down" } }
                        td { @if r.events_behind < 0 { "?" } @else { (r.events_behind) } }
                        td {
                            @if r.region == status.answered_by { "-" }
                            @else if r.last_contact_ms > 0 {
                                (duration(u64::try_from(status.time_ms.saturating_sub(r.last_contact_ms)).unwrap_or(0))) " ago"
                            } @else { "never" }
                        }
                        @if let Some(f) = f {
                            td.resources { (f.resources_creating + f.resources_active + f.resources_deleting) }
                            td { (f.deletions_pending) }
                            td { (f.deletions_blocked) }
                            td { (f.deletions_waiting) }
                            td { (f.deletions_failed) }
                            td { @if f.oldest_deletion_age_ms > 0 { (duration(u64::try_from(f.oldest_deletion_age_ms).unwrap_or(0))) } @else { "-" } }
                            td {
                                @if f.nodes.is_empty() { "single node" }
                                @else {
                                    @for n in &f.nodes {
                                        span.node data-role=(n.role) { (n.node) " (" (n.role) ")" } " "
                                    }
                                    " epoch " (f.writer_epoch)
                                }
                            }
                            td { (if f.protocol_version == 0 { 1 } else { f.protocol_version }) }
                            td { (f.binary_version) }
                            td.schema {
                                code { (f.schema_version) }
                                @if !f.schema_label.is_empty() { " (" (f.schema_label) ")" }
                            }
                        } @else {
                            td colspan="9" { "-" }
                            td { (if r.protocol_version == 0 { 1 } else { r.protocol_version }) }
                            td { }
                            td { }
                        }
                    }
                }
            }
        }
    }
}

fn audit_filters(filter: &AuditFilter) -> Markup {
    html! {
        form.audit-filter method="get" action="/cluster#audit" {
            label { "Region " input type="text" name="region" value=(filter.region) maxlength="64" placeholder="this node's"; }
            label { "Who " input type="text" name="principal" value=(filter.principal) maxlength="256"; }
            label { "Action " input type="text" name="action" value=(filter.action) maxlength="64" placeholder="delete, ForcePurge, ..."; }
            label { "Resource " input type="text" name="resource" value=(filter.resource) maxlength="256" placeholder="region/kind/id"; }
            button type="submit" { "Filter" }
        }
    }
}

fn audit_table(page: &v1::ListAuditResponse, filter: &AuditFilter) -> Markup {
    html! {
        @if page.entries.is_empty() {
            p.empty { "No entry on this page." }
        } @else {
            table.audit {
                thead { tr {
                    th { "Time" } th { "Region" } th { "Who" } th { "Via" } th { "Action" } th { "Target" }
                    th { "Reason" } th { "Outcome" }
                } }
                tbody {
                    @for e in &page.entries {
                        tr data-action=(e.action) data-outcome=(if e.outcome == "ok" { "ok" } else { "refused" }) {
                            td { (instant(e.time_ms)) }
                            td { (e.region) }
                            td.who { (e.who) }
                            td { (e.via) }
                            td.action { (e.action) }
                            td.target {
                                @if e.target.matches('/').count() == 2 { a href=(resource_href(&e.target)) { (e.target) } }
                                @else { (e.target) }
                            }
                            td { (e.reason) }
                            td.outcome { (e.outcome) }
                        }
                    }
                }
            }
        }
        @if !page.next_page_token.is_empty() {
            p { a.next-page href=(next_page(filter, &page.next_page_token)) { "Older entries" } }
        }
    }
}

fn next_page(filter: &AuditFilter, token: &str) -> String {
    format!(
        "/cluster?region={}&principal={}&action={}&resource={}&page={}#audit",
        query_value(&filter.region),
        query_value(&filter.principal),
        query_value(&filter.action),
        query_value(&filter.resource),
        query_value(token)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> v1::ClusterStatus {
        v1::ClusterStatus {
            answered_by: "eu-west".into(),
            time_ms: 1_700_000_000_000,
            regions: vec![
                v1::RegionStatus {
                    region: "eu-west".into(),
                    reachable: true,
                    link_connected: true,
                    figures: Some(v1::RegionFigures {
                        resources_active: 3,
                        binary_version: "0.1.0".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                v1::RegionStatus {
                    region: "us-east".into(),
                    reachable: false,
                    error: "<b>did not answer</b>".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn an_unreachable_region_is_named_with_why_and_its_text_escaped() {
        let audit = v1::ListAuditResponse::default();
        let html = cluster_page("eu-west", Ok(&status()), Ok(&audit), &AuditFilter::default())
            .0
            .into_string();
        assert!(
            html.contains("Region <strong>us-east</strong> does not answer."),
            "{html}"
        );
        assert!(html.contains("no: &lt;b&gt;did not answer&lt;/b&gt;"), "{html}");
        assert!(html.contains("No entry on this page."), "{html}");
    }

    #[test]
    fn an_audit_log_the_caller_may_not_read_leaves_the_regions_shown() {
        let html = cluster_page(
            "eu-west",
            Ok(&status()),
            Err("permission denied: admin.audit".into()),
            &AuditFilter::default(),
        )
        .0
        .into_string();
        assert!(
            html.contains("The audit log could not be read: permission denied"),
            "{html}"
        );
        assert!(html.contains("data-region=\"eu-west\""), "{html}");
    }

    #[test]
    fn regions_on_different_schemas_are_said_to_differ() {
        let mut status = status();
        let figures = |version: &str| v1::RegionFigures {
            schema_version: version.into(),
            ..Default::default()
        };
        status.regions[0].figures = Some(v1::RegionFigures {
            schema_label: "2026-11 volumes".into(),
            ..figures("fd517857c619fcd8")
        });
        status.regions.push(v1::RegionStatus {
            region: "ap-south".into(),
            reachable: true,
            figures: Some(figures("0123456789abcdef")),
            ..Default::default()
        });
        let html = regions_table(&status).into_string();
        assert!(
            html.contains("The regions run different schemas: 0123456789abcdef, fd517857c619fcd8."),
            "{html}"
        );
        assert!(
            html.contains("<code>fd517857c619fcd8</code> (2026-11 volumes)"),
            "{html}"
        );
    }

    #[test]
    fn the_next_page_keeps_the_filters() {
        let filter = AuditFilter {
            action: "delete".into(),
            resource: "eu-west/project/p q".into(),
            ..Default::default()
        };
        let page = v1::ListAuditResponse {
            entries: Vec::new(),
            next_page_token: "tok=1".into(),
        };
        let html = audit_table(&page, &filter).into_string();
        assert!(
            html.contains("action=delete&amp;resource=eu-west%2Fproject%2Fp%20q&amp;page=tok%3D1"),
            "{html}"
        );
    }
}
