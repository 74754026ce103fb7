//! The PostgreSQL store's write-through read cache: point lookups, found
//! and not found, and prefixes known to hold no row, bounded in bytes.
//!
//! Why: the core reads key by key, and over a network each read is a
//! round trip (tens of µs on loopback, more across hosts); a cascade reads
//! the same few rows (its operation, counters, the targets it walks) over
//! and over, and, for every resource it purges, keys and back-reference
//! prefixes that do not exist (the store prefetches those a page ahead,
//! `Store::prefetch`, and keeps the answers here). Why it is coherent:
//! only the fenced writer's process reads and writes the region's tables
//! (standbys read the lease and members rows only), so every change to
//! them goes through this store's commits, which write through: a put
//! keeps its value (except into the logs, read by scans only, and the
//! outcomes, seldom read again: [`FORGOTTEN_ON_PUT`]), a removal forgets
//! the key, and a put into a prefix known empty forgets that prefix. At
//! every `fence` (a new
//! epoch; another node may have written in between) the cache is dropped,
//! absences and empty prefixes with the rest.
//!
//! The same argument lets a commit know which keys are absent without
//! asking (`commit.rs` sends their puts as plain INSERTs and drops their
//! removals): a key cached absent, under an empty prefix, or above the
//! table's highest key ([`ReadCache::known_absent`]). The highest key of
//! a table is learnt by a commit into it (read in its transaction, after
//! its writes) and raised by every put since; it is dropped with the rest.
//! It is kept even when the cache's capacity is zero (a key per table).
//!
//! It also keeps **runs**: stretches of a table's keys it knows
//! completely, with every row in them ([`ReadCache::lookup_run`]). A scan
//! that went to the server knows every row from its start up to its last
//! row (or to its range's end, when it found fewer rows than it asked
//! for); kept, the next scan that starts inside the stretch is answered
//! from memory, whatever its limit, as long as the stretch holds that
//! many rows or reaches the scan's end. The commits write through them as
//! through the rest: a landed put inside a run is added to it, a landed
//! removal taken out. Why: a P1 of 1M on postgres sent a scan to the
//! server twice per work step for the due index (one row, then none) and
//! once per step for the next page of the target's back-references
//! (`PostgresStore::scan`, which reads a walk's pages ahead), each a round
//! trip on the writer's thread (with runs, at 1M: 2 due-index scans
//! instead of 17,572, and pages read ahead). Runs are bounded ([`MAX_RUNS_PER_TABLE`],
//! [`MAX_RUN_BYTES`], [`MAX_RUNS_BYTES`]), kept only for the walks' index
//! tables ([`RUN_TABLES`]: not records, not logs), and dropped with
//! the rest at every fence and failed commit.
//!
//! Reads and commits race (the conformance test reads while a thread
//! commits), so: a commit marks the cache busy before its COMMIT and
//! writes through after it, both under the lock; a lookup while it is busy
//! goes to the database (the cache may be a batch behind it); and a value
//! read from the database is kept only if no commit started since the read
//! began (a generation count), so an older value never overwrites a newer
//! one.
//!
//! Size: one file on purpose: keys, empty prefixes, highest keys and runs
//! are one cache under one lock and one generation (a commit writes
//! through all of them at once, a fence drops all of them), and about
//! half of the file is their tests.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{PoisonError, RwLock};

use quick_cache::unsync::Cache;
use quick_cache::Weighter;

use super::commit::Asked;
use crate::store::{Entry, Table};

/// Each table's highest key as a commit read it (None: the table is empty).
pub(super) type LearntHighest = Vec<(Table, Option<Vec<u8>>)>;

/// A cached lookup: the value, or None for a key known to be absent.
type Cached = Option<Vec<u8>>;

/// What the cache holds an entry for.
#[derive(Clone, PartialEq, Eq)]
enum Slot {
    /// A key: its value (or its absence) is the entry's.
    Key(Table, Vec<u8>),
    /// A prefix no row of the table starts with (the entry is None).
    EmptyPrefix(Table, Vec<u8>),
}

/// A [`Slot`] over borrowed bytes: what a lookup asks with, so that it
/// does not copy the key first (a copy per lookup was 0.8 % of a P1 at 1M
/// on postgres, and every commit looks up each of its keys).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum SlotRef<'a> {
    Key(Table, &'a [u8]),
    EmptyPrefix(Table, &'a [u8]),
}

impl Slot {
    fn as_ref(&self) -> SlotRef<'_> {
        match self {
            Slot::Key(table, key) => SlotRef::Key(*table, key),
            Slot::EmptyPrefix(table, prefix) => SlotRef::EmptyPrefix(*table, prefix),
        }
    }
}

/// A slot hashes as its borrowed form, so that a lookup by [`SlotRef`]
/// finds it.
impl std::hash::Hash for Slot {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state);
    }
}

impl quick_cache::Equivalent<Slot> for SlotRef<'_> {
    fn equivalent(&self, slot: &Slot) -> bool {
        *self == slot.as_ref()
    }
}

/// Tables whose puts are forgotten, not kept: the logs, read by scans only
/// (no point read would find a put), and the outcomes, which a cascade
/// writes one per resource it touches and point-reads again only in an
/// undelete or when a resource it unset is then deleted by it. Kept, a
/// cascade's outcomes filled the cache (a million of them outweigh its
/// 64 MiB) and every put was an insert and an eviction: about a fifth of
/// the cache's work in a P1 flat on postgres (docs/BENCHMARKS.md,
/// "PostgreSQL: the read cache's work per deletion"). Forgotten, a point
/// read after the put asks the database, as after any removal.
const FORGOTTEN_ON_PUT: [Table; 3] = [Table::Outbox, Table::Audit, Table::Outcomes];

/// The tables runs are kept for: the writer's walks' index rows (a key
/// and an empty or small value each: a back-reference names two
/// resources and a field, under 1 KiB), which it reads page after page.
/// Not a table of records (a page of resources or operations may be
/// thousands of times larger, and its reader pages on by its own bounds:
/// a run of them would hold little and push out a walk's), nor a log (an
/// append to a run whose range is open would keep every event).
pub(super) const RUN_TABLES: [Table; 3] = [Table::Backrefs, Table::BlockingBackrefs, Table::DueIndex];

/// Bytes an entry costs beyond its key and value (map slot, vectors'
/// headers): a rough figure, so that many absent keys still count.
const ENTRY_OVERHEAD: u64 = 64;

/// Runs kept per table at most: the oldest goes first. Per table, so
/// that the one-row runs of many small operations' outcomes (the API's
/// `GetOperation`) never push out the pages of a walk.
pub const MAX_RUNS_PER_TABLE: usize = 4;

/// Bytes one run holds at most (keys, values and [`ENTRY_OVERHEAD`] each):
/// a longer scan is not kept, and a run that grows past it is dropped.
pub const MAX_RUN_BYTES: u64 = 4 * 1024 * 1024;

/// Bytes every run together holds at most: the oldest runs go first.
pub const MAX_RUNS_BYTES: u64 = 16 * 1024 * 1024;

/// A stretch `[lo, hi)` of a table's keys (hi None: to the table's end)
/// whose every row is in `rows`, as of the last commit.
struct Run {
    table: Table,
    lo: Vec<u8>,
    hi: Option<Vec<u8>>,
    rows: BTreeMap<Vec<u8>, Vec<u8>>,
    bytes: u64,
    /// When it was made (the oldest goes first).
    made: u64,
}

impl Run {
    fn covers(&self, key: &[u8]) -> bool {
        self.lo.as_slice() <= key && self.hi.as_deref().is_none_or(|hi| key < hi)
    }

    fn overlaps(&self, lo: &[u8], hi: Option<&[u8]>) -> bool {
        hi.is_none_or(|hi| self.lo.as_slice() < hi) && self.hi.as_deref().is_none_or(|own| lo < own)
    }
}

fn row_bytes(key: &[u8], value: &[u8]) -> u64 {
    ENTRY_OVERHEAD + key.len() as u64 + value.len() as u64
}

#[derive(Clone, Default)]
struct ByteWeighter;

impl Weighter<Slot, Cached> for ByteWeighter {
    fn weight(&self, slot: &Slot, value: &Cached) -> u64 {
        let key = match slot {
            Slot::Key(_, key) | Slot::EmptyPrefix(_, key) => key.len() as u64,
        };
        ENTRY_OVERHEAD + key + value.as_ref().map_or(0, |v| v.len() as u64)
    }
}

struct State {
    entries: Cache<Slot, Cached, ByteWeighter>,
    /// The lengths of the empty prefixes remembered per table since the
    /// last clear (a few: a uid's 16 bytes), so that a put checks only the
    /// prefixes of its key that may be cached.
    prefix_lengths: BTreeMap<Table, BTreeSet<usize>>,
    /// Per table whose highest key is known: that key (None: no row).
    highest: BTreeMap<Table, Option<Vec<u8>>>,
    /// Odd while a commit is in flight; changes at every commit's start
    /// and end and at every clear.
    generation: u64,
    /// The commit in flight is a group's flight (`flush.rs`): its writes
    /// stay staged until it ended, so the writer's view (which reads them
    /// there first) may read the cache meanwhile, and what any read
    /// learns from the database meanwhile is kept (the commit's end writes
    /// its writes through over it).
    flight: bool,
    /// The runs known (see the module's doc), in no order.
    runs: Vec<Run>,
    /// What every run holds, in bytes.
    run_bytes: u64,
    /// Runs made so far (their `made`).
    runs_made: u64,
    /// The tables a key's entry was kept for since the last clear (a bit
    /// each): a landed write of a table with none has no entry to forget.
    /// A P1's flights remove back-references and put outbox rows, which
    /// scans read, and each such write looked its key up to forget it
    /// (the write-through's removals were 7 % of the writer's thread in a
    /// P1 of 1M on postgres).
    keyed: u32,
}

// A bit per table in `State::keyed`.
const _: () = assert!(Table::ALL.len() <= 32);

impl State {
    fn table_bit(table: Table) -> u32 {
        1 << (table as u32)
    }

    fn keep_key(&mut self, table: Table, key: Vec<u8>, value: Cached) {
        self.keyed |= Self::table_bit(table);
        self.entries.insert(Slot::Key(table, key), value);
    }

    /// Forgets the entry of `key`, if it may have one.
    fn forget_key(&mut self, table: Table, key: &[u8]) {
        if self.keyed & Self::table_bit(table) != 0 {
            self.entries.remove(&SlotRef::Key(table, key));
        }
    }

    /// Whether a lookup must go to the database: while a commit is in
    /// flight (the database may be ahead of the cache), except for the
    /// writer's view during a group's flight, whose writes it reads from
    /// the staged set first: for every other key, range and prefix the
    /// cache is what the server holds.
    fn busy_for(&self, writers_view: bool) -> bool {
        self.generation & 1 == 1 && !(writers_view && self.flight)
    }

    /// Whether a read of the database begun at `generation` may be kept:
    /// no commit started, ended or clear happened since; and no commit is
    /// in flight, unless it is a flight, whose end writes its writes
    /// through over whatever was read meanwhile (before or after its
    /// COMMIT) and drops everything if it failed.
    fn may_keep(&self, generation: u64) -> bool {
        self.generation == generation && (generation & 1 == 0 || self.flight)
    }

    /// Whether every key of `table` is below `key` (so `key`, and every
    /// key it is a prefix of, is absent).
    fn above_highest(&self, table: Table, key: &[u8]) -> bool {
        self.highest
            .get(&table)
            .is_some_and(|highest| highest.as_deref().is_none_or(|highest| key > highest))
    }

    fn empty_prefix_of(&self, table: Table, key: &[u8]) -> bool {
        self.prefix_lengths.get(&table).is_some_and(|lengths| {
            lengths
                .iter()
                .take_while(|len| **len <= key.len())
                .any(|len| self.entries.get(&SlotRef::EmptyPrefix(table, &key[..*len])).is_some())
        })
    }

    /// Whether a lookup of `key` would hit ([`State::lookup`] without
    /// copying the value).
    fn knows(&self, writers_view: bool, table: Table, key: &[u8]) -> bool {
        !self.busy_for(writers_view)
            && (self.above_highest(table, key)
                || self.entries.get(&SlotRef::Key(table, key)).is_some()
                || self.empty_prefix_of(table, key))
    }

    /// [`ReadCache::lookup_as`] under a lock its caller holds.
    fn lookup(&self, writers_view: bool, table: Table, key: &[u8]) -> Lookup {
        if self.busy_for(writers_view) {
            // A commit in flight: the database may be ahead of the cache.
            return Lookup::Miss(self.generation);
        }
        if self.above_highest(table, key) {
            return Lookup::Hit(None);
        }
        match self.entries.get(&SlotRef::Key(table, key)) {
            Some(value) => Lookup::Hit(value.clone()),
            // A key under an empty prefix is absent.
            None if self.empty_prefix_of(table, key) => Lookup::Hit(None),
            None => Lookup::Miss(self.generation),
        }
    }

    /// Whether `key` is known absent from `table`: [`State::lookup`]'s
    /// `Hit(None)` without a copy of the value of a key found present.
    fn absent(&self, table: Table, key: &[u8]) -> bool {
        if self.busy_for(false) {
            return false;
        }
        if self.above_highest(table, key) {
            return true;
        }
        match self.entries.get(&SlotRef::Key(table, key)) {
            Some(value) => value.is_none(),
            None => self.empty_prefix_of(table, key),
        }
    }

    /// A row `key` landed: no prefix of it is empty any more.
    fn forget_prefixes_of(&mut self, table: Table, key: &[u8]) {
        let Some(lengths) = self.prefix_lengths.get(&table) else {
            return;
        };
        for len in lengths.iter().take_while(|len| **len <= key.len()) {
            self.entries.remove(&SlotRef::EmptyPrefix(table, &key[..*len]));
        }
    }

    /// A write of `key` landed: every run that covers it takes it (a
    /// put its row, a removal the row's absence).
    fn write_through_runs(&mut self, table: Table, key: &[u8], value: Option<&[u8]>) {
        let mut total = self.run_bytes;
        for run in self.runs.iter_mut().filter(|run| run.table == table && run.covers(key)) {
            let old = match value {
                Some(value) => {
                    let added = row_bytes(key, value);
                    run.bytes += added;
                    total += added;
                    run.rows.insert(key.to_vec(), value.to_vec())
                }
                None => run.rows.remove(key),
            };
            if let Some(old) = old {
                let removed = row_bytes(key, &old);
                run.bytes = run.bytes.saturating_sub(removed);
                total = total.saturating_sub(removed);
            }
        }
        self.run_bytes = total;
    }

    /// Drops runs grown past [`MAX_RUN_BYTES`], then the oldest while all
    /// of them hold more than [`MAX_RUNS_BYTES`].
    fn bound_runs(&mut self) {
        let before = self.runs.len();
        self.runs.retain(|run| run.bytes <= MAX_RUN_BYTES);
        if self.runs.len() != before {
            self.run_bytes = self.runs.iter().map(|run| run.bytes).sum();
        }
        while self.run_bytes > MAX_RUNS_BYTES {
            let Some(oldest) = self
                .runs
                .iter()
                .enumerate()
                .min_by_key(|(_, run)| run.made)
                .map(|(i, _)| i)
            else {
                break;
            };
            let run = self.runs.swap_remove(oldest);
            self.run_bytes = self.run_bytes.saturating_sub(run.bytes);
        }
    }
}

/// The cache. A zero capacity keeps no entry (every key lookup a miss);
/// runs and each table's highest key are bounded on their own.
pub(super) struct ReadCache {
    state: RwLock<State>,
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Lookup {
    /// The key's value (or its absence), as of the last commit.
    Hit(Cached),
    /// Not cached: read the database, then [`ReadCache::remember`] with
    /// this generation.
    Miss(u64),
}

/// What a lookup of a scan's rows in the runs found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum RunLookup {
    /// The scan's rows, as of the last commit.
    Hit(Vec<Entry>),
    /// A run covers the scan's start, but holds too few of its rows.
    Short,
    /// No run covers the scan's start.
    Miss,
}

/// What a lookup of a prefix found.
pub(super) enum PrefixLookup {
    /// No row starts with it, as of the last commit.
    Empty,
    /// Not known: scan the database, then
    /// [`ReadCache::remember_empty_prefix`] with this generation if the
    /// scan of the whole prefix found nothing.
    Miss(u64),
}

impl ReadCache {
    pub(super) fn new(capacity_bytes: u64) -> Self {
        // An estimate of the entries it will hold, for its tables only.
        let estimated_items = usize::try_from(capacity_bytes / 512).unwrap_or(usize::MAX).max(16);
        Self {
            state: RwLock::new(State {
                entries: Cache::with_weighter(estimated_items, capacity_bytes, ByteWeighter),
                prefix_lengths: BTreeMap::new(),
                highest: BTreeMap::new(),
                generation: 0,
                flight: false,
                runs: Vec::new(),
                run_bytes: 0,
                runs_made: 0,
                keyed: 0,
            }),
        }
    }

    #[cfg(test)]
    pub(super) fn lookup(&self, table: Table, key: &[u8]) -> Lookup {
        self.lookup_as(false, table, key)
    }

    /// [`ReadCache::lookup`] for the writer's view when `writers_view`:
    /// during a flight it reads the cache (the flight's writes are staged,
    /// and read there first).
    pub(super) fn lookup_as(&self, writers_view: bool, table: Table, key: &[u8]) -> Lookup {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.lookup(writers_view, table, key)
    }

    /// Which of `keys` (less those `skip` says need no read) a lookup as
    /// [`ReadCache::lookup_as`] would miss, sorted and without duplicates:
    /// what a read-ahead sends. Under one read of the lock, and without
    /// copying the values it holds (a read-ahead asks about every key of
    /// a walk's page, most of them cached by the read-ahead before).
    pub(super) fn unknown_keys(
        &self,
        writers_view: bool,
        table: Table,
        keys: &[Vec<u8>],
        skip: impl Fn(&[u8]) -> bool,
    ) -> Vec<Vec<u8>> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        let mut unknown: Vec<Vec<u8>> = keys
            .iter()
            // The cache first: it knows most of a page's keys, and `skip`
            // (the staged set's, while a flight flies: always, in a
            // cascade) takes a lock and walks an ordered map per key.
            .filter(|key| !state.knows(writers_view, table, key) && !skip(key))
            .cloned()
            .collect();
        unknown.sort_unstable();
        unknown.dedup();
        unknown
    }

    /// Which of `prefixes` a lookup as [`ReadCache::lookup_prefix_as`]
    /// would miss, sorted and without duplicates, under one read of the
    /// lock.
    pub(super) fn unknown_prefixes(&self, writers_view: bool, table: Table, prefixes: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        let mut unknown: Vec<Vec<u8>> = prefixes
            .iter()
            .filter(|prefix| {
                state.busy_for(writers_view)
                    || !(state.above_highest(table, prefix) || state.empty_prefix_of(table, prefix))
            })
            .cloned()
            .collect();
        unknown.sort_unstable();
        unknown.dedup();
        unknown
    }

    /// Whether `prefix` (or a prefix of it) is known to hold no row.
    #[cfg(test)]
    pub(super) fn lookup_prefix(&self, table: Table, prefix: &[u8]) -> PrefixLookup {
        self.lookup_prefix_as(false, table, prefix)
    }

    /// [`ReadCache::lookup_prefix`] as [`ReadCache::lookup_as`].
    pub(super) fn lookup_prefix_as(&self, writers_view: bool, table: Table, prefix: &[u8]) -> PrefixLookup {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        if state.busy_for(writers_view) {
            return PrefixLookup::Miss(state.generation);
        }
        // Every key under a prefix is at least the prefix.
        if state.above_highest(table, prefix) || state.empty_prefix_of(table, prefix) {
            PrefixLookup::Empty
        } else {
            PrefixLookup::Miss(state.generation)
        }
    }

    /// The rows of `table` from `start` (inclusive) to `end` (exclusive;
    /// None: the table's end), at most `most`, from a run that starts at
    /// or before `start` and either holds `most` rows from there or
    /// reaches `end` ([`RunLookup::Hit`]); [`RunLookup::Short`] when a
    /// run covers `start` but holds too few rows (a walk used it up: the
    /// caller reads ahead); else (or while a commit is in flight: the
    /// database may be ahead of the runs) [`RunLookup::Miss`].
    #[cfg(test)]
    pub(super) fn lookup_run(&self, table: Table, start: &[u8], end: Option<&[u8]>, most: usize) -> RunLookup {
        self.lookup_run_as(false, table, start, end, most)
    }

    /// [`ReadCache::lookup_run`] as [`ReadCache::lookup_as`].
    pub(super) fn lookup_run_as(
        &self,
        writers_view: bool,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        most: usize,
    ) -> RunLookup {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        if state.busy_for(writers_view) {
            return RunLookup::Miss;
        }
        let Some(run) = state.runs.iter().find(|run| run.table == table && run.covers(start)) else {
            return RunLookup::Miss;
        };
        // The scan's rows in the run end at whichever comes first.
        let upper = match (run.hi.as_deref(), end) {
            (Some(hi), Some(end)) => Some(hi.min(end)),
            (hi, end) => hi.or(end),
        };
        let reaches_end = match (run.hi.as_deref(), end) {
            (None, _) => true,
            (Some(hi), Some(end)) => hi >= end,
            (Some(_), None) => false,
        };
        if upper.is_some_and(|upper| start >= upper) {
            // An empty range (an `after` at or past the prefix's end).
            return if reaches_end {
                RunLookup::Hit(Vec::new())
            } else {
                RunLookup::Short
            };
        }
        let bound = upper.map_or(Bound::Unbounded, Bound::Excluded);
        let rows: Vec<Entry> = run
            .rows
            .range::<[u8], _>((Bound::Included(start), bound))
            .take(most)
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        if rows.len() >= most || reaches_end {
            RunLookup::Hit(rows)
        } else {
            RunLookup::Short
        }
    }

    /// Whether a scan of `table` may be kept as a run ([`RUN_TABLES`]), so
    /// that reading ahead for one is worth it.
    pub(super) fn keeps_runs(table: Table) -> bool {
        RUN_TABLES.contains(&table)
    }

    /// Keeps what a scan of the database begun at `generation` found, on
    /// the same terms as [`ReadCache::remember`]: `rows`, the first rows
    /// of `table` from `start` (inclusive) to `end` (exclusive; None: the
    /// table's end), at most `asked` of them. Fewer than asked: every row
    /// of the range; else every row up to the last one. Kept only for
    /// [`RUN_TABLES`], and not past [`MAX_RUN_BYTES`]; a run it overlaps
    /// is replaced.
    pub(super) fn remember_run(
        &self,
        generation: u64,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        asked: usize,
        rows: &[Entry],
    ) {
        if !Self::keeps_runs(table) {
            return;
        }
        let bytes: u64 = rows.iter().map(|(key, value)| row_bytes(key, value)).sum();
        if bytes > MAX_RUN_BYTES {
            return;
        }
        let hi = match rows.last() {
            // The smallest key above the last row: `last ‖ 0x00`.
            Some((last, _)) if rows.len() >= asked => {
                let mut above = last.clone();
                above.push(0);
                Some(above)
            }
            _ => end.map(<[u8]>::to_vec),
        };
        if hi.as_deref().is_some_and(|hi| start >= hi) {
            return;
        }
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if !state.may_keep(generation) {
            return;
        }
        let State { runs, run_bytes, .. } = &mut *state;
        runs.retain(|run| {
            let keep = run.table != table || !run.overlaps(start, hi.as_deref());
            if !keep {
                *run_bytes = run_bytes.saturating_sub(run.bytes);
            }
            keep
        });
        let of_table = runs.iter().filter(|run| run.table == table).count();
        if of_table >= MAX_RUNS_PER_TABLE {
            if let Some(oldest) = runs
                .iter()
                .enumerate()
                .filter(|(_, run)| run.table == table)
                .min_by_key(|(_, run)| run.made)
                .map(|(i, _)| i)
            {
                let run = runs.swap_remove(oldest);
                *run_bytes = run_bytes.saturating_sub(run.bytes);
            }
        }
        state.runs_made += 1;
        let made = state.runs_made;
        state.run_bytes += bytes;
        state.runs.push(Run {
            table,
            lo: start.to_vec(),
            hi,
            rows: rows.iter().cloned().collect(),
            bytes,
            made,
        });
        state.bound_runs();
    }

    /// The generation a read of the database that starts now passes to
    /// [`ReadCache::remember`] (odd, so nothing is kept, while a commit is
    /// in flight).
    pub(super) fn generation(&self) -> u64 {
        self.state.read().unwrap_or_else(PoisonError::into_inner).generation
    }

    /// Keeps what a read of the database found, unless a commit started
    /// (or the cache was cleared) since the read began at `generation`.
    pub(super) fn remember(&self, generation: u64, table: Table, key: Vec<u8>, value: Cached) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.may_keep(generation) {
            state.keep_key(table, key, value);
        }
    }

    /// [`ReadCache::remember`] for many keys, under one lock (a prefetch
    /// answers hundreds at once).
    pub(super) fn remember_all(&self, generation: u64, found: impl IntoIterator<Item = (Table, Vec<u8>, Cached)>) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.may_keep(generation) {
            for (table, key, value) in found {
                state.keep_key(table, key, value);
            }
        }
    }

    /// Keeps that a read of the database begun at `generation` found no
    /// row starting with `prefix`, on the same terms as
    /// [`ReadCache::remember`].
    pub(super) fn remember_empty_prefix(&self, generation: u64, table: Table, prefix: Vec<u8>) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.may_keep(generation) {
            state.prefix_lengths.entry(table).or_default().insert(prefix.len());
            state.entries.insert(Slot::EmptyPrefix(table, prefix), None);
        }
    }

    /// Whether `key` is known not to be in `table` as of the last commit
    /// (only asked with no commit in flight: see `PostgresStore::commit_at`).
    #[cfg(test)]
    pub(super) fn known_absent(&self, table: Table, key: &[u8]) -> bool {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .absent(table, key)
    }

    /// Runs `plan` with the two questions a commit's plan asks of every
    /// key it writes ([`ReadCache::known_absent`]) and table (whether its
    /// highest key is known), under one read of the lock instead of one per
    /// key (a flush of a P1 asks about four keys per deleted resource).
    pub(super) fn planning<R>(
        &self,
        plan: impl FnOnce(&dyn Fn(Table, &[u8], Asked) -> bool, &dyn Fn(Table) -> bool) -> R,
    ) -> R {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        let absent = |table: Table, key: &[u8], asked: Asked| match asked {
            Asked::Put => state.absent(table, key),
            Asked::Removal => !state.busy_for(false) && state.above_highest(table, key),
        };
        let highest_known = |table: Table| state.highest.contains_key(&table);
        plan(&absent, &highest_known)
    }

    /// Whether the highest key of `table` is known.
    pub(super) fn highest_known(&self, table: Table) -> bool {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.highest.contains_key(&table)
    }

    /// Keeps the highest key of `table` (None: no row) a read of the
    /// database begun at `generation` found, on the same terms as
    /// [`ReadCache::remember`].
    pub(super) fn remember_highest(&self, generation: u64, table: Table, highest: Option<Vec<u8>>) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.may_keep(generation) {
            state.highest.insert(table, highest);
        }
    }

    /// A commit is about to be sent: the generation to give back to
    /// [`ReadCache::commit_ended`].
    pub(super) fn commit_started(&self) -> u64 {
        self.started(false)
    }

    /// [`ReadCache::commit_started`] for a group's flight (`flush.rs`),
    /// which the writer's next step reads past (see `State::busy_for`).
    pub(super) fn flight_started(&self) -> u64 {
        self.started(true)
    }

    fn started(&self, flight: bool) -> u64 {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.generation = state.generation.wrapping_add(1) | 1;
        state.flight = flight;
        state.generation
    }

    /// The commit begun at `started` ended: `writes` (the batch's last
    /// write per key) landed, with `learnt` (the highest key of tables it
    /// read them of), or, None, the commit failed (maybe landed: the cache
    /// is dropped). A cache cleared meanwhile (a fence) stays cleared:
    /// what landed at the old epoch may be older than what the next
    /// writer wrote.
    pub(super) fn commit_ended<'a>(
        &self,
        started: u64,
        writes: Option<(impl Iterator<Item = (Table, &'a [u8], Option<&'a [u8]>)>, LearntHighest)>,
    ) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        let writes = writes.filter(|_| state.generation == started);
        match writes {
            Some((writes, learnt)) => {
                state.highest.extend(learnt);
                for (table, key, value) in writes {
                    if !state.runs.is_empty() && RUN_TABLES.contains(&table) {
                        state.write_through_runs(table, key, value);
                    }
                    let Some(value) = value else {
                        // A removed key is forgotten, not kept as absent:
                        // a cascade removes three keys per resource it
                        // deletes and reads none of them again, and keeping
                        // each cost an entry (and, with the cache full, an
                        // eviction): 14 % of the writer's thread in a P1
                        // of 1M on postgres went to this loop.
                        state.forget_key(table, key);
                        continue;
                    };
                    state.forget_prefixes_of(table, key);
                    if let Some(highest) = state.highest.get_mut(&table) {
                        if highest.as_deref().is_none_or(|highest| key > highest) {
                            *highest = Some(key.to_vec());
                        }
                    }
                    if FORGOTTEN_ON_PUT.contains(&table) {
                        // Read by scans (which the cache does not answer
                        // from its entries) or seldom: see the constant.
                        state.forget_key(table, key);
                    } else {
                        state.keep_key(table, key.to_vec(), Some(value.to_vec()));
                    }
                }
                state.bound_runs();
            }
            None => state.clear(),
        }
        state.flight = false;
        state.generation = (state.generation | 1).wrapping_add(1);
    }

    /// Drops everything (a new epoch: another node may have written).
    pub(super) fn clear(&self) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.clear();
        // Different from every read begun before, and as odd or even as
        // it was (a commit in flight stays in flight).
        state.generation = state.generation.wrapping_add(2);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.state.read().unwrap_or_else(PoisonError::into_inner).entries.len()
    }
}

impl State {
    fn clear(&mut self) {
        self.entries.clear();
        self.prefix_lengths.clear();
        self.highest.clear();
        self.runs.clear();
        self.run_bytes = 0;
        self.keyed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(cache: &ReadCache, key: &[u8]) -> Option<Cached> {
        match cache.lookup(Table::Meta, key) {
            Lookup::Hit(value) => Some(value),
            Lookup::Miss(_) => None,
        }
    }

    fn generation(cache: &ReadCache, key: &[u8]) -> u64 {
        match cache.lookup(Table::Meta, key) {
            Lookup::Miss(generation) => generation,
            Lookup::Hit(_) => panic!("cached"),
        }
    }

    /// A commit of `writes` that landed (begun at `started`).
    fn ended<'a>(
        cache: &ReadCache,
        started: u64,
        writes: impl IntoIterator<Item = (Table, &'a [u8], Option<&'a [u8]>)>,
    ) {
        cache.commit_ended(started, Some((writes.into_iter(), Vec::new())));
    }

    fn failed(cache: &ReadCache, started: u64) {
        cache.commit_ended(started, None::<(std::iter::Empty<_>, _)>);
    }

    fn landed(cache: &ReadCache, key: &[u8], value: Option<&[u8]>) {
        let started = cache.commit_started();
        ended(cache, started, [(Table::Meta, key, value)]);
    }

    #[test]
    fn a_read_begun_before_a_commit_never_overwrites_what_it_wrote() {
        let cache = ReadCache::new(1 << 20);
        let before = generation(&cache, b"k");
        let started = cache.commit_started();
        // While the commit is in flight the cache is bypassed.
        assert!(hit(&cache, b"k").is_none());
        ended(
            &cache,
            started,
            [(Table::Meta, b"k".as_slice(), Some(b"new".as_slice()))],
        );
        // The old read comes back with the old value: not kept.
        cache.remember(before, Table::Meta, b"k".to_vec(), Some(b"old".to_vec()));
        assert_eq!(hit(&cache, b"k"), Some(Some(b"new".to_vec())));
        // A read begun after the commit is kept, absent keys too.
        let after = generation(&cache, b"gone");
        cache.remember(after, Table::Meta, b"gone".to_vec(), None);
        assert_eq!(hit(&cache, b"gone"), Some(None));
    }

    #[test]
    fn a_landed_removal_forgets_a_key_whether_a_read_or_a_put_kept_it() {
        let cache = ReadCache::new(1 << 20);
        landed(&cache, b"k", Some(b"v"));
        assert_eq!(
            hit(&cache, b"k"),
            Some(Some(b"v".to_vec())),
            "a put that landed is kept"
        );
        landed(&cache, b"k", None);
        assert_eq!(hit(&cache, b"k"), None, "its removal forgets it");
        cache.clear();
        let g = generation(&cache, b"k");
        cache.remember(g, Table::Meta, b"k".to_vec(), Some(b"w".to_vec()));
        landed(&cache, b"k", None);
        assert_eq!(hit(&cache, b"k"), None, "a read's entry, after a clear");
        // A removal in a table no entry was kept for looks nothing up,
        // and leaves the others' entries.
        landed(&cache, b"k", Some(b"x"));
        let started = cache.commit_started();
        ended(&cache, started, [(Table::Backrefs, b"k".as_slice(), None)]);
        assert_eq!(hit(&cache, b"k"), Some(Some(b"x".to_vec())));
    }

    #[test]
    fn a_failed_commit_or_a_fence_drops_everything() {
        let cache = ReadCache::new(1 << 20);
        landed(&cache, b"k", Some(b"v"));
        let stale = generation(&cache, b"other");
        let started = cache.commit_started();
        failed(&cache, started);
        assert!(hit(&cache, b"k").is_none(), "a commit that may have landed");
        cache.remember(stale, Table::Meta, b"other".to_vec(), None);
        assert!(hit(&cache, b"other").is_none());
        landed(&cache, b"k", Some(b"v"));
        let before_fence = generation(&cache, b"other");
        cache.clear();
        assert!(hit(&cache, b"k").is_none());
        cache.remember(before_fence, Table::Meta, b"other".to_vec(), None);
        assert!(hit(&cache, b"other").is_none(), "a read begun before the fence");
    }

    fn empty(cache: &ReadCache, prefix: &[u8]) -> bool {
        matches!(cache.lookup_prefix(Table::Meta, prefix), PrefixLookup::Empty)
    }

    #[test]
    fn an_empty_prefix_answers_its_keys_until_a_put_into_it_lands() {
        let cache = ReadCache::new(1 << 20);
        let g = cache.generation();
        cache.remember_empty_prefix(g, Table::Meta, b"p/".to_vec());
        assert!(empty(&cache, b"p/"));
        assert!(empty(&cache, b"p/x/"), "a longer prefix");
        assert!(!empty(&cache, b"p"), "a shorter one is not known");
        assert!(!empty(&cache, b"q/"));
        assert_eq!(hit(&cache, b"p/k"), Some(None), "a key under it is absent");
        assert!(!matches!(
            cache.lookup_prefix(Table::Outbox, b"p/"),
            PrefixLookup::Empty
        ));
        // A removal keeps it empty; a put of another table's key too.
        let started = cache.commit_started();
        ended(
            &cache,
            started,
            [
                (Table::Meta, b"p/gone".as_slice(), None),
                (Table::Outbox, b"p/k".as_slice(), Some(b"v".as_slice())),
            ],
        );
        assert!(empty(&cache, b"p/"));
        landed(&cache, b"p/k", Some(b"v"));
        assert!(!empty(&cache, b"p/"), "a row landed in it");
        assert_eq!(hit(&cache, b"p/k"), Some(Some(b"v".to_vec())));
        assert!(hit(&cache, b"p/other").is_none(), "no longer known absent");
    }

    #[test]
    fn an_empty_prefix_read_before_a_commit_or_a_fence_is_not_kept() {
        let cache = ReadCache::new(1 << 20);
        let before_commit = cache.generation();
        let started = cache.commit_started();
        assert!(!empty(&cache, b"p/"));
        ended(
            &cache,
            started,
            [(Table::Meta, b"p/k".as_slice(), Some(b"v".as_slice()))],
        );
        cache.remember_empty_prefix(before_commit, Table::Meta, b"p/".to_vec());
        assert!(!empty(&cache, b"p/"), "the scan began before the row landed");
        let g = cache.generation();
        cache.remember_empty_prefix(g, Table::Meta, b"q/".to_vec());
        assert!(empty(&cache, b"q/"));
        // A fence (another writer may have put rows into it) or a commit
        // that may have landed forgets it.
        cache.clear();
        assert!(!empty(&cache, b"q/"));
        assert!(hit(&cache, b"q/k").is_none());
        let g = cache.generation();
        cache.remember_empty_prefix(g, Table::Meta, b"q/".to_vec());
        let started = cache.commit_started();
        failed(&cache, started);
        assert!(!empty(&cache, b"q/"));
    }

    #[test]
    fn a_removed_key_and_a_put_into_a_log_or_an_outcome_are_forgotten_not_kept() {
        let cache = ReadCache::new(1 << 20);
        landed(&cache, b"k", Some(b"v"));
        assert_eq!(hit(&cache, b"k"), Some(Some(b"v".to_vec())));
        assert_eq!(cache.len(), 1);
        landed(&cache, b"k", None);
        // Not a stale value, and no entry spent on it: the next read asks.
        assert!(hit(&cache, b"k").is_none());
        assert_eq!(cache.len(), 0);
        let started = cache.commit_started();
        ended(
            &cache,
            started,
            [
                (Table::Outbox, b"7".as_slice(), Some(b"e".as_slice())),
                (Table::Audit, b"a".as_slice(), Some(b"x".as_slice())),
            ],
        );
        assert_eq!(cache.len(), 0, "logs are read by scans only");
        // An outcome read absent, then put: forgotten, not kept (and not
        // left absent), so the next read asks the database.
        let g = generation(&cache, b"o");
        cache.remember(g, Table::Outcomes, b"o".to_vec(), None);
        assert_eq!(cache.lookup(Table::Outcomes, b"o"), Lookup::Hit(None));
        let started = cache.commit_started();
        ended(
            &cache,
            started,
            [(Table::Outcomes, b"o".as_slice(), Some(b"deleted".as_slice()))],
        );
        assert!(matches!(cache.lookup(Table::Outcomes, b"o"), Lookup::Miss(_)));
        assert_eq!(cache.len(), 0, "a cascade's outcomes take no entry");
        // A removal still never leaves a stale value behind, even of a key
        // read before it.
        let g = generation(&cache, b"r");
        cache.remember(g, Table::Meta, b"r".to_vec(), Some(b"old".to_vec()));
        landed(&cache, b"r", None);
        assert!(hit(&cache, b"r").is_none());
    }

    #[test]
    fn the_cache_holds_at_most_its_bytes() {
        let cache = ReadCache::new(64 * 1024);
        for i in 0..10_000u32 {
            let g = generation(&cache, &i.to_be_bytes());
            cache.remember(g, Table::Meta, i.to_be_bytes().to_vec(), Some(vec![0; 100]));
        }
        for i in 0..10_000u32 {
            cache.remember_empty_prefix(cache.generation(), Table::Backrefs, i.to_be_bytes().to_vec());
        }
        let state = cache.state.read().unwrap();
        assert!(state.entries.weight() <= 64 * 1024, "{}", state.entries.weight());
        assert!(state.entries.len() > 100, "{}", state.entries.len());
    }

    /// A plan looks a put's key up, and a removal's only as far as the
    /// table's highest key: a removal of a key cached absent is sent.
    #[test]
    fn a_plan_looks_up_its_puts_and_drops_only_removals_above_the_highest_key() {
        let cache = ReadCache::new(1 << 20);
        let g = cache.generation();
        cache.remember(g, Table::Meta, b"gone".to_vec(), None);
        cache.remember_highest(g, Table::Meta, Some(b"m".to_vec()));
        let asked = |key: &[u8], asked: Asked| cache.planning(|absent, _| absent(Table::Meta, key, asked));
        assert!(asked(b"gone", Asked::Put), "a put of a key cached absent is an INSERT");
        assert!(!asked(b"gone", Asked::Removal), "its removal is sent");
        assert!(
            asked(b"z", Asked::Put) && asked(b"z", Asked::Removal),
            "above the highest: both"
        );
        let started = cache.commit_started();
        assert!(
            !asked(b"z", Asked::Removal),
            "nothing is known while a commit is in flight"
        );
        cache.commit_ended(started, None::<(std::iter::Empty<(Table, &[u8], Option<&[u8]>)>, _)>);
    }

    #[test]
    fn a_key_is_known_absent_when_cached_absent_under_an_empty_prefix_or_above_the_highest() {
        let cache = ReadCache::new(1 << 20);
        assert!(!cache.known_absent(Table::Outbox, b"5"), "nothing known");
        assert!(!cache.highest_known(Table::Outbox));
        let g = cache.generation();
        cache.remember(g, Table::Meta, b"gone".to_vec(), None);
        cache.remember(g, Table::Meta, b"here".to_vec(), Some(b"v".to_vec()));
        cache.remember_empty_prefix(g, Table::Backrefs, b"p/".to_vec());
        assert!(cache.known_absent(Table::Meta, b"gone"));
        assert!(!cache.known_absent(Table::Meta, b"here"));
        assert!(cache.known_absent(Table::Backrefs, b"p/x"));
        // A commit learns the outbox's highest key; its puts raise it.
        let started = cache.commit_started();
        assert!(
            !cache.known_absent(Table::Meta, b"gone"),
            "not while a commit is in flight"
        );
        cache.commit_ended(
            started,
            Some((
                [(Table::Outbox, b"7".as_slice(), Some(b"e".as_slice()))].into_iter(),
                vec![(Table::Outbox, Some(b"7".to_vec())), (Table::Audit, None)],
            )),
        );
        assert!(cache.highest_known(Table::Outbox));
        assert!(!cache.known_absent(Table::Outbox, b"7"));
        assert!(!cache.known_absent(Table::Outbox, b"5"), "below the highest: not known");
        assert!(cache.known_absent(Table::Outbox, b"8"));
        assert!(cache.known_absent(Table::Audit, b"a"), "an empty table");
        landed(&cache, b"x", Some(b"v"));
        let started = cache.commit_started();
        ended(
            &cache,
            started,
            [(Table::Outbox, b"9".as_slice(), Some(b"e".as_slice()))],
        );
        assert!(!cache.known_absent(Table::Outbox, b"8"), "raised by a put");
        assert!(cache.known_absent(Table::Outbox, b"90"));
        // A failed commit or a fence forgets the highest keys too.
        let started = cache.commit_started();
        failed(&cache, started);
        assert!(!cache.highest_known(Table::Outbox));
        assert!(!cache.known_absent(Table::Audit, b"a"));
    }

    #[test]
    fn a_commit_that_ends_after_a_fence_leaves_the_cache_cleared() {
        let cache = ReadCache::new(1 << 20);
        let started = cache.commit_started();
        // The fence of a new epoch while the old epoch's commit is in flight.
        cache.clear();
        cache.commit_ended(
            started,
            Some((
                [(Table::Meta, b"k".as_slice(), Some(b"old".as_slice()))].into_iter(),
                vec![(Table::Outbox, None)],
            )),
        );
        assert!(hit(&cache, b"k").is_none(), "the next writer may have changed it");
        assert!(!cache.highest_known(Table::Outbox));
        landed(&cache, b"k", Some(b"v"));
        assert_eq!(hit(&cache, b"k"), Some(Some(b"v".to_vec())), "the cache works again");
    }

    fn rows(keys: &[&str]) -> Vec<Entry> {
        keys.iter().map(|k| (k.as_bytes().to_vec(), b"v".to_vec())).collect()
    }

    fn keys_of(found: RunLookup) -> Option<Vec<String>> {
        match found {
            RunLookup::Hit(rows) => Some(
                rows.into_iter()
                    .map(|(key, _)| String::from_utf8(key).unwrap())
                    .collect(),
            ),
            RunLookup::Short | RunLookup::Miss => None,
        }
    }

    fn run_keys(cache: &ReadCache, start: &str, end: Option<&str>, most: usize) -> Option<Vec<String>> {
        keys_of(cache.lookup_run(Table::Backrefs, start.as_bytes(), end.map(str::as_bytes), most))
    }

    #[test]
    fn a_run_answers_scans_inside_it_and_takes_the_writes_that_land_in_it() {
        let cache = ReadCache::new(1 << 20);
        let g = cache.generation();
        // Fewer rows than asked: every row of [t/, t0) is known.
        cache.remember_run(
            g,
            Table::Backrefs,
            b"t/",
            Some(b"t0"),
            10,
            &rows(&["t/1", "t/2", "t/3"]),
        );
        assert_eq!(run_keys(&cache, "t/", Some("t0"), 10).unwrap(), ["t/1", "t/2", "t/3"]);
        assert_eq!(
            run_keys(&cache, "t/1\0", Some("t0"), 10).unwrap(),
            ["t/2", "t/3"],
            "after t/1"
        );
        assert_eq!(run_keys(&cache, "t/", Some("t0"), 2).unwrap(), ["t/1", "t/2"]);
        assert_eq!(run_keys(&cache, "s", Some("t0"), 10), None, "starts before the run");
        assert_eq!(run_keys(&cache, "t/", None, 10), None, "past the run's end");
        assert!(
            keys_of(cache.lookup_run(Table::Meta, b"t/", Some(b"t0"), 10)).is_none(),
            "another table"
        );
        let started = cache.commit_started();
        assert_eq!(
            run_keys(&cache, "t/", Some("t0"), 10),
            None,
            "not while a commit is in flight"
        );
        ended(
            &cache,
            started,
            [
                (Table::Backrefs, b"t/2".as_slice(), None),
                (Table::Backrefs, b"t/25".as_slice(), Some(b"v".as_slice())),
                (Table::Backrefs, b"u/1".as_slice(), Some(b"v".as_slice())),
            ],
        );
        assert_eq!(run_keys(&cache, "t/", Some("t0"), 10).unwrap(), ["t/1", "t/25", "t/3"]);
    }

    #[test]
    fn a_run_that_stopped_at_its_limit_knows_nothing_past_its_last_row() {
        let cache = ReadCache::new(1 << 20);
        let g = cache.generation();
        cache.remember_run(g, Table::Backrefs, b"t/", Some(b"t0"), 3, &rows(&["t/1", "t/2", "t/3"]));
        assert_eq!(run_keys(&cache, "t/1\0", Some("t0"), 2).unwrap(), ["t/2", "t/3"]);
        assert_eq!(run_keys(&cache, "t/1\0", Some("t0"), 3), None, "a row may follow t/3");
        assert_eq!(
            cache.lookup_run(Table::Backrefs, b"t/1\0", Some(b"t0"), 3),
            RunLookup::Short,
            "used up: the caller reads ahead"
        );
        assert_eq!(cache.lookup_run(Table::Backrefs, b"s", Some(b"t0"), 3), RunLookup::Miss);
        // A landed put past the last row is not in the run: still unknown.
        landed_in(&cache, Table::Backrefs, "t/4");
        assert_eq!(run_keys(&cache, "t/3", Some("t0"), 1).unwrap(), ["t/3"]);
        assert_eq!(run_keys(&cache, "t/3\0", Some("t0"), 1), None);
        // An open range (a table's end) is known whole only when the scan
        // found fewer rows than it asked for.
        let g = cache.generation();
        cache.remember_run(g, Table::DueIndex, b"", None, 64, &[]);
        assert_eq!(
            keys_of(cache.lookup_run(Table::DueIndex, b"", None, 64)).unwrap(),
            Vec::<String>::new()
        );
        landed_in(&cache, Table::DueIndex, "7");
        assert_eq!(
            keys_of(cache.lookup_run(Table::DueIndex, b"", None, 64)).unwrap(),
            ["7"]
        );
    }

    fn landed_in(cache: &ReadCache, table: Table, key: &str) {
        let started = cache.commit_started();
        ended(cache, started, [(table, key.as_bytes(), Some(b"v".as_slice()))]);
    }

    #[test]
    fn a_run_read_before_a_commit_or_dropped_by_a_fence_or_a_failed_commit_is_never_used() {
        let cache = ReadCache::new(1 << 20);
        let before = cache.generation();
        landed_in(&cache, Table::Backrefs, "t/2");
        cache.remember_run(before, Table::Backrefs, b"t/", Some(b"t0"), 10, &rows(&["t/1"]));
        assert_eq!(run_keys(&cache, "t/", Some("t0"), 10), None, "read before t/2 landed");
        let g = cache.generation();
        cache.remember_run(g, Table::Backrefs, b"t/", Some(b"t0"), 10, &rows(&["t/1", "t/2"]));
        assert!(run_keys(&cache, "t/", Some("t0"), 10).is_some());
        cache.clear();
        assert_eq!(run_keys(&cache, "t/", Some("t0"), 10), None, "a fence");
        let g = cache.generation();
        cache.remember_run(g, Table::Backrefs, b"t/", Some(b"t0"), 10, &rows(&["t/1", "t/2"]));
        let started = cache.commit_started();
        failed(&cache, started);
        assert_eq!(
            run_keys(&cache, "t/", Some("t0"), 10),
            None,
            "a commit that may have landed"
        );
        // A log's appends would all go into an open run: none is kept.
        let g = cache.generation();
        cache.remember_run(g, Table::Outbox, b"", None, 10, &rows(&["1"]));
        assert!(keys_of(cache.lookup_run(Table::Outbox, b"", None, 10)).is_none());
    }

    #[test]
    fn runs_are_bounded_per_table_and_in_bytes() {
        let cache = ReadCache::new(1 << 20);
        let g = cache.generation();
        cache.remember_run(g, Table::Backrefs, b"t/", Some(b"t0"), 10, &rows(&["t/1"]));
        for i in 0..=MAX_RUNS_PER_TABLE {
            let (lo, hi) = (format!("o{i}/"), format!("o{i}0"));
            cache.remember_run(g, Table::DueIndex, lo.as_bytes(), Some(hi.as_bytes()), 10, &[]);
        }
        let known = |table: Table, lo: &str, hi: &str| {
            matches!(
                cache.lookup_run(table, lo.as_bytes(), Some(hi.as_bytes()), 10),
                RunLookup::Hit(_)
            )
        };
        assert!(!known(Table::DueIndex, "o0/", "o00"), "the oldest of the table went");
        assert!(known(
            Table::DueIndex,
            &format!("o{MAX_RUNS_PER_TABLE}/"),
            &format!("o{MAX_RUNS_PER_TABLE}0")
        ));
        assert!(known(Table::Backrefs, "t/", "t0"), "another table's run stays");
        // A scan longer than a run may hold is not kept.
        let big = vec![(b"u/1".to_vec(), vec![0; MAX_RUN_BYTES as usize])];
        cache.remember_run(g, Table::Backrefs, b"u/", Some(b"u0"), 10, &big);
        assert!(!known(Table::Backrefs, "u/", "u0"));
        // A run that grows past it is dropped.
        let started = cache.commit_started();
        let value = vec![0; MAX_RUN_BYTES as usize];
        ended(
            &cache,
            started,
            [(Table::Backrefs, b"t/2".as_slice(), Some(value.as_slice()))],
        );
        assert!(!known(Table::Backrefs, "t/", "t0"));
        let state = cache.state.read().unwrap();
        assert!(state.run_bytes <= MAX_RUNS_BYTES);
        assert_eq!(state.run_bytes, state.runs.iter().map(|run| run.bytes).sum::<u64>());
    }

    #[test]
    fn runs_over_their_bytes_in_all_push_out_the_oldest() {
        let cache = ReadCache::new(1 << 20);
        let g = cache.generation();
        // Five runs just under a run's bound each hold more than all runs
        // may (four fit): the first one kept goes.
        let each = (MAX_RUN_BYTES - 1024) as usize;
        let tables = [
            Table::Backrefs,
            Table::Backrefs,
            Table::Backrefs,
            Table::DueIndex,
            Table::DueIndex,
        ];
        for (i, table) in tables.into_iter().enumerate() {
            let (lo, hi) = (format!("r{i}/"), format!("r{i}0"));
            let row = vec![(format!("r{i}/1").into_bytes(), vec![0; each])];
            cache.remember_run(g, table, lo.as_bytes(), Some(hi.as_bytes()), 10, &row);
        }
        let known = |table: Table, i: usize| {
            let (lo, hi) = (format!("r{i}/"), format!("r{i}0"));
            matches!(
                cache.lookup_run(table, lo.as_bytes(), Some(hi.as_bytes()), 10),
                RunLookup::Hit(_)
            )
        };
        assert!(!known(Table::Backrefs, 0), "the oldest run went");
        assert!(known(Table::Backrefs, 1));
        assert!(known(Table::DueIndex, 4), "the newest stays");
        let state = cache.state.read().unwrap();
        assert!(state.run_bytes <= MAX_RUNS_BYTES);
        assert!(
            state.run_bytes > MAX_RUNS_BYTES - MAX_RUN_BYTES,
            "four runs are still kept"
        );
        assert_eq!(state.run_bytes, state.runs.iter().map(|run| run.bytes).sum::<u64>());
    }
}
