//! `Engine::Postgres`: where the server comes from, how a region's store is
//! opened and fenced for a node of the bench, the store's call profile,
//! and the native row (PostgreSQL's own `ON DELETE CASCADE` of the same
//! shape, on the same server).
//!
//! The server is `--postgres-url` (its password from `CASCADE_PG_PASSWORD`),
//! else a throwaway one started by `cascade-testpg` in the parent process
//! (`fsync=off`; stopped and removed when the parent exits). Each region of
//! a row gets a schema of its own in that database (as a region does in
//! production: one schema per region), dropped when the row ends, so the
//! role needs no CREATEDB, only CREATE on the database.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_core::RegionId;
use cascade_node::store::{
    open_postgres, Batch, Entry, LeaseHolder, PostgresSettings, PostgresStore, Prefetch, Store, StoreError, Table,
    WriterLease,
};
use serde::{Deserialize, Serialize};

use crate::harness::{round3, Result};
use crate::spec::{Row, RowSpec, Shape};

/// Where the password of `--postgres-url` comes from (as for `cascade serve`).
pub const PASSWORD_ENV: &str = "CASCADE_PG_PASSWORD";

/// The cluster name the bench's regions record in their schema.
const CLUSTER: &str = "cascade-bench";

/// The lease a bench node takes: long enough for any row (nothing renews
/// it; nothing else competes for it either).
const LEASE_TTL: Duration = Duration::from_secs(6 * 3600);

/// How long the bench's own connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The database every row of a run uses (no password: that travels in
/// [`PASSWORD_ENV`], never on a command line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PgTarget {
    pub url: String,
    /// Whether it is the throwaway server (`fsync=off`), for the notes.
    pub throwaway: bool,
}

/// The server of this run: `url` (a real server) or a throwaway one;
/// Err(why) when neither is possible. The throwaway server lives as long
/// as this (the parent) process; its password is put in [`PASSWORD_ENV`]
/// for the children.
pub fn resolve(url: Option<&str>) -> std::result::Result<PgTarget, String> {
    if let Some(url) = url {
        return Ok(PgTarget {
            url: url.to_owned(),
            throwaway: false,
        });
    }
    let server = std::panic::catch_unwind(cascade_testpg::server)
        .map_err(|_| "the throwaway PostgreSQL server did not start".to_owned())?
        .ok_or_else(|| {
            "no --postgres-url, and no PostgreSQL installed for a throwaway server \
             (apt-get install postgresql, or set CASCADE_PG_BIN)"
                .to_owned()
        })?;
    let db = std::panic::catch_unwind(|| server.fresh_database("bench"))
        .map_err(|_| "cannot create the bench's database on the throwaway server".to_owned())?;
    std::env::set_var(PASSWORD_ENV, db.password());
    Ok(PgTarget {
        url: db.url(),
        throwaway: true,
    })
}

fn password() -> Option<String> {
    std::env::var(PASSWORD_ENV).ok()
}

/// A schema name unique to this process and `what` (lower-case letters,
/// digits and `_`, as `check_schema_name` wants).
pub fn schema_name(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let clean: String = what
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(30)
        .collect();
    format!(
        "bench_{}_{}_{clean}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A region's store in schema `schema`, opened, its lease taken and the
/// store fenced at that epoch (a store commits only once fenced), as the
/// role loop does before it opens a node, without the loop: the rows
/// measure the engine.
pub fn open_region(target: &PgTarget, region: &RegionId, schema: &str) -> Result<Arc<PostgresStore>> {
    let mut settings = PostgresSettings::new(target.url.clone(), password());
    settings.schema = schema.to_owned();
    let store = open_postgres(&settings, region, CLUSTER)?;
    let me = LeaseHolder {
        node: format!("bench-{}", std::process::id()),
        address: "http://127.0.0.1:0".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    };
    let epoch = store
        .try_acquire(&me, LEASE_TTL)?
        .ok_or_else(|| format!("the lease of region {region} in schema {schema} is held by another node"))?;
    store.fence(epoch);
    Ok(store)
}

/// A connection of the bench's own (native rows, dropping schemas).
async fn connect(target: &PgTarget) -> Result<tokio_postgres::Client> {
    let mut config: tokio_postgres::Config = target.url.parse()?;
    if let Some(p) = password() {
        config.password(p);
    }
    config.connect_timeout(CONNECT_TIMEOUT);
    // A bound on every statement (a 1M native row's populate is the longest).
    config.options("-c statement_timeout=600000");
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Drops `schemas` (the rows' regions, once their stores are closed).
pub async fn drop_schemas(target: &PgTarget, schemas: &[String]) -> Result<()> {
    if schemas.is_empty() {
        return Ok(());
    }
    let client = connect(target).await?;
    for s in schemas {
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {s} CASCADE"))
            .await?;
    }
    Ok(())
}

/// Calls and time per kind of store call (counted by [`ProfiledStore`]).
#[derive(Default)]
pub struct StoreProfile {
    gets: AtomicU64,
    get_ns: AtomicU64,
    get_many: AtomicU64,
    get_many_keys: AtomicU64,
    get_many_ns: AtomicU64,
    scans: AtomicU64,
    scan_ns: AtomicU64,
    commits: AtomicU64,
    commit_ns: AtomicU64,
    /// The writer's flushes that went to the server (each the group's one
    /// transaction: a commit only stages), and the time of every flush;
    /// for a flight (`Store::start_flush`), each one finished and the time
    /// the writer waited for it, not its transaction's.
    flushes: AtomicU64,
    flush_ns: AtomicU64,
    prefetches: AtomicU64,
    prefetch_ns: AtomicU64,
    /// Point reads that took longer than [`MISS_NS`]: the cache missed
    /// and the read went to the server.
    slow_gets: AtomicU64,
    /// Scans that took longer than [`MISS_NS`] (they went to the server),
    /// and their time: a scan the cache answers is a lookup and a copy.
    slow_scans: AtomicU64,
    slow_scan_ns: AtomicU64,
    /// Per table (`Table::ALL`'s order): server reads (slow gets), scans,
    /// and the scans that went to the server.
    by_table: [(AtomicU64, AtomicU64, AtomicU64); Table::ALL.len()],
}

/// A point read slower than this went to the server (a cache hit is a
/// map lookup and a copy: a few microseconds at most).
const MISS_NS: u64 = 50_000;

/// What a [`StoreProfile`] counted, to subtract one from another.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProfileSnapshot {
    pub gets: u64,
    pub get_ns: u64,
    pub slow_gets: u64,
    pub get_many: u64,
    pub get_many_keys: u64,
    pub get_many_ns: u64,
    pub scans: u64,
    pub scan_ns: u64,
    pub commits: u64,
    pub commit_ns: u64,
    pub flushes: u64,
    pub flush_ns: u64,
    pub prefetches: u64,
    pub prefetch_ns: u64,
    pub slow_scans: u64,
    pub slow_scan_ns: u64,
    /// Per table: (server reads, scans, server scans).
    pub by_table: [(u64, u64, u64); Table::ALL.len()],
}

fn table_index(table: Table) -> usize {
    Table::ALL.iter().position(|&t| t == table).unwrap_or(0)
}

impl StoreProfile {
    pub fn snapshot(&self) -> ProfileSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProfileSnapshot {
            gets: l(&self.gets),
            get_ns: l(&self.get_ns),
            slow_gets: l(&self.slow_gets),
            get_many: l(&self.get_many),
            get_many_keys: l(&self.get_many_keys),
            get_many_ns: l(&self.get_many_ns),
            scans: l(&self.scans),
            scan_ns: l(&self.scan_ns),
            commits: l(&self.commits),
            commit_ns: l(&self.commit_ns),
            flushes: l(&self.flushes),
            flush_ns: l(&self.flush_ns),
            prefetches: l(&self.prefetches),
            prefetch_ns: l(&self.prefetch_ns),
            slow_scans: l(&self.slow_scans),
            slow_scan_ns: l(&self.slow_scan_ns),
            by_table: std::array::from_fn(|i| (l(&self.by_table[i].0), l(&self.by_table[i].1), l(&self.by_table[i].2))),
        }
    }
}

impl ProfileSnapshot {
    pub fn minus(self, b: Self) -> Self {
        Self {
            gets: self.gets.saturating_sub(b.gets),
            get_ns: self.get_ns.saturating_sub(b.get_ns),
            slow_gets: self.slow_gets.saturating_sub(b.slow_gets),
            get_many: self.get_many.saturating_sub(b.get_many),
            get_many_keys: self.get_many_keys.saturating_sub(b.get_many_keys),
            get_many_ns: self.get_many_ns.saturating_sub(b.get_many_ns),
            scans: self.scans.saturating_sub(b.scans),
            scan_ns: self.scan_ns.saturating_sub(b.scan_ns),
            commits: self.commits.saturating_sub(b.commits),
            commit_ns: self.commit_ns.saturating_sub(b.commit_ns),
            flushes: self.flushes.saturating_sub(b.flushes),
            flush_ns: self.flush_ns.saturating_sub(b.flush_ns),
            prefetches: self.prefetches.saturating_sub(b.prefetches),
            prefetch_ns: self.prefetch_ns.saturating_sub(b.prefetch_ns),
            slow_scans: self.slow_scans.saturating_sub(b.slow_scans),
            slow_scan_ns: self.slow_scan_ns.saturating_sub(b.slow_scan_ns),
            by_table: std::array::from_fn(|i| {
                (
                    self.by_table[i].0.saturating_sub(b.by_table[i].0),
                    self.by_table[i].1.saturating_sub(b.by_table[i].1),
                    self.by_table[i].2.saturating_sub(b.by_table[i].2),
                )
            }),
        }
    }

    pub fn plus(self, b: Self) -> Self {
        Self {
            gets: self.gets + b.gets,
            get_ns: self.get_ns + b.get_ns,
            slow_gets: self.slow_gets + b.slow_gets,
            get_many: self.get_many + b.get_many,
            get_many_keys: self.get_many_keys + b.get_many_keys,
            get_many_ns: self.get_many_ns + b.get_many_ns,
            scans: self.scans + b.scans,
            scan_ns: self.scan_ns + b.scan_ns,
            commits: self.commits + b.commits,
            commit_ns: self.commit_ns + b.commit_ns,
            flushes: self.flushes + b.flushes,
            flush_ns: self.flush_ns + b.flush_ns,
            prefetches: self.prefetches + b.prefetches,
            prefetch_ns: self.prefetch_ns + b.prefetch_ns,
            slow_scans: self.slow_scans + b.slow_scans,
            slow_scan_ns: self.slow_scan_ns + b.slow_scan_ns,
            by_table: std::array::from_fn(|i| {
                (
                    self.by_table[i].0 + b.by_table[i].0,
                    self.by_table[i].1 + b.by_table[i].1,
                    self.by_table[i].2 + b.by_table[i].2,
                )
            }),
        }
    }

    /// One line: calls per deleted resource and the share of `wall_s`
    /// each kind of call took (calls from the API's readers run beside
    /// the writer's, so the shares may add up to more than the wall);
    /// the flushes' mean in ms, as a flush is the group's transaction.
    pub fn describe(&self, deleted: u64, wall_s: f64) -> String {
        let per = |x: u64| round3(x as f64 / deleted.max(1) as f64);
        let share = |ns: u64| (ns as f64 / 1e9 / wall_s.max(1e-9) * 100.0).round();
        let mean_ms = |ns: u64, calls: u64| round3(ns as f64 / 1e6 / calls.max(1) as f64);
        format!(
            "per deleted: {} gets ({} to the server, {}% of wall), {} get_many of {} keys ({}%), \
             {} scans ({}%; {} to the server, {}%), {} prefetches ({}%), {} commits ({}%), \
             {} flushes ({}%, {} ms each)",
            per(self.gets),
            per(self.slow_gets),
            share(self.get_ns),
            per(self.get_many),
            per(self.get_many_keys),
            share(self.get_many_ns),
            per(self.scans),
            share(self.scan_ns),
            per(self.slow_scans),
            share(self.slow_scan_ns),
            per(self.prefetches),
            share(self.prefetch_ns),
            per(self.commits),
            share(self.commit_ns),
            per(self.flushes),
            share(self.flush_ns),
            mean_ms(self.flush_ns, self.flushes),
        ) + &self.describe_tables(deleted)
    }

    /// `; server reads per deleted: table x, …; scans: table y, …; server
    /// scans: table z, …` (the tables at 0.001 per deleted resource or
    /// more: a step's round trips are a few per thousand deleted).
    fn describe_tables(&self, deleted: u64) -> String {
        let list = |pick: fn(&(u64, u64, u64)) -> u64| {
            Table::ALL
                .iter()
                .zip(&self.by_table)
                .map(|(t, c)| (t.name(), round3(pick(c) as f64 / deleted.max(1) as f64)))
                .filter(|(_, v)| *v >= 0.001)
                .map(|(t, v)| format!("{t} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "; server reads per deleted by table: {}; scans: {}; server scans: {}",
            list(|c| c.0),
            list(|c| c.1),
            list(|c| c.2)
        )
    }
}

/// A store that counts its calls and their time, around the PostgreSQL
/// store of a bench node: the round trips a cascade makes, per step kind.
pub struct ProfiledStore {
    inner: Arc<PostgresStore>,
    pub profile: Arc<StoreProfile>,
}

impl ProfiledStore {
    pub fn new(inner: Arc<PostgresStore>) -> Self {
        Self {
            inner,
            profile: Arc::default(),
        }
    }
}

fn timed<T>(calls: &AtomicU64, ns: &AtomicU64, f: impl FnOnce() -> T) -> (T, u64) {
    let started = Instant::now();
    let out = f();
    let took = started.elapsed().as_nanos() as u64;
    calls.fetch_add(1, Ordering::Relaxed);
    ns.fetch_add(took, Ordering::Relaxed);
    (out, took)
}

impl ProfiledStore {
    /// A flight's start (`start`), its time counted as a flush's: the
    /// writer waits there for the flight still in progress.
    fn flight_started(
        &self,
        start: impl FnOnce() -> std::result::Result<(), StoreError>,
    ) -> std::result::Result<(), StoreError> {
        let started = Instant::now();
        let out = start();
        let took = started.elapsed().as_nanos() as u64;
        self.profile.flush_ns.fetch_add(took, Ordering::Relaxed);
        out
    }
}

impl Store for ProfiledStore {
    fn get(&self, table: Table, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, StoreError> {
        let p = &self.profile;
        let (out, took) = timed(&p.gets, &p.get_ns, || self.inner.get(table, key));
        if took > MISS_NS {
            p.slow_gets.fetch_add(1, Ordering::Relaxed);
            p.by_table[table_index(table)].0.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> std::result::Result<Vec<Option<Vec<u8>>>, StoreError> {
        let p = &self.profile;
        p.get_many_keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
        timed(&p.get_many, &p.get_many_ns, || self.inner.get_many(table, keys)).0
    }

    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> std::result::Result<Vec<Entry>, StoreError> {
        let p = &self.profile;
        p.by_table[table_index(table)].1.fetch_add(1, Ordering::Relaxed);
        let (out, took) = timed(&p.scans, &p.scan_ns, || self.inner.scan(table, prefix, after, limit));
        if took > MISS_NS {
            p.slow_scans.fetch_add(1, Ordering::Relaxed);
            p.by_table[table_index(table)].2.fetch_add(1, Ordering::Relaxed);
            p.slow_scan_ns.fetch_add(took, Ordering::Relaxed);
        }
        out
    }

    fn prefetch(&self, reads: &Prefetch) -> std::result::Result<(), StoreError> {
        let p = &self.profile;
        timed(&p.prefetches, &p.prefetch_ns, || self.inner.prefetch(reads)).0
    }

    fn prefetches(&self) -> bool {
        self.inner.prefetches()
    }

    fn commit(&self, batch: Batch) -> std::result::Result<(), StoreError> {
        let p = &self.profile;
        timed(&p.commits, &p.commit_ns, || self.inner.commit(batch)).0
    }

    fn flush(&self) -> std::result::Result<(), StoreError> {
        // Counted when it went to the server: a flush with nothing staged
        // returns at once (a group whose steps all failed, a client step
        // that wrote nothing).
        let started = Instant::now();
        let out = self.inner.flush();
        let took = started.elapsed().as_nanos() as u64;
        let p = &self.profile;
        if took > MISS_NS {
            p.flushes.fetch_add(1, Ordering::Relaxed);
        }
        p.flush_ns.fetch_add(took, Ordering::Relaxed);
        out
    }

    /// The writer's time in it is counted as a flush's (it waits for a
    /// flight still in progress); the flight is counted when finished.
    fn start_flush(&self) -> std::result::Result<(), StoreError> {
        self.flight_started(|| self.inner.start_flush())
    }

    /// As [`Store::start_flush`] (the store answers the group's clients
    /// once its flight landed, as it does outside the bench).
    fn start_flush_then(&self, landed: Box<dyn FnOnce() + Send>) -> std::result::Result<(), StoreError> {
        self.flight_started(|| self.inner.start_flush_then(landed))
    }

    /// A flight ended: one flush, and the time the writer waited for it
    /// (not the flight's: the writer's next step ran meanwhile).
    fn finish_flush(&self) -> std::result::Result<(), StoreError> {
        let started = Instant::now();
        let out = self.inner.finish_flush();
        let took = started.elapsed().as_nanos() as u64;
        let p = &self.profile;
        p.flushes.fetch_add(1, Ordering::Relaxed);
        p.flush_ns.fetch_add(took, Ordering::Relaxed);
        out
    }

    fn overlaps_flushes(&self) -> bool {
        self.inner.overlaps_flushes()
    }

    fn commits_on_top_of_a_flight(&self) -> bool {
        self.inner.commits_on_top_of_a_flight()
    }

    fn waits_on_io(&self) -> bool {
        self.inner.waits_on_io()
    }

    fn reopen(&self) -> std::result::Result<(), StoreError> {
        self.inner.reopen()
    }
}

/// The native row's tables and rows for `shape` and `n` dependents, as
/// P1 makes them (names of the same length; the tree's networks are
/// `n/100`, the unset shape's floating IPs lose their port with `SET NULL`).
fn native_schema_sql(s: &str, shape: Shape, n: u64) -> String {
    let table = |name: &str, parent: &str, action: &str| {
        format!(
            "CREATE TABLE {s}.{name} (id bigint PRIMARY KEY, name text NOT NULL, \
             parent bigint REFERENCES {s}.{parent} (id) ON DELETE {action}); \
             CREATE INDEX ON {s}.{name} (parent);"
        )
    };
    let root = format!("CREATE TABLE {s}.root (id bigint PRIMARY KEY, name text NOT NULL);");
    match shape {
        Shape::Flat => format!(
            "{root} {} INSERT INTO {s}.root VALUES (0, 'bench/network/n'); \
             INSERT INTO {s}.child SELECT i, 'bench/port/p' || i, 0 FROM generate_series(0, {n} - 1) i;",
            table("child", "root", "CASCADE")
        ),
        Shape::Tree => {
            let networks = (n / 100).max(1);
            let subnets = n.saturating_sub(networks);
            format!(
                "{root} {} {} INSERT INTO {s}.root VALUES (0, 'bench/project/p'); \
                 INSERT INTO {s}.mid SELECT j, 'bench/network/n' || j, 0 FROM generate_series(0, {networks} - 1) j; \
                 INSERT INTO {s}.leaf SELECT i, 'bench/subnet/s' || i, i % {networks} \
                 FROM generate_series(0, {subnets} - 1) i;",
                table("mid", "root", "CASCADE"),
                table("leaf", "mid", "CASCADE")
            )
        }
        Shape::Unset => {
            let ports = n / 2;
            let ips = n - ports;
            format!(
                "{root} {} {} INSERT INTO {s}.root VALUES (0, 'bench/network/n'); \
                 INSERT INTO {s}.mid SELECT i, 'bench/port/p' || i, 0 FROM generate_series(0, {ports} - 1) i; \
                 INSERT INTO {s}.leaf SELECT i, 'bench/floating_ip/f' || i, i % {} \
                 FROM generate_series(0, {ips} - 1) i;",
                table("mid", "root", "CASCADE"),
                table("leaf", "mid", "SET NULL"),
                ports.max(1)
            )
        }
    }
}

/// The native row: PostgreSQL's own `ON DELETE CASCADE` of the P1 row's
/// shape and size, on the same server: populated with `generate_series`,
/// analysed, then the `DELETE` of the root timed alone (autocommit: its
/// commit included), and the `VACUUM` of the tables after it timed apart.
pub async fn native(spec: &RowSpec, target: &PgTarget) -> Result<Row> {
    let mut row = Row::for_spec(spec);
    let shape = spec.shape.unwrap_or(Shape::Flat);
    let client = connect(target).await?;
    let s = schema_name("native");
    client.batch_execute(&format!("CREATE SCHEMA {s}")).await?;
    let result = async {
        let populate = Instant::now();
        client.batch_execute(&native_schema_sql(&s, shape, spec.n)).await?;
        client.batch_execute("ANALYZE").await?;
        row.populate_s = Some(round3(populate.elapsed().as_secs_f64()));
        let started = Instant::now();
        let deleted_roots = client
            .execute(&format!("DELETE FROM {s}.root WHERE id = 0"), &[])
            .await?;
        let wall = started.elapsed().as_secs_f64();
        if deleted_roots != 1 {
            return Err(format!("the native DELETE removed {deleted_roots} roots, not 1").into());
        }
        let vacuum = Instant::now();
        client.batch_execute(&format!("VACUUM {s}.root")).await?;
        for t in ["child", "mid", "leaf"] {
            let exists: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = $2",
                    &[&s, &t],
                )
                .await?
                .get(0);
            if exists > 0 {
                client.batch_execute(&format!("VACUUM {s}.{t}")).await?;
            }
        }
        let vacuum_s = vacuum.elapsed().as_secs_f64();
        // What is left tells deleted from unset (the unset shape's leaves stay).
        let left: i64 = match shape {
            Shape::Unset => client
                .query_one(&format!("SELECT count(*) FROM {s}.leaf"), &[])
                .await?
                .get(0),
            _ => 0,
        };
        let unset = left.max(0) as u64;
        let deleted = (spec.n + 1).saturating_sub(unset);
        row.deleted = Some(deleted);
        row.unset = (unset > 0).then_some(unset);
        row.wall_s = Some(round3(wall));
        row.rate_per_s = Some((deleted as f64 / wall.max(1e-9)).round());
        row.vacuum_s = Some(round3(vacuum_s));
        row.operation_state = Some("SUCCEEDED".into());
        row.note = Some(format!(
            "PostgreSQL's ON DELETE CASCADE (one DELETE, autocommit); VACUUM after it {:.3} s{}",
            vacuum_s,
            if target.throwaway {
                "; throwaway server, fsync=off"
            } else {
                ""
            }
        ));
        Ok::<_, crate::harness::Error>(())
    }
    .await;
    let dropped = client.batch_execute(&format!("DROP SCHEMA {s} CASCADE")).await;
    result?;
    dropped?;
    row.tick_ms = None;
    Ok(row)
}
