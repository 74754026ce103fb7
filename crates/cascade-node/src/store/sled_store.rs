//! The sled engine: one tree per table, batches applied in one multi-tree
//! transaction.
//!
//! After a failed write sled keeps the error for good (its `global_error`:
//! every later write *and read* answers it, also once the disk has room
//! again), so healing is a reopen: the handles live behind a lock and
//! [`Store::reopen`] replaces them with a fresh open of the directory.

use std::path::Path;

use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

use super::reopen::{EngineHandles, Reopenable};
use super::{from_io, Batch, Entry, ScanFloors, ScanRange, Store, StoreError, Table};

pub struct SledStore(Reopenable<Handles>);

struct Handles {
    /// Kept so `flush` covers every tree.
    db: sled::Db,
    /// Indexed by `Table::index`.
    trees: Vec<sled::Tree>,
}

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
        Ok(Self { db, trees })
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
}

impl SledStore {
    /// Opens (or creates) the database in `dir`, with the default cache.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(dir, super::DEFAULT_CACHE_BYTES)
    }

    /// Opens it with a page cache of `cache_bytes` (sled's own default is
    /// 1 GiB, which a node's resident memory then grows to under load).
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        Reopenable::open(dir, cache_bytes).map(Self)
    }

    fn with<R>(&self, f: impl FnOnce(&Handles) -> Result<R, StoreError>) -> Result<R, StoreError> {
        self.0.with(f)
    }
}

impl Store for SledStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.with(|h| {
            Ok(h.tree(table)
                .get(key)
                .map_err(|e| engine(&format!("get from {}", table.name()), e))?
                .map(|v| v.to_vec()))
        })
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
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
        let mut per_tree: Vec<sled::Batch> = (0..Table::ALL.len()).map(|_| sled::Batch::default()).collect();
        let mut touched = [false; Table::ALL.len()];
        // Before the batch is taken apart: its puts lower the scan floors.
        let floors = self.0.floors();
        floors.before_commit(&batch);
        for (table, key, value) in batch.ops {
            touched[table.index()] = true;
            match value {
                Some(v) => per_tree[table.index()].insert(key, v),
                None => per_tree[table.index()].remove(key),
            }
        }
        let result = self.with(|h| {
            let trees: Vec<&sled::Tree> = h.trees.iter().collect();
            trees
                .as_slice()
                .transaction(|tx_trees| {
                    for (i, tree) in tx_trees.iter().enumerate() {
                        if touched[i] {
                            tree.apply_batch(&per_tree[i])?;
                        }
                    }
                    Ok::<(), ConflictableTransactionError<()>>(())
                })
                .map_err(|e: TransactionError<()>| match e {
                    TransactionError::Storage(e) => engine("commit of a batch", e),
                    TransactionError::Abort(()) => StoreError::Engine("sled: commit of a batch aborted".into()),
                })
        });
        floors.landed();
        result
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.with(|h| h.db.flush().map(|_| ()).map_err(|e| engine("flush", e)))
    }

    fn reopen(&self) -> Result<(), StoreError> {
        self.0.reopen()
    }

    fn scan_floors(&self) -> Option<&ScanFloors> {
        Some(self.0.floors())
    }
}
