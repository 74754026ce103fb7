//! A node's Prometheus metrics, and the HTTP listener that serves them
//! (`metrics_listen`, path `/metrics`).
//!
//! One [`Registry`] per node, not a process-global recorder: the demo and
//! the tests run several nodes in one process, and each must expose its
//! own figures on its own port. Names follow Prometheus' conventions:
//! prefix `cascade_`, base units (`_seconds`), `_total` on counters.
//!
//! Three kinds of figures, by where they come from:
//! - **counted where they happen**: the writer (steps, batches, resources by
//!   state, deletions accepted, finished and retried), the peer links
//!   (connected, last contact), the gRPC layer (`api/grpc_metrics.rs`);
//! - **read at scrape time** from the store, each read bounded
//!   ([`SCRAPE_SCAN_LIMIT`]): deletions by status and their ages, the
//!   retry queue, the outbox, pending releases per peer, the age of the
//!   oldest CREATING resource;
//! - **derived** at scrape time: how far each peer is behind this node's
//!   outbox (the last revision minus the peer's acknowledgement).
//!
//! What is read at scrape time is read through a [`ScrapeSource`], which
//! the node implements (`scrape.rs`): the node holds this registry, so the
//! registry does not name the node.
//!
//! Resources by state are kept exact without a scan per scrape: counted
//! once when the node opens, then moved by every committed write (the
//! writer reads the stored state a write replaces; the step has just read
//! it, so the engine's cache answers).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cascade_core::model::{DeletionRecord, DeletionStatus as Held, Event, EventType, Resource, ResourceState};
use cascade_core::state::WriteSet;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};
use tracing::{info, warn};

use crate::codec::StoreState;
use crate::error::Fault;
use crate::store::{StoreError, Table};

/// At most this many rows of one table are read per scrape (deletions,
/// pending releases of one peer). Beyond it a figure counts the first
/// rows only, and `cascade_metrics_scan_truncated` says so: a scrape
/// every 15 s must not cost a full read of a million-row cascade.
pub const SCRAPE_SCAN_LIMIT: usize = 100_000;

/// The `state` label of `cascade_resources`.
fn state_label(state: ResourceState) -> &'static str {
    match state {
        ResourceState::Creating => "creating",
        ResourceState::Active => "active",
        ResourceState::Deleting => "deleting",
        ResourceState::Deleted => "deleted",
    }
}

/// The `status` label of `cascade_deletions`.
fn status_label(status: &Held) -> &'static str {
    match status {
        Held::Pending => "pending",
        Held::Blocked { .. } => "blocked",
        Held::Waiting { .. } => "waiting",
        Held::Failed { .. } => "failed",
    }
}

/// Every metric of one node.
pub struct NodeMetrics {
    registry: Registry,
    /// A scrape reads the store: while it fails, every scrape would warn.
    scrape_failed: crate::log_throttle::Throttle,
    resources: IntGaugeVec,
    deletions_accepted: IntCounter,
    deletions_started: IntCounter,
    deletions_finished: IntCounterVec,
    deletion_retries: IntCounter,
    writer_step_seconds: HistogramVec,
    writer_batch_keys: Histogram,
    writer_commit_failures: IntCounter,
    store_reopens: IntCounter,
    writer_restarts: IntCounter,
    deletions: IntGaugeVec,
    retry_queue_depth: IntGauge,
    unfinished_work_seconds: Gauge,
    longest_running_seconds: Gauge,
    creating_oldest_seconds: Gauge,
    scan_truncated: IntGaugeVec,
    outbox_events: IntGauge,
    outbox_floor: IntGauge,
    audit_entries: IntGauge,
    audit_pruned: IntCounter,
    outbox_last: IntGauge,
    peer_connected: IntGaugeVec,
    peer_events_behind: IntGaugeVec,
    peer_last_contact: GaugeVec,
    peer_pending_releases: IntGaugeVec,
    peer_events_received: IntCounterVec,
    grpc_requests: IntCounterVec,
    grpc_seconds: HistogramVec,
    watch_overtaken: IntCounterVec,
    writer_epoch: IntGauge,
    lease_takeovers: IntGauge,
}

/// Registers `metric` and hands it back (registration fails only on a
/// duplicate name, which [`NodeMetrics::new`] never makes).
fn registered<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    if let Err(e) = registry.register(Box::new(metric.clone())) {
        warn!(error = %e, "a metric could not be registered");
    }
    metric
}

/// Builds a metric from constant options (the names and labels are
/// literals of this file; a malformed one is a bug caught by every test
/// that starts a node).
fn build<M>(made: prometheus::Result<M>) -> M {
    match made {
        Ok(m) => m,
        Err(e) => panic!("a metric of metrics.rs is malformed: {e}"),
    }
}

impl NodeMetrics {
    /// The registry, for metrics a lower module keeps itself (the policy's, `auth/policy.rs`).
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The node's metrics, registered, all at zero.
    pub fn new() -> Self {
        let r = Registry::new();
        let latency = vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ];
        Self {
            resources: registered(&r, build(IntGaugeVec::new(
                Opts::new("cascade_resources", "Resources this region owns, by state."),
                &["state"],
            ))),
            deletions_accepted: registered(&r, build(IntCounter::new(
                "cascade_deletions_accepted_total",
                "Delete requests this region accepted (one per operation it roots).",
            ))),
            deletions_started: registered(&r, build(IntCounter::new(
                "cascade_deletions_started_total",
                "Resources that entered DELETING, requested or reached by a cascade.",
            ))),
            deletions_finished: registered(&r, build(IntCounterVec::new(
                Opts::new(
                    "cascade_deletions_finished_total",
                    "Deletions that ended: outcome purged, or failed after their maximum attempts (a failed one may still be purged later, by a retry, a force-purge or a removed finalizer, and is then counted again as purged).",
                ),
                &["outcome"],
            ))),
            deletion_retries: registered(&r, build(IntCounter::new(
                "cascade_deletion_retries_total",
                "Deletion attempts that could not finish and were scheduled again (with backoff).",
            ))),
            writer_step_seconds: registered(&r, build(HistogramVec::new(
                HistogramOpts::new(
                    "cascade_writer_step_duration_seconds",
                    "One protocol step of the writer: reads, atomic commit and flush.",
                )
                .buckets(latency.clone()),
                &["step"],
            ))),
            writer_batch_keys: registered(&r, build(Histogram::with_opts(
                HistogramOpts::new(
                    "cascade_writer_batch_keys",
                    "Keys written (put or removed) per atomic batch the writer committed.",
                )
                .buckets(prometheus::exponential_buckets(1.0, 4.0, 10).unwrap_or_default()),
            ))),
            writer_commit_failures: registered(&r, build(IntCounter::new(
                "cascade_writer_commit_failures_total",
                "Steps whose commit the storage engine refused (health is NOT_SERVING meanwhile).",
            ))),
            store_reopens: registered(&r, build(IntCounter::new(
                "cascade_store_reopens_total",
                "Times the writer reopened the storage engine from its files to heal it (after a full disk, a read-only remount).",
            ))),
            writer_restarts: registered(&r, build(IntCounter::new(
                "cascade_writer_restarts_total",
                "Times the supervisor restarted a writer that failed (panicked), after a backoff of 100 ms doubling to 2 s.",
            ))),
            deletions: registered(&r, build(IntGaugeVec::new(
                Opts::new(
                    "cascade_deletions",
                    "Unfinished deletions of this region's resources, by status (pending, blocked, waiting, failed).",
                ),
                &["status"],
            ))),
            retry_queue_depth: registered(&r, build(IntGauge::new(
                "cascade_retry_queue_depth",
                "Entries in the durable deletion work queue (due now or backing off).",
            ))),
            unfinished_work_seconds: registered(&r, build(Gauge::new(
                "cascade_deletion_unfinished_work_seconds",
                "Sum of the ages of the unfinished deletions (as Kubernetes' workqueue_unfinished_work_seconds).",
            ))),
            longest_running_seconds: registered(&r, build(Gauge::new(
                "cascade_deletion_longest_running_seconds",
                "Age of the oldest unfinished deletion (as workqueue_longest_running_processor_seconds).",
            ))),
            creating_oldest_seconds: registered(&r, build(Gauge::new(
                "cascade_creating_oldest_seconds",
                "Age of the oldest CREATING resource of this region (a create whose references into other regions are not settled yet; 0: none).",
            ))),
            scan_truncated: registered(&r, build(IntGaugeVec::new(
                Opts::new(
                    "cascade_metrics_scan_truncated",
                    "1 when the last scrape read only the first rows of a table (see SCRAPE_SCAN_LIMIT).",
                ),
                &["table"],
            ))),
            outbox_events: registered(&r, build(IntGauge::new(
                "cascade_outbox_events",
                "Events retained in the outbox (peers and watchers resume from them).",
            ))),
            outbox_floor: registered(&r, build(IntGauge::new(
                "cascade_outbox_floor_revision",
                "The oldest revision still in the outbox: compaction removed everything below.",
            ))),
            audit_entries: registered(&r, build(IntGauge::new(
                "cascade_audit_entries",
                "Entries this region's audit log holds (-1 until the first retention step counted a log from before the count was kept).",
            ))),
            audit_pruned: registered(&r, build(IntCounter::new(
                "cascade_audit_pruned_total",
                "Audit entries retention removed ([audit] retain and max_entries).",
            ))),
            writer_epoch: registered(&r, build(IntGauge::new(
                "cascade_writer_epoch",
                "The writer lease's epoch this node writes with (goes up at every takeover in its region; 0: a region of one node, without a lease).",
            ))),
            lease_takeovers: registered(&r, build(IntGauge::new(
                "cascade_lease_takeovers",
                "Times this process took its region's writer lease since it started (a region of several nodes over PostgreSQL).",
            ))),
            outbox_last: registered(&r, build(IntGauge::new(
                "cascade_outbox_last_revision",
                "The newest revision in the outbox (0: none yet).",
            ))),
            peer_connected: registered(&r, build(IntGaugeVec::new(
                Opts::new(
                    "cascade_peer_connected",
                    "1 while this node follows the peer region's outbox (its watch stream is up).",
                ),
                &["peer"],
            ))),
            peer_events_behind: registered(&r, build(IntGaugeVec::new(
                Opts::new(
                    "cascade_peer_events_behind",
                    "Events of this node's outbox the peer is sent and has not acknowledged yet (-1: no acknowledgement since this node started).",
                ),
                &["peer"],
            ))),
            peer_last_contact: registered(&r, build(GaugeVec::new(
                Opts::new(
                    "cascade_peer_last_contact_timestamp_seconds",
                    "Unix time of the last successful exchange with the peer (0: none since this node started).",
                ),
                &["peer"],
            ))),
            peer_pending_releases: registered(&r, build(IntGaugeVec::new(
                Opts::new(
                    "cascade_peer_pending_releases",
                    "Releases of back-references queued for the peer (the owner) and not acknowledged yet.",
                ),
                &["peer"],
            ))),
            peer_events_received: registered(&r, build(IntCounterVec::new(
                Opts::new(
                    "cascade_peer_events_received_total",
                    "Events of the peer's outbox this node's link received, by type (deleting, deletion_forced, purged), whether it applied them or not.",
                ),
                &["peer", "type"],
            ))),
            grpc_requests: registered(&r, build(IntCounterVec::new(
                Opts::new(
                    "cascade_grpc_server_requests_total",
                    "gRPC calls served, by method and status code (a stream is counted when it ends).",
                ),
                &["method", "code"],
            ))),
            grpc_seconds: registered(&r, build(HistogramVec::new(
                HistogramOpts::new(
                    "cascade_grpc_server_request_duration_seconds",
                    "Time from a call's arrival to its status (a stream: its whole life).",
                )
                .buckets(latency),
                &["method"],
            ))),
            watch_overtaken: registered(&r, build(IntCounterVec::new(
                Opts::new(
                    "cascade_watch_overtaken_total",
                    "Watch streams ended with OUT_OF_RANGE because the revision they asked for or had reached was compacted, by stream (client, peer).",
                ),
                &["stream"],
            ))),
            registry: r,
            scrape_failed: crate::log_throttle::Throttle::default(),
        }
        .with_zeroes()
    }

    /// Labelled series that should read 0 rather than be absent before
    /// their first event (an alert on `rate(...)` needs the series).
    fn with_zeroes(self) -> Self {
        for outcome in ["purged", "failed"] {
            let _ = self.deletions_finished.with_label_values(&[outcome]);
        }
        for stream in ["client", "peer"] {
            let _ = self.watch_overtaken.with_label_values(&[stream]);
        }
        self
    }

    /// Counts the resources of `state` by state, once, when the node opens
    /// (a full read: the only one; the writer keeps the counts after).
    pub(crate) fn count_resources(&self, state: &StoreState<'_>) -> Result<(), StoreError> {
        let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page: Vec<Resource> = state.scan(Table::Resources, &[], after.as_deref(), 10_000)?;
            let Some(last) = page.last() else { break };
            // Resources are keyed by their name.
            after = Some(last.name.as_str().as_bytes().to_vec());
            for r in &page {
                *counts.entry(state_label(r.state)).or_default() += 1;
            }
        }
        for s in [
            ResourceState::Creating,
            ResourceState::Active,
            ResourceState::Deleting,
            ResourceState::Deleted,
        ] {
            let label = state_label(s);
            self.resources
                .with_label_values(&[label])
                .set(counts.get(label).copied().unwrap_or(0));
        }
        Ok(())
    }

    /// What one committed step changed, given the stored values it replaced
    /// (`before`, read before the commit).
    pub(crate) fn record_commit(&self, writes: &WriteSet, before: &[Option<ResourceState>], batch_keys: usize) {
        self.writer_batch_keys.observe(batch_keys as f64);
        for (old, new) in before.iter().zip(writes.resources.values()) {
            let new = new.as_ref().map(|r| r.state);
            if let Some(old) = old {
                self.resources.with_label_values(&[state_label(*old)]).dec();
            }
            if let Some(new) = new {
                self.resources.with_label_values(&[state_label(new)]).inc();
            }
            // From the states, not the events, whichever step made them. A
            // resource with nothing to wait for goes from ACTIVE to purged
            // in one step: it started and finished. A CREATING one removed
            // is a create taken back, not a deletion.
            let (active, deleting) = (Some(ResourceState::Active), Some(ResourceState::Deleting));
            let purged = new.is_none() && (*old == active || *old == deleting);
            if (new == deleting && *old != deleting) || (purged && *old == active) {
                self.deletions_started.inc();
            }
            if purged {
                self.deletions_finished.with_label_values(&["purged"]).inc();
            }
        }
        for e in &writes.events {
            self.count_event(e);
        }
    }

    fn count_event(&self, e: &Event) {
        if e.event_type == EventType::DeletionFailed {
            self.deletions_finished.with_label_values(&["failed"]).inc();
        }
    }

    /// Resources of this region in `state`, as counted.
    pub(crate) fn resource_count(&self, state: ResourceState) -> i64 {
        self.resources.with_label_values(&[state_label(state)]).get()
    }

    /// A work step scheduled `n` deletions again after attempts that could
    /// not finish (`WorkReport::retried`).
    pub(crate) fn deletions_retried(&self, n: usize) {
        self.deletion_retries.inc_by(n as u64);
    }

    /// A Delete request was accepted (an operation rooted here began).
    pub(crate) fn deletion_accepted(&self) {
        self.deletions_accepted.inc();
    }

    /// A writer step of kind `step` took `took`.
    pub(crate) fn writer_step(&self, step: &'static str, took: Duration) {
        self.writer_step_seconds
            .with_label_values(&[step])
            .observe(took.as_secs_f64());
    }

    /// The engine refused a commit.
    pub(crate) fn commit_failed(&self) {
        self.writer_commit_failures.inc();
    }

    /// A retention step removed `n` audit entries.
    pub(crate) fn audit_pruned(&self, n: usize) {
        self.audit_pruned.inc_by(n as u64);
    }

    /// The writer reopened the storage engine to heal it.
    pub(crate) fn store_reopened(&self) {
        self.store_reopens.inc();
    }

    /// The supervisor restarted a writer that failed.
    pub(crate) fn writer_restarted(&self) {
        self.writer_restarts.inc();
    }

    /// The link to `peer` is following its outbox (or not).
    pub(crate) fn peer_connected(&self, peer: &str, connected: bool) {
        self.peer_connected.with_label_values(&[peer]).set(i64::from(connected));
    }

    /// The link to `peer` received one of its outbox events (labelled with
    /// the protocol's name of its type in lower case: `deletion_forced`).
    pub(crate) fn peer_event_received(&self, peer: &str, event_type: cascade_core::model::EventType) {
        use cascade_core::model::EventType;
        let label = match event_type {
            EventType::Deleting => "deleting",
            EventType::DeletionForced => "deletion_forced",
            EventType::Purged => "purged",
            _ => "other",
        };
        self.peer_events_received.with_label_values(&[peer, label]).inc();
    }

    /// A call to `peer` succeeded at `unix_seconds`.
    pub(crate) fn peer_contact(&self, peer: &str, unix_seconds: f64) {
        self.peer_last_contact.with_label_values(&[peer]).set(unix_seconds);
    }

    /// The unix time of the last successful exchange with `peer`, if any.
    pub(crate) fn last_contact(&self, peer: &str) -> Option<f64> {
        let seconds = self.peer_last_contact.get_metric_with_label_values(&[peer]).ok()?.get();
        (seconds > 0.0).then_some(seconds)
    }

    /// Whether the link to `peer` is following its outbox.
    pub(crate) fn is_connected(&self, peer: &str) -> bool {
        self.peer_connected
            .get_metric_with_label_values(&[peer])
            .is_ok_and(|g| g.get() == 1)
    }

    /// A watch stream of kind `stream` (client, peer) was overtaken by
    /// compaction (`outbox.rs`).
    pub(crate) fn watch_overtaken(&self, stream: &str) {
        self.watch_overtaken.with_label_values(&[stream]).inc();
    }

    /// How many `stream` watches were overtaken (for unit tests).
    #[cfg(test)]
    pub(crate) fn watch_overtaken_count(&self, stream: &str) -> u64 {
        self.watch_overtaken.with_label_values(&[stream]).get()
    }

    /// A gRPC call of `method` ended with `code` after `took`.
    pub(crate) fn grpc_call(&self, method: &str, code: &str, took: Duration) {
        self.grpc_requests.with_label_values(&[method, code]).inc();
        self.grpc_seconds
            .with_label_values(&[method])
            .observe(took.as_secs_f64());
    }

    /// The text exposition of every metric, after refreshing what is read
    /// at scrape time from `node`.
    pub(crate) fn render(&self, node: &dyn ScrapeSource) -> String {
        match self.refresh(node) {
            Ok(()) => {
                self.scrape_failed.reset();
            }
            Err(e) => {
                if let Some(more) = self.scrape_failed.admit() {
                    warn!(error = %e, suppressed = more.count(), "metrics: reading the store failed; serving the last figures{more}");
                }
            }
        }
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            warn!(error = %e, "metrics: encoding failed");
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The writer lease this node holds: its epoch, and how many times this
    /// process took the lease over.
    pub(crate) fn set_lease(&self, epoch: u64, takeovers: u64) {
        self.writer_epoch.set(i64::try_from(epoch).unwrap_or(i64::MAX));
        self.lease_takeovers.set(i64::try_from(takeovers).unwrap_or(i64::MAX));
    }

    /// Reads the figures kept in the store.
    fn refresh(&self, node: &dyn ScrapeSource) -> Result<(), Fault> {
        let state = node.store_state();
        let now_ms = node.now_ms();
        let summary = DeletionSummary::read(&state, now_ms)?;
        self.truncated("deletions", summary.truncated);
        for (status, n) in &summary.by_status {
            self.deletions.with_label_values(&[status]).set(*n);
        }
        self.unfinished_work_seconds.set(summary.total_age_ms as f64 / 1000.0);
        self.longest_running_seconds.set(summary.oldest_age_ms as f64 / 1000.0);
        let (oldest_creating_ms, unsettled_truncated) = oldest_creating_ms(&state, now_ms)?;
        self.truncated("pending_attach", unsettled_truncated);
        self.creating_oldest_seconds.set(oldest_creating_ms as f64 / 1000.0);
        let queue = state.store.scan(Table::RetryQueue, &[], None, SCRAPE_SCAN_LIMIT)?.len();
        self.truncated("retry_queue", queue >= SCRAPE_SCAN_LIMIT);
        self.retry_queue_depth.set(queue as i64);
        let next = state.next_revision_stored()?;
        let floor = state.outbox_floor()?;
        let last = next.saturating_sub(1);
        self.outbox_last.set(last as i64);
        self.outbox_floor.set(floor as i64);
        self.outbox_events.set(next.saturating_sub(floor) as i64);
        let audited = state.audit_count()?;
        self.audit_entries
            .set(audited.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX)));
        let (mut outbox_truncated, mut releases_truncated) = (false, false);
        for peer in node.peer_regions() {
            let behind = match node.peer_events_behind(peer, SCRAPE_SCAN_LIMIT)? {
                Some((n, truncated)) => {
                    outbox_truncated |= truncated;
                    n as i64
                }
                None => -1,
            };
            self.peer_events_behind.with_label_values(&[peer]).set(behind);
            let pending = state
                .store
                .scan(
                    Table::PendingReleases,
                    &crate::codec::release_prefix(peer),
                    None,
                    SCRAPE_SCAN_LIMIT,
                )?
                .len();
            releases_truncated |= pending >= SCRAPE_SCAN_LIMIT;
            self.peer_pending_releases
                .with_label_values(&[peer])
                .set(pending as i64);
            // Present from the first scrape, at 0, rather than absent.
            let _ = self.peer_connected.with_label_values(&[peer]);
            let _ = self.peer_last_contact.with_label_values(&[peer]);
        }
        self.truncated("outbox", outbox_truncated);
        self.truncated("pending_releases", releases_truncated);
        Ok(())
    }

    fn truncated(&self, table: &str, truncated: bool) {
        self.scan_truncated
            .with_label_values(&[table])
            .set(i64::from(truncated));
    }
}

impl Default for NodeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The age of the oldest CREATING resource (0 when there is none), and
/// whether the read stopped at [`SCRAPE_SCAN_LIMIT`]. Read from the rows of
/// unconfirmed attaches, which every CREATING resource has (ACTIVE ones with
/// an update's attach pending have one too, and are skipped): a bounded
/// scan of a table that is empty on a settled node, not of every resource.
fn oldest_creating_ms(state: &StoreState<'_>, now_ms: u64) -> Result<(u64, bool), StoreError> {
    let pending = state.pending_attaches(None, SCRAPE_SCAN_LIMIT)?;
    let mut oldest = 0u64;
    for p in &pending {
        if let Some(r) = state.get_resource(&p.resource.name)? {
            if r.uid == p.resource.uid && r.state == ResourceState::Creating {
                oldest = oldest.max(now_ms.saturating_sub(r.create_time.0));
            }
        }
    }
    Ok((oldest, pending.len() >= SCRAPE_SCAN_LIMIT))
}

/// Unfinished deletions counted by status, with their ages (for the
/// metrics and `Admin.GetClusterStatus`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct DeletionSummary {
    /// Every status label, present even at zero.
    pub by_status: BTreeMap<&'static str, i64>,
    pub total_age_ms: u64,
    pub oldest_age_ms: u64,
    /// Only the first [`SCRAPE_SCAN_LIMIT`] records were read.
    pub truncated: bool,
}

impl DeletionSummary {
    /// The deletion table's summary, reading at most [`SCRAPE_SCAN_LIMIT`] records.
    pub fn read(state: &StoreState<'_>, now_ms: u64) -> Result<Self, StoreError> {
        let records = state.scan::<DeletionRecord>(Table::Deletions, &[], None, SCRAPE_SCAN_LIMIT)?;
        Ok(Self {
            truncated: records.len() >= SCRAPE_SCAN_LIMIT,
            ..Self::of(&records, now_ms)
        })
    }

    fn of(records: &[DeletionRecord], now_ms: u64) -> Self {
        let mut by_status: BTreeMap<&'static str, i64> = ["pending", "blocked", "waiting", "failed"]
            .into_iter()
            .map(|s| (s, 0))
            .collect();
        let (mut total_age_ms, mut oldest_age_ms) = (0u64, 0u64);
        for r in records {
            *by_status.entry(status_label(&r.status)).or_default() += 1;
            let age = now_ms.saturating_sub(r.deleted_at.0);
            total_age_ms = total_age_ms.saturating_add(age);
            oldest_age_ms = oldest_age_ms.max(age);
        }
        Self {
            by_status,
            total_age_ms,
            oldest_age_ms,
            truncated: false,
        }
    }
}

/// What a scrape reads of its node besides the registry's own counts: the
/// store, the time, the peers and how far each is behind this node's
/// outbox. The node gives it (`scrape.rs`, above the node): the registry,
/// which the node holds, does not name the node.
pub(crate) trait ScrapeSource: Send + Sync {
    /// The node's registry.
    fn metrics(&self) -> &NodeMetrics;
    /// The store as the core reads it.
    fn store_state(&self) -> StoreState<'_>;
    /// The node's clock, in unix milliseconds.
    fn now_ms(&self) -> u64;
    /// The peers' regions, in name order.
    fn peer_regions(&self) -> Vec<&str>;
    /// Events of this node's outbox that `peer` is sent and has not
    /// acknowledged (None before its first acknowledgement), reading at
    /// most `limit` (true: the count stopped there).
    fn peer_events_behind(&self, peer: &str, limit: usize) -> Result<Option<(u64, bool)>, Fault>;
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves, each
/// scrape read from `node`.
pub(crate) async fn serve_metrics(
    node: Arc<dyn ScrapeSource>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let addr = listener.local_addr().ok();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let node = node.clone();
            async move {
                // The reads wait on the engine: not on a runtime worker.
                let rendered = tokio::task::spawn_blocking(move || node.metrics().render(node.as_ref())).await;
                let body = rendered.unwrap_or_else(|e| format!("# the scrape failed: {e}\n"));
                (
                    [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                    body,
                )
            }
        }),
    );
    if let Some(addr) = addr {
        info!(%addr, "metrics on http://{addr}/metrics");
    }
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
        warn!(error = %e, "the metrics listener stopped");
    }
}
