//! The Cascade client: a typed gRPC wrapper and the command-line front end
//! (`cascade get`, `delete --cascade --wait`, …).
//!
//! # Layout
//!
//! - [`client`]: [`Client`], connection and calls, errors with the server's details.
//! - [`cli`]: the client subcommands of the `cascade` binary.
//! - [`render`]: text and JSON output.

pub mod check;
pub mod cli;
pub mod client;
pub mod render;

pub use client::{AdminClient, Client, ClientError, ClientTls};
