//! Recoverable and bounded deletion (issue 29), over real nodes in three
//! regions: soft delete with a window, plan-bound deletes (a dry run's
//! token, the delete that expects it, `[limits] confirm_above`), filtered
//! purge, budgets and control of a running operation, and undelete of a
//! whole cascade.
//!
//! One test binary for the multi-node tests (CI links the node
//! once for all of them).

// Test code: elapsed times are real time, and are printed (`--nocapture`).
#![allow(clippy::disallowed_methods, clippy::print_stderr)]

#[path = "../support/mod.rs"]
mod support;

mod budget;
mod plan_bound;
mod purge;
mod soft_delete;
mod undelete;
