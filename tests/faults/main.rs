//! Faults that must stay local: links between regions that heal and tell
//! the truth through a real fault-injecting proxy (`support::fault_proxy`:
//! a TLS tarpit, a silent partition, a throttled link), creates a client
//! can retry through cut forwards and connection resets, explain and
//! status within their deadline while a region is in trouble, a full
//! disk that heals without a restart, and a writer that fails at every
//! start, restarted with backoff.
//!
//! One test binary: most of these tests wait on the clock (a 25 s tarpit,
//! a minute of resets, deadlines), so they share the test threads with
//! each other instead of running one binary after the other.

#[path = "../support/mod.rs"]
mod support;

mod disk_full;
mod explain_deadline;
mod links_heal;
mod retriable_creates;
mod writer_restarts;
