//! In-process clusters of real nodes (real gRPC on loopback, real engines
//! in a temporary directory), and what every scenario shares: the engine
//! mapping, write counters, RSS, percentiles, waiting for an operation.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::Client;
use cascade_core::{RegionId, Schema};
use cascade_node::{Node, NodeEnv, NodeSettings, WriteStats, WriteStatsSnapshot};
use cascade_proto::v1;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use cascade_node::store::{MemoryStore, StorageEngine, Table, TableFootprint};

use crate::postgres::{self, PgTarget, ProfileSnapshot, ProfiledStore, StoreProfile};
use crate::spec::Engine;

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, Error>;

/// The one place that says how an engine is configured on a node.
pub fn engine_settings(engine: Engine, settings: &mut NodeSettings, dir: &Path) -> Result<()> {
    match engine {
        Engine::Memory => settings.data_dir = None,
        Engine::Sled => {
            settings.data_dir = Some(dir.to_owned());
            settings.engine = StorageEngine::Sled;
        }
        Engine::Fjall => {
            settings.data_dir = Some(dir.to_owned());
            settings.engine = StorageEngine::Fjall;
        }
        // The store is opened and fenced by `Cluster::start` and handed to
        // the node (`NodeEnv::store`): no directory.
        Engine::Postgres => {
            settings.data_dir = None;
            settings.engine = StorageEngine::Postgres;
        }
    }
    Ok(())
}

/// Whether this build can run a node on `engine` (postgres: whether a
/// server was found is `postgres::resolve`'s to say).
pub fn engine_available(engine: Engine) -> Result<()> {
    let mut settings = NodeSettings::new(
        RegionId::parse("probe")?,
        Arc::new(Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA)?),
        None,
    );
    engine_settings(engine, &mut settings, Path::new("probe"))
}

/// One node of a cluster: its client, its write counters, how to stop it.
pub struct Member {
    pub endpoint: String,
    pub client: Client,
    pub stats: Arc<WriteStats>,
    /// Postgres: the calls its store made (None on the other engines,
    /// which are not wrapped, so their figures stay as they were).
    pub store_profile: Option<Arc<StoreProfile>>,
    /// Engine memory: the node's store, handed to it by the harness so a
    /// row can say what its tables hold (`Cluster::memory_footprint`).
    pub memory: Option<Arc<MemoryStore>>,
    /// Peers in its settings (each has one watch stream to this node's).
    pub peers: usize,
    /// Where it serves its metrics (`ClusterSpec::metrics`).
    pub metrics_addr: Option<std::net::SocketAddr>,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::result::Result<(), cascade_node::NodeError>>,
}

/// Nodes started together, with the directory their engines write to.
pub struct Cluster {
    pub members: Vec<Member>,
    /// Postgres: the database and the regions' schemas, dropped by `stop`.
    postgres: Option<(PgTarget, Vec<String>)>,
    _dir: tempfile::TempDir,
}

/// How to start a cluster.
pub struct ClusterSpec<'a> {
    pub engine: Engine,
    pub regions: &'a [String],
    /// Region index → indexes of its peers. None: everyone.
    pub peers_of: Option<&'a dyn Fn(usize) -> Vec<usize>>,
    pub tick: Duration,
    /// The database of engine postgres.
    pub postgres: Option<&'a PgTarget>,
    /// `[audit] max_entries` of every node (None: the default).
    pub audit_max_entries: Option<u64>,
    /// `[audit] retain` of every node (None: the default, 90 days).
    pub audit_retain: Option<Duration>,
    /// Whether each node serves its Prometheus metrics on 127.0.0.1:0
    /// (`Member::metrics_addr`, read with [`scrape`]).
    pub metrics: bool,
}

/// `[audit] max_entries` for a row of `n` resources: room for every entry
/// the row writes (a populate writes one per resource, the probes and
/// the small writes a few thousand more), so that the nodes do not prune
/// the audit log while a cascade is measured. At the default (1,000,000),
/// a P1 of 1M pruned the entries its populate overfilled during the
/// probes and the cascade: work no deletion asked for, counted as the
/// cascade's (`local::probe_cost`). The audit scenario sets its own.
pub fn row_audit_cap(n: u64) -> u64 {
    n.saturating_mul(2).max(1_000_000)
}

impl<'a> ClusterSpec<'a> {
    /// A cluster of `regions` as a row asks for it (engine, tick),
    /// every node a peer of every other.
    pub fn for_row(row: &'a crate::spec::RowSpec, regions: &'a [String]) -> Self {
        Self {
            engine: row.engine,
            regions,
            peers_of: None,
            tick: Duration::from_millis(row.tick_ms),
            postgres: row.postgres.as_ref(),
            audit_max_entries: Some(row_audit_cap(row.n)),
            audit_retain: None,
            metrics: false,
        }
    }
}

impl Cluster {
    /// Binds every listener first so each node knows its peers' addresses,
    /// then opens and serves the nodes, then connects a client to each.
    pub async fn start(spec: ClusterSpec<'_>) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("cascade-bench-").tempdir()?;
        let schema = Arc::new(Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA)?);
        let mut listeners = Vec::new();
        for _ in spec.regions {
            listeners.push(TcpListener::bind("127.0.0.1:0").await?);
        }
        let endpoints = listeners
            .iter()
            .map(|l| Ok(format!("http://{}", l.local_addr()?)))
            .collect::<Result<Vec<_>>>()?;
        let mut members = Vec::new();
        let mut schemas = Vec::new();
        for (i, listener) in listeners.into_iter().enumerate() {
            let region = &spec.regions[i];
            let mut settings = NodeSettings::new(RegionId::parse(region)?, schema.clone(), None);
            engine_settings(spec.engine, &mut settings, &dir.path().join(region))?;
            settings.tick = spec.tick;
            if let Some(max) = spec.audit_max_entries {
                settings.audit.max_entries = max;
            }
            if let Some(retain) = spec.audit_retain {
                settings.audit.retain = retain;
            }
            if spec.metrics {
                settings.metrics_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
            }
            let peers = match spec.peers_of {
                Some(f) => f(i),
                None => (0..spec.regions.len()).filter(|&j| j != i).collect(),
            };
            settings.peers = peers
                .iter()
                .map(|&j| Ok((RegionId::parse(&spec.regions[j])?, endpoints[j].clone().into())))
                .collect::<Result<BTreeMap<_, _>>>()?;
            let mut memory = None;
            let (node, store_profile) = if spec.engine == Engine::Postgres {
                let target = spec.postgres.ok_or("engine postgres without a database")?;
                let schema = postgres::schema_name(region);
                schemas.push(schema.clone());
                let region_id = settings.region.clone();
                // Opening connects and migrates: off the runtime's workers.
                let store = tokio::task::block_in_place(|| postgres::open_region(target, &region_id, &schema))?;
                let profiled = Arc::new(ProfiledStore::new(store));
                let profile = profiled.profile.clone();
                let env = NodeEnv {
                    store: Some(profiled),
                    ..NodeEnv::default()
                };
                (Node::open_with(settings, env).await?, Some(profile))
            } else if spec.engine == Engine::Memory {
                // The store `Node::open` would open (no data directory), kept
                // here too so that its tables can be counted.
                let store = Arc::new(MemoryStore::default());
                memory = Some(store.clone());
                let env = NodeEnv {
                    store: Some(store),
                    ..NodeEnv::default()
                };
                (Node::open_with(settings, env).await?, None)
            } else {
                (Node::open(settings).await?, None)
            };
            let stats = node.write_stats();
            let metrics_addr = node.metrics_addr();
            let (tx, rx) = oneshot::channel::<()>();
            let shutdown = async {
                let _ = rx.await;
            };
            let task = tokio::spawn(node.serve(listener, shutdown));
            members.push(Member {
                endpoint: endpoints[i].clone(),
                client: Client::connect(&endpoints[i]).await?,
                stats,
                store_profile,
                memory,
                peers: peers.len(),
                metrics_addr,
                shutdown: Some(tx),
                task,
            });
        }
        let postgres = spec.postgres.map(|t| (t.clone(), schemas));
        Ok(Self {
            members,
            postgres,
            _dir: dir,
        })
    }

    /// The store calls of every node, summed (zero off postgres).
    pub fn store_profile(&self) -> ProfileSnapshot {
        self.members
            .iter()
            .filter_map(|m| m.store_profile.as_ref())
            .fold(ProfileSnapshot::default(), |sum, p| sum.plus(p.snapshot()))
    }

    /// Engine memory: what every node's tables hold, summed per table, the
    /// largest first, then the total (None on the other engines).
    pub fn memory_footprint(&self) -> Option<String> {
        let mut sum: BTreeMap<Table, TableFootprint> = BTreeMap::new();
        let mut any = false;
        for store in self.members.iter().filter_map(|m| m.memory.as_ref()) {
            any = true;
            for (table, f) in store.footprint() {
                let s = sum.entry(table).or_default();
                s.entries += f.entries;
                s.key_bytes += f.key_bytes;
                s.value_bytes += f.value_bytes;
                s.allocated_bytes += f.allocated_bytes;
                s.pages += f.pages;
            }
        }
        any.then(|| describe_footprint(&sum))
    }

    /// Whether the nodes run on postgres (their store calls are counted).
    pub fn profiled(&self) -> bool {
        self.members.iter().any(|m| m.store_profile.is_some())
    }

    pub fn client(&self, i: usize) -> &Client {
        &self.members[i].client
    }

    /// The write counters of every node, summed.
    pub fn stats(&self) -> WriteStatsSnapshot {
        let mut sum = WriteStatsSnapshot::default();
        for m in &self.members {
            let s = m.stats.snapshot();
            sum.batches += s.batches;
            sum.work_batches += s.work_batches;
            sum.key_writes += s.key_writes;
            sum.value_bytes += s.value_bytes;
        }
        sum
    }

    /// Waits until no node has committed anything for `still` (at most `limit`).
    pub async fn wait_quiet(&self, still: Duration, limit: Duration) -> WriteStatsSnapshot {
        let deadline = Instant::now() + limit;
        let mut last = self.stats();
        let mut since = Instant::now();
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = self.stats();
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= still {
                break;
            }
        }
        last
    }

    /// Stops every node gracefully (bounded: a slow stop does not hold the row).
    pub async fn stop(mut self) {
        for m in &mut self.members {
            if let Some(tx) = m.shutdown.take() {
                let _ = tx.send(());
            }
        }
        for m in self.members.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(30), m.task).await;
        }
        if let Some((target, schemas)) = self.postgres.take() {
            if let Err(e) = postgres::drop_schemas(&target, &schemas).await {
                eprintln!("cascade-bench: could not drop the rows' schemas {schemas:?}: {e}");
            }
        }
    }
}

/// The value of an unlabelled metric of the node serving its metrics at
/// `addr` (`GET /metrics`, HTTP/1.0 so the answer ends with the connection).
pub async fn scrape(addr: std::net::SocketAddr, metric: &str) -> Result<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
            .await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| format!("{addr}: no metrics within 10 s"))??;
    answer
        .lines()
        .find_map(|line| line.strip_prefix(metric)?.strip_prefix(' ')?.trim().parse().ok())
        .ok_or_else(|| format!("{addr}: no metric {metric}").into())
}

/// Tables as `name: entries, key MB, value MB, allocated MB, pages`, the largest
/// allocation first, then the total.
fn describe_footprint(tables: &BTreeMap<Table, TableFootprint>) -> String {
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut rows: Vec<_> = tables.iter().filter(|(_, f)| f.entries > 0).collect();
    rows.sort_by_key(|(_, f)| std::cmp::Reverse(f.allocated_bytes));
    let mut total = TableFootprint::default();
    let mut parts = Vec::new();
    for (table, f) in rows {
        total.entries += f.entries;
        total.key_bytes += f.key_bytes;
        total.value_bytes += f.value_bytes;
        total.allocated_bytes += f.allocated_bytes;
        total.pages += f.pages;
        parts.push(format!(
            "{} {} entries, keys {:.1} MB, values {:.1} MB, allocated {:.1} MB in {} pages",
            table.name(),
            f.entries,
            mb(f.key_bytes),
            mb(f.value_bytes),
            mb(f.allocated_bytes),
            f.pages
        ));
    }
    parts.push(format!(
        "total {} entries, keys {:.1} MB, values {:.1} MB, allocated {:.1} MB in {} pages",
        total.entries,
        mb(total.key_bytes),
        mb(total.value_bytes),
        mb(total.allocated_bytes),
        total.pages
    ));
    parts.join("; ")
}

/// `a - b`, field by field.
pub fn delta(a: WriteStatsSnapshot, b: WriteStatsSnapshot) -> WriteStatsSnapshot {
    WriteStatsSnapshot {
        batches: a.batches.saturating_sub(b.batches),
        work_batches: a.work_batches.saturating_sub(b.work_batches),
        key_writes: a.key_writes.saturating_sub(b.key_writes),
        value_bytes: a.value_bytes.saturating_sub(b.value_bytes),
    }
}

/// A field of /proc/self/status in MB (`VmRSS`, `VmHWM`); None off Linux.
fn proc_status_mb(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(round2(kb / 1024.0))
}

/// CPU time (user and system, every thread) this process has used so
/// far, in seconds. Linux's `/proc/self/stat` counts it in ticks of
/// `USER_HZ`, which is 100 on every Linux ABI: a 10 ms resolution.
pub fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces:
    // count from after the last ')'. Field 3 (the state) comes first;
    // utime and stime are fields 14 and 15.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let utime: f64 = fields.nth(11)?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Resident set size now.
pub fn rss_mb() -> Option<f64> {
    proc_status_mb("VmRSS:")
}

/// Peak resident set size since the process started or [`reset_peak_rss`].
pub fn peak_rss_mb() -> Option<f64> {
    proc_status_mb("VmHWM:")
}

/// Resets the peak to the current RSS (Linux: `5` to /proc/self/clear_refs).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `p` quantile (0..=1) of `samples` (nearest rank); None when empty.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(round3(sorted[rank - 1]))
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Polls GetOperation (one outcome per page: the counters are what we
/// want) every `every` until the operation is done, or fails after `limit`.
pub async fn wait_operation(client: &Client, id: &str, every: Duration, limit: Duration) -> Result<v1::Operation> {
    let deadline = Instant::now() + limit;
    loop {
        let op = client.get_operation(id, 1).await?;
        if op.done {
            return Ok(op);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "operation {id} not done after {limit:?}: {:?}, progress {:?}",
                op_state(&op),
                op.progress
            )
            .into());
        }
        tokio::time::sleep(every).await;
    }
}

pub fn op_state(op: &v1::Operation) -> String {
    v1::OperationState::try_from(op.state)
        .map(|s| s.as_str_name().trim_start_matches("OPERATION_STATE_").to_owned())
        .unwrap_or_else(|_| format!("state {}", op.state))
}

/// A spec named `name` (full) with references `(field, [targets])`.
pub fn spec(name: String, refs: &[(&str, &[&str])]) -> v1::ResourceSpec {
    v1::ResourceSpec {
        name,
        attributes: Default::default(),
        refs: refs
            .iter()
            .map(|(field, targets)| v1::ReferenceField {
                field: (*field).to_owned(),
                targets: targets
                    .iter()
                    .map(|t| v1::ObjectRef {
                        name: (*t).to_owned(),
                        ..Default::default()
                    })
                    .collect(),
            })
            .collect(),
        finalizers: Vec::new(),
    }
}

pub fn delete_request(name: &str) -> v1::DeleteRequest {
    v1::DeleteRequest {
        name: name.to_owned(),
        cascade: true,
        requested_by: "cascade-bench".into(),
        ..Default::default()
    }
}

/// Resource specs made on demand (`make(i)` for `i` in `0..count`), so a
/// million of them never sit in the client's memory, which is the row's.
#[derive(Clone)]
pub struct Specs {
    pub count: u64,
    make: Arc<dyn Fn(u64) -> v1::ResourceSpec + Send + Sync>,
}

impl Specs {
    pub fn new(count: u64, make: impl Fn(u64) -> v1::ResourceSpec + Send + Sync + 'static) -> Self {
        Self {
            count,
            make: Arc::new(make),
        }
    }
}

/// BatchCreates `specs` in batches of `batch` over `pipelines` concurrent
/// callers of `client`; answers the latency of every call.
pub async fn batch_create(client: &Client, specs: Specs, batch: u64, pipelines: usize) -> Result<Vec<f64>> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..pipelines.max(1) {
        let (next, specs, client) = (next.clone(), specs.clone(), client.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let start = next.fetch_add(batch, Ordering::Relaxed);
                if start >= specs.count {
                    break;
                }
                let chunk = (start..(start + batch).min(specs.count))
                    .map(|i| (specs.make)(i))
                    .collect();
                let started = Instant::now();
                client.batch_create(chunk).await.map_err(|e| e.to_string())?;
                latencies.push(ms(started.elapsed()));
            }
            Ok::<_, String>(latencies)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}
