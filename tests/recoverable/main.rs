//! Recoverable and bounded deletion (issue 29)
//!
//! One test binary with a module per part, so the suite links once.

#[path = "../support/mod.rs"]
mod support;

mod purge;
