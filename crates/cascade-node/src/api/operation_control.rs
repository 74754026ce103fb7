//! The wire edge of operation budgets and controls (issue 29): the typed
//! peer calls `Peer.BudgetLease` and `Peer.OperationControl` (an inherent
//! impl of the port, [`Peers`], as in `peer_client.rs`), the Resources
//! calls PauseOperation, ResumeOperation and CancelOperation, the Admin
//! call ExtendBudget, and the Peer service's side of both peer calls. The
//! flows are the domain's (`operation_control.rs`).

use std::time::Duration;

use cascade_core::auth::Verb;
use cascade_core::model::Operation;
use cascade_core::protocol::{AdminRequest, Bounds, BudgetGrant, Control};
use cascade_core::{OperationId, RefTarget, RegionId};
use cascade_proto::bounds::Bounded;
use cascade_proto::convert;
use cascade_proto::status::invalid_field;
use cascade_proto::v1;
use tonic::{Request, Response, Status};
use tracing::{info, info_span, Instrument};

use crate::api::forward::{budget_within, deadlines, forward, to_the_end, FORWARD_TIMEOUT};
use crate::api::parse_operation_id;
use crate::api::principal::{caller, vouching_region};
use crate::api::resources::ResourcesApi;
use crate::cluster::OPERATION_READ_TIMEOUT;
use crate::peers::{ControlAction, Peers, RemoteError};

impl Peers {
    /// Asks `region` (the root's region of `id`) for up to `wanted` units
    /// of the operation's budget.
    pub(crate) async fn budget_lease(
        &self,
        region: &str,
        id: OperationId,
        from: &RegionId,
        wanted: u64,
        deadline: Duration,
    ) -> Result<BudgetGrant, RemoteError> {
        let req = v1::BudgetLeaseRequest {
            operation_id: id.to_string(),
            from_region: from.to_string(),
            wanted,
        };
        let answer = self
            .call(region, "BudgetLease", deadline, |mut c| async move {
                c.budget_lease(req).await
            })
            .await?;
        Ok(BudgetGrant {
            // Never more than was asked, whatever the answer says.
            granted: answer.granted.min(wanted),
            max_deletions: answer.max_deletions,
            used: answer.used,
        })
    }

    /// Tells `region` to register, pause, resume or cancel its part of `id`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn operation_control(
        &self,
        region: &str,
        id: OperationId,
        action: ControlAction,
        root: &RefTarget,
        who: &str,
        reason: &str,
        deadline: Duration,
    ) -> Result<(), RemoteError> {
        let mut req = v1::OperationControlRequest {
            operation_id: id.to_string(),
            root: Some(convert::object_ref(root)),
            requested_by: who.to_owned(),
            reason: reason.to_owned(),
            ..Default::default()
        };
        req.action = match action {
            ControlAction::Register(bounds) => {
                req.budgeted = bounds.max_deletions.is_some();
                req.rate_per_second = bounds.rate_per_s.unwrap_or_default();
                v1::OperationControlAction::Register
            }
            ControlAction::Apply(Control::Pause) => v1::OperationControlAction::Pause,
            ControlAction::Apply(Control::Resume) => v1::OperationControlAction::Resume,
            ControlAction::Apply(Control::Cancel) => v1::OperationControlAction::Cancel,
        } as i32;
        self.call(region, "OperationControl", deadline, |mut c| async move {
            c.operation_control(req).await
        })
        .await?;
        Ok(())
    }
}

impl ResourcesApi {
    /// PauseOperation, ResumeOperation, CancelOperation: carried out by the
    /// operation's root's region (forwarded there unchanged), decided there
    /// on the root (`operation.pause`, ...), audited, then told to every
    /// other region (see `Node::control_operation`).
    pub(crate) async fn control<M: Bounded>(
        &self,
        request: Request<M>,
        control: Control,
        raw_id: String,
        reason: String,
    ) -> Result<Response<v1::Operation>, Status> {
        request.get_ref().check_bounds()?;
        // The root's read and the other regions told within this.
        let budget = budget_within(FORWARD_TIMEOUT, request.metadata());
        let (deadline, answer_by) = deadlines(&request);
        let principal = caller(&request);
        let through = vouching_region(&request);
        let id = parse_operation_id(&raw_id, "id")?;
        let root = match self.node.state().get_operation(id).map_err(crate::error::Fault::from)? {
            Some(op) => op.root,
            None => {
                let read = budget.min(OPERATION_READ_TIMEOUT);
                self.node.operation_within(id, 0, None, read).await?.operation.root
            }
        };
        if let Some((region, mut owner)) = self.route(&root.name, "id")? {
            let now = self.node.clock.now();
            let answer = match control {
                Control::Pause => {
                    let req = Request::new(v1::PauseOperationRequest { id: raw_id, reason });
                    let send = move |r| async move { owner.pause_operation(r).await };
                    forward(&region, "PauseOperation", &deadline, FORWARD_TIMEOUT, now, req, send).await?
                }
                Control::Resume => {
                    let req = Request::new(v1::ResumeOperationRequest { id: raw_id, reason });
                    let send = move |r| async move { owner.resume_operation(r).await };
                    forward(&region, "ResumeOperation", &deadline, FORWARD_TIMEOUT, now, req, send).await?
                }
                Control::Cancel => {
                    let req = Request::new(v1::CancelOperationRequest { id: raw_id, reason });
                    let send = move |r| async move { owner.cancel_operation(r).await };
                    forward(&region, "CancelOperation", &deadline, FORWARD_TIMEOUT, now, req, send).await?
                }
            };
            return Ok(Response::new(answer));
        }
        let (verb, action) = match control {
            Control::Pause => (Verb::OperationPause, "operation.pause"),
            Control::Resume => (Verb::OperationResume, "operation.resume"),
            Control::Cancel => (Verb::OperationCancel, "operation.cancel"),
        };
        let audit = self
            .audited(&principal, through.as_deref(), verb, &root.name, action)
            .await?;
        let req = AdminRequest {
            who: principal.id.clone(),
            action: control.action().to_owned(),
            target: id.to_string(),
            reason,
        };
        let span = info_span!("operation_control", region = %self.node.region, operation = %id, action);
        // Every refusal audited, one for time too (`ResourcesApi::change`).
        let (api, context) = (self.clone(), audit.clone());
        let controlled = async move {
            let control = api.node.control_operation(id, control, req, context, budget, answer_by);
            match control.instrument(span).await {
                Ok(done) => Ok(done),
                Err(fault) => Err(api.audit_refused(audit, action, &root.name, fault).await),
            }
        };
        let (op, unreachable) = to_the_end(answer_by, controlled).await?;
        info!(region = %self.node.region, operation = %id, who = %principal.id, action, unreachable = ?unreachable, "operation controlled");
        let mut answer = present_part(&op);
        answer.unreachable_regions = unreachable;
        Ok(Response::new(answer))
    }
}

/// One region's part as the control calls answer it.
pub(crate) fn present_part(op: &Operation) -> v1::Operation {
    convert::operation(op, &[], String::new())
}

/// The Peer service's `OperationControl`, decoded: what to do, to which
/// operation, with its root when it names one.
pub(crate) fn peer_control(
    req: &v1::OperationControlRequest,
) -> Result<(OperationId, ControlAction, Option<RefTarget>), Status> {
    let id = parse_operation_id(&req.operation_id, "operation_id")?;
    let root = req
        .root
        .clone()
        .map(|r| convert::ref_target(Some(r), "root"))
        .transpose()?;
    let action = match v1::OperationControlAction::try_from(req.action) {
        Ok(v1::OperationControlAction::Register) => ControlAction::Register(Bounds {
            max_deletions: req.budgeted.then_some(1),
            rate_per_s: (req.rate_per_second > 0).then_some(req.rate_per_second),
        }),
        Ok(v1::OperationControlAction::Pause) => ControlAction::Apply(Control::Pause),
        Ok(v1::OperationControlAction::Resume) => ControlAction::Apply(Control::Resume),
        Ok(v1::OperationControlAction::Cancel) => ControlAction::Apply(Control::Cancel),
        _ => return Err(invalid_field("action", format!("unknown action {}", req.action))),
    };
    Ok((id, action, root))
}
