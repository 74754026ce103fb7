//! The outbox as a feed: what a stream of committed events reads from.
//!
//! The writer commits each step's events to the outbox table and only then
//! publishes them on the node's broadcast channel. A stream of them (the
//! client `Watch` and the peers' `Watch`, in `api/stream.rs`) replays what
//! is durable from a revision, then follows the broadcast; an
//! [`OutboxFeed`] is what it needs, handed out by `Node::feed`. It is not
//! a wire type: the wire edge turns the events it yields into messages.
//! (`WatchOperation` only uses the broadcast as a wake-up and re-reads the
//! operation: compaction cannot make it skip anything.)
//!
//! How long a slow watcher is waited for: compaction (the reconciler,
//! `Node::compactable_below`) keeps every event some peer region has not
//! acknowledged and at least the newest `[deletion] outbox_retention`
//! events; it never waits for a client watcher. A stream whose next
//! revision was compacted ends with OUT_OF_RANGE and the revision to resume
//! from, and [`Overtaken`] counts it and warns.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cascade_core::model::{Event, Revision};
use tokio::sync::{broadcast, watch};
use tracing::warn;

use crate::log_throttle::Throttle;
use crate::metrics::NodeMetrics;
use crate::store::Store;

/// Where a stream reads from and when it must stop.
pub struct OutboxFeed {
    pub store: Arc<dyn Store>,
    /// Subscribed before the replay starts, so nothing falls in between.
    pub live: broadcast::Receiver<Arc<Event>>,
    pub shutting_down: watch::Receiver<bool>,
    /// Where a stream that compaction overtook is reported.
    pub overtaken: Arc<Overtaken>,
    /// How far a stream may read the store (see [`Published`]).
    pub published: Arc<Published>,
}

/// The revision below which every event of the outbox is durable and was
/// published on the live feed: a stream replays the store only below it;
/// what is above comes from the live feed, after the writer's flush.
///
/// Why: a batch is visible to readers of the store as soon as it is
/// committed, before its flush. A flush that fails (a full disk) leaves
/// committed events that the engine may lose when it is reopened (sled
/// keeps only what reached the disk), after which their revisions are
/// given to other events. A stream that had read them from the store
/// would have sent revisions that never happened, and skipped the real
/// ones. A scan may also see part of a batch still being applied (sled
/// gives whole batches only to point reads); below this mark every batch
/// is whole. Only the writer moves it: after each flush, and after a
/// reopen to what the engine kept.
#[derive(Debug)]
pub struct Published(AtomicU64);

impl Published {
    /// Everything below `next` is durable (the node just opened its store).
    pub fn new(next: Revision) -> Self {
        Self(AtomicU64::new(next))
    }

    /// The first revision not yet durable and published.
    pub fn below(&self) -> Revision {
        self.0.load(Ordering::Acquire)
    }

    /// Everything below `next` is durable now, and is published next.
    pub(crate) fn advance(&self, next: Revision) {
        self.0.fetch_max(next, Ordering::AcqRel);
    }
}

/// Who reads a stream: named in the warning when compaction overtakes it.
#[derive(Debug, Clone)]
pub enum Watcher {
    /// A client's `Watch`, by its remote address (unknown on a connection
    /// that is not TCP, such as the simulation's).
    Client { addr: Option<SocketAddr> },
    /// Another region's link (`Peer.Watch`).
    Peer { region: String },
}

impl Watcher {
    /// The `stream` label of `cascade_watch_overtaken_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            Watcher::Client { .. } => "client",
            Watcher::Peer { .. } => "peer",
        }
    }
}

impl std::fmt::Display for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Watcher::Client { addr: Some(addr) } => write!(f, "client {addr}"),
            Watcher::Client { addr: None } => f.write_str("client (address unknown)"),
            Watcher::Peer { region } => write!(f, "peer region {region}"),
        }
    }
}

/// Counts and reports the streams compaction overtook: one counter
/// series per stream kind and one rate-limited warning per kind (a
/// controller that retries from a compacted revision in a loop, or many
/// slow clients at once, make one line a window with the count).
///
/// The throttles are never reset: each overtaken stream ends, so there is
/// no "caught up again" to wait for; a new episode is a new occurrence.
pub struct Overtaken {
    metrics: Arc<NodeMetrics>,
    clients: Throttle,
    peers: Throttle,
}

impl Overtaken {
    pub(crate) fn new(metrics: Arc<NodeMetrics>) -> Self {
        Self {
            metrics,
            clients: Throttle::default(),
            peers: Throttle::default(),
        }
    }

    /// `watcher` asked for `asked` (the first revision of a fresh watch, or
    /// the next one a running stream would send), below the outbox's
    /// oldest revision `floor`.
    pub fn report(&self, watcher: &Watcher, asked: Revision, floor: Revision) {
        self.metrics.watch_overtaken(watcher.kind());
        let throttle = match watcher {
            Watcher::Client { .. } => &self.clients,
            Watcher::Peer { .. } => &self.peers,
        };
        if let Some(more) = throttle.admit() {
            warn!(
                %watcher,
                reached = asked.saturating_sub(1),
                floor,
                suppressed = more.count(),
                "a watcher fell behind the outbox's compaction: its stream ends with OUT_OF_RANGE \
                 (it must re-list and resume from the floor; raise [deletion] outbox_retention \
                 if this repeats){more}"
            );
        }
    }
}
