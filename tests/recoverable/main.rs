//! Recoverable and bounded deletion (issue 29): soft delete with a window,
//! over real nodes in three regions.
//!
//! One test binary for the parts: each links the whole node, and a
//! binary of its own costs CI a link and a start.

// Test code: elapsed times are real time, and are printed (`--nocapture`).
#![allow(clippy::disallowed_methods, clippy::print_stderr)]

#[path = "../support/mod.rs"]
mod support;

mod soft_delete;
