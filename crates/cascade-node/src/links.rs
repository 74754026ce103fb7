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
//!
//! Size: one file on purpose: the links, the reconciler and their
//! supervisor share the coalesced ticks and wake-ups and one context, and
//! each actor is read with the supervisor that restarts it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

// tokio's clock, not std's: it is the one a simulation (and a paused test
// runtime) controls.
use tokio::time::Instant;

use cascade_core::error::StorageError;
use cascade_core::model::{EventType, RemoteEvent};
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::{CoreError, Timestamp};
use futures::{FutureExt, StreamExt};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tracing::{debug, info, info_span, warn, Instrument};

use crate::clock;
use crate::entropy::{stable_hash, XorShift64};
use crate::error::Fault;
use crate::log_throttle::Throttle;
use crate::node::Node;
use crate::peers::{WatchEnd, Watched, WatchedEvent, PEER_CALL_TIMEOUT};

/// Events handed to the writer per step.
pub(crate) const EVENT_BATCH: usize = 256;
/// Releases or checks per peer call.
pub(crate) const CALL_BATCH: usize = 500;
pub(crate) const RECONNECT_BASE: Duration = Duration::from_millis(100);
pub(crate) const RECONNECT_CAP: Duration = Duration::from_secs(5);
/// An unchanged cursor is acknowledged again this often.
const ACK_REFRESH: Duration = Duration::from_secs(5);

/// What every link needs; cloned into each actor.
#[derive(Clone)]
pub struct LinkContext {
    /// The node: store, writer, peers, settings.
    pub node: Arc<Node>,
    /// How often a link sends releases and looks at its watch.
    pub tick: Duration,
    pub check_interval: Duration,
    /// Seeds each link's reconnect jitter (mixed with the peer's name).
    pub jitter_seed: u64,
}

pub enum LinkMsg {
    Tick,
    /// The writer committed a release queued for this link's peer: send
    /// the queued releases now (see [`prompt_releases`]).
    Releases,
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
    /// The key of the last queued release sent to the peer (see
    /// [`flush_releases`]); None: from the first.
    release_after: Option<Vec<u8>>,
    /// The cursor last acknowledged to the peer, and when.
    last_ack: Option<(u64, Instant)>,
    ticker: Option<tokio::task::JoinHandle<()>>,
    /// A tick is in the mailbox (see [`coalesced_ticks`]).
    tick_queued: Arc<AtomicBool>,
    /// The task that wakes the link when a release is queued, and whether
    /// its message is in the mailbox (see [`prompt_releases`]).
    releases: Option<tokio::task::JoinHandle<()>>,
    releases_queued: Arc<AtomicBool>,
    /// Reconnect jitter, seeded per node and peer (see `NodeEnv::seed`), so
    /// links do not reconnect in lockstep and a simulation replays.
    jitter: XorShift64,
}

/// Sends `msg()` to `actor` every `every`, unless the last one is still
/// in its mailbox (`queued`, which the handler clears when it takes the
/// message). A tick's peer calls can wait on a dead peer for their whole
/// deadline; a plain interval would pile a tick into the mailbox every
/// `every` meanwhile, without bound, and everything sent to the actor
/// after them (the watch's end, say) would wait behind the pile.
fn coalesced_ticks<M: ractor::Message>(
    actor: &ActorRef<M>,
    every: Duration,
    queued: Arc<AtomicBool>,
    msg: fn() -> M,
) -> tokio::task::JoinHandle<()> {
    let actor = actor.clone();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            if !queued.swap(true, Ordering::AcqRel) && actor.cast(msg()).is_err() {
                return; // the actor stopped
            }
        }
    })
}

/// Casts [`LinkMsg::Releases`] to `actor` each time the writer commits a
/// release queued for `peer`, unless one is still in its mailbox: a send
/// takes every release queued so far, so one message stands for any number
/// of commits. Why: releases went only at the link's tick, and an owner's
/// deletion waits for them (P2, five regions: each importer's releases
/// waited up to a tick, `--tick-ms` 200, before each send, and the last
/// ones held the root that long). The tick still sends too, as the retry
/// after a failed send.
fn prompt_releases(
    actor: &ActorRef<LinkMsg>,
    node: &Node,
    peer: &str,
    queued: Arc<AtomicBool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let wake = node.release_hints.queued(peer)?;
    let actor = actor.clone();
    Some(tokio::spawn(async move {
        loop {
            wake.notified().await;
            if !queued.swap(true, Ordering::AcqRel) && actor.cast(LinkMsg::Releases).is_err() {
                return; // the actor stopped
            }
        }
    }))
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
                // Down as of now, whatever the actor is busy with: its
                // mailbox may hold a tick whose calls wait on the same
                // dead peer, and `cascade status` must not say "up" meanwhile.
                node.metrics.peer_connected(&peer, false);
                let _ = me.cast(LinkMsg::WatchEnded(end));
            }
            .instrument(span),
        ));
    }
}

/// Follows the peer's outbox until the stream ends; returns why it ended.
async fn follow(node: &Node, peer: &str, me: &ActorRef<LinkMsg>) -> String {
    // Read before the cursor: a takeback after it ends this stream.
    let takebacks = node.write_stats.takebacks();
    let cursor = match node.state().cursor_of(peer) {
        Ok(c) => c,
        Err(e) => return format!("reading the cursor: {e}"),
    };
    let mut stream = match node.peers.watch(peer, &node.region, cursor + 1).await {
        Ok(s) => s,
        Err(WatchEnd::Compacted) => return resync(node, peer).await,
        Err(WatchEnd::Failed(why)) => return why,
    };
    debug!(from = cursor + 1, "following peer outbox");
    contact(node, peer);
    let _ = me.cast(LinkMsg::WatchHealthy);
    // The peer sends a heartbeat whenever it has had nothing to send for
    // WATCH_HEARTBEAT: hearing nothing for longer than the silence timeout
    // means the link is dead (a silent partition, a frozen peer), even if
    // the connection still looks open. The link then reads down and dials
    // again, instead of waiting for the stream to end on its own.
    let silence = node.link_timings.silence_timeout;
    loop {
        let first = match tokio::time::timeout(silence, stream.next()).await {
            Err(_) => return format!("nothing heard from the peer for {silence:?} (no event, no heartbeat)"),
            Ok(Some(Ok(e))) => e,
            Ok(Some(Err(WatchEnd::Compacted))) => return resync(node, peer).await,
            Ok(Some(Err(WatchEnd::Failed(why)))) => return why,
            Ok(None) => return "stream closed by peer".into(),
        };
        let mut batch = vec![first];
        while batch.len() < EVENT_BATCH {
            match stream.next().now_or_never() {
                Some(Some(Ok(e))) => batch.push(e),
                _ => break,
            }
        }
        contact(node, peer);
        // The highest progress mark of the batch, and its events.
        let mut passed_through = 0;
        let mut watched: Vec<WatchedEvent> = Vec::with_capacity(batch.len());
        for item in batch.into_iter().flatten() {
            match item {
                Watched::Beat { passed_through: r } => passed_through = passed_through.max(r),
                Watched::Event(w) => {
                    if understood(node, peer, &w.event) {
                        watched.push(w);
                    }
                    // A mark before an event is behind it.
                    passed_through = 0;
                }
            }
        }
        // The marks after the batch's last event, after its events: a
        // cursor moved past an event first would skip it.
        if let Err(e) = apply_events(node, peer, watched, takebacks).await {
            return e;
        }
        if passed_through > 0 {
            if let Err(e) = pass_through(node, peer, passed_through, takebacks).await {
                return format!("moving the cursor: {e}");
            }
        }
    }
}

/// Applies a batch of the peer's events in one writer step (nothing for
/// an empty one); the error says why the stream must be followed again.
async fn apply_events(node: &Node, peer: &str, watched: Vec<WatchedEvent>, takebacks: u64) -> Result<(), String> {
    if watched.is_empty() {
        return Ok(());
    }
    let span = apply_span(node, peer, &watched);
    let events: Vec<RemoteEvent> = watched.into_iter().map(|w| w.event).collect();
    let from = peer.to_owned();
    let stats = node.write_stats.clone();
    // A batch that only moves the cursor (events about resources
    // nothing here references: most of them, in P3) skips its flush: a
    // crash that loses it has the owner send the same events again.
    // So must a failed flush that takes it back while this process
    // lives: the stream has gone past what the stored cursor covers,
    // and is followed again from it (checked in the writer's step,
    // after every takeback before it: `WriteStats::takebacks`).
    node.writer
        .apply_may_skip_flush(
            move |s, c, _| {
                if stats.takebacks() != takebacks {
                    return Err(taken_back());
                }
                peer::apply_remote_events(s, c, &from, events)
            },
            |applied: &peer::AppliedEvents| applied.needs_flush,
        )
        .instrument(span)
        .await
        .map(|_| ())
        .map_err(|e| format!("applying events: {e}"))
}

/// Moves the cursor of `peer` to a progress mark of its watch: one step,
/// no flush (`peer::pass_through`), checked against takebacks as a batch
/// of events is.
async fn pass_through(node: &Node, peer: &str, revision: u64, takebacks: u64) -> Result<(), Fault> {
    let from = peer.to_owned();
    let stats = node.write_stats.clone();
    node.writer
        .apply_may_skip_flush(
            move |s, _, _| {
                if stats.takebacks() != takebacks {
                    return Err(taken_back());
                }
                peer::pass_through(s, &from, revision)
            },
            |_: &bool| false,
        )
        .await
        .map(|_| ())
}

/// A step of a link refused because the store took back commits that
/// skipped their flush since the link read its cursor.
fn taken_back() -> CoreError {
    CoreError::Storage(StorageError(
        "the store took back commits that skipped their flush, the cursor's among them: \
         following again from the stored cursor"
            .into(),
    ))
}

/// Counts a received event by type, and whether this node applies it: a
/// node made to speak protocol version 1 (a test of mixed versions) skips
/// DELETION_FORCED, as such a node skips an event type it does not know.
fn understood(node: &Node, peer: &str, event: &RemoteEvent) -> bool {
    node.metrics.peer_event_received(peer, event.event_type);
    event.event_type != EventType::DeletionForced || node.peers.own_version >= cascade_proto::DELETION_FORCED_SINCE
}

/// The span a batch of a peer's events is applied in: a child of the
/// first event's trace, linked to every other trace in the batch (one
/// step, one commit, whatever the traces). Each event's operation is
/// remembered with its trace, so what this region emits for it carries
/// the same trace on (`trace_context.rs`).
fn apply_span(node: &Node, peer: &str, watched: &[WatchedEvent]) -> tracing::Span {
    let first = watched
        .first()
        .map(|w| w.event.resource.name.to_string())
        .unwrap_or_default();
    let span = info_span!("apply_peer_events", region = %node.region, peer, events = watched.len(), first = %first);
    let mut parent: Option<&str> = None;
    for w in watched {
        let Some(traceparent) = w.traceparent.as_deref() else {
            continue;
        };
        if let Some(op) = w.event.operation {
            node.trace_marks.remember_operation(op, traceparent);
        }
        match parent {
            None => {
                crate::trace_context::adopt_parent(&span, traceparent);
                parent = Some(traceparent);
            }
            Some(p) if p == traceparent => {}
            Some(_) => crate::trace_context::link_to(&span, traceparent),
        }
    }
    span
}

/// Notes a successful exchange with `peer` (its last-contact metric, and
/// `Admin.Status`).
fn contact(node: &Node, peer: &str) {
    node.metrics.peer_contact(peer, node.clock.now().0 as f64 / 1000.0);
}

/// The peer compacted its outbox past our cursor: take its listing of
/// DELETING resources we reference instead of the missed events.
async fn resync(node: &Node, peer: &str) -> String {
    let (deleting, revision) = match node.peers.list_deleting(peer, &node.region).await {
        Ok(listing) => listing,
        Err(e) => return format!("resync listing: {e}"),
    };
    let n = deleting.len();
    let from = peer.to_owned();
    match node
        .writer
        .apply(move |s, c, _| peer::resync(s, c, &from, deleting, revision))
        .await
    {
        Ok(_) => {
            info!(
                peer,
                deleting = n,
                revision,
                "cursor was compacted away at the peer; resynced from its listing"
            );
            "resynced from the peer's listing".into()
        }
        Err(e) => format!("resync: {e}"),
    }
}

/// Tells the peer how far we applied its outbox (it compacts below every
/// peer's acknowledgement) when the cursor moved, or every `ACK_REFRESH`
/// (an owner that restarted has forgotten the acks it had).
///
/// Only a durable cursor is acknowledged: a cursor move that concerned
/// nothing here is committed without a flush of its own (`links.rs`,
/// `follow`), and an acknowledgement of one that a crash then loses would
/// let the owner compact away the events this node must be sent again. So
/// the cursor is read, then the count of batches committed (which
/// includes the one that wrote it), and the ack waits, at most `within`,
/// for a flush that covers them; the writer flushes such commits at its
/// next tick at the latest. Without one it is left to the next tick.
async fn ack(node: &Node, peer: &str, last: &mut Option<(u64, Instant)>, within: Duration) -> Result<(), Fault> {
    let takebacks = node.write_stats.takebacks();
    let cursor = node.state().cursor_of(peer)?;
    if last.is_some_and(|(acked, at)| acked == cursor && at.elapsed() < ACK_REFRESH) {
        return Ok(());
    }
    let committed = node.write_stats.committed();
    // A flush that failed meanwhile may have taken the cursor back, and a
    // later one does not make it durable again.
    if !node.write_stats.wait_flushed(committed, within).await || node.write_stats.takebacks() != takebacks {
        return Ok(());
    }
    node.peers.ack(peer, &node.region, cursor).await?;
    contact(node, peer);
    *last = Some((cursor, clock::monotonic_now()));
    Ok(())
}

/// Sends the releases queued for `peer`; drops them once acknowledged.
///
/// Starts after `after`, the highest key it sent so far (everything before
/// it was acknowledged and removed), unless the writer queued a release at
/// or before that key since (`ReleaseHints`): then this call starts just
/// before the lowest such key, once ([`release_scan_start`]). `after`
/// itself never moves back. Why: every removed release is a tombstone in
/// an LSM engine until compaction, and a scan from the first key on every
/// call walked over all of them (`tests/tombstones.rs`).
async fn flush_releases(node: &Node, peer: &str, after: &mut Option<Vec<u8>>) -> Result<usize, Fault> {
    let (from, behind) = release_scan_start(node.release_hints.take(peer), after.as_deref());
    let sent = send_releases(node, peer, from, after).await;
    if sent.is_err() && behind {
        // The hint was taken: until a pass from the first key succeeds,
        // every pass starts there (found by the simulation: a partition
        // failed the pass, and a release queued behind the cursor stayed).
        *after = None;
    }
    sent
}

/// Where a send of queued releases starts (the key it scans after; None:
/// the first key), given the lowest key the writer queued a release at
/// since the last send (`hint`) and the highest key sent so far (`sent`);
/// and whether that is behind `sent`.
///
/// A hint at or below `sent` is a release queued behind the position: the
/// send starts just before the hinted key (the key less its last byte:
/// every key from the hinted one on comes after it), not at the first key.
/// Every release below the hinted key was queued, and hinted, before the
/// sends that passed its place. Why not the first key: the writer hints a
/// release once its batch is flushed, after the commit made it visible, so
/// a send running meanwhile may already have sent and removed it; its late
/// hint then sent the next send over every tombstone of the table
/// (`tests/tombstones.rs` under load: 6,431 passed for 3,000 removed). An
/// empty hint (the store was reopened: `ReleaseHints::take`) is the first key.
fn release_scan_start(hint: Option<Vec<u8>>, sent: Option<&[u8]>) -> (Option<Vec<u8>>, bool) {
    match hint {
        Some(lowest) if sent.is_some_and(|sent| lowest.as_slice() <= sent) => {
            let before = lowest.split_last().map(|(_, head)| head.to_vec());
            (before.filter(|head| !head.is_empty()), true)
        }
        _ => (sent.map(<[u8]>::to_vec), false),
    }
}

/// Sends the queued releases after `from`, a page at a time, raising
/// `highest` to the last key acknowledged.
async fn send_releases(
    node: &Node,
    peer: &str,
    mut from: Option<Vec<u8>>,
    highest: &mut Option<Vec<u8>>,
) -> Result<usize, Fault> {
    let mut sent_total = 0;
    loop {
        let pending = node.state().pending_releases(peer, from.as_deref(), CALL_BATCH)?;
        let Some(last) = pending.last() else {
            return Ok(sent_total);
        };
        let last_key = crate::codec::release_key(peer, &last.backref.key());
        let rows: Vec<PeerBackRef> = pending
            .iter()
            .map(|p| PeerBackRef {
                generation: p.generation,
                ..PeerBackRef::from(p.backref.clone())
            })
            .collect();
        node.peers.release(peer, &node.region, &rows).await?;
        let n = pending.len();
        let sent: Vec<_> = pending.into_iter().map(|p| (p.backref.key(), p.generation)).collect();
        let region = peer.to_owned();
        // Without a flush of its own: a crash that loses it has the same
        // releases sent again, which the peer answers as absent.
        node.writer
            .apply_may_skip_flush(move |s, _, _| peer::releases_acknowledged(s, &region, sent), |_| false)
            .await?;
        if highest.as_ref().is_none_or(|h| last_key > *h) {
            *highest = Some(last_key.clone());
        }
        from = Some(last_key);
        sent_total += n;
        if n < CALL_BATCH {
            return Ok(sent_total);
        }
    }
}

/// Owner side of seed 002's periodic check, over every row whose referrer
/// lives in `peer` (a page per call, round-robin through the table): ask
/// the peer which still stand; drop the others. Rows attached within
/// `older_than` are left alone (their referrer's commit may be in flight;
/// the choice is [`peer::rows_to_check`]). Heals lost releases, referrers
/// that crashed, and attaches that landed after their reference was
/// already given up.
async fn check_backrefs(
    node: &Node,
    peer: &str,
    older_than: Duration,
    resume_after: &mut Option<Vec<u8>>,
) -> Result<usize, Fault> {
    let now = node.clock.now();
    let cutoff = Timestamp(now.0.saturating_sub(older_than.as_millis() as u64));
    let (rows, last) = node.state().backref_page(resume_after.as_deref(), 4 * CALL_BATCH)?;
    *resume_after = last;
    let candidates = peer::rows_to_check(rows, node.region.as_str(), peer, cutoff);
    if candidates.is_empty() {
        return Ok(0);
    }
    let standing = node.peers.check_backrefs(peer, &node.region, &candidates).await?;
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
        .await?;
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
        let tick_queued = Arc::new(AtomicBool::new(false));
        let ticker = coalesced_ticks(&myself, ctx.tick, tick_queued.clone(), || LinkMsg::Tick);
        let jitter = XorShift64::new(ctx.jitter_seed ^ stable_hash(&peer));
        let releases_queued = Arc::new(AtomicBool::new(false));
        let releases = prompt_releases(&myself, &ctx.node, &peer, releases_queued.clone());
        let mut state = LinkState {
            jitter,
            ctx,
            peer,
            watch: None,
            failures: 0,
            reconnect_at: clock::monotonic_now(),
            last_check: clock::monotonic_now(),
            check_after: None,
            release_after: None,
            last_ack: None,
            ticker: Some(ticker),
            tick_queued,
            releases,
            releases_queued,
        };
        state.start_watch(&myself);
        Ok(state)
    }

    async fn post_stop(&self, _: ActorRef<LinkMsg>, state: &mut LinkState) -> Result<(), ActorProcessingErr> {
        state.ctx.node.metrics.peer_connected(&state.peer, false);
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        if let Some(r) = state.releases.take() {
            r.abort();
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
            LinkMsg::WatchHealthy => {
                state.failures = 0;
                node.metrics.peer_connected(&state.peer, true);
            }
            LinkMsg::WatchEnded(why) => {
                state.watch = None;
                node.metrics.peer_connected(&state.peer, false);
                state.failures += 1;
                let wait = backoff_with_jitter(state.failures, &mut state.jitter);
                state.reconnect_at = clock::monotonic_now() + wait;
                span.in_scope(|| debug!(reason = %why, retry_in = ?wait, "watch of peer ended"));
            }
            LinkMsg::Releases => {
                state.releases_queued.store(false, Ordering::Release);
                if state.watch.is_none() {
                    // The link is down: the tick retries when it is back,
                    // instead of a send that waits on a dead peer per commit.
                    return Ok(());
                }
                if let Err(e) = flush_releases(&node, &state.peer, &mut state.release_after)
                    .instrument(span.clone())
                    .await
                {
                    span.in_scope(|| debug!(error = %e, "releases not delivered yet; will retry"));
                }
            }
            LinkMsg::Tick => {
                state.tick_queued.store(false, Ordering::Release);
                if state.watch.is_none() && clock::monotonic_now() >= state.reconnect_at {
                    state.start_watch(&myself);
                }
                if let Err(e) = flush_releases(&node, &state.peer, &mut state.release_after)
                    .instrument(span.clone())
                    .await
                {
                    span.in_scope(|| debug!(error = %e, "releases not delivered yet; will retry"));
                }
                if state.watch.is_some() {
                    // Waits for the writer's tick at most (its flush of
                    // commits that skipped theirs), and the peer call's deadline.
                    let within = state.ctx.tick.min(PEER_CALL_TIMEOUT);
                    if let Err(e) = ack(&node, &state.peer, &mut state.last_ack, within).await {
                        span.in_scope(|| debug!(error = %e, "ack not delivered; will retry"));
                    }
                }
                if state.last_check.elapsed() >= state.ctx.check_interval {
                    state.last_check = clock::monotonic_now();
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
/// crash between the durable commit and the owner's answer, a request cut
/// midway, an owner that was unreachable): attach again (idempotent), then
/// confirmed, or removed (CREATING) / taken back (ACTIVE): `Node::reconcile`.
struct Reconciler;

pub enum ReconcilerMsg {
    Tick,
    /// The writer reported a root that waits only for other regions'
    /// parts: check it now, not at the next tick (see [`prompt_closures`]).
    Closures,
}

/// Casts [`ReconcilerMsg::Closures`] to `actor` each time the writer
/// reports a root waiting for its closure, unless one is still in its
/// mailbox (a check takes every root reported so far). Why: the check ran
/// only at the reconciler's tick (`max(tick, 200 ms)`), so every
/// cross-region cascade ended with a wait of up to a tick after its last
/// release (P2 at 100k on the memory engine: 0.85 s in all).
fn prompt_closures(
    actor: &ActorRef<ReconcilerMsg>,
    node: &Node,
    queued: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let wake = node.closure_checks.reported();
    let actor = actor.clone();
    tokio::spawn(async move {
        loop {
            wake.notified().await;
            if !queued.swap(true, Ordering::AcqRel) && actor.cast(ReconcilerMsg::Closures).is_err() {
                return; // the actor stopped
            }
        }
    })
}

/// Compaction batches one tick runs at most. With one batch a tick the
/// outbox fell behind any writer that appends more than a batch's events a
/// tick (5,000 a second at the 200 ms tick; a BatchCreate population
/// appends 30,000–40,000, a cascade on the memory engine 200,000): it held
/// 887,000 of a million creates' events against a retention of 100,000
/// (docs/BENCHMARKS.md, "P4: the memory engine's footprint"). Batches go
/// one writer message each, so other writes interleave with them.
const MOST_COMPACTION_BATCHES_PER_TICK: usize = 64;

/// Compacts the outbox below `below`: one batch a tick, and more while the
/// events past the retention are more than a retention's worth again, until
/// the batches a tick allows are spent or half a tick has gone by (the rest
/// of the tick is the reconciler's other work). So the outbox holds at most
/// about twice its retention under any write rate the writer sustains,
/// and a burst smaller than that is compacted a batch a tick after it,
/// not inside it (where its removals would share the writer with the
/// burst: P1 on sled at 100,000, 16 % slower when every tick caught up).
async fn compact_outbox(node: &Node, below: u64, tick: Duration, failed: &Throttle) {
    let started = clock::monotonic_now();
    // Without the floor (a failed read) one batch goes, as before.
    let mut backlog = node
        .state()
        .outbox_floor()
        .map_or(0, |floor| below.saturating_sub(floor));
    let mut removed = 0;
    for _ in 0..MOST_COMPACTION_BATCHES_PER_TICK {
        match node.writer.compact_outbox(below).await {
            Ok(n) => {
                failed.reset();
                removed += n;
                backlog = backlog.saturating_sub(n as u64);
                let caught_up = backlog <= node.outbox_retention;
                if n < crate::writer::OUTBOX_COMPACTION_BATCH || caught_up || started.elapsed() >= tick / 2 {
                    break;
                }
            }
            Err(e) => {
                if let Some(more) = failed.admit() {
                    warn!(region = %node.region, error = %e, suppressed = more.count(), "outbox compaction failed{more}");
                }
                break;
            }
        }
    }
    if removed > 0 {
        debug!(region = %node.region, removed, below, "outbox compacted");
    }
}

struct ReconcilerState {
    ctx: LinkContext,
    /// Creates younger than this may still be in flight in a request.
    settle_after: Duration,
    /// Unsettled when the reconciler started: no request of this process
    /// made them, so they are settled at once, whatever their age.
    orphans: std::collections::HashSet<cascade_core::Uid>,
    /// Where the walk of unsettled creates resumes (the last uid looked
    /// at); None between passes.
    attach_after: Option<Vec<u8>>,
    /// When the next pass over unsettled creates starts.
    next_attach_pass: Instant,
    /// This pass left a young create to its request: the soonest one of
    /// them is old enough to settle here after this long.
    pass_due: Option<Duration>,
    /// This pass tried to settle a create.
    pass_acted: bool,
    ticker: Option<tokio::task::JoinHandle<()>>,
    /// A tick is in the mailbox (see [`coalesced_ticks`]).
    tick_queued: Arc<AtomicBool>,
    /// The task that wakes the reconciler when a closure check is
    /// reported, and whether its message is in the mailbox.
    closures: Option<tokio::task::JoinHandle<()>>,
    closures_queued: Arc<AtomicBool>,
    /// What fails on every tick while the store fails: one line a window.
    compaction_failed: Throttle,
    attach_read_failed: Throttle,
    closure_failed: Throttle,
    /// Budget leases that fail (a root region down): one line a window.
    control_failed: Throttle,
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
            .pending_attaches(None, usize::MAX)
            .map(|p| p.into_iter().map(|p| p.resource.uid).collect())
            .unwrap_or_default();
        // Coalesced like the links' ticks: a pass waits on peers (attaches,
        // closure checks), and a plain interval would pile ticks up behind it.
        let tick_queued = Arc::new(AtomicBool::new(true));
        let _ = myself.cast(ReconcilerMsg::Tick);
        let ticker = coalesced_ticks(
            &myself,
            ctx.tick.max(Duration::from_millis(200)),
            tick_queued.clone(),
            || ReconcilerMsg::Tick,
        );
        let closures_queued = Arc::new(AtomicBool::new(false));
        let closures = prompt_closures(&myself, &ctx.node, closures_queued.clone());
        Ok(ReconcilerState {
            closures: Some(closures),
            closures_queued,
            ctx,
            settle_after: PEER_CALL_TIMEOUT * 3,
            orphans,
            attach_after: None,
            next_attach_pass: clock::monotonic_now(),
            pass_due: None,
            pass_acted: false,
            ticker: Some(ticker),
            tick_queued,
            compaction_failed: Throttle::default(),
            attach_read_failed: Throttle::default(),
            closure_failed: Throttle::default(),
            control_failed: Throttle::default(),
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
        if let Some(c) = state.closures.take() {
            c.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<ReconcilerMsg>,
        msg: ReconcilerMsg,
        state: &mut ReconcilerState,
    ) -> Result<(), ActorProcessingErr> {
        let node = state.ctx.node.clone();
        if let ReconcilerMsg::Closures = msg {
            state.closures_queued.store(false, Ordering::Release);
            crate::closure_check::confirm_closures(&node, &state.closure_failed).await;
            return Ok(());
        }
        state.tick_queued.store(false, Ordering::Release);
        if let Some(below) = node.compactable_below() {
            compact_outbox(&node, below, state.ctx.tick, &state.compaction_failed).await;
        }
        crate::closure_check::confirm_closures(&node, &state.closure_failed).await;
        crate::operation_control::reconcile(&node, &state.control_failed).await;
        crate::undelete::reconcile(&node).await;
        // Unsettled creates are walked a page per tick, in passes. The next
        // pass starts at the next tick when this one had a create to settle
        // (it may have failed: retried as before), else when the youngest
        // create it left to its request becomes old enough to settle here
        // (`settle_after`). Why not the first page every tick: a settled
        // create's row is removed, a tombstone in an LSM engine until
        // compaction, and a scan from the first key passed all of them on
        // every tick: 63 % of all CPU in cascade-bench's P2 at 1M on fjall
        // (800k creates settled), enough to starve the nodes' connections.
        if state.attach_after.is_none() && clock::monotonic_now() < state.next_attach_pass {
            return Ok(());
        }
        const PAGE: usize = 100;
        let pending = match node.state().pending_attaches(state.attach_after.as_deref(), PAGE) {
            Ok(p) => {
                state.attach_read_failed.reset();
                p
            }
            Err(e) => {
                if let Some(more) = state.attach_read_failed.admit() {
                    warn!(error = %e, suppressed = more.count(), "reading unsettled creates failed{more}");
                }
                return Ok(());
            }
        };
        let pass_ends = pending.len() < PAGE;
        state.attach_after = pending.last().map(|last| last.resource.uid.as_bytes().to_vec());
        let now = node.clock.now();
        let mut due = Vec::new();
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
                let due = state.settle_after - age;
                state.pass_due = Some(state.pass_due.map_or(due, |d| d.min(due)));
                continue;
            }
            due.push(r);
        }
        // The page's due creates are settled at once: an owner that does
        // not answer costs the page one attach deadline, not one per create
        // behind it (the bound in README's "Creates across regions").
        state.pass_acted |= !due.is_empty();
        let settled = futures::future::join_all(due.iter().map(|r| node.reconcile(r))).await;
        for (r, done) in due.iter().zip(settled) {
            if done {
                state.orphans.remove(&r.uid);
            }
        }
        if pass_ends {
            let wait = if state.pass_acted {
                Duration::ZERO
            } else {
                state.pass_due.take().unwrap_or(state.settle_after)
            };
            state.next_attach_pass = clock::monotonic_now() + wait;
            state.attach_after = None;
            state.pass_due = None;
            state.pass_acted = false;
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::release_scan_start;

    /// A release key of the test: a prefix and one more byte.
    fn key(last: u8) -> Vec<u8> {
        vec![b'r', b'a', 0, last]
    }

    #[test]
    fn a_release_hinted_behind_the_position_is_sent_from_just_before_it_not_from_the_first_key() {
        let sent = key(200);
        // Hinted behind: the scan starts after the hinted key less its last
        // byte, below the hinted key and far past the first key.
        let (from, behind) = release_scan_start(Some(key(50)), Some(&sent));
        let from = from.expect("not the first key");
        assert!(behind);
        assert!(from < key(50) && from >= key(0)[..3].to_vec(), "{from:?}");
        // The very key the position was sent to counts as behind.
        assert!(release_scan_start(Some(sent.clone()), Some(&sent)).1);
        // Hinted ahead of the position, or nothing hinted: on from it.
        assert_eq!(
            release_scan_start(Some(key(201)), Some(&sent)),
            (Some(sent.clone()), false)
        );
        assert_eq!(release_scan_start(None, Some(&sent)), (Some(sent.clone()), false));
        // Nothing sent yet: from the first key.
        assert_eq!(release_scan_start(Some(key(7)), None), (None, false));
        // The store was reopened (an empty hint): from the first key.
        assert_eq!(release_scan_start(Some(Vec::new()), Some(&sent)), (None, true));
        assert_eq!(release_scan_start(Some(vec![1]), Some(&sent)), (None, true));
    }
}
