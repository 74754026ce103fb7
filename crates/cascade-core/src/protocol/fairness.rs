//! Fairness between operations in a work step: due items are taken
//! round-robin by operation (at most `Policy::items_per_operation` of one
//! per step), so a small delete is not queued behind a cascade of a
//! million; see [`super::process_work`].

use std::collections::VecDeque;

use crate::error::CoreError;
use crate::model::{DueOperation, DueWork};
use crate::name::{OperationId, Uid};
use crate::state::{StateRead, Tx};

use super::{Ctx, WorkReport};

/// How many times `Policy::batch_items` due items a work step looks at to
/// share the step between operations.
pub(super) const WINDOW_FACTOR: usize = 4;

/// The operation a due item works for: what its index entry recorded,
/// else its deletion record's, or for an importer's item its tombstone's
/// (uids are unique across regions, so at most one of the two exists). A
/// soft-deleted member's expiry (no record: its deletion finished) goes
/// with the other expiries, under no operation, so a mass expiry shares
/// the step like one operation.
fn operation_of<S: StateRead + ?Sized>(tx: &Tx<'_, S>, due: &DueWork) -> Result<Option<OperationId>, CoreError> {
    if let DueOperation::Recorded(operation) = due.operation {
        return Ok(operation);
    }
    Ok(match tx.deletion(due.uid)? {
        Some(d) => Some(d.operation),
        None => tx.remote_deletion(due.uid)?.map(|t| t.operation),
    })
}

/// The due items a step takes, round-robin by operation in the order each
/// operation's first item came due, at most `Policy::items_per_operation`
/// of one while others are due too, and `Policy::batch_items` in all.
/// Items left out stay due.
pub(super) fn round_robin<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    due: Vec<DueWork>,
    report: &mut WorkReport,
) -> Result<Vec<(Option<OperationId>, Uid)>, CoreError> {
    let mut queues: Vec<(Option<OperationId>, VecDeque<Uid>)> = Vec::new();
    for item in due {
        let op = operation_of(tx, &item)?;
        match queues.iter_mut().find(|(o, _)| *o == op) {
            Some((_, q)) => q.push_back(item.uid),
            None => queues.push((op, VecDeque::from([item.uid]))),
        }
    }
    let per_op = ctx.policy.items_per_operation.max(1);
    let several = queues.len() > 1;
    let mut taken: Vec<usize> = vec![0; queues.len()];
    let mut out = Vec::new();
    loop {
        let mut progressed = false;
        for (i, (op, q)) in queues.iter_mut().enumerate() {
            if out.len() >= ctx.policy.batch_items {
                break;
            }
            // The cap shares the step between operations; one alone in
            // the window takes the whole step, as before.
            if several && taken[i] >= per_op {
                continue;
            }
            if let Some(item) = q.pop_front() {
                taken[i] += 1;
                out.push((*op, item));
                progressed = true;
            }
        }
        if !progressed || out.len() >= ctx.policy.batch_items {
            break;
        }
    }
    if queues.iter().any(|(_, q)| !q.is_empty()) {
        report.more = true;
    }
    Ok(out)
}
