//! The node: one region's store, writer, peers and settings, and every
//! operation the APIs and the links run on them, on core types.
//!
//! [`Node`] is the spine of the crate. The gRPC services (`api/resources.rs`,
//! `api/peer.rs`) are adapters around it: they decode a request, call a
//! `Node` method, and encode the answer; the peer links and the reconciler
//! (`links.rs`) call the same methods. The feature modules add `Node`
//! methods from above: the cross-region flows (creates whose references
//! reach other regions, dry runs, operations spanning regions) in
//! `cluster.rs`, and `admin.rs`, `explain.rs`, `status.rs`, `scrape.rs`.
//! This module uses only what lies below it (the writer, the metrics
//! registry, trace marks, the status cache, the outbox feed, the port for
//! calls to other regions, the store, config, error, clock and entropy).
//! None of this knows a wire type or names `api/`: other regions are
//! reached through the port's typed calls, [`Peers`].
//!
//! Reads are served straight from the store ([`Node::state`]); every write
//! goes to the single writer ([`WriterHandle`]).
//!
//! Size: a little over 800 lines: one method per entry point the adapters
//! call, each a few lines over the store or the writer; the flows that span
//! regions already live in the feature modules above it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cascade_core::limits::quote;
use cascade_core::model::{DeletionRecord, Event, Resource, ResourceState};
use cascade_core::operation_view::OperationPage;
use cascade_core::peer::{self, PeerBackRef, ReleaseReport, RemoteDeleting};
use cascade_core::{BackRef, BackRefKey, CoreError, Ctx, OperationId, RegionId, ResourceName, Schema, Uid};
use tokio::sync::{broadcast, watch};
use tracing::{info, warn};

use crate::audit::RefusalBudget;
use crate::clock::{Clock, SystemClock};
use crate::codec::StoreState;
use crate::config::{AdminAccess, ApiLimits, NodeSettings};
use crate::entropy::{stable_hash, wall_clock_seed, SeededUids, SystemUids, UidSource};
use crate::error::{Fault, WriterUnavailable};
use crate::metrics::NodeMetrics;
use crate::outbox::{OutboxFeed, Overtaken};
use crate::peers::{Deadline, LookupAnswer, PeerConnector, Peers};
use crate::schema_in_force::SchemaHolder;
use crate::schema_reload::SchemaReloader;
use crate::status_cache::StatusCache;
use crate::store::{open_store_with_cache, Store, StoreError, Table};
use crate::trace_context::TraceMarks;
use crate::writer::{ClosureChecks, ReleaseHints, WriteStats, WriterContext, WriterHandle, WriterThread};
use cascade_tls::NodeTls;

/// Rows of each table a `Peer.Dump` reads at most: the checker's one
/// snapshot of a region, not paged (README, "Paging").
pub(crate) const MAX_DUMP_ROWS: usize = 1_000_000;

/// How long a read asks a remote owner whether an `allow_dangling` target
/// still exists before it reports the reference as the local view has it.
pub(crate) const DANGLING_LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Why opening or serving a node failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The data directory could not be opened or flushed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The writer actor could not be started.
    #[error(transparent)]
    Writer(#[from] WriterUnavailable),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The reflection service could not be built from the descriptor set.
    #[error("reflection service: {0}")]
    Reflection(String),
    /// Binding, accepting, or creating the data directory failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The settings contradict each other (TLS identity, peer addresses).
    #[error("configuration: {0}")]
    Config(String),
    /// The schema file changes the schema the region stored in a way its
    /// stored data forbids (`schema_in_force::check_at_start`).
    #[error(transparent)]
    Schema(#[from] crate::schema_reload::StartRefused),
    /// The writer's supervisor ended without a stop (`writer/handle.rs`):
    /// nothing in the process can write any more, so the server stopped.
    /// Started again, the node loads its state as after any restart.
    #[error("the writer ended without being asked to (see the error logged before): the node stopped serving and must be started again")]
    WriterEnded,
}

/// The node's surroundings, injectable so a simulation controls them.
#[derive(Clone)]
pub struct NodeEnv {
    /// `deleted_at`, retry schedules, attach times.
    pub clock: Arc<dyn Clock>,
    /// None: uids from [`SystemUids`] and reconnect jitter from the wall
    /// clock. Some: [`SeededUids`] and jitter derived from this seed and the
    /// region, so a run replays exactly (give each node its own region, or
    /// its own seed).
    pub seed: Option<u64>,
    /// Opens connections to peers instead of TCP (see [`PeerConnector`]).
    pub connector: Option<PeerConnector>,
    /// An engine to run on instead of the one `settings` name (tests:
    /// [`crate::store::TombstoneStore`]).
    pub store: Option<Arc<dyn Store>>,
    /// The writer's lease, when this node is the writer of a region of
    /// several nodes (`api/roles.rs`): shown by status and the metrics.
    pub role: Option<crate::ha::WriterRole>,
    /// Tests only: decide with this instead of the policy `settings.auth`
    /// names (a deny-set in `tests/security/closure.rs`, before a policy
    /// file is what a test writes).
    #[doc(hidden)]
    pub authorizer: Option<Arc<dyn cascade_core::auth::Authorize>>,
    /// Where the writer runs: a thread of its own (the default), or the
    /// runtime that opens the node (the turmoil simulation only:
    /// [`WriterThread::CallersRuntime`] says why).
    pub writer_thread: WriterThread,
}

impl Default for NodeEnv {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            seed: None,
            connector: None,
            store: None,
            role: None,
            authorizer: None,
            writer_thread: WriterThread::Own,
        }
    }
}

/// One region's node: opened (store and writer running), served by
/// `Node::serve` (at the wire edge, `api/server.rs`).
pub struct Node {
    pub(crate) region: RegionId,
    /// The schema in force, swapped only by the writer on a reload
    /// (`schema_in_force.rs`); read it with [`Node::schema`].
    pub(crate) schema_in_force: Arc<SchemaHolder>,
    /// What a schema reload needs (`schema_reload.rs`), shared with the
    /// file watcher and the handle's `reload_schema`.
    pub(crate) schema_reloader: SchemaReloader,
    /// Tunables of the protocol (retries, batch budget, closure checks).
    pub(crate) policy: cascade_core::Policy,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) writer: WriterHandle,
    /// The other regions: forwarding, cross-region attach, aggregation.
    pub(crate) peers: Peers,
    pub(crate) clock: Arc<dyn Clock>,
    /// Committed events, fanned out to Watch and WatchOperation streams.
    pub(crate) events: broadcast::Sender<Arc<Event>>,
    pub(crate) limits: ApiLimits,
    /// Peer calls must come from a certified region, acting as itself (mutual TLS is on).
    pub(crate) peer_auth: bool,
    /// Flips to true when the node shuts down, so long-lived streams end
    /// and graceful shutdown does not wait on watchers forever.
    pub(crate) shutting_down: watch::Sender<bool>,
    /// Peer region → the last revision of our outbox it acknowledged
    /// (in memory: after a restart nothing is compacted until all re-ack).
    pub(crate) acks: Mutex<BTreeMap<String, u64>>,
    /// Outbox events always kept, whatever the peers acknowledged (client
    /// watchers resume from them too; compaction never waits for a client
    /// watcher beyond them: `outbox.rs`).
    pub(crate) outbox_retention: u64,
    /// Counts and warns of watch streams that compaction overtook.
    pub(crate) overtaken: Arc<Overtaken>,
    /// How far streams may read the outbox: what the writer flushed.
    pub(crate) published: Arc<crate::outbox::Published>,
    /// Roots waiting for other regions' parts of their operation.
    pub(crate) closure_checks: ClosureChecks,
    /// Budget leases this region's cascades wait for (from the writer).
    pub(crate) budget_wants: crate::writer::BudgetWants,
    /// Pauses, resumes and cancels this region (the root's) could not
    /// tell another region yet: (operation, region) → what to tell it. The
    /// reconciler tells them again (`operation_control.rs`). In memory.
    pub(crate) undelivered_controls: Mutex<BTreeMap<(OperationId, String), crate::peers::ControlToDeliver>>,
    /// Undeletes rooted here that some region has not finished (issue 29,
    /// `undelete.rs`): None until the reconciler read them from the
    /// operations table once (their state is durable there).
    pub(crate) undeletes_left: Mutex<Option<std::collections::BTreeSet<OperationId>>>,
    /// Served with TLS (peers and clients) when set.
    pub(crate) tls: Option<NodeTls>,
    /// Who may call the Admin service.
    pub(crate) admin: AdminAccess,
    /// How callers are authenticated (`[auth]`).
    pub(crate) auth: crate::auth::AuthSettings,
    /// What each principal may do: the policy in force (`auth/`).
    pub(crate) authorizer: Arc<dyn cascade_core::auth::Authorize>,
    /// What the audit log keeps (`[audit]`); the writer prunes by it
    /// (`WriterContext::audit_retention`, given when the node opens).
    #[allow(dead_code)]
    pub(crate) audit: crate::auth::AuditSettings,
    /// Refusals audited this second, for every service of the node
    /// ([`crate::audit::AUDITED_REFUSALS_PER_SECOND`]).
    pub(crate) refusals_audited: RefusalBudget,
    /// Audit entries cannot be written while the store refuses commits:
    /// one line a window, with the count.
    pub(crate) audit_failed: crate::log_throttle::Throttle,
    /// How often peer links send releases and look at their streams.
    pub(crate) link_tick: Duration,
    /// How often an owner asks each peer which back-references still stand.
    pub(crate) check_interval: Duration,
    /// How links dial, ping and decide a peer is gone (`[links]`).
    pub(crate) link_timings: crate::peers::LinkTimings,
    /// Seeds the peer links' reconnect jitter.
    pub(crate) jitter_seed: u64,
    /// What the writer committed (shared with it).
    pub(crate) write_stats: Arc<WriteStats>,
    /// Where the peer links' sends of queued releases start (see [`ReleaseHints`]).
    pub(crate) release_hints: Arc<ReleaseHints>,
    /// Prometheus metrics (`metrics.rs`), served on `metrics_listen`.
    pub(crate) metrics: Arc<NodeMetrics>,
    /// The metrics listener, bound when the node opens (so its address is
    /// known before it serves) and taken by `serve`.
    pub(crate) metrics_listener: Mutex<Option<std::net::TcpListener>>,
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// The web console's listener (`[console] listen`), bound when the node
    /// opens like the metrics' and taken by `serve` (`console.rs`).
    pub(crate) console_listener: Mutex<Option<std::net::TcpListener>>,
    pub(crate) console_addr: Option<std::net::SocketAddr>,
    /// `[console] allowed_hosts`: names the console answers to besides its
    /// address and `localhost`.
    pub(crate) console_allowed_hosts: Vec<String>,
    /// Whether the writer's last commit succeeded (gRPC health follows it).
    pub(crate) committing: Arc<watch::Sender<bool>>,
    /// The address peers and clients reach this node at, when known (for
    /// `Admin.Status`).
    pub(crate) advertised: Arc<Mutex<Option<String>>>,
    /// Who this node is in the audit log (shared with the writer).
    pub(crate) audit_name: crate::audit::AuditNode,
    /// This node's lease, when it is the writer of a region of several
    /// nodes over one database (None: a single-node region).
    pub(crate) role: Option<crate::ha::WriterRole>,
    /// The trace context of recent events peers are sent (shared with the writer).
    pub(crate) trace_marks: Arc<TraceMarks>,
    /// The last cluster status and figures, reused for a second.
    pub(crate) status_cache: StatusCache,
    /// Peer region → its nodes' addresses, as configured (joined by ", ").
    pub(crate) peer_addresses: BTreeMap<String, String>,
    /// The members of the plans this node's dry runs bound lately, so a
    /// plan-bound delete whose closure changed names what changed
    /// (`plan_tokens.rs`).
    pub(crate) recent_plans: crate::plan_tokens::RecentPlans,
}

/// A resource as a reader sees it: with its deletion record (DELETING) and
/// the targets of its `allow_dangling` references that are gone.
#[derive(Debug, Clone)]
pub(crate) struct ResourceView {
    pub resource: Resource,
    pub record: Option<DeletionRecord>,
    pub dangling: BTreeSet<Uid>,
}

/// What a remote target's owner said about it (see [`Node::mark_remote_dangling`]).
pub(crate) enum RemoteLookup {
    /// It lives, with this uid.
    Found(Uid),
    /// It is gone (or being deleted).
    Gone,
    /// The owner could not be asked.
    Unknown,
}

/// A page of the DELETING resources another region references
/// (`Peer.ListDeleting`, the resync after compaction).
pub(crate) struct DeletingPage {
    pub deleting: Vec<RemoteDeleting>,
    /// The revision to resume the watch after.
    pub revision: u64,
    /// The uid to continue after; None on the last page.
    pub next: Option<Uid>,
}

/// Everything one region holds, for the invariant checker (`Peer.Dump`).
pub(crate) struct RegionDump {
    pub resources: Vec<ResourceView>,
    pub backrefs: Vec<BackRef>,
    pub remote_deletions: Vec<cascade_core::RemoteDeletion>,
    pub pending_releases: usize,
    pub queued_work: usize,
    pub pending_attach: usize,
    pub cursors: Vec<(String, u64)>,
    pub last_revision: u64,
}

/// What this region says about one of its resources to another region.
pub(crate) enum LocalLookup {
    /// ACTIVE, this incarnation.
    Live(Uid),
    /// DELETING: to another region it is already gone (seed 000).
    Deleting(Uid),
    /// No such resource (or still CREATING).
    Absent,
}

impl Node {
    /// Opens a node with the real clock, randomness and network.
    pub async fn open(settings: NodeSettings) -> Result<Self, NodeError> {
        Self::open_with(settings, NodeEnv::default()).await
    }

    /// Opens a node with the given clock and otherwise real surroundings.
    pub async fn open_with_clock(settings: NodeSettings, clock: Arc<dyn Clock>) -> Result<Self, NodeError> {
        Self::open_with(
            settings,
            NodeEnv {
                clock,
                ..NodeEnv::default()
            },
        )
        .await
    }

    /// Opens a node in the given surroundings (see [`NodeEnv`]).
    pub async fn open_with(settings: NodeSettings, env: NodeEnv) -> Result<Self, NodeError> {
        let NodeEnv {
            clock,
            seed,
            connector,
            store,
            role,
            authorizer,
            writer_thread,
        } = env;
        let region_seed = seed.map(|s| s ^ stable_hash(settings.region.as_str()));
        let ids: Arc<dyn UidSource> = match region_seed {
            Some(s) => Arc::new(SeededUids::new(s, clock.clone())),
            None => Arc::new(SystemUids),
        };
        let jitter_seed = region_seed.map_or_else(wall_clock_seed, |s| s.rotate_left(17));
        let store = match store {
            Some(store) => store,
            None => open_store_with_cache(settings.engine, settings.data_dir.as_deref(), settings.cache_bytes)?,
        };
        StoreState { store: store.as_ref() }.upgrade()?;
        let at_start = crate::writer::off_the_workers(store.waits_on_io(), || {
            crate::schema_reload::check_at_start(
                &StoreState { store: store.as_ref() },
                settings.region.as_str(),
                &settings.schema,
                settings.schema_file.as_deref(),
                settings.accept_schema_unchecked,
            )
        })?;
        let (events, _) = broadcast::channel(4096);
        let (shutting_down, _) = watch::channel(false);
        if let Some(tls) = &settings.tls {
            if tls.region() != &settings.region {
                return Err(NodeError::Config(format!(
                    "the TLS certificate names region {}, but this node is region {}",
                    tls.region(),
                    settings.region
                )));
            }
        }
        let peers = Peers::new(
            &settings.peers,
            settings.tls.as_ref(),
            connector,
            settings.links,
            settings.limits.max_message_bytes,
            settings.protocol_version,
        )
        .map_err(|e| NodeError::Config(e.to_string()))?;
        let metrics = Arc::new(NodeMetrics::new());
        if let Some(role) = &role {
            metrics.set_lease(role.epoch, role.takeovers());
        }
        // A read of every resource, once: not on a runtime worker (nodes
        // share a process in the demo and tests).
        crate::writer::off_the_workers(store.waits_on_io(), || {
            metrics.count_resources(&StoreState { store: store.as_ref() })
        })?;
        let metrics_listener = match settings.metrics_listen {
            Some(addr) => {
                let listener = std::net::TcpListener::bind(addr)
                    .map_err(|e| NodeError::Config(format!("metrics_listen: cannot listen on {addr}: {e}")))?;
                listener.set_nonblocking(true)?;
                Some(listener)
            }
            None => None,
        };
        let metrics_addr = metrics_listener.as_ref().map(|l| l.local_addr()).transpose()?;
        let console_listener = match settings.console_listen {
            Some(addr) => {
                let listener = std::net::TcpListener::bind(addr)
                    .map_err(|e| NodeError::Config(format!("console.listen: cannot listen on {addr}: {e}")))?;
                listener.set_nonblocking(true)?;
                Some(listener)
            }
            None => None,
        };
        let console_addr = console_listener.as_ref().map(|l| l.local_addr()).transpose()?;
        let committing = Arc::new(watch::channel(true).0);
        let trace_marks = Arc::new(TraceMarks::default());
        let closure_checks = ClosureChecks::default();
        let budget_wants = crate::writer::BudgetWants::default();
        let write_stats = Arc::new(WriteStats::default());
        // What the store holds at open is what reached its disk: durable.
        let published = Arc::new(crate::outbox::Published::new(
            StoreState { store: store.as_ref() }.next_revision_stored()?,
        ));
        let release_hints = Arc::new(ReleaseHints::default());
        let authorizer = match authorizer {
            Some(authorizer) => authorizer,
            None => crate::auth::build_authorizer(&settings.auth, metrics.registry())
                .map_err(|e| NodeError::Config(e.to_string()))?,
        };
        let advertised = Arc::new(Mutex::new(role.as_ref().map(|r| r.me.address.clone())));
        let audit_name = crate::audit::AuditNode::new(
            role.as_ref().map(|r| r.me.node.clone()),
            advertised.clone(),
            settings.region.to_string(),
        );
        let schema_in_force = Arc::new(SchemaHolder::new(settings.schema.clone(), settings.schema_file.clone()));
        let writers_view = crate::store::writers_view_of(&store)?;
        let writer = WriterHandle::spawn(
            WriterContext {
                region: settings.region.clone(),
                schema: schema_in_force.clone(),
                policy: settings.policy.clone(),
                // Only the writer reads what it committed and has not
                // flushed yet (`store::writers_view_of`).
                store: writers_view,
                clock: clock.clone(),
                ids,
                events: events.clone(),
                tick: settings.tick,
                closure_checks: closure_checks.clone(),
                budget_wants: budget_wants.clone(),
                stats: write_stats.clone(),
                release_hints: release_hints.clone(),
                metrics: metrics.clone(),
                committing: committing.clone(),
                trace_marks: trace_marks.clone(),
                published: published.clone(),
                authorizer: authorizer.clone(),
                audit_retention: crate::audit::Retention {
                    retain: Some(settings.audit.retain),
                    max_entries: Some(settings.audit.max_entries),
                },
                audit_node: audit_name.clone(),
            },
            writer_thread,
        )
        .await?;
        let schema_reloader = SchemaReloader::new(
            schema_in_force.clone(),
            writer.clone(),
            settings.region.clone(),
            settings.policy.max_retention_ms,
        );
        let started = Self {
            region: settings.region,
            schema_in_force,
            schema_reloader,
            policy: settings.policy,
            store,
            writer,
            peers,
            clock,
            events,
            limits: settings.limits,
            peer_auth: settings.tls.is_some(),
            shutting_down,
            acks: Mutex::default(),
            outbox_retention: settings.outbox_retention,
            overtaken: Arc::new(Overtaken::new(metrics.clone())),
            published,
            closure_checks,
            budget_wants,
            undelivered_controls: Mutex::default(),
            undeletes_left: Mutex::default(),
            tls: settings.tls,
            admin: settings.admin,
            auth: settings.auth,
            authorizer,
            audit: settings.audit,
            refusals_audited: RefusalBudget::default(),
            audit_failed: crate::log_throttle::Throttle::default(),
            link_tick: settings.tick,
            check_interval: settings.check_interval,
            link_timings: settings.links,
            jitter_seed,
            write_stats,
            release_hints,
            metrics,
            metrics_listener: Mutex::new(metrics_listener),
            metrics_addr,
            console_listener: Mutex::new(console_listener),
            console_addr,
            console_allowed_hosts: settings.console_allowed_hosts.clone(),
            committing,
            advertised,
            audit_name,
            role,
            trace_marks,
            status_cache: StatusCache::default(),
            recent_plans: Default::default(),
            peer_addresses: settings
                .peers
                .iter()
                .map(|(r, a)| (r.to_string(), a.to_string()))
                .collect(),
        };
        started
            .audit_schema_at_start(at_start, settings.schema_file.as_deref())
            .await;
        Ok(started)
    }

    /// Audits a start whose schema file changed the stored schema (as a
    /// reload is audited), and loudly one that `--accept-schema-unchecked`
    /// let through despite the stored data.
    async fn audit_schema_at_start(&self, at_start: crate::schema_reload::AtStart, file: Option<&std::path::Path>) {
        use crate::schema_reload::AtStart;
        let (diff, outcome) = match at_start {
            AtStart::Same => return,
            AtStart::Changed { from, diff } => {
                info!(region = %self.region, %from, to = %self.schema_in_force.version(), %diff, "schema changed at start");
                (diff, format!("ok at start (from {from})"))
            }
            AtStart::Overridden { from, diff, reasons } => {
                let reasons = reasons.join("; ");
                warn!(region = %self.region, %from, to = %self.schema_in_force.version(), %diff, %reasons,
                    "--accept-schema-unchecked: a schema the stored data forbids is in force");
                (
                    diff,
                    format!("accepted unchecked at start (from {from}; --accept-schema-unchecked): {reasons}"),
                )
            }
        };
        let target = file.map_or_else(
            || "the schema given to the node".to_owned(),
            |f| f.display().to_string(),
        );
        let request = cascade_core::protocol::AdminRequest {
            who: crate::writer::SCHEMA_OPERATOR.to_owned(),
            action: crate::writer::SCHEMA_RELOAD_ACTION.to_owned(),
            target,
            reason: diff,
        };
        let mut context = self.audit_context(&cascade_core::auth::Principal::anonymous(), "start", None);
        context.who = crate::writer::SCHEMA_OPERATOR.to_owned();
        context.via = "start".to_owned();
        if let Err(e) = self.audit(request, outcome, context).await {
            warn!(region = %self.region, error = %e, "the schema change at start could not be audited");
        }
    }

    /// Where the node serves its Prometheus metrics (`http://ADDR/metrics`),
    /// when `metrics_listen` is set.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr
    }

    /// Where the node serves its web console, when `[console] listen` is set.
    pub fn console_addr(&self) -> Option<std::net::SocketAddr> {
        self.console_addr
    }

    /// What this node's writer has committed since it opened (batches, key
    /// writes, bytes). The handle stays valid while the node serves.
    pub fn write_stats(&self) -> Arc<WriteStats> {
        self.write_stats.clone()
    }

    /// The store as the core reads it.
    pub(crate) fn state(&self) -> StoreState<'_> {
        StoreState {
            store: self.store.as_ref(),
        }
    }

    /// The schema in force now (a reload may swap it after this read; a
    /// write's step checks again with the writer's).
    pub(crate) fn schema(&self) -> Arc<Schema> {
        self.schema_in_force.schema()
    }

    /// What reloads this node's schema (its file watcher, SIGHUP, and
    /// [`crate::RunningNode::reload_schema`] call it).
    pub fn schema_reloader(&self) -> SchemaReloader {
        self.schema_reloader.clone()
    }

    /// A read-only protocol context for queries served outside the writer,
    /// over `schema` (the caller's load of [`Node::schema`]).
    pub(crate) fn read_ctx<'a>(&'a self, schema: &'a Schema) -> Ctx<'a> {
        Ctx {
            schema,
            region: &self.region,
            now: self.clock.now(),
            policy: &self.policy,
            authorizer: &*self.authorizer,
        }
    }

    /// The outbox as a stream reads it: the store, the live feed, and the
    /// shutdown signal.
    pub(crate) fn feed(&self) -> OutboxFeed {
        OutboxFeed {
            store: self.store.clone(),
            live: self.events.subscribe(),
            shutting_down: self.shutting_down.subscribe(),
            overtaken: self.overtaken.clone(),
            published: self.published.clone(),
        }
    }

    /// Whether `name` is this region's: None; else the owner's region, or
    /// INVALID_ARGUMENT on `field` for a region outside the cluster.
    pub(crate) fn owner_region<'n>(&self, name: &'n ResourceName, field: &str) -> Result<Option<&'n str>, CoreError> {
        if name.region() == self.region.as_str() {
            return Ok(None);
        }
        if !self.peers.knows(name.region()) {
            let refused = CoreError::WrongRegion {
                name: name.clone(),
                region: name.region().to_owned(),
                local: format!("{} (peers: {})", self.region, self.peer_list()),
            };
            return Err(CoreError::invalid(field, refused.to_string()));
        }
        Ok(Some(name.region()))
    }

    /// The peers' regions, for messages.
    pub(crate) fn peer_list(&self) -> String {
        self.peers.regions().collect::<Vec<_>>().join(", ")
    }

    /// Refuses a kind the schema does not know, naming `field`.
    pub(crate) fn known_kind(&self, kind: &str, field: &str, what: impl std::fmt::Display) -> Result<(), CoreError> {
        match self.schema().kind(kind) {
            Some(_) => Ok(()),
            None => Err(CoreError::invalid(field, what.to_string())),
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

    /// Events of this node's outbox that `peer` is sent and has not
    /// acknowledged: None before its first acknowledgement since this node
    /// started. Read from its acknowledgement on, at most `limit` events
    /// (the second value says the count stopped there). Only events the
    /// peer is sent count: an importer's cursor stays at the last one it
    /// applied, however many creates followed.
    pub(crate) fn events_behind(&self, peer: &str, limit: usize) -> Result<Option<(u64, bool)>, Fault> {
        let Some(acked) = self.acks.lock().ok().and_then(|a| a.get(peer).copied()) else {
            return Ok(None);
        };
        let unacked = self.state().events_from(acked.saturating_add(1), limit)?;
        let sent = unacked.iter().filter(|e| e.concerns_importers()).count();
        Ok(Some((sent as u64, unacked.len() >= limit)))
    }

    /// A peer applied our outbox up to `revision`; answers the first
    /// revision still retained.
    pub(crate) fn record_ack(&self, region: &RegionId, revision: u64) -> Result<u64, Fault> {
        if let Ok(mut acks) = self.acks.lock() {
            let slot = acks.entry(region.to_string()).or_default();
            *slot = (*slot).max(revision);
        }
        Ok(self.state().outbox_floor()?)
    }

    /// A resource with its deletion record and the local dangling marks.
    pub(crate) fn view(&self, r: Resource) -> Result<ResourceView, Fault> {
        let state = self.state();
        let record = if r.state == ResourceState::Deleting {
            state.get_deletion(r.uid)?
        } else {
            None
        };
        let mut dangling = BTreeSet::<Uid>::new();
        for (field, targets) in &r.refs {
            let tracked = self
                .schema()
                .reference(r.kind(), field)
                .is_some_and(|s| s.on_delete.tracked());
            if tracked {
                continue;
            }
            for t in targets {
                let gone = if t.name.region() == self.region.as_str() {
                    !state.uid_exists(t.uid)?
                } else {
                    // A remote target: gone once its owner reported it
                    // deleting. (Reads also ask the owner; see
                    // `mark_remote_dangling`.)
                    state.remote_deletion_of(t.uid)?
                };
                if gone {
                    dangling.insert(t.uid);
                }
            }
        }
        Ok(ResourceView {
            resource: r,
            record,
            dangling,
        })
    }

    /// Asks the owners of remote `allow_dangling` targets whether they still
    /// exist (the incarnation named). An owner that cannot be asked leaves
    /// the mark as the local view had it, and so does one the client's
    /// `deadline` leaves no time to ask (each is asked within what is left
    /// of it, and at most [`DANGLING_LOOKUP_TIMEOUT`]). `owners` remembers
    /// the answers within one request, so a page (or a dump) asks once per
    /// target.
    ///
    /// Needed because the local view alone cannot tell: the tombstone of a
    /// remote deletion goes with its PURGED event, after which a remote
    /// target that is gone looks like one that lives. (The simulation found
    /// List and Dump reporting such references as not dangling.)
    pub(crate) async fn mark_remote_dangling(
        &self,
        view: &mut ResourceView,
        owners: &mut BTreeMap<ResourceName, RemoteLookup>,
        deadline: &Deadline,
    ) {
        let r = &view.resource;
        for (field, targets) in &r.refs {
            let tracked = self
                .schema()
                .reference(r.kind(), field)
                .is_none_or(|s| s.on_delete.tracked());
            if tracked {
                continue;
            }
            for t in targets {
                if view.dangling.contains(&t.uid) || t.name.region() == self.region.as_str() {
                    continue;
                }
                if !owners.contains_key(&t.name) {
                    let answer = match deadline.for_call(t.name.region(), "Lookup") {
                        Err(_) => RemoteLookup::Unknown,
                        Ok(within) => match self.peers.lookup(&t.name, within.min(DANGLING_LOOKUP_TIMEOUT)).await {
                            Ok(LookupAnswer::Live(uid)) => RemoteLookup::Found(uid),
                            Ok(LookupAnswer::Deleting | LookupAnswer::Absent) => RemoteLookup::Gone,
                            Err(_) => RemoteLookup::Unknown,
                        },
                    };
                    owners.insert(t.name.clone(), answer);
                }
                let gone = match owners.get(&t.name) {
                    Some(RemoteLookup::Found(uid)) => *uid != t.uid,
                    Some(RemoteLookup::Gone) => true,
                    Some(RemoteLookup::Unknown) | None => false,
                };
                if gone {
                    view.dangling.insert(t.uid);
                }
            }
        }
    }

    /// A resource of this region as a client reads it (CREATING ones are
    /// invisible). NOT_FOUND if absent; INVALID_ARGUMENT for an unknown kind.
    /// A soft-deleted (DELETED) one is read only with `show_deleted`;
    /// without, NOT_FOUND says it is soft-deleted and until when (the
    /// caller was authorized to read the name before this is asked). The
    /// owners of remote `allow_dangling` targets are asked within what is
    /// left of the client's `deadline` ([`Self::mark_remote_dangling`]).
    pub(crate) async fn get(
        &self,
        name: &ResourceName,
        show_deleted: bool,
        deadline: &Deadline,
    ) -> Result<ResourceView, Fault> {
        self.known_kind(
            name.kind(),
            "name",
            format_args!("unknown kind {} in {name}", quote(name.kind())),
        )?;
        match self.state().get_resource(name)? {
            Some(r) if r.state == ResourceState::Deleted && !show_deleted => match r.soft_deleted {
                Some(soft) => Err(CoreError::SoftDeleted {
                    name: name.clone(),
                    uid: r.uid,
                    expire_time: soft.expire_time,
                    operation: soft.operation,
                    exists: false,
                }
                .into()),
                None => Err(CoreError::NotFound(name.clone()).into()),
            },
            Some(r) if r.state != ResourceState::Creating => {
                let mut view = self.view(r)?;
                self.mark_remote_dangling(&mut view, &mut BTreeMap::new(), deadline)
                    .await;
                Ok(view)
            }
            _ => Err(CoreError::NotFound(name.clone()).into()),
        }
    }

    /// This region's part of an operation, with up to `page_size` outcomes
    /// after `after`. NOT_FOUND when it has no part.
    pub(crate) fn local_operation(
        &self,
        id: OperationId,
        page_size: usize,
        after: Option<&ResourceName>,
    ) -> Result<OperationPage, Fault> {
        let state = self.state();
        let operation = state
            .get_operation(id)?
            .ok_or_else(|| CoreError::OperationNotFound(id.to_string()))?;
        let page_size = page_size.min(self.limits.max_page_size);
        let mut outcomes = if page_size == 0 {
            Vec::new()
        } else {
            state.outcomes(id, after, page_size + 1)?
        };
        let next = if outcomes.len() > page_size {
            outcomes.truncate(page_size);
            outcomes.last().map(|o| o.resource.name.clone())
        } else {
            None
        };
        Ok(OperationPage {
            operation,
            outcomes,
            next,
        })
    }

    /// What this region tells another about one of its resources.
    pub(crate) fn lookup_local(&self, name: &ResourceName) -> Result<LocalLookup, Fault> {
        Ok(match self.state().get_resource(name)? {
            Some(r) if r.state == ResourceState::Active => LocalLookup::Live(r.uid),
            // A soft-deleted one is no target either: refused like a
            // DELETING one (it may come back by an Undelete).
            Some(r) if matches!(r.state, ResourceState::Deleting | ResourceState::Deleted) => {
                LocalLookup::Deleting(r.uid)
            }
            _ => LocalLookup::Absent,
        })
    }

    /// Owner: records `region`'s back-references (all or none).
    pub(crate) async fn attach(&self, region: RegionId, entries: Vec<PeerBackRef>) -> Result<usize, Fault> {
        self.writer
            .apply(move |s, c, _| peer::attach(s, c, region.as_str(), entries))
            .await
    }

    /// Owner: drops `region`'s back-references it released.
    pub(crate) async fn release(&self, region: RegionId, entries: Vec<PeerBackRef>) -> Result<ReleaseReport, Fault> {
        self.writer
            .apply(move |s, c, _| peer::release(s, c, Some(region.as_str()), entries))
            .await
    }

    /// Importer: which of these back-references still stand here.
    pub(crate) fn standing(&self, keys: &[BackRefKey]) -> Result<Vec<bool>, Fault> {
        peer::standing(&self.state(), keys).map_err(|e| Fault::Refused(CoreError::Storage(e)))
    }

    /// Importer: whether each list owner keeps another live target (asked
    /// before an owner accepts a delete without cascade).
    pub(crate) fn keeps_another_target(&self, keys: &[BackRefKey]) -> Result<Vec<bool>, Fault> {
        let schema = self.schema();
        Ok(peer::keeps_another_target(&self.state(), self.read_ctx(&schema), keys)?)
    }

    /// Owner: a page of the DELETING resources that `region` references
    /// (in uid order after `after`, at most `page_size` of them; 0: all),
    /// the revision to resume its watch after (taken first: events after
    /// it are streamed anyway, and applying one twice is harmless; a
    /// resync of several pages resumes after the first page's), and the
    /// uid to continue after when there may be more.
    pub(crate) fn deleting_for(
        &self,
        region: &RegionId,
        after: Option<Uid>,
        page_size: usize,
    ) -> Result<DeletingPage, Fault> {
        const CHUNK: usize = 1024;
        let state = self.state();
        let revision = state.next_revision_stored()?.saturating_sub(1);
        let mut cursor = after.map(|u| u.as_bytes().to_vec());
        let mut deleting = Vec::new();
        loop {
            let deletions: Vec<DeletionRecord> = state.scan(Table::Deletions, &[], cursor.as_deref(), CHUNK)?;
            let exhausted = deletions.len() < CHUNK;
            for d in deletions {
                cursor = Some(d.target.uid.as_bytes().to_vec());
                let rows = state.backrefs_of(d.target.uid)?;
                if rows.iter().any(|r| r.referrer.name.region() == region.as_str()) {
                    let (no_cascade, retain_ms) = state
                        .get_operation(d.operation)?
                        .map_or((false, 0), |op| (!op.cascade, op.retain_ms));
                    let uid = d.target.uid;
                    deleting.push(RemoteDeleting {
                        forced: d.forced.is_some(),
                        target: d.target,
                        operation: d.operation,
                        no_cascade,
                        principal: d.principal,
                        retain_ms,
                    });
                    if deleting.len() == page_size {
                        return Ok(DeletingPage {
                            deleting,
                            revision,
                            next: Some(uid),
                        });
                    }
                }
            }
            if exhausted {
                return Ok(DeletingPage {
                    deleting,
                    revision,
                    next: None,
                });
            }
        }
    }

    /// The whole region's state, resources marked as a reader sees them.
    pub(crate) async fn dump(&self) -> Result<RegionDump, Fault> {
        const MAX: usize = MAX_DUMP_ROWS;
        let state = self.state();
        let resources: Vec<Resource> = state.all(Table::Resources, MAX)?;
        // A soft-deleted resource's expiry is a queue entry that is due only
        // when its window ends: work waiting for a time, not work under way,
        // so it does not make the region busy.
        let expiries = resources.iter().filter(|r| r.state == ResourceState::Deleted).count();
        let mut dump = RegionDump {
            resources: Vec::with_capacity(resources.len()),
            backrefs: state.all(Table::Backrefs, MAX)?,
            remote_deletions: state.all(Table::RemoteDeletions, MAX)?,
            pending_releases: state.count(Table::PendingReleases)?,
            queued_work: state.count(Table::RetryQueue)?.saturating_sub(expiries),
            pending_attach: state.count(Table::PendingAttach)?,
            cursors: state.cursors()?,
            last_revision: state.next_revision_stored()?.saturating_sub(1),
        };
        // Marked as Get marks them, so the checker sees what a reader sees
        // (each owner within DANGLING_LOOKUP_TIMEOUT: a dump's reader gives
        // no deadline of its own).
        let mut owners = BTreeMap::new();
        for r in resources {
            let mut view = self.view(r)?;
            self.mark_remote_dangling(&mut view, &mut owners, &Deadline::NONE).await;
            dump.resources.push(view);
        }
        Ok(dump)
    }

    /// Tells long-lived streams to end (the node is stopping).
    pub(crate) fn stop_streams(&self) {
        // Once: serving calls it when shutdown begins and again when the
        // connections have ended.
        if self
            .shutting_down
            .send_if_modified(|stopping| !std::mem::replace(stopping, true))
        {
            info!(region = %self.region, "stopping streams");
        }
    }
}
