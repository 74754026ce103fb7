//! The fjall engine (fjall 3, an LSM tree): one database per data
//! directory, one keyspace per table, a batch is one cross-keyspace
//! `OwnedWriteBatch`.
//!
//! Reads go through a database snapshot, not the keyspace directly: a
//! keyspace's own `get` and `range` read at the newest sequence number,
//! which sees a batch that another thread is still applying to the
//! memtables one item at a time. A snapshot reads at the last *published*
//! batch, so a reader sees each batch whole or not at all, point reads and
//! scans alike (sled gives that to point reads; see `Store::commit`).
//!
//! `flush` is `persist(PersistMode::SyncAll)`: an fsync of the journal,
//! which is what sled's `flush` does (`File::sync_all`). `SyncData`
//! (fdatasync) would keep the same durability on Linux, but it saves
//! nothing here: fjall sizes a new journal with `set_len` (fjall 3.1.13,
//! `journal/writer.rs`), which leaves it sparse, so every append allocates
//! blocks and fdatasync must commit that allocation to the file system's
//! journal just as fsync does; only the timestamps differ. Measured: 1M
//! puts and 1M removes of 200-byte values in batches of 1,000, a persist
//! per batch, ext4: 11–12 s either way; and the small write's p99 during
//! P1 tree 1M was no lower with it (docs/BENCHMARKS.md, "fjall: the small
//! write's tail"). fjall's docs keep it for when "fdatasync is sufficient
//! for your file system", so the engine makes no bet on the file system.

//!
//! A failed journal write poisons the database: every later write answers
//! `Poisoned`, also once the disk has room again (reads still work). So
//! healing is a reopen: the handles live behind a lock and
//! [`Store::reopen`] replaces them with a fresh open of the directory.
//! A batch whose commit failed may still be found after the reopen (its
//! journal bytes were written before the error; fjall recovers a whole
//! batch or truncates a torn one): the writer treats a failed commit as
//! landed or not, never as half-landed (`writer.rs`).

use std::collections::HashSet;
use std::path::Path;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable};

use super::reopen::{EngineHandles, Reopenable};
use super::{from_io, Batch, DiskCondition, Entry, ScanFloors, ScanRange, Store, StoreError, Table};

/// Each keyspace's memtable rotates at this size (fjall's default is 64
/// MiB).
///
/// Why not smaller: every memtable flush, and every compaction it leads
/// to, installs a new version of its keyspace's tree, and lsm-tree 3
/// writes and fsyncs that version while it holds the lock every read of
/// the keyspace takes (a point read, the start of a scan). During a large
/// cascade those fsyncs wait behind the flushes' and compactions' own
/// writes, 10–45 ms, and the writer's reads wait with them, and a small
/// write behind the writer. At 8 MiB a P1 of 1M on fjall installed a
/// version every few hundred milliseconds: the small create's p99 was
/// 21–24 ms in every shape; at 32 MiB, 12–16 ms, with 20–30 % less CPU per
/// deleted resource, for a peak of 430–450 MB against 250–280 (issue 28
/// allows 600). docs/BENCHMARKS.md, "fjall: a scan that ran past its
/// prefix, and the reads that wait for a version's fsync".
///
/// Why not larger: with 16 keyspaces, 64 MiB let the memtables of a node
/// that had just written a million resources hold over 400 MB alone, and
/// P1 tree at 1M peaked at 636 MB ("fjall's memtables", when 8 MiB was
/// chosen over it).
///
/// fjall stores a keyspace's options when it creates the keyspace and
/// reads them back at every open, so this size applies to databases
/// created with it; an older data directory keeps the size it was
/// created with.
const MEMTABLE_BYTES: u64 = 32 * 1024 * 1024;

/// A fjall database with a keyspace per [`Table`].
pub struct FjallStore(Reopenable<Handles>);

struct Handles {
    /// Batches, snapshots and `persist` are database-wide.
    db: Database,
    /// Indexed by `Table::index`.
    keyspaces: Vec<Keyspace>,
}

/// An engine error, with what was being done: a full disk, a read-only
/// file system and the poisoned database they leave may clear
/// ([`StoreError::Unavailable`]), anything else not.
fn engine(doing: &str, e: fjall::Error) -> StoreError {
    let message = format!("fjall: {doing}: {e}");
    match &e {
        fjall::Error::Io(io) => from_io(io, message),
        fjall::Error::Storage(fjall::LsmError::Io(io)) => from_io(io, message),
        fjall::Error::Poisoned => StoreError::Unavailable {
            condition: DiskCondition::Refusing,
            message,
        },
        _ => StoreError::Engine(message),
    }
}

/// Set (to anything) in a node's environment, fjall keeps commits in the
/// process until a flush, so a SIGKILL loses what was not flushed, as a
/// power loss would. For crash tests of the commits that skip their flush
/// (`tests/cross_region_crash.rs`): by default fjall hands every commit
/// to the operating system at once, and a SIGKILL loses nothing of it.
pub const KEEP_UNFLUSHED_IN_PROCESS: &str = "CASCADE_TEST_FJALL_KEEP_UNFLUSHED_IN_PROCESS";

impl EngineHandles for Handles {
    const ENGINE: &'static str = "fjall";

    fn open(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        clear_interrupted_creation(dir)?;
        // fjall's marker, written before any keyspace is made: without it
        // the database is created now, and has none yet.
        let existed = dir.join("version").try_exists().map_err(|e| {
            StoreError::Engine(format!(
                "fjall: cannot check the version marker in {}: {e}",
                dir.display()
            ))
        })?;
        let mut db = open_database(dir, cache_bytes)?;
        if existed && creation_cut_short(&db, dir)? {
            tracing::warn!(
                dir = %dir.display(),
                "a fjall database whose creation was cut short (some keyspaces made, not all; no data): created afresh"
            );
            drop(db);
            start_afresh(dir)?;
            db = open_database(dir, cache_bytes)?;
        }
        let keyspaces = Table::ALL
            .iter()
            .map(|t| {
                db.keyspace(t.name(), || {
                    KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_BYTES)
                })
                .map_err(|e| engine(&format!("cannot open keyspace {}", t.name()), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { db, keyspaces })
    }
}

/// Opens (or creates) fjall's database in `dir`, without its keyspaces.
fn open_database(dir: &Path, cache_bytes: u64) -> Result<Database, StoreError> {
    Database::builder(dir)
        .cache_size(cache_bytes)
        .manual_journal_persist(std::env::var_os(KEEP_UNFLUSHED_IN_PROCESS).is_some())
        .open()
        .map_err(|e| match e {
            // fjall's own words for it are "FjallError: Locked".
            fjall::Error::Locked => StoreError::Engine(format!(
                "fjall: cannot open the database at {}: another process holds its lock \
                 (is another node running on this data_dir?)",
                dir.display()
            )),
            e => engine(&format!("cannot open the database at {}", dir.display()), e),
        })
}

/// Whether `db` is a database whose first open was cut short between
/// fjall's `version` marker and the last of its keyspaces (each is made
/// in turn, and fjall records it in its meta keyspace), so that it must be
/// created afresh. CI once saw "cannot open keyspace outcomes: NotFound"
/// at the start after a kill there; 400 SIGKILLs at random instants of
/// that creation did not reproduce it (fjall 3.1.13 recovered each), so
/// the open does not rely on how fjall recovers that window. Only when
/// that is provably safe:
/// nothing was ever written through it, because `open_store` writes the
/// data directory's `ENGINE` file once the store is open, before any
/// write, and no keyspace it has holds a row. A database that lacks a
/// keyspace otherwise has lost one that may have held data, and is
/// refused with an error that names it: opened, the table would read as
/// empty (resources without their back-references, deletions without
/// their queue).
fn creation_cut_short(db: &Database, dir: &Path) -> Result<bool, StoreError> {
    let present = db.list_keyspace_names();
    let missing: Vec<&str> = Table::ALL
        .iter()
        .map(|t| t.name())
        .filter(|name| !present.iter().any(|p| &**p == *name))
        .collect();
    if missing.is_empty() {
        return Ok(false);
    }
    let mut holding = Vec::new();
    for name in &present {
        let keyspace = db
            .keyspace(name, KeyspaceCreateOptions::default)
            .map_err(|e| engine(&format!("cannot open keyspace {}", &**name), e))?;
        if !keyspace
            .is_empty()
            .map_err(|e| engine(&format!("cannot read keyspace {}", &**name), e))?
        {
            holding.push(String::from(&**name));
        }
    }
    let marker = dir.join(super::ENGINE_MARKER);
    let opened_before = marker
        .try_exists()
        .map_err(|e| StoreError::Engine(format!("fjall: cannot check {}: {e}", marker.display())))?;
    if holding.is_empty() && !opened_before {
        return Ok(true);
    }
    let why = if holding.is_empty() {
        format!(
            "it was opened before (its data_dir has an {} file)",
            super::ENGINE_MARKER
        )
    } else {
        format!("it holds data (in {})", holding.join(", "))
    };
    Err(StoreError::Engine(format!(
        "fjall: the database at {} has no keyspace {}, though {why}: its files were lost (removed, or not \
         restored with the rest); opened, those tables would read as empty, so it is refused. Restore the \
         data_dir from a backup",
        dir.display(),
        missing.join(", ")
    )))
}

/// Turns a database whose creation was cut short (`creation_cut_short`)
/// into one whose creation never started: its `version` marker goes
/// first, so that a kill meanwhile leaves what `clear_interrupted_creation`
/// removes at the next open (journals without a marker).
fn start_afresh(dir: &Path) -> Result<(), StoreError> {
    let version = dir.join("version");
    std::fs::remove_file(&version).map_err(|e| {
        StoreError::Engine(format!(
            "fjall: cannot remove {} of a creation cut short: {e}",
            version.display()
        ))
    })?;
    clear_interrupted_creation(dir)
}

/// fjall's files of a database whose creation was cut short (the process
/// killed inside fjall's `create_new`, which creates the journal before it
/// writes its `version` marker): fjall's own open would call `create_new`
/// again and fail on the journal it finds ("File exists"), so a node
/// SIGKILLed in the first moments of its first start could never start
/// again (`tests/cross_region_crash.rs` killed one there, in CI). Without
/// the marker fjall never reads those files, and nothing was written
/// through them (writes come after the open returns), so they hold no
/// data: removed, and the database is created afresh. The keyspaces go
/// before the journals: a kill in between leaves a journal, and so the
/// next open removes the rest.
fn clear_interrupted_creation(dir: &Path) -> Result<(), StoreError> {
    let io = |what: &str, e: std::io::Error| StoreError::Engine(format!("fjall: {what} in {}: {e}", dir.display()));
    let created = dir
        .join("version")
        .try_exists()
        .map_err(|e| io("cannot check the version marker", e))?;
    if created {
        return Ok(());
    }
    let mut journals = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let path = entry.map_err(|e| io("cannot list the files", e))?.path();
                if path.extension().is_some_and(|ext| ext == "jnl") {
                    journals.push(path);
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("cannot list the files", e)),
    }
    if journals.is_empty() {
        return Ok(());
    }
    // Under fjall's lock: a process still inside its creation holds it,
    // and its journal is not ours to remove (its open answers Locked).
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join("lock"))
        .map_err(|e| io("cannot open the lock file", e))?;
    if lock.try_lock().is_err() {
        return Ok(());
    }
    tracing::warn!(
        dir = %dir.display(),
        "a fjall database whose creation was cut short (a journal, no version marker): created afresh"
    );
    let keyspaces = dir.join("keyspaces");
    if keyspaces
        .try_exists()
        .map_err(|e| io("cannot check the keyspaces", e))?
    {
        std::fs::remove_dir_all(&keyspaces)
            .map_err(|e| io("cannot remove the keyspaces of a creation cut short", e))?;
    }
    for journal in journals {
        std::fs::remove_file(&journal).map_err(|e| io("cannot remove the journal of a creation cut short", e))?;
    }
    drop(lock);
    Ok(())
}

impl Handles {
    fn keyspace(&self, table: Table) -> &Keyspace {
        &self.keyspaces[table.index()]
    }
}

impl FjallStore {
    /// Opens (or creates) the database in `dir` and a keyspace per table,
    /// with the default cache.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(dir, super::DEFAULT_CACHE_BYTES)
    }

    /// Opens it with a block cache of `cache_bytes`.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        Reopenable::open(dir, cache_bytes).map(Self)
    }

    fn with<R>(&self, f: impl FnOnce(&Handles) -> Result<R, StoreError>) -> Result<R, StoreError> {
        self.0.with(f)
    }
}

impl Store for FjallStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.with(|h| {
            h.db.snapshot()
                .get(h.keyspace(table), key)
                .map(|v| v.map(|v| v.to_vec()))
                .map_err(|e| engine(&format!("get from {}", table.name()), e))
        })
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.with(|h| {
            let snapshot = h.db.snapshot();
            let keyspace = h.keyspace(table);
            let Some(range) = ScanRange::new(prefix, after) else {
                return Ok(Vec::new());
            };
            let iter = snapshot.range::<&[u8], _>(keyspace, range.bounds());
            let mut out = Vec::new();
            for guard in iter {
                let (k, v) = guard
                    .into_inner()
                    .map_err(|e| engine(&format!("scan of {}", table.name()), e))?;
                if !k.starts_with(prefix) {
                    break;
                }
                out.push((k.to_vec(), v.to_vec()));
                if out.len() >= limit {
                    break;
                }
            }
            Ok(out)
        })
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.0.commit(&batch, |h| {
            // Every item of a fjall batch gets the batch's one sequence number,
            // so two writes of one key in a batch tie, and which one survives
            // is up to fjall's memtable (today its skiplist lets the later
            // insert replace the earlier), which fjall does not document. The
            // `Batch` contract is "in order, the last write wins" (sled's batch
            // and the memory store do that): keep only each key's last write,
            // so the contract holds whatever fjall does with ties.
            let mut seen: HashSet<(Table, &[u8])> = HashSet::with_capacity(batch.ops.len());
            let mut wb = h.db.batch();
            for (table, key, value) in batch.ops.iter().rev() {
                if !seen.insert((*table, key.as_slice())) {
                    continue;
                }
                let keyspace = h.keyspace(*table);
                match value {
                    Some(v) => wb.insert(keyspace, key.as_slice(), v.as_slice()),
                    None => wb.remove(keyspace, key.as_slice()),
                }
            }
            wb.commit().map_err(|e| engine("commit of a batch", e))
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.with(|h| {
            h.db.persist(PersistMode::SyncAll)
                .map_err(|e| engine("persist (fsync of the journal)", e))
        })
    }

    fn reopen(&self) -> Result<(), StoreError> {
        self.0.reopen()
    }

    fn scan_floors(&self) -> Option<&ScanFloors> {
        Some(self.0.floors())
    }
}
