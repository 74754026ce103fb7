//! Node configuration: a TOML file, overridden by flags and environment
//! (the binary does that), resolved into [`NodeSettings`].
//!
//! ```toml
//! region = "eu-1"
//! cluster = "cascade"                      # optional: the cluster's name, recorded in a shared store
//! listen = "127.0.0.1:50051"
//! data_dir = "data/eu-1"
//! schema = "deploy/schemas/neutron.toml"   # optional: the embedded example
//! metrics_listen = "127.0.0.1:9090"        # optional: Prometheus, GET /metrics
//!
//! [peers]             # the other regions of the cluster
//! us-east = "http://127.0.0.1:50052"
//! ap-south = ["http://10.0.0.7:50051", "http://10.0.0.8:50051"]  # a region's nodes (at most 16)
//!
//! [deletion]          # all optional
//! batch_budget = 512
//! max_attempts = 20
//! backoff_base_ms = 1000
//! backoff_cap_ms = 60000
//! tick_ms = 200
//! check_interval_ms = 30000   # re-check remote back-references of waiting deletions
//! outbox_retention = 100000   # events kept after every peer acknowledged them; a client watch further behind ends OUT_OF_RANGE
//!
//! [limits]            # all optional; what one request may carry
//! max_message_bytes = 16777216  # a gRPC message, either way (keep equal across the cluster)
//! max_batch = 1000              # resources per BatchCreate, back-references per peer call
//! max_page_size = 1000          # List / outcome pages
//! default_page_size = 100
//! purge_scan = 10000            # resources one Admin.Purge examines per region
//! max_purge_members = 1000      # resources one forced Admin.Purge may delete
//! confirm_above = 1000          # a larger cascade needs its dry run's plan token (default: none does)
//! max_retention = "30d"         # longest soft-delete window: a kind's `retain`, a Delete's retention
//!
//! [storage]           # optional
//! engine = "sled"     # or "fjall", or "postgres"; a data_dir keeps the engine that created it
//! cache_mb = 64       # the engine's cache: most of a node's resident memory
//! # postgres only (a region of several nodes over one database):
//! url = "postgres://cascade@db.example:5432/cascade"   # or key=value; no password in it
//! password_file = "/run/secrets/pg-password"   # else the env CASCADE_PG_PASSWORD
//! schema = "cascade"  # the PostgreSQL schema holding this region's tables
//!
//! [admin]             # who may call cascade.v1.Admin; none: nobody
//! token = "…"                          # sent as `authorization: Bearer …`
//! identities = ["alice.admin.cascade"] # with [tls]: client certificate DNS names
//! force_purge_after_ms = 3600000       # younger deletions need ForcePurge's `force`
//!
//! [links]             # optional: links between regions
//! dial_timeout_ms = 3000        # TCP connect and TLS handshake, together
//! keepalive_interval_ms = 5000  # HTTP/2 ping after this long without reading
//! keepalive_timeout_ms = 20000  # an unanswered ping closes the connection
//! silence_timeout_ms = 5000     # nothing heard (no event, no heartbeat): the link reads down and redials
//!
//! [tracing]           # optional
//! otlp_endpoint = "http://otel-collector:4317"   # export spans (OTLP/gRPC)
//!
//! [console]           # optional: the web console (README, "The console")
//! listen = "127.0.0.1:8080"   # http://ADDR/, or https:// with [tls]
//! allowed_hosts = ["console.example.com"]   # names a proxy serves it as (besides the address and localhost)
//!
//! [tls]               # mutual TLS: all three, or none (plain text)
//! ca = "certs/ca.pem"        # the cluster's CA
//! cert = "certs/eu-1.pem"    # names this region: DNS SAN "eu-1.cascade"
//! key = "certs/eu-1.key"
//! ```
//!
//! With `[tls]`, every peer address must be `https://`, and a peer is
//! verified to be the region it is listed as.
//!
//! [`ApiLimits`], what `[limits]` resolves to, is defined here with the
//! rest of the settings (the node and its services read it from there).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cascade_core::schema::EXAMPLE_SCHEMA;
use cascade_core::{Policy, RegionId, Schema};
use serde::Deserialize;

use crate::peers::{LinkTimings, PeerAddresses, WATCH_HEARTBEAT};
use crate::store::{PostgresSettings, StorageEngine};

mod auth;
mod console;
mod storage;
pub use auth::{AuditConfig, AuthConfig, JwtConfig, RateConfig};
use cascade_tls::{NodeTls, TlsFiles};
pub use console::{ConsoleConfig, MAX_CONSOLE_ALLOWED_HOSTS};
use storage::{check_cluster_name, postgres_settings};
pub use storage::{DEFAULT_CLUSTER, PG_PASSWORD_ENV};

/// The file as written. Every field may also come from a flag or the environment.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub region: Option<String>,
    /// The cluster's name (default `cascade`): a shared store records it
    /// with the region, and refuses a node of another cluster.
    pub cluster: Option<String>,
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub schema: Option<PathBuf>,
    /// Where Prometheus metrics are served (`http://ADDR/metrics`); none:
    /// not served.
    pub metrics_listen: Option<String>,
    /// Region → gRPC address of its node, or the list of its nodes'
    /// addresses (a writer and its standbys: any that answers will do).
    #[serde(default)]
    pub peers: BTreeMap<String, PeerEntry>,
    #[serde(default)]
    pub deletion: DeletionConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub storage: StorageConfig,
    pub tls: Option<TlsConfig>,
    #[serde(default)]
    pub admin: AdminConfig,
    #[serde(default)]
    pub tracing: TracingConfig,
    #[serde(default)]
    pub links: LinksConfig,
    /// `[ha]`: this node among its region's nodes (PostgreSQL only).
    #[serde(default)]
    pub ha: crate::ha::HaConfig,
    /// `[auth]`: client identities and the policy (`config/auth.rs`).
    pub auth: Option<AuthConfig>,
    /// `[audit]`: what the audit log keeps.
    #[serde(default)]
    pub audit: AuditConfig,
    /// `[console]`: the web console (off unless `listen` is set).
    #[serde(default)]
    pub console: ConsoleConfig,
}

/// A region's entry in `[peers]`: one address, or a list of its nodes'.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum PeerEntry {
    One(String),
    Several(Vec<String>),
}

impl PeerEntry {
    /// The addresses, in the order written.
    pub fn addresses(&self) -> Vec<String> {
        match self {
            PeerEntry::One(addr) => vec![addr.clone()],
            PeerEntry::Several(list) => list.clone(),
        }
    }
}

/// An entry written as one address equals that address.
impl PartialEq<String> for PeerEntry {
    fn eq(&self, other: &String) -> bool {
        matches!(self, PeerEntry::One(addr) if addr == other)
    }
}

/// `[links]`: how links between regions dial, ping and decide a peer is
/// gone (see [`LinkTimings`]); every key optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinksConfig {
    pub dial_timeout_ms: Option<u64>,
    pub keepalive_interval_ms: Option<u64>,
    pub keepalive_timeout_ms: Option<u64>,
    pub silence_timeout_ms: Option<u64>,
}

/// `[tracing]`: where spans go besides the log (read by the binary, which
/// installs the exporter before the node starts).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// An OTLP/gRPC collector (`http://otel-collector:4317`): every span is
    /// exported there, and trace context travels between regions. None:
    /// no export (the default).
    pub otlp_endpoint: Option<String>,
}

/// `[admin]`: who is an administrator (the Admin service refuses everyone
/// else, PERMISSION_DENIED, and logs the attempt in the audit log).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// A caller sending `authorization: Bearer <token>` is an administrator
    /// (at least 16 bytes; with TLS it travels encrypted).
    pub token: Option<String>,
    /// With `[tls]`: client certificates whose DNS name is listed are
    /// administrators.
    #[serde(default)]
    pub identities: Vec<String>,
    /// A deletion younger than this may be force-purged only with `force`
    /// (default one hour).
    pub force_purge_after_ms: Option<u64>,
}

/// Who may call the Admin service, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminAccess {
    /// The bearer token, if any.
    pub token: Option<String>,
    /// Client certificate DNS names that are administrators.
    pub identities: Vec<String>,
    /// How long a deletion must have been DELETING before ForcePurge
    /// takes it without `force`.
    pub force_purge_after_ms: u64,
}

/// How often the writer looks at the retry queue when nothing wakes it
/// (`[deletion] tick_ms`).
pub const DEFAULT_TICK: Duration = Duration::from_millis(200);

/// How long a cross-region back-reference of a waiting deletion may go
/// unreleased before the owner asks whether it still stands
/// (`[deletion] check_interval_ms`).
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// Outbox events kept past every peer's acknowledgement
/// (`[deletion] outbox_retention`): how far behind a client Watch may fall.
pub const DEFAULT_OUTBOX_RETENTION: u64 = 100_000;

/// One hour: a deletion stuck that long is what seed 000's administrator
/// force-purges; a younger one needs `force`.
pub const DEFAULT_FORCE_PURGE_AFTER_MS: u64 = 3_600_000;

impl Default for AdminAccess {
    fn default() -> Self {
        Self {
            token: None,
            identities: Vec::new(),
            force_purge_after_ms: DEFAULT_FORCE_PURGE_AFTER_MS,
        }
    }
}

/// `[storage]`: which engine keeps `data_dir`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// `sled` (the default), `fjall` or `postgres`, checked when the
    /// settings are resolved so that the error names the key. sled and
    /// fjall are ignored without a `data_dir` (the in-memory store).
    pub engine: Option<String>,
    /// The engine's cache in MiB (default 64); postgres: the read cache.
    pub cache_mb: Option<u64>,
    /// postgres: `postgres://user@host:port/database` or a libpq
    /// `key=value` string, without a password.
    pub url: Option<String>,
    /// postgres: a file holding the password (its first line); else the
    /// environment's `CASCADE_PG_PASSWORD`.
    pub password_file: Option<PathBuf>,
    /// postgres: the PostgreSQL schema of this region's tables (default
    /// `cascade`).
    pub schema: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    pub max_message_bytes: Option<usize>,
    pub max_batch: Option<usize>,
    pub max_page_size: Option<usize>,
    pub default_page_size: Option<usize>,
    pub purge_scan: Option<usize>,
    pub max_purge_members: Option<usize>,
    pub confirm_above: Option<usize>,
    /// The longest soft-delete retention, as a duration (`30d`).
    pub max_retention: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeletionConfig {
    pub batch_budget: Option<usize>,
    pub max_attempts: Option<u32>,
    pub backoff_base_ms: Option<u64>,
    pub backoff_cap_ms: Option<u64>,
    pub tick_ms: Option<u64>,
    pub check_interval_ms: Option<u64>,
    pub outbox_retention: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{field}: {message}")]
    Invalid { field: &'static str, message: String },
    #[error("tls: {0}")]
    Tls(#[from] cascade_tls::TlsError),
    #[error(transparent)]
    Ha(#[from] crate::ha::HaConfigError),
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses a configuration's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_owned(),
            message: e.to_string(),
        })
    }
}

/// Limits that protect the node from oversized requests.
#[derive(Debug, Clone)]
pub struct ApiLimits {
    /// Largest gRPC message either way (server and the node's own peer clients).
    pub max_message_bytes: usize,
    /// Resources per BatchCreate; back-references per peer call.
    pub max_batch_create: usize,
    /// Page size of List and of an operation's outcomes when the request names none.
    pub default_page_size: usize,
    /// Largest page a request may ask for (larger asks are cut to it).
    pub max_page_size: usize,
    /// Resources one Admin.Purge examines in each region at most: past
    /// them its count is a lower bound (and a forced purge is refused).
    pub purge_scan: usize,
    /// Resources one forced Admin.Purge may delete, every region together
    /// (more: refused, nothing started).
    pub max_purge_members: usize,
    /// A cascade that changes more resources than this (every region
    /// together) must be bound to its plan (`DeleteRequest.expect_plan`);
    /// None: no cascade needs one (the default).
    pub confirm_above: Option<usize>,
}

impl ApiLimits {
    /// Bytes one page of a listing may take (List, ListDeletions,
    /// ListAudit, an operation's outcomes): a quarter of the message limit
    /// (4 MiB by default), so a page of large items ends early, with its
    /// token, instead of failing to encode.
    pub fn page_bytes(&self) -> usize {
        self.max_message_bytes / 4
    }
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: cascade_proto::MAX_MESSAGE_BYTES,
            max_batch_create: 1_000,
            default_page_size: 100,
            max_page_size: 1_000,
            purge_scan: 10_000,
            max_purge_members: 1_000,
            confirm_above: None,
        }
    }
}

/// Everything a node needs to start, validated.
#[derive(Clone)]
pub struct NodeSettings {
    pub region: RegionId,
    pub schema: Arc<Schema>,
    /// The file `schema` was read from: reloaded on SIGHUP and when it
    /// changes (`schema_reload.rs`). None: the embedded example schema, or
    /// one given as data; nothing to reload.
    pub schema_file: Option<PathBuf>,
    /// None: in-memory store (simulation and quick experiments; nothing survives).
    pub data_dir: Option<PathBuf>,
    /// The engine that keeps `data_dir` (unused without one).
    pub engine: StorageEngine,
    /// The engine's cache, in bytes.
    pub cache_bytes: u64,
    /// Where the postgres engine connects (Some exactly when `engine` is
    /// postgres).
    pub postgres: Option<PostgresSettings>,
    /// The cluster's name (`cluster`, default `cascade`).
    pub cluster: String,
    pub policy: Policy,
    pub tick: Duration,
    pub limits: ApiLimits,
    /// Other regions and their nodes' addresses.
    pub peers: BTreeMap<RegionId, PeerAddresses>,
    /// How long a cross-region back-reference of a waiting deletion may go
    /// unreleased before the owner asks the importer whether it still stands.
    pub check_interval: Duration,
    /// Outbox events kept even when every peer has acknowledged them: how
    /// far behind the newest event a client watch may fall before it is
    /// ended with OUT_OF_RANGE (compaction never waits for client watchers).
    pub outbox_retention: u64,
    /// Mutual TLS with peers (and TLS for clients); None: plain text, and
    /// Peer calls are trusted to name their own region.
    pub tls: Option<NodeTls>,
    /// Who may call the Admin service (by default nobody).
    pub admin: AdminAccess,
    /// Where to serve Prometheus metrics (None: not served; port 0 picks one).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Dialling, keepalive and silence bounds of the links (`[links]`).
    pub links: LinkTimings,
    /// This node among its region's nodes, and the writer lease's timing
    /// (`[ha]`; used with a shared store only).
    pub ha: crate::ha::HaSettings,
    /// The node-to-node protocol version this node announces and behaves
    /// as: `cascade_proto::PROTOCOL_VERSION`, unless a test of mixed
    /// versions makes it an older node (version 1 does not apply
    /// DELETION_FORCED). Not in the config file.
    #[doc(hidden)]
    pub protocol_version: u32,
    /// Who callers are and what they may do (`[auth]`; off by default in
    /// code, chosen explicitly in a file).
    pub auth: crate::auth::AuthSettings,
    /// What the audit log keeps (`[audit]`).
    pub audit: crate::auth::AuditSettings,
    /// Where to serve the web console (`[console] listen`; None: not
    /// served; port 0 picks one).
    pub console_listen: Option<std::net::SocketAddr>,
    /// Start even when the schema changes the one the region stored in a
    /// way its stored data forbids (`cascade serve
    /// --accept-schema-unchecked`; audited). Not in the config file: an
    /// override for one start, not a setting.
    pub accept_schema_unchecked: bool,
    /// Host names the console answers to besides its listen address and
    /// `localhost` (`[console] allowed_hosts`, lower-cased).
    pub console_allowed_hosts: Vec<String>,
}

impl NodeSettings {
    /// Settings with the embedded example schema and default tunables.
    pub fn new(region: RegionId, schema: Arc<Schema>, data_dir: Option<PathBuf>) -> Self {
        Self {
            region,
            schema,
            schema_file: None,
            data_dir,
            engine: StorageEngine::default(),
            cache_bytes: crate::store::DEFAULT_CACHE_BYTES,
            postgres: None,
            cluster: DEFAULT_CLUSTER.to_owned(),
            policy: Policy::default(),
            tick: DEFAULT_TICK,
            limits: ApiLimits::default(),
            peers: BTreeMap::new(),
            check_interval: DEFAULT_CHECK_INTERVAL,
            outbox_retention: DEFAULT_OUTBOX_RETENTION,
            tls: None,
            admin: AdminAccess::default(),
            metrics_listen: None,
            links: LinkTimings::default(),
            ha: crate::ha::HaSettings::default(),
            protocol_version: cascade_proto::PROTOCOL_VERSION,
            auth: crate::auth::AuthSettings::default(),
            audit: crate::auth::AuditSettings::default(),
            console_listen: None,
            accept_schema_unchecked: false,
            console_allowed_hosts: Vec::new(),
        }
    }

    pub fn from_file(file: &ConfigFile) -> Result<Self, ConfigError> {
        let region = file.region.as_deref().ok_or(ConfigError::Invalid {
            field: "region",
            message: "is required".into(),
        })?;
        let region = RegionId::parse(region).map_err(|e| ConfigError::Invalid {
            field: "region",
            message: e.to_string(),
        })?;
        let schema = load_schema(file.schema.as_deref())?;
        let mut settings = Self::new(region, Arc::new(schema), file.data_dir.clone());
        settings.schema_file = file.schema.clone();
        settings.ha = crate::ha::HaSettings::from_config(&file.ha)?;
        if let Some(engine) = &file.storage.engine {
            settings.engine = engine
                .parse()
                .map_err(|e: crate::store::UnknownEngine| ConfigError::Invalid {
                    field: "storage.engine",
                    message: e.to_string(),
                })?;
        }
        if let Some(mb) = file.storage.cache_mb {
            // Below a few MiB either engine thrashes on its own metadata.
            if !(4..=1 << 20).contains(&mb) {
                return Err(ConfigError::Invalid {
                    field: "storage.cache_mb",
                    message: format!("{mb} is outside 4..=1048576"),
                });
            }
            settings.cache_bytes = mb * 1024 * 1024;
        }
        if let Some(cluster) = &file.cluster {
            settings.cluster = check_cluster_name(cluster)?;
        }
        settings.postgres = postgres_settings(
            &file.storage,
            settings.engine,
            settings.cache_bytes,
            std::env::var(PG_PASSWORD_ENV).ok(),
        )?;
        settings.policy.max_retention_ms = max_retention(&file.limits, &settings.schema)?;
        let d = &file.deletion;
        if let Some(v) = d.batch_budget {
            if v == 0 {
                return Err(ConfigError::Invalid {
                    field: "deletion.batch_budget",
                    message: "must be at least 1".into(),
                });
            }
            settings.policy.batch_budget = v;
        }
        if let Some(v) = d.max_attempts {
            settings.policy.max_attempts = v;
        }
        if let Some(v) = d.backoff_base_ms {
            settings.policy.backoff_base_ms = v;
        }
        if let Some(v) = d.backoff_cap_ms {
            settings.policy.backoff_cap_ms = v;
        }
        if let Some(v) = d.tick_ms {
            settings.tick = Duration::from_millis(v.max(10));
        }
        if let Some(v) = d.outbox_retention {
            settings.outbox_retention = v;
        }
        if let Some(v) = d.check_interval_ms {
            settings.check_interval = Duration::from_millis(v.max(10));
        }
        if let Some(addr) = &file.metrics_listen {
            settings.metrics_listen = Some(addr.parse().map_err(|e| ConfigError::Invalid {
                field: "metrics_listen",
                message: format!("{addr:?}: {e} (expected an address like 0.0.0.0:9090)"),
            })?);
        }
        settings.console_listen = console::console_listen(&file.console)?;
        settings.console_allowed_hosts = console::console_allowed_hosts(&file.console)?;
        apply_limits(&file.limits, &mut settings.limits)?;
        apply_links(&file.links, &mut settings.links)?;
        if let Some(tls) = &file.tls {
            let loaded = NodeTls::load(&TlsFiles {
                ca: tls.ca.clone(),
                cert: tls.cert.clone(),
                key: tls.key.clone(),
            })?;
            if loaded.region() != &settings.region {
                return Err(ConfigError::Invalid {
                    field: "tls.cert",
                    message: format!(
                        "{} names region {}, but this node is region {}",
                        tls.cert.display(),
                        loaded.region(),
                        settings.region
                    ),
                });
            }
            settings.tls = Some(loaded);
        }
        if let Some(token) = &file.admin.token {
            if token.len() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(ConfigError::Invalid {
                    field: "admin.token",
                    message: "must be at least 16 bytes, without spaces".into(),
                });
            }
        }
        if !file.admin.identities.is_empty() && file.tls.is_none() {
            return Err(ConfigError::Invalid {
                field: "admin.identities",
                message: "names client certificates: it needs [tls] (use admin.token without TLS)".into(),
            });
        }
        settings.admin = AdminAccess {
            token: file.admin.token.clone(),
            identities: file.admin.identities.clone(),
            force_purge_after_ms: file.admin.force_purge_after_ms.unwrap_or(DEFAULT_FORCE_PURGE_AFTER_MS),
        };
        settings.auth = auth::auth_settings(
            file.auth.as_ref(),
            settings.tls.is_some(),
            file.admin.token.is_some() || !file.admin.identities.is_empty(),
        )?;
        settings.audit = auth::audit_settings(&file.audit)?;
        let scheme = if settings.tls.is_some() { "https://" } else { "http://" };
        for (region, entry) in &file.peers {
            let id = RegionId::parse(region).map_err(|e| ConfigError::Invalid {
                field: "peers",
                message: e.to_string(),
            })?;
            if id == settings.region {
                return Err(ConfigError::Invalid {
                    field: "peers",
                    message: format!("{region} is this node's own region"),
                });
            }
            let addresses = entry.addresses();
            for addr in &addresses {
                if !addr.starts_with(scheme) {
                    let why = if settings.tls.is_some() {
                        "[tls] is on"
                    } else {
                        "[tls] is off; https:// peers need it"
                    };
                    return Err(ConfigError::Invalid {
                        field: "peers",
                        message: format!(
                            "{region}: address {} must start with {scheme} ({why})",
                            cascade_core::limits::quote(addr)
                        ),
                    });
                }
            }
            let addresses = PeerAddresses::new(addresses).map_err(|e| ConfigError::Invalid {
                field: "peers",
                message: format!("{region}: {e}"),
            })?;
            settings.peers.insert(id, addresses);
        }
        Ok(settings)
    }
}

fn apply_limits(file: &LimitsConfig, limits: &mut ApiLimits) -> Result<(), ConfigError> {
    let at_least = |field: &'static str, value: Option<usize>, min: usize| match value {
        Some(v) if v < min => Err(ConfigError::Invalid {
            field,
            message: format!("must be at least {min}"),
        }),
        other => Ok(other),
    };
    // 64 KiB: below that a single large resource could not be created at all.
    if let Some(v) = at_least("limits.max_message_bytes", file.max_message_bytes, 64 * 1024)? {
        limits.max_message_bytes = v;
    }
    if let Some(v) = at_least("limits.max_batch", file.max_batch, 1)? {
        limits.max_batch_create = v;
    }
    if let Some(v) = at_least("limits.max_page_size", file.max_page_size, 1)? {
        limits.max_page_size = v;
    }
    if let Some(v) = at_least("limits.default_page_size", file.default_page_size, 1)? {
        limits.default_page_size = v;
    }
    if let Some(v) = at_least("limits.purge_scan", file.purge_scan, 1)? {
        limits.purge_scan = v;
    }
    if let Some(v) = at_least("limits.max_purge_members", file.max_purge_members, 1)? {
        limits.max_purge_members = v;
    }
    if let Some(v) = file.confirm_above {
        // A plan token binds a whole closure, and a dry run lists at most
        // this many members per region: above it no cascade could be
        // confirmed at all.
        let most = cascade_core::Policy::default().max_plan;
        if v == 0 || v > most {
            return Err(ConfigError::Invalid {
                field: "limits.confirm_above",
                message: format!(
                    "must be 1 to {most} (a dry run's plan, which binds a token, lists at most {most} resources per region); \
                     leave it out to let every cascade start without a plan token"
                ),
            });
        }
        limits.confirm_above = Some(v);
    }
    if limits.default_page_size > limits.max_page_size {
        return Err(ConfigError::Invalid {
            field: "limits.default_page_size",
            message: format!(
                "{} exceeds max_page_size {}",
                limits.default_page_size, limits.max_page_size
            ),
        });
    }
    Ok(())
}

/// `[limits] max_retention` (default 30 days), which every kind's `retain`
/// must fit in: a schema that asks for longer is refused at load, naming
/// the kind.
fn max_retention(file: &LimitsConfig, schema: &Schema) -> Result<u64, ConfigError> {
    let max = match &file.max_retention {
        None => cascade_core::limits::DEFAULT_MAX_RETENTION_MS,
        Some(text) => cascade_core::time_text::parse_duration(text).map_err(|message| ConfigError::Invalid {
            field: "limits.max_retention",
            message,
        })?,
    };
    if let Some((kind, ms)) = schema.longest_retain().filter(|(_, ms)| *ms > max) {
        return Err(ConfigError::Invalid {
            field: "schema",
            message: format!(
                "kinds.{kind}.retain: {} is longer than [limits] max_retention ({})",
                cascade_core::time_text::duration(ms),
                cascade_core::time_text::duration(max)
            ),
        });
    }
    Ok(max)
}

/// Loads a schema file, or the embedded example when none is given.
pub fn load_schema(path: Option<&Path>) -> Result<Schema, ConfigError> {
    let (text, path) = match path {
        Some(p) => (
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_owned(),
                source,
            })?,
            p.to_owned(),
        ),
        None => (EXAMPLE_SCHEMA.to_owned(), PathBuf::from("<embedded example schema>")),
    };
    Schema::from_toml(&text).map_err(|e| ConfigError::Parse {
        path,
        message: e.to_string(),
    })
}

/// `[links]` over the defaults. The silence timeout must leave room for a
/// few missed heartbeats, or a healthy idle link would flap.
fn apply_links(c: &LinksConfig, t: &mut LinkTimings) -> Result<(), ConfigError> {
    let ms = |v: Option<u64>, field: &'static str, default: Duration| -> Result<Duration, ConfigError> {
        match v {
            None => Ok(default),
            Some(0) => Err(ConfigError::Invalid {
                field,
                message: "must be more than 0".into(),
            }),
            Some(v) => Ok(Duration::from_millis(v)),
        }
    };
    t.dial_timeout = ms(c.dial_timeout_ms, "links.dial_timeout_ms", t.dial_timeout)?;
    t.keepalive_interval = ms(
        c.keepalive_interval_ms,
        "links.keepalive_interval_ms",
        t.keepalive_interval,
    )?;
    t.keepalive_timeout = ms(
        c.keepalive_timeout_ms,
        "links.keepalive_timeout_ms",
        t.keepalive_timeout,
    )?;
    t.silence_timeout = ms(c.silence_timeout_ms, "links.silence_timeout_ms", t.silence_timeout)?;
    if t.silence_timeout < WATCH_HEARTBEAT * 3 {
        return Err(ConfigError::Invalid {
            field: "links.silence_timeout_ms",
            message: format!(
                "must be at least {} (three of the peers' heartbeats, one every {:?})",
                (WATCH_HEARTBEAT * 3).as_millis(),
                WATCH_HEARTBEAT
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
