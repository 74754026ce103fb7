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

pub mod clock;
mod cluster;
pub mod codec;
pub mod config;
pub mod entropy;
pub mod links;
pub mod peer_service;
pub mod peers;
pub mod server;
pub mod service;
pub mod store;
pub mod stream;
pub mod writer;

pub use cascade_core::model::Event;
pub use config::{ConfigFile, NodeSettings};
pub use server::{Node, NodeEnv, NodeError, RunningNode};
