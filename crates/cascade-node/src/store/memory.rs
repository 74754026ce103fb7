//! An in-memory engine: for simulation tests and for comparing engines.
//!
//! Each table is a run of pages in key order ([`Pages`]): a page is one
//! buffer of its entries' offsets (two bytes each, searched by halves)
//! and its entries, each the key's length (LEB128), the key and the
//! value, and the pages are in a `BTreeMap` under the lowest key each may
//! hold. Why: `cascade-bench` runs its nodes on this
//! engine in its own process, and with an ordered set of one allocation
//! per entry the set's half-full nodes and the allocations' size classes
//! weighed about 50 bytes per entry beside the data (a P1 of 1M ports
//! peaked at 689–707 MB for 432 MB of entries); a `BTreeMap` of two `Vec`s
//! per entry before that, about 120 (docs/BENCHMARKS.md, "P4: the memory
//! engine's footprint" and "P4 under 600 MB").
//!
//! Size: about 1,300 lines, a third of them its tests: the page's layout,
//! the search over its offsets, its split, the pages remembered per table
//! and the writes a commit holds back hold one invariant together (every
//! offset of a page of several entries under `PAGE_BYTES`, a remembered
//! page's bound and last key, a held run's page unchanged until it is
//! written), and the tests drive them through the `Store` against a
//! `BTreeMap`.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;

use super::{Batch, Entry, ScanFloors, Store, StoreError, Table};

/// One run of pages per table, indexed by [`Table::index`].
type Tables = [Pages; Table::ALL.len()];

/// A page splits once its offsets and entries take more than this many
/// bytes (an entry larger than a page is a page of its own). Larger pages
/// carry less of the map per entry; smaller ones move fewer bytes when an
/// entry is written into them. It keeps every offset in a u16.
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
    /// under (not the index's nodes, nor the slots' `Vec`s).
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
                let pages = &tables[table.index()];
                for (bound, &slot) in &pages.index {
                    let page = pages.slots.get(slot as usize).map_or(&[][..], Vec::as_slice);
                    f.pages += 1;
                    let capacity = pages.slots.get(slot as usize).map_or(0, Vec::capacity);
                    f.allocated_bytes += (bound.len() + capacity) as u64;
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

    fn get_in(&self, table: Table, key: &[u8], read: &mut dyn FnMut(&[u8])) -> Result<(), StoreError> {
        if let Some(value) = self.lock()[table.index()].get(key) {
            read(value);
        }
        Ok(())
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::new();
        self.lock()[table.index()].scan(prefix, after, limit, &mut |key, value| {
            out.push((key.to_vec(), value.to_vec()));
        });
        Ok(out)
    }

    fn scan_in(
        &self,
        table: Table,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        read: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), StoreError> {
        self.lock()[table.index()].scan(prefix, after, limit, read);
        Ok(())
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.floors.before_commit(&batch);
        let mut tables = self.lock();
        let mut held: [Held<'_>; Table::ALL.len()] = Default::default();
        for (table, key, value) in &batch.ops {
            let (t, held) = (&mut tables[table.index()], &mut held[table.index()]);
            match value {
                Some(v) => t.put_held(held, key, v),
                None => t.remove_held(held, key),
            }
        }
        for (t, held) in tables.iter_mut().zip(held) {
            t.release(held);
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
/// empties is dropped). A page's buffer is exactly as long as its offsets
/// and entries (`reserve_exact`: the allocator's size class is its only
/// slack).
///
/// The pages sit in slots, and the index maps each page's key to its
/// slot, so that the last pages a lookup landed on ([`Recent`]) are
/// reached again without a search of the index: a cascade reads, removes
/// and appends keys in order, table by table, and the index's search (a
/// node's keys compared one by one, each behind a pointer) was about half
/// of this engine's CPU in P1 flat (docs/BENCHMARKS.md, "The memory
/// engine's pages searched").
#[derive(Debug, Default)]
struct Pages {
    index: BTreeMap<Box<[u8]>, u32>,
    /// The pages; a slot whose page was dropped is empty and in `free`.
    slots: Vec<Vec<u8>>,
    free: Vec<u32>,
    /// The pages the last lookups landed on, the latest first; forgotten
    /// whenever the index changes (a page split off or dropped).
    recent: [Option<Recent>; RECENT],
    entries: u64,
}

/// How many pages of a table [`Pages::locate`] remembers: a step reads
/// and writes one run of keys per table, and now and then a key elsewhere
/// (the operation's target, a create beside the cascade).
const RECENT: usize = 2;

/// A page a lookup landed on: a key from its bound up to its last entry
/// is in it, and, if it is the table's last page, any key from its bound.
#[derive(Debug)]
struct Recent {
    bound: Vec<u8>,
    slot: u32,
    last: bool,
}

/// Writes of one table a commit holds back to apply together: a cascade
/// removes runs of keys in order (a page's entries one after the other:
/// its leaves by name and by uid, their back-references) and appends keys
/// past the table's end (outcomes, audit ids, revisions). Applied one by
/// one, each removal moved the page's tail and rewrote its offsets, and
/// each append moved the whole page and reallocated it; held, a page is
/// rewritten once per run (docs/BENCHMARKS.md, "The memory engine's commit
/// and the reads' copies"). Any other write to the table applies what is
/// held first, so the batch's order (the last write of a key wins) holds.
#[derive(Debug, Default)]
enum Held<'a> {
    #[default]
    Nothing,
    /// Entries of the page in `slot` to remove, by their index in the
    /// page as it is (which nothing else changes while they are held), and
    /// the index after the last one, where the next key of a run is.
    Removals {
        slot: usize,
        doomed: Vec<usize>,
        next: usize,
    },
    /// Entries past the table's last key, in key order.
    Appends(Vec<(&'a [u8], &'a [u8])>),
}

impl Pages {
    /// The slot of the page that holds `key` (or would), None for a table
    /// without pages.
    fn locate(&mut self, key: &[u8]) -> Option<usize> {
        for r in 0..RECENT {
            let Some(seen) = &self.recent[r] else { continue };
            let Some(page) = self.slots.get(seen.slot as usize) else {
                continue;
            };
            let n = count(page);
            if key >= seen.bound.as_slice() && (seen.last || (n > 0 && key <= key_at(page, n - 1))) {
                let slot = seen.slot as usize;
                self.recent[..=r].rotate_right(1);
                return Some(slot);
            }
        }
        let (bound, &slot) = self
            .index
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()?;
        let last = self.index.last_key_value().map(|(_, &s)| s) == Some(slot);
        // The oldest is forgotten, its buffer reused.
        let mut seen = self.recent[RECENT - 1].take().unwrap_or(Recent {
            bound: Vec::new(),
            slot,
            last,
        });
        seen.bound.clear();
        seen.bound.extend_from_slice(bound);
        seen.slot = slot;
        seen.last = last;
        self.recent.rotate_right(1);
        self.recent[0] = Some(seen);
        Some(slot as usize)
    }

    /// The bound of the page [`Self::locate`] returned last.
    fn located_bound(&self) -> &[u8] {
        self.recent[0].as_ref().map_or(&[], |seen| seen.bound.as_slice())
    }

    /// Files `page` under `bound`, in a free slot if there is one.
    fn add_page(&mut self, bound: Box<[u8]>, page: Vec<u8>) {
        let slot = match self.free.pop() {
            Some(slot) => {
                if let Some(empty) = self.slots.get_mut(slot as usize) {
                    *empty = page;
                }
                slot
            }
            None => {
                self.slots.push(page);
                // A table of more than 4 billion pages (8 TB) is not
                // held in memory.
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.index.insert(bound, slot);
        self.recent = Default::default();
    }

    /// The pages in key order from the one filed under `from`.
    fn pages_from<'a>(&'a self, from: &[u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.index
            .range::<[u8], _>((Bound::Included(from), Bound::Unbounded))
            .map(|(_, &slot)| self.slots.get(slot as usize).map_or(&[][..], Vec::as_slice))
    }

    fn get(&mut self, key: &[u8]) -> Option<&[u8]> {
        let slot = self.locate(key)?;
        let page = self.slots.get(slot)?;
        let i = search(page, key).ok()?;
        Some(entry(page, i).1)
    }

    /// Hands each entry of the scan to `read`, in key order.
    fn scan(&mut self, prefix: &[u8], after: Option<&[u8]>, limit: usize, read: &mut dyn FnMut(&[u8], &[u8])) {
        let (start, past): (&[u8], bool) = match after {
            Some(a) if a >= prefix => (a, true),
            _ => (prefix, false),
        };
        if limit == 0 || self.locate(start).is_none() {
            return;
        }
        let mut read_so_far = 0;
        // The page that holds `start`, then every page after it; only the
        // first is searched (the others' keys are all past `start`).
        let mut first = true;
        for page in self.pages_from(self.located_bound()) {
            let at = if std::mem::take(&mut first) {
                match search(page, start) {
                    Ok(i) if past => i + 1,
                    Ok(i) | Err(i) => i,
                }
            } else {
                0
            };
            for (key, value) in entries(page, at) {
                if !key.starts_with(prefix) {
                    return;
                }
                read(key, value);
                read_so_far += 1;
                if read_so_far >= limit {
                    return;
                }
            }
        }
    }

    /// A put of a commit: held when it appends past the table's last key
    /// (or the one held before it), else written at once.
    fn put_held<'a>(&mut self, held: &mut Held<'a>, key: &'a [u8], value: &'a [u8]) {
        if let Held::Appends(run) = held {
            if run.last().is_some_and(|&(last, _)| key > last) {
                run.push((key, value));
                return;
            }
        }
        self.release(std::mem::take(held));
        let slot = self.locate(key);
        let past_the_end = slot.and_then(|slot| self.slots.get(slot)).is_some_and(|page| {
            let n = count(page);
            let last = self.recent[0].as_ref().is_some_and(|seen| seen.last);
            last && (n == 0 || key > key_at(page, n - 1))
        });
        if past_the_end {
            *held = Held::Appends(vec![(key, value)]);
        } else {
            self.put(slot, key, value);
        }
    }

    /// A removal of a commit: held with the removals before it when its
    /// key is in the same page, else (after those are applied) the start
    /// of a run of its own.
    fn remove_held(&mut self, held: &mut Held<'_>, key: &[u8]) {
        if let Held::Removals { slot, doomed, next } = held {
            if let Some(page) = self.slots.get(*slot) {
                let n = count(page);
                // A run's next key is usually the next entry.
                if *next < n && key_at(page, *next) == key {
                    doomed.push(*next);
                    *next += 1;
                    return;
                }
                // A key between the page's first and last entries is in
                // this page or nowhere.
                if n > 0 && key >= key_at(page, 0) && key <= key_at(page, n - 1) {
                    if let Ok(i) = search(page, key) {
                        doomed.push(i);
                        *next = i + 1;
                    }
                    return;
                }
            }
        }
        self.release(std::mem::take(held));
        let Some(slot) = self.locate(key) else {
            return;
        };
        let Some(page) = self.slots.get(slot) else {
            return;
        };
        if let Ok(i) = search(page, key) {
            *held = Held::Removals {
                slot,
                doomed: vec![i],
                next: i + 1,
            };
        }
    }

    /// Applies what `held` holds.
    fn release(&mut self, held: Held<'_>) {
        match held {
            Held::Nothing => {}
            Held::Removals { slot, mut doomed, .. } => {
                doomed.sort_unstable();
                doomed.dedup();
                self.remove_entries(slot, &doomed);
            }
            Held::Appends(run) => self.append(&run),
        }
    }

    /// Removes the entries at `doomed` (sorted, distinct) of the page in
    /// `slot`, dropping the page if it empties (but the first).
    fn remove_entries(&mut self, slot: usize, doomed: &[usize]) {
        let Some(page) = self.slots.get_mut(slot) else {
            return;
        };
        let n = count(page);
        let doomed = &doomed[..doomed.partition_point(|&i| i < n)];
        if doomed.is_empty() {
            return;
        }
        self.entries -= doomed.len() as u64;
        if doomed.len() < n {
            remove_many(page, doomed);
            if page.capacity() >= 2 * page.len() + 64 {
                // What a cascade removes is given back as it goes, not
                // only once a whole page is empty.
                page.shrink_to_fit();
            }
            return;
        }
        // The page empties: the index files it under the bound at or
        // below its first key.
        let first = key_at(page, 0).to_vec();
        *page = Vec::new();
        let bound = self
            .index
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(first.as_slice())))
            .next_back()
            .map(|(bound, _)| bound.clone());
        if let Some(bound) = bound.filter(|bound| !bound.is_empty()) {
            self.index.remove(&bound);
            self.free.extend(u32::try_from(slot).ok());
            self.recent = Default::default();
        }
    }

    /// Appends `run` (keys in order, past the table's last key): the last
    /// page takes what fits, the rest goes into new pages, each filled
    /// before the next starts (as entries appended one by one fill them).
    fn append(&mut self, run: &[(&[u8], &[u8])]) {
        if run.is_empty() {
            return;
        }
        if self.index.is_empty() {
            self.add_page(Box::default(), Vec::new());
        }
        let Some(page) = self
            .index
            .last_key_value()
            .map(|(_, &slot)| slot as usize)
            .and_then(|slot| self.slots.get_mut(slot))
        else {
            return;
        };
        let fits = fill(count(page), page.len(), run);
        extend(page, &run[..fits]);
        self.entries += run.len() as u64;
        let mut rest = &run[fits..];
        while let Some(&(first, _)) = rest.first() {
            let take = fill(0, 0, rest);
            self.add_page(first.into(), page_of(&rest[..take]));
            rest = &rest[take..];
        }
    }

    /// Writes (`key`, `value`) into the page in `slot` (None: the table
    /// has no page yet), splitting it if it grows past a page.
    fn put(&mut self, slot: Option<usize>, key: &[u8], value: &[u8]) {
        let Some(page) = slot.and_then(|slot| self.slots.get_mut(slot)) else {
            // An empty table: its first page, under the empty key.
            self.add_page(Box::default(), page_of(&[(key, value)]));
            self.entries += 1;
            return;
        };
        let n = count(page);
        let (i, replaces, len) = match search(page, key) {
            Ok(i) => {
                let old = entry(page, i).1.len();
                if old == value.len() {
                    // A value of the same length (a counter, a state
                    // flipped) is written over the old one, nothing moved.
                    overwrite_value(page, i, value);
                    return;
                }
                (i, true, (page.len() + value.len()).saturating_sub(old))
            }
            Err(i) => {
                self.entries += 1;
                (i, false, page.len() + SLOT + encoded_len(key, value))
            }
        };
        // Every offset stays under `PAGE_BYTES` (so in a u16) unless the
        // page is one entry, whose only offset is the first.
        let after = if replaces { n } else { n + 1 };
        if len <= PAGE_BYTES || after == 1 {
            if replaces {
                remove_at(page, i);
            }
            insert_at(page, i, key, value);
            return;
        }
        let mut pieces = split(page, i, replaces, key, value).into_iter();
        if let Some(left) = pieces.next() {
            *page = left;
        }
        for right in pieces {
            let bound: Box<[u8]> = entry(&right, 0).0.into();
            self.add_page(bound, right);
        }
    }
}

// A page is one buffer: the offsets of its entries (a u16 each, little
// endian), then the entries in key order, each the key's length (LEB128),
// the key and the value, which runs to the next entry (or the page's end).
// The first offset is where the entries start, so it is also twice their
// count; an empty page is an empty buffer. The offsets are what a lookup
// searches by halves, and they give a page's last key in one read, which
// `Pages::locate` asks on every lookup; they take the place of each
// value's length. (The walk from the first entry that they replace was
// 6 % of P1 flat's cascade, the search by halves about as much:
// docs/BENCHMARKS.md, "The memory engine's pages searched".)

/// The bytes of an entry's offset.
const SLOT: usize = 2;

/// How many entries a page holds.
fn count(page: &[u8]) -> usize {
    offset(page, 0) / SLOT
}

/// Where entry `i` starts (0 past the offsets, which no caller asks for).
fn offset(page: &[u8], i: usize) -> usize {
    match page.get(SLOT * i..SLOT * i + SLOT) {
        Some(&[lo, hi]) => usize::from(u16::from_le_bytes([lo, hi])),
        _ => 0,
    }
}

fn set_offset(page: &mut [u8], i: usize, at: usize) {
    // Callers keep every offset of a page of several entries under
    // `PAGE_BYTES`, and a page of one entry has its first offset only.
    let at = u16::try_from(at).unwrap_or(u16::MAX);
    if let Some(slot) = page.get_mut(SLOT * i..SLOT * i + SLOT) {
        slot.copy_from_slice(&at.to_le_bytes());
    }
}

/// The bytes of entry `i` of a page of `n` entries.
fn entry_bytes(page: &[u8], n: usize, i: usize) -> std::ops::Range<usize> {
    let start = offset(page, i);
    let end = if i + 1 < n { offset(page, i + 1) } else { page.len() };
    start..end.max(start)
}

/// Entry `i`'s key and value. The page is only ever written by this
/// module; should its bytes not hold an entry, it reads as an empty one.
fn entry(page: &[u8], i: usize) -> (&[u8], &[u8]) {
    let bytes = page.get(entry_bytes(page, count(page), i)).unwrap_or_default();
    let (key_len, at) = leb128(bytes, 0);
    let key_end = at.saturating_add(key_len).min(bytes.len());
    (
        bytes.get(at..key_end).unwrap_or_default(),
        bytes.get(key_end..).unwrap_or_default(),
    )
}

/// Entry `i`'s key, for the search.
fn key_at(page: &[u8], i: usize) -> &[u8] {
    let start = offset(page, i);
    let (key_len, at) = leb128(page, start);
    page.get(at..at.saturating_add(key_len)).unwrap_or_default()
}

/// Where `key` is in a page (its entry's index), or where it would go.
fn search(page: &[u8], key: &[u8]) -> Result<usize, usize> {
    let (mut low, mut high) = (0, count(page));
    while low < high {
        let mid = low + (high - low) / 2;
        match key_at(page, mid).cmp(key) {
            std::cmp::Ordering::Less => low = mid + 1,
            std::cmp::Ordering::Equal => return Ok(mid),
            std::cmp::Ordering::Greater => high = mid,
        }
    }
    Err(low)
}

/// The entries of a page from its `at`-th on.
fn entries(page: &[u8], at: usize) -> impl Iterator<Item = (&[u8], &[u8])> {
    (at..count(page)).map(move |i| entry(page, i))
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

/// The bytes of an entry, its offset aside.
fn encoded_len(key: &[u8], value: &[u8]) -> usize {
    put_leb128(&mut [0; 10], key.len()) + key.len() + value.len()
}

/// Writes the entry (`key`, `value`) at `at`, where its bytes are.
fn write_entry(page: &mut [u8], at: usize, key: &[u8], value: &[u8]) {
    let mut key_len = [0u8; 10];
    let k = put_leb128(&mut key_len, key.len());
    let mut at = at;
    for part in [&key_len[..k], key, value] {
        if let Some(to) = page.get_mut(at..at + part.len()) {
            to.copy_from_slice(part);
        }
        at += part.len();
    }
}

/// Writes `value` over entry `i`'s, of the same length.
fn overwrite_value(page: &mut [u8], i: usize, value: &[u8]) {
    let end = entry_bytes(page, count(page), i).end;
    if let Some(to) = end.checked_sub(value.len()).and_then(|start| page.get_mut(start..end)) {
        to.copy_from_slice(value);
    }
}

/// Inserts the entry (`key`, `value`) as entry `i`: the page grows by
/// exactly its bytes and its offset, and what follows moves once.
fn insert_at(page: &mut Vec<u8>, i: usize, key: &[u8], value: &[u8]) {
    let n = count(page);
    let i = i.min(n);
    let len = encoded_len(key, value);
    let old_len = page.len();
    // Where the new entry goes, before anything moves.
    let at = if i < n { offset(page, i) } else { old_len.max(SLOT * n) };
    page.reserve_exact(SLOT + len);
    page.resize(old_len + SLOT + len, 0);
    // The entries from `at` on move past the new one and its offset, the
    // ones before it past the new offset, and the offsets from `i` on by
    // one slot, each range to where nothing else is written.
    page.copy_within(at..old_len, at + SLOT + len);
    page.copy_within(SLOT * n..at, SLOT * n + SLOT);
    page.copy_within(SLOT * i..SLOT * n, SLOT * i + SLOT);
    for j in 0..=n {
        let moved = match j.cmp(&i) {
            std::cmp::Ordering::Less => offset(page, j) + SLOT,
            std::cmp::Ordering::Equal => at + SLOT,
            std::cmp::Ordering::Greater => offset(page, j) + SLOT + len,
        };
        set_offset(page, j, moved);
    }
    write_entry(page, at + SLOT, key, value);
}

/// Removes entry `i`: its bytes and its offset.
fn remove_at(page: &mut Vec<u8>, i: usize) {
    let n = count(page);
    if i >= n {
        return;
    }
    let std::ops::Range { start, end } = entry_bytes(page, n, i);
    let len = end - start;
    let old_len = page.len();
    // The offsets after `i` move one slot back, then the entries before
    // `i` onto the last slot, then the ones after it onto entry `i`.
    page.copy_within(SLOT * (i + 1)..SLOT * n, SLOT * i);
    page.copy_within(SLOT * n..start, SLOT * n - SLOT);
    page.copy_within(end..old_len, start - SLOT);
    page.truncate(old_len - SLOT - len);
    for j in 0..n - 1 {
        let moved = offset(page, j) - if j < i { SLOT } else { SLOT + len };
        set_offset(page, j, moved);
    }
}

/// Removes the entries at `doomed` (sorted, distinct, fewer than the
/// page's) in one pass: each run of entries kept between them moves once,
/// and each kept offset is written once.
fn remove_many(page: &mut Vec<u8>, doomed: &[usize]) {
    let n = count(page);
    let old_head = SLOT * n;
    // The old offsets, read while the new ones and the entries are
    // written over them. A page of several entries has its offsets within
    // a page; else, one at a time.
    let mut old = [0u8; PAGE_BYTES];
    let (Some(saved), Some(head)) = (old.get_mut(..old_head), page.get(..old_head)) else {
        for &i in doomed.iter().rev() {
            remove_at(page, i);
        }
        return;
    };
    saved.copy_from_slice(head);
    let end = page.len();
    let old_offset = |i: usize| if i < n { offset(&old, i) } else { end };
    let mut to = SLOT * (n - doomed.len());
    let (mut kept, mut i) = (0, 0);
    for &gone in doomed.iter().chain(std::iter::once(&n)) {
        // Entries `i..gone` are kept: their bytes move to `to`, ahead of
        // anything not yet moved, and past every offset written.
        let (from, until) = (old_offset(i), old_offset(gone));
        for j in i..gone {
            set_offset(page, kept, old_offset(j) - from + to);
            kept += 1;
        }
        page.copy_within(from..until, to);
        to += until - from;
        i = gone + 1;
    }
    page.truncate(to);
}

/// How many entries of `run` a page of `n` entries and `len` bytes takes
/// before the next would take it past [`PAGE_BYTES`] (an empty page takes
/// at least one).
fn fill(n: usize, mut len: usize, run: &[(&[u8], &[u8])]) -> usize {
    let mut taken = 0;
    for (key, value) in run {
        let size = SLOT + encoded_len(key, value);
        if n + taken > 0 && len + size > PAGE_BYTES {
            break;
        }
        len += size;
        taken += 1;
    }
    taken
}

/// Appends `run` (keys past the page's last) to the page, growing its
/// buffer once to exactly its new size.
fn extend(page: &mut Vec<u8>, run: &[(&[u8], &[u8])]) {
    if run.is_empty() {
        return;
    }
    let n = count(page);
    let old_len = page.len().max(SLOT * n);
    let added: usize = run.iter().map(|(k, v)| encoded_len(k, v)).sum();
    let shift = SLOT * run.len();
    page.reserve_exact(shift + added);
    page.resize(old_len + shift + added, 0);
    // The entries move past the new offsets, and so do the old offsets'
    // targets.
    page.copy_within(SLOT * n..old_len, SLOT * n + shift);
    for j in 0..n {
        let moved = offset(page, j) + shift;
        set_offset(page, j, moved);
    }
    let mut at = old_len + shift;
    for (j, (key, value)) in run.iter().enumerate() {
        set_offset(page, n + j, at);
        write_entry(page, at, key, value);
        at += encoded_len(key, value);
    }
}

/// A page of these entries, in key order, in a buffer of its size.
fn page_of(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    let head = SLOT * entries.len();
    let size = head + entries.iter().map(|(k, v)| encoded_len(k, v)).sum::<usize>();
    let mut page = vec![0u8; size];
    let mut at = head;
    for (i, (key, value)) in entries.iter().enumerate() {
        set_offset(&mut page, i, at);
        write_entry(&mut page, at, key, value);
        at += encoded_len(key, value);
    }
    page
}

/// A page that writing (`key`, `value`) as its entry `i` (over the one
/// there if `replaces`) would grow past [`PAGE_BYTES`], as the pages it
/// splits into, in key order: each under `PAGE_BYTES` or a single entry.
/// When the entry ends the page (keys arriving in order: revisions, UUID
/// v7 ids), it starts a page alone and the left one stays full; else the
/// page splits at its middle entry (again, should a part still be over).
/// Each part is an allocation of its own size: a buffer cut and shrunk in
/// place keeps the allocator's block it grew into (a page of 2,080 bytes
/// sits in mimalloc's 2,560-byte class, and its left part of 1,950 or
/// 1,040 stayed there).
fn split(page: &[u8], i: usize, replaces: bool, key: &[u8], value: &[u8]) -> Vec<Vec<u8>> {
    let mut all: Vec<(&[u8], &[u8])> = entries(page, 0).collect();
    if replaces && i < all.len() {
        all[i] = (key, value);
    } else {
        all.insert(i.min(all.len()), (key, value));
    }
    let sizes: Vec<usize> = all.iter().map(|(k, v)| SLOT + encoded_len(k, v)).collect();
    let mut parts = Vec::new();
    if i + 1 == all.len() && i > 0 {
        cut(&sizes, 0..i, &mut parts);
        parts.push(i..i + 1);
    } else {
        cut(&sizes, 0..all.len(), &mut parts);
    }
    parts.into_iter().map(|part| page_of(&all[part])).collect()
}

/// The parts of `range` of entries of these sizes, cut at their middle
/// until each is at most [`PAGE_BYTES`] or a single entry.
fn cut(sizes: &[usize], range: std::ops::Range<usize>, parts: &mut Vec<std::ops::Range<usize>>) {
    let part = &sizes[range.clone()];
    let total: usize = part.iter().sum();
    if total <= PAGE_BYTES || part.len() <= 1 {
        parts.push(range);
        return;
    }
    let half = total / 2;
    // The entry that crosses the middle goes to whichever side leaves the
    // two closer to even, and never leaves one empty.
    let (mut at, mut before) = (0, 0);
    while at < part.len() && before + part[at] <= half {
        before += part[at];
        at += 1;
    }
    if at < part.len() && (at == 0 || before + part[at] - half < half - before) {
        at += 1;
    }
    let at = range.start + at.clamp(1, part.len() - 1);
    cut(sizes, range.start..at, parts);
    cut(sizes, at..range.end, parts);
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
            10 * (2 + 1 + 20 + 100),
            "one page, exactly as long as its entries: an offset, the key's length, the key, the value"
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
        let bytes = outbox.entries * (2 + 1 + 8 + 120);
        assert_eq!(outbox.entries, 10_000);
        assert!(
            outbox.pages <= bytes / (PAGE_BYTES as u64 - 131) + 1,
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

    /// Entries longer than a page's u16 offsets reach, among small ones
    /// before, between and after them, and written over both ways (large
    /// over small, small over large): every entry reads back as written,
    /// in key order.
    #[test]
    fn entries_past_what_offsets_reach_read_back_among_small_ones() {
        let store = MemoryStore::default();
        let big = |n: u8| vec![n; 70_000 + usize::from(n)];
        let mut model = BTreeMap::new();
        let mut write = |batch: &mut Batch, key: Vec<u8>, value: Vec<u8>| {
            batch.put(Table::Resources, key.clone(), value.clone());
            model.insert(key, value);
        };
        let mut batch = Batch::default();
        write(&mut batch, b"m".to_vec(), big(1));
        store.commit(batch).unwrap();
        for round in 0..3u8 {
            let mut batch = Batch::default();
            for i in 0..40u8 {
                write(&mut batch, vec![b'a', i, round], vec![i; 30]);
                write(&mut batch, vec![b'm', i, round], vec![i; 30]);
                write(&mut batch, vec![b'z', i, round], vec![i; 30]);
            }
            write(&mut batch, vec![b'm', 20, round, 0], big(round + 2));
            write(&mut batch, vec![b'z', 99, round], big(round + 5));
            store.commit(batch).unwrap();
        }
        let mut batch = Batch::default();
        write(&mut batch, b"m".to_vec(), big(9));
        write(&mut batch, vec![b'm', 20, 1, 0], vec![1; 10]);
        write(&mut batch, vec![b'a', 5, 0], big(7));
        store.commit(batch).unwrap();

        for (key, value) in &model {
            assert_eq!(
                store.get(Table::Resources, key).unwrap().as_ref(),
                Some(value),
                "{key:?}"
            );
        }
        let all = store.scan(Table::Resources, b"", None, usize::MAX).unwrap();
        assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    }

    /// A cascade's pattern over many pages: runs of keys read, removed
    /// and appended in order, each run interleaved with keys elsewhere in
    /// the same table (which the pages remembered for the run must not
    /// answer), through pages splitting off the end and emptied ones
    /// dropped; every read answers as an ordered map does.
    #[test]
    fn runs_of_keys_in_order_among_keys_elsewhere_answer_as_an_ordered_map_does() {
        let store = MemoryStore::default();
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let key = |i: u32| format!("k{i:08}").into_bytes();
        let mut batch = Batch::default();
        for i in (0..20_000u32).step_by(2) {
            batch.put(Table::Resources, key(i), vec![(i % 251) as u8; 40]);
            model.insert(key(i), vec![(i % 251) as u8; 40]);
        }
        store.commit(batch).unwrap();
        let check = |model: &BTreeMap<Vec<u8>, Vec<u8>>, k: &[u8]| {
            assert_eq!(store.get(Table::Resources, k).unwrap().as_ref(), model.get(k), "{k:?}");
        };
        // Removed in order, in steps of 50, each step also reading a far
        // key, writing one in a gap, and appending past the end.
        for step in 0..150u32 {
            let mut batch = Batch::default();
            for i in (step * 100..(step + 1) * 100).step_by(2) {
                check(&model, &key(i));
                check(&model, &key(19_998 - i));
                batch.remove(Table::Resources, key(i));
                model.remove(&key(i));
            }
            let gap = key(10_001 + 2 * step);
            batch.put(Table::Resources, gap.clone(), vec![1; 60]);
            model.insert(gap, vec![1; 60]);
            for j in 0..30 {
                let end = key(20_000 + step * 30 + j);
                batch.put(Table::Resources, end.clone(), vec![2; 90]);
                model.insert(end, vec![2; 90]);
            }
            store.commit(batch).unwrap();
            check(&model, &key(step * 100 + 1));
            check(&model, &key(10_001 + 2 * step));
            let from = key(step * 100);
            let scanned = store.scan(Table::Resources, b"k", Some(&from), 120).unwrap();
            let want: Vec<Entry> = model
                .range((Bound::Excluded(from), Bound::Unbounded))
                .take(120)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(scanned, want, "step {step}");
        }
        let all = store.scan(Table::Resources, b"", None, usize::MAX).unwrap();
        assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    }

    /// Keys appended in one batch (as a cascade appends its outcomes)
    /// fill their pages exactly as keys appended a batch each do: the same
    /// pages, the same bytes allocated.
    #[test]
    fn keys_appended_in_one_batch_fill_pages_as_keys_appended_one_by_one() {
        let value = |i: u32| vec![(i % 251) as u8; 20 + (i % 7) as usize * 30];
        let one_batch = MemoryStore::default();
        let mut batch = Batch::default();
        for i in 0..5_000u32 {
            batch.put(Table::Outcomes, i.to_be_bytes().to_vec(), value(i));
        }
        one_batch.commit(batch).unwrap();
        let one_by_one = MemoryStore::default();
        for i in 0..5_000u32 {
            let mut batch = Batch::default();
            batch.put(Table::Outcomes, i.to_be_bytes().to_vec(), value(i));
            one_by_one.commit(batch).unwrap();
        }
        assert_eq!(one_batch.footprint(), one_by_one.footprint());
        assert_eq!(
            one_batch.scan(Table::Outcomes, b"", None, usize::MAX).unwrap(),
            one_by_one.scan(Table::Outcomes, b"", None, usize::MAX).unwrap()
        );
    }

    /// What one step of a cascade writes to a table, as a batch.
    #[derive(Debug, Clone)]
    struct Step {
        /// Removes keys `from..from + len` in order (some already gone).
        from: u32,
        len: u32,
        /// Appends this many keys past the table's last, in order, some
        /// larger than a page.
        appends: u32,
        /// Also removes a key of the run twice and puts one in its middle.
        twice: bool,
    }

    fn step() -> impl Strategy<Value = Step> {
        (0u32..3_000, 0u32..400, 0u32..150, any::<bool>()).prop_map(|(from, len, appends, twice)| Step {
            from,
            len,
            appends,
            twice,
        })
    }

    proptest! {
        /// Runs of removals in key order (whole pages, parts of pages,
        /// keys absent, a key removed twice, a put inside the run) and of
        /// appends past the table's end, interleaved with another table's
        /// writes in the same batch, as the commit holds them back: every
        /// read answers as an ordered map does.
        #[test]
        fn runs_of_removals_and_appends_answer_as_an_ordered_map_does(steps in proptest::collection::vec(step(), 1..10)) {
            let store = MemoryStore::default();
            let mut model: BTreeMap<(Table, Vec<u8>), Vec<u8>> = BTreeMap::new();
            let key = |i: u32| format!("k{i:06}").into_bytes();
            let value = |i: u32| {
                let len = if i.is_multiple_of(97) { 3_000 } else { 10 + (i % 60) as usize };
                vec![(i % 251) as u8; len]
            };
            let mut batch = Batch::default();
            for i in 0..3_000u32 {
                batch.put(Table::Resources, key(i), value(i));
                model.insert((Table::Resources, key(i)), value(i));
            }
            store.commit(batch).unwrap();
            let mut next = 3_000u32;
            for Step { from, len, appends, twice } in steps {
                let mut batch = Batch::default();
                let mut write = |batch: &mut Batch, table: Table, k: Vec<u8>, v: Option<Vec<u8>>| {
                    match &v {
                        Some(v) => model.insert((table, k.clone()), v.clone()),
                        None => model.remove(&(table, k.clone())),
                    };
                    batch.ops.push((table, k, v));
                };
                for i in from..from + len {
                    write(&mut batch, Table::Resources, key(i), None);
                    if i.is_multiple_of(10) {
                        write(&mut batch, Table::UidIndex, key(i), Some(vec![1; 16]));
                    }
                    if twice && i == from + len / 2 {
                        write(&mut batch, Table::Resources, key(i), None);
                        write(&mut batch, Table::Resources, key(i + 1), Some(b"kept".to_vec()));
                        write(&mut batch, Table::UidIndex, key(i), None);
                    }
                }
                for _ in 0..appends {
                    write(&mut batch, Table::Resources, key(next), Some(value(next)));
                    if twice && next.is_multiple_of(5) {
                        write(&mut batch, Table::Resources, key(next), Some(b"again".to_vec()));
                    }
                    next += 1;
                }
                store.commit(batch).unwrap();
                for table in [Table::Resources, Table::UidIndex] {
                    let want: Vec<Entry> = model
                        .iter()
                        .filter(|((t, _), _)| *t == table)
                        .map(|((_, k), v)| (k.clone(), v.clone()))
                        .collect();
                    prop_assert_eq!(store.scan(table, b"", None, usize::MAX).unwrap(), want.clone());
                    prop_assert_eq!(store.footprint().get(&table).map_or(0, |f| f.entries), want.len() as u64);
                    for (k, v) in want.iter().step_by(37) {
                        prop_assert_eq!(store.get(table, k).unwrap(), Some(v.clone()));
                    }
                }
                for i in (from..from + len).step_by(13) {
                    prop_assert_eq!(store.get(Table::Resources, &key(i)).unwrap(), model.get(&(Table::Resources, key(i))).cloned());
                }
            }
        }
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
            // Past a page, and past what a page's u16 offsets can reach.
            1 => (key(), prop_oneof![0usize..5000, 65_000usize..70_000]).prop_map(|(k, n)| Op::Put(k, vec![9; n])),
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
