//! An in-memory engine: for simulation tests and for comparing engines.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;

use super::{Batch, Entry, ScanFloors, Store, StoreError, Table};

/// One ordered map per table.
type Tables = BTreeMap<Table, BTreeMap<Vec<u8>, Vec<u8>>>;

#[derive(Debug, Default)]
pub struct MemoryStore {
    /// One lock over all tables, so a batch is atomic to readers.
    tables: Mutex<Tables>,
    /// Nothing to skip here (a removed key is gone), but a store that
    /// wraps this one to keep tombstones (`TombstoneStore`) scans by them.
    floors: ScanFloors,
}

/// What one table of a [`MemoryStore`] holds: its entries, their bytes,
/// and the bytes of the allocations that hold them (a key or value
/// allocated larger than it is counts whole), so a profile can tell the
/// data from the container.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TableFootprint {
    pub entries: u64,
    pub key_bytes: u64,
    pub value_bytes: u64,
    /// The entries' own allocations (not the ordered map's nodes).
    pub allocated_bytes: u64,
}

impl MemoryStore {
    /// What each table holds now (tables never written are absent). It
    /// walks every entry under the lock: for profiles, not for a request.
    pub fn footprint(&self) -> BTreeMap<Table, TableFootprint> {
        self.lock()
            .iter()
            .map(|(table, t)| {
                let mut f = TableFootprint::default();
                for (k, v) in t {
                    f.entries += 1;
                    f.key_bytes += k.len() as u64;
                    f.value_bytes += v.len() as u64;
                    f.allocated_bytes += (k.capacity() + v.capacity()) as u64;
                }
                (*table, f)
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        // A panic while holding the lock cannot leave a half-applied batch
        // (batches are applied without panicking paths), so poisoning is moot.
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemoryStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().get(&table).and_then(|t| t.get(key).cloned()))
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let tables = self.lock();
        let Some(t) = tables.get(&table) else {
            return Ok(Vec::new());
        };
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a.to_vec()),
            _ => Bound::Included(prefix.to_vec()),
        };
        Ok(t.range((start, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.floors.before_commit(&batch);
        let mut tables = self.lock();
        for (table, key, value) in batch.ops {
            let t = tables.entry(table).or_default();
            match value {
                Some(v) => t.insert(key, v),
                None => t.remove(&key),
            };
        }
        drop(tables);
        self.floors.landed();
        Ok(())
    }

    fn scan_floors(&self) -> Option<&ScanFloors> {
        Some(&self.floors)
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn waits_on_io(&self) -> bool {
        false
    }
}
