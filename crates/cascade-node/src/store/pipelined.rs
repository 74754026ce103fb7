//! The writer's view of an embedded engine whose commits land on a thread
//! of their own: a group's commits are staged in memory, and its flush
//! hands them to that thread, which applies them to the engine and fsyncs
//! while the writer computes its next step ([`Store::start_flush`]).
//!
//! Why: on fjall the writer's thread spent about a quarter of a cascade in
//! the engine's commit (its memtable's skiplist) and the fsync, on one
//! core, while the machine's second core was a third idle
//! (docs/BENCHMARKS.md, "The writer's commits landed on a thread of their
//! own"). Issue 28's third lever: plan the next batch while the engine
//! commits this one.
//!
//! What the writer sees is unchanged: its reads see its staged writes
//! first (a put answers its key, a removal hides the engine's row, a scan
//! merges both, `overlay.rs`), from the commit until they landed, so the
//! group's steps are the same sequence as before. Nothing leaves the node
//! before it is durable: the writer keeps a group's replies and events
//! until [`Store::finish_flush`] says its flight landed (`writer/group.rs`,
//! as on PostgreSQL), and it finishes a flight before it commits again,
//! so one flight at most is in progress and it never races a commit.
//! Everyone else reads the engine itself, so sees a write once it landed
//! (before, they saw it once committed, before its fsync): never a write
//! the writer could still lose.
//!
//! A failure: a flight whose engine commit failed landed nothing, and its
//! staged writes are dropped (the writer answers its group the storage
//! error, `WriterState::finish_flight`); one whose fsync failed landed in
//! the engine unflushed, as a failed flush did before. A crash loses the
//! staged writes, which nobody was told of. The staged set is bounded
//! ([`MAX_PIPELINED_KEYS`], [`MAX_PIPELINED_BYTES`]): a commit that takes
//! it over applies it to the engine at once (unflushed, as every commit
//! did before), on the writer's thread.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;

use super::overlay::{merge, range_of, StagedSize};
use super::{Batch, Entry, Prefetch, ScanFloors, ScanRange, Store, StoreError, Table};

/// Keys staged at most (over every table): a commit that stages more
/// applies the staged set to the engine at once. A work step stages a few
/// thousand (its budget); a group's client steps a few each.
pub const MAX_PIPELINED_KEYS: usize = 50_000;

/// Bytes staged at most (keys, values and their map entries), as
/// [`MAX_PIPELINED_KEYS`].
pub const MAX_PIPELINED_BYTES: usize = 32 * 1024 * 1024;

/// One table's staged writes: key → value, None for a removal.
type Rows = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// The staged writes of every table: the last write of each key (a batch
/// applies in order and the last write of a key wins, so the batches in
/// order and their merge leave the same rows).
#[derive(Default, Clone)]
struct Writes([Rows; Table::ALL.len()]);

impl Writes {
    fn is_empty(&self) -> bool {
        self.0.iter().all(BTreeMap::is_empty)
    }

    /// One batch of them all, for the engine (a copy: readers see them
    /// until the engine has them).
    fn to_batch(&self) -> Batch {
        let mut batch = Batch {
            ops: Vec::with_capacity(self.0.iter().map(BTreeMap::len).sum()),
        };
        for (table, rows) in Table::ALL.iter().zip(&self.0) {
            batch
                .ops
                .extend(rows.iter().map(|(key, value)| (*table, key.clone(), value.clone())));
        }
        batch
    }
}

#[derive(Default)]
struct Staging {
    /// Shared with the flight that lands them.
    writes: Arc<Writes>,
    size: StagedSize,
    /// Commits that were applied to the engine at once (over the bounds)
    /// and failed: the next flush fails with it, so that the steps that
    /// staged them before are not told they landed.
    dropped: Option<StoreError>,
}

/// The flight [`Store::start_flush`] started.
enum Flight {
    Idle,
    Sending {
        writes: Arc<Writes>,
        landed: mpsc::Receiver<Result<(), StoreError>>,
    },
    /// It ended and its staged writes are gone; its outcome not yet
    /// reported ([`Store::finish_flush`] reports it).
    Ended(Result<(), StoreError>),
}

/// What the committer thread is asked.
enum Job {
    /// Apply these writes to the engine and fsync.
    Land {
        writes: Arc<Writes>,
        landed: mpsc::SyncSender<Result<(), StoreError>>,
        /// Runs once they landed, before the writer is told
        /// ([`Store::start_flush_then`]).
        then: Option<Box<dyn FnOnce() + Send>>,
    },
    /// Free these: thousands of keys' allocations, off the writer's thread.
    Free(Arc<Writes>),
}

struct Committer {
    jobs: mpsc::Sender<Job>,
    thread: Option<JoinHandle<()>>,
}

/// The writer's view of `inner` with pipelined commits (see the module's
/// doc). Only the writer commits and flushes through it.
pub struct PipelinedStore {
    inner: Arc<dyn Store>,
    staging: RwLock<Staging>,
    /// Keys staged now: 0 lets a read skip the lock.
    staged_keys: AtomicUsize,
    /// The floors of scans through this view, which sees staged puts the
    /// engine's own floors do not know of yet.
    floors: ScanFloors,
    flight: Mutex<Flight>,
    committer: Committer,
    bounds: (usize, usize),
    /// How long the last flight took to land, in µs (0: none has yet).
    last_landing_us: Arc<AtomicU64>,
}

impl PipelinedStore {
    /// `inner`'s writer's view, with a thread of its own (`cascade-commit`)
    /// to land its flushes.
    pub fn new(inner: Arc<dyn Store>) -> Result<Self, StoreError> {
        Self::with_bounds(inner, MAX_PIPELINED_KEYS, MAX_PIPELINED_BYTES)
    }

    fn with_bounds(inner: Arc<dyn Store>, keys: usize, bytes: usize) -> Result<Self, StoreError> {
        let (jobs, received) = mpsc::channel();
        let engine = inner.clone();
        let last_landing_us = Arc::new(AtomicU64::new(0));
        let landings = last_landing_us.clone();
        let thread = std::thread::Builder::new()
            .name("cascade-commit".into())
            .spawn(move || land_flights(engine.as_ref(), received, &landings))
            .map_err(|e| StoreError::Engine(format!("cannot start the commit thread: {e}")))?;
        Ok(Self {
            inner,
            staging: RwLock::default(),
            staged_keys: AtomicUsize::new(0),
            floors: ScanFloors::default(),
            flight: Mutex::new(Flight::Idle),
            committer: Committer {
                jobs,
                thread: Some(thread),
            },
            bounds: (keys, bytes),
            last_landing_us,
        })
    }

    fn staging(&self) -> RwLockReadGuard<'_, Staging> {
        self.staging.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn staging_mut(&self) -> RwLockWriteGuard<'_, Staging> {
        self.staging.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn flight(&self) -> MutexGuard<'_, Flight> {
        self.flight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn nothing_staged(&self) -> bool {
        self.staged_keys.load(Ordering::Acquire) == 0
    }

    /// A staged write of `key`: Some(value), Some(None) for a removal;
    /// None when the key is not staged.
    fn staged(&self, table: Table, key: &[u8]) -> Option<Option<Vec<u8>>> {
        if self.nothing_staged() {
            return None;
        }
        self.staging().writes.0[table.index()].get(key).cloned()
    }

    /// Hands `writes` to the committer to free (or frees them here if it
    /// is gone).
    fn free(&self, writes: Arc<Writes>) {
        if Arc::strong_count(&writes) == 1 && !writes.is_empty() {
            let _ = self.committer.jobs.send(Job::Free(writes));
        }
    }

    /// Waits for the flight in progress, if any, and drops its staged
    /// writes (landed: the engine has them; failed: nothing of them is
    /// known). Its outcome stays for [`Store::finish_flush`].
    fn settle_flight(&self) {
        let mut flight = self.flight();
        let Flight::Sending { writes, landed } = std::mem::replace(&mut *flight, Flight::Idle) else {
            return;
        };
        let outcome = landed.recv().unwrap_or_else(|_| {
            Err(StoreError::Engine(
                "the commit thread stopped before it answered a flush".into(),
            ))
        });
        let staged = {
            let mut staging = self.staging_mut();
            if Arc::ptr_eq(&staging.writes, &writes) {
                let staged = std::mem::take(&mut staging.writes);
                staging.size = StagedSize::default();
                self.staged_keys.store(0, Ordering::Release);
                Some(staged)
            } else {
                None
            }
        };
        if outcome.is_err() {
            // A removal it staged may be undone: a floor raised past the
            // removed key would hide it.
            self.floors.forget();
        }
        *flight = Flight::Ended(outcome);
        drop(flight);
        drop(writes);
        if let Some(staged) = staged {
            self.free(staged);
        }
    }

    /// Settles the flight, and takes its outcome if not reported yet.
    fn take_ended(&self) -> Result<(), StoreError> {
        self.settle_flight();
        let mut flight = self.flight();
        match std::mem::replace(&mut *flight, Flight::Idle) {
            Flight::Ended(outcome) => outcome,
            // Only the writer starts flights: none started since.
            other => {
                *flight = other;
                Ok(())
            }
        }
    }

    /// A failure of an earlier commit's landing not reported yet.
    fn take_dropped(&self) -> Result<(), StoreError> {
        match self.staging_mut().dropped.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Starts a flight of everything staged (and an fsync), after the one
    /// before it was settled; `then` runs once it landed.
    fn send_flight(&self, then: Option<Box<dyn FnOnce() + Send>>) -> Result<(), StoreError> {
        self.take_ended()?;
        self.take_dropped()?;
        let writes = self.staging().writes.clone();
        let (landed, outcome) = mpsc::sync_channel(1);
        let job = Job::Land {
            writes: writes.clone(),
            landed,
            then,
        };
        if self.committer.jobs.send(job).is_err() {
            // The thread is gone (it never panics on an engine's error):
            // land here, as a flush.
            drop(writes);
            self.land_staged()?;
            return self.inner.flush();
        }
        *self.flight() = Flight::Sending {
            writes,
            landed: outcome,
        };
        Ok(())
    }

    /// Applies the staged writes to the engine here and now (unflushed),
    /// and forgets them: landed, the engine answers them; failed, nothing
    /// of them is known.
    fn land_staged(&self) -> Result<(), StoreError> {
        let staged = {
            let mut staging = self.staging_mut();
            if staging.writes.is_empty() {
                return Ok(());
            }
            let batch = staging.writes.to_batch();
            let landed = self.inner.commit(batch);
            let staged = std::mem::take(&mut staging.writes);
            staging.size = StagedSize::default();
            self.staged_keys.store(0, Ordering::Release);
            if let Err(e) = &landed {
                staging.dropped = Some(e.clone());
                self.floors.forget();
            }
            landed.map(|()| staged)
        };
        self.free(staged?);
        Ok(())
    }
}

/// The committer thread: lands each flight's writes and fsyncs, until the
/// store is dropped; notes in `last_landing_us` how long each took.
fn land_flights(engine: &dyn Store, jobs: mpsc::Receiver<Job>, last_landing_us: &AtomicU64) {
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Land { writes, landed, then } => {
                let started = crate::clock::monotonic_now();
                let outcome = if writes.is_empty() {
                    Ok(())
                } else {
                    engine.commit(writes.to_batch())
                };
                let outcome = outcome.and_then(|()| engine.flush());
                let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                last_landing_us.store(took.max(1), Ordering::Release);
                drop(writes);
                if let (Ok(()), Some(then)) = (&outcome, then) {
                    then();
                }
                // The writer may have stopped waiting (dropped): nothing to tell.
                let _ = landed.send(outcome);
            }
            Job::Free(writes) => drop(writes),
        }
    }
}

impl Drop for PipelinedStore {
    fn drop(&mut self) {
        // The thread holds the engine: joined, so that the engine is closed
        // when its last handle goes (a restart in place opens it again).
        let (closed, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.committer.jobs, closed));
        if let Some(thread) = self.committer.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Store for PipelinedStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.staged(table, key) {
            Some(staged) => Ok(staged),
            None => self.inner.get(table, key),
        }
    }

    fn get_in(&self, table: Table, key: &[u8], read: &mut dyn FnMut(&[u8])) -> Result<(), StoreError> {
        if !self.nothing_staged() {
            let staging = self.staging();
            match staging.writes.0[table.index()].get(key) {
                Some(Some(value)) => {
                    read(value);
                    return Ok(());
                }
                Some(None) => return Ok(()),
                None => {}
            }
        }
        self.inner.get_in(table, key, read)
    }

    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if self.nothing_staged() {
            return self.inner.get_many(table, keys);
        }
        let mut values: Vec<Option<Option<Vec<u8>>>> = keys.iter().map(|key| self.staged(table, key)).collect();
        let unknown: Vec<Vec<u8>> = keys
            .iter()
            .zip(&values)
            .filter(|(_, staged)| staged.is_none())
            .map(|(key, _)| key.clone())
            .collect();
        let mut read = self.inner.get_many(table, &unknown)?.into_iter();
        for value in &mut values {
            if value.is_none() {
                *value = Some(read.next().flatten());
            }
        }
        Ok(values.into_iter().map(Option::flatten).collect())
    }

    fn prefetch(&self, reads: &Prefetch) -> Result<(), StoreError> {
        self.inner.prefetch(reads)
    }

    fn prefetches(&self) -> bool {
        self.inner.prefetches()
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let staged = match ScanRange::new(prefix, after) {
            Some(range) if limit > 0 && !self.nothing_staged() => {
                range_of(&self.staging().writes.0[table.index()], range.bounds(), limit)
            }
            _ => Vec::new(),
        };
        if staged.is_empty() {
            return self.inner.scan(table, prefix, after, limit);
        }
        // Each staged removal may hide one of the engine's rows.
        let asked = limit.saturating_add(staged.iter().filter(|(_, value)| value.is_none()).count());
        let rows = self.inner.scan(table, prefix, after, asked)?;
        Ok(merge(rows, staged, asked, limit))
    }

    fn scan_in(
        &self,
        table: Table,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        read: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), StoreError> {
        let none_in_range = self.nothing_staged()
            || ScanRange::new(prefix, after).is_none_or(|range| {
                self.staging().writes.0[table.index()]
                    .range::<[u8], _>(range.bounds())
                    .next()
                    .is_none()
            });
        if none_in_range {
            return self.inner.scan_in(table, prefix, after, limit, read);
        }
        for (key, value) in self.scan(table, prefix, after, limit)? {
            read(&key, &value);
        }
        Ok(())
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        // The writer finishes a flight before it commits: this keeps the
        // staged set one flight's at most if a caller did not.
        self.settle_flight();
        self.floors.before_commit(&batch);
        let over = {
            let mut staging = self.staging_mut();
            let Staging { writes, size, .. } = &mut *staging;
            // Shared only with a flight, and none is in progress: no copy.
            let writes = Arc::make_mut(writes);
            for (table, key, value) in batch.ops {
                size.stage(&mut writes.0[table.index()], key, value);
            }
            self.staged_keys.store(size.keys, Ordering::Release);
            size.keys > self.bounds.0 || size.bytes > self.bounds.1
        };
        // Readers of this view see the batch now.
        self.floors.landed();
        if over {
            return self.land_staged();
        }
        Ok(())
    }

    fn land(&self) -> Result<(), StoreError> {
        self.settle_flight();
        self.land_staged()
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.take_ended()?;
        self.take_dropped()?;
        self.land_staged()?;
        self.inner.flush()
    }

    fn start_flush(&self) -> Result<(), StoreError> {
        self.send_flight(None)
    }

    fn start_flush_then(&self, landed: Box<dyn FnOnce() + Send>) -> Result<(), StoreError> {
        self.send_flight(Some(landed))
    }

    fn finish_flush(&self) -> Result<(), StoreError> {
        self.take_ended()
    }

    fn overlaps_flushes(&self) -> bool {
        true
    }

    fn last_landing(&self) -> Option<std::time::Duration> {
        match self.last_landing_us.load(Ordering::Acquire) {
            0 => None,
            us => Some(std::time::Duration::from_micros(us)),
        }
    }

    fn waits_on_io(&self) -> bool {
        self.inner.waits_on_io()
    }

    fn reopen(&self) -> Result<(), StoreError> {
        self.settle_flight();
        // The engine may hold a batch whose commit reported an error.
        self.floors.forget();
        self.inner.reopen()
    }

    fn scan_floors(&self) -> Option<&ScanFloors> {
        Some(&self.floors)
    }
}

#[cfg(test)]
mod tests;
