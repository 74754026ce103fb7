//! What bounds or holds an operation's spreading (issue 29): its budget,
//! rate, pause and cancel, kept with each region's part of the operation
//! ([`super::Operation::controls`]); what changes them is
//! `crate::protocol::control`.

use serde::{Deserialize, Serialize};

use super::Timestamp;

/// What bounds or holds an operation's spreading: a budget of members
/// (`max_deletions`), a rate, a pause, a cancel. Each region's part keeps
/// its own copy.
///
/// The budget belongs to the root's region: there `max_deletions` is the
/// operation's budget and `used()` counts the members this region entered
/// into deletion plus the leases it granted to other regions. In any other
/// region `max_deletions` is what the root's region leased to it so far,
/// and `used()` what it spent; a member is entered only with a unit of it
/// in hand, so the members entered, summed over the regions, never exceed
/// the operation's budget.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationControls {
    /// The most members this part may enter into deletion (see above);
    /// None: unbounded.
    pub max_deletions: Option<u64>,
    /// Members this part entered into deletion (the root counts, and a
    /// leaf purged in the step that reached it).
    pub admitted: u64,
    /// Budget the root's region leased to other regions (root only).
    pub granted: u64,
    /// The root's region answered the last lease with nothing left: the
    /// operation's budget and what was used of it then (non-root only).
    pub exhausted: Option<(u64, u64)>,
    /// New members per second this part enters, at most; None: no limit.
    pub rate_per_s: Option<u32>,
    /// When the rate's count started (the part's start, or its resume).
    pub rate_since: Timestamp,
    /// `admitted` at `rate_since`.
    pub rate_base: u64,
    /// Paused (`PauseOperation`): this region's work skips the operation.
    pub paused: bool,
    /// Cancelled (`CancelOperation`): no new member is entered.
    pub cancelled: bool,
    /// Who paused, resumed or cancelled it last.
    pub by: String,
}

impl OperationControls {
    /// Counted against `max_deletions`.
    pub fn used(&self) -> u64 {
        self.admitted.saturating_add(self.granted)
    }

    /// Budget left to spend here (u64::MAX when unbounded).
    pub fn left(&self) -> u64 {
        self.max_deletions
            .map_or(u64::MAX, |max| max.saturating_sub(self.used()))
    }
}
