//! An in-memory engine: for simulation tests and for comparing engines.
//!
//! Each entry is one allocation (the key's length, the key, the value:
//! [`Packed`]) in one ordered set per table. Why: `cascade-bench` runs its
//! nodes on this engine in its own process, and with a `BTreeMap` of two
//! `Vec`s per entry the container weighed more than the data (a P1 of 1M
//! ports peaked at 1,135 MB for 533 MB of keys and values: about 120
//! bytes per entry beyond them; docs/BENCHMARKS.md, "P4: the memory
//! engine's footprint").

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Mutex;

use super::{Batch, Entry, ScanFloors, Store, StoreError, Table};

/// One ordered set of entries per table, indexed by [`Table::index`].
type Tables = [BTreeSet<Packed>; Table::ALL.len()];

#[derive(Debug, Default)]
pub struct MemoryStore {
    /// One lock over all tables, so a batch is atomic to readers.
    tables: Mutex<Tables>,
    /// Nothing to skip here (a removed key is gone), but a store that
    /// wraps this one to keep tombstones (`TombstoneStore`) scans by them.
    floors: ScanFloors,
}

/// What one table of a [`MemoryStore`] holds: its entries, their bytes,
/// and the bytes of the allocations that hold them, so a profile can tell
/// the data from the container.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TableFootprint {
    pub entries: u64,
    pub key_bytes: u64,
    pub value_bytes: u64,
    /// The entries' own allocations (not the ordered set's nodes).
    pub allocated_bytes: u64,
}

impl MemoryStore {
    /// What each table holds now (tables without entries are absent). It
    /// walks every entry under the lock: for profiles, not for a request.
    pub fn footprint(&self) -> BTreeMap<Table, TableFootprint> {
        let tables = self.lock();
        Table::ALL
            .into_iter()
            .filter(|table| !tables[table.index()].is_empty())
            .map(|table| {
                let mut f = TableFootprint::default();
                for entry in &tables[table.index()] {
                    let (key, value) = entry.split();
                    f.entries += 1;
                    f.key_bytes += key.len() as u64;
                    f.value_bytes += value.len() as u64;
                    f.allocated_bytes += entry.0.len() as u64;
                }
                (table, f)
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
        Ok(self.lock()[table.index()].get(key).map(|e| e.split().1.to_vec()))
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let tables = self.lock();
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        Ok(tables[table.index()]
            .range::<[u8], _>((start, Bound::Unbounded))
            .map(Packed::split)
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect())
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.floors.before_commit(&batch);
        // Packed before the lock is taken: readers wait for the inserts only.
        let ops: Vec<(Table, Result<Packed, Vec<u8>>)> = batch
            .ops
            .into_iter()
            .map(|(table, key, value)| match value {
                Some(v) => (table, Ok(Packed::new(&key, &v))),
                None => (table, Err(key)),
            })
            .collect();
        let mut tables = self.lock();
        for (table, op) in ops {
            let t = &mut tables[table.index()];
            match op {
                Ok(entry) => {
                    t.replace(entry);
                }
                Err(key) => {
                    t.remove(key.as_slice());
                }
            }
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

/// A key and its value in one exact allocation: the key's length (LEB128),
/// the key, the value. Ordered, compared and borrowed by its key alone, so
/// a set of them is a map from key to value that a `&[u8]` looks up.
#[derive(Debug)]
struct Packed(Box<[u8]>);

impl Packed {
    fn new(key: &[u8], value: &[u8]) -> Self {
        // Exactly as long as it must be, so the box is the allocation.
        let header = (usize::BITS - key.len().leading_zeros()).div_ceil(7).max(1) as usize;
        let mut out = Vec::with_capacity(header + key.len() + value.len());
        let mut len = key.len();
        while len >= 0x80 {
            out.push((len as u8) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(key);
        out.extend_from_slice(value);
        Self(out.into_boxed_slice())
    }

    /// The key and the value.
    fn split(&self) -> (&[u8], &[u8]) {
        let mut len = 0usize;
        let mut shift = 0;
        let mut header = 0;
        for &byte in self.0.iter() {
            header += 1;
            len |= usize::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                break;
            }
            shift += 7;
        }
        let body = self.0.get(header..).unwrap_or_default();
        body.split_at(len.min(body.len()))
    }

    fn key(&self) -> &[u8] {
        self.split().0
    }
}

impl Borrow<[u8]> for Packed {
    fn borrow(&self) -> &[u8] {
        self.key()
    }
}

impl PartialEq for Packed {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Packed {}

impl PartialOrd for Packed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Packed {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(other.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys whose length takes one, two and three bytes to write, sharing
    /// prefixes so that the order is the bytes' and not the lengths'.
    #[test]
    fn keys_of_any_length_and_empty_values_keep_their_order() {
        let store = MemoryStore::default();
        let keys: Vec<Vec<u8>> = [0usize, 1, 127, 128, 129, 300, 20_000]
            .iter()
            .map(|&n| vec![b'k'; n])
            .collect();
        let mut batch = Batch::default();
        for (i, key) in keys.iter().enumerate().rev() {
            let value = if i % 2 == 0 { Vec::new() } else { vec![i as u8; i * 50] };
            batch.put(Table::Backrefs, key.clone(), value);
        }
        batch.put(Table::Backrefs, b"kl".to_vec(), b"after every k".to_vec());
        store.commit(batch).unwrap();

        for (i, key) in keys.iter().enumerate() {
            let want = if i % 2 == 0 { Vec::new() } else { vec![i as u8; i * 50] };
            assert_eq!(
                store.get(Table::Backrefs, key).unwrap(),
                Some(want),
                "key of {} bytes",
                key.len()
            );
        }
        let scanned: Vec<Vec<u8>> = store
            .scan(Table::Backrefs, b"", None, 100)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let mut want = keys.clone();
        want.push(b"kl".to_vec());
        assert_eq!(scanned, want);
        let after_long: Vec<Vec<u8>> = store
            .scan(Table::Backrefs, b"k", Some(&keys[5]), 100)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(after_long, vec![keys[6].clone(), b"kl".to_vec()]);

        // A put over a key replaces its value; a remove takes the entry.
        let mut batch = Batch::default();
        batch.put(Table::Backrefs, keys[4].clone(), b"new".to_vec());
        batch.remove(Table::Backrefs, keys[3].clone());
        store.commit(batch).unwrap();
        assert_eq!(store.get(Table::Backrefs, &keys[4]).unwrap(), Some(b"new".to_vec()));
        assert_eq!(store.get(Table::Backrefs, &keys[3]).unwrap(), None);
        assert_eq!(
            store.scan(Table::Backrefs, b"", None, 100).unwrap().len(),
            want.len() - 1
        );
    }

    #[test]
    fn the_footprint_counts_each_tables_entries_and_bytes() {
        let store = MemoryStore::default();
        let mut batch = Batch::default();
        for i in 0..10u8 {
            batch.put(Table::Resources, vec![i; 20], vec![i; 100]);
        }
        batch.put(Table::Meta, b"m".to_vec(), Vec::new());
        batch.put(Table::Outbox, b"gone".to_vec(), b"x".to_vec());
        batch.remove(Table::Outbox, b"gone".to_vec());
        store.commit(batch).unwrap();

        let footprint = store.footprint();
        let resources = footprint[&Table::Resources];
        assert_eq!(
            (resources.entries, resources.key_bytes, resources.value_bytes),
            (10, 200, 1_000)
        );
        assert_eq!(
            resources.allocated_bytes,
            10 * (1 + 20 + 100),
            "one allocation per entry: a byte of length, the key, the value"
        );
        assert_eq!(footprint[&Table::Meta].entries, 1);
        assert!(
            !footprint.contains_key(&Table::Outbox),
            "a table emptied again is absent"
        );
    }
}
