//! Deleting from the console: the dry run of a cascade from a resource
//! (`GET /resources/NAME/delete`) and its button (`POST` there), each a
//! `Resources.Delete` call as the caller.
//!
//! **Who sees the button is the API's answer, not the console's guess.**
//! The node authorizes a dry run with the verb of the delete itself
//! (`cascade` on the root, `api/resources.rs`), and answers in the plan's
//! `denied` every member the caller may not change, which the delete's
//! closure check refuses (`cluster.rs`, `check_closure`). So a dry run
//! that answers, with nothing denied and a token, is the API saying the
//! delete would be allowed: no second call (`Admin.CanI` would decide the
//! root's verb only, not the closure's members). Hiding the button is
//! only a courtesy: whatever is posted, the API decides the delete again.
//!
//! **The delete is bound to the plan the page showed**: the form carries
//! the dry run's token as `expect_plan`, so a closure that changed since
//! is refused ABORTED, PLAN_CHANGED, and the page lists what changed.
//!
//! **Forgery.** The token cookie is SameSite=Strict, so a form posted from
//! another site carries no token and the API refuses it where
//! authentication is required. Where it is not (`[auth] mode = "none"`),
//! the console's call would be allowed whoever sent the form, so the POST
//! must also carry an `Origin` that is this console's own: browsers send
//! it with every POST and a page of another site cannot set it. The dry
//! run's page is served with `Referrer-Policy: same-origin` (the console's
//! other pages say `no-referrer`), under which the browser sends its real
//! origin with the form rather than `null`. A form token was not chosen:
//! it needs a secret or server state per form, and guards nothing the
//! `Origin` check and the cookie's SameSite do not.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use cascade_core::limits::quote;
use serde::Deserialize;

use super::context::{plan_token, resource_name, Console};
use super::error::ConsoleError;
use super::pages::{self, DELETE_SUFFIX};
use super::session::Caller;

/// The dry run's page: the plan as the caller's dry run answers it, and
/// the button when that answer says the delete would be allowed.
pub(super) async fn page(console: &Console, caller: &Caller, name: &str) -> Response {
    let name = match resource_name(name) {
        Ok(name) => name,
        Err(e) => return pages::failure(&console.region, &e, "/operations"),
    };
    match console.backend.dry_run(caller, &name).await {
        Ok(answer) => {
            let mut response = pages::dry_run(&console.region, &name, &answer).into_response_with(StatusCode::OK);
            // The form's POST then carries this console's origin (see above).
            response
                .headers_mut()
                .insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
            response
        }
        Err(e) => pages::dry_run_refused(&console.region, &name, &e),
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct DeleteForm {
    /// The dry run's plan token.
    #[serde(default)]
    plan: String,
}

/// The button: `Delete{cascade, expect_plan}` as the caller; the operation
/// page when it started, else the API's refusal with what it names.
pub(super) async fn submit(
    State(console): State<Arc<Console>>,
    caller: Caller,
    headers: HeaderMap,
    uri: Uri,
    Path(path): Path<String>,
    form: Result<Form<DeleteForm>, FormRejection>,
) -> Response {
    let Some(name) = path.strip_suffix(DELETE_SUFFIX) else {
        return pages::not_found(&console.region);
    };
    let checked = from_own_page(&headers, &uri, console.secure)
        .and_then(|()| resource_name(name))
        .and_then(|name| {
            let Form(form) = form.map_err(|e| ConsoleError::BadRequest(e.body_text()))?;
            Ok((name, plan_token(&form.plan)?.to_owned()))
        });
    let (name, plan) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            let back = resource_name(name).map_or_else(|_| "/operations".to_owned(), |n| pages::delete_href(&n));
            return pages::failure(&console.region, &e, &back);
        }
    };
    match console.backend.delete_bound(&caller, &name, &plan).await {
        // Started, or already started by an earlier press: its page.
        Ok(answer) => match answer.operation {
            Some(op) => Redirect::to(&pages::operation_href(&op.id)).into_response(),
            None => pages::failure(
                &console.region,
                &ConsoleError::NotFound(format!("{}: nothing to delete", quote(&name))),
                &pages::resource_href(&name),
            ),
        },
        Err(refusal) => pages::delete_refused(&console.region, &name, &refusal),
    }
}

/// Whether a change comes from a page of this console: its `Origin` is
/// this console's own, `http(s)://` and the host the request was sent to
/// (`Host`, or the authority of an HTTP/2 request).
fn from_own_page(headers: &HeaderMap, uri: &Uri, secure: bool) -> Result<(), ConsoleError> {
    let scheme = if secure { "https" } else { "http" };
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()));
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    match (origin, host) {
        (Some(origin), Some(host)) if origin.eq_ignore_ascii_case(&format!("{scheme}://{host}")) => Ok(()),
        (origin, _) => Err(ConsoleError::CrossSite(format!(
            "refused: this delete was not sent from a page of this console (its Origin is {})",
            origin.map_or_else(|| "missing".to_owned(), quote)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(name.clone(), HeaderValue::from_str(value).expect("a header value"));
        }
        headers
    }

    #[test]
    fn a_delete_is_taken_only_from_this_consoles_own_origin() {
        let path: Uri = "/resources/eu-west/network/n/delete".parse().expect("a path");
        let own = headers(&[
            (header::HOST, "127.0.0.1:8080"),
            (header::ORIGIN, "http://127.0.0.1:8080"),
        ]);
        assert!(from_own_page(&own, &path, false).is_ok());
        // Over HTTPS the origin says so; HTTP/2 names the host in the URI.
        let h2: Uri = "https://127.0.0.1:8443/resources/eu-west/network/n/delete"
            .parse()
            .expect("a URI");
        let own_h2 = headers(&[(header::ORIGIN, "https://127.0.0.1:8443")]);
        assert!(from_own_page(&own_h2, &h2, true).is_ok());
        for refused in [
            headers(&[
                (header::HOST, "127.0.0.1:8080"),
                (header::ORIGIN, "https://evil.example"),
            ]),
            headers(&[(header::HOST, "127.0.0.1:8080"), (header::ORIGIN, "null")]),
            headers(&[(header::HOST, "127.0.0.1:8080")]),
            headers(&[
                (header::HOST, "127.0.0.1:8080"),
                (header::ORIGIN, "https://127.0.0.1:8080"),
            ]),
        ] {
            let e = from_own_page(&refused, &path, false).expect_err("another origin");
            assert_eq!(e.status(), StatusCode::FORBIDDEN, "{e}");
        }
    }
}
