//! The wire edge of undelete (issue 29): the Resources call Undelete, the
//! typed peer call `Peer.UndeletePart` (an inherent impl of the port,
//! [`Peers`]) and the Peer service's side of it, decoded. The flows are
//! the domain's (`undelete.rs`).

use std::time::Duration;

use cascade_core::auth::Verb;
use cascade_core::limits::MAX_UNDELETE_LISTED;
use cascade_core::protocol::UndeletePhase;
use cascade_core::{OperationId, ResourceName};
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
use crate::peers::{Peers, RemoteError};
use crate::undelete::{PartAnswer, PartAsk};

/// The whole of an Undelete (every region's rounds), at most: a region
/// that has not answered by then finishes later, driven by the reconciler.
const UNDELETE_BUDGET: Duration = Duration::from_secs(60);

impl Peers {
    /// Asks `region` for one round of its part of an undelete, within
    /// `deadline`, which the call carries as its `grpc-timeout` (the part's
    /// Lookups keep to it: `crate::undelete`).
    pub(crate) async fn undelete_part(
        &self,
        region: &str,
        ask: &PartAsk,
        deadline: Duration,
    ) -> Result<PartAnswer, RemoteError> {
        let req = v1::UndeletePartRequest {
            operation_id: ask.id.to_string(),
            undelete_of: ask.of.to_string(),
            root: Some(convert::object_ref(&ask.root)),
            phase: match ask.phase {
                UndeletePhase::Members => v1::UndeletePhase::Members,
                UndeletePhase::References => v1::UndeletePhase::References,
            } as i32,
            final_round: ask.final_round,
            dry_run: ask.dry_run,
            would_restore: ask
                .would_restore
                .iter()
                .take(MAX_UNDELETE_LISTED)
                .map(convert::object_ref)
                .collect(),
            requested_by: ask.requested_by.clone(),
        };
        let req = crate::api::forward::with_timeout(req, deadline);
        let answer = self
            .call(region, "UndeletePart", deadline, |mut c| async move {
                c.undelete_part(req).await
            })
            .await?;
        let bad = |e: Status| RemoteError::BadAnswer {
            region: region.to_owned(),
            rpc: "UndeletePart",
            message: e.message().to_owned(),
        };
        let mut would_restore = Vec::new();
        for t in answer.would_restore.into_iter().take(MAX_UNDELETE_LISTED) {
            would_restore.push(convert::ref_target(Some(t), "would_restore").map_err(bad)?);
        }
        let planned = convert::operation_page_from(v1::Operation {
            id: ask.id.to_string(),
            root: Some(convert::object_ref(&ask.root)),
            state: v1::OperationState::Running as i32,
            outcomes: answer.planned.into_iter().take(MAX_UNDELETE_LISTED).collect(),
            ..Default::default()
        })
        .map_err(bad)?
        .outcomes;
        Ok(PartAnswer {
            restored: answer.restored,
            not_restored: answer.not_restored,
            waiting: answer.waiting,
            has_part: answer.has_part,
            would_restore,
            planned,
        })
    }
}

/// The Peer service's `UndeletePart`, decoded.
pub(crate) fn peer_ask(req: &v1::UndeletePartRequest) -> Result<PartAsk, Status> {
    req.check_bounds()?;
    let phase = match v1::UndeletePhase::try_from(req.phase) {
        Ok(v1::UndeletePhase::Members) => UndeletePhase::Members,
        Ok(v1::UndeletePhase::References) => UndeletePhase::References,
        _ => return Err(invalid_field("phase", format!("unknown phase {}", req.phase))),
    };
    let mut would_restore = std::collections::BTreeSet::new();
    for (i, t) in req.would_restore.iter().enumerate() {
        would_restore.insert(convert::ref_target(Some(t.clone()), &format!("would_restore[{i}]"))?);
    }
    Ok(PartAsk {
        id: parse_operation_id(&req.operation_id, "operation_id")?,
        of: parse_operation_id(&req.undelete_of, "undelete_of")?,
        root: convert::ref_target(req.root.clone(), "root")?,
        phase,
        final_round: req.final_round,
        dry_run: req.dry_run,
        would_restore,
        requested_by: req.requested_by.clone(),
    })
}

/// A region's round as the Peer service answers it.
pub(crate) fn peer_answer(a: &PartAnswer) -> v1::UndeletePartResponse {
    v1::UndeletePartResponse {
        restored: a.restored,
        not_restored: a.not_restored,
        waiting: a.waiting,
        has_part: a.has_part,
        would_restore: a.would_restore.iter().map(convert::object_ref).collect(),
        planned: a.planned.iter().map(convert::outcome).collect(),
    }
}

impl ResourcesApi {
    /// Undelete: carried out by the deletion's root's region (forwarded
    /// there unchanged), decided there on the root (verb `undelete`),
    /// audited, then driven in every region (see `Node::undelete`).
    pub(crate) async fn undelete_call(
        &self,
        request: Request<v1::UndeleteRequest>,
    ) -> Result<Response<v1::UndeleteResponse>, Status> {
        request.get_ref().check_bounds()?;
        let deadline = budget_within(UNDELETE_BUDGET.max(FORWARD_TIMEOUT), request.metadata());
        let (client_deadline, answer_by) = deadlines(&request);
        let principal = caller(&request);
        let through = vouching_region(&request);
        let req = request.get_ref().clone();
        // The root's region carries it out: by the name's region, or the
        // operation's root (read here, or from the regions that hold it).
        let (id, name, root_name, field) = if !req.operation_id.is_empty() {
            let id = parse_operation_id(&req.operation_id, "operation_id")?;
            (Some(id), None, self.root_of(id, deadline).await?, "operation_id")
        } else if !req.name.is_empty() {
            let name = ResourceName::parse(&req.name).map_err(|e| invalid_field("name", e))?;
            (None, Some(name.clone()), name, "name")
        } else {
            return Err(invalid_field(
                "operation_id",
                "name an operation (operation_id) or its root (name)",
            ));
        };
        if let Some((region, mut owner)) = self.route(&root_name, field)? {
            // The owner drives it within the whole undelete's budget.
            let (bound, now) = (UNDELETE_BUDGET.max(FORWARD_TIMEOUT), self.node.clock.now());
            let send = move |r| async move { owner.undelete(r).await };
            let (within, request) = (&client_deadline, Request::new(req));
            let answer = forward(&region, "Undelete", within, bound, now, request, send).await?;
            return Ok(Response::new(answer));
        }
        let of = self.node.deletion_to_undelete(id, name.as_ref())?;
        let audit = self
            .audited(
                &principal,
                through.as_deref(),
                Verb::Undelete,
                &of.root.name,
                "undelete",
            )
            .await?;
        let span = info_span!("undelete", region = %self.node.region, undelete_of = %of.id, dry_run = req.dry_run);
        let root = of.root.name.clone();
        // Every refusal audited, one for time too (`ResourcesApi::change`).
        let (api, context, who) = (self.clone(), audit.clone(), principal.id.clone());
        let undeleted = async move {
            let undelete = api.node.undelete(of, req.dry_run, who, context, deadline, answer_by);
            match undelete.instrument(span).await {
                Ok(done) => Ok(done),
                Err(fault) => Err(api.audit_refused(audit, "undelete", &root, fault).await),
            }
        };
        let done = to_the_end(answer_by, undeleted).await?;
        info!(region = %self.node.region, undelete_of = %done.of, who = %principal.id, dry_run = req.dry_run,
            unreachable = ?done.unreachable, "undelete answered");
        let mut operation = done
            .operation
            .as_ref()
            .map(|op| convert::operation(op, &[], String::new()));
        if let Some(op) = operation.as_mut() {
            op.unreachable_regions = done.unreachable.clone();
        }
        Ok(Response::new(v1::UndeleteResponse {
            operation,
            planned: done.planned.iter().map(convert::outcome).collect(),
            planned_more: done.planned_more,
            unreachable_regions: done.unreachable,
            undelete_of: done.of.to_string(),
        }))
    }

    /// The root of operation `id`: from this region's part, else from the
    /// regions that hold one.
    async fn root_of(&self, id: OperationId, deadline: Duration) -> Result<ResourceName, Status> {
        if let Some(op) = self.node.state().get_operation(id).map_err(crate::error::Fault::from)? {
            return Ok(op.root.name);
        }
        let read = deadline.min(OPERATION_READ_TIMEOUT);
        Ok(self.node.operation_within(id, 0, None, read).await?.operation.root.name)
    }
}
