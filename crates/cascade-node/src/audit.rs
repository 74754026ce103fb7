//! The audit log's shell side: who a change is recorded for
//! ([`AuditContext`], built by a handler from the caller and the decision
//! that let the call through), the entry a writer step appends for each
//! change it commits ([`Change`]: one entry per change, in the same batch),
//! the budget of refusals audited per second ([`RefusalBudget`]) and what
//! one retention step keeps ([`Retention`]).
//!
//! Every field is cut to its limit with `cut_stored` (a marker and the
//! original length), as the core cuts the entries of Admin steps: a
//! refusal is audited with what the caller sent, and the caller decides
//! how much that is.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cascade_core::auth::Principal;
use cascade_core::limits::{
    cut_stored, MAX_AUDIT_ACTION_BYTES, MAX_AUDIT_OUTCOME_BYTES, MAX_AUDIT_TARGET_BYTES, MAX_AUDIT_WHO_BYTES,
    MAX_REASON_BYTES, MAX_REGION_BYTES,
};
use cascade_core::model::AuditEntry;
use cascade_core::{Timestamp, Uid};

/// Refused calls written to the audit log per second, at most: each is a
/// commit of the node's one writer, and anyone can make them. Beyond this
/// they are only logged (with how many were left out).
pub(crate) const AUDITED_REFUSALS_PER_SECOND: u32 = 10;

/// Groups of a principal kept in one entry, at most (each cut like `who`).
pub(crate) const MAX_AUDIT_GROUPS: usize = 32;

/// Entries one retention step removes at most: a step is one writer
/// commit, and a client's write waits behind it at most this long.
pub(crate) const PRUNE_STEP_KEYS: usize = 1_000;

/// Who a change is recorded for, and how the call got here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AuditContext {
    /// The principal's id (or, for a refused Admin call under the
    /// `[admin]` gate, what the caller presented).
    pub who: String,
    pub groups: Vec<String>,
    /// `certificate`, `jwt`, `token`, `unauthenticated`.
    pub via: String,
    /// This node: its `[ha] node_name`, else its listen address, else the region.
    pub node: String,
    /// The region the call came through: this one for a direct call, the
    /// vouching region for a call another region made for its client.
    pub through: String,
    /// The rule of the decision that allowed (or refused) it.
    pub rule: String,
    /// The caller's own note: a deletion's `requested_by`, an Admin call's reason.
    pub note: String,
}

/// Who this node is in the audit log (`node`): its `[ha] node_name`, else
/// the address it listens on (known once it serves), else its region.
/// Shared by the node (the entries of the calls it answers) and its writer
/// (the entries of a cascade's members, written in work steps that no
/// call carries a context into).
#[derive(Debug, Clone)]
pub(crate) struct AuditNode {
    /// `[ha] node_name`, in a region of several nodes.
    named: Option<String>,
    /// The address it listens on, set when it starts serving.
    listening: Arc<Mutex<Option<String>>>,
    region: String,
}

impl AuditNode {
    pub(crate) fn new(named: Option<String>, listening: Arc<Mutex<Option<String>>>, region: String) -> AuditNode {
        AuditNode {
            named,
            listening,
            region,
        }
    }

    /// The name entries give this node now.
    pub(crate) fn name(&self) -> String {
        if let Some(named) = &self.named {
            return named.clone();
        }
        let listening = self.listening.lock().ok().and_then(|a| a.clone());
        listening.unwrap_or_else(|| self.region.clone())
    }
}

/// One change a step made, as the log names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    /// `create`, `update`, `delete`, `cascade`, `orphan`, `lien.add`, ...
    pub action: &'static str,
    /// The resource's full name.
    pub target: String,
}

impl AuditContext {
    /// The context of `principal`'s call, allowed or refused by `rule`.
    pub(crate) fn of(principal: &Principal, node: String, through: String, rule: String) -> AuditContext {
        AuditContext {
            who: principal.id.clone(),
            groups: principal.groups.clone(),
            via: principal.via.as_str().to_owned(),
            node,
            through,
            rule,
            note: String::new(),
        }
    }

    /// With the caller's note (a `requested_by`, a reason).
    pub(crate) fn noting(mut self, note: impl Into<String>) -> AuditContext {
        self.note = note.into();
        self
    }

    /// The entry of one change or refusal, every field cut to its limit.
    pub(crate) fn entry(&self, id: Uid, time: Timestamp, action: &str, target: &str, outcome: &str) -> AuditEntry {
        let mut entry = AuditEntry {
            id,
            time,
            who: cut_stored(&self.who, MAX_AUDIT_WHO_BYTES),
            action: cut_stored(action, MAX_AUDIT_ACTION_BYTES),
            target: cut_stored(target, MAX_AUDIT_TARGET_BYTES),
            reason: cut_stored(&self.note, MAX_REASON_BYTES),
            outcome: cut_stored(outcome, MAX_AUDIT_OUTCOME_BYTES),
            ..AuditEntry::default()
        };
        self.stamp(&mut entry);
        entry
    }

    /// Fills this context's principal details, node, region and rule into
    /// an entry a core step wrote (an Admin action's: the core knows what
    /// was asked and by whom, not which node or rule).
    pub(crate) fn stamp(&self, entry: &mut AuditEntry) {
        entry.groups = self
            .groups
            .iter()
            .take(MAX_AUDIT_GROUPS)
            .map(|g| cut_stored(g, MAX_AUDIT_WHO_BYTES))
            .collect();
        entry.via = cut_stored(&self.via, MAX_AUDIT_ACTION_BYTES);
        entry.node = cut_stored(&self.node, MAX_AUDIT_TARGET_BYTES);
        entry.through = cut_stored(&self.through, MAX_REGION_BYTES);
        entry.rule = cut_stored(&self.rule, MAX_AUDIT_TARGET_BYTES);
    }
}

/// How many refusals may still be audited this second (see
/// [`AUDITED_REFUSALS_PER_SECOND`]); shared by every service of a node.
#[derive(Debug, Default)]
pub(crate) struct RefusalBudget(Mutex<(u64, u32)>);

impl RefusalBudget {
    /// Whether one more refusal may be written at `now`.
    pub(crate) fn admit(&self, now: Timestamp) -> bool {
        let second = now.0 / 1000;
        // A poisoned lock only means another caller panicked; the pair is still usable.
        let mut budget = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if budget.0 != second {
            *budget = (second, 0);
        }
        budget.1 = budget.1.saturating_add(1);
        budget.1 <= AUDITED_REFUSALS_PER_SECOND
    }
}

/// What the audit log keeps (`[audit] retain`, `max_entries`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Retention {
    /// Entries older than this are removed.
    pub retain: Option<Duration>,
    /// Beyond this many, the oldest are removed.
    pub max_entries: Option<u64>,
}

impl Retention {
    /// Entries whose id's time is below this are too old at `now` (None: no age limit).
    pub(crate) fn cutoff(&self, now: Timestamp) -> Option<u64> {
        let retain = u64::try_from(self.retain?.as_millis()).unwrap_or(u64::MAX);
        Some(now.0.saturating_sub(retain))
    }
}

/// The time an entry's key says it was written: a UUID v7's first 48 bits
/// are milliseconds since the epoch. The log's keys are its ids, so a scan
/// in key order is a scan in time order.
pub(crate) fn key_time_ms(key: &[u8]) -> Option<u64> {
    let first: [u8; 6] = key.get(..6)?.try_into().ok()?;
    let mut wide = [0u8; 8];
    wide[2..].copy_from_slice(&first);
    Some(u64::from_be_bytes(wide))
}

/// The smallest key of an entry written at `ms` or later (a UUID v7 of
/// that millisecond with every other bit zero).
pub(crate) fn first_key_at(ms: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_says_when_its_entry_was_written() {
        let id = uuid::Builder::from_unix_timestamp_millis(1_760_000_000_123, &[7; 10]).into_uuid();
        assert_eq!(key_time_ms(id.as_bytes()), Some(1_760_000_000_123));
        assert!(first_key_at(1_760_000_000_123).as_slice() <= id.as_bytes().as_slice());
        assert!(first_key_at(1_760_000_000_124).as_slice() > id.as_bytes().as_slice());
        assert_eq!(key_time_ms(b"short"), None);
    }

    #[test]
    fn refusals_beyond_the_budget_of_a_second_are_not_audited() {
        let budget = RefusalBudget::default();
        let admitted = (0..25).filter(|_| budget.admit(Timestamp(5_000))).count();
        assert_eq!(admitted, AUDITED_REFUSALS_PER_SECOND as usize);
        assert!(budget.admit(Timestamp(6_000)), "a new second, a new budget");
    }

    #[test]
    fn every_field_of_an_entry_is_cut_to_its_limit() {
        let context = AuditContext {
            who: "w".repeat(10_000),
            groups: vec!["g".repeat(10_000); 100],
            via: "v".repeat(10_000),
            node: "n".repeat(10_000),
            through: "t".repeat(10_000),
            rule: "r".repeat(10_000),
            note: "x".repeat(100_000),
        };
        let e = context.entry(Uid(uuid::Uuid::nil()), Timestamp(1), &"a".repeat(10_000), "b", "c");
        assert!(e.who.len() <= MAX_AUDIT_WHO_BYTES && e.action.len() <= MAX_AUDIT_ACTION_BYTES);
        assert!(e.reason.len() <= MAX_REASON_BYTES && e.via.len() <= MAX_AUDIT_ACTION_BYTES);
        assert!(e.node.len() <= MAX_AUDIT_TARGET_BYTES && e.through.len() <= MAX_REGION_BYTES);
        assert!(e.rule.len() <= MAX_AUDIT_TARGET_BYTES);
        assert_eq!(e.groups.len(), MAX_AUDIT_GROUPS);
        assert!(e.groups.iter().all(|g| g.len() <= MAX_AUDIT_WHO_BYTES));
    }

    #[test]
    fn the_cutoff_is_the_retention_before_now() {
        let keep_a_minute = Retention {
            retain: Some(Duration::from_secs(60)),
            max_entries: None,
        };
        assert_eq!(keep_a_minute.cutoff(Timestamp(100_000)), Some(40_000));
        assert_eq!(Retention::default().cutoff(Timestamp(100_000)), None);
    }
}
