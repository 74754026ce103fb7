//! Node-to-node links: one supervised actor per peer region, and the
//! reconciler of unsettled cross-region creates.
//!
//! A peer link, for peer region P:
//! - follows P's outbox (`Peer.Watch` from this node's cursor for P + 1)
//!   and hands the events to the writer in batches; the writer advances the
//!   cursor in the same step as their effects, so a reconnect resumes
//!   exactly where the last applied event left off;
//! - reconnects with capped exponential backoff and jitter;
//! - sends the releases queued for P and drops them once P acknowledges;
//! - as the owner, asks P which back-references of this node's waiting
//!   deletions still stand (seed 002's periodic check) and drops the rest.
//!
//! Actors are unnamed (several nodes share a process in tests and the demo)
//! and linked to a supervisor that restarts one that fails.

use std::collections::HashMap;
use std::time::Duration;

// tokio's clock, not std's: it is the one a simulation (and a paused test
// runtime) controls.
use tokio::time::Instant;

use cascade_core::model::RemoteEvent;
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::{OperationId, Timestamp};
use cascade_proto::convert;
use cascade_proto::v1;
use futures::{FutureExt, StreamExt};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tracing::{debug, info, info_span, warn, Instrument};

use crate::codec::StoreState;
use crate::entropy::{stable_hash, XorShift64};
use crate::forward::{call_owner, OwnerError};
use crate::peers::PEER_CALL_TIMEOUT;
use crate::service::ResourcesService;
use crate::store::Table;

/// Events handed to the writer per step.
const EVENT_BATCH: usize = 256;
/// Releases or checks per peer call.
const CALL_BATCH: usize = 500;
const RECONNECT_BASE: Duration = Duration::from_millis(100);
const RECONNECT_CAP: Duration = Duration::from_secs(5);
/// An unchanged cursor is acknowledged again this often.
const ACK_REFRESH: Duration = Duration::from_secs(5);

/// What every link needs; cloned into each actor.
#[derive(Clone)]
pub struct LinkContext {
    /// The node's services: store, writer, peers, settings.
    pub node: ResourcesService,
    /// How often a link sends releases and looks at its watch.
    pub tick: Duration,
    pub check_interval: Duration,
    /// Seeds each link's reconnect jitter (mixed with the peer's name).
    pub jitter_seed: u64,
}

pub enum LinkMsg {
    Tick,
    /// The watch stream ended (error text); reconnect after a backoff.
    WatchEnded(String),
    /// The watch stream delivered: the connection is healthy.
    WatchHealthy,
}

struct PeerLink;

struct LinkState {
    ctx: LinkContext,
    /// The peer region this link talks to.
    peer: String,
    /// The running watch task, if any.
    watch: Option<tokio::task::JoinHandle<()>>,
    /// Consecutive failed connections, for the backoff.
    failures: u32,
    reconnect_at: Instant,
    last_check: Instant,
    /// Where the periodic check of back-reference rows resumes.
    check_after: Option<Vec<u8>>,
    /// The cursor last acknowledged to the peer, and when.
    last_ack: Option<(u64, Instant)>,
    ticker: Option<tokio::task::JoinHandle<()>>,
    /// Reconnect jitter, seeded per node and peer (see `NodeEnv::seed`), so
    /// links do not reconnect in lockstep and a simulation replays.
    jitter: XorShift64,
}

/// Half to all of the capped exponential delay, picked by `jitter`.
fn backoff_with_jitter(failures: u32, jitter: &mut XorShift64) -> Duration {
    let exp = RECONNECT_BASE
        .saturating_mul(1u32 << failures.min(16))
        .min(RECONNECT_CAP);
    exp / 2 + exp.mul_f64(jitter.below(1000) as f64 / 2000.0)
}

impl LinkState {
    fn start_watch(&mut self, myself: &ActorRef<LinkMsg>) {
        let node = self.ctx.node.clone();
        let peer = self.peer.clone();
        let me = myself.clone();
        let span = info_span!("peer_link", region = %node.region, peer = %peer);
        self.watch = Some(tokio::spawn(
            async move {
                let end = follow(&node, &peer, &me).await;
                let _ = me.cast(LinkMsg::WatchEnded(end));
            }
            .instrument(span),
        ));
    }
}

/// Follows the peer's outbox until the stream ends; returns why it ended.
async fn follow(node: &ResourcesService, peer: &str, me: &ActorRef<LinkMsg>) -> String {
    let cursor = match (StoreState {
        store: node.store.as_ref(),
    })
    .cursor_of(peer)
    {
        Ok(c) => c,
        Err(e) => return format!("reading the cursor: {e}"),
    };
    let mut client = match node.peers.peer(peer) {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let request = v1::PeerWatchRequest {
        region: node.region.to_string(),
        from_revision: cursor + 1,
    };
    let mut stream = match tokio::time::timeout(PEER_CALL_TIMEOUT, client.watch(request)).await {
        Ok(Ok(s)) => s.into_inner(),
        Ok(Err(s)) if s.code() == tonic::Code::OutOfRange => return resync(node, peer).await,
        Ok(Err(s)) => return format!("{:?}: {}", s.code(), s.message()),
        Err(_) => return "watch call timed out".into(),
    };
    debug!(from = cursor + 1, "following peer outbox");
    let _ = me.cast(LinkMsg::WatchHealthy);
    loop {
        let first = match stream.next().await {
            Some(Ok(e)) => e,
            Some(Err(s)) if s.code() == tonic::Code::OutOfRange => return resync(node, peer).await,
            Some(Err(s)) => return format!("{:?}: {}", s.code(), s.message()),
            None => return "stream closed by peer".into(),
        };
        let mut batch = vec![first];
        while batch.len() < EVENT_BATCH {
            match stream.next().now_or_never() {
                Some(Some(Ok(e))) => batch.push(e),
                _ => break,
            }
        }
        let events: Vec<RemoteEvent> = batch.into_iter().filter_map(remote_event).collect();
        let from = peer.to_owned();
        match node
            .writer
            .apply(move |s, c, _| peer::apply_remote_events(s, c, &from, events))
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return format!("applying events: {e}"),
            Err(e) => return format!("applying events: {e}"),
        }
    }
}

/// The peer compacted its outbox past our cursor: take its listing of
/// DELETING resources we reference instead of the missed events.
async fn resync(node: &ResourcesService, peer: &str) -> String {
    let mut client = match node.peers.peer(peer) {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let request = v1::ListDeletingRequest {
        region: node.region.to_string(),
    };
    let listing = match tokio::time::timeout(PEER_CALL_TIMEOUT, client.list_deleting(request)).await {
        Ok(Ok(l)) => l.into_inner(),
        Ok(Err(s)) => return format!("resync listing: {:?}: {}", s.code(), s.message()),
        Err(_) => return "resync listing timed out".into(),
    };
    let revision = listing.revision;
    let deleting: Vec<_> = listing
        .deleting
        .into_iter()
        .filter_map(|d| {
            Some(peer::RemoteDeleting {
                target: convert::ref_target(d.resource, "resource").ok()?,
                operation: OperationId::parse(&d.operation_id).ok()?,
                no_cascade: d.no_cascade,
            })
        })
        .collect();
    let n = deleting.len();
    let from = peer.to_owned();
    match node
        .writer
        .apply(move |s, c, _| peer::resync(s, c, &from, deleting, revision))
        .await
    {
        Ok(Ok(_)) => {
            info!(
                peer,
                deleting = n,
                revision,
                "cursor was compacted away at the peer; resynced from its listing"
            );
            "resynced from the peer's listing".into()
        }
        Ok(Err(e)) => format!("resync: {e}"),
        Err(e) => format!("resync: {e}"),
    }
}

/// Tells the peer how far we applied its outbox (it compacts below every
/// peer's acknowledgement) when the cursor moved, or every `ACK_REFRESH`
/// (an owner that restarted has forgotten the acks it had).
async fn ack(node: &ResourcesService, peer: &str, last: &mut Option<(u64, Instant)>) -> Result<(), String> {
    let cursor = (StoreState {
        store: node.store.as_ref(),
    })
    .cursor_of(peer)
    .map_err(|e| e.to_string())?;
    if last.is_some_and(|(acked, at)| acked == cursor && at.elapsed() < ACK_REFRESH) {
        return Ok(());
    }
    let mut client = node.peers.peer(peer).map_err(|e| e.to_string())?;
    let request = v1::AckRequest {
        region: node.region.to_string(),
        revision: cursor,
    };
    match tokio::time::timeout(PEER_CALL_TIMEOUT, client.ack(request)).await {
        #[allow(clippy::disallowed_methods)] // TODO(issue 9): route through Clock
        Ok(Ok(_)) => {
            *last = Some((cursor, Instant::now()));
            Ok(())
        }
        Ok(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
        Err(_) => Err("ack timed out".into()),
    }
}

fn remote_event(e: v1::PeerEvent) -> Option<RemoteEvent> {
    let resource = convert::ref_target(e.resource, "resource").ok()?;
    Some(RemoteEvent {
        revision: e.revision,
        event_type: convert::event_type_from(e.r#type)?,
        resource,
        operation: OperationId::parse(&e.operation_id).ok(),
        no_cascade: e.no_cascade,
    })
}

/// Sends the releases queued for `peer`; drops them once acknowledged.
async fn flush_releases(node: &ResourcesService, peer: &str) -> Result<usize, String> {
    let mut sent_total = 0;
    loop {
        let pending = (StoreState {
            store: node.store.as_ref(),
        })
        .pending_releases(peer, CALL_BATCH)
        .map_err(|e| e.to_string())?;
        if pending.is_empty() {
            return Ok(sent_total);
        }
        let mut client = node.peers.peer(peer).map_err(|e| e.to_string())?;
        let request = v1::ReleaseRequest {
            from_region: node.region.to_string(),
            backrefs: pending
                .iter()
                .map(|p| {
                    convert::peer_backref(&PeerBackRef {
                        target: p.backref.target.clone(),
                        referrer: p.backref.referrer.clone(),
                        field: p.backref.field.clone(),
                        generation: p.generation,
                    })
                })
                .collect(),
        };
        match tokio::time::timeout(PEER_CALL_TIMEOUT, client.release(request)).await {
            Ok(Ok(_)) => {}
            Ok(Err(s)) => return Err(format!("{:?}: {}", s.code(), s.message())),
            Err(_) => return Err("release timed out".into()),
        }
        let n = pending.len();
        let sent: Vec<_> = pending.into_iter().map(|p| (p.backref.key(), p.generation)).collect();
        let region = peer.to_owned();
        node.writer
            .apply(move |s, _, _| peer::releases_acknowledged(s, &region, sent))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        sent_total += n;
        if n < CALL_BATCH {
            return Ok(sent_total);
        }
    }
}

/// Owner side of seed 002's periodic check, over every row whose referrer
/// lives in `peer` (a page per call, round-robin through the table): ask
/// the peer which still stand; drop the others. Rows attached within
/// `older_than` are left alone (their referrer's commit may be in flight).
/// Heals lost releases, referrers that crashed, and attaches that landed
/// after their reference was already given up.
async fn check_backrefs(
    node: &ResourcesService,
    peer: &str,
    older_than: Duration,
    resume_after: &mut Option<Vec<u8>>,
) -> Result<usize, String> {
    let now = node.clock.now();
    let cutoff = Timestamp(now.0.saturating_sub(older_than.as_millis() as u64));
    let page = node
        .store
        .scan(Table::Backrefs, &[], resume_after.as_deref(), 4 * CALL_BATCH)
        .map_err(|e| e.to_string())?;
    *resume_after = page.last().map(|(k, _)| k.clone());
    let mut candidates = Vec::new();
    for (_, v) in &page {
        #[allow(clippy::disallowed_methods)] // TODO(issue 9): route through the codec
        let row: cascade_core::BackRef = match serde_json::from_slice(v) {
            Ok(r) => r,
            Err(_) => continue,
        };
        if row.referrer.name.region() == peer
            && row.target.name.region() == node.region.as_str()
            && row.attached_at <= cutoff
        {
            candidates.push(PeerBackRef {
                target: row.target,
                referrer: row.referrer,
                field: row.field,
                generation: u64::MAX,
            });
        }
    }
    if candidates.is_empty() {
        return Ok(0);
    }
    let mut client = node.peers.peer(peer).map_err(|e| e.to_string())?;
    let request = v1::CheckBackrefsRequest {
        from_region: node.region.to_string(),
        backrefs: candidates.iter().map(convert::peer_backref).collect(),
    };
    let standing = match tokio::time::timeout(PEER_CALL_TIMEOUT, client.check_backrefs(request)).await {
        Ok(Ok(r)) => r.into_inner().standing,
        Ok(Err(s)) => return Err(format!("{:?}: {}", s.code(), s.message())),
        Err(_) => return Err("check timed out".into()),
    };
    let gone: Vec<PeerBackRef> = candidates
        .into_iter()
        .zip(standing.into_iter().chain(std::iter::repeat(true)))
        .filter(|(_, stands)| !stands)
        .map(|(c, _)| c)
        .collect();
    if gone.is_empty() {
        return Ok(0);
    }
    let n = gone.len();
    info!(
        peer,
        dropped = n,
        "back-references no longer standing at the importer were dropped"
    );
    node.writer
        .apply(move |s, c, _| peer::release(s, c, None, gone))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    Ok(n)
}

impl Actor for PeerLink {
    type Msg = LinkMsg;
    type State = LinkState;
    type Arguments = (LinkContext, String);

    async fn pre_start(
        &self,
        myself: ActorRef<LinkMsg>,
        (ctx, peer): Self::Arguments,
    ) -> Result<LinkState, ActorProcessingErr> {
        let ticker = myself.send_interval(ctx.tick, || LinkMsg::Tick);
        let jitter = XorShift64::new(ctx.jitter_seed ^ stable_hash(&peer));
        #[allow(clippy::disallowed_methods)] // TODO(issue 9): route through Clock
        let mut state = LinkState {
            jitter,
            ctx,
            peer,
            watch: None,
            failures: 0,
            reconnect_at: Instant::now(),
            last_check: Instant::now(),
            check_after: None,
            last_ack: None,
            ticker: Some(ticker),
        };
        state.start_watch(&myself);
        Ok(state)
    }

    async fn post_stop(&self, _: ActorRef<LinkMsg>, state: &mut LinkState) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        if let Some(w) = state.watch.take() {
            w.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<LinkMsg>,
        msg: LinkMsg,
        state: &mut LinkState,
    ) -> Result<(), ActorProcessingErr> {
        let node = state.ctx.node.clone();
        let span = info_span!("peer_link", region = %node.region, peer = %state.peer);
        match msg {
            LinkMsg::WatchHealthy => state.failures = 0,
            #[allow(clippy::disallowed_methods)] // TODO(issue 9): route through Clock
            LinkMsg::WatchEnded(why) => {
                state.watch = None;
                state.failures += 1;
                let wait = backoff_with_jitter(state.failures, &mut state.jitter);
                state.reconnect_at = Instant::now() + wait;
                span.in_scope(|| debug!(reason = %why, retry_in = ?wait, "watch of peer ended"));
            }
            #[allow(clippy::disallowed_methods)] // TODO(issue 9): route through Clock
            LinkMsg::Tick => {
                if state.watch.is_none() && Instant::now() >= state.reconnect_at {
                    state.start_watch(&myself);
                }
                if let Err(e) = flush_releases(&node, &state.peer).instrument(span.clone()).await {
                    span.in_scope(|| debug!(error = %e, "releases not delivered yet; will retry"));
                }
                if state.watch.is_some() {
                    if let Err(e) = ack(&node, &state.peer, &mut state.last_ack).await {
                        span.in_scope(|| debug!(error = %e, "ack not delivered; will retry"));
                    }
                }
                if state.last_check.elapsed() >= state.ctx.check_interval {
                    state.last_check = Instant::now();
                    if let Err(e) = check_backrefs(&node, &state.peer, state.ctx.check_interval, &mut state.check_after)
                        .instrument(span.clone())
                        .await
                    {
                        span.in_scope(|| debug!(error = %e, "back-reference check failed; will retry"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Settles resources whose cross-region references are not confirmed (a
/// crash between the durable commit and the owner's answer, or an owner
/// that was unreachable): attach again (attach is idempotent), then
/// confirmed, or removed (CREATING) / taken back (ACTIVE).
struct Reconciler;

pub enum ReconcilerMsg {
    Tick,
}

struct ReconcilerState {
    ctx: LinkContext,
    /// Creates younger than this may still be in flight in a request.
    settle_after: Duration,
    /// Unsettled when the reconciler started: no request of this process
    /// made them, so they are settled at once, whatever their age.
    orphans: std::collections::HashSet<cascade_core::Uid>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl Actor for Reconciler {
    type Msg = ReconcilerMsg;
    type State = ReconcilerState;
    type Arguments = LinkContext;

    async fn pre_start(
        &self,
        myself: ActorRef<ReconcilerMsg>,
        ctx: LinkContext,
    ) -> Result<ReconcilerState, ActorProcessingErr> {
        let orphans = ctx
            .node
            .state()
            .pending_attaches(usize::MAX)
            .map(|p| p.into_iter().map(|p| p.resource.uid).collect())
            .unwrap_or_default();
        let ticker = myself.send_interval(ctx.tick.max(Duration::from_millis(200)), || ReconcilerMsg::Tick);
        let _ = myself.cast(ReconcilerMsg::Tick);
        Ok(ReconcilerState {
            ctx,
            settle_after: PEER_CALL_TIMEOUT * 3,
            orphans,
            ticker: Some(ticker),
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<ReconcilerMsg>,
        state: &mut ReconcilerState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<ReconcilerMsg>,
        _: ReconcilerMsg,
        state: &mut ReconcilerState,
    ) -> Result<(), ActorProcessingErr> {
        let node = state.ctx.node.clone();
        if let Some(below) = node.compactable_below() {
            match node.writer.compact_outbox(below).await {
                Ok(Ok(n)) if n > 0 => debug!(region = %node.region, removed = n, below, "outbox compacted"),
                Ok(Err(e)) => warn!(region = %node.region, error = %e, "outbox compaction failed"),
                _ => {}
            }
        }
        confirm_closures(&node).await;
        let pending = match node.state().pending_attaches(100) {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "reading unsettled creates failed");
                return Ok(());
            }
        };
        let now = node.clock.now();
        for pending in pending {
            let target = pending.resource;
            let Ok(Some(r)) = node.state().get_resource(&target.name) else {
                continue;
            };
            if r.uid != target.uid {
                continue;
            }
            // Leave young creates and updates to the request handling them.
            let age = Duration::from_millis(now.0.saturating_sub(r.update_time.0));
            if !state.orphans.contains(&r.uid) && age < state.settle_after {
                continue;
            }
            let span = info_span!("reconcile_create", region = %node.region, name = %r.name, uid = %r.uid);
            async {
                match node.reattach(&r).await {
                    Ok(Ok(_)) => {
                        info!("cross-region references confirmed");
                        state.orphans.remove(&r.uid);
                    }
                    Ok(Err(e @ cascade_core::CoreError::RegionUnavailable { .. })) => {
                        debug!(error = %e, "owner unreachable; will retry")
                    }
                    Ok(Err(e)) => {
                        info!(reason = %e, "cross-region references refused: create removed or references taken back");
                        state.orphans.remove(&r.uid);
                    }
                    Err(s) => debug!(error = %s, "not settled yet; will retry"),
                }
            }
            .instrument(span)
            .await;
        }
        Ok(())
    }
}

/// For every operation whose root waits only for other regions' parts
/// (reported by the writer): read every region's part twice; if no region
/// has a pending deletion and none changed between the two reads, confirm,
/// and the root is purged. A region that cannot be asked, or any pending
/// or changing part, leaves the root waiting: the writer reports it again
/// after `Policy::closure_check_ms`.
async fn confirm_closures(node: &ResourcesService) {
    let ids: Vec<OperationId> = match node.closure_checks.lock() {
        Ok(mut checks) => std::mem::take(&mut *checks).into_iter().collect(),
        Err(_) => return,
    };
    for id in ids {
        let span = info_span!("closure_check", region = %node.region, operation = %id);
        async {
            let Some(local_changes) = remote_closure_finished(node, id).await else {
                return;
            };
            match node
                .writer
                .apply(move |s, c, _| cascade_core::protocol::confirm_remote_closure(s, c, id, local_changes))
                .await
            {
                Ok(Ok(true)) => info!("every region's part of the operation is finished; the root goes"),
                Ok(Ok(false)) => debug!("the operation changed meanwhile; will look again"),
                Ok(Err(e)) => warn!(error = %e, "confirming the closure failed"),
                Err(e) => debug!(error = %e, "writer unavailable; will look again"),
            }
        }
        .instrument(span)
        .await;
    }
}

/// The double collect of [`confirm_closures`]: Some(the local part's change
/// count, read before the first collect) when every other region's part
/// had nothing pending and did not change between two collects.
async fn remote_closure_finished(node: &ResourcesService, id: OperationId) -> Option<u64> {
    let local = node.state().get_operation(id).ok()??;
    let first = collect_parts(node, id).await?;
    if first.iter().any(|(_, pending, _)| *pending > 0) {
        debug!(parts = ?first, "other regions' parts still pending");
        return None;
    }
    let second = collect_parts(node, id).await?;
    (first == second).then_some(local.changes)
}

/// (region, pending, changes) of every peer's part; a region without a part
/// reads (0, 0). None if any region could not be asked.
async fn collect_parts(node: &ResourcesService, id: OperationId) -> Option<Vec<(String, u64, u64)>> {
    let mut parts = Vec::new();
    for region in node.peers.regions() {
        let mut client = node.peers.peer(region).ok()?;
        let request = v1::GetOperationRequest {
            id: id.to_string(),
            outcomes_page_size: 0,
            outcomes_page_token: String::new(),
        };
        match call_owner(
            region,
            "OperationPart",
            PEER_CALL_TIMEOUT,
            client.operation_part(request),
        )
        .await
        {
            Ok(part) => {
                let pending = part.progress.map_or(0, |p| p.pending);
                parts.push((region.to_owned(), pending, part.changes));
            }
            Err(OwnerError::Answered(s)) if s.code() == tonic::Code::NotFound => parts.push((region.to_owned(), 0, 0)),
            Err(e) => {
                debug!(peer = region, error = %e.into_status(), "part of the operation not readable; will look again");
                return None;
            }
        }
    }
    Some(parts)
}

/// Which child a supervised actor is, so a failed one is restarted as itself.
#[derive(Clone)]
enum Child {
    Peer(String),
    Reconciler,
}

struct LinkSupervisor;

struct SupervisorState {
    ctx: LinkContext,
    children: HashMap<ActorId, Child>,
    stopping: bool,
}

pub enum LinkSupervisorMsg {
    Stop,
}

impl LinkSupervisor {
    async fn spawn_child(
        myself: &ActorRef<LinkSupervisorMsg>,
        state: &mut SupervisorState,
        child: Child,
    ) -> Result<(), ActorProcessingErr> {
        let id = match &child {
            Child::Peer(peer) => {
                let (a, _) =
                    Actor::spawn_linked(None, PeerLink, (state.ctx.clone(), peer.clone()), myself.get_cell()).await?;
                a.get_id()
            }
            Child::Reconciler => {
                let (a, _) = Actor::spawn_linked(None, Reconciler, state.ctx.clone(), myself.get_cell()).await?;
                a.get_id()
            }
        };
        state.children.insert(id, child);
        Ok(())
    }
}

impl Actor for LinkSupervisor {
    type Msg = LinkSupervisorMsg;
    type State = SupervisorState;
    type Arguments = LinkContext;

    async fn pre_start(
        &self,
        myself: ActorRef<LinkSupervisorMsg>,
        ctx: LinkContext,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let peers: Vec<String> = ctx.node.peers.regions().map(str::to_owned).collect();
        let mut state = SupervisorState {
            ctx,
            children: HashMap::new(),
            stopping: false,
        };
        for peer in peers {
            Self::spawn_child(&myself, &mut state, Child::Peer(peer)).await?;
        }
        Self::spawn_child(&myself, &mut state, Child::Reconciler).await?;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<LinkSupervisorMsg>,
        msg: LinkSupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LinkSupervisorMsg::Stop => {
                state.stopping = true;
                myself.stop_children_and_wait(None, Some(Duration::from_secs(5))).await;
                myself.stop(None);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<LinkSupervisorMsg>,
        evt: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        if state.stopping {
            return Ok(());
        }
        let (who, why) = match &evt {
            SupervisionEvent::ActorFailed(who, err) => (who.get_id(), err.to_string()),
            SupervisionEvent::ActorTerminated(who, _, reason) => (who.get_id(), reason.clone().unwrap_or_default()),
            _ => return Ok(()),
        };
        if let Some(child) = state.children.remove(&who) {
            let name = match &child {
                Child::Peer(p) => format!("peer link to {p}"),
                Child::Reconciler => "create reconciler".to_owned(),
            };
            warn!(region = %state.ctx.node.region, actor = %name, reason = %why, "link actor stopped; restarting it");
            Self::spawn_child(&myself, state, child).await?;
        }
        Ok(())
    }
}

/// The running links of a node.
pub struct Links {
    supervisor: ActorRef<LinkSupervisorMsg>,
}

impl Links {
    pub async fn start(ctx: LinkContext) -> Result<Self, ractor::SpawnErr> {
        let (supervisor, _) = Actor::spawn(None, LinkSupervisor, ctx).await?;
        Ok(Self { supervisor })
    }

    pub async fn stop(&self) {
        let _ = self.supervisor.cast(LinkSupervisorMsg::Stop);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.supervisor.wait(None)).await;
    }
}
