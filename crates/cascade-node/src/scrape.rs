//! What a metrics scrape reads of the node: [`Node`] as the registry's
//! [`ScrapeSource`] (the store, the clock, the peers and how far each is
//! behind this node's outbox).
//!
//! The registry (`metrics.rs`) lies below the node, which holds it; this
//! is the part of the metrics that needs the node, so it sits above it,
//! beside the other modules that add to `Node`.

use crate::codec::StoreState;
use crate::error::Fault;
use crate::metrics::{NodeMetrics, ScrapeSource};
use crate::node::Node;

impl ScrapeSource for Node {
    fn metrics(&self) -> &NodeMetrics {
        &self.metrics
    }

    fn store_state(&self) -> StoreState<'_> {
        self.state()
    }

    fn now_ms(&self) -> u64 {
        self.clock.now().0
    }

    fn peer_regions(&self) -> Vec<&str> {
        self.peers.regions().collect()
    }

    fn peer_events_behind(&self, peer: &str, limit: usize) -> Result<Option<(u64, bool)>, Fault> {
        self.events_behind(peer, limit)
    }
}
