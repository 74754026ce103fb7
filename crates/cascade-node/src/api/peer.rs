//! `cascade.v1.Peer`, what other regions' nodes call on this one: an
//! adapter around [`Node`] that also decides who may call what (with mutual
//! TLS, a region acts only as itself).
//!
//! Versions: a watcher's call says which protocol version it speaks
//! (metadata `cascade-protocol-version`, none: version 1); its Watch and
//! Ack note it as the version that region last announced, and a watcher
//! older than `cascade_proto::DELETION_FORCED_SINCE` is sent DELETING in
//! place of DELETION_FORCED (it would skip an event type it does not know).

use std::collections::BTreeSet;
use std::sync::Arc;

use cascade_core::model::EventType;
use cascade_core::{peer, BackRefKey, CoreError, RegionId, ResourceName, Uid};
use cascade_proto::bounds::{fit_page, Bounded};
use cascade_proto::convert;
use cascade_proto::status::{invalid_field, status_from_core, with_details};
use cascade_proto::v1::{self, peer_server::Peer, ErrorReason};
use tonic::{Request, Response, Status};
use tracing::{info_span, warn};

use crate::api::relay::{relayed_caller, Relayed};
use crate::api::stream::{outbox_stream, with_heartbeats, Sent};
use crate::api::{parse_name, parse_operation_id};
use crate::codec::EventHead;
use crate::error::Fault;
use crate::node::{LocalLookup, Node};
use crate::outbox::Watcher;
use crate::peers::WATCH_HEARTBEAT;

/// The Peer service over one node.
#[derive(Clone)]
pub(crate) struct PeerApi {
    pub(crate) node: Arc<Node>,
    /// Calls refused for acting in another region's name, or releasing
    /// another region's rows: a misconfigured or hostile peer repeats
    /// them on every call, so one line a window.
    pub(crate) refusals_logged: Arc<crate::log_throttle::Throttle>,
}

/// Lookup's NOT_FOUND, with the reason (absent, or DELETING) in the details.
fn not_found(name: &ResourceName, reason: ErrorReason, uid: &str) -> Status {
    let details = v1::ErrorDetails {
        reason: reason as i32,
        resource: Some(v1::ObjectRef {
            name: name.to_string(),
            uid: uid.to_owned(),
            dangling: false,
        }),
        ..Default::default()
    };
    with_details(tonic::Code::NotFound, format!("{name} not found"), &details)
}

impl PeerApi {
    /// A refusal for a schema this region does not have yet, with the
    /// version of the one it runs (which the core does not know).
    fn schema_unknown(&self, e: CoreError) -> Status {
        let e = match e {
            CoreError::SchemaUnknown { region, what, .. } => CoreError::SchemaUnknown {
                region,
                what,
                version: {
                    let v = self.node.schema_in_force.version();
                    match v.label {
                        Some(label) => format!("{} {label:?}", v.digest),
                        None => v.digest,
                    }
                },
            },
            other => other,
        };
        status_from_core(&e)
    }
}

/// The protocol version a call announced in its metadata; a caller that
/// announces none is a node before versions were announced: the oldest.
fn caller_version<T>(request: &Request<T>) -> u32 {
    cascade_proto::announced_version(
        request
            .metadata()
            .get(cascade_proto::PROTOCOL_VERSION_HEADER)
            .map(|v| v.as_bytes()),
    )
    .unwrap_or(cascade_proto::OLDEST_PROTOCOL_VERSION)
}

/// The event type a watcher of protocol `version` is sent for `event_type`:
/// DELETION_FORCED only from the version that applies it; before, DELETING
/// (which such a watcher applies, or skips as a replay), since it would
/// skip an event type it does not know, and the owner does not rely on it
/// (a force purge waits for every region holding a `block` referrer to
/// speak that version: `admin.rs`).
fn event_type_for(version: u32, event_type: EventType) -> EventType {
    match event_type {
        // To another region a soft-deleted resource is gone: its importers
        // drop their tombstone as for a purge (the owner itself refuses
        // any reference to it), whatever version they speak.
        EventType::SoftDeleted => EventType::Purged,
        EventType::DeletionForced if version < cascade_proto::DELETION_FORCED_SINCE => EventType::Deleting,
        other => other,
    }
}

fn from_region(raw: &str) -> Result<RegionId, Status> {
    RegionId::parse(raw).map_err(|e| invalid_field("from_region", e))
}

fn backrefs(list: Vec<v1::PeerBackRef>) -> Result<Vec<peer::PeerBackRef>, Status> {
    list.into_iter()
        .enumerate()
        .map(|(i, b)| convert::peer_backref_at(b, &|| format!("backrefs[{i}]")))
        .collect()
}

/// Who is calling, as far as the transport can tell.
enum Caller {
    /// Plain text: the region the request names is taken on trust.
    Unauthenticated,
    /// Mutual TLS: the region the client certificate names.
    Region(RegionId),
}

impl PeerApi {
    /// With mutual TLS on, every Peer call needs a client certificate that
    /// names a region (the CA already verified the chain at the handshake).
    /// A call a standby of this region relayed is from the region the
    /// standby read from its caller's certificate (`api/relay.rs`); that
    /// header counts from a node of this region only.
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        if !self.node.peer_auth {
            return Ok(Caller::Unauthenticated);
        }
        let chain = request.peer_certs().ok_or_else(|| {
            Status::unauthenticated("peer calls need a client certificate of a cascade region (mutual TLS)")
        })?;
        let certified = cascade_tls::peer_region(&chain)
            .map_err(|why| Status::unauthenticated(format!("client certificate {why}")))?;
        match relayed_caller(request.metadata(), &certified, &self.node.region) {
            Relayed::Direct(region) | Relayed::For(region) => Ok(Caller::Region(region)),
            Relayed::Anonymous => Err(Status::unauthenticated(format!(
                "peer calls need a client certificate of a cascade region (mutual TLS); the standby of {} \
                 that relayed this call was shown none",
                self.node.region
            ))),
            Relayed::Unreadable(quoted) => Err(Status::unauthenticated(format!(
                "a node of {} relayed this call for {quoted}, which is not a region",
                self.node.region
            ))),
        }
    }

    /// A region may attach, release, watch and acknowledge only as itself.
    fn authorize_as<T>(&self, request: &Request<T>, claimed: &RegionId, rpc: &str) -> Result<(), Status> {
        match self.caller(request)? {
            Caller::Region(actual) if actual != *claimed => {
                if let Some(more) = self.refusals_logged.admit() {
                    warn!(region = %self.node.region, caller = %actual, claimed = %claimed, rpc,
                        suppressed = more.count(), "refused a peer call made in another region's name{more}");
                }
                Err(Status::permission_denied(format!(
                    "{rpc}: the caller's certificate names region {actual}, not {claimed}"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Read-only peer calls: any certified region (or anyone, in plain text).
    fn authorize_any<T>(&self, request: &Request<T>) -> Result<(), Status> {
        self.caller(request).map(|_| ())
    }

    /// The keys a read-only question about back-references names (any
    /// certified region may ask), within the batch limit.
    fn backref_keys(&self, request: Request<v1::CheckBackrefsRequest>) -> Result<Vec<BackRefKey>, Status> {
        self.authorize_any(&request)?;
        let req = request.into_inner();
        self.limit(req.backrefs.len())?;
        Ok(backrefs(req.backrefs)?.iter().map(|b| b.key()).collect())
    }

    fn limit(&self, n: usize) -> Result<(), Status> {
        if n > self.node.limits.max_batch_create {
            return Err(invalid_field(
                "backrefs",
                format!("at most {} per call", self.node.limits.max_batch_create),
            ));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl Peer for PeerApi {
    /// A part of another region's Admin.Purge: that region may start a
    /// part only of its own purge (`root_region`, its certificate's).
    async fn purge_part(
        &self,
        request: Request<v1::PurgePartRequest>,
    ) -> Result<Response<v1::PurgePartResponse>, Status> {
        request.get_ref().check_bounds()?;
        if request.get_ref().root_region.is_empty() {
            self.authorize_any(&request)?;
        } else {
            let claimed =
                RegionId::parse(&request.get_ref().root_region).map_err(|e| invalid_field("root_region", e))?;
            self.authorize_as(&request, &claimed, "PurgePart")?;
        }
        let answer = crate::api::admin::purge_part(&self.node, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn budget_lease(
        &self,
        request: Request<v1::BudgetLeaseRequest>,
    ) -> Result<Response<v1::BudgetLeaseResponse>, Status> {
        request.get_ref().check_bounds()?;
        let region = from_region(&request.get_ref().from_region)?;
        self.authorize_as(&request, &region, "BudgetLease")?;
        let req = request.into_inner();
        let id = parse_operation_id(&req.operation_id, "operation_id")?;
        let grant = self.node.grant_budget(id, req.wanted).await?;
        Ok(Response::new(v1::BudgetLeaseResponse {
            granted: grant.granted,
            max_deletions: grant.max_deletions,
            used: grant.used,
        }))
    }

    async fn operation_control(
        &self,
        request: Request<v1::OperationControlRequest>,
    ) -> Result<Response<v1::OperationControlResponse>, Status> {
        request.get_ref().check_bounds()?;
        let (id, action, root) = crate::api::operation_control::peer_control(request.get_ref())?;
        // Only the root's region controls an operation's parts.
        match &root {
            Some(root) => {
                let region = RegionId::parse(root.name.region()).map_err(|e| invalid_field("root", e))?;
                self.authorize_as(&request, &region, "OperationControl")?;
            }
            None => self.authorize_any(&request)?,
        }
        let req = request.into_inner();
        let op = self
            .node
            .apply_peer_control(id, action, root, req.requested_by, req.reason)
            .await?;
        Ok(Response::new(v1::OperationControlResponse {
            state: convert::operation_state(&op) as i32,
        }))
    }

    async fn undelete_part(
        &self,
        request: Request<v1::UndeletePartRequest>,
    ) -> Result<Response<v1::UndeletePartResponse>, Status> {
        let ask = crate::api::undelete::peer_ask(request.get_ref())?;
        // Only the root's region drives an undelete's parts.
        let region = RegionId::parse(ask.root.name.region()).map_err(|e| invalid_field("root", e))?;
        self.authorize_as(&request, &region, "UndeletePart")?;
        // Its Lookups within the deadline the root's region gave the part.
        let deadline = crate::api::forward::deadline_of(request.metadata());
        let answer = self.node.undelete_part_here(ask, &deadline).await?;
        Ok(Response::new(crate::api::undelete::peer_answer(&answer)))
    }

    async fn region_figures(
        &self,
        request: Request<v1::RegionFiguresRequest>,
    ) -> Result<Response<v1::RegionFigures>, Status> {
        request.get_ref().check_bounds()?;
        self.authorize_any(&request)?;
        let figures = self.node.region_figures()?;
        Ok(Response::new(crate::api::admin::region_figures(figures)))
    }

    async fn explain_part(
        &self,
        request: Request<v1::ExplainPartRequest>,
    ) -> Result<Response<v1::ExplainPartResponse>, Status> {
        request.get_ref().check_bounds()?;
        self.authorize_any(&request)?;
        let op = parse_operation_id(&request.get_ref().operation_id, "operation_id")?;
        let part = self.node.explain_part(op)?;
        Ok(Response::new(v1::ExplainPartResponse {
            deletions: part
                .parts
                .iter()
                .map(|p| convert::resource(&p.resource, Some(&p.record), &BTreeSet::new()))
                .collect(),
            truncated: part.truncated,
            root: part.root.as_ref().map(convert::object_ref),
        }))
    }

    async fn lookup(&self, request: Request<v1::LookupRequest>) -> Result<Response<v1::ObjectRef>, Status> {
        request.get_ref().check_bounds()?;
        self.authorize_any(&request)?;
        let name = parse_name(&request.into_inner().name, "name")?;
        peer::known_kind(&self.node.schema(), &self.node.region, name.kind()).map_err(|e| self.schema_unknown(e))?;
        match self.node.lookup_local(&name)? {
            LocalLookup::Live(uid) => Ok(Response::new(v1::ObjectRef {
                name: name.to_string(),
                uid: uid.to_string(),
                dangling: false,
            })),
            // Seed 000: to another region, a DELETING resource is already
            // gone (NOT_FOUND). The details still say DELETING, so a node
            // resolving a reference for a client can tell it "is being
            // deleted", as this region tells its own clients.
            LocalLookup::Deleting(uid) => Err(not_found(&name, ErrorReason::Deleting, &uid.to_string())),
            LocalLookup::Absent => Err(not_found(&name, ErrorReason::NotFound, "")),
        }
    }

    async fn attach(&self, request: Request<v1::AttachRequest>) -> Result<Response<v1::AttachResponse>, Status> {
        request.get_ref().check_bounds()?;
        let from = from_region(&request.get_ref().from_region)?;
        self.authorize_as(&request, &from, "Attach")?;
        let req = request.into_inner();
        self.limit(req.backrefs.len())?;
        let entries = backrefs(req.backrefs)?;
        let attached = match self.node.attach(from, entries).await {
            Err(Fault::Refused(e @ CoreError::SchemaUnknown { .. })) => return Err(self.schema_unknown(e)),
            other => other?,
        };
        Ok(Response::new(v1::AttachResponse {
            attached: attached as u32,
        }))
    }

    async fn release(&self, request: Request<v1::ReleaseRequest>) -> Result<Response<v1::ReleaseResponse>, Status> {
        request.get_ref().check_bounds()?;
        let from = from_region(&request.get_ref().from_region)?;
        self.authorize_as(&request, &from, "Release")?;
        let req = request.into_inner();
        self.limit(req.backrefs.len())?;
        let entries = backrefs(req.backrefs)?;
        let report = self.node.release(from.clone(), entries).await?;
        if report.foreign > 0 {
            if let Some(more) = self.refusals_logged.admit() {
                warn!(region = %self.node.region, from = %from, refused = report.foreign,
                    suppressed = more.count(), "refused to release back-references of another region's referrers{more}");
            }
        }
        Ok(Response::new(v1::ReleaseResponse {
            released: report.released as u32,
            absent: report.absent as u32,
            stale: report.stale as u32,
            foreign: report.foreign as u32,
        }))
    }

    type WatchStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::PeerEvent, Status>> + Send>>;

    async fn watch(&self, request: Request<v1::PeerWatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        request.get_ref().check_bounds()?;
        let watcher = from_region(&request.get_ref().region)?;
        self.authorize_as(&request, &watcher, "Watch")?;
        let version = caller_version(&request);
        self.node.peers.heard_from(watcher.as_str(), version);
        let req = request.into_inner();
        let span = info_span!("peer_watch", region = %self.node.region, watcher = %watcher, from = req.from_revision);
        let node = self.node.clone();
        let stream = outbox_stream(
            self.node.feed(),
            req.from_revision,
            Watcher::Peer {
                region: watcher.to_string(),
            },
            |e: &EventHead<'_>| e.concerns_importers(),
            move |sent| {
                let e = match sent {
                    // The importer moves its cursor there: nothing it was
                    // not sent up to it concerns it.
                    Sent::PassedThrough(revision) => {
                        return Some(v1::PeerEvent {
                            heartbeat: true,
                            revision,
                            ..Default::default()
                        })
                    }
                    Sent::Event(e) => e,
                };
                Some(v1::PeerEvent {
                    traceparent: node.trace_marks.of(e.revision).unwrap_or_default(),
                    revision: e.revision,
                    r#type: convert::event_type(event_type_for(version, e.event_type)) as i32,
                    resource: Some(convert::object_ref(&e.resource)),
                    operation_id: e.operation.map(|o| o.to_string()).unwrap_or_default(),
                    no_cascade: e.no_cascade,
                    heartbeat: false,
                    // Vouched by this region to importers (the stream is
                    // region-certified); anonymous is left out.
                    principal: (e.principal != cascade_core::auth::Principal::anonymous())
                        .then(|| crate::api::principal::to_wire(&e.principal)),
                    retain_ms: e.retain_ms,
                })
            },
            span,
        );
        let stream = with_heartbeats(stream, WATCH_HEARTBEAT, || v1::PeerEvent {
            heartbeat: true,
            ..Default::default()
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn check_backrefs(
        &self,
        request: Request<v1::CheckBackrefsRequest>,
    ) -> Result<Response<v1::CheckBackrefsResponse>, Status> {
        request.get_ref().check_bounds()?;
        let keys = self.backref_keys(request)?;
        let standing = self.node.standing(&keys)?;
        Ok(Response::new(v1::CheckBackrefsResponse { standing }))
    }

    async fn plan(&self, request: Request<v1::PeerPlanRequest>) -> Result<Response<v1::Plan>, Status> {
        request.get_ref().check_bounds()?;
        self.authorize_any(&request)?;
        let req = request.into_inner();
        let seeds = req
            .seeds
            .into_iter()
            .map(|s| convert::ref_target(Some(s), "seeds"))
            .collect::<Result<Vec<_>, _>>()?;
        // Vouched by the asking region (only a certified region gets here):
        // this region decides on its own members for that principal.
        let principal = match req.principal {
            Some(wire) => crate::api::principal::from_wire(wire)
                .ok_or_else(|| cascade_proto::status::invalid_field("principal.via", "names no known means"))?,
            None => cascade_core::auth::Principal::anonymous(),
        };
        let plan = self.node.plan_part(seeds, req.cascade, &principal)?;
        Ok(Response::new(convert::plan(&plan)))
    }

    async fn operation_part(
        &self,
        request: Request<v1::GetOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        request.get_ref().check_bounds()?;
        self.authorize_any(&request)?;
        let req = request.into_inner();
        let id = parse_operation_id(&req.id, "id")?;
        let after = if req.outcomes_page_token.is_empty() {
            None
        } else {
            Some(parse_name(&req.outcomes_page_token, "outcomes_page_token")?)
        };
        let page = self
            .node
            .local_operation(id, req.outcomes_page_size as usize, after.as_ref())?;
        let next = page.next.as_ref().map(ResourceName::to_string).unwrap_or_default();
        let mut part = convert::operation(&page.operation, &page.outcomes, next);
        if fit_page(&mut part.outcomes, self.node.limits.page_bytes()) {
            // The part's own token: the last outcome's resource name.
            part.next_outcomes_page_token = part
                .outcomes
                .last()
                .and_then(|o| o.resource.as_ref())
                .map(|r| r.name.clone())
                .unwrap_or_default();
        }
        Ok(Response::new(part))
    }

    async fn ack(&self, request: Request<v1::AckRequest>) -> Result<Response<v1::AckResponse>, Status> {
        request.get_ref().check_bounds()?;
        let region = from_region(&request.get_ref().region)?;
        // An acknowledgement lets the owner compact its outbox: only the watcher itself may give it.
        self.authorize_as(&request, &region, "Ack")?;
        self.node.peers.heard_from(region.as_str(), caller_version(&request));
        let first_retained = self.node.record_ack(&region, request.into_inner().revision)?;
        Ok(Response::new(v1::AckResponse { first_retained }))
    }

    async fn list_deleting(
        &self,
        request: Request<v1::ListDeletingRequest>,
    ) -> Result<Response<v1::ListDeletingResponse>, Status> {
        request.get_ref().check_bounds()?;
        let region = from_region(&request.get_ref().region)?;
        self.authorize_any(&request)?;
        let req = request.into_inner();
        let after = if req.page_token.is_empty() {
            None
        } else {
            Some(Uid::parse(&req.page_token).map_err(|_| invalid_field("page_token", "not a token this API issued"))?)
        };
        // 0 asks for every entry at once (a node that does not page).
        let page_size = match req.page_size {
            0 => 0,
            n => (n as usize).min(self.node.limits.max_page_size),
        };
        let page = self.node.deleting_for(&region, after, page_size)?;
        let mut deleting: Vec<v1::DeletingEntry> = page
            .deleting
            .iter()
            .map(|d| v1::DeletingEntry {
                resource: Some(convert::object_ref(&d.target)),
                operation_id: d.operation.to_string(),
                no_cascade: d.no_cascade,
                forced: d.forced,
                // Whom the deletion acts for, as its DELETING event says: a
                // watcher resyncing from this listing acts for it too.
                principal: (d.principal != cascade_core::auth::Principal::anonymous())
                    .then(|| crate::api::principal::to_wire(&d.principal)),
                retain_ms: d.retain_ms,
            })
            .collect();
        let mut next_page_token = page.next.map(|u| u.to_string()).unwrap_or_default();
        // Not cut to the byte budget when asked with 0: such a caller reads
        // no token, and would take a cut page for the whole listing. Its
        // answer is bounded only by max_message_bytes, and one larger
        // fails to encode: an error, not a listing silently incomplete.
        if page_size > 0 && fit_page(&mut deleting, self.node.limits.page_bytes()) {
            // The token is the last uid the page holds.
            next_page_token = deleting
                .last()
                .and_then(|d| d.resource.as_ref())
                .map(|r| r.uid.clone())
                .unwrap_or_default();
        }
        Ok(Response::new(v1::ListDeletingResponse {
            deleting,
            revision: page.revision,
            next_page_token,
        }))
    }

    async fn keeps_another_target(
        &self,
        request: Request<v1::CheckBackrefsRequest>,
    ) -> Result<Response<v1::CheckBackrefsResponse>, Status> {
        request.get_ref().check_bounds()?;
        let keys = self.backref_keys(request)?;
        let standing = self.node.keeps_another_target(&keys)?;
        Ok(Response::new(v1::CheckBackrefsResponse { standing }))
    }

    async fn dump(&self, request: Request<v1::DumpRequest>) -> Result<Response<v1::DumpResponse>, Status> {
        request.get_ref().check_bounds()?;
        // The whole region's state: certified regions only (`cascade check` runs with a node's identity).
        self.authorize_any(&request)?;
        let dump = self.node.dump().await?;
        Ok(Response::new(v1::DumpResponse {
            region: self.node.region.to_string(),
            resources: dump
                .resources
                .iter()
                .map(|v| convert::resource(&v.resource, v.record.as_ref(), &v.dangling))
                .collect(),
            backrefs: dump.backrefs.iter().map(convert::backref_row).collect(),
            pending_releases: dump.pending_releases as u64,
            queued_work: dump.queued_work as u64,
            pending_attach: dump.pending_attach as u64,
            remote_deletions: dump
                .remote_deletions
                .iter()
                .map(|r| convert::object_ref(&r.target))
                .collect(),
            cursors: dump.cursors.into_iter().collect(),
            last_revision: dump.last_revision,
        }))
    }
}
