//! What every handler of the console shares, and the checks of what a
//! browser puts in a path or a query before any API call is made.

use std::sync::Arc;

use cascade_core::limits::{quote, MAX_LIST_PAGE_TOKEN_BYTES, MAX_PLAN_TOKEN_BYTES};
use cascade_core::{OperationId, ResourceName};
use tokio::sync::{watch, Semaphore};

use super::backend::Backend;
use super::error::ConsoleError;

/// What every handler shares.
pub(super) struct Console {
    pub backend: Backend,
    pub region: String,
    /// Served over HTTPS: the cookie is `Secure`.
    pub secure: bool,
    /// Turns true when the node stops: live streams end.
    pub stopping: watch::Receiver<bool>,
    pub live_streams: Arc<Semaphore>,
}

/// An operation id from a path: a UUID (anything else is refused here,
/// quoted by its prefix, before the API is asked).
pub(super) fn operation_id(id: &str) -> Result<String, ConsoleError> {
    OperationId::parse(id)
        .map(|id| id.to_string())
        .map_err(|e| ConsoleError::BadRequest(e.to_string()))
}

pub(super) fn resource_name(name: &str) -> Result<String, ConsoleError> {
    ResourceName::parse(name)
        .map(|n| n.to_string())
        .map_err(|e| ConsoleError::BadRequest(e.to_string()))
}

/// A page token from a query: bounded, else refused.
pub(super) fn page_token(token: &str) -> Result<&str, ConsoleError> {
    if token.len() > MAX_LIST_PAGE_TOKEN_BYTES {
        return Err(ConsoleError::BadRequest(format!(
            "page token {} is longer than {MAX_LIST_PAGE_TOKEN_BYTES} bytes",
            quote(token)
        )));
    }
    Ok(token)
}

/// A plan token from the delete form: present (a delete from this
/// console is always bound to its dry run) and bounded as the API bounds
/// `expect_plan`.
pub(super) fn plan_token(token: &str) -> Result<&str, ConsoleError> {
    if token.is_empty() {
        return Err(ConsoleError::BadRequest(
            "the delete names no plan: run the dry run, then press its button".into(),
        ));
    }
    if token.len() > MAX_PLAN_TOKEN_BYTES {
        return Err(ConsoleError::BadRequest(format!(
            "plan token {} is longer than {MAX_PLAN_TOKEN_BYTES} bytes",
            quote(token)
        )));
    }
    Ok(token)
}
