//! `cascade.v1.Peer`: what other regions' nodes call on this one.

use cascade_core::model::{EventType, ResourceState};
use cascade_core::{peer, BackRefKey, Ctx, OperationId, RegionId, ResourceName};
use cascade_proto::convert;
use cascade_proto::status::{invalid_field, storage_unavailable, with_details};
use cascade_proto::status_from_core;
use cascade_proto::v1::{self, peer_server::Peer, ErrorReason};
use tonic::{Request, Response, Status};
use tracing::{info_span, warn};

use crate::codec::StoreState;
use crate::service::ResourcesService;
use crate::store::Table;
use crate::stream::outbox_stream;

/// Shares the node's store, writer and feed with the client API.
#[derive(Clone)]
pub struct PeerService {
    pub(crate) node: ResourcesService,
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

fn from_region(raw: &str) -> Result<RegionId, Status> {
    RegionId::parse(raw).map_err(|e| invalid_field("from_region", e))
}

fn backrefs(list: Vec<v1::PeerBackRef>) -> Result<Vec<peer::PeerBackRef>, Status> {
    list.into_iter()
        .enumerate()
        .map(|(i, b)| convert::peer_backref_from(b, &format!("backrefs[{i}]")))
        .collect()
}

/// Who is calling, as far as the transport can tell.
enum Caller {
    /// Plain text: the region the request names is taken on trust.
    Unauthenticated,
    /// Mutual TLS: the region the client certificate names.
    Region(RegionId),
}

impl PeerService {
    /// With mutual TLS on, every Peer call needs a client certificate that
    /// names a region (the CA already verified the chain at the handshake).
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        if !self.node.peer_auth {
            return Ok(Caller::Unauthenticated);
        }
        let chain = request.peer_certs().ok_or_else(|| {
            Status::unauthenticated("peer calls need a client certificate of a cascade region (mutual TLS)")
        })?;
        match cascade_tls::peer_region(&chain) {
            Ok(region) => Ok(Caller::Region(region)),
            Err(why) => Err(Status::unauthenticated(format!("client certificate {why}"))),
        }
    }

    /// A region may attach, release, watch and acknowledge only as itself.
    fn authorize_as<T>(&self, request: &Request<T>, claimed: &RegionId, rpc: &str) -> Result<(), Status> {
        match self.caller(request)? {
            Caller::Region(actual) if actual != *claimed => {
                warn!(region = %self.node.region, caller = %actual, claimed = %claimed, rpc,
                    "refused a peer call made in another region's name");
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
impl Peer for PeerService {
    async fn lookup(&self, request: Request<v1::LookupRequest>) -> Result<Response<v1::ObjectRef>, Status> {
        self.authorize_any(&request)?;
        let name = ResourceName::parse(&request.into_inner().name).map_err(|e| invalid_field("name", e))?;
        let found = StoreState {
            store: self.node.store.as_ref(),
        }
        .get_resource(&name)
        .map_err(storage_unavailable)?;
        match found {
            Some(r) if r.state == ResourceState::Active => Ok(Response::new(v1::ObjectRef {
                name: r.name.to_string(),
                uid: r.uid.to_string(),
                dangling: false,
            })),
            // Seed 000: to another region, a DELETING resource is already
            // gone (NOT_FOUND). The details still say DELETING, so a node
            // resolving a reference for a client can tell it "is being
            // deleted", as this region tells its own clients.
            Some(r) if r.state == ResourceState::Deleting => {
                Err(not_found(&name, ErrorReason::Deleting, &r.uid.to_string()))
            }
            _ => Err(not_found(&name, ErrorReason::NotFound, "")),
        }
    }

    async fn attach(&self, request: Request<v1::AttachRequest>) -> Result<Response<v1::AttachResponse>, Status> {
        let from = from_region(&request.get_ref().from_region)?;
        self.authorize_as(&request, &from, "Attach")?;
        let req = request.into_inner();
        self.limit(req.backrefs.len())?;
        let entries = backrefs(req.backrefs)?;
        let attached = self
            .node
            .writer
            .apply(move |s, c, _| peer::attach(s, c, from.as_str(), entries))
            .await
            .map_err(storage_unavailable)?
            .map_err(|e| status_from_core(&e))?;
        Ok(Response::new(v1::AttachResponse {
            attached: attached as u32,
        }))
    }

    async fn release(&self, request: Request<v1::ReleaseRequest>) -> Result<Response<v1::ReleaseResponse>, Status> {
        let from = from_region(&request.get_ref().from_region)?;
        self.authorize_as(&request, &from, "Release")?;
        let req = request.into_inner();
        self.limit(req.backrefs.len())?;
        let entries = backrefs(req.backrefs)?;
        let caller = from.clone();
        let report = self
            .node
            .writer
            .apply(move |s, c, _| peer::release(s, c, Some(caller.as_str()), entries))
            .await
            .map_err(storage_unavailable)?
            .map_err(|e| status_from_core(&e))?;
        if report.foreign > 0 {
            warn!(region = %self.node.region, from = %from, refused = report.foreign,
                "refused to release back-references of another region's referrers");
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
        let watcher = from_region(&request.get_ref().region)?;
        self.authorize_as(&request, &watcher, "Watch")?;
        let req = request.into_inner();
        let span = info_span!("peer_watch", region = %self.node.region, watcher = %watcher, from = req.from_revision);
        let stream = outbox_stream(
            self.node.feed(),
            req.from_revision,
            |e| matches!(e.event_type, EventType::Deleting | EventType::Purged),
            |e| v1::PeerEvent {
                revision: e.revision,
                r#type: convert::event_type(e.event_type) as i32,
                resource: Some(convert::object_ref(&e.resource)),
                operation_id: e.operation.map(|o| o.to_string()).unwrap_or_default(),
                no_cascade: e.no_cascade,
            },
            span,
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn check_backrefs(
        &self,
        request: Request<v1::CheckBackrefsRequest>,
    ) -> Result<Response<v1::CheckBackrefsResponse>, Status> {
        let keys = self.backref_keys(request)?;
        let standing = peer::standing(
            &StoreState {
                store: self.node.store.as_ref(),
            },
            &keys,
        )
        .map_err(storage_unavailable)?;
        Ok(Response::new(v1::CheckBackrefsResponse { standing }))
    }

    async fn plan(&self, request: Request<v1::PeerPlanRequest>) -> Result<Response<v1::Plan>, Status> {
        self.authorize_any(&request)?;
        let req = request.into_inner();
        let seeds = req
            .seeds
            .into_iter()
            .map(|s| convert::ref_target(Some(s), "seeds"))
            .collect::<Result<Vec<_>, _>>()?;
        let plan = self.node.plan_part(seeds, req.cascade)?;
        Ok(Response::new(convert::plan(&plan)))
    }

    async fn operation_part(
        &self,
        request: Request<v1::GetOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        self.authorize_any(&request)?;
        let req = request.into_inner();
        let id = OperationId::parse(&req.id).map_err(|e| invalid_field("id", e))?;
        Ok(Response::new(self.node.local_operation(
            id,
            req.outcomes_page_size as usize,
            &req.outcomes_page_token,
        )?))
    }

    async fn ack(&self, request: Request<v1::AckRequest>) -> Result<Response<v1::AckResponse>, Status> {
        let region = from_region(&request.get_ref().region)?;
        // An acknowledgement lets the owner compact its outbox: only the watcher itself may give it.
        self.authorize_as(&request, &region, "Ack")?;
        let req = request.into_inner();
        if let Ok(mut acks) = self.node.acks.lock() {
            let slot = acks.entry(region.to_string()).or_default();
            *slot = (*slot).max(req.revision);
        }
        let first_retained = self.node.state().outbox_floor().map_err(storage_unavailable)?;
        Ok(Response::new(v1::AckResponse { first_retained }))
    }

    async fn list_deleting(
        &self,
        request: Request<v1::ListDeletingRequest>,
    ) -> Result<Response<v1::ListDeletingResponse>, Status> {
        let region = from_region(&request.get_ref().region)?;
        self.authorize_any(&request)?;
        let state = self.node.state();
        let unavailable = storage_unavailable::<crate::store::StoreError>;
        // The revision first: events after it are streamed anyway, and
        // applying one twice is harmless.
        let revision = state.next_revision_stored().map_err(unavailable)?.saturating_sub(1);
        let deletions: Vec<cascade_core::DeletionRecord> =
            state.all(Table::Deletions, usize::MAX).map_err(unavailable)?;
        let mut deleting = Vec::new();
        for d in deletions {
            let rows = state.backrefs_of(d.target.uid).map_err(unavailable)?;
            if rows.iter().any(|r| r.referrer.name.region() == region.as_str()) {
                let no_cascade = state
                    .get_operation(d.operation)
                    .map_err(unavailable)?
                    .is_some_and(|op| !op.cascade);
                deleting.push(v1::DeletingEntry {
                    resource: Some(convert::object_ref(&d.target)),
                    operation_id: d.operation.to_string(),
                    no_cascade,
                });
            }
        }
        Ok(Response::new(v1::ListDeletingResponse { deleting, revision }))
    }

    async fn keeps_another_target(
        &self,
        request: Request<v1::CheckBackrefsRequest>,
    ) -> Result<Response<v1::CheckBackrefsResponse>, Status> {
        let keys = self.backref_keys(request)?;
        let state = self.node.state();
        let standing = peer::keeps_another_target(&state, read_ctx(&self.node, self.node.clock.now()), &keys)
            .map_err(|e| status_from_core(&e))?;
        Ok(Response::new(v1::CheckBackrefsResponse { standing }))
    }

    async fn dump(&self, request: Request<v1::DumpRequest>) -> Result<Response<v1::DumpResponse>, Status> {
        // The whole region's state: certified regions only (`cascade check` runs with a node's identity).
        self.authorize_any(&request)?;
        let state = StoreState {
            store: self.node.store.as_ref(),
        };
        let unavailable = storage_unavailable::<crate::store::StoreError>;
        const MAX: usize = 1_000_000;
        let resources: Vec<cascade_core::Resource> = state.all(Table::Resources, MAX).map_err(unavailable)?;
        let rows: Vec<cascade_core::BackRef> = state.all(Table::Backrefs, MAX).map_err(unavailable)?;
        let remote: Vec<cascade_core::RemoteDeletion> = state.all(Table::RemoteDeletions, MAX).map_err(unavailable)?;
        let mut out = v1::DumpResponse {
            region: self.node.region.to_string(),
            backrefs: rows.iter().map(convert::backref_row).collect(),
            pending_releases: state.count(Table::PendingReleases).map_err(unavailable)? as u64,
            queued_work: state.count(Table::RetryQueue).map_err(unavailable)? as u64,
            pending_attach: state.count(Table::PendingAttach).map_err(unavailable)? as u64,
            remote_deletions: remote.iter().map(|r| convert::object_ref(&r.target)).collect(),
            cursors: state.cursors().map_err(unavailable)?.into_iter().collect(),
            last_revision: state.next_revision_stored().map_err(unavailable)?.saturating_sub(1),
            ..Default::default()
        };
        // Marked as Get marks them, so the checker sees what a reader sees.
        let mut owners = std::collections::BTreeMap::new();
        for r in &resources {
            let mut view = self.node.present(r)?;
            self.node.mark_remote_dangling(r, &mut view, &mut owners).await;
            out.resources.push(view);
        }
        Ok(Response::new(out))
    }
}

/// A read-only protocol context for queries served outside the writer.
pub(crate) fn read_ctx<'a>(node: &'a ResourcesService, now: cascade_core::Timestamp) -> Ctx<'a> {
    Ctx {
        schema: &node.schema,
        region: &node.region,
        now,
        policy: &node.policy,
    }
}
