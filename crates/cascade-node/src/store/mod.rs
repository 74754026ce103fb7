//! The narrow storage interface the node needs, and its engines.
//!
//! The protocol never sees an engine: it reads through
//! [`crate::codec::StoreState`] and its writes arrive here as one [`Batch`]
//! that an engine must apply atomically across tables. That is all an
//! engine has to offer (point reads, ordered prefix scans, atomic
//! multi-table batches), so engines can be measured against each other
//! without touching the protocol.
//!
//! Engines: [`SledStore`] (the default), [`FjallStore`],
//! [`PostgresStore`] (a region of several nodes over one database, one
//! fenced writer: [`open_postgres`]) and, for tests and the simulation,
//! [`MemoryStore`]. [`open_store`] opens the embedded one a node's
//! settings name; a data directory records its engine in an `ENGINE` file,
//! so it is never opened by the other one.

mod disk;
mod fjall_store;
mod lease;
mod memory;
mod postgres;
mod reopen;
mod sled_store;
mod tombstones;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

pub(crate) use disk::{from_io, probe_writable};
pub use disk::{DiskCondition, WRITE_PROBE, WRITE_PROBE_BYTES};
pub use fjall_store::FjallStore;
pub use lease::{LeaseHolder, LeaseRecord, RegionMember, WriterLease};
pub use memory::MemoryStore;
pub use postgres::{
    check_schema_name, open_postgres, PostgresSettings, PostgresStore, DEFAULT_SCHEMA, MAX_MEMBERS, SCHEMA_VERSION,
};
pub use sled_store::SledStore;
pub use tombstones::TombstoneStore;

/// The logical tables. An engine maps each to a tree, a column family or a key prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// name → resource
    Resources,
    /// uid → name (finds an incarnation; a re-created name has a new uid)
    UidIndex,
    /// target uid ‖ referrer uid ‖ field → back-reference
    Backrefs,
    /// back-reference key → nothing, for the `block` rows only: what a
    /// delete must check, without reading every referrer of the target
    BlockingBackrefs,
    /// uid → deletion record (the deletion table of seed 000)
    Deletions,
    /// operation id → operation
    Operations,
    /// operation id ‖ name → outcome
    Outcomes,
    /// uid → work item (the retry queue of seed 004)
    RetryQueue,
    /// due time (big endian) ‖ uid → nothing: the retry queue in the order
    /// it falls due, so a work step reads only what is due
    DueIndex,
    /// revision (big endian) → event
    Outbox,
    /// small named counters
    Meta,
    /// remote uid → tombstone of a remote resource seen DELETING
    RemoteDeletions,
    /// owner region ‖ 0 ‖ back-reference key → release not yet acknowledged
    PendingReleases,
    /// peer region → last applied revision of its outbox
    Cursors,
    /// uid → CREATING resource whose cross-region attach is unsettled
    PendingAttach,
    /// entry id (a UUID v7, so time order) → administrative action
    Audit,
}

impl Table {
    pub const ALL: [Table; 16] = [
        Table::Resources,
        Table::UidIndex,
        Table::Backrefs,
        Table::BlockingBackrefs,
        Table::Deletions,
        Table::Operations,
        Table::Outcomes,
        Table::RetryQueue,
        Table::DueIndex,
        Table::Outbox,
        Table::Meta,
        Table::RemoteDeletions,
        Table::PendingReleases,
        Table::Cursors,
        Table::PendingAttach,
        Table::Audit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Table::Resources => "resources",
            Table::UidIndex => "uid_index",
            Table::Backrefs => "backrefs",
            Table::BlockingBackrefs => "blocking_backrefs",
            Table::Deletions => "deletions",
            Table::Operations => "operations",
            Table::Outcomes => "outcomes",
            Table::RetryQueue => "retry_queue",
            Table::DueIndex => "due_index",
            Table::Outbox => "outbox",
            Table::Meta => "meta",
            Table::RemoteDeletions => "remote_deletions",
            Table::PendingReleases => "pending_releases",
            Table::Cursors => "cursors",
            Table::PendingAttach => "pending_attach",
            Table::Audit => "audit",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Writes to apply all together or not at all.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub ops: Vec<(Table, Vec<u8>, Option<Vec<u8>>)>,
}

impl Batch {
    pub fn put(&mut self, table: Table, key: Vec<u8>, value: Vec<u8>) {
        self.ops.push((table, key, Some(value)));
    }
    pub fn remove(&mut self, table: Table, key: Vec<u8>) {
        self.ops.push((table, key, None));
    }
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The engine failed (IO, a lock held by another process, ...), with
    /// what was being done.
    #[error("storage engine: {0}")]
    Engine(String),
    /// The engine could not write (or, sled, even read) for a reason
    /// outside the data that can clear without anyone touching the data
    /// directory: a full disk, a read-only remount, an engine that refuses
    /// everything since such a failure. The writer retries, reopening the
    /// engine ([`Store::reopen`]) once the directory takes writes again.
    #[error("storage engine: {message}")]
    Unavailable {
        /// What the disk or the engine said, in one word.
        condition: DiskCondition,
        /// The engine's error, with what was being done.
        message: String,
    },
    /// A stored value or key that does not decode (reported by the codec).
    #[error("corrupt record in table {table}: {message}")]
    Corrupt { table: &'static str, message: String },
    /// The data directory was written by another engine than the one the
    /// settings name. Neither engine can read the other's files, and
    /// opening the directory anyway would start an empty region on top of
    /// the real one.
    #[error(
        "data_dir {dir} holds a {found} database, but the storage engine is {configured}: \
         set `[storage] engine = \"{found}\"` (or --storage-engine {found}) to open it, \
         or use a fresh data_dir for {configured}"
    )]
    WrongEngine {
        /// The data directory.
        dir: PathBuf,
        /// The engine whose files are in it.
        found: StorageEngine,
        /// The engine the settings asked for.
        configured: StorageEngine,
    },
    /// The commit was refused because this node no longer holds the
    /// region's writer lease at the epoch it writes with: another node took
    /// it over ([`WriterLease`]). Nothing of the batch landed; the node
    /// steps down.
    #[error("this node is no longer the writer of its region (it wrote at epoch {held}, the lease is at {current})")]
    Fenced {
        /// The epoch this node held.
        held: u64,
        /// The lease's epoch now, when known (0: not known).
        current: u64,
    },
    /// The connection to the database died while a COMMIT was in flight:
    /// the batch may or may not have landed. The writer steps down, and
    /// whoever writes next reads the state again from the store.
    #[error("storage engine: the outcome of a commit is unknown ({0}); stepping down")]
    CommitOutcomeUnknown(String),
    /// A commit to a shared store by a node that never took the writer
    /// lease ([`WriterLease::fence`] was never called): refused without
    /// asking the database.
    #[error("this node does not hold its region's writer lease: a shared store commits only after the lease is taken and the store fenced")]
    NotFenced,
}

impl StoreError {
    /// Whether the failure may clear on its own, so that retrying (and
    /// reopening the engine) can heal the store. Corruption, a wrong
    /// engine and the engine's own failures never do: reopening over them
    /// would hide them.
    pub fn may_clear(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }
}

/// One key-value pair as stored.
pub type Entry = (Vec<u8>, Vec<u8>);

pub trait Store: Send + Sync + 'static {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// The values of `keys` (None: absent), in their order: one round trip
    /// on an engine over a network instead of one per key.
    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        keys.iter().map(|key| self.get(table, key)).collect()
    }
    /// Entries whose key starts with `prefix`, in key order, strictly after
    /// `after` when given, at most `limit`.
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError>;
    /// Applies every write of the batch atomically, in order (the last
    /// write of a key wins): a point read sees all of it or none of it, and
    /// so does recovery after a crash. A scan that races the commit sees it
    /// whole on fjall and the memory store, but may see part of it on sled
    /// (its iterators are no snapshots); the writer's own reads never race
    /// a commit, because it is the only committer.
    fn commit(&self, batch: Batch) -> Result<(), StoreError>;
    /// Makes every committed batch durable.
    fn flush(&self) -> Result<(), StoreError>;
    /// Whether a read, commit or flush may wait on the disk (or a write
    /// stall): the writer then runs its steps off the runtime's workers
    /// (`writer.rs`, `off_the_workers`). An engine in memory never waits,
    /// and handing a worker over costs a step more than it saves.
    fn waits_on_io(&self) -> bool {
        true
    }
    /// Closes the engine and opens it again from its files, in place:
    /// after a failure that may clear ([`StoreError::may_clear`]) sled
    /// keeps the error for good and fjall poisons its database, so only a
    /// fresh open writes again. It is what a restart does to the store,
    /// which a node survives at any point, and it is called by the writer
    /// (the only committer) between steps; a reader meanwhile is refused
    /// at once ([`DiskCondition::Reopening`], which may clear: the open can
    /// take seconds and a reader may be a runtime worker) and, if the open
    /// fails, gets an error, never a half-open store. A store
    /// reopens only once its directory takes writes ([`probe_writable`]);
    /// until then it keeps its old handles and answers the error. Nothing
    /// to do for a store in memory.
    fn reopen(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Which engine keeps a node's data directory: `[storage] engine` in the
/// config file, `--storage-engine` / `CASCADE_STORAGE_ENGINE` for `cascade
/// serve`. Written and parsed as its lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StorageEngine {
    /// sled 0.34, the engine the product was specified with: one tree per
    /// table, a batch is one multi-tree transaction.
    #[default]
    Sled,
    /// fjall 3, an LSM tree: one keyspace per table, a batch is one
    /// cross-keyspace write batch.
    Fjall,
    /// PostgreSQL, shared by the region's nodes: a table per table, a
    /// batch is one transaction fenced by the writer lease's epoch. Opened
    /// by [`open_postgres`] (it needs `[storage] url`), not [`open_store`].
    Postgres,
}

impl StorageEngine {
    /// Every engine, in the order error messages list them.
    pub const ALL: [StorageEngine; 3] = [StorageEngine::Sled, StorageEngine::Fjall, StorageEngine::Postgres];

    /// Whether the engine keeps its data in `data_dir` (not a database
    /// server).
    pub fn embedded(self) -> bool {
        !matches!(self, StorageEngine::Postgres)
    }

    /// The name in the config file, on the command line and in the
    /// data directory's `ENGINE` file.
    pub fn name(self) -> &'static str {
        match self {
            StorageEngine::Sled => "sled",
            StorageEngine::Fjall => "fjall",
            StorageEngine::Postgres => "postgres",
        }
    }
}

impl fmt::Display for StorageEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no [`StorageEngine`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown storage engine {0:?} (expected one of: sled, fjall, postgres)")]
pub struct UnknownEngine(pub String);

impl FromStr for StorageEngine {
    type Err = UnknownEngine;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StorageEngine::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| UnknownEngine(s.to_owned()))
    }
}

/// The file in a data directory that names the engine that wrote it.
pub const ENGINE_MARKER: &str = "ENGINE";

/// Opens the store a node's settings name: `dir` None is the in-memory
/// store (nothing survives, `engine` does not matter); otherwise `engine`
/// on `dir`, created if missing.
///
/// A directory remembers its engine (the [`ENGINE_MARKER`] file, written
/// on first open; a directory from before the marker is recognised by its
/// files), and opening it with the other engine fails with
/// [`StoreError::WrongEngine`]: the other engine would otherwise start an
/// empty region beside the real data.
pub fn open_store(engine: StorageEngine, dir: Option<&Path>) -> Result<Arc<dyn Store>, StoreError> {
    open_store_with_cache(engine, dir, DEFAULT_CACHE_BYTES)
}

/// The engine's cache a node gets unless `[storage] cache_mb` says
/// otherwise: 64 MiB. It bounds most of a node's resident memory; the
/// engines' own defaults are 1 GiB (sled) and 32 MiB (fjall).
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// [`open_store`] with the engine's cache set to `cache_bytes`.
pub fn open_store_with_cache(
    engine: StorageEngine,
    dir: Option<&Path>,
    cache_bytes: u64,
) -> Result<Arc<dyn Store>, StoreError> {
    if engine == StorageEngine::Postgres {
        return Err(needs_open_postgres());
    }
    let Some(dir) = dir else {
        return Ok(Arc::new(MemoryStore::default()));
    };
    std::fs::create_dir_all(dir).map_err(|e| io_error("cannot create the data_dir", dir, e))?;
    let recorded = recorded_engine(dir)?;
    if let Some(found) = recorded {
        if found != engine {
            return Err(StoreError::WrongEngine {
                dir: dir.to_owned(),
                found,
                configured: engine,
            });
        }
    }
    let store: Arc<dyn Store> = match engine {
        StorageEngine::Sled => Arc::new(SledStore::open_with_cache(dir, cache_bytes)?),
        StorageEngine::Fjall => Arc::new(FjallStore::open_with_cache(dir, cache_bytes)?),
        StorageEngine::Postgres => return Err(needs_open_postgres()),
    };
    // After the engine opened: a marker must not claim a directory that no
    // engine could open. A crash before it is written leaves the engine's
    // files, which `recorded_engine` recognises.
    if !dir
        .join(ENGINE_MARKER)
        .try_exists()
        .map_err(|e| io_error("cannot read", dir, e))?
    {
        write_marker(dir, engine)?;
    }
    Ok(store)
}

fn needs_open_postgres() -> StoreError {
    StoreError::Engine(
        "the postgres engine needs its connection settings ([storage] url): open it with open_postgres".into(),
    )
}

fn io_error(doing: &str, path: &Path, e: std::io::Error) -> StoreError {
    from_io(&e, format!("{doing} {}: {e}", path.display()))
}

/// The engine that wrote `dir`: its marker, or for a directory without
/// one, the engine whose files it holds. None: a fresh directory.
fn recorded_engine(dir: &Path) -> Result<Option<StorageEngine>, StoreError> {
    let marker = dir.join(ENGINE_MARKER);
    match std::fs::read_to_string(&marker) {
        Ok(text) => text.trim().parse().map(Some).map_err(|e: UnknownEngine| {
            StoreError::Engine(format!(
                "{}: {e}; this file names the engine that wrote the data_dir",
                marker.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => engine_of_files(dir),
        Err(e) => Err(io_error("cannot read", &marker, e)),
    }
}

/// Recognises a directory written before markers existed (sled only, in
/// practice) or one whose marker was never written because the process died
/// right after the engine created its files.
fn engine_of_files(dir: &Path) -> Result<Option<StorageEngine>, StoreError> {
    let exists = |name: &str| {
        let path = dir.join(name);
        path.try_exists().map_err(|e| io_error("cannot read", &path, e))
    };
    // sled 0.34 keeps `conf` and `db`; fjall 3 a `version` file and a
    // `keyspaces` folder.
    if exists("conf")? && exists("db")? {
        Ok(Some(StorageEngine::Sled))
    } else if exists("version")? && exists("keyspaces")? {
        Ok(Some(StorageEngine::Fjall))
    } else {
        Ok(None)
    }
}

/// Writes the marker whole or not at all (a temporary file renamed over
/// it), so a crash cannot leave a torn name behind.
fn write_marker(dir: &Path, engine: StorageEngine) -> Result<(), StoreError> {
    use std::io::Write;
    let marker = dir.join(ENGINE_MARKER);
    let temp = dir.join(format!("{ENGINE_MARKER}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&temp)?;
        writeln!(f, "{engine}")?;
        f.sync_all()?;
        std::fs::rename(&temp, &marker)?;
        // The rename is durable once the directory is.
        #[cfg(unix)]
        std::fs::File::open(dir)?.sync_all()?;
        Ok(())
    };
    write().map_err(|e| io_error("cannot write", &marker, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn put(ops: &[(Table, &[u8], &[u8])]) -> Batch {
        let mut b = Batch::default();
        for (t, k, v) in ops {
            b.put(*t, k.to_vec(), v.to_vec());
        }
        b
    }

    fn keys(entries: &[Entry]) -> Vec<&[u8]> {
        entries.iter().map(|(k, _)| k.as_slice()).collect()
    }

    /// What every engine must do, on a fresh store. One function over
    /// `&dyn Store`, so the engines are held to the same assertions.
    pub(super) fn conformance(store: &dyn Store) {
        use Table::*;
        let s = |t, p: &[u8], a: Option<&[u8]>, l| store.scan(t, p, a, l).unwrap();

        // Empty batches and empty tables.
        store.commit(Batch::default()).unwrap();
        assert!(s(Resources, b"", None, 10).is_empty());
        assert_eq!(store.get(Resources, b"a").unwrap(), None);

        // Prefix boundaries: a key equal to the prefix is in it; a shorter
        // key, a key just before and a key just after are not.
        store
            .commit(put(&[
                (Resources, b"a/w/zz", b"before"),
                (Resources, b"a/x", b"shorter"),
                (Resources, b"a/x/", b"equal"),
                (Resources, b"a/x/1", b"1"),
                (Resources, b"a/x/2", b"2"),
                (Resources, b"a/x/3", b"3"),
                (Resources, b"a/x0", b"after"),
                (Resources, b"a/y/1", b"y"),
            ]))
            .unwrap();
        let all: Vec<&[u8]> = vec![b"a/x/", b"a/x/1", b"a/x/2", b"a/x/3"];
        assert_eq!(keys(&s(Resources, b"a/x/", None, 100)), all);
        assert_eq!(
            s(Resources, b"a/x/", None, 100)[1],
            (b"a/x/1".to_vec(), b"1".to_vec()),
            "values come with their keys"
        );
        // `after` before the prefix, equal to it, inside, at the last key, beyond.
        assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/w/zz"), 100)), all);
        assert_eq!(keys(&s(Resources, b"a/x/", Some(b""), 100)), all);
        assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x/"), 100)), all[1..]);
        assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x/1"), 100)), all[2..]);
        assert_eq!(
            keys(&s(Resources, b"a/x/", Some(b"a/x/15"), 100)),
            all[2..],
            "an `after` that is no key"
        );
        assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x/3"), 100)), Vec::<&[u8]>::new());
        assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x0"), 100)), Vec::<&[u8]>::new());
        assert_eq!(keys(&s(Resources, b"a/x/", Some(b"b"), 100)), Vec::<&[u8]>::new());
        // `limit` 0, 1, some, exactly all, more than all.
        assert!(s(Resources, b"a/x/", None, 0).is_empty());
        assert!(s(Resources, b"a/x/", Some(b"a/x/1"), 0).is_empty());
        assert_eq!(keys(&s(Resources, b"a/x/", None, 1)), all[..1]);
        assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x/1"), 1)), all[2..3]);
        assert_eq!(keys(&s(Resources, b"a/x/", None, 3)), all[..3]);
        assert_eq!(keys(&s(Resources, b"a/x/", None, 4)), all);
        assert_eq!(
            keys(&s(Resources, b"", None, usize::MAX)).len(),
            8,
            "the empty prefix is the table"
        );
        assert_eq!(keys(&s(Resources, b"", Some(b"a/x0"), 100)), vec![b"a/y/1".as_slice()]);
        assert_eq!(keys(&s(Resources, b"zzz", None, 100)), Vec::<&[u8]>::new());

        // Prefixes of 0xff bytes: no "next prefix" to stop at, the table's end is.
        store
            .commit(put(&[
                (Outbox, &[0xfe, 0xff], b"a"),
                (Outbox, &[0xff], b"b"),
                (Outbox, &[0xff, 0x00], b"c"),
                (Outbox, &[0xff, 0xff], b"d"),
                (Outbox, &[0xff, 0xff, 0x00], b"e"),
                (Outbox, &[0xff, 0xff, 0xff], b"f"),
            ]))
            .unwrap();
        let ff: Vec<&[u8]> = vec![&[0xff, 0xff], &[0xff, 0xff, 0x00], &[0xff, 0xff, 0xff]];
        assert_eq!(keys(&s(Outbox, &[0xff, 0xff], None, 100)), ff);
        assert_eq!(keys(&s(Outbox, &[0xff, 0xff], Some(&[0xff, 0xff, 0x00]), 100)), ff[2..]);
        assert_eq!(
            keys(&s(Outbox, &[0xff, 0xff], Some(&[0xff, 0xff, 0xff]), 100)),
            Vec::<&[u8]>::new()
        );
        assert_eq!(keys(&s(Outbox, &[0xff], None, 100)).len(), 5);
        let first_two: Vec<&[u8]> = vec![&[0xff], &[0xff, 0x00]];
        assert_eq!(keys(&s(Outbox, &[0xff], Some(&[0xfe]), 2)), first_two);

        // Every table is its own key space: one key, a value per table.
        let mut b = Batch::default();
        for t in Table::ALL {
            b.put(t, b"shared".to_vec(), t.name().as_bytes().to_vec());
        }
        store.commit(b).unwrap();
        for t in Table::ALL {
            assert_eq!(store.get(t, b"shared").unwrap(), Some(t.name().as_bytes().to_vec()));
            let in_t = s(t, b"shared", None, 100);
            assert_eq!(
                in_t,
                vec![(b"shared".to_vec(), t.name().as_bytes().to_vec())],
                "{}",
                t.name()
            );
        }
        let mut b = Batch::default();
        b.remove(Cursors, b"shared".to_vec());
        store.commit(b).unwrap();
        assert_eq!(store.get(Cursors, b"shared").unwrap(), None);
        assert_eq!(store.get(Meta, b"shared").unwrap(), Some(b"meta".to_vec()));
        assert_eq!(
            store.get(PendingAttach, b"shared").unwrap(),
            Some(b"pending_attach".to_vec())
        );

        // Removing a missing key is no error and changes nothing.
        let mut b = Batch::default();
        b.remove(Resources, b"a/x/missing".to_vec());
        b.remove(Deletions, b"never".to_vec());
        store.commit(b).unwrap();
        assert_eq!(keys(&s(Resources, b"a/x/", None, 100)), all);

        // A batch applies in order: the last write of a key wins.
        let mut b = Batch::default();
        b.put(Meta, b"twice".to_vec(), b"first".to_vec());
        b.put(Meta, b"twice".to_vec(), b"second".to_vec());
        b.put(Meta, b"gone".to_vec(), b"x".to_vec());
        b.remove(Meta, b"gone".to_vec());
        b.remove(Resources, b"a/x/2".to_vec());
        b.put(Resources, b"a/x/2".to_vec(), b"back".to_vec());
        store.commit(b).unwrap();
        assert_eq!(store.get(Meta, b"twice").unwrap(), Some(b"second".to_vec()));
        assert_eq!(store.get(Meta, b"gone").unwrap(), None);
        assert_eq!(store.get(Resources, b"a/x/2").unwrap(), Some(b"back".to_vec()));

        // Large values.
        let big = vec![0xa5u8; 1 << 20];
        store.commit(put(&[(Operations, b"big", &big)])).unwrap();
        assert_eq!(store.get(Operations, b"big").unwrap().as_deref(), Some(big.as_slice()));
        assert_eq!(s(Operations, b"big", None, 1), vec![(b"big".to_vec(), big)]);
        store.flush().unwrap();
    }

    /// A batch over several tables, seen by a concurrent reader: all of it
    /// or none of it. Batch n writes n into Resources first and into Outbox
    /// last, with many writes between; a reader reads Resources, then Outbox:
    /// with atomic batches the later read can never be older.
    ///
    /// `scans_are_snapshots`: a scan also sees one batch whole. sled's does
    /// not (its iterators read each key as of when they reach it, so a
    /// scan racing a commit can return keys of two batches); its point
    /// reads are atomic.
    pub(super) fn batches_are_atomic_to_readers(store: Arc<dyn Store>, scans_are_snapshots: bool) {
        const BATCHES: u64 = 200;
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                for n in 1..=BATCHES {
                    let mut b = Batch::default();
                    b.put(Table::Resources, b"n".to_vec(), n.to_be_bytes().to_vec());
                    for i in 0..200u32 {
                        b.put(Table::Backrefs, i.to_be_bytes().to_vec(), n.to_be_bytes().to_vec());
                    }
                    b.put(Table::Outbox, b"n".to_vec(), n.to_be_bytes().to_vec());
                    store.commit(b).unwrap();
                }
            })
        };
        let read = |t| {
            store
                .get(t, b"n")
                .unwrap()
                .map_or(0, |v| u64::from_be_bytes(v.as_slice().try_into().unwrap()))
        };
        let mut checks = 0;
        loop {
            let first = read(Table::Resources);
            let last = read(Table::Outbox);
            assert!(
                last >= first,
                "saw batch {first} in resources but only {last} in outbox"
            );
            let page = store.scan(Table::Backrefs, b"", None, 1000).unwrap();
            let scanned = read(Table::Outbox);
            if let Some((_, v)) = page.first().filter(|_| scans_are_snapshots) {
                let n = u64::from_be_bytes(v.as_slice().try_into().unwrap());
                assert!(page.iter().all(|(_, w)| w == v), "a scan saw two batches at once");
                assert_eq!(page.len(), 200, "a scan saw part of batch {n}");
                assert!(scanned >= n, "scanned batch {n}, then read outbox at {scanned}");
            }
            checks += 1;
            if first == BATCHES {
                break;
            }
        }
        writer.join().unwrap();
        assert!(checks > 1);
    }

    /// Committed and flushed batches survive dropping and reopening.
    pub(super) fn survives_reopen(open: impl Fn() -> Arc<dyn Store>) {
        let big = vec![0x5au8; 1 << 20];
        {
            let store = open();
            for n in 0u32..50 {
                let mut b = Batch::default();
                for t in [Table::Resources, Table::UidIndex, Table::Outbox] {
                    b.put(t, n.to_be_bytes().to_vec(), format!("{}-{n}", t.name()).into_bytes());
                }
                if n > 0 {
                    b.remove(Table::Meta, (n - 1).to_be_bytes().to_vec());
                }
                b.put(Table::Meta, n.to_be_bytes().to_vec(), b"latest".to_vec());
                store.commit(b).unwrap();
            }
            store.commit(put(&[(Table::Operations, b"big", &big)])).unwrap();
            store.flush().unwrap();
        }
        let store = open();
        for t in [Table::Resources, Table::UidIndex, Table::Outbox] {
            let got = store.scan(t, b"", None, 1000).unwrap();
            let want: Vec<Entry> = (0u32..50)
                .map(|n| (n.to_be_bytes().to_vec(), format!("{}-{n}", t.name()).into_bytes()))
                .collect();
            assert_eq!(got, want, "{}", t.name());
        }
        assert_eq!(
            store.scan(Table::Meta, b"", None, 10).unwrap(),
            vec![(49u32.to_be_bytes().to_vec(), b"latest".to_vec())]
        );
        assert_eq!(store.get(Table::Operations, b"big").unwrap(), Some(big));
    }

    #[test]
    fn memory_store_conforms() {
        conformance(&MemoryStore::default());
        batches_are_atomic_to_readers(Arc::new(MemoryStore::default()), true);
    }

    #[test]
    fn sled_store_conforms_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        conformance(&SledStore::open(&dir.path().join("a")).unwrap());
        batches_are_atomic_to_readers(Arc::new(SledStore::open(&dir.path().join("b")).unwrap()), false);
        survives_reopen(|| Arc::new(SledStore::open(&dir.path().join("c")).unwrap()));
    }

    #[test]
    fn fjall_store_conforms_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        conformance(&FjallStore::open(&dir.path().join("a")).unwrap());
        batches_are_atomic_to_readers(Arc::new(FjallStore::open(&dir.path().join("b")).unwrap()), true);
        survives_reopen(|| Arc::new(FjallStore::open(&dir.path().join("c")).unwrap()));
    }

    #[test]
    fn engine_names_round_trip_and_sled_is_the_default() {
        assert_eq!(StorageEngine::default(), StorageEngine::Sled);
        for e in StorageEngine::ALL {
            assert_eq!(e.to_string().parse::<StorageEngine>(), Ok(e));
        }
        assert_eq!("fjall".parse(), Ok(StorageEngine::Fjall));
        let e = "Fjall".parse::<StorageEngine>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown storage engine \"Fjall\" (expected one of: sled, fjall, postgres)"
        );
    }

    #[test]
    fn open_store_without_a_directory_is_in_memory() {
        for e in StorageEngine::ALL.into_iter().filter(|e| e.embedded()) {
            let store = open_store(e, None).unwrap();
            store.commit(put(&[(Table::Meta, b"k", b"v")])).unwrap();
            assert_eq!(store.get(Table::Meta, b"k").unwrap(), Some(b"v".to_vec()));
        }
    }

    fn wrong_engine(dir: &Path, engine: StorageEngine) -> (StorageEngine, String) {
        match open_store(engine, Some(dir)) {
            Ok(_) => panic!("{} opened with {engine}", dir.display()),
            Err(e @ StoreError::WrongEngine { found, configured, .. }) => {
                assert_eq!(configured, engine);
                (found, e.to_string())
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_data_dir_remembers_its_engine() {
        use StorageEngine::*;
        let root = tempfile::tempdir().unwrap();
        for (engine, other) in [(Sled, Fjall), (Fjall, Sled)] {
            let dir = root.path().join(engine.name()).join("nested");
            {
                let store = open_store(engine, Some(&dir)).unwrap();
                store.commit(put(&[(Table::Meta, b"k", b"v")])).unwrap();
                store.flush().unwrap();
            }
            let marker = std::fs::read_to_string(dir.join(ENGINE_MARKER)).unwrap();
            assert_eq!(marker, format!("{engine}\n"));
            let (found, message) = wrong_engine(&dir, other);
            assert_eq!(found, engine);
            assert_eq!(
                message,
                format!(
                    "data_dir {} holds a {engine} database, but the storage engine is {other}: \
                     set `[storage] engine = \"{engine}\"` (or --storage-engine {engine}) to open it, \
                     or use a fresh data_dir for {other}",
                    dir.display()
                )
            );
            // The refusal touched nothing: the right engine still reads it.
            let store = open_store(engine, Some(&dir)).unwrap();
            assert_eq!(store.get(Table::Meta, b"k").unwrap(), Some(b"v".to_vec()));
        }
    }

    #[test]
    fn a_data_dir_in_use_is_refused() {
        let root = tempfile::tempdir().unwrap();
        for engine in StorageEngine::ALL.into_iter().filter(|e| e.embedded()) {
            let dir = root.path().join(engine.name());
            let _open = open_store(engine, Some(&dir)).unwrap();
            let err = open_store(engine, Some(&dir)).err().expect("opened twice").to_string();
            assert!(err.contains(&dir.display().to_string()), "{engine}: {err}");
        }
    }

    #[test]
    fn a_data_dir_without_a_marker_is_known_by_its_files() {
        use StorageEngine::*;
        let root = tempfile::tempdir().unwrap();
        // Written before markers existed (sled), or the process died between
        // the engine creating its files and the marker (either engine).
        let sled_dir = root.path().join("sled");
        drop(SledStore::open(&sled_dir).unwrap());
        let fjall_dir = root.path().join("fjall");
        drop(FjallStore::open(&fjall_dir).unwrap());
        for (dir, engine, other) in [(&sled_dir, Sled, Fjall), (&fjall_dir, Fjall, Sled)] {
            assert!(!dir.join(ENGINE_MARKER).exists());
            assert_eq!(wrong_engine(dir, other).0, engine);
            drop(open_store(engine, Some(dir)).unwrap());
            assert_eq!(
                std::fs::read_to_string(dir.join(ENGINE_MARKER)).unwrap(),
                format!("{engine}\n"),
                "the marker is written on the first open"
            );
        }
        // A marker that names no engine is an error that says what the file is.
        std::fs::write(sled_dir.join(ENGINE_MARKER), "rocksdb\n").unwrap();
        let err = open_store(Sled, Some(&sled_dir)).err().unwrap().to_string();
        assert!(
            err.contains("unknown storage engine \"rocksdb\"") && err.contains("names the engine that wrote"),
            "{err}"
        );
    }
}
