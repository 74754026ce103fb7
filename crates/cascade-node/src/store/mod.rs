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
mod floors;
mod lease;
mod memory;
mod overlay;
mod pipelined;
mod postgres;
mod reopen;
mod sled_store;
mod tombstones;
mod watched;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

pub(crate) use disk::{from_io, probe_writable};
pub use disk::{DiskCondition, WRITE_PROBE, WRITE_PROBE_BYTES};
pub use fjall_store::{FjallStore, KEEP_UNFLUSHED_IN_PROCESS};
pub use floors::{scan_from_floor, ScanFloors};
pub use lease::{LeaseHolder, LeaseRecord, RegionMember, WriterLease};
pub use memory::{MemoryStore, TableFootprint};
pub use pipelined::{PipelinedStore, MAX_PIPELINED_BYTES, MAX_PIPELINED_KEYS};
pub use postgres::{
    check_schema_name, open_postgres, PostgresSettings, PostgresStore, DEFAULT_SCHEMA, MAX_MEMBERS, MAX_RUNS_BYTES,
    MAX_RUNS_PER_TABLE, MAX_RUN_BYTES, MAX_STAGED_BYTES, MAX_STAGED_KEYS, RUN_READ_AHEAD, SCHEMA_VERSION,
};
pub use sled_store::SledStore;
pub use tombstones::TombstoneStore;
pub(crate) use watched::WatchedReads;

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

#[derive(Debug, Clone, thiserror::Error)]
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

/// The keys a [`Store::scan`] of `prefix` strictly after `after` may
/// read: from the prefix (or just past `after` when that lies at or
/// beyond it) up to [`prefix_end`], every engine's iterator bounded by
/// both.
///
/// Why the end: an engine's iterator passes removed keys (fjall's
/// tombstones, sled's emptied leaves) until it finds a live one. With no
/// end, a scan that comes back short (a walk's last page, a full pass, a
/// prefix with nothing left) went on past its prefix through every
/// removed key of the prefixes after it, to the first live key beyond,
/// only to stop there: at the end of P1 unset 1M on fjall, 43–110 ms per
/// scan of the root's back-references, past the floating IPs' removed
/// rows, once per work step (docs/BENCHMARKS.md, "fjall: a scan that ran
/// past its prefix, and the reads that wait for a version's fsync"). [`TombstoneStore`] counts what this range passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanRange<'a> {
    start: std::ops::Bound<&'a [u8]>,
    end: Option<Vec<u8>>,
}

impl<'a> ScanRange<'a> {
    /// None when no key can follow `after` in the prefix (`after` at or
    /// past the prefix's end): the scan is empty, and an engine must not
    /// be given a range whose start is past its end (sled's and std's
    /// ordered maps panic on one).
    pub(crate) fn new(prefix: &'a [u8], after: Option<&'a [u8]>) -> Option<Self> {
        let end = prefix_end(prefix);
        let start = match after {
            Some(a) if end.as_deref().is_some_and(|end| a >= end) => return None,
            Some(a) if a >= prefix => std::ops::Bound::Excluded(a),
            _ => std::ops::Bound::Included(prefix),
        };
        Some(Self { start, end })
    }

    /// The range, as an engine's `range` takes it.
    pub(crate) fn bounds(&self) -> (std::ops::Bound<&[u8]>, std::ops::Bound<&[u8]>) {
        let end = match &self.end {
            Some(end) => std::ops::Bound::Excluded(end.as_slice()),
            None => std::ops::Bound::Unbounded,
        };
        (self.start, end)
    }
}

/// The first key after every key that starts with `prefix`, or None when
/// no key is (an empty prefix, or one of 0xff bytes only): `prefix`
/// without its trailing 0xff bytes, its last byte one up.
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while end.last() == Some(&0xff) {
        end.pop();
    }
    let last = end.last_mut()?;
    *last += 1;
    Some(end)
}

/// Reads a caller is about to make, named ahead ([`Store::prefetch`]).
#[derive(Debug, Default, Clone)]
pub struct Prefetch {
    /// Keys it will get, per table.
    pub keys: std::collections::BTreeMap<Table, Vec<Vec<u8>>>,
    /// Prefixes it will scan, per table: whether each holds any row.
    pub prefixes: std::collections::BTreeMap<Table, Vec<Vec<u8>>>,
}

impl Prefetch {
    pub fn key(&mut self, table: Table, key: Vec<u8>) {
        self.keys.entry(table).or_default().push(key);
    }

    pub fn prefix(&mut self, table: Table, prefix: Vec<u8>) {
        self.prefixes.entry(table).or_default().push(prefix);
    }
}

pub trait Store: Send + Sync + 'static {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// [`Store::get`] with the value lent to `read` (not called when the
    /// key is absent) instead of returned: an engine that keeps its values
    /// in memory lends them without a copy, and the codec decodes from the
    /// loan (the memory engine: a copy and its free were a tenth of a
    /// cascade's reads; docs/BENCHMARKS.md, "The memory engine's commit
    /// and the reads' copies"). `read` may run while the engine holds a
    /// lock: it must not call the store. By default, a copy.
    fn get_in(&self, table: Table, key: &[u8], read: &mut dyn FnMut(&[u8])) -> Result<(), StoreError> {
        if let Some(value) = self.get(table, key)? {
            read(&value);
        }
        Ok(())
    }
    /// The values of `keys` (None: absent), in their order: one round trip
    /// on an engine over a network instead of one per key.
    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        keys.iter().map(|key| self.get(table, key)).collect()
    }
    /// Reads `reads` ahead, all together, so that the gets and the prefix
    /// scans that follow do not wait one by one: on an engine whose every
    /// read is a round trip (postgres: one pipelined round trip for all of
    /// them, the answers kept in its cache, absent keys and empty prefixes
    /// included). A hint: the reads that follow are right whether it ran or
    /// not, so the default does nothing, as an engine on local disk gains
    /// nothing from it.
    fn prefetch(&self, _reads: &Prefetch) -> Result<(), StoreError> {
        Ok(())
    }
    /// Whether [`Store::prefetch`] does anything: a caller builds the
    /// reads only for a store that uses them.
    fn prefetches(&self) -> bool {
        false
    }
    /// Entries whose key starts with `prefix`, in key order, strictly after
    /// `after` when given, at most `limit`, and fewer only when no entry
    /// follows: the core ends a walk of back-references at a page shorter
    /// than it asked for (`cascade_core::state::BackRefPages`), so an engine that
    /// returned a short page early (a byte cap per round trip, say) would
    /// end a deletion's walk with referrers left. Every engine's
    /// conformance test pages with limits below, at and above the rows.
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError>;
    /// [`Store::scan`] with each entry lent to `read`, in key order,
    /// instead of returned (as [`Store::get_in`]). By default, copies.
    fn scan_in(
        &self,
        table: Table,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        read: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), StoreError> {
        for (key, value) in self.scan(table, prefix, after, limit)? {
            read(&key, &value);
        }
        Ok(())
    }
    /// Applies every write of the batch atomically, in order (the last
    /// write of a key wins): a read, point or scan, sees all of it or none
    /// of it, and so does recovery after a crash. The one reader that may
    /// meet a batch half applied is a [`PipelinedStore`] reading its engine
    /// through [`Store::for_pipelined_writer`], whose staged set answers
    /// every key of it meanwhile.
    fn commit(&self, batch: Batch) -> Result<(), StoreError>;
    /// Makes every committed batch visible to every reader of the store
    /// now, without waiting for it to be durable: a no-op where a commit
    /// already is (by default), and on postgres, whose staged commits only
    /// a flush sends. [`PipelinedStore`] applies its staged commits to its
    /// engine (after the flight in progress). For a step that skips its
    /// flush (`writer/durable.rs`): what it wrote (an importer's cursor,
    /// say) is read by the node's API and links at once, as before its
    /// store was pipelined. An error: they did not land, and neither did
    /// the commits staged with them, so the next flush fails too.
    fn land(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Makes every committed batch durable. On postgres a commit is
    /// staged in the store (its reads see it) and the flush sends every
    /// batch committed since the last one in one transaction: a flush that
    /// fails landed none of what it sent (or, its outcome unknown, all or
    /// none), as a batch committed and never flushed never lands.
    fn flush(&self) -> Result<(), StoreError>;
    /// Starts a flush of every batch committed so far and returns without
    /// waiting for it, when [`Store::overlaps_flushes`]: the caller's next
    /// reads see those batches (and their compute may run) while they are
    /// sent, and [`Store::finish_flush`] says whether they landed. A flush
    /// in progress is finished first. The caller must finish it before it
    /// commits again, flushes or lets anything resting on it leave the
    /// node. By default the synchronous [`Store::flush`].
    fn start_flush(&self) -> Result<(), StoreError> {
        self.flush()
    }
    /// [`Store::start_flush`], and `landed` runs as soon as the flush
    /// landed, on the store's thread that saw it land, when the store has
    /// one ([`PipelinedStore`]'s commit thread, PostgreSQL's runtime): the
    /// caller's clients are answered without waiting for it to ask. Never when the flush failed; maybe never (by
    /// default `landed` is dropped): [`Store::finish_flush`] still reports
    /// the outcome, and whatever `landed` would have done is then the
    /// caller's.
    fn start_flush_then(&self, landed: Box<dyn FnOnce() + Send>) -> Result<(), StoreError> {
        drop(landed);
        self.start_flush()
    }
    /// Waits for the flush [`Store::start_flush`] started, if any, and
    /// says whether what it sent landed: the one report of its outcome
    /// (only its starter, the writer, calls it). A failure dropped what it
    /// sent, as a failed [`Store::flush`] does. By default nothing is ever
    /// in progress.
    fn finish_flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Whether [`Store::start_flush`] returns before the flush ended (the
    /// writer then keeps the group's replies and events until
    /// [`Store::finish_flush`], `writer/group.rs`). PostgreSQL only: on an
    /// embedded engine the flush is an fsync of the writer's own thread.
    fn overlaps_flushes(&self) -> bool {
        false
    }
    /// How long the last flight took to land (its engine commit and
    /// fsync), on a store that lands them on a thread of its own
    /// ([`PipelinedStore`]): a small write that joins a work step's group
    /// waits for the rest of the step and then this, so the writer aims
    /// its steps shorter when landings are long (`writer/work_budget.rs`).
    /// None: no flight landed yet, or the store has none of its own.
    fn last_landing(&self) -> Option<std::time::Duration> {
        None
    }
    /// Whether a commit may be made while a flight is in progress
    /// ([`Store::start_flush`]) without waiting for it: staged on top of
    /// it, read over its writes, and dropped with them if it fails (the
    /// next flush then fails too, so nobody is told it landed). The
    /// writer then lets a group's steps commit while the flight before it
    /// flies (`WriterState::commit_unflushed`). PostgreSQL only: the
    /// embedded engines' pipelined view waits for the flight in a commit.
    fn commits_on_top_of_a_flight(&self) -> bool {
        false
    }
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
    /// The floors of the tables that are scanned from their first key and
    /// removed from the front ([`scan_from_floor`]): an engine whose removed
    /// keys stay in the way of a scan (an LSM tree's tombstones, sled's
    /// empty leaves) keeps them, and calls [`ScanFloors::before_commit`]
    /// and [`ScanFloors::landed`] around every commit. None: every such
    /// scan starts at the first key.
    fn scan_floors(&self) -> Option<&ScanFloors> {
        None
    }
    /// The view of this store the node's writer reads and commits
    /// through, when it differs from everyone else's: on PostgreSQL a
    /// commit is staged until the flush, and only the writer's view reads
    /// staged writes (a failed flush drops them, so no other reader may
    /// have seen them). None: one view for all, as on the embedded
    /// engines, where a commit taken back by a crash is taken back from
    /// every reader with the process.
    fn writers_view(&self) -> Option<Arc<dyn Store>> {
        None
    }
    /// The handle on this engine a [`PipelinedStore`] commits and reads
    /// through, when it is not the store itself: one whose reads do not
    /// wait for a batch that is landing. That view answers every key of the
    /// batch it is landing from its staged set until the batch landed, so
    /// its reads of the engine never see it half applied; everyone else's
    /// reads wait for a landing batch to be whole (sled's: `sled_store.rs`;
    /// fjall's never wait). None: the store itself.
    fn for_pipelined_writer(&self) -> Option<Arc<dyn Store>> {
        None
    }
}

/// The view of `store` a node's writer reads and commits through: the
/// store's own when it has one ([`Store::writers_view`], PostgreSQL), a
/// [`PipelinedStore`] over an engine that waits on its disk (its commits
/// land and fsync on a thread of their own while the writer computes the
/// next step), else the store itself (in memory a commit costs less than
/// handing it over).
pub fn writers_view_of(store: &Arc<dyn Store>) -> Result<Arc<dyn Store>, StoreError> {
    if let Some(view) = store.writers_view() {
        return Ok(view);
    }
    if store.waits_on_io() && !store.overlaps_flushes() {
        let engine = store.for_pipelined_writer().unwrap_or_else(|| store.clone());
        return Ok(Arc::new(PipelinedStore::new(engine)?));
    }
    Ok(store.clone())
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
mod tests;
