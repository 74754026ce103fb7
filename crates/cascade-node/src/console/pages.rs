//! The console's HTML, written with maud: each template is Rust checked at
//! compile time, and every value put into a page is escaped (a name or an
//! attribute holding `<script>` is shown as text, never run). The pages
//! work without script; `console.js` only swaps in what `live.rs` sends.
//! The operation page is in `pages/operation.rs`, the dry run before a
//! delete and its button in `pages/delete.rs`, a resource's page with its
//! history in `pages/resource.rs`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use cascade_core::model::Timestamp;
use maud::{html, Markup, DOCTYPE};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use super::backend::{enum_word, RunningOperations};
use super::error::ConsoleError;

pub(super) mod cluster;
mod delete;
mod operation;
mod resource;
pub(super) use delete::{delete_refused, dry_run, dry_run_refused};
pub(crate) use operation::MAX_TREE_MEMBERS;
pub(super) use operation::{live_operation, operation_page, Rate};
pub(super) use resource::{resource, resource_gone};

/// A rendered page (or a fragment of one, sent live).
pub(super) struct Page(pub Markup);

impl Page {
    pub(super) fn into_response_with(self, status: StatusCode) -> Response {
        let mut response = (status, self.0.into_string()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        response
    }
}

/// What a path segment may hold as is; everything else is %-encoded, so a
/// name or a token is one segment or value whatever it holds.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'\'')
    .add(b'+')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// A query value: a segment without `/` and `=` either.
const QUERY_VALUE: &AsciiSet = &SEGMENT.add(b'/').add(b'=').add(b';');

/// The console path of a resource (its name's slashes kept: one route
/// takes the rest of the path).
pub(super) fn resource_href(name: &str) -> String {
    format!("/resources/{}", utf8_percent_encode(name, SEGMENT))
}

/// The dry-run page of a cascade from a resource; its form posts there too.
pub(super) fn delete_href(name: &str) -> String {
    format!("{}{DELETE_SUFFIX}", resource_href(name))
}

/// What ends a resource's path to make it its dry-run page: a name has
/// exactly three segments, so a fourth is never part of one.
pub(super) const DELETE_SUFFIX: &str = "/delete";

pub(super) fn operation_href(id: &str) -> String {
    format!("/operations/{}", utf8_percent_encode(id, QUERY_VALUE))
}

pub(super) fn query_value(value: &str) -> String {
    utf8_percent_encode(value, QUERY_VALUE).to_string()
}

/// An instant of the API (unix ms) as RFC 3339 UTC; empty for none.
pub(super) fn instant(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) if ms > 0 => cascade_core::time_text::rfc3339(Timestamp(ms)),
        _ => String::new(),
    }
}

/// The frame every page shares: the region that serves it, the way
/// around, signing in and out.
pub(super) fn layout(region: &str, title: &str, body: Markup) -> Page {
    Page(html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Cascade console" }
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/console.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/operations" { "Cascade" }
                    span.served-by { "served by " code { (region) } }
                    nav {
                        a href="/operations" { "Operations" }
                        a href="/cluster" { "Cluster" }
                        form.find method="get" action="/find" {
                            input type="search" name="q" placeholder="operation id or region/kind/id"
                                aria-label="operation id or resource name" maxlength="256";
                            button type="submit" { "Open" }
                        }
                        a href="/login" { "Sign in" }
                        form.inline method="post" action="/logout" { button type="submit" { "Sign out" } }
                    }
                }
                main { (body) }
            }
        }
    })
}

pub(super) fn login(region: &str, next: &str, problem: Option<&str>) -> Page {
    layout(
        region,
        "Sign in",
        html! {
            h1 { "Sign in" }
            p {
                "The console calls this node's API as you: it sends your token with every call "
                "(as " code { "cascade --token" } " does) and shows what the node lets you read. "
                "The token is kept in a cookie of this site only, never by the node."
            }
            @if let Some(problem) = problem {
                p.problem role="alert" { (problem) }
            }
            form.login method="post" action="/login" {
                input type="hidden" name="next" value=(next);
                label for="token" { "Token (a static token or a JWT)" }
                input #token type="password" name="token" autocomplete="off" required;
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// A page that could not be made: what the API said, and what to do.
pub(super) fn failure(region: &str, error: &ConsoleError, next: &str) -> Response {
    let page = layout(
        region,
        error.title(),
        html! {
            h1 { (error.title()) }
            p.problem role="alert" { (error.to_string()) }
            @match error {
                ConsoleError::Unauthenticated(_) => {
                    p { a href={"/login?next=" (query_value(next))} { "Sign in" } " with a token this cluster accepts." }
                }
                ConsoleError::Forbidden(_) => {
                    p { "Your identity may not read this: the node's policy decided (" code { "cascade auth can-i" } " says what you may)." }
                }
                ConsoleError::Unavailable(_) => {
                    p { "The node or a region it asked did not answer in time. Reload to try again." }
                }
                ConsoleError::CrossSite(_) => {
                    p { "A change is accepted only from this console's own page: open the resource's dry run and use its button." }
                }
                _ => {}
            }
        },
    );
    page.into_response_with(error.status())
}

/// A page about `unreachable`'s data (a resource it owns) that it did not
/// give in time: says so, naming the region as the other pages name one
/// that does not answer (`.unreachable`, `data-region`).
pub(super) fn region_failure(region: &str, unreachable: &str, error: &ConsoleError, next: &str) -> Response {
    let page = layout(
        region,
        error.title(),
        html! {
            h1 { (error.title()) }
            p.unreachable role="alert" data-region=(unreachable) {
                "Region " strong { (unreachable) } " is unreachable: " (error.to_string())
                ". " a href=(next) { "Reload" } " to try again."
            }
        },
    );
    page.into_response_with(error.status())
}

pub(super) fn not_found(region: &str) -> Response {
    failure(
        region,
        &ConsoleError::NotFound("no such page of the console".into()),
        "/operations",
    )
}

/// The operations page's live part: every operation the caller may read
/// that is running or recent, with its totals, its counts per region
/// (`region_progress`), its rate, and, for an administrator, its members
/// still in flight per region and status from the deletion tables.
pub(super) fn operations_table(running: &RunningOperations, rates: &dyn Fn(&str) -> Option<f64>) -> Markup {
    html! {
        @for (region, why) in &running.unanswered {
            p.unreachable role="alert" data-region=(region) {
                "Region " strong { (region) } " did not answer: " (why)
            }
        }
        @if !running.cut_regions.is_empty() {
            p.note { "More deletions than one read holds in " (running.cut_regions.join(", ")) ": their counts are lower bounds." }
        }
        @if let Some(problem) = &running.tables_problem {
            p.note { "The deletion tables could not be read: " (problem) }
        }
        @if !running.by_operation.values().any(|op| op.shown) {
            p.empty #no-operations {
                "No operation you may read is running or started in the last hour. "
                "The list holds the operations whose root your identity may read ("
                code { "cascade auth can-i get NAME" } " says whether you may); open another by its id."
            }
        } @else {
            table.operations {
                thead { tr {
                    th { "Operation" } th { "Root" } th { "State" }
                    th { "Deleted" } th { "Unset" } th { "Pending" } th { "Blocked" } th { "Failed" }
                    th { "Rate" } th { "Per region" }
                } }
                tbody {
                    @for (id, op) in running.by_operation.iter().filter(|(_, op)| op.shown) {
                        @let progress = op.operation.as_ref().and_then(|o| o.progress).unwrap_or_default();
                        @let state = op.operation.as_ref().map(|o| enum_word(o.state().as_str_name(), "OPERATION_STATE_").to_owned()).unwrap_or_default();
                        tr data-operation=(id) {
                            td { a href=(operation_href(id)) { code { (id) } } }
                            td { @if let Some(root) = op.operation.as_ref().and_then(|o| o.root.as_ref()) {
                                a href=(resource_href(&root.name)) { (root.name) }
                            } }
                            td { span class={"state state-" (state.to_lowercase())} { (state) } }
                            td.count { (progress.deleted) } td.count { (progress.unset) }
                            td.count { (progress.pending) } td.count { (progress.blocked) }
                            td.count { (progress.failed) }
                            td.count { @match rates(id) { Some(rate) => { (format!("{rate:.0}/s")) } None => { "…" } } }
                            td {
                                @for r in op.operation.iter().flat_map(|o| &o.region_progress) {
                                    @let p = r.progress.unwrap_or_default();
                                    span.region-progress data-region-progress=(r.region) {
                                        strong { (r.region) } " "
                                        @if r.reachable {
                                            (p.deleted) "d " (p.unset) "u " (p.pending) "p "
                                            @if p.blocked > 0 { span.status-blocked { (p.blocked) " blocked " } }
                                            @if p.failed > 0 { span.status-failed { (p.failed) " failed " } }
                                        } @else {
                                            span.region-unreachable { "unreachable " }
                                        }
                                    }
                                }
                                @for (region, statuses) in &op.in_flight {
                                    span.region-flight {
                                        strong { (region) } ": "
                                        @for (status, n) in statuses {
                                            span class={"status-" (status.to_lowercase())} { (n) " " (status.to_lowercase()) } " "
                                        }
                                    }
                                }
                                @if op.stuck > 0 { span.stuck { (op.stuck) " stuck" } }
                            }
                        }
                    }
                }
            }
            @if running.more { p.note { "More operations than one page holds: the first of each region are shown; open another by its id." } }
        }
    }
}

pub(super) fn operations(region: &str, table: Markup) -> Page {
    layout(
        region,
        "Operations",
        html! {
            h1 { "Operations" }
            p.help {
                "The operations you may read that are running or started in the last hour, in every region, as "
                code { "Resources.ListOperations" } " lists them: "
                "totals, then per region deleted (d), unset (u), pending (p), blocked and failed; "
                "the rate is members finished per second over the last few updates. "
                "An administrator also sees each region's deletion table (members in flight, stuck). Updated live."
            }
            div #live data-live="/operations/live" { (table) }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_keeps_a_name_or_token_in_its_own_segment() {
        assert_eq!(resource_href("eu-west/port/a b"), "/resources/eu-west/port/a%20b");
        assert_eq!(resource_href("eu-west/port/x?y#z"), "/resources/eu-west/port/x%3Fy%23z");
        assert_eq!(query_value("a/b=c&d"), "a%2Fb%3Dc%26d");
    }
}
