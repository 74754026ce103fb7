//! `cascade.v1.Resources`, the client API: an adapter around [`Node`].
//!
//! Each call decodes its request, forwards it unchanged to the owner when
//! it names another region's resource (so the owner answers, whichever node
//! was asked; within the client's deadline, and a change is refused there
//! once its forwarder gave up: `forward.rs`'s `forward`), or calls the
//! [`Node`] method that does the work, and encodes the answer. List and
//! ListReferences are in `listing.rs` (a listing of every region fans out
//! and merges). ExplainDeletion has one deadline (2 s, or less as the
//! client's own leaves), which a forward carries to the owner. Watch
//! streams the outbox (`stream.rs`: ended with OUT_OF_RANGE when
//! compaction overtakes it); WatchOperation re-reads the operation
//! whenever one of its events commits (and polls other regions), so it
//! replays nothing and compaction cannot make it skip a change.
//! PauseOperation, ResumeOperation and CancelOperation are in
//! `operation_control.rs` (they reach the root's region and every other);
//! ListOperations in `list_operations.rs`.
//!
//! Size: one file because the Resources service is one trait impl; what
//! grows (listings, operation controls) lives in its own module, and the
//! methods here are the adapters that delegate to it.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use cascade_core::auth::{Principal, Target, Verb};
use cascade_core::limits::quote;
use cascade_core::operation_view::{OperationView, OutcomesCursor};
use cascade_core::protocol::{AddLien, Control, DeleteOutcome, ResourceSpec};
use cascade_core::{CoreError, ResourceName, Timestamp};
use cascade_proto::bounds::{fit_page, Bounded};
use cascade_proto::convert;
use cascade_proto::page_token::OutcomesPageToken;
use cascade_proto::status::invalid_field;
use cascade_proto::v1::resources_client::ResourcesClient;
use cascade_proto::v1::{self, resources_server::Resources};
use futures::Stream;
use tokio::sync::{broadcast, mpsc};
use tonic::{Request, Response, Status};
use tracing::{info_span, Instrument};

use crate::admin::Refusal;
use crate::api::forward::{budget_within, deadline_of, deadlines, forward, to_the_end, FORWARD_TIMEOUT};
use crate::api::principal::{caller, vouching_region};
use crate::api::stream::{events_only, outbox_stream};
use crate::api::{parse_name, parse_operation_id, refused};
use crate::audit::AuditContext;
use crate::cluster::OPERATION_READ_TIMEOUT;
use crate::codec::EventHead;
use crate::error::{Denied, Fault};
use crate::explain::{Explanation, EXPLAIN_BUDGET};
use crate::peers::Deadline;

/// The whole cross-region part of a dry run (every round of `Peer.Plan`):
/// a region that has not answered by then is listed as unreachable.
pub(crate) const DRY_RUN_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);
use crate::node::{Node, ResourceView};
use crate::outbox::Watcher;

/// The client API over one node.
#[derive(Clone)]
pub(crate) struct ResourcesApi {
    pub(crate) node: Arc<Node>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The wire form of a resource as a reader sees it.
pub(crate) fn present(view: &ResourceView) -> v1::Resource {
    convert::resource(&view.resource, view.record.as_ref(), &view.dangling)
}

/// The wire form of an explanation.
fn present_explanation(e: &Explanation) -> v1::DeletionExplanation {
    v1::DeletionExplanation {
        operation_id: e.operation.to_string(),
        root: e.root.as_ref().map(convert::object_ref),
        deletions: e
            .deletions
            .iter()
            .map(|d| v1::ExplainedDeletion {
                resource: Some(convert::resource(
                    &d.part.resource,
                    Some(&d.part.record),
                    &BTreeSet::new(),
                )),
                parent: d.parent.as_ref().map(|(p, _)| p.to_string()).unwrap_or_default(),
                field: d.parent.as_ref().map(|(_, f)| f.clone()).unwrap_or_default(),
                reasons: d.reasons.clone(),
                stuck: d.stuck,
            })
            .collect(),
        unreachable_regions: e.unreachable.keys().cloned().collect(),
        stuck: e.deletions.iter().any(|d| d.stuck),
        truncated: e.truncated,
        unreachable: e
            .unreachable
            .iter()
            .map(|(region, u)| v1::UnreachableRegion {
                region: region.clone(),
                last_contact_ms: u.last_contact.map_or(0, |t| i64::try_from(t.0).unwrap_or(i64::MAX)),
                reason: u.reason.clone(),
            })
            .collect(),
        time_ms: i64::try_from(e.made_at.0).unwrap_or(i64::MAX),
    }
}

/// The wire form of an operation, with its cursor as an opaque page token;
/// its outcomes end early when they would take more than `page_bytes`,
/// with a token after the last one kept.
pub(crate) fn present_operation(view: &OperationView, page_bytes: usize) -> v1::Operation {
    let token = view
        .next
        .as_ref()
        .map(|c| {
            OutcomesPageToken {
                region: c.region.clone(),
                inner: c.after.as_ref().map(ResourceName::to_string).unwrap_or_default(),
            }
            .encode()
        })
        .unwrap_or_default();
    let mut operation = convert::operation_view(view, token);
    if fit_page(&mut operation.outcomes, page_bytes) {
        if let Some(last) = operation.outcomes.last() {
            operation.next_outcomes_page_token = OutcomesPageToken {
                region: last.region.clone(),
                inner: last.resource.as_ref().map(|r| r.name.clone()).unwrap_or_default(),
            }
            .encode();
        }
    }
    operation
}

/// An outcomes page token as the core's cursor (INVALID_ARGUMENT on
/// `outcomes_page_token` for one that does not decode).
fn outcomes_cursor(token: &str) -> Result<Option<OutcomesCursor>, Status> {
    let malformed = |why: String| invalid_field("outcomes_page_token", why);
    let Some(t) = OutcomesPageToken::decode(token).map_err(|e| malformed(e.to_string()))? else {
        return Ok(None);
    };
    let after = if t.inner.is_empty() {
        None
    } else {
        // The part's own token: the last outcome's resource name.
        Some(parse_name(&t.inner, "outcomes_page_token")?)
    };
    Ok(Some(OutcomesCursor {
        region: t.region,
        after,
    }))
}

impl ResourcesApi {
    /// Forwards `message` to its owner `region` (`send` makes the call
    /// `rpc`) within what is left of the client's `deadline` and at most
    /// [`FORWARD_TIMEOUT`]: [`forward`] says what the owner is told and
    /// what the client gets when it does not answer in time.
    pub(crate) async fn to_owner<M, T, Fut>(
        &self,
        region: &str,
        rpc: &'static str,
        deadline: &Deadline,
        message: M,
        send: impl FnOnce(Request<M>) -> Fut,
    ) -> Result<T, Status>
    where
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let now = self.node.clock.now();
        Ok(forward(region, rpc, deadline, FORWARD_TIMEOUT, now, Request::new(message), send).await?)
    }

    /// None for a name of this region; the owner's client for a peer's;
    /// INVALID_ARGUMENT naming `field` for a region outside the cluster.
    pub(crate) fn route(
        &self,
        name: &ResourceName,
        field: &str,
    ) -> Result<Option<(String, ResourcesClient<crate::api::peer_client::PeerChannel>)>, Status> {
        let Some(region) = self.node.owner_region(name, field).map_err(refused)? else {
            return Ok(None);
        };
        let owner = self.node.peers.resources(region).map_err(refused)?;
        Ok(Some((region.to_owned(), owner)))
    }

    /// May `principal` do `verb` to `target` under this region's policy?
    /// Asked where this node is the owner (a call forwarded to another
    /// region is decided there) and before anything changes:
    /// PERMISSION_DENIED naming the verb and the member otherwise.
    pub(crate) fn authorize(&self, principal: &Principal, verb: Verb, target: Target<'_>) -> Result<(), Status> {
        self.node.authorize(principal, verb, target)?;
        Ok(())
    }

    /// `get` on what an operation read shows: its root, or this region
    /// when the read names none.
    pub(crate) fn authorize_operation_read(
        &self,
        principal: &Principal,
        verb: Verb,
        root: Option<&ResourceName>,
    ) -> Result<(), Status> {
        match root {
            Some(root) => self.authorize(principal, verb, Target::Resource(root)),
            None => self.authorize(
                principal,
                verb,
                Target::Region {
                    region: &self.node.region,
                    kind: None,
                },
            ),
        }
    }

    /// Decodes a spec, naming a bad target uid as the core names targets
    /// (`refs.network.uid`, `refs.ports[0].uid`).
    fn decode_spec(&self, spec: v1::ResourceSpec, field: &str) -> Result<ResourceSpec, Status> {
        let kind = ResourceName::parse(&spec.name).map(|n| n.kind().to_owned()).ok();
        self.decode_spec_kind(spec, kind.as_deref(), &|| field.to_owned())
    }

    /// [`Self::decode_spec`] of a batch's member `i`, whose name the caller
    /// parsed (the path `resources[i]` is built only for a refusal).
    fn decode_spec_of(&self, spec: v1::ResourceSpec, name: &ResourceName, i: usize) -> Result<ResourceSpec, Status> {
        self.decode_spec_kind(spec, Some(name.kind()), &|| format!("resources[{i}]"))
    }

    fn decode_spec_kind(
        &self,
        spec: v1::ResourceSpec,
        kind: Option<&str>,
        field: &dyn Fn() -> String,
    ) -> Result<ResourceSpec, Status> {
        let many = |f: &str| match kind {
            Some(kind) => self.node.schema().reference(kind, f).is_none_or(|r| r.many),
            None => true,
        };
        convert::resource_spec_at(spec, field, &many)
    }

    /// The audit context of a change `principal` asks for: `verb` on
    /// `name` is decided by the policy in force (`Node::authorize`), whose
    /// rule the audit entry of the change records. A refusal is audited in
    /// its own step (rate-limited: `Node::audit_refusal`) and answered
    /// PERMISSION_DENIED naming the resource and the verb.
    /// The audit context of `principal`'s call through `through` (the
    /// region that vouched for it; None: a direct call), when the policy
    /// allows `verb` on `name`; else the refusal, audited.
    pub(crate) async fn audited(
        &self,
        principal: &Principal,
        through: Option<&str>,
        verb: Verb,
        name: &ResourceName,
        action: &str,
    ) -> Result<AuditContext, Status> {
        match self.node.authorize(principal, verb, Target::Resource(name)) {
            Ok(decision) => Ok(self.node.audit_context(principal, &decision.rule, through)),
            Err(fault) => {
                let context = self.node.audit_context(principal, "", through);
                Err(self.audit_refused(context, action, name, fault).await)
            }
        }
    }

    /// A refused change: written to the audit log (with the rule of the
    /// first refused member, when the policy refused it) in its own step,
    /// and the status the caller gets.
    pub(crate) async fn audit_refused(
        &self,
        mut context: AuditContext,
        action: &str,
        name: &ResourceName,
        fault: Fault,
    ) -> Status {
        if let Fault::Denied(denied) = &fault {
            context.rule = denied.members.first().map(|m| m.rule.clone()).unwrap_or_default();
        }
        let status = Status::from(fault);
        let refusal = Refusal {
            context,
            action: action.to_owned(),
            target: name.to_string(),
            outcome: format!("{:?}: {}", status.code(), status.message()),
        };
        self.node.audit_refusal(refusal).await;
        status
    }

    /// Makes a change (`change`: the node's call that runs its writer
    /// step) to its end, in a task of its own when another region's node
    /// forwarded it (`answer_by`: see `forward.rs`'s `to_the_end`), and
    /// audits its refusal as the policy's refusals are (`action` on
    /// `name`, for `context`): the policy's or a plan's (a Delete's closure
    /// check, a cascade unconfirmed or bound to a changed closure: an
    /// operator reads who tried a large delete, and what had changed), or
    /// one for time ([`Self::refused_late`]).
    pub(crate) async fn change<T>(
        &self,
        answer_by: Option<Timestamp>,
        change: impl Future<Output = Result<T, Fault>> + Send + 'static,
        context: AuditContext,
        action: &'static str,
        name: &ResourceName,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
    {
        let (api, name) = (self.clone(), name.clone());
        let made = async move {
            match change.await {
                Ok(done) => Ok(done),
                Err(fault @ Fault::Denied(_)) => Err(api.audit_refused(context, action, &name, fault).await),
                Err(fault @ Fault::Refused(CoreError::PlanChanged { .. } | CoreError::PlanRequired { .. })) => {
                    Err(api.audit_refused(context, action, &name, fault).await)
                }
                Err(fault) if api.refused_late(&fault) => Err(api.audit_refused(context, action, &name, fault).await),
                Err(fault) => Err(fault.into()),
            }
        };
        to_the_end(answer_by, made).await
    }

    /// Whether `fault` is this region's refusal of a change forwarded here
    /// that arrived after its forwarder gave up (refused in its step,
    /// changing nothing: `crate::peers::still_awaited` names this region).
    /// Nobody waits for that answer, so the audit log is where it shows. A
    /// call to another region that ran out of the client's time names that
    /// region, and is answered at once, before the client's own deadline.
    fn refused_late(&self, fault: &Fault) -> bool {
        matches!(fault, Fault::Refused(CoreError::DeadlineExceeded { region, .. }) if *region == self.node.region.as_str())
    }

    async fn operation(
        &self,
        id: cascade_core::OperationId,
        page_size: usize,
        token: &str,
        read_timeout: std::time::Duration,
    ) -> Result<v1::Operation, Status> {
        let cursor = outcomes_cursor(token)?;
        Ok(present_operation(
            &self.node.operation_within(id, page_size, cursor, read_timeout).await?,
            self.node.limits.page_bytes(),
        ))
    }
}

#[tonic::async_trait]
impl Resources for ResourcesApi {
    // The controls of a running operation: `api/operation_control.rs`.
    async fn pause_operation(
        &self,
        request: Request<v1::PauseOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        let (id, reason) = (request.get_ref().id.clone(), request.get_ref().reason.clone());
        self.control(request, Control::Pause, id, reason).await
    }

    async fn resume_operation(
        &self,
        request: Request<v1::ResumeOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        let (id, reason) = (request.get_ref().id.clone(), request.get_ref().reason.clone());
        self.control(request, Control::Resume, id, reason).await
    }

    async fn cancel_operation(
        &self,
        request: Request<v1::CancelOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        let (id, reason) = (request.get_ref().id.clone(), request.get_ref().reason.clone());
        self.control(request, Control::Cancel, id, reason).await
    }

    // Running and recent operations: `api/list_operations.rs`.
    async fn list_operations(
        &self,
        request: Request<v1::ListOperationsRequest>,
    ) -> Result<Response<v1::ListOperationsResponse>, Status> {
        request.get_ref().check_bounds()?;
        Ok(Response::new(self.list_operations_call(request).await?))
    }

    // Undelete of a whole cascade: `api/undelete.rs`.
    async fn undelete(&self, request: Request<v1::UndeleteRequest>) -> Result<Response<v1::UndeleteResponse>, Status> {
        self.undelete_call(request).await
    }

    async fn explain_deletion(
        &self,
        request: Request<v1::ExplainDeletionRequest>,
    ) -> Result<Response<v1::DeletionExplanation>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        // One deadline for the whole explanation, forwarded or not.
        let budget = budget_within(EXPLAIN_BUDGET, request.metadata());
        let deadline = deadline_of(request.metadata());
        let req = request.into_inner();
        let explanation = match (req.name.is_empty(), req.operation_id.is_empty()) {
            (false, true) => {
                let name = parse_name(&req.name, "name")?;
                if let Some((region, mut owner)) = self.route(&name, "name")? {
                    // The owner explains within the same deadline (it
                    // keeps its own margin); one that does not answer in
                    // it is UNAVAILABLE naming its region, DEADLINE_EXCEEDED
                    // once the client's own deadline has passed.
                    let send = move |r| async move { owner.explain_deletion(r).await };
                    let (request, now) = (Request::new(req), self.node.clock.now());
                    let answer = forward(
                        &region,
                        "ExplainDeletion",
                        &deadline,
                        EXPLAIN_BUDGET,
                        now,
                        request,
                        send,
                    )
                    .await?;
                    return Ok(Response::new(answer));
                }
                self.authorize(&principal, Verb::Get, Target::Resource(&name))?;
                let span = info_span!("explain_deletion", region = %self.node.region, name = %name);
                self.node.explain_resource(&name, budget).instrument(span).await?
            }
            (true, false) => {
                let op = parse_operation_id(&req.operation_id, "operation_id")?;
                let span = info_span!("explain_deletion", region = %self.node.region, operation = %op);
                let explanation = self.node.explain(op, budget).instrument(span).await?;
                // Read first: the operation names its root.
                self.authorize_operation_read(&principal, Verb::Get, explanation.root.as_ref().map(|r| &r.name))?;
                explanation
            }
            _ => {
                return Err(invalid_field(
                    "name",
                    "name a DELETING resource or an operation_id (one of them)",
                ))
            }
        };
        Ok(Response::new(present_explanation(&explanation)))
    }

    async fn create(&self, request: Request<v1::CreateRequest>) -> Result<Response<v1::Resource>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        let through = vouching_region(&request);
        let (deadline, answer_by) = deadlines(&request);
        let raw = request.into_inner();
        let spec = raw
            .resource
            .clone()
            .ok_or_else(|| invalid_field("resource", "is required"))?;
        let name = parse_name(&spec.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let send = move |r| async move { owner.create(r).await };
            return Ok(Response::new(
                self.to_owner(&region, "Create", &deadline, raw, send).await?,
            ));
        }
        let name = parse_name(&spec.name, "name")?;
        let audit = self
            .audited(&principal, through.as_deref(), Verb::Create, &name, "create")
            .await?;
        let spec = self.decode_spec(spec, "")?;
        let (node, context) = (self.node.clone(), audit.clone());
        let create = async move { node.create(vec![spec], context, &deadline, answer_by).await };
        let mut created = self.change(answer_by, create, audit, "create", &name).await?;
        let r = created
            .pop()
            .ok_or_else(|| Status::internal("create returned nothing"))?;
        Ok(Response::new(present(&self.node.view(r)?)))
    }

    async fn batch_create(
        &self,
        request: Request<v1::BatchCreateRequest>,
    ) -> Result<Response<v1::BatchCreateResponse>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        let through = vouching_region(&request);
        let (deadline, answer_by) = deadlines(&request);
        let specs = request.into_inner().resources;
        let max = self.node.limits.max_batch_create;
        if specs.is_empty() || specs.len() > max {
            return Err(invalid_field("resources", format!("must hold 1 to {max} resources")));
        }
        let mut regions = BTreeSet::new();
        let mut names = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let name =
                ResourceName::parse(&spec.name).map_err(|e| invalid_field(&format!("resources[{i}].name"), e))?;
            if !regions.contains(name.region()) {
                regions.insert(name.region().to_owned());
            }
            names.push(name);
        }
        if regions.len() > 1 {
            return Err(invalid_field(
                "resources",
                "a batch creates resources of one region (it is one transaction at their owner)",
            ));
        }
        if let Some(first) = names.first() {
            if let Some((region, mut owner)) = self.route(first, "resources[0].name")? {
                let forwarded = Request::new(v1::BatchCreateRequest { resources: specs });
                let send = move |r| async move { owner.batch_create(r).await };
                let now = self.node.clock.now();
                let created = forward(&region, "BatchCreate", &deadline, FORWARD_TIMEOUT, now, forwarded, send).await?;
                return Ok(Response::new(created));
            }
        }
        // One transaction: refused whole when any resource is, naming each.
        // Each resource is decided on its own, once; the batch is audited
        // (one entry per resource) with the first one's rule.
        let mut denied: Option<Denied> = None;
        let mut first_rule: Option<String> = None;
        for name in &names {
            match self.node.authorize(&principal, Verb::Create, Target::Resource(name)) {
                Ok(decision) => {
                    first_rule.get_or_insert(decision.rule);
                }
                Err(Fault::Denied(one)) => match &mut denied {
                    None => denied = Some(one),
                    Some(all) if all.members.len() < Denied::MAX_MEMBERS => all.members.extend(one.members),
                    Some(all) => all.more += 1,
                },
                Err(other) => return Err(other.into()),
            }
        }
        if let Some(denied) = denied {
            let first = denied
                .members
                .first()
                .map(|m| (m.name.clone(), m.rule.clone()))
                .unwrap_or_default();
            let status = Status::from(Fault::Denied(denied));
            let refusal = Refusal {
                context: self.node.audit_context(&principal, &first.1, through.as_deref()),
                action: "create".to_owned(),
                target: first.0,
                outcome: format!("{:?}: {}", status.code(), status.message()),
            };
            self.node.audit_refusal(refusal).await;
            return Err(status);
        }
        let rule = first_rule.ok_or_else(|| invalid_field("resources", "must hold 1 or more resources"))?;
        let audit = self.node.audit_context(&principal, &rule, through.as_deref());
        let specs = specs
            .into_iter()
            .zip(&names)
            .enumerate()
            .map(|(i, (s, name))| self.decode_spec_of(s, name, i))
            .collect::<Result<Vec<_>, _>>()?;
        let first = names
            .first()
            .ok_or_else(|| invalid_field("resources", "must hold 1 or more resources"))?;
        let (node, context) = (self.node.clone(), audit.clone());
        let create = async move { node.create(specs, context, &deadline, answer_by).await };
        let created = self.change(answer_by, create, audit, "create", first).await?;
        let resources = created
            .into_iter()
            .map(|r| self.node.view(r).map(|v| present(&v)))
            .collect::<Result<_, _>>()?;
        Ok(Response::new(v1::BatchCreateResponse { resources }))
    }

    async fn get(&self, request: Request<v1::GetRequest>) -> Result<Response<v1::Resource>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        let (deadline, _) = deadlines(&request);
        let raw = request.into_inner();
        let name = parse_name(&raw.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let send = move |r| async move { owner.get(r).await };
            return Ok(Response::new(
                self.to_owner(&region, "Get", &deadline, raw, send).await?,
            ));
        }
        self.authorize(&principal, Verb::Get, Target::Resource(&name))?;
        let view = self.node.get(&name, raw.show_deleted, &deadline).await?;
        Ok(Response::new(present(&view)))
    }

    async fn list(&self, request: Request<v1::ListRequest>) -> Result<Response<v1::ListResponse>, Status> {
        request.get_ref().check_bounds()?;
        Ok(Response::new(self.list_resources(request).await?))
    }

    async fn list_references(
        &self,
        request: Request<v1::ListReferencesRequest>,
    ) -> Result<Response<v1::ListReferencesResponse>, Status> {
        request.get_ref().check_bounds()?;
        Ok(Response::new(self.list_references_of(request).await?))
    }

    async fn get_history(
        &self,
        request: Request<v1::GetHistoryRequest>,
    ) -> Result<Response<v1::GetHistoryResponse>, Status> {
        request.get_ref().check_bounds()?;
        Ok(Response::new(self.history_of(request).await?))
    }

    async fn update(&self, request: Request<v1::UpdateRequest>) -> Result<Response<v1::Resource>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        let through = vouching_region(&request);
        let (deadline, answer_by) = deadlines(&request);
        let req = request.into_inner();
        let spec = req
            .resource
            .clone()
            .ok_or_else(|| invalid_field("resource", "is required"))?;
        let name = parse_name(&spec.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let send = move |r| async move { owner.update(r).await };
            return Ok(Response::new(
                self.to_owner(&region, "Update", &deadline, req, send).await?,
            ));
        }
        let name = parse_name(&spec.name, "name")?;
        let audit = self
            .audited(&principal, through.as_deref(), Verb::Update, &name, "update")
            .await?;
        let spec = self.decode_spec(spec, "")?;
        let etag = (!req.etag.is_empty()).then_some(req.etag);
        let (node, context) = (self.node.clone(), audit.clone());
        let update = async move { node.update(spec, etag, context, &deadline, answer_by).await };
        let r = self.change(answer_by, update, audit, "update", &name).await?;
        Ok(Response::new(present(&self.node.view(r)?)))
    }

    async fn delete(&self, request: Request<v1::DeleteRequest>) -> Result<Response<v1::DeleteResponse>, Status> {
        request.get_ref().check_bounds()?;
        // A dry run asks other regions for their parts: all of it within
        // this, or the caller's own deadline when that is shorter.
        let budget = budget_within(DRY_RUN_BUDGET, request.metadata());
        let principal = caller(&request);
        let through = vouching_region(&request);
        let (deadline, answer_by) = deadlines(&request);
        let raw = request.into_inner();
        let name = parse_name(&raw.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let send = move |r| async move { owner.delete(r).await };
            return Ok(Response::new(
                self.to_owner(&region, "Delete", &deadline, raw, send).await?,
            ));
        }
        let expect_plan = (!raw.expect_plan.is_empty()).then(|| raw.expect_plan.clone());
        let mut req = convert::delete_request(raw)?;
        let (verb, action) = match (req.orphan, req.cascade) {
            (true, _) => (Verb::Orphan, "orphan"),
            (false, true) => (Verb::Cascade, "cascade"),
            (false, false) => (Verb::Delete, "delete"),
        };
        let audit = self
            .audited(&principal, through.as_deref(), verb, &name, action)
            .await?
            .noting(req.requested_by.clone());
        // Stored with the deletion: the cascade acts for it in every region.
        req.principal = principal;
        // The closure check's refusal (a member of any region the caller
        // may not change) is audited like the root's own, and so are the
        // plan's and one that came too late (`Self::change`).
        let (node, context) = (self.node.clone(), audit.clone());
        let delete = async move {
            let plan = expect_plan.as_deref();
            node.delete(req, plan, budget, &deadline, context, answer_by).await
        };
        let (outcome, unreachable) = self.change(answer_by, delete, audit, action, &name).await?;
        let response = match outcome {
            DeleteOutcome::Accepted(op) => v1::DeleteResponse {
                operation: Some(convert::operation(&op, &[], String::new())),
                ..Default::default()
            },
            DeleteOutcome::AlreadyDeleting(op) => v1::DeleteResponse {
                operation: Some(convert::operation(&op, &[], String::new())),
                already_deleting: true,
                ..Default::default()
            },
            DeleteOutcome::Missing => v1::DeleteResponse::default(),
            DeleteOutcome::DryRun(plan) => {
                let binding = self.node.bind_plan(&plan, &unreachable);
                let mut plan = convert::plan(&plan);
                plan.unreachable_regions = unreachable;
                plan.members = binding.members.len() as u64;
                match binding.token {
                    Ok(token) => plan.token = token,
                    Err(why) => plan.token_missing = why,
                }
                v1::DeleteResponse {
                    plan: Some(plan),
                    ..Default::default()
                }
            }
        };
        Ok(Response::new(response))
    }

    async fn add_lien(&self, request: Request<v1::AddLienRequest>) -> Result<Response<v1::Resource>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        let through = vouching_region(&request);
        let (deadline, answer_by) = deadlines(&request);
        let req = request.into_inner();
        let name = parse_name(&req.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let send = move |r| async move { owner.add_lien(r).await };
            return Ok(Response::new(
                self.to_owner(&region, "AddLien", &deadline, req, send).await?,
            ));
        }
        let audit = self
            .audited(&principal, through.as_deref(), Verb::Lien, &name, "add_lien")
            .await?;
        let span = info_span!("add_lien", region = %self.node.region, name = %name, lien = %req.lien_id);
        let lien = AddLien {
            name: req.name,
            id: req.lien_id,
            reason: req.reason,
            requested_by: if req.requested_by.is_empty() {
                "anonymous".to_owned()
            } else {
                req.requested_by
            },
            etag: (!req.etag.is_empty()).then_some(req.etag),
        };
        let audit = audit.noting(lien.requested_by.clone());
        let (node, context) = (self.node.clone(), audit.clone());
        let add = async move { node.add_lien(lien, context, answer_by).instrument(span).await };
        let r = self.change(answer_by, add, audit, "add_lien", &name).await?;
        Ok(Response::new(present(&self.node.view(r)?)))
    }

    async fn remove_lien(&self, request: Request<v1::RemoveLienRequest>) -> Result<Response<v1::Resource>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        let through = vouching_region(&request);
        let (deadline, answer_by) = deadlines(&request);
        let req = request.into_inner();
        let name = parse_name(&req.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let send = move |r| async move { owner.remove_lien(r).await };
            return Ok(Response::new(
                self.to_owner(&region, "RemoveLien", &deadline, req, send).await?,
            ));
        }
        let audit = self
            .audited(&principal, through.as_deref(), Verb::Lien, &name, "remove_lien")
            .await?;
        let span = info_span!("remove_lien", region = %self.node.region, name = %name, lien = %req.lien_id);
        let etag = (!req.etag.is_empty()).then_some(req.etag);
        let (node, context) = (self.node.clone(), audit.clone());
        let remove = async move {
            let lien = node.remove_lien(req.name, req.lien_id, etag, context, answer_by);
            lien.instrument(span).await
        };
        let r = self.change(answer_by, remove, audit, "remove_lien", &name).await?;
        Ok(Response::new(present(&self.node.view(r)?)))
    }

    async fn remove_finalizer(
        &self,
        request: Request<v1::RemoveFinalizerRequest>,
    ) -> Result<Response<v1::Resource>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        let through = vouching_region(&request);
        let (deadline, answer_by) = deadlines(&request);
        let req = request.into_inner();
        let name = parse_name(&req.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let send = move |r| async move { owner.remove_finalizer(r).await };
            return Ok(Response::new(
                self.to_owner(&region, "RemoveFinalizer", &deadline, req, send).await?,
            ));
        }
        let audit = self
            .audited(
                &principal,
                through.as_deref(),
                Verb::Finalize,
                &name,
                "remove_finalizer",
            )
            .await?;
        let req = convert::remove_finalizer_request(req)?;
        let span = info_span!("remove_finalizer", region = %self.node.region, name = %name, uid = ?req.uid, finalizer = %req.finalizer);
        let (node, context) = (self.node.clone(), audit.clone());
        let remove = async move { node.remove_finalizer(req, context, answer_by).instrument(span).await };
        let r = self.change(answer_by, remove, audit, "remove_finalizer", &name).await?;
        Ok(Response::new(present(&self.node.view(r)?)))
    }

    async fn report_finalizer_failure(
        &self,
        request: Request<v1::ReportFinalizerFailureRequest>,
    ) -> Result<Response<v1::Resource>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        let through = vouching_region(&request);
        let (deadline, answer_by) = deadlines(&request);
        let req = request.into_inner();
        let name = parse_name(&req.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let send = move |r| async move { owner.report_finalizer_failure(r).await };
            return Ok(Response::new(
                self.to_owner(&region, "ReportFinalizerFailure", &deadline, req, send)
                    .await?,
            ));
        }
        let audit = self
            .audited(
                &principal,
                through.as_deref(),
                Verb::Finalize,
                &name,
                "report_finalizer_failure",
            )
            .await?;
        let req = convert::finalizer_failure_request(req)?;
        let span = info_span!("report_finalizer_failure", region = %self.node.region, name = %name, uid = ?req.uid, finalizer = %req.finalizer);
        let (node, context) = (self.node.clone(), audit.clone());
        let report = async move {
            let failure = node.report_finalizer_failure(req, context, answer_by);
            failure.instrument(span).await
        };
        let r = self
            .change(answer_by, report, audit, "report_finalizer_failure", &name)
            .await?;
        Ok(Response::new(present(&self.node.view(r)?)))
    }

    async fn get_operation(
        &self,
        request: Request<v1::GetOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        request.get_ref().check_bounds()?;
        // Each round of part reads within this, or within the caller's own
        // deadline when it leaves less (the probe round and the page's reads
        // may take one each).
        let read_timeout = budget_within(2 * OPERATION_READ_TIMEOUT, request.metadata()) / 2;
        let principal = caller(&request);
        let req = request.into_inner();
        let id = parse_operation_id(&req.id, "id")?;
        let page_size = match req.outcomes_page_size {
            0 => self.node.limits.default_page_size,
            n => n as usize,
        };
        let operation = self
            .operation(id, page_size, &req.outcomes_page_token, read_timeout)
            .await?;
        // Read first: the operation names its root (shown only if allowed).
        let root = operation.root.as_ref().and_then(|r| ResourceName::parse(&r.name).ok());
        self.authorize_operation_read(&principal, Verb::Get, root.as_ref())?;
        Ok(Response::new(operation))
    }

    type WatchOperationStream = BoxStream<v1::Operation>;

    async fn watch_operation(
        &self,
        request: Request<v1::WatchOperationRequest>,
    ) -> Result<Response<Self::WatchOperationStream>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        let id = parse_operation_id(&request.into_inner().id, "id")?;
        let node = self.node.clone();
        // Subscribe before the first read so no local change falls in between;
        // other regions' parts are polled.
        let mut events = node.events.subscribe();
        let first = node.operation(id, 0, None).await?;
        self.authorize_operation_read(&principal, Verb::Watch, Some(&first.operation.root.name))?;
        let (tx, rx) = mpsc::channel(16);
        let mut stop = node.shutting_down.subscribe();
        let poll = if node.peers.regions().next().is_some() {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(3600)
        };
        let span = info_span!("watch_operation", region = %node.region, operation = %id);
        tokio::spawn(
            async move {
                let changed = |a: &OperationView, b: &OperationView| {
                    a.operation.progress != b.operation.progress
                        || a.operation.state != b.operation.state
                        || a.done != b.done
                        || a.unreachable != b.unreachable
                };
                let mut last = first.clone();
                let page_bytes = node.limits.page_bytes();
                if tx.send(Ok(present_operation(&first, page_bytes))).await.is_err() || last.done {
                    return;
                }
                loop {
                    // Biased for replayable simulations; stop and closed
                    // first so a busy feed cannot starve them.
                    tokio::select! {
                        biased;
                        _ = stop.wait_for(|s| *s) => return,
                        _ = tx.closed() => return,
                        r = events.recv() => match r {
                            Ok(e) if e.operation != Some(id) => continue,
                            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                            Err(broadcast::error::RecvError::Closed) => return,
                        },
                        _ = tokio::time::sleep(poll) => {}
                    }
                    let view = match node.operation(id, 0, None).await {
                        Ok(v) => v,
                        Err(e) => {
                            let _ = tx.send(Err(e.into())).await;
                            return;
                        }
                    };
                    if changed(&view, &last) {
                        let done = view.done;
                        let wire = present_operation(&view, page_bytes);
                        last = view;
                        if tx.send(Ok(wire)).await.is_err() || done {
                            return;
                        }
                    }
                }
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    type WatchStream = BoxStream<v1::WatchEvent>;

    async fn watch(&self, request: Request<v1::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        request.get_ref().check_bounds()?;
        let watcher = Watcher::Client {
            addr: request.remote_addr(),
        };
        let principal = caller(&request);
        let req = request.into_inner();
        if !req.kind.is_empty() {
            self.node
                .known_kind(&req.kind, "kind", format_args!("unknown kind {}", quote(&req.kind)))
                .map_err(refused)?;
        }
        self.authorize(
            &principal,
            Verb::Watch,
            Target::Region {
                region: &self.node.region,
                kind: (!req.kind.is_empty()).then_some(req.kind.as_str()),
            },
        )?;
        let kind = (!req.kind.is_empty()).then_some(req.kind);
        let span = info_span!("watch", region = %self.node.region, from = req.from_revision);
        let stream = outbox_stream(
            self.node.feed(),
            req.from_revision,
            watcher,
            move |e: &EventHead<'_>| kind.as_deref().is_none_or(|k| e.kind() == k),
            events_only(convert::event),
            span,
        );
        Ok(Response::new(Box::pin(stream)))
    }
}
