//! The baseline of a P1 row: the raw engine doing the same writes without
//! the node (no gRPC, no protocol, no actor): as many key writes, as many
//! value bytes, in as many batches, each committed and flushed as the
//! node's writer does.

use std::sync::Arc;
use std::time::Instant;

use cascade_core::RegionId;

use cascade_node::store::{Batch, FjallStore, MemoryStore, SledStore, Store, Table};

use crate::harness::{self, ms, percentile, round3, Result};
use crate::postgres;
use crate::spec::{Engine, Row, RowSpec};

/// The tables a deletion writes; the baseline's keys go round-robin over them.
const TABLES: [Table; 6] = [
    Table::Resources,
    Table::UidIndex,
    Table::Backrefs,
    Table::Outcomes,
    Table::RetryQueue,
    Table::Outbox,
];

/// Key length: a name or a uid plus a suffix, about what the node's keys are.
const KEY_LEN: usize = 40;

/// Sequential keys (the engine's best case, as the node's uids, names and
/// revisions mostly are): a fixed prefix, then the index big-endian.
fn key(i: u64) -> Vec<u8> {
    let mut k = vec![b'k'; KEY_LEN - 8];
    k.extend_from_slice(&i.to_be_bytes());
    k
}

fn table(i: u64) -> Table {
    TABLES[(i % TABLES.len() as u64) as usize]
}

fn open(spec: &RowSpec, dir: &std::path::Path, schema: &str) -> Result<Arc<dyn Store>> {
    Ok(match spec.engine {
        Engine::Memory => Arc::new(MemoryStore::default()),
        // As a node opens them (the same cache).
        Engine::Sled => Arc::new(SledStore::open(dir)?),
        Engine::Fjall => Arc::new(FjallStore::open(dir)?),
        // As the bench's nodes open it: a schema of its own, fenced.
        Engine::Postgres => {
            let target = spec.postgres.as_ref().ok_or("engine postgres without a database")?;
            postgres::open_region(target, &RegionId::parse("baseline")?, schema)?
        }
    })
}

/// Half the key writes are puts of new keys (values sized so the bytes
/// match), half removes of keys an earlier batch put, mixed in batches of
/// the P1 row's mean size, as a deletion's steps mix them; the store stays
/// small, as the node's does while it deletes.
pub fn run(spec: &RowSpec) -> Result<Row> {
    run_in(spec, &postgres::schema_name("baseline"))
}

/// [`run`], on postgres in schema `schema` (which the caller drops).
pub fn run_in(spec: &RowSpec, schema: &str) -> Result<Row> {
    let mut row = Row::for_spec(spec);
    let figures = spec.baseline_of.ok_or("baseline without the P1 row's figures")?;
    let dir = tempfile::Builder::new().prefix("cascade-bench-baseline-").tempdir()?;
    let store = open(spec, dir.path(), schema)?;
    let key_writes = figures.key_writes.max(2);
    let puts = key_writes.div_ceil(2);
    let removes = key_writes - puts;
    let value_len = (figures.value_bytes / puts).max(1) as usize;
    let per_batch = (key_writes / figures.batches.max(1)).max(2);
    let value = vec![b'x'; value_len];

    let mut latencies = Vec::new();
    let (mut next_put, mut next_remove) = (0u64, 0u64);
    let cpu_before = crate::harness::process_cpu_s();
    let started = Instant::now();
    while next_put < puts || next_remove < removes {
        let mut batch = Batch::default();
        let removable = removes.min(next_put) - next_remove;
        let r = if next_put < puts {
            removable.min(per_batch / 2)
        } else {
            removable.min(per_batch)
        };
        for k in next_remove..next_remove + r {
            batch.remove(table(k), key(k));
        }
        next_remove += r;
        let p = (per_batch - r).min(puts - next_put);
        for k in next_put..next_put + p {
            batch.put(table(k), key(k), value.clone());
        }
        next_put += p;
        let t = Instant::now();
        store.commit(batch)?;
        store.flush()?;
        latencies.push(ms(t.elapsed()));
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = crate::harness::process_cpu_s()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let deleted = spec.deleted.unwrap_or(spec.n).max(1);
    row.wall_s = Some(round3(wall));
    row.cascade_cpu_s = cpu.map(crate::harness::round2);
    row.cpu_us_per_deleted = cpu.map(|s| crate::harness::round2(s * 1e6 / deleted as f64));
    row.rate_per_s = Some((deleted as f64 / wall.max(1e-9)).round());
    row.p50_ms = percentile(&latencies, 0.50);
    row.p99_ms = percentile(&latencies, 0.99);
    row.key_writes = Some(key_writes);
    row.value_bytes = Some(puts * value_len as u64);
    row.batches = Some(latencies.len() as u64);
    row.key_writes_per_deleted = Some(harness::round2(key_writes as f64 / deleted as f64));
    row.peak_rss_mb = harness::peak_rss_mb();
    row.note = Some(format!(
        "{puts} puts of {value_len} B and {removes} removes, {per_batch} per batch, commit+flush each"
    ));
    row.tick_ms = None;
    Ok(row)
}
