//! The audit log's retention under load (issue 27): the same P1-like load
//! on two fresh nodes in turn, one whose `[audit] max_entries` the load
//! never reaches (pruning off) and one whose `max_entries` is a tenth of
//! what the load writes (pruning all along, in steps of at most 1,000
//! entries). The load: `n` ports created with BatchCreate (batches of
//! 1,000 from two callers: 1,000 audit entries a commit) while one client
//! issues small Creates against the same region. Each small Create is one
//! writer commit, so its latency is what a client's write waits for: its
//! p50 and p99 with pruning off and on, in the same run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::Client;

use crate::harness::{batch_create, percentile, round3, spec, Cluster, ClusterSpec, Result, Specs};
use crate::local::{concurrent_writes, REGION};
use crate::spec::{Row, RowSpec};

/// What one node's run measured.
struct Load {
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
    writes: usize,
    wall_s: f64,
}

/// The row: the small Creates' p50/p99 with pruning on (`p50_ms`,
/// `p99_ms`) and off (`audit_off_p50_ms`, `audit_off_p99_ms`).
pub async fn retention(spec_: &RowSpec) -> Result<Row> {
    let mut row = Row::for_spec(spec_);
    let kept = (spec_.n / 10).max(1);
    let off = load(spec_, None).await?;
    let on = load(spec_, Some(kept)).await?;
    row.p50_ms = on.p50_ms;
    row.p99_ms = on.p99_ms;
    row.max_ms = on.max_ms;
    row.concurrent_writes = Some(on.writes as u64);
    row.wall_s = Some(round3(on.wall_s));
    row.rate_per_s = Some((spec_.n as f64 / on.wall_s).round());
    row.audit_off_p50_ms = off.p50_ms;
    row.audit_off_p99_ms = off.p99_ms;
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"));
    row.note = Some(format!(
        "max_entries {kept}: small Creates p50/p99 {}/{} ms with pruning, {}/{} ms without ({} and {} creates); \
         the load took {:.2} s and {:.2} s",
        ms(on.p50_ms),
        ms(on.p99_ms),
        ms(off.p50_ms),
        ms(off.p99_ms),
        on.writes,
        off.writes,
        on.wall_s,
        off.wall_s
    ));
    Ok(row)
}

/// Runs the load on a fresh node keeping at most `max_entries` audit
/// entries (None: the default, which the load does not reach).
async fn load(spec_: &RowSpec, max_entries: Option<u64>) -> Result<Load> {
    let regions = [REGION.to_owned()];
    let cluster = Cluster::start(ClusterSpec {
        audit_max_entries: max_entries,
        ..ClusterSpec::for_row(spec_, &regions)
    })
    .await?;
    let client = cluster.client(0).clone();
    let network = format!("{REGION}/network/n");
    client.create(spec(format!("{REGION}/project/p"), &[])).await?;
    client
        .create(spec(network.clone(), &[("project", &[&format!("{REGION}/project/p")])]))
        .await?;
    let ports = Specs::new(spec_.n, move |i| {
        spec(format!("{REGION}/port/p{i}"), &[("network", &[&network])])
    });
    let stop = Arc::new(AtomicBool::new(false));
    let writer_client = Client::connect(&cluster.members[0].endpoint).await?;
    let writes = tokio::spawn(concurrent_writes(writer_client, REGION.to_owned(), stop.clone()));
    let started = Instant::now();
    batch_create(&client, ports, 1_000, 2).await?;
    // Retention goes on a moment after the last batch: measured too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let wall_s = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (latencies, failed) = writes.await?;
    cluster.stop().await;
    if failed > 0 {
        return Err(format!("{failed} small creates failed").into());
    }
    Ok(Load {
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: percentile(&latencies, 1.0),
        writes: latencies.len(),
        wall_s,
    })
}
