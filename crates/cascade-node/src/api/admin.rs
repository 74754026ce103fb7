//! `cascade.v1.Admin`, the operators' API: an adapter around the [`Node`]
//! methods of `admin.rs`, behind one gate.
//!
//! The gate, with `[auth] mode = "none"`: a caller is an administrator when it sends the configured
//! token (`authorization: Bearer …`), or, with mutual TLS, presents a
//! client certificate whose DNS name `[admin] identities` lists. Anyone
//! else is refused PERMISSION_DENIED; the refusal is logged and written to
//! the audit log. A request about another region is forwarded to its node
//! with the caller's token, and, for a certificate identity, with the
//! identity this node verified in [`FORWARDED_FOR`]: the owner sees the
//! forwarding region's certificate, and trusts that header only from a
//! certified region of its cluster or a node of its own region (a standby,
//! which forwards every call to its writer: `api/standby.rs`).

mod actions;
mod check_schema;
mod purge;

use std::sync::Arc;

use cascade_core::auth::{Principal, Target, Verb};
use cascade_core::limits::{cut_stored, quote, MAX_AUDIT_TARGET_BYTES};
use cascade_core::model::AuditEntry;
use cascade_core::protocol::AdminRequest;
use cascade_core::{RegionId, Uid};
use cascade_proto::bounds::{fit_page, Bounded};
use cascade_proto::convert;
use cascade_proto::status::invalid_field;
use cascade_proto::v1::{self, admin_server::Admin};
use subtle::ConstantTimeEq;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::{info, info_span, warn, Instrument};

use crate::admin::{AuditFilter, DeletionEntry, DeletionFilter, Refusal};
use crate::api::forward::{answer_by, budget_within, deadline_of, forward, FORWARD_TIMEOUT};
use crate::api::principal::caller;
use crate::api::relay::{relayed_caller, Relayed};
use crate::api::{parse_name, refused};
use crate::audit::AuditContext;
use crate::auth::AuthMode;
use crate::node::Node;
use crate::peers::RegionFigures;
use crate::status_cache::RegionStatus;

/// Metadata a forwarding node adds: the administrator identity it verified
/// from the client's certificate.
pub(crate) const FORWARDED_FOR: &str = "cascade-admin-for";

/// The operators' API over one node. Refusals are audited through
/// [`Node::audit_refusal`] (rate-limited for the whole node).
pub(crate) struct AdminApi {
    pub(crate) node: Arc<Node>,
    /// Anyone can be refused, as often as they like: one line a window.
    pub(crate) refusals_logged: crate::log_throttle::Throttle,
}

/// An authenticated administrator, and how to vouch for them when a call
/// is forwarded.
struct Administrator {
    /// For the audit log: the certificate name, or "token".
    who: String,
    /// How they proved it, for the audit log: `token` or `certificate`.
    via: &'static str,
    /// The region that forwarded the call for them (None: a direct call).
    through: Option<String>,
    /// The headers a forwarded call carries.
    forward: MetadataMap,
}

impl AdminApi {
    /// The gate (see the module doc). A refusal is logged and audited.
    async fn authenticate<T>(&self, request: &Request<T>, action: &str, target: &str) -> Result<Administrator, Status> {
        // With `[auth] mode = "required"` the authentication layer
        // (`api/authn.rs`) already knows the caller, and a forwarded call
        // vouches for them (`crate::peers::carrying`); what they may do is
        // the policy's (the admin.* verbs), `[admin]` is refused at start.
        if self.node.auth.mode == crate::auth::AuthMode::Required {
            let principal = crate::api::principal::caller(request);
            return Ok(Administrator {
                who: principal.id,
                via: principal.via.as_str(),
                through: None,
                forward: MetadataMap::new(),
            });
        }
        let access = &self.node.admin;
        let metadata = request.metadata();
        let bearer = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let mut forward = MetadataMap::new();
        if let (Some(sent), Some(token)) = (bearer, access.token.as_deref()) {
            if bool::from(sent.as_bytes().ct_eq(token.as_bytes())) {
                if let Some(v) = metadata.get("authorization") {
                    forward.insert("authorization", v.clone());
                }
                return Ok(Administrator {
                    who: "token".to_owned(),
                    via: "token",
                    through: None,
                    forward,
                });
            }
        }
        let chain = request.peer_certs();
        // Who the TLS caller is: a call a standby of this region relayed
        // (`api/relay.rs`) shows the standby's certificate, which is no
        // administrator's, only the region and the identity it vouches for.
        let relayed = chain
            .as_deref()
            .and_then(|c| cascade_tls::peer_region(c).ok())
            .map(|certified| relayed_caller(metadata, &certified, &self.node.region));
        let names = match relayed {
            Some(Relayed::For(_) | Relayed::Anonymous | Relayed::Unreadable(_)) => Vec::new(),
            _ => chain
                .as_deref()
                .map(|c| cascade_tls::certificate_dns_names(c))
                .unwrap_or_default(),
        };
        if let Some(name) = names.iter().find(|n| access.identities.contains(n)) {
            if let Ok(v) = name.parse() {
                forward.insert(FORWARDED_FOR, v);
            }
            return Ok(Administrator {
                who: name.clone(),
                via: "certificate",
                through: None,
                forward,
            });
        }
        // A call another node of the cluster forwarded for an administrator
        // it verified (only over mutual TLS: the header alone proves
        // nothing): a region of the cluster, a node of this region, or a
        // standby of this region relaying either or vouching itself.
        let own = &self.node.region;
        let of_cluster = |r: &RegionId| r == own || self.node.peers.knows(r.as_str());
        let forwarder = match &relayed {
            Some(Relayed::Direct(region)) if of_cluster(region) => Some(region.to_string()),
            Some(Relayed::For(region)) if of_cluster(region) => {
                Some(format!("{region}, relayed by a standby of {own}"))
            }
            Some(Relayed::Anonymous) => Some(format!("a standby of {own}")),
            _ => None,
        };
        let vouched = metadata.get(FORWARDED_FOR).and_then(|v| v.to_str().ok());
        if let (Some(forwarder), Some(identity)) = (&forwarder, vouched) {
            if access.identities.iter().any(|i| i == identity) {
                if let Some(v) = metadata.get(FORWARDED_FOR) {
                    forward.insert(FORWARDED_FOR, v.clone());
                }
                let through = match &relayed {
                    Some(Relayed::Direct(region) | Relayed::For(region)) => Some(region.to_string()),
                    _ => None,
                };
                return Ok(Administrator {
                    who: format!("{identity} (through {forwarder})"),
                    via: "certificate",
                    through,
                    forward,
                });
            }
        }
        // What the caller presented goes into the refusal, the warning and
        // the audit entry: the vouched identity is whatever the caller put
        // in a header, and a certificate may name any number of names, so
        // both are quoted (a short prefix and the length), never echoed
        // whole. The token itself is never repeated.
        let presented = match (bearer, names.as_slice(), vouched) {
            (Some(_), _, _) => "a token that is not this node's admin token".to_owned(),
            (None, [], _) => "no credentials".to_owned(),
            (None, names, Some(identity)) => {
                format!(
                    "certificate {} vouching for {}",
                    quote(&names.join(", ")),
                    quote(identity)
                )
            }
            (None, names, None) => format!("certificate {}", quote(&names.join(", "))),
        };
        let configured = if access.token.is_none() && access.identities.is_empty() {
            "this node has no administrator configured ([admin] in its config)"
        } else {
            "an administrator sends the [admin] token or presents a certificate [admin] identities lists"
        };
        let status = Status::permission_denied(format!("{action}: {presented} is not an administrator: {configured}"));
        // The audit entry is cut by the core; the log line likewise.
        let target = cut_stored(target, MAX_AUDIT_TARGET_BYTES);
        let mut context = self.node.audit_context(&caller(request), "[admin] gate", None);
        context.who = presented.clone();
        let refusal = Refusal {
            context,
            action: action.to_owned(),
            target: target.clone(),
            outcome: format!("PERMISSION_DENIED: {}", status.message()),
        };
        let audited = self.node.audit_refusal(refusal).await;
        if let Some(more) = self.refusals_logged.admit() {
            warn!(region = %self.node.region, action, target = %target, caller = %presented, audited,
                suppressed = more.count(), "refused an Admin call{more}");
        }
        Err(status)
    }

    /// The audit context of an administrator's call: the principal the
    /// authentication layer found (anonymous while it is off), how the
    /// `[admin]` gate knew them, the region that forwarded it, and the rule
    /// of the decision for `verb` on this region.
    fn admin_context<T>(&self, request: &Request<T>, admin: &Administrator, verb: Verb) -> AuditContext {
        let principal = caller(request);
        let region = &self.node.region;
        // The rule for the log only: whether the caller may is decided by
        // `authorize_admin` where the call is answered (and audited when
        // refused there).
        let decision = self
            .node
            .authorizer
            .decide(&principal, verb, Target::Region { region, kind: None });
        let mut context = self
            .node
            .audit_context(&principal, &decision.rule, admin.through.as_deref());
        if principal.is_anonymous() {
            context.via = admin.via.to_owned();
        }
        context
    }

    /// Under `[auth] mode = "required"`, may the caller do the Admin `verb`
    /// on this region? Asked where the call is answered (a forwarded call
    /// is decided by its owner), after the gate. With authentication off
    /// the gate alone decides, as before.
    fn authorize_admin(&self, principal: &Principal, verb: Verb) -> Result<(), Status> {
        if self.node.auth.mode != AuthMode::Required {
            return Ok(());
        }
        self.node.authorize(
            principal,
            verb,
            Target::Region {
                region: &self.node.region,
                kind: None,
            },
        )?;
        Ok(())
    }

    /// None for this node's region (or none named); the region to forward to otherwise.
    fn other_region(&self, raw: &str, field: &str) -> Result<Option<String>, Status> {
        if raw.is_empty() || raw == self.node.region.as_str() {
            return Ok(None);
        }
        let region = RegionId::parse(raw).map_err(|e| invalid_field(field, e))?;
        if !self.node.peers.knows(region.as_str()) {
            return Err(invalid_field(
                field,
                format!(
                    "{region} is not a region of this cluster (peers: {})",
                    self.node.peer_list()
                ),
            ));
        }
        Ok(Some(region.to_string()))
    }

    /// A forwarded copy of `message`, carrying what vouches for the caller.
    fn forwarded<M>(message: M, admin: &Administrator) -> Request<M> {
        let mut request = Request::new(message);
        for entry in admin.forward.iter() {
            if let tonic::metadata::KeyAndValueRef::Ascii(k, v) = entry {
                request.metadata_mut().insert(k.clone(), v.clone());
            }
        }
        request
    }

    /// An administrator's action the node refused: audited with the status
    /// the caller gets.
    async fn audited_refusal(&self, audit: AdminRequest, context: AuditContext, fault: crate::error::Fault) -> Status {
        self.audited_status(audit, context, Status::from(fault)).await
    }

    /// A refusal of an administrator's action, audited (the core cuts
    /// every field of the entry to its limit).
    async fn audited_status(&self, audit: AdminRequest, context: AuditContext, status: Status) -> Status {
        actions::audited(&self.node, audit, context, status).await
    }

    /// An entry with the record it holds, not one read again now: an
    /// action's answer is the record as the action left it, and a forced
    /// deletion the writer purged meanwhile has none left to read (a
    /// ForcePurge answered without its `deletion`, tests/admin.rs under load).
    fn present(&self, e: DeletionEntry) -> Result<v1::DeletionEntry, Status> {
        let view = self.node.view(e.resource)?;
        Ok(v1::DeletionEntry {
            resource: Some(convert::resource(&view.resource, Some(&e.record), &view.dangling)),
            attempts: e.work.as_ref().map_or(0, |w| w.attempts),
            next_attempt_ms: e.work.as_ref().map_or(0, |w| convert::ms(w.next_attempt_at)),
            last_error: e.work.and_then(|w| w.last_error).unwrap_or_default(),
            stuck: e.stuck,
            age_ms: i64::try_from(e.age_ms).unwrap_or(i64::MAX),
        })
    }
}

fn page_token(raw: &str, field: &str) -> Result<Option<Uid>, Status> {
    if raw.is_empty() {
        return Ok(None);
    }
    Uid::parse(raw)
        .map(Some)
        .map_err(|_| invalid_field(field, "not a token this API issued"))
}

/// The filters of a ListAudit request (empty strings and zeros: none).
fn audit_filter(req: &v1::ListAuditRequest) -> Result<AuditFilter, Status> {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let time = |ms: i64, field: &str| match ms {
        0 => Ok(None),
        ms => u64::try_from(ms)
            .map(Some)
            .map_err(|_| invalid_field(field, "milliseconds since the epoch, not negative")),
    };
    let filter = AuditFilter {
        principal: text(&req.principal),
        resource: text(&req.resource),
        action: text(&req.action),
        since_ms: time(req.since_ms, "since_ms")?,
        until_ms: time(req.until_ms, "until_ms")?,
    };
    if let (Some(since), Some(until)) = (filter.since_ms, filter.until_ms) {
        if until < since {
            return Err(invalid_field("until_ms", format!("{until} is before since_ms {since}")));
        }
    }
    Ok(filter)
}

fn audit_entry(e: AuditEntry, region: &RegionId) -> v1::AuditEntry {
    v1::AuditEntry {
        id: e.id.to_string(),
        time_ms: convert::ms(e.time),
        who: e.who,
        action: e.action,
        target: e.target,
        reason: e.reason,
        outcome: e.outcome,
        region: region.to_string(),
        groups: e.groups,
        via: e.via,
        node: e.node,
        through: e.through,
        rule: e.rule,
    }
}

#[tonic::async_trait]
impl Admin for AdminApi {
    /// Carried out by the operation's root's region (forwarded there).
    async fn extend_budget(
        &self,
        request: Request<v1::ExtendBudgetRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        let target = request.get_ref().operation_id.clone();
        let admin = self.authenticate(&request, "ExtendBudget", &target).await?;
        let principal = caller(&request);
        let context = self.admin_context(&request, &admin, Verb::AdminExtendBudget);
        let deadline = deadline_of(request.metadata());
        // A forwarded action arriving after its forwarder gave up is refused.
        let answer_by = answer_by(request.metadata());
        let read = budget_within(crate::cluster::OPERATION_READ_TIMEOUT, request.metadata());
        let req = request.into_inner();
        let audit = AdminRequest {
            who: admin.who.clone(),
            action: "ExtendBudget".to_owned(),
            target: format!("operation {} to {}", req.operation_id, req.max_deletions),
            reason: req.reason.clone(),
        };
        if let Err(refused) = req.check_bounds() {
            return Err(self.audited_status(audit, context, refused).await);
        }
        let id = crate::api::parse_operation_id(&req.operation_id, "operation_id")?;
        let root = match self.node.state().get_operation(id).map_err(crate::error::Fault::from)? {
            Some(op) => op.root,
            // Read from the regions within the caller's deadline too.
            None => self.node.operation_within(id, 0, None, read).await?.operation.root,
        };
        if let Some(region) = self.node.owner_region(&root.name, "operation_id").map_err(refused)? {
            let mut client = self.node.peers.admin(region).map_err(refused)?;
            let (forwarded, now) = (Self::forwarded(req, &admin), self.node.clock.now());
            let send = move |r| async move { client.extend_budget(r).await };
            return Ok(Response::new(
                forward(region, "ExtendBudget", &deadline, FORWARD_TIMEOUT, now, forwarded, send).await?,
            ));
        }
        if let Err(denied) = self.authorize_admin(&principal, Verb::AdminExtendBudget) {
            return Err(self.audited_status(audit, context, denied).await);
        }
        let span = info_span!("extend_budget", region = %self.node.region, operation = %id, who = %admin.who);
        let (node, entry, ctx, max) = (self.node.clone(), audit.clone(), context.clone(), req.max_deletions);
        let extend = async move {
            node.extend_budget(id, max, entry, ctx, answer_by)
                .instrument(span)
                .await
        };
        let op = self.carry_out(answer_by, extend, audit, context).await?;
        info!(region = %self.node.region, operation = %id, max_deletions = max, who = %admin.who, "budget extended");
        Ok(Response::new(crate::api::operation_control::present_part(&op)))
    }

    async fn list_deletions(
        &self,
        request: Request<v1::ListDeletionsRequest>,
    ) -> Result<Response<v1::ListDeletionsResponse>, Status> {
        let target = request.get_ref().region.clone();
        let admin = self.authenticate(&request, "ListDeletions", &target).await?;
        let principal = caller(&request);
        let deadline = deadline_of(request.metadata());
        let req = request.into_inner();
        req.check_bounds()?;
        if let Some(region) = self.other_region(&req.region, "region")? {
            let mut client = self.node.peers.admin(&region).map_err(refused)?;
            let (ask, now) = (Self::forwarded(req, &admin), self.node.clock.now());
            let send = move |r| async move { client.list_deletions(r).await };
            return Ok(Response::new(
                forward(&region, "ListDeletions", &deadline, FORWARD_TIMEOUT, now, ask, send).await?,
            ));
        }
        self.authorize_admin(&principal, Verb::AdminListDeletions)?;
        let status = match v1::DeletionStatus::try_from(req.status) {
            Ok(v1::DeletionStatus::Unspecified) => None,
            Ok(v1::DeletionStatus::Pending) => Some("PENDING"),
            Ok(v1::DeletionStatus::Blocked) => Some("BLOCKED"),
            Ok(v1::DeletionStatus::Failed) => Some("FAILED"),
            Ok(v1::DeletionStatus::Waiting) => Some("WAITING"),
            Err(_) => return Err(invalid_field("status", "not a deletion status")),
        };
        let filter = DeletionFilter {
            status,
            stuck: req.stuck,
            older_than_ms: req.older_than_ms,
            operation: None,
        };
        let after = page_token(&req.page_token, "page_token")?;
        let (entries, next) = self.node.list_deletions(&filter, req.page_size as usize, after)?;
        let mut deletions = entries
            .into_iter()
            .map(|e| self.present(e))
            .collect::<Result<Vec<_>, _>>()?;
        let mut next_page_token = next.map(|u| u.to_string()).unwrap_or_default();
        if fit_page(&mut deletions, self.node.limits.page_bytes()) {
            // The token is the last uid the page holds.
            next_page_token = deletions
                .last()
                .and_then(|d| d.resource.as_ref())
                .map(|r| r.uid.clone())
                .unwrap_or_default();
        }
        Ok(Response::new(v1::ListDeletionsResponse {
            deletions,
            next_page_token,
        }))
    }

    async fn retry_deletion(
        &self,
        request: Request<v1::RetryDeletionRequest>,
    ) -> Result<Response<v1::DeletionEntry>, Status> {
        let target = request.get_ref().name.clone();
        let admin = self.authenticate(&request, "RetryDeletion", &target).await?;
        let principal = caller(&request);
        let context = self.admin_context(&request, &admin, Verb::AdminRetryDeletion);
        let deadline = deadline_of(request.metadata());
        // A forwarded action arriving after its forwarder gave up is refused.
        let answer_by = answer_by(request.metadata());
        let req = request.into_inner();
        let audit = AdminRequest {
            who: admin.who.clone(),
            action: "RetryDeletion".to_owned(),
            target: req.name.clone(),
            reason: req.reason.clone(),
        };
        if let Err(refused) = req.check_bounds() {
            return Err(self.audited_status(audit, context, refused).await);
        }
        let name = parse_name(&req.name, "name")?;
        if let Some(region) = self.node.owner_region(&name, "name").map_err(refused)? {
            let mut client = self.node.peers.admin(region).map_err(refused)?;
            let (ask, now) = (Self::forwarded(req, &admin), self.node.clock.now());
            let send = move |r| async move { client.retry_deletion(r).await };
            return Ok(Response::new(
                forward(region, "RetryDeletion", &deadline, FORWARD_TIMEOUT, now, ask, send).await?,
            ));
        }
        if let Err(denied) = self.authorize_admin(&principal, Verb::AdminRetryDeletion) {
            return Err(self.audited_status(audit, context.clone(), denied).await);
        }
        let span = info_span!("retry_deletion", region = %self.node.region, name = %name, who = %admin.who);
        let (node, entry, ctx) = (self.node.clone(), audit.clone(), context.clone());
        let retry = async move {
            node.retry_deletion(req.name, entry, ctx, answer_by)
                .instrument(span)
                .await
        };
        let entry = self.carry_out(answer_by, retry, audit, context).await?;
        info!(region = %self.node.region, name = %name, uid = %entry.resource.uid, who = %admin.who, "deletion retried");
        Ok(Response::new(self.present(entry)?))
    }

    async fn force_purge(
        &self,
        request: Request<v1::ForcePurgeRequest>,
    ) -> Result<Response<v1::DeletionEntry>, Status> {
        let target = request.get_ref().name.clone();
        let admin = self.authenticate(&request, "ForcePurge", &target).await?;
        let principal = caller(&request);
        let context = self.admin_context(&request, &admin, Verb::AdminForcePurge);
        let deadline = deadline_of(request.metadata());
        // A forwarded action arriving after its forwarder gave up is refused.
        let answer_by = answer_by(request.metadata());
        let req = request.into_inner();
        let audit = AdminRequest {
            who: admin.who.clone(),
            action: if req.force { "ForcePurge (force)" } else { "ForcePurge" }.to_owned(),
            target: req.name.clone(),
            reason: req.reason.clone(),
        };
        if let Err(refused) = req.check_bounds() {
            return Err(self.audited_status(audit, context, refused).await);
        }
        let name = parse_name(&req.name, "name")?;
        if let Some(region) = self.node.owner_region(&name, "name").map_err(refused)? {
            let mut client = self.node.peers.admin(region).map_err(refused)?;
            let (forwarded, now) = (Self::forwarded(req, &admin), self.node.clock.now());
            let send = move |r| async move { client.force_purge(r).await };
            return Ok(Response::new(
                forward(region, "ForcePurge", &deadline, FORWARD_TIMEOUT, now, forwarded, send).await?,
            ));
        }
        if let Err(denied) = self.authorize_admin(&principal, Verb::AdminForcePurge) {
            return Err(self.audited_status(audit, context.clone(), denied).await);
        }
        let span =
            info_span!("force_purge", region = %self.node.region, name = %name, who = %admin.who, force = req.force);
        let (node, entry, ctx, reason) = (self.node.clone(), audit.clone(), context.clone(), audit.reason.clone());
        let force = async move {
            node.force_purge(req.name, entry, req.force, ctx, answer_by)
                .instrument(span)
                .await
        };
        let entry = self.carry_out(answer_by, force, audit, context).await?;
        warn!(region = %self.node.region, name = %name, uid = %entry.resource.uid, who = %admin.who,
            reason = %reason, "deletion forced through by an administrator");
        Ok(Response::new(self.present(entry)?))
    }

    async fn list_audit(
        &self,
        request: Request<v1::ListAuditRequest>,
    ) -> Result<Response<v1::ListAuditResponse>, Status> {
        let target = request.get_ref().region.clone();
        let admin = self.authenticate(&request, "ListAudit", &target).await?;
        let principal = caller(&request);
        let deadline = deadline_of(request.metadata());
        let req = request.into_inner();
        req.check_bounds()?;
        if let Some(region) = self.other_region(&req.region, "region")? {
            let mut client = self.node.peers.admin(&region).map_err(refused)?;
            let (forwarded, now) = (Self::forwarded(req, &admin), self.node.clock.now());
            let send = move |r| async move { client.list_audit(r).await };
            return Ok(Response::new(
                forward(&region, "ListAudit", &deadline, FORWARD_TIMEOUT, now, forwarded, send).await?,
            ));
        }
        self.authorize_admin(&principal, Verb::AdminListAudit)?;
        let after = page_token(&req.page_token, "page_token")?;
        let filter = audit_filter(&req)?;
        let (entries, next) = self.node.list_audit(&filter, req.page_size as usize, after)?;
        let mut entries: Vec<v1::AuditEntry> = entries.into_iter().map(|e| audit_entry(e, &self.node.region)).collect();
        let mut next_page_token = next.map(|u| u.to_string()).unwrap_or_default();
        if fit_page(&mut entries, self.node.limits.page_bytes()) {
            // The token is the last entry's id.
            next_page_token = entries.last().map(|e| e.id.clone()).unwrap_or_default();
        }
        Ok(Response::new(v1::ListAuditResponse {
            entries,
            next_page_token,
        }))
    }

    /// Open to every client with authentication off (see admin.proto): it
    /// reads counts only. Under `[auth] mode = "required"`, to those the
    /// policy allows admin.cluster_status.
    async fn get_cluster_status(
        &self,
        request: Request<v1::GetClusterStatusRequest>,
    ) -> Result<Response<v1::ClusterStatus>, Status> {
        self.authorize_admin(&caller(&request), Verb::AdminClusterStatus)?;
        // Within the caller's deadline: a frozen peer is listed
        // unreachable in time for the caller to read it.
        let deadline = crate::api::forward::budget_within(crate::status::STATUS_DEADLINE, request.metadata());
        let regions = self.node.cluster_status(deadline).await?;
        Ok(Response::new(v1::ClusterStatus {
            answered_by: self.node.region.to_string(),
            answered_by_node: self.node.role.as_ref().map(|r| r.me.node.clone()).unwrap_or_default(),
            regions: regions.into_iter().map(region_status).collect(),
            time_ms: self.node.clock.now().0 as i64,
        }))
    }

    /// Counts and samples what a filter matches, or with force deletes it
    /// as one operation (`api/admin/purge.rs`).
    async fn purge(&self, request: Request<v1::PurgeRequest>) -> Result<Response<v1::PurgeResponse>, Status> {
        self.run_purge(request).await
    }

    /// A schema file checked against the schema in force and the stored
    /// data, changing nothing (`api/admin/check_schema.rs`).
    async fn check_schema(
        &self,
        request: Request<v1::CheckSchemaRequest>,
    ) -> Result<Response<v1::CheckSchemaResponse>, Status> {
        self.run_check_schema(request).await
    }

    /// Open to every caller (it answers about the caller, from the policy
    /// alone); about another principal only to one allowed
    /// admin.impersonate. The region owning `name` (or `region`) answers.
    async fn can_i(&self, request: Request<v1::CanIRequest>) -> Result<Response<v1::CanIResponse>, Status> {
        request.get_ref().check_bounds()?;
        let principal = caller(&request);
        let deadline = deadline_of(request.metadata());
        let req = request.into_inner();
        let verb = Verb::parse(&req.verb).ok_or_else(|| {
            let known: Vec<&str> = Verb::ALL.iter().map(|v| v.as_str()).collect();
            invalid_field(
                "verb",
                format!("{} is not a verb (one of: {})", quote(&req.verb), known.join(", ")),
            )
        })?;
        let name = if req.name.is_empty() {
            None
        } else {
            Some(parse_name(&req.name, "name")?)
        };
        let owner = match &name {
            Some(name) => self
                .node
                .owner_region(name, "name")
                .map_err(refused)?
                .map(str::to_owned),
            None => self.other_region(&req.region, "region")?,
        };
        if let Some(region) = owner {
            // The owner answers from its own policy, for the caller this
            // node authenticated.
            let mut client = self.node.peers.admin(&region).map_err(refused)?;
            // The caller travels with the call as with every call a node
            // makes for its client (`crate::peers::carrying`: vouched under
            // mutual TLS, its own bearer credential without).
            let send = move |r| async move { client.can_i(r).await };
            return Ok(Response::new(
                forward(
                    &region,
                    "CanI",
                    &deadline,
                    FORWARD_TIMEOUT,
                    self.node.clock.now(),
                    Request::new(req),
                    send,
                )
                .await?,
            ));
        }
        let subject = if req.as_principal.is_empty() && req.as_groups.is_empty() {
            principal
        } else {
            self.node.authorize(
                &principal,
                Verb::AdminImpersonate,
                Target::Region {
                    region: &self.node.region,
                    kind: None,
                },
            )?;
            Principal {
                id: if req.as_principal.is_empty() {
                    principal.id.clone()
                } else {
                    req.as_principal
                },
                groups: req.as_groups,
                via: principal.via,
            }
        };
        let target = match &name {
            Some(name) => Target::Resource(name),
            None => Target::Region {
                region: &self.node.region,
                kind: None,
            },
        };
        let decision = self.node.authorizer.decide(&subject, verb, target);
        Ok(Response::new(v1::CanIResponse {
            allowed: decision.allowed,
            rule: decision.rule,
            principal: subject.id,
            region: self.node.region.to_string(),
        }))
    }
}

pub(crate) use purge::{purge_part, PURGE_BUDGET};

fn region_status(r: RegionStatus) -> v1::RegionStatus {
    v1::RegionStatus {
        region: r.region,
        address: r.address,
        reachable: r.unreachable.is_none(),
        error: r.unreachable.unwrap_or_default(),
        link_connected: r.link_connected,
        events_behind: r.events_behind,
        last_contact_ms: r.last_contact_ms,
        figures: r.figures.map(region_figures),
        protocol_version: r.protocol_version,
    }
}

/// This region's figures on the wire (also `Peer.RegionFigures`).
pub(crate) fn region_figures(f: RegionFigures) -> v1::RegionFigures {
    v1::RegionFigures {
        resources_creating: f.resources_creating,
        resources_active: f.resources_active,
        resources_deleting: f.resources_deleting,
        deletions_pending: f.deletions_pending,
        deletions_blocked: f.deletions_blocked,
        deletions_waiting: f.deletions_waiting,
        deletions_failed: f.deletions_failed,
        oldest_deletion_age_ms: f.oldest_deletion_age_ms,
        last_revision: f.last_revision,
        truncated: f.truncated,
        protocol_version: f.protocol_version,
        binary_version: f.binary_version,
        nodes: f
            .nodes
            .into_iter()
            .map(|n| v1::RegionNode {
                role: if n.writer { "writer" } else { "standby" }.to_owned(),
                node: n.node,
                address: n.address,
                binary_version: n.binary_version,
                last_seen_ms: n.last_seen_ms,
            })
            .collect(),
        writer_epoch: f.writer_epoch,
        authentication: f.authentication,
        schema_version: f.schema_version,
        schema_label: f.schema_label,
    }
}
