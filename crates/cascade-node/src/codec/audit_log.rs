//! The audit log's bookkeeping in the store: its count and where
//! retention stopped (meta keys), and one retention step.

use super::StoreState;
use crate::store::{Batch, StoreError, Table};

/// How many entries the audit log holds: moved in the batch that adds
/// entries and in the one that prunes them. Started by the first batch
/// that adds entries to an empty log; absent in a store from before
/// issue 27 until the first retention step counts the table once (such a
/// log holds only Admin calls: small).
pub(super) const AUDIT_ENTRIES: &[u8] = b"audit_entries";
/// The key of the last audit entry retention removed: the next step scans
/// after it, not over the tombstones of an LSM engine (see `compact_outbox`).
const AUDIT_FLOOR: &[u8] = b"audit_floor";

/// What one retention step of the audit log did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditPruned {
    /// Entries removed.
    pub removed: usize,
    /// Entries the log holds now.
    pub entries: u64,
    /// Whether the step stopped at its limit with more to remove.
    pub more: bool,
}

impl StoreState<'_> {
    /// How many entries the audit log holds (None: not counted yet, see [`AUDIT_ENTRIES`]).
    pub fn audit_count(&self) -> Result<Option<u64>, StoreError> {
        Ok(match self.store.get(Table::Meta, AUDIT_ENTRIES)? {
            Some(_) => Some(self.counter(Table::Meta, AUDIT_ENTRIES, 0)?),
            None => None,
        })
    }

    /// Whether the audit log holds no entry (one key read at most; asked
    /// only while the count is absent).
    pub(super) fn audit_log_is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.store.scan(Table::Audit, &[], None, 1)?.is_empty())
    }

    /// One retention step of the audit log: removes, oldest first, the
    /// entries older than `cutoff_ms` (by their id's time) and those beyond
    /// `max_entries`, at most `limit`, in one batch that also moves the
    /// count. Counts the table first when the count is absent (a store
    /// from before it was kept). Returns the batch for the writer to
    /// commit and flush through its own path (`WriterState::retain_audit`),
    /// like every write: a failure there counts a takeback and starts the
    /// store's healing as any other (it committed and flushed here before,
    /// and a failed flush only logged a warning while it may have dropped
    /// what other steps had committed without a flush).
    pub fn prune_audit(
        &self,
        cutoff_ms: Option<u64>,
        max_entries: Option<u64>,
        limit: usize,
    ) -> Result<(Batch, AuditPruned), StoreError> {
        let mut batch = Batch::default();
        let count = match self.audit_count()? {
            Some(c) => c,
            None => {
                let mut counted = 0u64;
                let mut after: Option<Vec<u8>> = None;
                loop {
                    let keys = self.store.scan(Table::Audit, &[], after.as_deref(), 10_000)?;
                    counted += keys.len() as u64;
                    match keys.last() {
                        Some((k, _)) if keys.len() == 10_000 => after = Some(k.clone()),
                        _ => break,
                    }
                }
                batch.put(Table::Meta, AUDIT_ENTRIES.to_vec(), counted.to_be_bytes().to_vec());
                counted
            }
        };
        let mut over = max_entries.map_or(0, |max| count.saturating_sub(max));
        let floor = self.store.get(Table::Meta, AUDIT_FLOOR)?;
        // The oldest entry first, alone: most steps find nothing to remove,
        // and that answer should cost one key, not a step's worth.
        let oldest_is_old = |keys: &[(Vec<u8>, Vec<u8>)]| {
            keys.first()
                .and_then(|(k, _)| crate::audit::key_time_ms(k))
                .zip(cutoff_ms)
                .is_some_and(|(at, cutoff)| at < cutoff)
        };
        let keys = if over > 0
            || (cutoff_ms.is_some() && oldest_is_old(&self.store.scan(Table::Audit, &[], floor.as_deref(), 1)?))
        {
            self.store.scan(Table::Audit, &[], floor.as_deref(), limit)?
        } else {
            Vec::new()
        };
        let scanned = keys.len();
        let mut removed = 0usize;
        let mut last = None;
        for (key, _) in keys {
            let old = match (cutoff_ms, crate::audit::key_time_ms(&key)) {
                (Some(cutoff), Some(at)) => at < cutoff,
                _ => false,
            };
            if !old && over == 0 {
                break;
            }
            over = over.saturating_sub(1);
            removed += 1;
            batch.remove(Table::Audit, key.clone());
            last = Some(key);
        }
        let entries = count.saturating_sub(removed as u64);
        if let Some(last) = last {
            batch.put(Table::Meta, AUDIT_FLOOR.to_vec(), last);
            batch.put(Table::Meta, AUDIT_ENTRIES.to_vec(), entries.to_be_bytes().to_vec());
        }
        let pruned = AuditPruned {
            removed,
            entries,
            more: removed == scanned && scanned == limit,
        };
        Ok((batch, pruned))
    }
}
