//! A Cascade region node: the IO shell around `cascade-core`.
//!
//! # Layout
//!
//! - [`Node`] (`node.rs`): the spine: one region's store, writer, peers and
//!   settings, and every operation the APIs and links run on them, on core
//!   types; `cluster.rs` holds its cross-region flows.
//! - `server.rs`: serving a node on a listener passed in by the caller, and
//!   stopping it gracefully; [`RunningNode`] for in-process nodes.
//! - `api/`: the wire edge, the only module that knows `cascade.v1`
//!   messages: the Resources and Peer services (adapters around `Node`),
//!   the typed calls on other regions, the classification of their answers.
//! - `writer.rs`: the single-writer actor that runs protocol steps and
//!   commits them, with its supervisor.
//! - `links.rs`: the peer links (watch, releases, checks) and the reconciler.
//! - `trace_context.rs`: W3C trace context on calls to peers and with
//!   peer events, so one deletion is one trace across regions.
//! - `metrics.rs`: Prometheus metrics, their HTTP listener, and the gRPC
//!   layer that counts calls by method and code.
//! - [`store`]: the narrow storage trait with the sled and in-memory engines.
//! - [`codec`]: how core records are keyed and encoded in the store.
//! - [`config`]: the node's TOML configuration.
//! - [`clock`]: injected time. [`entropy`]: injected randomness.
//! - [`peers`]: the channels to other regions' nodes (and how a simulation
//!   replaces TCP).

mod admin;
mod api;
pub mod clock;
mod cluster;
pub mod codec;
pub mod config;
pub mod entropy;
mod error;
mod explain;
mod links;
mod metrics;
mod node;
pub mod peers;
mod server;
mod status;
pub mod store;
mod trace_context;
mod writer;

pub use config::{ConfigFile, NodeSettings};
pub use node::{ApiLimits, Node, NodeEnv, NodeError};
pub use server::RunningNode;
pub use writer::{WriteStats, WriteStatsSnapshot};
