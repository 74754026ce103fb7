//! The PostgreSQL engine: a region's tables in one PostgreSQL schema,
//! shared by the region's nodes, of which only the holder of the writer
//! lease commits ([`WriterLease`], every commit fenced by its epoch).
//!
//! - `settings.rs`: where it connects, its sessions' timeouts, what its
//!   errors say (never the password) and which may clear;
//! - `migrate.rs`: the schema, its versions, and whose it is (region and
//!   cluster, recorded on first start);
//! - `staged.rs`: the batches committed since the last flush, which the
//!   writer's reads see, and which the flush lands together;
//! - `commit.rs`: reads, and the staged batches as one pipelined
//!   transaction, fenced first;
//! - `lease.rs`: the lease row and the fence state;
//! - `cache.rs`: the write-through read cache, dropped at every fence.
//!
//! A commit is staged (no round trip: its epoch is checked locally) and a
//! flush sends everything staged in one transaction: a writer's group of
//! steps (`writer/group.rs`: each committed, then one flush) lands in one
//! transaction, fenced once. So here, as on the embedded engines, a
//! commit is visible to the writer's next step at once and durable only
//! once a flush returned; a batch staged and never flushed (a SIGKILL, a
//! fence, a failed flush) never lands, and was never acknowledged. Unlike
//! them, a failed flush (a routine error, not only a crash) takes back
//! what it staged, so only the writer's view ([`Store::writers_view`])
//! reads staged writes; the node's other readers ([`PostgresStore::at_epoch`])
//! read what landed.
//!
//! The [`Store`] trait is synchronous and called from runtime workers,
//! from `block_in_place`, from plain threads and from current-thread
//! runtimes, so the store owns a small runtime of its own (two threads)
//! that drives the driver's connections, and blocks its caller on the
//! answer: never `Handle::current().block_on`, which panics on a worker
//! and deadlocks a current-thread runtime.
//!
//! Size: over 800 lines because the store's one [`Store`] impl, its
//! commit/flush path and the writer's view share the staged set, the cache
//! and the fence; the parts that stand alone are already split out
//! (`cache`, `commit`, `flush`, `lease`, `migrate`, `settings`,
//! `staged`).

mod cache;
mod commit;
mod flush;
mod lease;
mod migrate;
mod settings;
mod staged;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::{Arc, Mutex};

use cascade_core::RegionId;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

#[cfg(doc)]
use super::WriterLease;
use super::{Batch, Entry, Prefetch, Store, StoreError, Table};
use cache::{Lookup, PrefixLookup, ReadCache, RunLookup};
pub use cache::{MAX_RUNS_BYTES, MAX_RUNS_PER_TABLE, MAX_RUN_BYTES};
pub use lease::MAX_MEMBERS;
pub use migrate::SCHEMA_VERSION;
pub use settings::{check_schema_name, PostgresSettings, DEFAULT_SCHEMA};
use settings::{
    connection_config, open_error, with_session, Target, IDLE_IN_TRANSACTION_TIMEOUT, LOCK_TIMEOUT, POOL_TIMEOUT,
    READ_POOL_SIZE, READ_STATEMENT_TIMEOUT, WRITER_STATEMENT_TIMEOUT,
};
pub use staged::{MAX_STAGED_BYTES, MAX_STAGED_KEYS};

/// What the store's futures share (they run on its runtime, so they own
/// their handles).
pub(crate) struct Shared {
    /// One connection: the writer's session, with its timeouts. A pool of
    /// one, so a connection that died is made again at the next commit
    /// (keeping the store's epoch: the next commit's fence is what makes
    /// that safe).
    writer: Pool,
    /// Reads and the lease's statements.
    readers: Pool,
    target: Target,
    schema: String,
    region: String,
    sql: commit::Statements,
}

/// A region's store on PostgreSQL. Open it with [`open_postgres`].
pub struct PostgresStore {
    shared: Arc<Shared>,
    cache: ReadCache,
    /// What was committed since the last flush (`staged.rs`).
    staged: staged::Staged,
    fence: lease::Fence,
    /// Held by a commit while it stages, and by a flush from its plan to
    /// its end (see `send_staged`); a flight's start holds it from its
    /// take to its dispatch.
    commit_lock: Mutex<()>,
    /// The group's flush sent in the background, and how the last one
    /// ended until the writer is told (`flush.rs`).
    flight: Mutex<flush::Flights>,
    lost: tokio::sync::watch::Sender<bool>,
    /// Tests only: hold every commit's transaction this long after its
    /// fence (a slow batch, holding the lease row's share lock).
    #[cfg(test)]
    pause_after_fence: Mutex<Option<std::time::Duration>>,
    /// Last, so that it is dropped after everything that may use it.
    runtime: PrivateRuntime,
}

/// The store's own runtime, shut down without waiting when the store goes
/// (which may be on a runtime worker, where waiting is not allowed).
struct PrivateRuntime(Option<tokio::runtime::Runtime>);

impl Drop for PrivateRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Opens the region's store on PostgreSQL: connects (an unreachable server,
/// a wrong password, a missing database are errors naming the server,
/// database and user, never the password), creates or migrates the
/// schema under an advisory lock, and refuses a schema of another region
/// or cluster, or of a newer version than this binary knows.
pub fn open_postgres(
    settings: &PostgresSettings,
    region: &RegionId,
    cluster: &str,
) -> Result<Arc<PostgresStore>, StoreError> {
    check_schema_name(&settings.schema).map_err(|e| StoreError::Engine(format!("storage.schema: {e}")))?;
    let (config, target) = connection_config(settings)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("cascade-postgres")
        .enable_all()
        .build()
        .map_err(|e| StoreError::Engine(format!("cannot start the PostgreSQL store's runtime: {e}")))?;
    let pool = |config: tokio_postgres::Config, size: usize| {
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_TIMEOUT))
            .create_timeout(Some(POOL_TIMEOUT))
            .recycle_timeout(Some(POOL_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Engine(format!("{target}: cannot make a connection pool: {e}")))
    };
    let writer = pool(
        with_session(
            &config,
            &[
                ("statement_timeout", WRITER_STATEMENT_TIMEOUT),
                ("lock_timeout", LOCK_TIMEOUT),
                ("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION_TIMEOUT),
            ],
        ),
        1,
    )?;
    let readers = pool(
        with_session(
            &config,
            &[
                ("statement_timeout", READ_STATEMENT_TIMEOUT),
                ("lock_timeout", LOCK_TIMEOUT),
                ("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION_TIMEOUT),
            ],
        ),
        READ_POOL_SIZE,
    )?;
    let shared = Arc::new(Shared {
        writer,
        readers,
        target: target.clone(),
        schema: settings.schema.clone(),
        region: region.to_string(),
        sql: commit::Statements::new(&settings.schema),
    });
    let store = PostgresStore {
        shared: shared.clone(),
        cache: ReadCache::new(settings.cache_bytes),
        staged: staged::Staged::new(),
        fence: Mutex::default(),
        commit_lock: Mutex::new(()),
        flight: Mutex::default(),
        lost: tokio::sync::watch::channel(false).0,
        #[cfg(test)]
        pause_after_fence: Mutex::new(None),
        runtime: PrivateRuntime(Some(runtime)),
    };
    let (region, cluster) = (region.to_string(), cluster.to_owned());
    store.run(async move {
        let mut client = shared.writer.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => open_error(&e, &shared.target),
            deadpool_postgres::PoolError::Timeout(_) => StoreError::Engine(format!(
                "cannot connect to {}: no connection within {POOL_TIMEOUT:?} \
                 (is the server up, and the host and port in storage.url right?)",
                shared.target
            )),
            other => StoreError::Engine(format!("cannot connect to {}: {other}", shared.target)),
        })?;
        migrate::migrate(&mut client, &shared.schema, &region, &cluster, &shared.target).await
    })?;
    Ok(Arc::new(store))
}

/// Blocks the calling thread until `task`, running on the store's own
/// runtime, ends. The join is polled outside tokio's cooperative budget
/// (`unconstrained`): the caller may be a task of a current-thread runtime
/// (the writer's own thread, `writer/handle.rs`) that has spent its
/// budget, and a `JoinHandle` polled then answers Pending and defers its
/// wake-up to that task's next yield, which a caller blocked here never
/// reaches: the writer hung at its next read.
///
/// A task that failed (panicked, or was cancelled by the runtime's end)
/// is the engine's error, named by the database it ran against.
fn wait_for<T>(target: &Target, task: tokio::task::JoinHandle<T>) -> Result<T, StoreError> {
    futures::executor::block_on(tokio::task::unconstrained(task))
        .map_err(|e| StoreError::Engine(format!("{target}: a database task failed: {e}")))
}

impl PostgresStore {
    /// Runs `future` on the store's runtime and blocks the caller (any
    /// thread, a runtime worker included) until it is done.
    fn run<T, F>(&self, future: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let Some(runtime) = &self.runtime.0 else {
            return Err(StoreError::Engine("the PostgreSQL store is closed".into()));
        };
        let task = runtime.spawn(future);
        wait_for(&self.shared.target, task)?
    }

    /// The schema holding the region's tables.
    pub fn schema(&self) -> &str {
        &self.shared.schema
    }

    #[cfg(test)]
    fn pause_after_fence(&self, pause: Option<std::time::Duration>) {
        *self
            .pause_after_fence
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = pause;
    }
}

impl PostgresStore {
    /// Stages `batch` at the epoch the store holds now, which must be
    /// `expected` when given: a `Node` of an earlier epoch (a step still
    /// running after its writer stepped down, [`EpochStore`]) never
    /// commits at a later epoch this process took since. Refused without a
    /// round trip when never fenced, or lost since. Sent at once, with
    /// everything staged before it, when it takes the staged set over its
    /// bounds (`staged.rs`).
    fn commit_at(&self, expected: Option<u64>, batch: Batch) -> Result<(), StoreError> {
        let epoch = self.epoch_to_commit()?;
        if let Some(held) = expected.filter(|held| *held != epoch) {
            return Err(StoreError::Fenced { held, current: epoch });
        }
        if batch.is_empty() {
            return Ok(());
        }
        // Staged on top of a flight in progress (`flush.rs`), without
        // waiting for it: if it fails, what was staged on top of it goes
        // too and the next flush says so. A failure nobody was told of
        // yet refuses the commit (it may rest on what was lost) and stays
        // for the writer's `finish_flush`. The flights' lock is held while
        // the batch is staged, so a flight cannot end in between.
        let over_bounds = {
            let flights = self.flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(e) = flights.unreported_failure(Some(epoch)) {
                return Err(e);
            }
            // Not while a flush plans and sends what is staged.
            let _one_commit = self
                .commit_lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.staged.stage(epoch, batch)?
        };
        if !over_bounds {
            return Ok(());
        }
        // Over its bounds: sent at once, after the flight in progress.
        let flight = self.landed_flight();
        if let Some(e) = flight.unreported_failure(Some(epoch)) {
            return Err(e);
        }
        let _one_commit = self
            .commit_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.send_staged(Some(epoch), true)
    }

    /// Lands every batch staged at `expected`'s epoch (None: at whichever
    /// the store holds), in one transaction; nothing staged, no round trip.
    /// An error when they did not all land: dropped by a fence, refused,
    /// fenced, or of unknown outcome; or when a flight of that epoch
    /// (`flush.rs`) failed and nobody was told yet.
    fn flush_at(&self, expected: Option<u64>) -> Result<(), StoreError> {
        // A failed flight its writer was not told of refuses with a copy
        // and stays for the writer's `finish_flush` (`flush.rs`): the
        // shutdown flush must not take it from a writer stuck in a step.
        let flight = self.landed_flight();
        if let Some(e) = flight.unreported_failure(self.acting_epoch(expected)) {
            return Err(e);
        }
        let _one_flush = self
            .commit_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.send_staged(expected, false)
    }

    /// Sends what is staged (the caller holds the commit lock): planned
    /// against the cache, which knows what the server holds, fenced with
    /// the epoch it was staged at. Landed, the cache takes its writes;
    /// failed, the cache is dropped (it may have landed) and a fenced or
    /// unknown outcome stops every later commit (`commit_failed`). Either
    /// way the staged writes go. `at_commit`: sent by a commit for going
    /// over the bounds, which answers for its own batch only, so that the
    /// next flush fails too if earlier commits were lost with it.
    fn send_staged(&self, expected: Option<u64>, at_commit: bool) -> Result<(), StoreError> {
        let Some(taken) = self.staged.take(expected)? else {
            return Ok(());
        };
        let sent = self.unwound(&taken, || self.send(&taken))?;
        let dropped = match &sent {
            Err(e) if at_commit && taken.batches > 1 => Some(staged::copy_of(e)),
            _ => None,
        };
        self.staged.sent(&taken, dropped);
        sent
    }

    /// Runs `send` of `taken`, which the staged set holds as its flush in
    /// progress: a panic in it (planning, the cache's write-through) must
    /// not leave that flush never ended (the writer's view would read its
    /// writes, never sent, and the next flush could not take the staged
    /// set). Caught, it ends as a flight's does (`flush.rs`,
    /// `landed_flight`): the cache dropped, the writes and what is staged
    /// on top of them gone, and the outcome unknown (it may have landed),
    /// which stops later commits.
    fn unwound<T>(&self, taken: &staged::Taken, send: impl FnOnce() -> T) -> Result<T, StoreError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(send)).map_err(|_| {
            self.cache.clear();
            let e = StoreError::CommitOutcomeUnknown("a panic while a flush was sent".into());
            self.staged.flight_failed(taken, &e);
            self.commit_failed(&e, taken.epoch);
            e
        })
    }

    fn send(&self, taken: &staged::Taken) -> Result<(), StoreError> {
        let (started, task) = self.dispatch(taken, false, None)?;
        let ran = self.join(task);
        self.sent_ended(taken, started, ran)
    }

    /// Starts the transaction of `taken` on the store's runtime: fenced
    /// first with the epoch it was staged at (lost since: nothing is sent,
    /// and the cache is dropped). Returns the cache's generation to end it
    /// with and the task. `flight`: a group's flight, which the writer's
    /// next step reads past (`cache.rs`, `State::busy_for`); `landed`
    /// runs on the store's runtime once the transaction committed.
    fn dispatch(
        &self,
        taken: &staged::Taken,
        flight: bool,
        landed: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<(u64, commit::Task), StoreError> {
        let epoch = taken.epoch;
        let current = match self.epoch_to_commit() {
            Ok(current) if current == epoch => Ok(()),
            Ok(current) => Err(StoreError::Fenced { held: epoch, current }),
            Err(e) => Err(e),
        };
        if let Err(e) = current {
            self.cache.clear();
            return Err(e);
        }
        let Some(runtime) = &self.runtime.0 else {
            return Err(StoreError::Engine("the PostgreSQL store is closed".into()));
        };
        let plan = self
            .cache
            .planning(|absent, highest_known| commit::plan(&taken.writes, absent, highest_known));
        #[cfg(test)]
        let pause = *self
            .pause_after_fence
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        #[cfg(not(test))]
        let pause = None;
        let started = if flight {
            self.cache.flight_started()
        } else {
            self.cache.commit_started()
        };
        let shared = self.shared.clone();
        let writes = taken.writes.clone();
        let task = runtime.spawn(async move {
            let outcome = commit::commit(shared, epoch, writes, plan, pause).await;
            if let (Ok(_), Some(landed)) = (&outcome.1, landed) {
                // A panic there must not turn a flight that landed into a
                // failed join (its outcome is the transaction's): the
                // writer still answers the replies `landed` did not take.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(landed)).is_err() {
                    tracing::error!("a landed flight's callback panicked; the writer answers its clients");
                }
            }
            outcome
        });
        Ok((started, task))
    }

    /// Waits for a transaction [`Self::dispatch`] started.
    fn join(&self, task: commit::Task) -> Result<commit::Outcome, StoreError> {
        wait_for(&self.shared.target, task)
    }

    /// The transaction of `taken` ended (`ran`): landed, the cache takes
    /// its writes; failed, the cache is dropped and a fenced or unknown
    /// outcome stops every later commit.
    fn sent_ended(
        &self,
        taken: &staged::Taken,
        started: u64,
        ran: Result<commit::Outcome, StoreError>,
    ) -> Result<(), StoreError> {
        match ran {
            Ok((plan, Ok(learnt))) => {
                self.cache
                    .commit_ended(started, Some((commit::sent(&taken.writes, &plan), learnt)));
                Ok(())
            }
            Ok((_, Err(e))) | Err(e) => {
                self.cache.commit_ended(started, None::<(std::iter::Empty<_>, _)>);
                self.commit_failed(&e, taken.epoch);
                Err(e)
            }
        }
    }

    /// This store as the writer of `epoch` sees it: the same reads, and
    /// commits only at that epoch (see [`EpochStore`]).
    pub fn at_epoch(self: &Arc<Self>, epoch: u64) -> Arc<dyn Store> {
        Arc::new(EpochStore {
            store: self.clone(),
            epoch,
            sees: Sees::Landed,
        })
    }
}

/// A [`PostgresStore`] bound to one epoch of the writer lease: what one
/// writer's `Node` runs on. The process keeps one store for its life and
/// fences it anew at every takeover; a step of the `Node` of an earlier
/// epoch that is still running (its stop timed out) must not commit at
/// the new epoch, which the database's fence alone would let through.
struct EpochStore {
    store: Arc<PostgresStore>,
    epoch: u64,
    /// Landed for the `Node`'s readers, staged for its writer's view
    /// ([`Store::writers_view`]).
    sees: Sees,
}

impl Store for EpochStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.store.get_as(self.sees, table, key)
    }
    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.store.get_many_as(self.sees, table, keys)
    }
    fn prefetch(&self, reads: &Prefetch) -> Result<(), StoreError> {
        self.store.prefetch(reads)
    }
    fn prefetches(&self) -> bool {
        self.store.prefetches()
    }
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.store.scan_as(self.sees, table, prefix, after, limit)
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.store.commit_at(Some(self.epoch), batch)
    }
    fn writers_view(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(EpochStore {
            store: self.store.clone(),
            epoch: self.epoch,
            sees: Sees::Staged,
        }))
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.store.flush_at(Some(self.epoch))
    }
    fn start_flush(&self) -> Result<(), StoreError> {
        self.store.start_flush_at(Some(self.epoch), None)
    }
    fn start_flush_then(&self, landed: Box<dyn FnOnce() + Send>) -> Result<(), StoreError> {
        self.store.start_flush_at(Some(self.epoch), Some(landed))
    }
    fn finish_flush(&self) -> Result<(), StoreError> {
        self.store.finish_flush_at(Some(self.epoch))
    }
    fn overlaps_flushes(&self) -> bool {
        true
    }
    fn commits_on_top_of_a_flight(&self) -> bool {
        true
    }
    fn waits_on_io(&self) -> bool {
        self.store.waits_on_io()
    }
    fn reopen(&self) -> Result<(), StoreError> {
        self.store.reopen()
    }
}

/// What a read of the store sees: the writer's own view sees what it
/// staged (its next step reads what the last one committed, as on every
/// engine); every other reader (the API's Gets and Lists, peers' Lookups,
/// links, Watch streams) sees only what landed. A flush that fails drops
/// what it had staged, so a write staged and seen by a client could be
/// taken back by a routine error (a statement timeout, a restarting
/// server), not only by a crash: a client that read it could then pass an
/// etag check against a revision that never was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sees {
    Staged,
    Landed,
}

impl Sees {
    /// The staged write of `key`, if this view sees staged writes and
    /// one was staged (Some(None): staged as removed).
    fn staged(self, staged: &staged::Staged, table: Table, key: &[u8]) -> Option<Option<Vec<u8>>> {
        match self {
            Sees::Staged => staged.get(table, key),
            Sees::Landed => None,
        }
    }
}

/// Rows a scan of a walk's page reads at least (a page after the first,
/// or one whose run was used up): what it was asked for and the next
/// pages, kept as a run (`cache.rs`). A P1 work step on postgres takes a
/// page of a few hundred back-references of about 200 bytes each (with
/// the run's overhead): a read of 4,096 serves several steps and stays
/// inside a run's bound.
pub const RUN_READ_AHEAD: usize = 4096;

/// How many rows a scan that goes to the server asks for: `asked`, or,
/// for a page of the writer's own walk (a page after the first, or one
/// where the last read's rows were used up: a walk that starts from the
/// prefix each step, its rows removed as it goes) in one of
/// `cache::RUN_TABLES`, [`RUN_READ_AHEAD`] at least, kept as a run
/// (`cache.rs`) so the next steps' pages cost no round trip. Only the
/// writer's view reads ahead: the API's, peers' and streams' scans page
/// on their own bounds, and the rows they would read ahead (and the runs
/// they would push out) are the writer's.
fn rows_to_read(table: Table, sees: Sees, continues: bool, looked: &RunLookup, limit: usize, asked: usize) -> usize {
    let walking = sees == Sees::Staged
        && (continues || matches!(looked, RunLookup::Short))
        && limit > 1
        && cache::RUN_TABLES.contains(&table);
    if walking {
        asked.max(RUN_READ_AHEAD)
    } else {
        asked
    }
}

impl PostgresStore {
    fn get_as(&self, sees: Sees, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(staged) = sees.staged(&self.staged, table, key) {
            return Ok(staged);
        }
        let generation = match self.cache.lookup_as(sees == Sees::Staged, table, key) {
            Lookup::Hit(value) => return Ok(value),
            Lookup::Miss(generation) => generation,
        };
        let value = self.run(commit::get(self.shared.clone(), table, key.to_vec()))?;
        self.cache.remember(generation, table, key.to_vec(), value.clone());
        Ok(value)
    }

    fn get_many_as(&self, sees: Sees, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut values = Vec::with_capacity(keys.len());
        let mut missed = Vec::new();
        for key in keys {
            if let Some(staged) = sees.staged(&self.staged, table, key) {
                values.push(staged);
                continue;
            }
            match self.cache.lookup_as(sees == Sees::Staged, table, key) {
                Lookup::Hit(value) => values.push(value),
                Lookup::Miss(generation) => {
                    missed.push((values.len(), generation));
                    values.push(None);
                }
            }
        }
        if missed.is_empty() {
            return Ok(values);
        }
        let asked: Vec<Vec<u8>> = missed.iter().map(|(i, _)| keys[*i].clone()).collect();
        let found: std::collections::HashMap<Vec<u8>, Vec<u8>> = self
            .run(commit::get_many(self.shared.clone(), table, asked))?
            .into_iter()
            .collect();
        for (i, generation) in missed {
            let value = found.get(&keys[i]).cloned();
            self.cache.remember(generation, table, keys[i].clone(), value.clone());
            values[i] = value;
        }
        Ok(values)
    }

    fn scan_as(
        &self,
        sees: Sees,
        table: Table,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (start, end) = commit::scan_bounds(prefix, after);
        // Before the server is asked: a flush that lands meanwhile leaves
        // them in both, which merge the same.
        let staged = match sees {
            Sees::Staged => self.staged.range(table, &start, end.as_deref(), limit),
            Sees::Landed => Vec::new(),
        };
        // Each staged removal may hide one of the server's rows.
        let asked = limit.saturating_add(staged.iter().filter(|(_, value)| value.is_none()).count());
        let writers_view = sees == Sees::Staged;
        let rows = match self.cache.lookup_prefix_as(writers_view, table, prefix) {
            PrefixLookup::Empty => Vec::new(),
            PrefixLookup::Miss(generation) => {
                match self
                    .cache
                    .lookup_run_as(writers_view, table, &start, end.as_deref(), asked)
                {
                    RunLookup::Hit(rows) => rows,
                    looked => {
                        let whole_prefix = start == prefix;
                        let read = rows_to_read(table, sees, after.is_some(), &looked, limit, asked);
                        let mut rows = self.run(commit::scan(
                            self.shared.clone(),
                            table,
                            start.clone(),
                            end.clone(),
                            read,
                        ))?;
                        if rows.is_empty() && whole_prefix {
                            self.cache.remember_empty_prefix(generation, table, prefix.to_vec());
                        } else if limit > 1 && sees == Sees::Staged {
                            // Not a check that a row exists (limit 1): its run
                            // would be one row, and push out a walk's. Nor
                            // another view's scan: runs are few (four a
                            // table), and an API's or a peer's page would push
                            // out the writer's walk (any view reads a run: it
                            // holds what landed).
                            self.cache
                                .remember_run(generation, table, &start, end.as_deref(), read, &rows);
                        }
                        rows.truncate(asked);
                        rows
                    }
                }
            }
        };
        if staged.is_empty() {
            return Ok(rows);
        }
        Ok(crate::store::overlay::merge(rows, staged, asked, limit))
    }
}

impl Store for PostgresStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.get_as(Sees::Staged, table, key)
    }

    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.get_many_as(Sees::Staged, table, keys)
    }

    /// Asks the database only for what the cache does not know and no
    /// staged write answers, in one round trip, and keeps every answer
    /// (absent keys and empty prefixes too) unless a flush started
    /// meanwhile: what the server holds, which staged writes do not change
    /// until they land.
    fn prefetch(&self, reads: &Prefetch) -> Result<(), StoreError> {
        let generation = self.cache.generation();
        let keys: Vec<(Table, Vec<Vec<u8>>)> = reads
            .keys
            .iter()
            .map(|(table, keys)| {
                let unknown = self
                    .cache
                    .unknown_keys(true, *table, keys, |key| self.staged.holds(*table, key));
                (*table, unknown)
            })
            .filter(|(_, keys)| !keys.is_empty())
            .collect();
        let prefixes: commit::PrefixRanges = reads
            .prefixes
            .iter()
            .map(|(table, prefixes)| {
                let unknown = self.cache.unknown_prefixes(true, *table, prefixes);
                // A prefix without an end (empty, or all 0xff) is left to
                // its scan.
                let (lows, highs): (Vec<Vec<u8>>, Vec<Vec<u8>>) = unknown
                    .into_iter()
                    .filter_map(|prefix| commit::scan_bounds(&prefix, None).1.map(|end| (prefix, end)))
                    .unzip();
                (*table, lows, highs)
            })
            .filter(|(_, lows, _)| !lows.is_empty())
            .collect();
        if keys.is_empty() && prefixes.is_empty() {
            return Ok(());
        }
        // The highest key of each table asked and not known, in the same
        // round trip: a key above it (a uid minted after every row of the
        // table, as a cascade's referrers are after its target) is absent
        // without asking, from the next page on.
        let mut highest: Vec<Table> = keys
            .iter()
            .map(|(table, _)| *table)
            .chain(prefixes.iter().map(|(table, _, _)| *table))
            .filter(|table| !self.cache.highest_known(*table))
            .collect();
        highest.sort_unstable();
        highest.dedup();
        // Shared with the read's task, not copied for it.
        let keys = Arc::new(keys);
        let prefixes = Arc::new(prefixes);
        let found = self.run(commit::prefetch(
            self.shared.clone(),
            keys.clone(),
            prefixes.clone(),
            highest,
        ))?;
        for (table, key) in found.highest {
            self.cache.remember_highest(generation, table, key);
        }
        let mut rows: std::collections::HashMap<Table, std::collections::HashMap<Vec<u8>, Vec<u8>>> =
            std::collections::HashMap::new();
        for (table, (key, value)) in found.rows {
            rows.entry(table).or_default().insert(key, value);
        }
        self.cache.remember_all(
            generation,
            keys.iter().flat_map(|(table, keys)| {
                let mut found = rows.remove(table).unwrap_or_default();
                keys.iter()
                    .map(move |key| (*table, key.clone(), found.remove(key.as_slice())))
            }),
        );
        let occupied: std::collections::HashSet<(Table, Vec<u8>)> = found.occupied.into_iter().collect();
        for (table, lows, _) in prefixes.iter() {
            for prefix in lows {
                let key = (*table, prefix.clone());
                if !occupied.contains(&key) {
                    self.cache.remember_empty_prefix(generation, key.0, key.1);
                }
            }
        }
        Ok(())
    }

    fn prefetches(&self) -> bool {
        true
    }

    /// The server's rows merged with the staged writes in range
    /// (`overlay::merge`). A prefix known to hold no row on the server is
    /// not asked for; a scan of a whole prefix that finds none there is
    /// remembered. A scan inside a stretch of rows the cache knows whole
    /// (a run: what an earlier scan found, kept up by the commits since,
    /// `cache.rs`) is answered from it; a walk's page (after the first,
    /// or where its run ran short) reads [`RUN_READ_AHEAD`] rows at least,
    /// for the pages after it.
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.scan_as(Sees::Staged, table, prefix, after, limit)
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.commit_at(None, batch)
    }

    /// Lands every batch committed since the last flush in one
    /// transaction (see `flush_at`); its COMMIT, once returned, is durable
    /// (the server's `synchronous_commit`).
    fn flush(&self) -> Result<(), StoreError> {
        self.flush_at(None)
    }

    /// Sends what is staged as a flight (`flush.rs`) and returns at once.
    fn start_flush(&self) -> Result<(), StoreError> {
        self.start_flush_at(None, None)
    }

    /// [`Store::start_flush`], and `landed` runs on the store's runtime
    /// once the flight's COMMIT returned (`flush.rs`).
    fn start_flush_then(&self, landed: Box<dyn FnOnce() + Send>) -> Result<(), StoreError> {
        self.start_flush_at(None, Some(landed))
    }

    fn finish_flush(&self) -> Result<(), StoreError> {
        self.finish_flush_at(None)
    }

    fn overlaps_flushes(&self) -> bool {
        true
    }

    fn commits_on_top_of_a_flight(&self) -> bool {
        true
    }

    /// Nothing to reopen: the pools make their connections again. The
    /// writer retries only once the server answers.
    fn reopen(&self) -> Result<(), StoreError> {
        self.run(commit::ping(self.shared.clone()))
    }
}

#[cfg(test)]
mod read_ahead_tests {
    use super::*;

    #[test]
    fn a_writers_walk_reads_ahead_and_logs_records_single_rows_and_other_views_do_not() {
        let read = |table, sees, continues, looked: RunLookup, limit| {
            rows_to_read(table, sees, continues, &looked, limit, limit)
        };
        let writer = Sees::Staged;
        assert_eq!(
            read(Table::Backrefs, writer, true, RunLookup::Miss, 300),
            RUN_READ_AHEAD,
            "a page after the first"
        );
        assert_eq!(
            read(Table::Backrefs, writer, false, RunLookup::Short, 300),
            RUN_READ_AHEAD,
            "its run used up"
        );
        assert_eq!(read(Table::DueIndex, writer, true, RunLookup::Miss, 2), RUN_READ_AHEAD);
        assert_eq!(
            read(Table::Backrefs, writer, false, RunLookup::Miss, 300),
            300,
            "a first page"
        );
        assert_eq!(
            read(Table::Backrefs, writer, true, RunLookup::Miss, 1),
            1,
            "whether a row exists"
        );
        assert_eq!(
            read(Table::Backrefs, writer, true, RunLookup::Miss, 10_000),
            10_000,
            "more than a read-ahead"
        );
        assert_eq!(
            read(Table::Outbox, writer, true, RunLookup::Miss, 32),
            32,
            "a log keeps no run (the outbox's compaction pages by 32 rows of up to 64 KiB)"
        );
        assert_eq!(read(Table::Audit, writer, false, RunLookup::Short, 300), 300);
        assert_eq!(
            read(Table::Resources, writer, true, RunLookup::Miss, 100),
            100,
            "records are not index rows"
        );
        assert_eq!(
            read(Table::Backrefs, Sees::Landed, true, RunLookup::Miss, 300),
            300,
            "a peer's or the API's page"
        );
    }
}
