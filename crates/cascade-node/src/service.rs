//! The client API (`cascade.v1.Resources`): decodes requests, sends writes
//! to the writer, serves reads straight from the store, streams events.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;

use cascade_core::model::{Event, Resource, ResourceState};
use cascade_core::protocol::{DeleteOutcome, ResourceSpec};
use cascade_core::{CoreError, OperationId, RegionId, ResourceName, Schema, Uid};
use cascade_proto::convert;
use cascade_proto::status::{invalid_field, storage_unavailable};
use cascade_proto::status_from_core;
use cascade_proto::v1::resources_client::ResourcesClient;
use cascade_proto::v1::{self, resources_server::Resources};
use futures::Stream;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::{info_span, Instrument};

use crate::clock::Clock;
use crate::codec::StoreState;
use crate::forward::{call_owner, FORWARD_TIMEOUT};
use crate::peers::Peers;
use crate::store::{Store, StoreError, Table};
use crate::stream::{outbox_stream, OutboxFeed};
use crate::writer::{WriterHandle, WriterUnavailable};

/// Limits that protect the node from oversized requests.
#[derive(Debug, Clone)]
pub struct ApiLimits {
    /// Largest gRPC message either way (server and the node's own peer clients).
    pub max_message_bytes: usize,
    /// Resources per BatchCreate; back-references per peer call.
    pub max_batch_create: usize,
    pub default_page_size: usize,
    pub max_page_size: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: cascade_proto::MAX_MESSAGE_BYTES,
            max_batch_create: 1_000,
            default_page_size: 100,
            max_page_size: 1_000,
        }
    }
}

#[derive(Clone)]
pub struct ResourcesService {
    pub(crate) region: RegionId,
    pub(crate) schema: Arc<Schema>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) writer: WriterHandle,
    /// Committed events, fanned out to Watch and WatchOperation streams.
    pub(crate) events: broadcast::Sender<Arc<Event>>,
    pub(crate) limits: ApiLimits,
    /// Peer calls must come from a certified region, acting as itself (mutual TLS is on).
    pub(crate) peer_auth: bool,
    /// Flips to true when the node shuts down, so long-lived streams end
    /// and graceful shutdown does not wait on watchers forever.
    pub(crate) shutting_down: tokio::sync::watch::Receiver<bool>,
    /// Tunables for the read-only protocol queries served here (dry runs).
    pub(crate) policy: cascade_core::Policy,
    /// The other regions: forwarding, cross-region attach, aggregation.
    pub(crate) peers: Peers,
    pub(crate) clock: Arc<dyn Clock>,
    /// Peer region → the last revision of our outbox it acknowledged
    /// (in memory: after a restart nothing is compacted until all re-ack).
    pub(crate) acks: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>,
    /// Outbox events always kept, whatever the peers acknowledged (client
    /// watchers resume from them too).
    pub(crate) outbox_retention: u64,
    /// Roots waiting for other regions' parts of their operation.
    pub(crate) closure_checks: crate::writer::ClosureChecks,
}

/// What a remote target's owner said about it (see
/// [`ResourcesService::mark_remote_dangling`]).
pub(crate) enum RemoteLookup {
    /// It lives, with this uid.
    Found(String),
    Gone,
    /// The owner could not be asked.
    Unknown,
}

type Stream2<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

pub(crate) fn store_status(e: StoreError) -> Status {
    storage_unavailable(e)
}

pub(crate) fn writer_status(e: WriterUnavailable) -> Status {
    storage_unavailable(e)
}

pub(crate) fn core_status(e: CoreError) -> Status {
    status_from_core(&e)
}

pub(crate) fn parse_name(raw: &str, field: &str) -> Result<ResourceName, Status> {
    ResourceName::parse(raw).map_err(|e| invalid_field(field, e))
}

fn parse_operation_id(raw: &str) -> Result<OperationId, Status> {
    OperationId::parse(raw).map_err(|e| invalid_field("id", e))
}

impl ResourcesService {
    /// Decodes a spec, naming a bad target uid as the core names targets
    /// (`refs.network.uid`, `refs.ports[0].uid`).
    pub(crate) fn decode_spec(&self, spec: v1::ResourceSpec, field: &str) -> Result<ResourceSpec, Status> {
        let kind = ResourceName::parse(&spec.name).map(|n| n.kind().to_owned()).ok();
        let many = |f: &str| match &kind {
            Some(kind) => self.schema.reference(kind, f).is_none_or(|r| r.many),
            None => true,
        };
        convert::resource_spec_with(spec, field, &many)
    }

    pub(crate) fn feed(&self) -> OutboxFeed {
        OutboxFeed {
            store: self.store.clone(),
            live: self.events.subscribe(),
            shutting_down: self.shutting_down.clone(),
        }
    }

    pub(crate) fn state(&self) -> StoreState<'_> {
        StoreState {
            store: self.store.as_ref(),
        }
    }

    /// The outbox may be compacted below this revision: every peer has
    /// acknowledged it, and the retention floor allows it.
    pub(crate) fn compactable_below(&self) -> Option<u64> {
        let next = self.state().next_revision_stored().ok()?;
        let keep_from = next.saturating_sub(self.outbox_retention);
        let acks = self.acks.lock().ok()?;
        let mut lowest = u64::MAX;
        for region in self.peers.regions() {
            lowest = lowest.min(*acks.get(region)?);
        }
        Some(lowest.saturating_add(1).min(keep_from))
    }

    /// None for a name of this region; the owner's client for a peer's;
    /// INVALID_ARGUMENT naming `field` for a region that is not part of the
    /// cluster.
    pub(crate) fn route(
        &self,
        name: &ResourceName,
        field: &str,
    ) -> Result<Option<(String, ResourcesClient<Channel>)>, Status> {
        if name.region() == self.region.as_str() {
            return Ok(None);
        }
        if !self.peers.knows(name.region()) {
            let refused = CoreError::WrongRegion {
                name: name.clone(),
                region: name.region().to_owned(),
                local: format!(
                    "{} (peers: {})",
                    self.region,
                    self.peers.regions().collect::<Vec<_>>().join(", ")
                ),
            };
            return Err(invalid_field(field, refused));
        }
        let owner = self.peers.resources(name.region()).map_err(core_status)?;
        Ok(Some((name.region().to_owned(), owner)))
    }

    /// The wire form of a resource, with its deletion record and dangling marks.
    pub(crate) fn present(&self, r: &Resource) -> Result<v1::Resource, Status> {
        let state = self.state();
        let record = if r.state == ResourceState::Deleting {
            state.get_deletion(r.uid).map_err(store_status)?
        } else {
            None
        };
        let mut dangling = BTreeSet::<Uid>::new();
        for (field, targets) in &r.refs {
            let tracked = self
                .schema
                .reference(r.kind(), field)
                .is_some_and(|s| s.on_delete.tracked());
            if tracked {
                continue;
            }
            for t in targets {
                let gone = if t.name.region() == self.region.as_str() {
                    !state.uid_exists(t.uid).map_err(store_status)?
                } else {
                    // A remote target: gone once its owner reported it
                    // deleting. (Get also asks the owner; see `get`.)
                    state.remote_deletion_of(t.uid).map_err(store_status)?
                };
                if gone {
                    dangling.insert(t.uid);
                }
            }
        }
        Ok(convert::resource(r, record.as_ref(), &dangling))
    }

    /// Asks the owners of remote `allow_dangling` targets whether they still
    /// exist (the incarnation named). An owner that cannot be asked leaves
    /// the mark as the local view had it. `owners` remembers the answers
    /// within one request, so a page (or a dump) asks once per target.
    ///
    /// Needed because the local view alone cannot tell: the tombstone of a
    /// remote deletion goes with its PURGED event, after which a remote
    /// target that is gone looks like one that lives. (The simulation found
    /// List and Dump reporting such references as not dangling.)
    pub(crate) async fn mark_remote_dangling(
        &self,
        r: &Resource,
        view: &mut v1::Resource,
        owners: &mut BTreeMap<String, RemoteLookup>,
    ) {
        for field in &mut view.refs {
            let tracked = self
                .schema
                .reference(r.kind(), &field.field)
                .is_none_or(|s| s.on_delete.tracked());
            if tracked {
                continue;
            }
            for t in &mut field.targets {
                if t.dangling || t.name.starts_with(&format!("{}/", self.region)) {
                    continue;
                }
                if !owners.contains_key(&t.name) {
                    let answer = self.lookup_remote(&t.name).await;
                    owners.insert(t.name.clone(), answer);
                }
                match owners.get(&t.name) {
                    Some(RemoteLookup::Found(uid)) => t.dangling = *uid != t.uid,
                    Some(RemoteLookup::Gone) => t.dangling = true,
                    Some(RemoteLookup::Unknown) | None => {}
                }
            }
        }
    }

    async fn lookup_remote(&self, name: &str) -> RemoteLookup {
        let Some(region) = name.split('/').next() else {
            return RemoteLookup::Unknown;
        };
        let Ok(mut peer) = self.peers.peer(region) else {
            return RemoteLookup::Unknown;
        };
        let lookup = peer.lookup(v1::LookupRequest { name: name.to_owned() });
        match tokio::time::timeout(Duration::from_secs(2), lookup).await {
            Ok(Ok(found)) => RemoteLookup::Found(found.into_inner().uid),
            Ok(Err(s)) if s.code() == tonic::Code::NotFound => RemoteLookup::Gone,
            _ => RemoteLookup::Unknown,
        }
    }

    /// This region's part of an operation.
    pub(crate) fn local_operation(
        &self,
        id: OperationId,
        page_size: usize,
        page_token: &str,
    ) -> Result<v1::Operation, Status> {
        let state = self.state();
        let op = state
            .get_operation(id)
            .map_err(store_status)?
            .ok_or_else(|| core_status(CoreError::OperationNotFound(id.to_string())))?;
        let after = if page_token.is_empty() {
            None
        } else {
            Some(parse_name(page_token, "outcomes_page_token")?)
        };
        let page_size = page_size.min(self.limits.max_page_size);
        let outcomes = if page_size == 0 {
            Vec::new()
        } else {
            state
                .outcomes(id, after.as_ref(), page_size + 1)
                .map_err(store_status)?
        };
        let (outcomes, next) = if outcomes.len() > page_size {
            let next = outcomes[page_size - 1].resource.name.to_string();
            (outcomes[..page_size].to_vec(), next)
        } else {
            (outcomes, String::new())
        };
        Ok(convert::operation(&op, &outcomes, next))
    }
}

#[tonic::async_trait]
impl Resources for ResourcesService {
    async fn create(&self, request: Request<v1::CreateRequest>) -> Result<Response<v1::Resource>, Status> {
        let raw = request.into_inner();
        let spec = raw
            .resource
            .clone()
            .ok_or_else(|| invalid_field("resource", "is required"))?;
        if let Some((region, mut owner)) = self.route(&parse_name(&spec.name, "name")?, "name")? {
            let created = call_owner(&region, "Create", FORWARD_TIMEOUT, owner.create(raw)).await?;
            return Ok(Response::new(created));
        }
        let spec = self.decode_spec(spec, "")?;
        let mut created = self.create_flow(vec![spec]).await?;
        let r = created
            .pop()
            .ok_or_else(|| Status::internal("create returned nothing"))?;
        Ok(Response::new(self.present(&r)?))
    }

    async fn batch_create(
        &self,
        request: Request<v1::BatchCreateRequest>,
    ) -> Result<Response<v1::BatchCreateResponse>, Status> {
        let specs = request.into_inner().resources;
        if specs.is_empty() || specs.len() > self.limits.max_batch_create {
            return Err(invalid_field(
                "resources",
                format!("must hold 1 to {} resources", self.limits.max_batch_create),
            ));
        }
        let mut regions = BTreeSet::new();
        for (i, spec) in specs.iter().enumerate() {
            regions.insert(
                parse_name(&spec.name, &format!("resources[{i}].name"))?
                    .region()
                    .to_owned(),
            );
        }
        if regions.len() > 1 {
            return Err(invalid_field(
                "resources",
                "a batch creates resources of one region (it is one transaction at their owner)",
            ));
        }
        if let Some(first) = specs.first() {
            if let Some((region, mut owner)) =
                self.route(&parse_name(&first.name, "resources[0].name")?, "resources[0].name")?
            {
                let call = owner.batch_create(v1::BatchCreateRequest { resources: specs });
                let created = call_owner(&region, "BatchCreate", FORWARD_TIMEOUT, call).await?;
                return Ok(Response::new(created));
            }
        }
        let specs = specs
            .into_iter()
            .enumerate()
            .map(|(i, s)| self.decode_spec(s, &format!("resources[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let created = self.create_flow(specs).await?;
        let resources = created.iter().map(|r| self.present(r)).collect::<Result<_, _>>()?;
        Ok(Response::new(v1::BatchCreateResponse { resources }))
    }

    async fn get(&self, request: Request<v1::GetRequest>) -> Result<Response<v1::Resource>, Status> {
        let raw = request.into_inner();
        let name = parse_name(&raw.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let found = call_owner(&region, "Get", FORWARD_TIMEOUT, owner.get(raw)).await?;
            return Ok(Response::new(found));
        }
        if self.schema.kind(name.kind()).is_none() {
            return Err(invalid_field(
                "name",
                format!("unknown kind {:?} in {name}", name.kind()),
            ));
        }
        let found = self.state().get_resource(&name).map_err(store_status)?;
        match found {
            Some(r) if r.state != ResourceState::Creating => {
                let mut view = self.present(&r)?;
                self.mark_remote_dangling(&r, &mut view, &mut BTreeMap::new()).await;
                Ok(Response::new(view))
            }
            _ => Err(core_status(CoreError::NotFound(name))),
        }
    }

    async fn list(&self, request: Request<v1::ListRequest>) -> Result<Response<v1::ListResponse>, Status> {
        let req = request.into_inner();
        let mut prefix = format!("{}/", self.region);
        if !req.kind.is_empty() {
            if self.schema.kind(&req.kind).is_none() {
                return Err(invalid_field("kind", format!("unknown kind {:?}", req.kind)));
            }
            prefix.push_str(&req.kind);
            prefix.push('/');
        }
        let state_filter = convert::resource_state_from(
            v1::ResourceState::try_from(req.state).map_err(|_| invalid_field("state", "unknown state"))?,
        );
        let page_size = match req.page_size as usize {
            0 => self.limits.default_page_size,
            n => n.min(self.limits.max_page_size),
        };
        let mut after = if req.page_token.is_empty() {
            None
        } else {
            Some(parse_name(&req.page_token, "page_token")?.to_string().into_bytes())
        };
        let mut out = Vec::new();
        let mut next = String::new();
        let mut owners = BTreeMap::new();
        'pages: loop {
            let page: Vec<(Vec<u8>, Vec<u8>)> = self
                .store
                .scan(Table::Resources, prefix.as_bytes(), after.as_deref(), 1024)
                .map_err(store_status)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            for (_, v) in page {
                #[allow(clippy::disallowed_methods)] // TODO(issue 9): route through the codec
                let r: Resource = serde_json::from_slice(&v)
                    .map_err(|e| Status::internal(format!("corrupt resource record: {e}")))?;
                if r.state == ResourceState::Creating || state_filter.is_some_and(|s| s != r.state) {
                    continue;
                }
                if out.len() == page_size {
                    next = out.last().map(|r: &v1::Resource| r.name.clone()).unwrap_or_default();
                    break 'pages;
                }
                let mut view = self.present(&r)?;
                self.mark_remote_dangling(&r, &mut view, &mut owners).await;
                out.push(view);
            }
        }
        Ok(Response::new(v1::ListResponse {
            resources: out,
            next_page_token: next,
        }))
    }

    async fn update(&self, request: Request<v1::UpdateRequest>) -> Result<Response<v1::Resource>, Status> {
        let req = request.into_inner();
        let spec = req
            .resource
            .clone()
            .ok_or_else(|| invalid_field("resource", "is required"))?;
        if let Some((region, mut owner)) = self.route(&parse_name(&spec.name, "name")?, "name")? {
            let updated = call_owner(&region, "Update", FORWARD_TIMEOUT, owner.update(req)).await?;
            return Ok(Response::new(updated));
        }
        let spec = self.decode_spec(spec, "")?;
        let etag = (!req.etag.is_empty()).then_some(req.etag);
        let r = self.update_flow(spec, etag).await?;
        Ok(Response::new(self.present(&r)?))
    }

    async fn delete(&self, request: Request<v1::DeleteRequest>) -> Result<Response<v1::DeleteResponse>, Status> {
        let raw = request.into_inner();
        if let Some((region, mut owner)) = self.route(&parse_name(&raw.name, "name")?, "name")? {
            let answer = call_owner(&region, "Delete", FORWARD_TIMEOUT, owner.delete(raw)).await?;
            return Ok(Response::new(answer));
        }
        let mut req = convert::delete_request(raw)?;
        if !req.cascade {
            req.remote_kept = self.remote_kept(&parse_name(&req.name, "name")?).await?;
        }
        let cascade = req.cascade;
        let outcome = self
            .writer
            .delete(req)
            .await
            .map_err(writer_status)?
            .map_err(core_status)?;
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
            DeleteOutcome::DryRun(plan) => v1::DeleteResponse {
                plan: Some(self.plan_everywhere(plan, cascade).await),
                ..Default::default()
            },
        };
        Ok(Response::new(response))
    }

    async fn get_operation(
        &self,
        request: Request<v1::GetOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        let req = request.into_inner();
        let id = parse_operation_id(&req.id)?;
        let page_size = match req.outcomes_page_size {
            0 => self.limits.default_page_size,
            n => n as usize,
        };
        Ok(Response::new(
            self.operation(id, page_size, &req.outcomes_page_token).await?,
        ))
    }

    type WatchOperationStream = Stream2<v1::Operation>;

    async fn watch_operation(
        &self,
        request: Request<v1::WatchOperationRequest>,
    ) -> Result<Response<Self::WatchOperationStream>, Status> {
        let id = parse_operation_id(&request.into_inner().id)?;
        // Subscribe before the first read so no local change falls in between;
        // other regions' parts are polled.
        let mut events = self.events.subscribe();
        let first = self.operation(id, 0, "").await?;
        let (tx, rx) = mpsc::channel(16);
        let svc = self.clone();
        let mut stop = self.shutting_down.clone();
        let poll = if self.peers.regions().next().is_some() {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(3600)
        };
        let span = info_span!("watch_operation", region = %self.region, operation = %id);
        tokio::spawn(
            async move {
                let changed = |a: &v1::Operation, b: &v1::Operation| {
                    a.progress != b.progress
                        || a.state != b.state
                        || a.done != b.done
                        || a.unreachable_regions != b.unreachable_regions
                };
                let mut last = first.clone();
                if tx.send(Ok(first)).await.is_err() || last.done {
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
                    let view = match svc.operation(id, 0, "").await {
                        Ok(v) => v,
                        Err(s) => {
                            let _ = tx.send(Err(s)).await;
                            return;
                        }
                    };
                    if changed(&view, &last) {
                        let done = view.done;
                        last = view.clone();
                        if tx.send(Ok(view)).await.is_err() || done {
                            return;
                        }
                    }
                }
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    type WatchStream = Stream2<v1::WatchEvent>;

    async fn watch(&self, request: Request<v1::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let req = request.into_inner();
        if !req.kind.is_empty() && self.schema.kind(&req.kind).is_none() {
            return Err(invalid_field("kind", format!("unknown kind {:?}", req.kind)));
        }
        let kind = (!req.kind.is_empty()).then_some(req.kind);
        let span = info_span!("watch", region = %self.region, from = req.from_revision);
        let stream = outbox_stream(
            self.feed(),
            req.from_revision,
            move |e: &Event| kind.as_deref().is_none_or(|k| e.resource.name.kind() == k),
            convert::event,
            span,
        );
        Ok(Response::new(Box::pin(stream)))
    }
}
