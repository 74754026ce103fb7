//! What one row measures ([`RowSpec`], handed from the parent to a child
//! process) and what it reports ([`Row`], printed back as one JSON line).

use std::fmt;

use serde::{Deserialize, Serialize};

/// A storage engine a node can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    Memory,
    Sled,
    Fjall,
    /// PostgreSQL (`--postgres-url`, else a throwaway server): one schema
    /// per region, the store fenced as the region's writer.
    Postgres,
}

impl Engine {
    pub const ALL: [Engine; 4] = [Engine::Memory, Engine::Sled, Engine::Fjall, Engine::Postgres];

    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Memory => "memory",
            Engine::Sled => "sled",
            Engine::Fjall => "fjall",
            Engine::Postgres => "postgres",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("unknown engine {s:?} (memory, sled, fjall, postgres)"))
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The scenarios of the issue. `Baseline` runs after each P1 row, with
/// that row's write figures; `Native` after each P1 row on postgres
/// (PostgreSQL's own `ON DELETE CASCADE` of the same shape and size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    P1,
    Baseline,
    Native,
    P2,
    P3,
    P4,
    P5,
    /// The audit log's retention under a P1-like load: the writer's
    /// latency with pruning off and on (`audit.rs`).
    Audit,
}

impl Scenario {
    pub const SELECTABLE: [Scenario; 6] = [
        Scenario::P1,
        Scenario::P2,
        Scenario::P3,
        Scenario::P4,
        Scenario::P5,
        Scenario::Audit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::P1 => "p1",
            Scenario::Baseline => "baseline",
            Scenario::Native => "native",
            Scenario::P2 => "p2",
            Scenario::P3 => "p3",
            Scenario::P4 => "p4",
            Scenario::P5 => "p5",
            Scenario::Audit => "audit",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        Self::SELECTABLE
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("unknown scenario {s:?} (p1, p2, p3, p4, p5, audit; p1 brings its baseline)"))
    }
}

/// The shape of a P1 closure (kinds of the example schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// One network, `n` ports referencing it (`cascade`). Delete the network.
    Flat,
    /// One project, `n / 100` networks under it, the rest subnets spread
    /// over the networks: three levels. Delete the project.
    Tree,
    /// One network, `n / 2` ports on it, and `n / 2` floating IPs each
    /// referencing one port (`unset`). Delete the network: the ports go,
    /// the floating IPs stay with their `port` cleared.
    Unset,
}

impl Shape {
    pub const ALL: [Shape; 3] = [Shape::Flat, Shape::Tree, Shape::Unset];

    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("unknown shape {s:?} (flat, tree, unset)"))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Flat => "flat",
            Shape::Tree => "tree",
            Shape::Unset => "unset",
        }
    }
}

/// The write figures of a P1 deletion, which its baseline repeats on the raw engine.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct WriteFigures {
    pub key_writes: u64,
    pub value_bytes: u64,
    pub batches: u64,
}

/// One row to measure, in one child process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RowSpec {
    pub scenario: Scenario,
    pub engine: Engine,
    /// Dependents (P1, P2), references created (P5), keys (baseline).
    pub n: u64,
    /// Nodes in the row.
    pub regions: usize,
    pub shape: Option<Shape>,
    /// P3: latency samples to take.
    pub samples: usize,
    /// Baseline: what the P1 row wrote.
    pub baseline_of: Option<WriteFigures>,
    /// P1 row the baseline repeats (its n and deleted count).
    pub deleted: Option<u64>,
    /// The nodes' writer tick (`NodeSettings::tick`).
    pub tick_ms: u64,
    /// The PostgreSQL database of the run (engine postgres, native rows).
    #[serde(default)]
    pub postgres: Option<crate::postgres::PgTarget>,
    /// P1, P2: whether one-resource Deletes run beside the cascade (the
    /// small-delete probe; `--no-delete-probe` turns it off, to measure
    /// what it adds).
    #[serde(default = "probe_on")]
    pub delete_probe: bool,
}

fn probe_on() -> bool {
    true
}

/// What a row reports. The first ten fields are always present (null when
/// they do not apply); the rest are per scenario.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Row {
    pub scenario: String,
    pub engine: String,
    pub n: u64,
    pub regions: usize,
    pub wall_s: Option<f64>,
    pub rate_per_s: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub peak_rss_mb: Option<f64>,
    pub key_writes_per_deleted: Option<f64>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
    /// SUCCEEDED, or what the operation ended in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unset: Option<u64>,
    /// Time for the Delete RPC to answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_call_ms: Option<f64>,
    /// p99 of the small Creates issued against the same region while the cascade ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_write_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_write_max_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_writes: Option<u64>,
    /// The one-resource Deletes issued against the same region while the
    /// cascade ran (each of a fresh resource nothing references): how many
    /// finished, and the p50, p99 and maximum of the Delete call (sent →
    /// answered) and of the deletion (sent → the operation seen done, its
    /// resource gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_deletes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_delete_call_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_delete_call_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_delete_call_max_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_delete_done_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_delete_done_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_delete_done_max_ms: Option<f64>,
    /// Key writes of the deletion per resource deleted or unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_writes_per_touched: Option<f64>,
    /// Key writes, value bytes and batches of the deletion (every node of the row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_writes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches: Option<u64>,
    /// Populating with BatchCreate: seconds and resources per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub populate_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub populate_rate_per_s: Option<f64>,
    /// P1, P2: CPU seconds the row's process (its nodes and its clients)
    /// used from the Delete until the operation was seen done, and that
    /// per deleted resource in µs. On a shared machine the wall time
    /// counts the waits for a core; this does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cascade_cpu_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_us_per_deleted: Option<f64>,
    /// RSS: nodes open and idle; before the Delete; peak from the Delete to
    /// quiescence; after quiescence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_idle_mb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_before_mb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cascade_peak_rss_mb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_after_mb: Option<f64>,
    /// P1 wall time over its baseline's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p1_over_baseline: Option<f64>,
    /// P1 on postgres: its wall time over the native row's (PostgreSQL's
    /// own `ON DELETE CASCADE` of the same rows, its DELETE alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p1_over_native: Option<f64>,
    /// Native rows: the VACUUM after the DELETE, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vacuum_s: Option<f64>,
    /// P1 on postgres: store calls per deleted resource and their share of
    /// the wall time (`postgres::ProfiledStore`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_profile: Option<String>,
    /// P1 on memory: what the store's tables hold once the population is
    /// in (`Cluster::memory_footprint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_footprint: Option<String>,
    /// P3: samples taken, peer watch streams open, the import streams of the topology.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_watch_streams: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import_streams: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick_ms: Option<u64>,
    /// Audit rows: the small Creates' p50 and p99 with pruning off (the
    /// row's `p50_ms` and `p99_ms` are with pruning by count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_off_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_off_p99_ms: Option<f64>,
    /// Audit rows: the same with pruning by age (`[audit] retain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_age_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_age_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The row could not be measured: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Row {
    /// A row with the identifying fields of `spec` filled in.
    pub fn for_spec(spec: &RowSpec) -> Self {
        Self {
            scenario: spec.scenario.as_str().to_owned(),
            engine: spec.engine.as_str().to_owned(),
            n: spec.n,
            regions: spec.regions,
            shape: spec.shape.map(|s| s.as_str().to_owned()),
            tick_ms: Some(spec.tick_ms),
            ..Self::default()
        }
    }
}
