//! The cluster page's handler: the regions and the audit log read at once,
//! each within the call budget, so the page answers in about that long
//! even while a region does not answer.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use cascade_core::limits::quote;
use serde::Deserialize;

use super::backend::cluster::AuditFilter;
use super::context::{page_token, Console};
use super::error::ConsoleError;
use super::pages;
use super::session::Caller;

/// The longest filter value taken from a query (a resource name's bound);
/// a longer one is refused before any call.
const MAX_FILTER_BYTES: usize = 512;

#[derive(Debug, Deserialize)]
pub(super) struct ClusterQuery {
    #[serde(default)]
    region: String,
    #[serde(default)]
    principal: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    resource: String,
    #[serde(default)]
    page: String,
}

impl ClusterQuery {
    fn filter(self) -> Result<AuditFilter, ConsoleError> {
        for (what, value) in [
            ("region", &self.region),
            ("principal", &self.principal),
            ("action", &self.action),
            ("resource", &self.resource),
        ] {
            if value.len() > MAX_FILTER_BYTES {
                return Err(ConsoleError::BadRequest(format!(
                    "the {what} filter {} is longer than {MAX_FILTER_BYTES} bytes",
                    quote(value)
                )));
            }
        }
        let page_token = page_token(&self.page)?.to_owned();
        Ok(AuditFilter {
            region: self.region.trim().to_owned(),
            principal: self.principal.trim().to_owned(),
            action: self.action.trim().to_owned(),
            resource: self.resource.trim().to_owned(),
            page_token,
        })
    }
}

pub(super) async fn cluster_page(
    State(console): State<Arc<Console>>,
    caller: Caller,
    Query(query): Query<ClusterQuery>,
) -> Response {
    let filter = match query.filter() {
        Ok(filter) => filter,
        Err(e) => return pages::failure(&console.region, &e, "/cluster"),
    };
    let (status, audit) = futures::join!(
        console.backend.cluster_status(&caller),
        console.backend.audit(&caller, &filter)
    );
    // Not signed in, or not allowed to read the cluster at all: the
    // failure page (it offers to sign in). A refused or failed audit read
    // alone leaves the regions shown.
    if let Err(e @ (ConsoleError::Unauthenticated(_) | ConsoleError::Forbidden(_))) = &status {
        return pages::failure(&console.region, e, "/cluster");
    }
    let status = status.as_ref().map_err(ToString::to_string);
    let audit = audit.as_ref().map_err(ToString::to_string);
    pages::cluster::cluster_page(&console.region, status, audit, &filter).into_response_with(StatusCode::OK)
}
