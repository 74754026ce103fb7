//! The audit log's retention under load (issue 27): the same P1-like load
//! on three fresh nodes in turn: one whose retention the load never reaches
//! (pruning off), one whose `[audit] max_entries` is a tenth of what the
//! load writes (pruning by count all along) and one whose `[audit] retain`
//! is [`RETAIN_UNDER_LOAD`] (pruning by age once the first entries are that
//! old), each in steps of at most 1,000 entries. The load: `n` ports
//! created with BatchCreate (batches of 1,000 from two callers: 1,000 audit
//! entries a commit) while one client issues small Creates against the same
//! region. Each small Create is one writer commit, so its latency is what a
//! client's write waits for: its p50 and p99 under each retention, in the
//! same run, and the entries each node pruned (its
//! `cascade_audit_pruned_total`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::Client;

use crate::harness::{batch_create, percentile, round3, scrape, spec, Cluster, ClusterSpec, Result, Specs};
use crate::local::{concurrent_writes, REGION};
use crate::spec::{Row, RowSpec};

/// `[audit] retain` of the by-age node: short enough that the entries of
/// the load's first second are pruned while it still writes.
const RETAIN_UNDER_LOAD: Duration = Duration::from_secs(1);

/// How long the load's node is watched after its last batch: retention
/// goes on a moment after the load, and the small Creates with it.
const AFTER_THE_LOAD: Duration = Duration::from_millis(1_500);

/// What the node keeps.
#[derive(Clone, Copy)]
enum Retention {
    /// Neither limit within the load's reach (the defaults).
    Off,
    /// `max_entries`.
    Count(u64),
    /// `retain`.
    Age(Duration),
}

/// What one node's run measured.
struct Load {
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
    writes: usize,
    wall_s: f64,
    pruned: f64,
}

impl Load {
    fn summary(&self) -> String {
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"));
        format!(
            "p50/p99/max {}/{}/{} ms over {} creates, load {:.2} s, {} pruned",
            ms(self.p50_ms),
            ms(self.p99_ms),
            ms(self.max_ms),
            self.writes,
            self.wall_s,
            self.pruned
        )
    }
}

/// The load average of the machine, as `/proc/loadavg` says (Linux).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The row: the small Creates' p50/p99 with pruning by count (`p50_ms`,
/// `p99_ms`), by age (`audit_age_p50_ms`, `audit_age_p99_ms`) and off
/// (`audit_off_p50_ms`, `audit_off_p99_ms`).
pub async fn retention(spec_: &RowSpec) -> Result<Row> {
    let mut row = Row::for_spec(spec_);
    let kept = (spec_.n / 10).max(1);
    let before = load_average();
    let off = load(spec_, Retention::Off).await?;
    let by_count = load(spec_, Retention::Count(kept)).await?;
    let by_age = load(spec_, Retention::Age(RETAIN_UNDER_LOAD)).await?;
    row.p50_ms = by_count.p50_ms;
    row.p99_ms = by_count.p99_ms;
    row.max_ms = by_count.max_ms;
    row.concurrent_writes = Some(by_count.writes as u64);
    row.wall_s = Some(round3(by_count.wall_s));
    row.rate_per_s = Some((spec_.n as f64 / by_count.wall_s).round());
    row.audit_off_p50_ms = off.p50_ms;
    row.audit_off_p99_ms = off.p99_ms;
    row.audit_age_p50_ms = by_age.p50_ms;
    row.audit_age_p99_ms = by_age.p99_ms;
    row.note = Some(format!(
        "small Creates: pruning off {}; by count (max_entries {kept}) {}; by age (retain {} ms) {}; \
         load average {before} before, {} after",
        off.summary(),
        by_count.summary(),
        RETAIN_UNDER_LOAD.as_millis(),
        by_age.summary(),
        load_average()
    ));
    Ok(row)
}

/// Runs the load on a fresh node that keeps what `retention` says.
async fn load(spec_: &RowSpec, retention: Retention) -> Result<Load> {
    let regions = [REGION.to_owned()];
    let (audit_max_entries, audit_retain) = match retention {
        Retention::Off => (None, None),
        Retention::Count(max) => (Some(max), None),
        Retention::Age(retain) => (None, Some(retain)),
    };
    let cluster = Cluster::start(ClusterSpec {
        audit_max_entries,
        audit_retain,
        metrics: true,
        ..ClusterSpec::for_row(spec_, &regions)
    })
    .await?;
    let metrics = cluster.members[0].metrics_addr.ok_or("the node serves no metrics")?;
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
    let wall_s = started.elapsed().as_secs_f64();
    // Retention goes on a moment after the last batch: measured too.
    tokio::time::sleep(AFTER_THE_LOAD).await;
    stop.store(true, Ordering::Relaxed);
    let (latencies, failed) = writes.await?;
    let pruned = scrape(metrics, "cascade_audit_pruned_total").await?;
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
        pruned,
    })
}
