//! What other regions' nodes answer, as the domain reads it: the values the
//! typed calls of [`Peers`](super::Peers) return, on core types.
//!
//! The calls themselves decode the wire into these (`api/peer_client.rs`);
//! the flows that use them (`cluster.rs`, `explain.rs`, `status.rs`, the
//! links) never see a wire type.

use cascade_core::explain::Part;
use cascade_core::model::{RefTarget, RemoteEvent};
use cascade_core::Uid;

/// What an owner says about one of its resources (`Peer.Lookup`).
pub(crate) enum LookupAnswer {
    /// ACTIVE, with this uid.
    Live(Uid),
    /// Being deleted: to another region it is already gone (seed 000).
    Deleting,
    /// No such resource.
    Absent,
}

/// One event of a peer's outbox (`Peer.Watch`), with the trace context of
/// the step that committed it (when the peer traces and still knows it).
pub(crate) struct WatchedEvent {
    pub event: RemoteEvent,
    pub traceparent: Option<String>,
}

/// One item of a peer's watch stream (`Peer.Watch`).
pub(crate) enum Watched {
    Event(WatchedEvent),
    /// A heartbeat; with a revision above 0 also a progress mark: the peer
    /// sent every event up to it that concerns this region (the others,
    /// the leaves it purged, change nothing here), so the cursor moves
    /// there. From a peer that sends none (an older one) the cursor stays
    /// at the last event applied, as before.
    Beat {
        passed_through: cascade_core::model::Revision,
    },
}

/// Why a peer's watch stream ended.
pub(crate) enum WatchEnd {
    /// The peer compacted its outbox past the cursor: resync from its listing.
    Compacted,
    /// Anything else (the text says what); reconnect after a backoff.
    Failed(String),
}

/// One region's part of an explanation (`Peer.ExplainPart`; this region's
/// own is `Node::explain_part`).
#[derive(Debug, Clone, Default)]
pub(crate) struct ExplainPart {
    /// The operation's root, when this region keeps a part of it.
    pub root: Option<RefTarget>,
    /// Its DELETING resources of the operation.
    pub parts: Vec<Part>,
    /// More were found than one answer holds.
    pub truncated: bool,
}

/// One region's own figures (`Peer.RegionFigures`; see `RegionFigures` in
/// admin.proto), for the cluster status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RegionFigures {
    pub resources_creating: u64,
    pub resources_active: u64,
    pub resources_deleting: u64,
    pub deletions_pending: u64,
    pub deletions_blocked: u64,
    pub deletions_waiting: u64,
    pub deletions_failed: u64,
    pub oldest_deletion_age_ms: i64,
    pub last_revision: u64,
    pub truncated: bool,
    /// The protocol version the region says it speaks (0: it says none,
    /// a node before version 2).
    pub protocol_version: u32,
    /// Its binary's version (empty: it says none).
    pub binary_version: String,
    /// Its nodes, when it is a region of several nodes (by name).
    pub nodes: Vec<RegionNode>,
    /// The epoch its writer commits with (0: no lease).
    pub writer_epoch: u64,
    /// "none" or "required: " and its means (empty: it says nothing).
    pub authentication: String,
    /// Its schema's version (a digest; empty: it says none) and label.
    pub schema_version: String,
    pub schema_label: String,
}

/// One node of a region of several nodes, as the region's writer reads
/// the members rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegionNode {
    pub node: String,
    pub address: String,
    /// It holds the lease (the node that answered).
    pub writer: bool,
    pub binary_version: String,
    pub last_seen_ms: i64,
}

/// What the root's region of an operation tells another one about it
/// (`Peer.OperationControl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ControlAction {
    /// Register a bounded operation before its delete starts.
    Register(cascade_core::protocol::Bounds),
    /// Pause, resume or cancel its part.
    Apply(cascade_core::protocol::Control),
}

/// A pause, resume or cancel the root's region owes another region
/// (`Node::undelivered_controls`).
#[derive(Debug, Clone)]
pub(crate) struct ControlToDeliver {
    /// What to tell it.
    pub(crate) control: cascade_core::protocol::Control,
    /// The operation's root (the region creates its part with it).
    pub(crate) root: cascade_core::RefTarget,
    /// Who asked, and why (audited there).
    pub(crate) who: String,
    pub(crate) reason: String,
}
