//! A resource's page: its attributes, references both ways, its deletion
//! and its history of events (`Resources.GetHistory`, newest first,
//! paged); and the page of a resource that is gone, which still shows
//! the history its region keeps.

use cascade_proto::v1;
use maud::{html, Markup};

use super::{delete_href, instant, layout, operation_href, query_value, resource_href, Page};
use crate::console::backend::enum_word;

/// A resource: attributes, references both ways (a page each), its
/// deletion when it is being deleted, its history.
pub(in crate::console) fn resource(
    region: &str,
    r: &v1::Resource,
    referrers: Result<&v1::ListReferencesResponse, String>,
    targets: Result<&v1::ListReferencesResponse, String>,
    history: Result<&v1::GetHistoryResponse, String>,
) -> Page {
    let state = enum_word(r.state().as_str_name(), "RESOURCE_STATE_").to_owned();
    layout(
        region,
        &r.name,
        html! {
            h1 { code.name { (r.name) } " " span class={"state state-" (state.to_lowercase())} { (state) } }
            @if r.deletion.is_none() {
                p { a #delete-link href=(delete_href(&r.name)) { "Delete…" } " (a dry run first: what the cascade would do, then a button if you may)" }
            }
            dl.facts {
                dt { "Kind" } dd { (r.kind) }
                dt { "Region" } dd { (r.region) }
                dt { "Uid" } dd { code { (r.uid) } }
                dt { "Revision" } dd { (r.revision) }
                dt { "Created" } dd { (instant(r.create_time_ms)) }
                dt { "Updated" } dd { (instant(r.update_time_ms)) }
                @if !r.finalizers.is_empty() { dt { "Finalizers" } dd { (r.finalizers.join(", ")) } }
                @for lien in &r.liens { dt { "Lien" } dd { (lien.id) " " (lien.reason) } }
            }
            @if let Some(d) = &r.deletion {
                section.deletion {
                    h2 { "Being deleted" }
                    p {
                        "Status " strong { (enum_word(d.status().as_str_name(), "DELETION_STATUS_")) }
                        ", " (d.reason) ", operation "
                        a href=(operation_href(&d.operation_id)) { code { (d.operation_id) } }
                    }
                    @if !d.message.is_empty() { p.reason { (d.message) } }
                }
            }
            section {
                h2 { "Attributes" }
                @if r.attributes.is_empty() { p.empty { "None." } } @else {
                    table.attributes {
                        @for (k, v) in r.attributes.iter().collect::<std::collections::BTreeMap<_, _>>() {
                            tr { th { (k) } td { (v) } }
                        }
                    }
                }
            }
            section {
                h2 { "References it holds" }
                (references_table(&r.name, "targets", targets, false))
            }
            section {
                h2 { "Referrers, in every region" }
                (references_table(&r.name, "referrers", referrers, true))
            }
            (history_section(&r.name, history))
        },
    )
}

fn references_table(
    name: &str,
    param: &str,
    page: Result<&v1::ListReferencesResponse, String>,
    referrers: bool,
) -> Markup {
    html! {
        @match page {
            Err(why) => { p.problem { (why) } }
            Ok(page) if page.references.is_empty() => { p.empty { "None." } }
            Ok(page) => {
                table.references {
                    thead { tr { th { @if referrers { "Referrer" } @else { "Target" } } th { "Field" } th { "On delete" } } }
                    tbody {
                        @for reference in &page.references {
                            @let other = if referrers { &reference.referrer } else { &reference.target };
                            tr {
                                td { a href=(resource_href(other)) { (other) } }
                                td { (reference.field) }
                                td class={"policy policy-" (reference.on_delete)} { (reference.on_delete) }
                            }
                        }
                    }
                }
                @if !page.next_page_token.is_empty() {
                    a.next href={(resource_href(name)) "?" (param) "=" (query_value(&page.next_page_token))} { "Next page" }
                }
            }
        }
    }
}

/// A resource the API no longer has (NOT_FOUND: purged, or never
/// created), with what its region's history still says of the name.
pub(in crate::console) fn resource_gone(
    region: &str,
    name: &str,
    why: &str,
    history: Result<&v1::GetHistoryResponse, String>,
) -> Page {
    layout(
        region,
        name,
        html! {
            h1 { code.name { (name) } " " span.state.state-gone { "NOT FOUND" } }
            p.problem role="alert" { (why) }
            (history_section(name, history))
        },
    )
}

/// The history: newest first, each event with its revision, time, kind,
/// account, who and operation (a link); the next page; and where the kept
/// history starts when older events were compacted.
fn history_section(name: &str, history: Result<&v1::GetHistoryResponse, String>) -> Markup {
    html! {
        section #history {
            h2 { "History" }
            @match history {
                Err(why) => { p.problem { (why) } }
                Ok(page) => {
                    @if page.events.is_empty() {
                        p.empty { "No event of it on this page." }
                    } @else {
                        table.history {
                            thead { tr { th { "Revision" } th { "Time" } th { "Event" } th { "What" } th { "By" } th { "Operation" } } }
                            tbody {
                                @for event in &page.events {
                                    @let kind = enum_word(event.kind().as_str_name(), "HISTORY_EVENT_KIND_").to_lowercase();
                                    tr class={"event event-" (kind.replace('_', "-"))} {
                                        td { (event.revision) }
                                        td { (instant(event.time_ms)) }
                                        td.kind { (kind.replace('_', " ")) }
                                        td { (event.message) }
                                        td { (event.by) }
                                        td {
                                            @if !event.operation_id.is_empty() {
                                                a href=(operation_href(&event.operation_id)) { code { (event.operation_id) } }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    @if !page.next_page_token.is_empty() {
                        a.next href={(resource_href(name)) "?history=" (query_value(&page.next_page_token))} { "Older events" }
                    } @else if page.compacted_before_revision > 0 {
                        p.compacted {
                            "History before revision " (page.compacted_before_revision)
                            " was compacted: the region keeps its newest events only."
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_value_is_text_in_the_page() {
        let r = v1::Resource {
            name: "eu-west/port/p".into(),
            attributes: [("note".to_owned(), "<script>alert(1)</script>".to_owned())].into(),
            ..Default::default()
        };
        let empty = v1::ListReferencesResponse::default();
        let html = resource(
            "eu-west",
            &r,
            Ok(&empty),
            Err("<b>no</b>".into()),
            Err("<i>x</i>".into()),
        )
        .0
        .into_string();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{html}");
        assert!(html.contains("&lt;b&gt;no&lt;/b&gt;"), "{html}");
        assert!(html.contains("&lt;i&gt;x&lt;/i&gt;"), "{html}");
    }

    #[test]
    fn a_kept_history_says_where_it_starts() {
        let page = v1::GetHistoryResponse {
            events: vec![v1::HistoryEvent {
                revision: 7,
                kind: v1::HistoryEventKind::UnsetByCascade as i32,
                message: "net cleared: eu-west/network/n is being deleted".into(),
                operation_id: "0b5e5c1e-0000-4000-8000-000000000001".into(),
                ..Default::default()
            }],
            next_page_token: String::new(),
            compacted_before_revision: 5,
        };
        let html = resource_gone("eu-west", "eu-west/port/p", "not found", Ok(&page))
            .0
            .into_string();
        assert!(html.contains("unset by cascade"), "{html}");
        assert!(html.contains("History before revision 5 was compacted"), "{html}");
        assert!(
            html.contains("/operations/0b5e5c1e-0000-4000-8000-000000000001"),
            "{html}"
        );
    }
}
