//! A memory engine that remembers what it removed, the way an LSM engine
//! does until compaction, and counts the removed keys each scan passes.
//!
//! Why: the memory engine forgets a removed key, so nothing run on it can
//! tell a scan that starts after what it removed from one that starts at
//! the first key and steps over every row removed before. On fjall the
//! second kind is a tombstone walk that grows with every row ever removed:
//! three of them (the outbox compaction, the reconciler's unsettled
//! creates, the links' queued releases) were found by profiles only, the
//! last two at 84 % of all CPU of a 1M cross-region cascade. Tests run
//! nodes on this store and bound the tombstones passed per key removed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use super::{Batch, Entry, MemoryStore, ScanFloors, Store, StoreError, Table};

/// [`MemoryStore`] plus the tombstones of every key it removed (never
/// compacted: the worst case an LSM engine can present).
#[derive(Debug, Default)]
pub struct TombstoneStore {
    inner: MemoryStore,
    tombstones: Mutex<BTreeMap<Table, BTreeSet<Vec<u8>>>>,
    passed: Mutex<BTreeMap<Table, u64>>,
    removed: Mutex<BTreeMap<Table, u64>>,
    /// Live rows scans returned, per table: a scan that reads the same
    /// rows again costs on every engine, tombstones or not.
    returned: Mutex<BTreeMap<Table, u64>>,
}

impl TombstoneStore {
    /// Tombstones scans of `table` stepped over so far.
    pub fn passed(&self, table: Table) -> u64 {
        self.passed
            .lock()
            .map(|p| p.get(&table).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Tombstones scans stepped over so far, per table.
    pub fn passed_by_table(&self) -> BTreeMap<Table, u64> {
        self.passed.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Live rows the scans of `table` returned so far.
    pub fn returned(&self, table: Table) -> u64 {
        self.returned
            .lock()
            .map(|r| r.get(&table).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Keys of `table` removed so far.
    pub fn removed(&self, table: Table) -> u64 {
        self.removed
            .lock()
            .map(|r| r.get(&table).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

impl Store for TombstoneStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let found = self.inner.scan(table, prefix, after, limit)?;
        if let Ok(mut returned) = self.returned.lock() {
            *returned.entry(table).or_default() += found.len() as u64;
        }
        // What the scan read: from its start to its last entry, or to the
        // end of the prefix when it came back short.
        let upto = (found.len() >= limit)
            .then(|| found.last().map(|(k, _)| k.clone()))
            .flatten();
        let start = match after {
            Some(a) if a >= prefix => std::ops::Bound::Excluded(a.to_vec()),
            _ => std::ops::Bound::Included(prefix.to_vec()),
        };
        let stepped = match self.tombstones.lock() {
            Ok(t) => t.get(&table).map_or(0, |dead| {
                dead.range((start, std::ops::Bound::Unbounded))
                    .take_while(|k| k.starts_with(prefix) && upto.as_ref().is_none_or(|u| *k <= u))
                    .count() as u64
            }),
            Err(_) => 0,
        };
        if stepped > 0 {
            if let Ok(mut passed) = self.passed.lock() {
                *passed.entry(table).or_default() += stepped;
            }
        }
        Ok(found)
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if let Ok(mut tombstones) = self.tombstones.lock() {
            for (table, key, value) in &batch.ops {
                let dead = tombstones.entry(*table).or_default();
                if value.is_some() {
                    dead.remove(key);
                } else if self.inner.get(*table, key)?.is_some() {
                    dead.insert(key.clone());
                    if let Ok(mut removed) = self.removed.lock() {
                        *removed.entry(*table).or_default() += 1;
                    }
                }
            }
        }
        self.inner.commit(batch)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    fn start_flush(&self) -> Result<(), StoreError> {
        self.inner.start_flush()
    }

    fn finish_flush(&self) -> Result<(), StoreError> {
        self.inner.finish_flush()
    }

    fn overlaps_flushes(&self) -> bool {
        self.inner.overlaps_flushes()
    }

    fn waits_on_io(&self) -> bool {
        false
    }

    fn scan_floors(&self) -> Option<&ScanFloors> {
        self.inner.scan_floors()
    }
}
