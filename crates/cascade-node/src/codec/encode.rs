//! [`encode_writes`]: a step's `WriteSet` as one atomic [`Batch`], read
//! against the store as it is before the batch (the due index of moved
//! work, the blocking index of removed rows, the audit log's count).

use cascade_core::model::RemoteDeletion;
use cascade_core::schema::OnDelete;
use cascade_core::state::WriteSet;
use cascade_core::{OperationId, Uid};

use super::{
    audit_log, backref_key, due_key, due_value, outbox, outcome_key, records, release_key, Record, StoreState,
    GENERATION, NEXT_REVISION, SCHEMA_IN_FORCE,
};
use crate::store::{Batch, StoreError, Table};

/// The operation a queue entry works for as the step that queues or moves
/// it leaves things: its deletion record's, or for another region's
/// resource its tombstone's (uids are unique across regions), or none (a
/// soft-deleted member's expiry, queued by the step that removes its
/// record). This step's writes first, then the store.
fn recorded_operation(state: &StoreState<'_>, w: &WriteSet, uid: Uid) -> Result<Option<OperationId>, StoreError> {
    // Written or removed by this step: a local resource's, no tombstone to look for.
    if let Some(written) = w.deletions.get(&uid) {
        return Ok(written.as_ref().map(|d| d.operation));
    }
    if let Some(deletion) = state.get_deletion(uid)? {
        return Ok(Some(deletion.operation));
    }
    Ok(match w.remote_deletions.get(&uid) {
        Some(written) => written.as_ref().map(|t| t.operation),
        None => state
            .get::<RemoteDeletion>(Table::RemoteDeletions, uid.as_bytes())?
            .map(|t| t.operation),
    })
}

/// One atomic batch for everything a step wrote, read against the store
/// as it is before the batch (to move the due index of rescheduled work).
pub fn encode_writes(state: &StoreState<'_>, w: &WriteSet) -> Result<Batch, StoreError> {
    let mut b = Batch::default();
    fn put_or_remove<T: Record>(b: &mut Batch, table: Table, key: Vec<u8>, v: &Option<T>) -> Result<(), StoreError> {
        match v {
            Some(v) => b.put(table, key, v.encode(table)?),
            None => b.remove(table, key),
        }
        Ok(())
    }
    for (name, v) in &w.resources {
        let key = name.as_str().as_bytes().to_vec();
        match v {
            Some(resource) => b.put(Table::Resources, key, records::encode_resource_row(name, resource)?),
            None => b.remove(Table::Resources, key),
        }
    }
    for (uid, v) in &w.uid_index {
        put_or_remove(&mut b, Table::UidIndex, uid.as_bytes().to_vec(), v)?;
    }
    // Whether the blocking index has any key, asked once per batch (from
    // its scan floor, so the removed keys ahead of its first live one are
    // passed about once, not once a batch): most regions have no `block`
    // row at all. Asked per removed row, the index's reads were a tenth of
    // the writer's time in a flat cascade on sled (docs/BENCHMARKS.md,
    // "Reads of empty tables").
    let mut blocking_index_empty: Option<bool> = None;
    for (k, v) in &w.backrefs {
        let key = backref_key(k);
        // The index holds exactly the `block` rows. A row keeps its class
        // when rewritten, so only a put of one writes it, and a read of the
        // (small) index spares every other write a blind remove.
        if v.as_ref().is_some_and(|row| row.on_delete == OnDelete::Block) {
            b.put(Table::BlockingBackrefs, key.clone(), Vec::new());
        } else {
            let empty = match blocking_index_empty {
                Some(empty) => empty,
                None => {
                    let empty = state.table_is_empty(Table::BlockingBackrefs)?;
                    blocking_index_empty = Some(empty);
                    empty
                }
            };
            if !empty && state.exists(Table::BlockingBackrefs, &key)? {
                b.remove(Table::BlockingBackrefs, key.clone());
            }
        }
        match v {
            Some(row) => b.put(Table::Backrefs, key, records::encode_backref(k, row)?),
            None => b.remove(Table::Backrefs, key),
        }
    }
    for (uid, v) in &w.deletions {
        put_or_remove(&mut b, Table::Deletions, uid.as_bytes().to_vec(), v)?;
    }
    for (id, v) in &w.operations {
        put_or_remove(&mut b, Table::Operations, id.0.as_bytes().to_vec(), v)?;
    }
    for ((op, name), v) in &w.outcomes {
        b.put(
            Table::Outcomes,
            outcome_key(*op, name),
            records::encode_outcome_row(name, v)?,
        );
    }
    for (uid, v) in &w.work {
        let before = state.stored_due(*uid)?;
        let after = v.as_ref().map(|w| w.next_attempt_at);
        if before != after {
            if let Some(due) = before {
                b.remove(Table::DueIndex, due_key(due, *uid));
            }
            if let Some(due) = after {
                let operation = recorded_operation(state, w, *uid)?;
                b.put(Table::DueIndex, due_key(due, *uid), due_value(operation));
            }
        }
        put_or_remove(&mut b, Table::RetryQueue, uid.as_bytes().to_vec(), v)?;
    }
    outbox::put_events(&mut b, &w.events)?;
    if let Some(r) = w.next_revision {
        b.put(Table::Meta, NEXT_REVISION.to_vec(), r.to_be_bytes().to_vec());
    }
    for (uid, v) in &w.remote_deletions {
        put_or_remove(&mut b, Table::RemoteDeletions, uid.as_bytes().to_vec(), v)?;
    }
    for ((region, key), v) in &w.pending_releases {
        put_or_remove(&mut b, Table::PendingReleases, release_key(region, key), v)?;
    }
    for (region, rev) in &w.cursors {
        b.put(Table::Cursors, region.as_bytes().to_vec(), rev.to_be_bytes().to_vec());
    }
    for (uid, v) in &w.pending_attach {
        put_or_remove(&mut b, Table::PendingAttach, uid.as_bytes().to_vec(), v)?;
    }
    if let Some(g) = w.generation {
        b.put(Table::Meta, GENERATION.to_vec(), g.to_be_bytes().to_vec());
    }
    if let Some(schema) = &w.schema_in_force {
        b.put(Table::Meta, SCHEMA_IN_FORCE.to_vec(), schema.as_bytes().to_vec());
    }
    for entry in &w.audit {
        let (key, value) = records::encode_audit_row(entry)?;
        b.put(Table::Audit, key, value);
    }
    if !w.audit.is_empty() {
        // The count moves in the batch that adds the entries. Absent, it
        // starts here when the log is empty (a fresh store: its first
        // audited write); a log from before the count is counted by the
        // first retention step instead. Started by that step on a fresh
        // store too, it was a write of its own at the node's first tick:
        // one batch more than a client's writes, whenever the tick came
        // (`writer_load`'s `concurrent_creates_share_flushes…` counted it
        // under CI's load, where its burst outlasted the first tick).
        let count = match state.audit_count()? {
            Some(count) => Some(count),
            None => state.audit_log_is_empty()?.then_some(0),
        };
        if let Some(count) = count {
            let count = count + w.audit.len() as u64;
            b.put(
                Table::Meta,
                audit_log::AUDIT_ENTRIES.to_vec(),
                count.to_be_bytes().to_vec(),
            );
        }
    }
    Ok(b)
}
