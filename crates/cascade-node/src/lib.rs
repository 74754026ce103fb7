//! A Cascade region node: the IO shell around `cascade-core`.
//!
//! # Layout
//!
//! The modules read top-down, in floors: a module names only modules on
//! its floor or below (`tests/architecture.rs` checks that the graph of
//! `crate::`/`super::` paths between files has no cycle, and that nothing
//! outside `api/` names `crate::api`).
//!
//! 1. **The wire edge**, `api/`, the only module that knows `cascade.v1`
//!    messages: the Resources, Peer and Admin services (adapters around
//!    `Node`), `api/server.rs` (serving a node on a listener passed in by
//!    the caller, and stopping it gracefully; [`RunningNode`] for
//!    in-process nodes), the typed calls on other regions
//!    (`api/peer_client.rs`: the protobuf half of the port, an `impl
//!    Peers`) and the classification of their answers (`api/forward.rs`).
//!    Beside it, `console.rs` (the web console), which `api/server.rs`
//!    starts: a client of this node's API that names nothing of the crate.
//! 2. **The domain**: [`Node`] (`node.rs`), the spine: one region's store,
//!    writer, peers and settings, and every operation the APIs and links
//!    run on them, on core types. Above it, the feature modules that add
//!    `Node` methods: `cluster.rs` (cross-region flows), `admin.rs`,
//!    `explain.rs`, `status.rs` (the cluster status), `scrape.rs` (what a
//!    metrics scrape reads of the node), `links.rs` (the peer links:
//!    watch, releases, checks; and the reconciler), `closure_check.rs`
//!    (whether a waiting root's cascade is finished in every region it
//!    touched), `operation_control.rs` (a bounded operation's
//!    registration and budget leases, pause, resume and cancel across
//!    regions) and `undelete.rs` (an undelete driven over every region).
//! 3. **Below the domain**: `writer.rs` (the single-writer actor that runs
//!    protocol steps and commits them, with its supervisor), `metrics.rs`
//!    (the Prometheus registry and its HTTP listener), `trace_context.rs`
//!    (W3C trace context with peer events, so one deletion is one trace
//!    across regions), `status_cache.rs` (the last cluster status, reused
//!    for a second), `outbox.rs` (the feed of committed events that
//!    streams read), `schema_reload.rs` (reading the schema file again on
//!    SIGHUP, a change of the file, or a call, for the writer to put in
//!    force).
//! 4. [`store`] (the narrow storage trait with the sled, fjall and
//!    in-memory engines), [`codec`] (how core records are keyed and encoded
//!    in the store), [`config`] (the node's TOML configuration, with
//!    [`ApiLimits`]), `error.rs` (`Fault`, the error of every operation),
//!    `schema_in_force.rs` (the schema the node runs now and its version,
//!    swapped whole by the writer).
//! 5. [`clock`] (injected time), [`entropy`] (injected randomness),
//!    `log_throttle.rs` (warnings that repeat, logged once a window with a
//!    count), and
//!    [`peers`], the port for calls to other regions: the channels to
//!    their nodes (and how a simulation replaces TCP), what they answer and
//!    `RemoteError`, on core types only. It names nothing of the crate, so
//!    everything above may hold its types; its typed calls are implemented
//!    at the wire edge, floor 1, and the domain never names `api/`.

// Floor 1: the wire edge.
mod api;
// The web console (issue 30): a client of this node's API, beside `api/`
// (which starts it); it names nothing of the crate.
mod console;

// Floor 2: the domain. The feature modules add `Node` methods from above
// the spine, `node`.
mod admin;
mod closure_check;
mod cluster;
mod explain;
mod history;
mod links;
mod listing;
// Operation budgets and controls (issue 29): a bounded delete's
// registration, budget leases, pause/resume/cancel across regions.
mod operation_control;
mod purge;
// Plan-bound deletes (issue 29): a dry run's token, a delete's check of it.
mod plan_bound;
mod safeguards;
mod scrape;
mod status;
// Undelete of a whole cascade (issue 29): the root's drive over every
// region, a region's part, the reconciler's retries.
mod undelete;

mod node;

// Floor 3: below the domain.
mod metrics;
mod outbox;
// The plan tokens' digest and the plans a node bound lately.
mod plan_tokens;
// Reloading the schema file (issue 31): SIGHUP, a file watch, a call; the
// writer puts a reloaded schema in force.
pub mod schema_reload;
// SIGHUP, one for the process: the policy and schema watchers follow it.
pub mod reload_signal;
mod status_cache;
mod trace_context;
mod writer;

// Floor 4: the store and codec, config, error.
pub mod codec;
pub mod config;
mod error;
pub mod store;
// The schema in force and its version (issue 31): read by the domain,
// swapped only by the writer.
mod schema_in_force;

// Floor 5: injected time and randomness, and the port for calls to other
// regions (its types; its typed calls are implemented in `api/`).
pub mod auth;
pub mod clock;
pub mod entropy;
pub mod ha;
mod log_throttle;
// The audit log's vocabulary (contexts, refusal budget, retention): core types only.
mod audit;
pub mod peers;

pub use api::limits::{limits, Amount, Limit};
pub use api::roles::{serve_region_node, SharedStore};
pub use api::server::RunningNode;
pub use api::standby::{serve_standby, StandbySettings, WRITER_HEALTH_SERVICE};
pub use config::{ApiLimits, ConfigFile, NodeSettings};
pub use node::{Node, NodeEnv, NodeError};
pub use schema_in_force::{SchemaVersion, StoredSchemaError};
pub use schema_reload::{ReloadError, ReloadOutcome, SchemaReloader, StartRefused};
pub use writer::{ReloadCause, WriteStats, WriteStatsSnapshot, WriterThread};
