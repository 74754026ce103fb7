//! The sled engine: one tree per table, and a batch made atomic by a
//! journal of our own instead of sled's transactions.
//!
//! Why not sled's: a sled transaction (and `Tree::apply_batch`) takes a
//! process-wide write lock for its whole length, and once one has run,
//! every read of every tree takes that lock shared. The writer's reads
//! then waited for each flight its commit thread was landing
//! (`pipelined.rs`), so the two threads took turns: in P1 flat at 1M the
//! writer used 18 s of CPU and the commit thread 22 s in a 46 s cascade
//! (docs/BENCHMARKS.md, "sled: the writer's reads no longer wait for a
//! landing batch").
//!
//! How a batch stays atomic without it:
//! - **After a crash:** the batch is first written whole as one journal
//!   entry (one insert, which sled makes atomic), then applied key by key,
//!   then the entry is removed. sled recovers its log in order and stops
//!   at the first write it lacks, so whatever part of the batch survived a
//!   crash, its journal entry did too, and the open finishes the batch
//!   from it ([`finish_an_interrupted_batch`]).
//! - **For readers:** a commit holds [`SledStore`]'s batch lock for
//!   writing, and every read takes it shared, so a read sees all of a
//!   batch or none of it, as under sled's lock. The one exception is the
//!   pipelined writer's own handle ([`Store::for_pipelined_writer`]): its
//!   view answers every key of a landing batch from its staged set, so its
//!   reads of the engine need not wait, and do not.
//!
//! After a failed write sled keeps the error for good (its `global_error`:
//! every later write *and read* answers it, also once the disk has room
//! again), so healing is a reopen: the handles live behind a lock and
//! [`Store::reopen`] replaces them with a fresh open of the directory.

use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

mod journal;

use super::reopen::{EngineHandles, Reopenable};
use super::{from_io, Batch, Entry, ScanFloors, ScanRange, Store, StoreError, Table};

pub struct SledStore {
    engine: Arc<Reopenable<Handles>>,
    /// Held for writing by a commit while it applies its batch, shared by
    /// a read: a read sees a batch whole or not at all (see the module's
    /// doc). Shared by every handle on the same open store.
    batches: Arc<RwLock<()>>,
    /// False only on the pipelined writer's handle, whose reads do not
    /// take [`SledStore::batches`].
    reads_wait_for_batches: bool,
}

struct Handles {
    /// Kept so `flush` covers every tree.
    db: sled::Db,
    /// Indexed by `Table::index`.
    trees: Vec<sled::Tree>,
    /// The batch being applied, whole, under [`JOURNAL_KEY`]: none
    /// between two commits.
    journal: sled::Tree,
}

/// The journal's tree. Not a table's name (`Table::name`), and kept out of
/// `Table::ALL`, so nothing but a commit and an open ever reads it.
const JOURNAL_TREE: &str = "batch_journal";

/// The journal's one key: commits are one at a time (the batch lock), so
/// at most one batch is ever being applied.
const JOURNAL_KEY: &[u8] = b"batch";

/// A sled error, with what was being done: a full disk or a read-only file
/// system may clear ([`StoreError::Unavailable`]), anything else not.
fn engine(doing: &str, e: sled::Error) -> StoreError {
    match &e {
        sled::Error::Io(io) => from_io(io, format!("sled: {doing}: {e}")),
        _ => StoreError::Engine(format!("sled: {doing}: {e}")),
    }
}

impl EngineHandles for Handles {
    const ENGINE: &'static str = "sled";

    fn open(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        let db = open_waiting_for_the_lock(dir, cache_bytes)
            .map_err(|e| engine(&format!("cannot open the database at {}", dir.display()), e))?;
        let trees = Table::ALL
            .iter()
            .map(|t| {
                db.open_tree(t.name())
                    .map_err(|e| engine(&format!("cannot open tree {}", t.name()), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let journal = db
            .open_tree(JOURNAL_TREE)
            .map_err(|e| engine(&format!("cannot open tree {JOURNAL_TREE}"), e))?;
        let handles = Self { db, trees, journal };
        finish_an_interrupted_batch(&handles)?;
        Ok(handles)
    }

    /// Each tree's drop tries a flush, which fails at once on the kept
    /// error, and logs it: 17 error lines of the failure the writer has
    /// logged already and reopens for. They are not sent to the node's log
    /// (a dispatcher that drops them, for this drop on this thread only).
    fn close(self) {
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || drop(self));
    }
}

/// How many times, [`LOCK_RETRY_PAUSE`] apart, an open retries a lock that
/// the directory's previous handles still hold: 2 s in all.
const LOCK_RETRIES: u32 = 100;
const LOCK_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// Opens the database, waiting a bounded while for its file lock.
///
/// Dropping the last `Db` does not release the lock at once: sled's
/// background threads hold the file a moment longer. A reopen in the same
/// process (healing after a full disk, a node restarted in a test) would
/// then fail at random with "could not acquire lock" (sled's own test build
/// blocks on the lock for this reason). A lock held by another process
/// still fails, after the bounded wait, with sled's error.
fn open_waiting_for_the_lock(dir: &Path, cache_bytes: u64) -> sled::Result<sled::Db> {
    let config = sled::Config::new().path(dir).cache_capacity(cache_bytes);
    let mut retries = 0;
    loop {
        match config.open() {
            Err(e) if retries < LOCK_RETRIES && is_lock_contention(&e) => {
                retries += 1;
                std::thread::sleep(LOCK_RETRY_PAUSE);
            }
            result => return result,
        }
    }
}

/// sled reports a held lock only in its message (an `Other` I/O error).
fn is_lock_contention(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

impl Handles {
    fn tree(&self, table: Table) -> &sled::Tree {
        &self.trees[table.index()]
    }

    /// Applies `ops` key by key, in order.
    fn apply(&self, ops: &[journal::Write]) -> Result<(), StoreError> {
        for (table, key, value) in ops {
            let tree = self.tree(*table);
            match value {
                Some(value) => tree.insert(key.as_slice(), value.as_slice()).map(drop),
                None => tree.remove(key.as_slice()).map(drop),
            }
            .map_err(|e| engine(&format!("commit of a batch to {}", table.name()), e))?;
        }
        Ok(())
    }

    /// Journals `batch`, applies it, and clears the journal.
    fn commit_journaled(&self, batch: &Batch) -> Result<(), StoreError> {
        self.journal
            .insert(JOURNAL_KEY, journal::encode(&batch.ops))
            .map_err(|e| engine("journal of a batch", e))?;
        self.apply(&batch.ops)?;
        self.journal
            .remove(JOURNAL_KEY)
            .map_err(|e| engine("journal of a batch", e))?;
        Ok(())
    }
}

/// Applies the batch a crash interrupted, if the journal holds one, and
/// clears it (see the module's doc): run by every open, before anyone
/// reads. Applying it again is harmless when part or all of it had landed:
/// each write sets its key's last value.
fn finish_an_interrupted_batch(handles: &Handles) -> Result<(), StoreError> {
    let Some(entry) = handles
        .journal
        .get(JOURNAL_KEY)
        .map_err(|e| engine("read of the batch journal", e))?
    else {
        return Ok(());
    };
    let ops = journal::decode(&entry)?;
    handles.apply(&ops)?;
    handles
        .journal
        .remove(JOURNAL_KEY)
        .map_err(|e| engine("journal of a batch", e))?;
    handles.db.flush().map_err(|e| engine("flush", e))?;
    tracing::warn!(
        writes = ops.len(),
        "sled: finished the batch a crash had interrupted, from its journal"
    );
    Ok(())
}

impl SledStore {
    /// Opens (or creates) the database in `dir`, with the default cache.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(dir, super::DEFAULT_CACHE_BYTES)
    }

    /// Opens it with a page cache of `cache_bytes` (sled's own default is
    /// 1 GiB, which a node's resident memory then grows to under load).
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        Ok(Self {
            engine: Arc::new(Reopenable::open(dir, cache_bytes)?),
            batches: Arc::default(),
            reads_wait_for_batches: true,
        })
    }

    fn with<R>(&self, f: impl FnOnce(&Handles) -> Result<R, StoreError>) -> Result<R, StoreError> {
        self.engine.with(f)
    }

    /// Shares the batch lock for a read, unless this is the pipelined
    /// writer's handle.
    fn reading(&self) -> Option<RwLockReadGuard<'_, ()>> {
        self.reads_wait_for_batches
            .then(|| self.batches.read().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Store for SledStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let _whole_batches = self.reading();
        self.with(|h| {
            Ok(h.tree(table)
                .get(key)
                .map_err(|e| engine(&format!("get from {}", table.name()), e))?
                .map(|v| v.to_vec()))
        })
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        // A page is bounded by `limit`: a commit waits for one page at most.
        let _whole_batches = self.reading();
        self.with(|h| {
            let tree = h.tree(table);
            let Some(range) = ScanRange::new(prefix, after) else {
                return Ok(Vec::new());
            };
            let iter = tree.range::<&[u8], _>(range.bounds());
            let mut out = Vec::new();
            for item in iter {
                let (k, v) = item.map_err(|e| engine(&format!("scan of {}", table.name()), e))?;
                if !k.starts_with(prefix) || out.len() >= limit {
                    break;
                }
                out.push((k.to_vec(), v.to_vec()));
            }
            Ok(out)
        })
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let _applying = self.batches.write().unwrap_or_else(PoisonError::into_inner);
        self.engine.commit(&batch, |h| h.commit_journaled(&batch))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.with(|h| h.db.flush().map(|_| ()).map_err(|e| engine("flush", e)))
    }

    fn reopen(&self) -> Result<(), StoreError> {
        self.engine.reopen()
    }

    fn scan_floors(&self) -> Option<&ScanFloors> {
        Some(self.engine.floors())
    }

    fn for_pipelined_writer(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(SledStore {
            engine: self.engine.clone(),
            batches: self.batches.clone(),
            reads_wait_for_batches: false,
        }))
    }
}

#[cfg(test)]
mod tests;
