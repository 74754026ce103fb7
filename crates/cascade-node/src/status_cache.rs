//! The cluster status as the node keeps it between calls: the last
//! [`RegionStatus`] of every region and this region's last figures, with
//! when they were made.
//!
//! `Node` holds a [`StatusCache`]; the `Node` methods that fill and reuse
//! it (`Admin.GetClusterStatus`) are in `status.rs`, above the node. The
//! types live here, below it, so that the node can hold them without
//! importing a module that imports it back.

use crate::peers::RegionFigures;

/// The last answers, with when they were made (see `status.rs` for how
/// long they are reused).
#[derive(Default)]
pub(crate) struct StatusCache {
    pub(crate) figures: std::sync::Mutex<Option<(tokio::time::Instant, RegionFigures)>>,
    /// Held while a status is gathered: concurrent callers wait for it
    /// and take it, instead of asking every region again.
    pub(crate) cluster: tokio::sync::Mutex<Option<(tokio::time::Instant, Vec<RegionStatus>)>>,
}

/// One region as the answering node sees it.
#[derive(Debug, Clone)]
pub(crate) struct RegionStatus {
    pub region: String,
    pub address: String,
    /// None: it answered; Some: why it did not.
    pub unreachable: Option<String>,
    pub link_connected: bool,
    pub events_behind: i64,
    pub last_contact_ms: i64,
    pub figures: Option<RegionFigures>,
    /// The protocol version this node last heard the region announce (0:
    /// none yet); this node's own for its own region.
    pub protocol_version: u32,
}
