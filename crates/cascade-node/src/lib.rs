//! A Cascade region node: the IO shell around `cascade-core`.
//!
//! # Layout
//!
//! - [`server`]: open a node (store + writer), serve it on a listener
//!   passed in by the caller, stop it gracefully.
//! - [`writer`]: the single-writer actor that runs protocol steps and
//!   commits them, with its supervisor.
//! - [`service`]: the `cascade.v1.Resources` gRPC service.
//! - [`store`]: the narrow storage trait with the sled and in-memory engines.
//! - [`codec`]: how core records are keyed and encoded in the store.
//! - [`config`]: the node's TOML configuration.
//! - [`clock`]: injected time.
//! - [`entropy`]: injected randomness (uids, reconnect jitter).
//! - [`forward`]: calls to other regions on a client's behalf, and the one
//!   rule that maps their outcome to a status (UNAVAILABLE for transport
//!   failures, the owner's own status passed through).
//! - [`wire_errors`]: tonic's refusals of unreadable requests in the
//!   documented codes (RESOURCE_EXHAUSTED, INVALID_ARGUMENT).

pub mod clock;
mod cluster;
pub mod codec;
pub mod config;
pub mod entropy;
pub mod forward;
pub mod links;
pub mod peer_service;
pub mod peers;
pub mod server;
pub mod service;
pub mod store;
pub mod stream;
pub mod wire_errors;
pub mod writer;

pub use cascade_core::model::Event;
pub use config::{ConfigFile, NodeSettings};
pub use server::{Node, NodeEnv, NodeError, RunningNode};
