//! `Resources.ListOperations`: running and recent operations the caller
//! may read, each as GetOperation answers it (no outcomes).
//!
//! One region's page: the operations whose root it owns (the origin's
//! record, `Node::origin_operations`), each assembled from every region's
//! part as GetOperation assembles it, and kept when the policy lets the
//! caller `get` its root (GetOperation's decision) and it is in the asked
//! state. Another region's page is its node's answer (forwarded with the
//! caller vouched for, so that node decides). Every region: each open
//! region asked at once within one deadline; the pages follow each other
//! in region order; the token carries each region's position
//! ([`ListPageToken`]), and a region that did not answer is given up and
//! named on every later page, as a listing of every region does.

use std::time::Duration;

use cascade_core::auth::{Principal, Verb};
use cascade_core::limits::{cut_stored, quote, MAX_LIST_REGIONS};
use cascade_core::listing::{RegionPosition, MAX_GIVEN_UP_REASON_BYTES};
use cascade_core::{OperationId, ResourceName};
use cascade_proto::page_token::ListPageToken;
use cascade_proto::status::invalid_field;
use cascade_proto::v1;
use tonic::{Request, Status};

use crate::api::forward::{budget_within, deadline_of};
use crate::api::listing::positions_in_token;
use crate::api::listing::LIST_BUDGET;
use crate::api::parse_operation_id;
use crate::api::principal::caller;
use crate::api::resources::{present_operation, ResourcesApi};

/// Operations per region per page when the request names no size.
pub(crate) const DEFAULT_OPERATIONS_PAGE: usize = 20;

/// Operations per region per page at most (each is assembled from every
/// region's part, so a page costs this many part reads per region).
pub(crate) const MAX_OPERATIONS_PAGE: usize = 100;

/// Whether an operation in `state` is one the request asks for.
fn in_state(asked: v1::OperationState, state: v1::OperationState) -> bool {
    match asked {
        v1::OperationState::Unspecified => true,
        // Neither is finished.
        v1::OperationState::Running => matches!(state, v1::OperationState::Running | v1::OperationState::Paused),
        asked => asked == state,
    }
}

/// The token's fingerprint of what selects: the state and the window.
fn selectors_of(req: &v1::ListOperationsRequest) -> u64 {
    let state = req.state.to_string();
    let window = req.started_within_seconds.to_string();
    ListPageToken::fingerprint(&["operations", &state, &window])
}

impl ResourcesApi {
    /// `Resources.ListOperations`: this region, another (forwarded), or every region.
    pub(crate) async fn list_operations_call(
        &self,
        request: Request<v1::ListOperationsRequest>,
    ) -> Result<v1::ListOperationsResponse, Status> {
        let budget = budget_within(LIST_BUDGET, request.metadata());
        let deadline = deadline_of(request.metadata());
        let principal = caller(&request);
        let req = request.into_inner();
        let asked = v1::OperationState::try_from(req.state).map_err(|_| invalid_field("state", "unknown state"))?;
        if req.region.is_empty() {
            return self.every_region(&principal, req, asked, budget).await;
        }
        if req.region != self.node.region.as_str() {
            if !self.node.peers.knows(&req.region) {
                return Err(invalid_field(
                    "region",
                    format!("{} is not a region of this cluster", quote(&req.region)),
                ));
            }
            let region = req.region.clone();
            let mut owner = self.node.peers.resources(&region).map_err(crate::api::refused)?;
            let send = move |r| async move { owner.list_operations(r).await };
            return self.to_owner(&region, "ListOperations", &deadline, req, send).await;
        }
        let (operations, next) = self.own_page(&principal, &req, asked, budget).await?;
        Ok(v1::ListOperationsResponse {
            operations,
            next_page_token: next.unwrap_or_default(),
            unreachable: Vec::new(),
        })
    }

    /// This region's page: its operations after the token, assembled, those
    /// the caller may read in the asked state; and where the next starts.
    async fn own_page(
        &self,
        principal: &Principal,
        req: &v1::ListOperationsRequest,
        asked: v1::OperationState,
        budget: Duration,
    ) -> Result<(Vec<v1::Operation>, Option<String>), Status> {
        let after = if req.page_token.is_empty() {
            None
        } else {
            Some(parse_operation_id(&req.page_token, "page_token")?)
        };
        let from_ms = (req.started_within_seconds > 0).then(|| {
            self.node
                .clock
                .now()
                .0
                .saturating_sub(u64::from(req.started_within_seconds) * 1000)
        });
        let size = match req.page_size {
            0 => DEFAULT_OPERATIONS_PAGE,
            n => (n as usize).min(MAX_OPERATIONS_PAGE),
        };
        let page = self.node.origin_operations(after, from_ms, size)?;
        // Every operation's parts at once, each read within the budget
        // less a margin for the answer.
        let read_timeout = budget.mul_f32(0.7);
        let views = futures::future::join_all(
            page.ids
                .iter()
                .map(|id| self.node.operation_within(*id, 0, None, read_timeout)),
        )
        .await;
        let page_bytes = self.node.limits.page_bytes();
        let mut operations = Vec::with_capacity(views.len());
        for view in views {
            let view = view?;
            let root: &ResourceName = &view.operation.root.name;
            match self.authorize_operation_read(principal, Verb::Get, Some(root)) {
                Ok(()) => {}
                // Left out, as GetOperation would refuse it.
                Err(status) if status.code() == tonic::Code::PermissionDenied => continue,
                Err(status) => return Err(status),
            }
            let operation = present_operation(&view, page_bytes);
            if in_state(asked, operation.state()) {
                operations.push(operation);
            }
        }
        Ok((operations, page.next.map(|id: OperationId| id.to_string())))
    }

    async fn every_region(
        &self,
        principal: &Principal,
        req: v1::ListOperationsRequest,
        asked: v1::OperationState,
        budget: Duration,
    ) -> Result<v1::ListOperationsResponse, Status> {
        let own = self.node.region.to_string();
        let mut regions: Vec<String> = self.node.peers.regions().map(str::to_owned).collect();
        regions.push(own.clone());
        regions.sort();
        if regions.len() > MAX_LIST_REGIONS {
            return Err(Status::failed_precondition(format!(
                "ListOperations lists at most {MAX_LIST_REGIONS} regions at once and this cluster has {}: list them one at a time (region)",
                regions.len()
            )));
        }
        let selectors = selectors_of(&req);
        let mut positions = positions_in_token(&req.page_token, selectors, "filters (state, started_within_seconds)")?;
        for (region, position) in &positions {
            if !regions.contains(region) {
                return Err(invalid_field(
                    "page_token",
                    format!("names region {}, which is not a region of this cluster", quote(region)),
                ));
            }
            if let RegionPosition::After(after) = position {
                parse_operation_id(after, "page_token")?;
            }
        }
        // A region that joined the cluster since the token was issued
        // is listed from its start.
        for region in &regions {
            positions.entry(region.clone()).or_insert(RegionPosition::Start);
        }
        let open: Vec<(String, String)> = positions
            .iter()
            .filter(|(_, p)| p.is_open())
            .map(|(r, p)| (r.clone(), p.token().to_owned()))
            .collect();
        let asks = open.into_iter().map(|(region, token)| {
            let mut one = req.clone();
            one.region = region.clone();
            one.page_token = token;
            let own = own.clone();
            async move {
                let answer = if region == own {
                    match tokio::time::timeout(budget, self.own_page(principal, &one, asked, budget)).await {
                        Ok(page) => page.map_err(Ok),
                        Err(_) => Err(Err(format!("did not read its own page within {budget:?}"))),
                    }
                } else {
                    self.remote_operations(&region, one, budget).await.map_err(Err)
                };
                (region, answer)
            }
        });
        let mut operations = Vec::new();
        for (region, answer) in futures::future::join_all(asks).await {
            let position = match answer {
                Ok((mut page, next)) => {
                    operations.append(&mut page);
                    next.map_or(RegionPosition::Done, RegionPosition::After)
                }
                // This region's own refusal (a bad token) is the caller's error.
                Err(Ok(status)) => return Err(status),
                Err(Err(why)) => RegionPosition::GaveUp(cut_stored(&why, MAX_GIVEN_UP_REASON_BYTES)),
            };
            positions.insert(region, position);
        }
        // Region order, then the order they started (each region's page is).
        let (unreachable, next_page_token) = self.end_of_page(selectors, positions);
        Ok(v1::ListOperationsResponse {
            operations,
            next_page_token,
            unreachable,
        })
    }

    /// Another region's page, through its node's ListOperations (which
    /// decides for the caller this node vouches for), within `budget`.
    async fn remote_operations(
        &self,
        region: &str,
        req: v1::ListOperationsRequest,
        budget: Duration,
    ) -> Result<(Vec<v1::Operation>, Option<String>), String> {
        let mut owner = self
            .node
            .peers
            .resources(region)
            .map_err(|e| format!("could not be asked: {e}"))?;
        let after = req.page_token.clone();
        let size = match req.page_size {
            0 => DEFAULT_OPERATIONS_PAGE,
            n => (n as usize).min(MAX_OPERATIONS_PAGE),
        };
        let mut call = Request::new(req);
        call.set_timeout(budget);
        match tokio::time::timeout(budget, owner.list_operations(call)).await {
            Err(_) => Err(format!("did not answer within {budget:?}")),
            Ok(Err(status)) if matches!(status.code(), tonic::Code::Cancelled | tonic::Code::DeadlineExceeded) => {
                Err(format!("did not answer within {budget:?}"))
            }
            Ok(Err(status)) => Err(format!(
                "answered {:?}: {}",
                status.code(),
                cut_stored(status.message(), 200)
            )),
            Ok(Ok(answer)) => {
                let page = answer.into_inner();
                // A peer's answer: at most a page, and a token that moves on
                // (else a walk of every region could repeat or never end).
                if page.operations.len() > size {
                    return Err(format!(
                        "answered {} operations for a page of {size}",
                        page.operations.len()
                    ));
                }
                let next = (!page.next_page_token.is_empty()).then_some(page.next_page_token);
                if let Some(n) = &next {
                    let moved = OperationId::parse(n).is_ok_and(|n| after.is_empty() || n.to_string() > after);
                    if !moved {
                        return Err(format!("answered a page token that does not move on ({})", quote(n)));
                    }
                }
                Ok((page.operations, next))
            }
        }
    }
}
