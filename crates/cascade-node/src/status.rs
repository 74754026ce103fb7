//! `Admin.GetClusterStatus` (`cascade status`), as [`Node`] methods on
//! plain types: this region's own figures, every peer's (asked over
//! `Peer.RegionFigures`, concurrently, each within [`STATUS_DEADLINE`]),
//! and this node's view of its link to each, with the protocol version it
//! last heard each announce (the figures say what each says of itself:
//! its protocol and binary versions).
//!
//! A peer that does not answer is listed unreachable with the reason; the
//! status itself never fails because of it: it is what an operator looks
//! at when a region is in trouble.
//!
//! The types it answers and keeps ([`RegionStatus`], the node's
//! `StatusCache`) are in `status_cache.rs`, a peer's figures
//! ([`RegionFigures`]) are the port's (`crate::peers`): the node holds the
//! cache, so it lives below the node and this module above it.

use std::time::Duration;

use cascade_core::model::ResourceState;

use crate::error::Fault;
use crate::metrics::{DeletionSummary, SCRAPE_SCAN_LIMIT};
use crate::node::Node;
use crate::peers::{RegionFigures, RegionNode, MAX_REGION_NODES};
use crate::status_cache::RegionStatus;

/// How long a peer has to give its figures before it is listed
/// unreachable: short, so that a frozen region slows the answer by this
/// much at most.
pub(crate) const STATUS_DEADLINE: Duration = Duration::from_secs(2);

/// A status (and a region's figures) is reused for this long: the call is
/// open to every client and costs reads in every region, so a flood of
/// them costs one status a second.
pub(crate) const STATUS_REUSE: Duration = Duration::from_secs(1);

impl Node {
    /// This region's figures: resources by state (the metrics' running
    /// counts), deletions by status and the oldest one's age (a read of at
    /// most [`SCRAPE_SCAN_LIMIT`] deletion records).
    pub(crate) fn region_figures(&self) -> Result<RegionFigures, Fault> {
        let fresh = |at: &tokio::time::Instant| at.elapsed() < STATUS_REUSE;
        if let Some((_, figures)) = self
            .status_cache
            .figures
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .filter(|(at, _)| fresh(at))
        {
            return Ok(figures);
        }
        // The reads wait on the engine: not on a runtime worker.
        let figures = crate::writer::off_the_workers(self.store.waits_on_io(), || self.read_figures())?;
        if let Ok(mut cache) = self.status_cache.figures.lock() {
            *cache = Some((crate::clock::monotonic_now(), figures.clone()));
        }
        Ok(figures)
    }

    fn read_figures(&self) -> Result<RegionFigures, Fault> {
        let state = self.state();
        let summary = DeletionSummary::read(&state, self.clock.now().0)?;
        let status = |s: &str| summary.by_status.get(s).copied().unwrap_or(0).max(0) as u64;
        let resources = |s| self.metrics.resource_count(s).max(0) as u64;
        let schema = self.schema_in_force.version();
        Ok(RegionFigures {
            resources_creating: resources(ResourceState::Creating),
            resources_active: resources(ResourceState::Active),
            resources_deleting: resources(ResourceState::Deleting),
            deletions_pending: status("pending"),
            deletions_blocked: status("blocked"),
            deletions_waiting: status("waiting"),
            deletions_failed: status("failed"),
            oldest_deletion_age_ms: i64::try_from(summary.oldest_age_ms).unwrap_or(i64::MAX),
            last_revision: state.next_revision_stored()?.saturating_sub(1),
            truncated: summary.truncated,
            protocol_version: self.peers.own_version,
            binary_version: env!("CARGO_PKG_VERSION").to_owned(),
            nodes: self.region_nodes(),
            writer_epoch: self.role.as_ref().map_or(0, |r| r.epoch),
            authentication: self.auth.describe(),
            schema_version: schema.digest,
            schema_label: schema.label.unwrap_or_default(),
        })
    }

    /// The region's nodes as they announced themselves, this one (the
    /// writer) marked; empty for a region of one node. A members read
    /// that fails leaves the list with this node alone: the status is
    /// what an operator reads when the database is in trouble.
    fn region_nodes(&self) -> Vec<RegionNode> {
        let Some(role) = &self.role else {
            return Vec::new();
        };
        let me = RegionNode {
            node: role.me.node.clone(),
            address: role.me.address.clone(),
            writer: true,
            binary_version: role.me.version.clone(),
            last_seen_ms: 0,
        };
        let members = match role.lease.members() {
            Ok(members) => members,
            Err(e) => {
                tracing::warn!(region = %self.region, error = %e, "cannot read the region's nodes");
                return vec![me];
            }
        };
        let mut nodes: Vec<RegionNode> = members
            .into_iter()
            .filter(|m| m.node.node != role.me.node)
            .take(MAX_REGION_NODES - 1)
            .map(|m| RegionNode {
                node: m.node.node,
                address: m.node.address,
                writer: false,
                binary_version: m.node.version,
                last_seen_ms: i64::try_from(m.last_seen.as_millis()).unwrap_or(i64::MAX),
            })
            .collect();
        nodes.push(me);
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        nodes
    }

    /// Every region of the cluster, this one first (reused for a second);
    /// a peer has `deadline` to answer (at most [`STATUS_DEADLINE`]: the
    /// caller's own deadline may leave less, as the console's pages do).
    pub(crate) async fn cluster_status(&self, deadline: Duration) -> Result<Vec<RegionStatus>, Fault> {
        let mut cache = self.status_cache.cluster.lock().await;
        if let Some((at, regions)) = cache.as_ref() {
            if at.elapsed() < STATUS_REUSE {
                return Ok(regions.clone());
            }
        }
        let regions = self.gather_status(deadline.min(STATUS_DEADLINE)).await?;
        *cache = Some((crate::clock::monotonic_now(), regions.clone()));
        Ok(regions)
    }

    async fn gather_status(&self, deadline: Duration) -> Result<Vec<RegionStatus>, Fault> {
        let own = RegionStatus {
            region: self.region.to_string(),
            address: self.advertised.lock().ok().and_then(|a| a.clone()).unwrap_or_default(),
            unreachable: None,
            link_connected: true,
            events_behind: 0,
            last_contact_ms: self.clock.now().0 as i64,
            figures: Some(self.region_figures()?),
            protocol_version: self.peers.own_version,
        };
        let asked = self.peers.regions().map(|region| async move {
            let answer = self.peers.region_figures(region, deadline).await;
            (region, answer)
        });
        let answers = futures::future::join_all(asked).await;
        let mut regions = vec![own];
        for (region, answer) in answers {
            let (figures, unreachable) = match answer {
                Ok(f) => (Some(f), None),
                Err(e) => (None, Some(e.to_string())),
            };
            regions.push(RegionStatus {
                region: region.to_owned(),
                address: self.peer_addresses.get(region).cloned().unwrap_or_default(),
                unreachable,
                link_connected: self.metrics.is_connected(region),
                events_behind: crate::writer::off_the_workers(self.store.waits_on_io(), || {
                    self.events_behind(region, SCRAPE_SCAN_LIMIT)
                })?
                .map_or(-1, |(n, _)| n as i64),
                last_contact_ms: self
                    .metrics
                    .last_contact(region)
                    .map_or(0, |seconds| (seconds * 1000.0) as i64),
                figures,
                // After the call for its figures: what its answer announced.
                protocol_version: self.peers.version_of(region).unwrap_or(0),
            });
        }
        Ok(regions)
    }
}
