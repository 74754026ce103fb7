//! The writer under load: a client's write during a long cascade waits
//! for at most one work step (`held_writes`), and client writes that queue
//! meanwhile share one flush (`group_commit`). Both count what the writer
//! committed instead of timing it, so they hold on any machine.
//!
//! One test binary for both: each links the whole node, and a binary of
//! its own costs CI a link and a start.

#[path = "../support/mod.rs"]
mod support;

mod group_commit;
mod held_writes;
