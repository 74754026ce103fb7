//! An in-memory engine: for simulation tests and for comparing engines.
//!
//! Each table is a run of pages in key order ([`Pages`]): a page is one
//! buffer of its entries, each the key's length and the value's (LEB128),
//! the key and the value, and the pages are in a `BTreeMap` under the
//! lowest key each may hold. Why: `cascade-bench` runs its nodes on this
//! engine in its own process, and with an ordered set of one allocation
//! per entry the set's half-full nodes and the allocations' size classes
//! weighed about 50 bytes per entry beside the data (a P1 of 1M ports
//! peaked at 689–707 MB for 432 MB of entries); a `BTreeMap` of two `Vec`s
//! per entry before that, about 120 (docs/BENCHMARKS.md, "P4: the memory
//! engine's footprint" and "P4 under 600 MB").

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;

use super::{Batch, Entry, ScanFloors, Store, StoreError, Table};

/// One run of pages per table, indexed by [`Table::index`].
type Tables = [Pages; Table::ALL.len()];

/// A page splits once its entries take more than this many bytes (an
/// entry larger than a page is a page of its own). Larger pages carry
/// less of the map per entry; smaller ones are faster to search, which is
/// a walk from the page's first entry.
const PAGE_BYTES: usize = 2048;

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
    /// The pages' buffers (their capacity) and the keys they are filed
    /// under (not the map's nodes).
    pub allocated_bytes: u64,
    pub pages: u64,
}

impl MemoryStore {
    /// What each table holds now (tables without entries are absent). It
    /// walks every entry under the lock: for profiles, not for a request.
    pub fn footprint(&self) -> BTreeMap<Table, TableFootprint> {
        let tables = self.lock();
        Table::ALL
            .into_iter()
            .filter(|table| tables[table.index()].entries > 0)
            .map(|table| {
                let mut f = TableFootprint::default();
                for (bound, page) in &tables[table.index()].pages {
                    f.pages += 1;
                    f.allocated_bytes += (bound.len() + page.capacity()) as u64;
                    for (key, value) in entries(page, 0) {
                        f.entries += 1;
                        f.key_bytes += key.len() as u64;
                        f.value_bytes += value.len() as u64;
                    }
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
        Ok(self.lock()[table.index()].get(key).map(<[u8]>::to_vec))
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        Ok(self.lock()[table.index()].scan(prefix, after, limit))
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.floors.before_commit(&batch);
        let mut tables = self.lock();
        for (table, key, value) in &batch.ops {
            let t = &mut tables[table.index()];
            match value {
                Some(v) => t.put(key, v),
                None => t.remove(key),
            }
        }
        drop(tables);
        // The batch's buffers are freed outside the lock.
        drop(batch);
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

/// One table: its entries in key order, in pages. Each page is filed
/// under the lowest key it may hold and holds the keys from there up to
/// the next page's; the first is filed under the empty key, so that every
/// key has a page, and is kept when it empties (any other page that
/// empties is dropped). A page's buffer is exactly as long as its entries
/// (`reserve_exact`: the allocator's size class is its only slack).
#[derive(Debug, Default)]
struct Pages {
    pages: BTreeMap<Box<[u8]>, Vec<u8>>,
    entries: u64,
}

impl Pages {
    fn get(&self, key: &[u8]) -> Option<&[u8]> {
        let (_, page) = self
            .pages
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()?;
        match find(page, key) {
            Found::At(at) => entries(page, at).next().map(|(_, value)| value),
            Found::Before(_) => None,
        }
    }

    fn scan(&self, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Vec<Entry> {
        let (start, past): (&[u8], bool) = match after {
            Some(a) if a >= prefix => (a, true),
            _ => (prefix, false),
        };
        let mut out = Vec::new();
        if limit == 0 {
            return out;
        }
        // The page that holds `start`, then every page after it.
        let from = match self
            .pages
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(start)))
            .next_back()
        {
            Some((bound, _)) => Bound::Included(&**bound),
            None => Bound::Unbounded,
        };
        for (_, page) in self.pages.range::<[u8], _>((from, Bound::Unbounded)) {
            let at = match find(page, start) {
                Found::At(at) if past => next_entry(page, at),
                Found::At(at) | Found::Before(at) => at,
            };
            for (key, value) in entries(page, at) {
                if !key.starts_with(prefix) {
                    return out;
                }
                out.push((key.to_vec(), value.to_vec()));
                if out.len() >= limit {
                    return out;
                }
            }
        }
        out
    }

    fn put(&mut self, key: &[u8], value: &[u8]) {
        let Some((_, page)) = self
            .pages
            .range_mut::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
        else {
            // An empty table: its first page, under the empty key.
            let mut page = Vec::new();
            write_entry(&mut page, 0..0, key, value);
            self.pages.insert(Box::default(), page);
            self.entries += 1;
            return;
        };
        let at = match find(page, key) {
            Found::At(at) => {
                let end = next_entry(page, at);
                write_entry(page, at..end, key, value);
                at
            }
            Found::Before(at) => {
                write_entry(page, at..at, key, value);
                self.entries += 1;
                at
            }
        };
        if page.len() > PAGE_BYTES {
            if let Some((bound, right)) = split(page, at) {
                self.pages.insert(bound, right);
            }
        }
    }

    fn remove(&mut self, key: &[u8]) {
        let Some((bound, page)) = self
            .pages
            .range_mut::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
        else {
            return;
        };
        let Found::At(at) = find(page, key) else {
            return;
        };
        let end = next_entry(page, at);
        page.drain(at..end);
        self.entries -= 1;
        if page.is_empty() && !bound.is_empty() {
            let bound = bound.to_vec();
            self.pages.remove(bound.as_slice());
        } else if page.capacity() >= 2 * page.len() + 64 {
            // What a cascade removes is given back as it goes, not only
            // once a whole page is empty.
            page.shrink_to_fit();
        }
    }
}

/// Where a key is in a page: at the entry that starts at this offset, or
/// not there, and it would go at this offset.
enum Found {
    At(usize),
    Before(usize),
}

fn find(page: &[u8], key: &[u8]) -> Found {
    let mut at = 0;
    while at < page.len() {
        let (k, _, next) = entry_at(page, at);
        match k.cmp(key) {
            std::cmp::Ordering::Less => at = next,
            std::cmp::Ordering::Equal => return Found::At(at),
            std::cmp::Ordering::Greater => return Found::Before(at),
        }
    }
    Found::Before(at)
}

/// The entries of a page from the one at `at` on.
fn entries(page: &[u8], mut at: usize) -> impl Iterator<Item = (&[u8], &[u8])> {
    std::iter::from_fn(move || {
        if at >= page.len() {
            return None;
        }
        let (key, value, next) = entry_at(page, at);
        at = next;
        Some((key, value))
    })
}

/// Where the entry after the one at `at` starts.
fn next_entry(page: &[u8], at: usize) -> usize {
    entry_at(page, at).2
}

/// The entry at `at`: its key, its value and where the next one starts.
/// The page is only ever written by [`write_entry`]; should its bytes not
/// hold an entry, the rest of the page reads as one empty one.
fn entry_at(page: &[u8], at: usize) -> (&[u8], &[u8], usize) {
    let (key_len, at) = leb128(page, at);
    let (value_len, at) = leb128(page, at);
    let key_end = at.saturating_add(key_len).min(page.len());
    let end = key_end.saturating_add(value_len).min(page.len());
    (
        page.get(at..key_end).unwrap_or_default(),
        page.get(key_end..end).unwrap_or_default(),
        end,
    )
}

/// A length at `at`, and where the bytes after it start.
fn leb128(bytes: &[u8], mut at: usize) -> (usize, usize) {
    let mut n = 0usize;
    let mut shift = 0u32;
    while let Some(&byte) = bytes.get(at) {
        at += 1;
        n |= usize::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
        if byte < 0x80 {
            break;
        }
        shift += 7;
    }
    (n, at)
}

/// Writes `n` as LEB128 into `out`, returning how many bytes it took.
fn put_leb128(out: &mut [u8; 10], mut n: usize) -> usize {
    let mut i = 0;
    while n >= 0x80 {
        out[i] = (n as u8) | 0x80;
        n >>= 7;
        i += 1;
    }
    out[i] = n as u8;
    i + 1
}

/// Replaces the bytes `range` of `page` with the entry (`key`, `value`),
/// moving what follows once.
fn write_entry(page: &mut Vec<u8>, range: std::ops::Range<usize>, key: &[u8], value: &[u8]) {
    let mut key_len = [0u8; 10];
    let mut value_len = [0u8; 10];
    let k = put_leb128(&mut key_len, key.len());
    let v = put_leb128(&mut value_len, value.len());
    let parts: [&[u8]; 4] = [&key_len[..k], &value_len[..v], key, value];
    let new_len: usize = parts.iter().map(|p| p.len()).sum();
    let old_len = page.len();
    let (start, end) = (range.start, range.end);
    if new_len > end - start {
        let grow = new_len - (end - start);
        page.reserve_exact(grow);
        page.resize(old_len + grow, 0);
        page.copy_within(end..old_len, end + grow);
    } else if new_len < end - start {
        page.drain(start + new_len..end);
    }
    let mut at = start;
    for part in parts {
        page[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
}

/// Splits a page grown past [`PAGE_BYTES`] by the entry written at `at`:
/// the right part and the key it is filed under. When that entry ends the
/// page (keys arriving in order: revisions, UUID v7 ids), it starts the
/// right part alone and the left stays full; else the page splits at its
/// middle entry. None for a page of one entry.
fn split(page: &mut Vec<u8>, at: usize) -> Option<(Box<[u8]>, Vec<u8>)> {
    let at_end = next_entry(page, at) == page.len();
    let cut = if at_end && at > 0 {
        at
    } else {
        let half = page.len() / 2;
        let mut cut = 0;
        loop {
            let next = next_entry(page, cut);
            if next >= page.len() || next > half {
                // The entry that crosses the middle goes to whichever side
                // leaves the two closer to even (and never leaves one empty).
                if cut == 0 || (next < page.len() && next - half < half - cut) {
                    cut = next;
                }
                break;
            }
            cut = next;
        }
        cut
    };
    if cut == 0 || cut >= page.len() {
        return None;
    }
    let right = page[cut..].to_vec();
    // The left part too in an allocation of its own size: a buffer cut
    // and shrunk in place keeps the allocator's block it grew into (a
    // page of 2,080 bytes sits in mimalloc's 2,560-byte class, and its
    // left part of 1,950 or 1,040 stayed there).
    *page = page[..cut].to_vec();
    let (bound, _, _) = entry_at(&right, 0);
    Some((bound.into(), right))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
            (
                resources.entries,
                resources.key_bytes,
                resources.value_bytes,
                resources.pages
            ),
            (10, 200, 1_000, 1)
        );
        assert_eq!(
            resources.allocated_bytes,
            10 * (2 + 20 + 100),
            "one page, exactly as long as its entries: two bytes of lengths, the key, the value"
        );
        assert_eq!(footprint[&Table::Meta].entries, 1);
        assert!(
            !footprint.contains_key(&Table::Outbox),
            "a table emptied again is absent"
        );
    }

    /// Revisions, UUID v7 ids and a uid index arrive in key order: each
    /// page is left full when the next entry starts a page of its own, so
    /// the pages are about as many as the bytes need (split at their
    /// middle, they would be twice as many, each half empty).
    #[test]
    fn keys_arriving_in_order_fill_their_pages() {
        let store = MemoryStore::default();
        for chunk in 0..20u64 {
            let mut batch = Batch::default();
            for i in chunk * 500..(chunk + 1) * 500 {
                batch.put(Table::Outbox, i.to_be_bytes().to_vec(), vec![7; 120]);
            }
            store.commit(batch).unwrap();
        }
        let outbox = store.footprint()[&Table::Outbox];
        let bytes = outbox.entries * (2 + 8 + 120);
        assert_eq!(outbox.entries, 10_000);
        assert!(
            outbox.pages <= bytes / (PAGE_BYTES as u64 - 130) + 1,
            "{} pages for {bytes} bytes",
            outbox.pages
        );
        assert!(
            outbox.allocated_bytes <= bytes + outbox.pages * 8,
            "{outbox:?}: the pages hold their entries and their keys, no more"
        );
    }

    /// Removing most of a table gives its memory back as it goes, not
    /// only once every entry of a page is gone.
    #[test]
    fn a_table_mostly_removed_keeps_little_of_its_pages() {
        let store = MemoryStore::default();
        let mut batch = Batch::default();
        for i in 0..10_000u32 {
            batch.put(Table::Backrefs, i.to_be_bytes().to_vec(), vec![1; 100]);
        }
        store.commit(batch).unwrap();
        let full = store.footprint()[&Table::Backrefs].allocated_bytes;
        let mut batch = Batch::default();
        for i in (0..10_000u32).filter(|i| i % 10 != 0) {
            batch.remove(Table::Backrefs, i.to_be_bytes().to_vec());
        }
        store.commit(batch).unwrap();
        let left = store.footprint()[&Table::Backrefs];
        assert_eq!(left.entries, 1_000);
        assert!(
            left.allocated_bytes * 4 < full,
            "{} of {full} bytes kept for a tenth of the entries",
            left.allocated_bytes
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(Vec<u8>, Vec<u8>),
        Remove(Vec<u8>),
        Scan(Vec<u8>, Option<Vec<u8>>, usize),
        Get(Vec<u8>),
    }

    /// Short keys over a small alphabet (so puts replace, removes hit and
    /// prefixes share entries), values up to two pages long.
    fn op() -> impl Strategy<Value = Op> {
        let key = || proptest::collection::vec(0u8..4, 0..6);
        prop_oneof![
            4 => (key(), proptest::collection::vec(any::<u8>(), 0..300)).prop_map(|(k, v)| Op::Put(k, v)),
            1 => (key(), 0usize..5000).prop_map(|(k, n)| Op::Put(k, vec![9; n])),
            3 => key().prop_map(Op::Remove),
            2 => (key(), proptest::option::of(key()), 0usize..50).prop_map(|(p, a, l)| Op::Scan(p, a, l)),
            2 => key().prop_map(Op::Get),
        ]
    }

    proptest! {
        /// Puts, removes, gets and scans in batches of up to 40 answer as
        /// an ordered map does, through every split and emptied page.
        #[test]
        fn the_pages_answer_as_an_ordered_map_does(batches in proptest::collection::vec(proptest::collection::vec(op(), 1..40), 1..30)) {
            let store = MemoryStore::default();
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            for ops in batches {
                let mut batch = Batch::default();
                for op in &ops {
                    match op {
                        Op::Put(k, v) => {
                            batch.put(Table::Resources, k.clone(), v.clone());
                            model.insert(k.clone(), v.clone());
                        }
                        Op::Remove(k) => {
                            batch.remove(Table::Resources, k.clone());
                            model.remove(k);
                        }
                        _ => {}
                    }
                }
                store.commit(batch).unwrap();
                for op in &ops {
                    match op {
                        Op::Get(k) => prop_assert_eq!(store.get(Table::Resources, k).unwrap(), model.get(k).cloned()),
                        Op::Scan(prefix, after, limit) => {
                            let start = match after {
                                Some(a) if a >= prefix => Bound::Excluded(a.clone()),
                                _ => Bound::Included(prefix.clone()),
                            };
                            let want: Vec<Entry> = model
                                .range((start, Bound::Unbounded))
                                .take_while(|(k, _)| k.starts_with(prefix))
                                .take(*limit)
                                .map(|(k, v)| (k.clone(), v.clone()))
                                .collect();
                            prop_assert_eq!(store.scan(Table::Resources, prefix, after.as_deref(), *limit).unwrap(), want);
                        }
                        _ => {}
                    }
                }
                let all = store.scan(Table::Resources, b"", None, usize::MAX).unwrap();
                prop_assert_eq!(all.len(), model.len());
                let footprint = store.footprint();
                prop_assert_eq!(footprint.get(&Table::Resources).map_or(0, |f| f.entries), model.len() as u64);
            }
        }
    }
}
