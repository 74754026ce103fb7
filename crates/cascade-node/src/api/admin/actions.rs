//! An administrator's action carried out to its end, its refusal written
//! to the audit log with the status the caller gets.
//!
//! Why a task of its own for a forwarded action (`forward.rs`'s
//! `to_the_end`): a forwarder that gives up resets its call, and the server
//! drops the call's handler at its next await. The action's writer step,
//! queued already, runs all the same and refuses itself for time
//! (`crate::peers::still_awaited`), but the refusal's audit entry, written
//! after it, was lost: a ForcePurge held by a partition that then healed
//! left no entry in the owner's log.

use std::future::Future;

use cascade_core::protocol::AdminRequest;
use cascade_core::Timestamp;
use tonic::Status;
use tracing::warn;

use super::AdminApi;
use crate::api::forward::to_the_end;
use crate::audit::AuditContext;
use crate::error::Fault;
use crate::node::Node;

impl AdminApi {
    /// Carries out `action` (the node's call that runs the action's writer
    /// step) to its end, in a task of its own when another region's node
    /// forwarded it (`answer_by` Some); a refusal is audited for `audit`
    /// and `context` with the status the caller gets.
    pub(super) async fn carry_out<T>(
        &self,
        answer_by: Option<Timestamp>,
        action: impl Future<Output = Result<T, Fault>> + Send + 'static,
        audit: AdminRequest,
        context: AuditContext,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
    {
        let node = self.node.clone();
        let carried = async move {
            match action.await {
                Ok(done) => Ok(done),
                Err(fault) => Err(audited(&node, audit, context, Status::from(fault)).await),
            }
        };
        to_the_end(answer_by, carried).await
    }
}

/// A refusal of an administrator's action (`status`, what the caller
/// gets), written to `node`'s audit log (the core cuts every field of the
/// entry to its limit); a log line, one a window, when it cannot be.
pub(super) async fn audited(node: &Node, audit: AdminRequest, context: AuditContext, status: Status) -> Status {
    match node
        .audit(audit, format!("{:?}: {}", status.code(), status.message()), context)
        .await
    {
        Ok(_) => {
            node.audit_failed.reset();
        }
        Err(e) => {
            if let Some(more) = node.audit_failed.admit() {
                warn!(region = %node.region, error = %e, suppressed = more.count(), "could not write the audit log{more}");
            }
        }
    }
    status
}
