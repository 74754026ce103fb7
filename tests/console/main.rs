//! The web console (issue 30) in a real headless Chromium against real
//! nodes: an operation followed live to its end, a stuck cascade and its
//! blocker, a region that stops answering or is frozen (the fault proxy, a
//! real SIGSTOP), signing in, hostile values, the dry run and its delete
//! button, the cluster page, a 100,001-member operation, and the README's
//! pictures taken from the demo.
//!
//! One test binary for every console test (CI links the node once for
//! all of them). Without Chromium the tests say they were skipped and
//! pass; `CASCADE_TEST_CHROMIUM_REQUIRED=1` (CI) makes that a failure.

// Test code: elapsed times are real time, and are printed (`--nocapture`);
// DevTools answers are JSON read here.
#![allow(clippy::disallowed_methods, clippy::print_stderr, clippy::print_stdout)]

#[path = "../support/mod.rs"]
mod support;

mod browser;
mod cluster;
mod delete;
mod frozen;
mod ha;
mod history;
mod hosts;
mod identity;
mod large;
mod operation;
mod progress;
mod screens;
mod signed_in;

use std::net::SocketAddr;

use cascade_node::NodeSettings;

/// A node's settings with the console on a free loopback port.
pub fn with_console(settings: &mut NodeSettings) {
    settings.console_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
}

/// The console URL of `region`'s node in `cluster` (no trailing slash).
pub fn console_of(cluster: &support::Cluster, region: &str) -> String {
    cluster
        .node(region)
        .node
        .console_url()
        .unwrap_or_else(|| panic!("{region}'s node serves no console"))
        .trim_end_matches('/')
        .to_owned()
}
