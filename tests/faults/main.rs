//! Faults between regions through a real fault-injecting proxy
//! (`support::fault_proxy`): links that heal and tell the truth (a TLS
//! tarpit, a silent partition, a throttled link), and creates that a
//! client can retry through cut forwards and connection resets.
//!
//! One test binary: most of these tests wait on the clock (a 25 s tarpit,
//! a minute of resets), so they share the test threads with each other
//! instead of running one binary after the other.

#[path = "../support/mod.rs"]
mod support;

mod links_heal;
mod retriable_creates;
