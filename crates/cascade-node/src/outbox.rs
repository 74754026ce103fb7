//! The outbox as a feed: what a stream of committed events reads from.
//!
//! The writer commits each step's events to the outbox table and only then
//! publishes them on the node's broadcast channel. A stream of them (the
//! client `Watch`, `WatchOperation` and the peers' `Watch`, in `api/`)
//! replays what is durable from a revision, then follows the broadcast; an
//! [`OutboxFeed`] is the three things it needs, handed out by
//! `Node::feed`. It is not a wire type: the wire edge turns the events it
//! yields into messages.

use std::sync::Arc;

use cascade_core::model::Event;
use tokio::sync::{broadcast, watch};

use crate::store::Store;

/// Where a stream reads from and when it must stop.
pub struct OutboxFeed {
    pub store: Arc<dyn Store>,
    /// Subscribed before the replay starts, so nothing falls in between.
    pub live: broadcast::Receiver<Arc<Event>>,
    pub shutting_down: watch::Receiver<bool>,
}
