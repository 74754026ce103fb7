//! Batches committed and not yet flushed: staged in memory, in order,
//! and sent together by the next flush, in one fenced transaction
//! (`mod.rs`, `flush_at`).
//!
//! Why: the writer commits each step of a group (a work step and the
//! client steps that joined it, `writer/group.rs`) and flushes once for
//! the group. On an embedded engine a commit is cheap and the flush is the
//! fsync; here a commit was the whole transaction, a round trip on the
//! writer's thread, so a group of k steps cost k of them (a P1 of 1M
//! on postgres spent 38–45 % of its wall in commits, about 15k of them
//! for its concurrent creates and deletes alone). Staged, the group costs
//! one.
//!
//! What is staged is the batches' net effect: the last write of each key,
//! per table (a batch applies in order and the last write of a key wins,
//! so the batches in order and their merge leave the same rows). The
//! flush plans that merge against the read cache, which knows only what
//! the server holds (staged writes enter it when they land), so its plan
//! (which keys are absent, `commit.rs`) is right for the server before the
//! transaction: one DELETE, INSERT and upsert per table for the whole
//! group instead of one of each per step.
//!
//! The store's reads see the staged writes first: a staged put answers its
//! key, a staged removal answers absent though the server still has the
//! row, and a scan merges the server's rows with the staged writes in its
//! range. They stay visible while their flush is in flight (a reader never
//! sees a write, then not, then again) and are dropped once it ended:
//! landed (the cache has them then) or failed (then nothing of them is
//! known). A flush takes what is staged whole; commits made while it is
//! in flight are staged on top of it, in a layer of their own read first
//! (a later write of a key wins, as in one set), and go with it if it
//! fails (`flush.rs`).
//!
//! The staged set belongs to one epoch of the writer lease: a fence at
//! another epoch drops it (a writer that lost its turn never lands it, and
//! the next one must not read it), and the next flush of that epoch (or a
//! flush of the store itself) says so. It is bounded ([`MAX_STAGED_KEYS`],
//! [`MAX_STAGED_BYTES`]): a commit that takes it over either sends it at
//! once.

use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use super::commit::Collapsed;
use crate::store::overlay::{StagedSize, StagedWrite};
use crate::store::{Batch, StoreError, Table};

/// Keys staged at most (over every table): a commit that stages more
/// sends everything staged at once. A work step of a P1 stages a few
/// thousand; a group's client steps a few each.
pub const MAX_STAGED_KEYS: usize = 50_000;

/// Bytes staged at most (keys, values and their map entries), as
/// [`MAX_STAGED_KEYS`]: the transaction that sends them stays well inside
/// the writer session's `statement_timeout`.
pub const MAX_STAGED_BYTES: usize = 32 * 1024 * 1024;

/// The bounds of a staged set (the constants above; smaller in tests).
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub(super) keys: usize,
    pub(super) bytes: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            keys: MAX_STAGED_KEYS,
            bytes: MAX_STAGED_BYTES,
        }
    }
}

/// The staged writes, shared by the writer that stages and flushes them
/// and the readers that see them.
pub(super) struct Staged {
    state: RwLock<State>,
    /// Keys staged now: 0 lets a read skip the lock (the usual case for
    /// a cascade's reads, which come after the last group's flush).
    keys: AtomicUsize,
}

#[derive(Default)]
struct State {
    /// The epoch the store is fenced at: only its commits are staged.
    epoch: Option<u64>,
    /// Commits staged since the last flush took what was staged.
    writes: Arc<Collapsed>,
    size: StagedSize,
    /// Commits staged since the last flush.
    batches: usize,
    /// What the flush in progress sends (it reports their fate itself),
    /// shared with it (the statements borrow from it until its
    /// transaction ended), and its keys: read after `writes`, which are
    /// staged on top of it (`flush.rs`), until it ended.
    flying: Option<(Arc<Collapsed>, usize)>,
    /// Commits of `epoch` (the first) that were staged and dropped before
    /// any flush could send them: the next flush of that epoch fails with
    /// this error (they did not land), and so does the store's own flush.
    dropped: Option<(u64, StoreError)>,
    bounds: Bounds,
}

impl State {
    /// Nothing staged on top of the flush in progress (if any).
    fn clear(&mut self) {
        self.writes = Arc::default();
        self.size = StagedSize::default();
        self.batches = 0;
    }

    /// The flush of `sent` ended: its writes leave (a fence may have
    /// dropped them already).
    fn end_flying(&mut self, sent: &Taken) {
        if self
            .flying
            .as_ref()
            .is_some_and(|(writes, _)| Arc::ptr_eq(writes, &sent.writes))
        {
            self.flying = None;
        }
    }

    /// Keys staged and flying: what a reader may find here.
    fn keys(&self) -> usize {
        self.size.keys + self.flying.as_ref().map_or(0, |(_, keys)| *keys)
    }

    /// The staged write of `key`: the later layer's, then the flying one's.
    fn get(&self, table: Table, key: &[u8]) -> Option<&Option<Vec<u8>>> {
        let flying = || self.flying.as_ref()?.0.get(&table)?.get(key);
        self.writes.get(&table).and_then(|rows| rows.get(key)).or_else(flying)
    }
}

/// What a flush takes to send.
pub(super) struct Taken {
    pub(super) writes: Arc<Collapsed>,
    pub(super) epoch: u64,
    /// How many commits it holds.
    pub(super) batches: usize,
}

impl Staged {
    pub(super) fn new() -> Self {
        Self {
            state: RwLock::default(),
            keys: AtomicUsize::new(0),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn nothing_staged(&self) -> bool {
        self.keys.load(Ordering::Acquire) == 0
    }

    /// A staged write of `key`: Some(value), or Some(None) for a removal;
    /// None when the key is not staged.
    pub(super) fn get(&self, table: Table, key: &[u8]) -> Option<Option<Vec<u8>>> {
        if self.nothing_staged() {
            return None;
        }
        self.read().get(table, key).cloned()
    }

    /// Whether `key` is staged (its reads are answered here).
    pub(super) fn holds(&self, table: Table, key: &[u8]) -> bool {
        !self.nothing_staged() && self.read().get(table, key).is_some()
    }

    /// The staged writes of `table` from `start` (inclusive) to `end`
    /// (exclusive; None: the table's end), in key order, up to and
    /// including the `puts`-th put: a scan of at most `puts` rows needs
    /// no staged write after it.
    pub(super) fn range(&self, table: Table, start: &[u8], end: Option<&[u8]>, puts: usize) -> Vec<StagedWrite> {
        // An `after` at or past the prefix's end leaves an empty range
        // (which `BTreeMap::range` refuses).
        if self.nothing_staged() || end.is_some_and(|end| start >= end) {
            return Vec::new();
        }
        let state = self.read();
        let bounds = (Bound::Included(start), end.map_or(Bound::Unbounded, Bound::Excluded));
        let top = state.writes.get(&table);
        let flying = state.flying.as_ref().and_then(|(writes, _)| writes.get(&table));
        match (top, flying) {
            (None, None) => Vec::new(),
            (Some(rows), None) | (None, Some(rows)) => crate::store::overlay::range_of(rows, bounds, puts),
            (Some(top), Some(below)) => crate::store::overlay::range_of_layers(top, below, bounds, puts),
        }
    }

    /// Stages `batch` at `epoch` (the epoch its caller checked, which
    /// must still be the store's). Returns whether the staged set is now
    /// over its bounds (and must be sent at once).
    pub(super) fn stage(&self, epoch: u64, batch: Batch) -> Result<bool, StoreError> {
        let mut state = self.write();
        match state.epoch {
            Some(current) if current == epoch => {}
            // Fenced at another epoch since the caller looked.
            Some(current) => return Err(StoreError::Fenced { held: epoch, current }),
            None => return Err(StoreError::NotFenced),
        }
        let State { writes, size, .. } = &mut *state;
        // Never shared here: a flush takes it whole (`take`), and a
        // commit never stages while a flush plans (the commit lock).
        let writes = Arc::make_mut(writes);
        for (table, key, value) in batch.ops {
            size.stage(writes.entry(table).or_default(), key, value);
        }
        state.batches += 1;
        self.keys.store(state.keys(), Ordering::Release);
        Ok(state.size.keys > state.bounds.keys || state.size.bytes > state.bounds.bytes)
    }

    /// What a flush of `expected`'s epoch (None: the store's flush, any
    /// epoch) sends: None when nothing is staged. An error when the
    /// commits it must answer for were dropped, or belong to another
    /// epoch.
    pub(super) fn take(&self, expected: Option<u64>) -> Result<Option<Taken>, StoreError> {
        let mut state = self.write();
        if let Some((dropped_at, _)) = &state.dropped {
            if expected.is_none_or(|held| held == *dropped_at) {
                let dropped_at = *dropped_at;
                let (_, e) = state.dropped.take().expect("checked above");
                // A failed flush lands nothing it answers for: the commits
                // staged since go too (their steps are answered this error).
                // Only at that epoch: after a takeover, the flush of an
                // older epoch's step (a `Node` whose stop timed out) must
                // not wipe what the new epoch's writer staged.
                if state.epoch == Some(dropped_at) {
                    state.clear();
                    self.keys.store(state.keys(), Ordering::Release);
                }
                return Err(e);
            }
        }
        let Some(epoch) = state.epoch else {
            return match expected {
                // Never fenced: nothing was ever staged.
                None => Ok(None),
                Some(_) => Err(StoreError::NotFenced),
            };
        };
        if let Some(held) = expected.filter(|held| *held != epoch) {
            return Err(StoreError::Fenced { held, current: epoch });
        }
        if state.writes.is_empty() {
            return Ok(None);
        }
        // One flush at a time (`flush.rs`): a flush that started ended
        // (`sent`, `flight_failed`) before the next takes anything.
        debug_assert!(state.flying.is_none(), "a flush took the staged set during another");
        let writes = std::mem::take(&mut state.writes);
        let batches = std::mem::take(&mut state.batches);
        let size = std::mem::take(&mut state.size);
        state.flying = Some((writes.clone(), size.keys));
        Ok(Some(Taken { writes, epoch, batches }))
    }

    /// The flush of `sent` ended (landed, or failed: either way the
    /// staged writes go); `dropped`: the commits of an earlier call it
    /// sent did not land, and nobody was told yet (a send at a commit,
    /// for going over the bounds).
    pub(super) fn sent(&self, sent: &Taken, dropped: Option<StoreError>) {
        let mut state = self.write();
        state.end_flying(sent);
        if let Some(e) = dropped.filter(|_| state.epoch == Some(sent.epoch)) {
            state.dropped = Some((sent.epoch, e));
        }
        self.keys.store(state.keys(), Ordering::Release);
    }

    /// The flight of `sent` failed (`flush.rs`): its writes go, and so do
    /// the commits staged on top of it since it started, which may rest
    /// on them: the next flush of that epoch fails with `e` (a copy).
    pub(super) fn flight_failed(&self, sent: &Taken, e: &StoreError) {
        let mut state = self.write();
        state.end_flying(sent);
        if state.epoch == Some(sent.epoch) && !state.writes.is_empty() {
            state.clear();
            // A report owed to an older epoch's writer (a fence's) gives
            // way: that writer's flush is refused as fenced anyway, and
            // this epoch's must not find the commits gone without a word.
            if state.dropped.as_ref().is_none_or(|(at, _)| *at != sent.epoch) {
                state.dropped = Some((sent.epoch, copy_of(e)));
            }
        }
        self.keys.store(state.keys(), Ordering::Release);
    }

    /// The store was fenced at `epoch`: writes staged at another epoch
    /// are dropped (and the next flush of theirs says so), and only
    /// commits of `epoch` are staged from now on.
    pub(super) fn fenced(&self, epoch: u64) {
        let mut state = self.write();
        let Some(previous) = state.epoch.replace(epoch).filter(|previous| *previous != epoch) else {
            return;
        };
        // The flush in progress reports its own fate; what is staged on
        // top of it is told here.
        state.flying = None;
        if !state.writes.is_empty() {
            state.dropped = Some((
                previous,
                StoreError::Fenced {
                    held: previous,
                    current: epoch,
                },
            ));
        }
        state.clear();
        self.keys.store(0, Ordering::Release);
    }

    #[cfg(test)]
    pub(super) fn set_bounds(&self, bounds: Bounds) {
        self.write().bounds = bounds;
    }
}

/// A copy of `e`, for the flush that must report it again (a store error
/// holds no handle, only what it says).
pub(super) fn copy_of(e: &StoreError) -> StoreError {
    match e {
        StoreError::Engine(message) => StoreError::Engine(message.clone()),
        StoreError::Unavailable { condition, message } => StoreError::Unavailable {
            condition: *condition,
            message: message.clone(),
        },
        StoreError::Corrupt { table, message } => StoreError::Corrupt {
            table,
            message: message.clone(),
        },
        StoreError::WrongEngine { dir, found, configured } => StoreError::WrongEngine {
            dir: dir.clone(),
            found: *found,
            configured: *configured,
        },
        StoreError::Fenced { held, current } => StoreError::Fenced {
            held: *held,
            current: *current,
        },
        StoreError::CommitOutcomeUnknown(message) => StoreError::CommitOutcomeUnknown(message.clone()),
        StoreError::NotFenced => StoreError::NotFenced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_set_answers_its_keys_and_is_bounded() {
        let set = Staged::new();
        let mut batch = Batch::default();
        batch.put(Table::Meta, b"k".to_vec(), b"v".to_vec());
        assert!(matches!(set.stage(1, Batch::default()), Err(StoreError::NotFenced)));
        set.fenced(1);
        set.set_bounds(Bounds {
            keys: 2,
            bytes: 1 << 20,
        });
        assert!(!set.stage(1, batch).unwrap());
        let mut batch = Batch::default();
        batch.remove(Table::Meta, b"gone".to_vec());
        batch.put(Table::Meta, b"k".to_vec(), b"w".to_vec());
        assert!(!set.stage(1, batch).unwrap(), "two keys: at its bound, not over");
        assert_eq!(set.get(Table::Meta, b"k"), Some(Some(b"w".to_vec())));
        assert_eq!(set.get(Table::Meta, b"gone"), Some(None));
        assert_eq!(set.get(Table::Meta, b"other"), None);
        assert_eq!(set.get(Table::Outbox, b"k"), None);
        let mut batch = Batch::default();
        batch.put(Table::Outbox, b"k".to_vec(), b"e".to_vec());
        assert!(set.stage(1, batch).unwrap(), "three keys: over");
        assert!(matches!(
            set.stage(2, Batch::default()),
            Err(StoreError::Fenced { held: 2, current: 1 })
        ));
    }

    #[test]
    fn a_fence_at_another_epoch_drops_what_is_staged_and_its_flush_says_so() {
        let set = Staged::new();
        set.fenced(1);
        let mut batch = Batch::default();
        batch.put(Table::Meta, b"k".to_vec(), b"v".to_vec());
        set.stage(1, batch).unwrap();
        set.fenced(2);
        assert_eq!(set.get(Table::Meta, b"k"), None);
        assert!(
            matches!(set.take(Some(2)), Ok(None)),
            "the new epoch has nothing staged, and lost nothing"
        );
        assert!(matches!(
            set.take(Some(1)),
            Err(StoreError::Fenced { held: 1, current: 2 })
        ));
        set.fenced(3);
        assert!(matches!(set.take(None), Ok(None)), "nothing was staged at 2");
    }
}
