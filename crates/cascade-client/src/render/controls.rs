//! An operation's budget, rate and last control (issue 29), in text and
//! in JSON: only a bounded or controlled operation shows them.

use cascade_proto::v1;
use serde_json::{json, Map, Value};

/// Adds the budget fields of a bounded or controlled operation to its JSON
/// object (docs/json-output.md); an operation without them gets none.
pub(super) fn add_controls_json(op: &v1::Operation, map: &mut Map<String, Value>) {
    if !is_controlled(op) {
        return;
    }
    map.insert("max_deletions".into(), json!(op.max_deletions));
    map.insert("budget_used".into(), json!(op.budget_used));
    map.insert("rate_per_second".into(), json!(op.rate_per_second));
    map.insert("controlled_by".into(), json!(op.controlled_by));
}

/// Whether an operation was bounded (budget, rate) or controlled (paused,
/// resumed, cancelled).
fn is_controlled(op: &v1::Operation) -> bool {
    op.max_deletions > 0 || op.rate_per_second > 0 || !op.controlled_by.is_empty()
}

/// What an operation's budget, rate and last control say, for a human.
pub(super) fn controls_text(op: &v1::Operation) -> Option<String> {
    if !is_controlled(op) {
        return None;
    }
    let mut parts = Vec::new();
    if op.max_deletions > 0 {
        parts.push(format!(
            "budget {} of {} member(s) used",
            op.budget_used, op.max_deletions
        ));
    }
    if op.rate_per_second > 0 {
        parts.push(format!("at most {} new member(s) a second", op.rate_per_second));
    }
    if !op.controlled_by.is_empty() {
        parts.push(format!("last paused, resumed or cancelled by {}", op.controlled_by));
    }
    Some(parts.join("; "))
}
