//! P1 (a local cascade of one of three shapes, with the small writes and
//! deletes that run beside it) and P4 (an idle node's RSS).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::Client;
use cascade_proto::v1;

use crate::harness::{
    self, batch_create, delete_request, ms, op_state, percentile, round2, round3, spec, Cluster, ClusterSpec, Result,
    Specs,
};
use crate::spec::{Row, RowSpec, Shape};

pub const REGION: &str = "bench";

/// What a row creates before it deletes, and what it deletes.
struct Population {
    /// Created in this order, each phase once the previous is in.
    phases: Vec<Specs>,
    root: String,
}

fn name(kind: &str, id: impl std::fmt::Display) -> String {
    format!("{REGION}/{kind}/{id}")
}

fn populate_plan(shape: Shape, n: u64) -> Population {
    let project = name("project", "p");
    let network = name("network", "n");
    let head = {
        let (project, network) = (project.clone(), network.clone());
        move |with_network: bool| {
            let mut v = vec![spec(project.clone(), &[])];
            if with_network {
                v.push(spec(network.clone(), &[("project", &[&project])]));
            }
            Specs::new(v.len() as u64, move |i| v[i as usize].clone())
        }
    };
    let ports = |count: u64| {
        let network = network.clone();
        Specs::new(count, move |i| {
            spec(name("port", format!("p{i}")), &[("network", &[&network])])
        })
    };
    match shape {
        Shape::Flat => Population {
            phases: vec![head(true), ports(n)],
            root: network,
        },
        Shape::Tree => {
            let networks = (n / 100).max(1);
            let subnets = n.saturating_sub(networks);
            let p = project.clone();
            Population {
                phases: vec![
                    head(false),
                    Specs::new(networks, move |j| {
                        spec(name("network", format!("n{j}")), &[("project", &[&p])])
                    }),
                    Specs::new(subnets, move |i| {
                        let parent = name("network", format!("n{}", i % networks));
                        spec(name("subnet", format!("s{i}")), &[("network", &[&parent])])
                    }),
                ],
                root: project,
            }
        }
        Shape::Unset => {
            let port_count = n / 2;
            let p = project.clone();
            Population {
                phases: vec![
                    head(true),
                    ports(port_count),
                    Specs::new(n - port_count, move |i| {
                        let port = name("port", format!("p{}", i % port_count.max(1)));
                        spec(
                            name("floating_ip", format!("f{i}")),
                            &[("project", &[&p]), ("port", &[&port])],
                        )
                    }),
                ],
                root: network,
            }
        }
    }
}

/// Small Creates (a `qos_policy`, no references) in `region` until
/// `stop`: their latencies (ms) and how many failed.
pub async fn concurrent_writes(client: Client, region: String, stop: Arc<AtomicBool>) -> (Vec<f64>, u64) {
    let mut latencies = Vec::new();
    let mut failed = 0;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        match client.create(spec(format!("{region}/qos_policy/c{i}"), &[])).await {
            Ok(_) => latencies.push(ms(started.elapsed())),
            Err(_) => {
                failed += 1;
                // Not a busy loop: a failure is an answer without work.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        i += 1;
    }
    (latencies, failed)
}

/// Fresh resources the small-delete probe has created for it before the
/// cascade (one `qos_policy` each, nothing references them): one for every
/// 50 members, at least 200 and at most 20,000. A probe's Delete takes a
/// few milliseconds at best, so a pool of n/50 outlasts a cascade that
/// deletes fewer than about 20,000 resources a second; past its end the
/// probe creates each resource on the spot, outside the timing.
fn delete_pool_size(n: u64) -> u64 {
    (n / 50).clamp(200, 20_000)
}

/// The name of the small-delete probe's `i`th resource in `region`.
fn pooled(region: &str, i: u64) -> String {
    format!("{region}/qos_policy/d{i}")
}

/// How often the small-delete probe asks whether its deletion is done.
const SMALL_DELETE_POLL: Duration = Duration::from_millis(2);

/// What the small-delete probe measured.
#[derive(Default)]
pub struct SmallDeletes {
    /// Delete sent → answered (ms).
    pub call_ms: Vec<f64>,
    /// Delete sent → its operation seen done, the resource gone (ms).
    pub done_ms: Vec<f64>,
    /// Deletes (or on-the-spot creates) that failed.
    pub failed: u64,
    /// Resources created on the spot when the pool ran out.
    pub created: u64,
}

/// One-resource Deletes in `region` until `stop`, one after the other,
/// as a user deletes one resource and waits until it is gone: each of a
/// fresh `qos_policy` nothing references (the pool `names`; once it is
/// used up, one created on the spot, outside the timing), then
/// GetOperation at once and every [`SMALL_DELETE_POLL`] until the
/// operation is done (at most `limit`).
pub async fn small_deletes(
    client: Client,
    region: String,
    mut names: impl Iterator<Item = String> + Send,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> SmallDeletes {
    let mut out = SmallDeletes::default();
    let mut spare = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let name = match names.next() {
            Some(name) => name,
            None => {
                let name = format!("{region}/qos_policy/dx{spare}");
                spare += 1;
                if client.create(spec(name.clone(), &[])).await.is_err() {
                    out.failed += 1;
                    // Not a busy loop: a failure is an answer without work.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                out.created += 1;
                name
            }
        };
        match delete_and_wait(&client, &name, limit).await {
            Ok((call, done)) => {
                out.call_ms.push(call);
                out.done_ms.push(done);
            }
            Err(_) => {
                out.failed += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    out
}

/// Deletes `name` (one resource, without cascade) and waits until its
/// operation is done and SUCCEEDED: the Delete call's latency and the
/// deletion's, in ms.
async fn delete_and_wait(client: &Client, name: &str, limit: Duration) -> Result<(f64, f64)> {
    let started = Instant::now();
    let answer = client
        .delete(v1::DeleteRequest {
            name: name.to_owned(),
            requested_by: "cascade-bench".into(),
            ..Default::default()
        })
        .await?;
    let call = ms(started.elapsed());
    let id = answer.operation.ok_or("the Delete answered no operation")?.id;
    loop {
        let op = client.get_operation(&id, 1).await?;
        if op.done {
            let state = op_state(&op);
            if state != "SUCCEEDED" {
                return Err(format!("the delete of {name} ended {state}").into());
            }
            return Ok((call, ms(started.elapsed())));
        }
        if started.elapsed() >= limit {
            return Err(format!("the delete of {name} not done after {limit:?}").into());
        }
        tokio::time::sleep(SMALL_DELETE_POLL).await;
    }
}

/// What one probe (a small Create, or a small Delete until done) writes,
/// from the windows each of several probes was measured in: the least of
/// each figure. A probe writes the same every time; whatever else the
/// writer committed in its window only adds. At 1M on fjall and sled the
/// writer was still pruning the audit log the populate had overfilled (a
/// removal per entry: key writes, no value bytes), four probes' window
/// held thousands of those, and the probes' share taken off the cascade's
/// key writes left none of them (0.00 key writes per deleted, and a
/// baseline of no writes at all).
pub(crate) fn probe_cost(windows: &[cascade_node::WriteStatsSnapshot]) -> cascade_node::WriteStatsSnapshot {
    let least = |figure: fn(&cascade_node::WriteStatsSnapshot) -> u64| windows.iter().map(figure).min().unwrap_or(0);
    cascade_node::WriteStatsSnapshot {
        batches: least(|w| w.batches),
        work_batches: least(|w| w.work_batches),
        key_writes: least(|w| w.key_writes),
        value_bytes: least(|w| w.value_bytes),
    }
}

/// How long to wait for an operation over `n` resources.
pub fn deadline_for(n: u64) -> Duration {
    Duration::from_secs(120) + Duration::from_millis(n.saturating_mul(2))
}

/// P1: populate one region with BatchCreate, Delete the root with cascade
/// while small Creates run against the same region, wait for SUCCEEDED.
pub async fn p1(spec_: &RowSpec) -> Result<Row> {
    let shape = spec_.shape.unwrap_or(Shape::Flat);
    let mut row = Row::for_spec(spec_);
    let regions = [REGION.to_owned()];
    let cluster = Cluster::start(ClusterSpec::for_row(spec_, &regions)).await?;
    row.rss_idle_mb = harness::rss_mb();
    let client = cluster.client(0).clone();

    let plan = populate_plan(shape, spec_.n);
    let total: u64 = plan.phases.iter().map(|p| p.count).sum();
    let started = Instant::now();
    for phase in plan.phases {
        batch_create(&client, phase, 1_000, 2).await?;
    }
    let populate = started.elapsed().as_secs_f64();
    row.populate_s = Some(round3(populate));
    row.populate_rate_per_s = Some((total as f64 / populate).round());
    cluster
        .wait_quiet(Duration::from_millis(300), Duration::from_secs(10))
        .await;
    row.store_footprint = cluster.memory_footprint();

    measure_deletion(&cluster, 0, &plan.root, spec_.n, spec_.delete_probe, &mut row).await?;
    cluster.stop().await;
    Ok(row)
}

/// Deletes `root` (in member `at`'s region) with cascade while small
/// Creates, and with `delete_probe` one-resource Deletes, run against the
/// same region; waits for the operation to be done and the nodes quiet;
/// fills the deletion's columns of `row`.
pub async fn measure_deletion(
    cluster: &Cluster,
    at: usize,
    root: &str,
    n: u64,
    delete_probe: bool,
    row: &mut Row,
) -> Result<()> {
    let member = &cluster.members[at];
    let client = member.client.clone();
    let region = root.split('/').next().unwrap_or_default().to_owned();
    let pool = if delete_probe { delete_pool_size(n) } else { 0 };
    if pool > 0 {
        let r = region.clone();
        batch_create(&client, Specs::new(pool, move |i| spec(pooled(&r, i), &[])), 1_000, 2).await?;
    }

    // What one small Create and one small Delete write, to take the
    // concurrent ones out of the deletion's figures: each probe in a
    // window of its own, the least of each figure kept (`probe_cost`).
    const PROBES: u64 = 4;
    let mut windows = Vec::new();
    for i in 0..PROBES {
        let before = cluster.stats();
        client
            .create(spec(format!("{region}/qos_policy/probe{i}"), &[]))
            .await?;
        windows.push(harness::delta(cluster.stats(), before));
    }
    let per_create = probe_cost(&windows);
    let mut windows = Vec::new();
    for i in 0..PROBES.min(pool) {
        let before = cluster.stats();
        delete_and_wait(&client, &pooled(&region, i), deadline_for(0)).await?;
        windows.push(harness::delta(cluster.stats(), before));
    }
    let probed = windows.len() as u64;
    let per_delete = probe_cost(&windows);

    let populate_peak = harness::peak_rss_mb();
    harness::reset_peak_rss();
    row.rss_before_mb = harness::rss_mb();

    let writer_client = Client::connect(&member.endpoint).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let before = cluster.stats();
    let profile_before = cluster.store_profile();
    let deleter = if pool > 0 {
        let client = Client::connect(&member.endpoint).await?;
        let (r, names_region) = (region.clone(), region.clone());
        let names = (probed..pool).map(move |i| pooled(&names_region, i));
        Some(tokio::spawn(small_deletes(
            client,
            r,
            names,
            stop.clone(),
            deadline_for(n),
        )))
    } else {
        None
    };
    let writes = tokio::spawn(concurrent_writes(writer_client, region, stop.clone()));
    let cpu_before = harness::process_cpu_s();
    let started = Instant::now();
    let answer = client
        .delete(delete_request(root))
        .await
        .map_err(|e| format!("the Delete of {root}: {e}"))?;
    row.delete_call_ms = Some(round3(ms(started.elapsed())));
    let id = answer.operation.ok_or("the Delete answered no operation")?.id;
    let waited = harness::wait_operation(&client, &id, Duration::from_millis(5), deadline_for(n)).await;
    let wall = started.elapsed().as_secs_f64();
    let cpu = harness::process_cpu_s()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    stop.store(true, Ordering::Relaxed);
    let (latencies, failed) = writes.await?;
    let deletes = match deleter {
        Some(task) => Some(task.await?),
        None => None,
    };
    let op = waited.map_err(|e| format!("following operation {id}: {e}"))?;

    let after = cluster
        .wait_quiet(Duration::from_millis(500), Duration::from_secs(60))
        .await;
    let d = harness::delta(after, before);
    if cluster.profiled() {
        let calls = cluster.store_profile().minus(profile_before);
        let deleted = op.progress.as_ref().map_or(0, |p| p.deleted);
        row.store_profile = Some(calls.describe(deleted, wall));
    }
    let creates = latencies.len() as u64 + deletes.as_ref().map_or(0, |d| d.created);
    let small = deletes.as_ref().map_or(0, |d| d.done_ms.len() as u64);
    // Per probe, as measured beforehand (no delete probe: its cost is 0).
    let probes = |per_create: u64, per_delete: u64| creates * per_create + small * per_delete;
    let (probes_key_writes, probes_value_bytes) = (
        probes(per_create.key_writes, per_delete.key_writes),
        probes(per_create.value_bytes, per_delete.value_bytes),
    );
    let key_writes = d.key_writes.saturating_sub(probes_key_writes);
    let value_bytes = d.value_bytes.saturating_sub(probes_value_bytes);
    // The Delete's own step and the work steps. Not the batches counted
    // less the probes': a small delete's work shares the cascade's steps,
    // so subtracting what it cost alone took away more than it added, and
    // on a slow machine, with thousands of probes, left about nothing
    // (and the baseline row that copies this count one huge batch).
    let batches = d.work_batches + 1;

    let progress = op.progress.unwrap_or_default();
    row.operation_state = Some(op_state(&op));
    row.deleted = Some(progress.deleted);
    row.unset = Some(progress.unset);
    row.wall_s = Some(round3(wall));
    row.rate_per_s = Some((progress.deleted as f64 / wall).round());
    row.cascade_cpu_s = cpu.map(round2);
    row.cpu_us_per_deleted = cpu.map(|s| round2(s * 1e6 / progress.deleted.max(1) as f64));
    row.key_writes = Some(key_writes);
    row.value_bytes = Some(value_bytes);
    row.batches = Some(batches);
    row.key_writes_per_deleted = Some(round2(key_writes as f64 / progress.deleted.max(1) as f64));
    if progress.unset > 0 {
        row.key_writes_per_touched = Some(round2(
            key_writes as f64 / (progress.deleted + progress.unset).max(1) as f64,
        ));
    }
    row.p50_ms = percentile(&latencies, 0.50);
    row.p99_ms = percentile(&latencies, 0.99);
    row.concurrent_write_p99_ms = row.p99_ms;
    row.concurrent_write_max_ms = percentile(&latencies, 1.0);
    row.concurrent_writes = Some(latencies.len() as u64);
    let mut notes = Vec::new();
    // Said, not hidden: a figure the probes' share ate is no figure (the
    // baseline would copy it, and the report would pass it as few writes).
    if probes_key_writes * 2 > d.key_writes {
        notes.push(format!(
            "the probes' share ({probes_key_writes} key writes of {}) is over half the key writes counted: \
             the key-write figures are unreliable",
            d.key_writes
        ));
    }
    if failed > 0 {
        notes.push(format!("{failed} concurrent creates failed"));
    }
    if let Some(d) = &deletes {
        row.small_deletes = Some(small);
        row.small_delete_call_p50_ms = percentile(&d.call_ms, 0.50);
        row.small_delete_call_p99_ms = percentile(&d.call_ms, 0.99);
        row.small_delete_call_max_ms = percentile(&d.call_ms, 1.0);
        row.small_delete_done_p50_ms = percentile(&d.done_ms, 0.50);
        row.small_delete_done_p99_ms = percentile(&d.done_ms, 0.99);
        row.small_delete_done_max_ms = percentile(&d.done_ms, 1.0);
        if d.failed > 0 {
            notes.push(format!("{} small deletes failed", d.failed));
        }
        if d.created > 0 {
            notes.push(format!(
                "the small-delete pool ran out: {} resources created on the spot",
                d.created
            ));
        }
    }
    if !notes.is_empty() {
        row.note = Some(notes.join("; "));
    }
    row.cascade_peak_rss_mb = harness::peak_rss_mb();
    row.rss_after_mb = harness::rss_mb();
    row.peak_rss_mb = match (populate_peak, row.cascade_peak_rss_mb) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    Ok(())
}

/// P4: one node open and serving, nothing stored, once its writer is quiet.
pub async fn p4(spec_: &RowSpec) -> Result<Row> {
    let mut row = Row::for_spec(spec_);
    let regions = [REGION.to_owned()];
    let cluster = Cluster::start(ClusterSpec::for_row(spec_, &regions)).await?;
    // One call, so the server's connection machinery is in the figure.
    cluster
        .client(0)
        .list(v1::ListRequest {
            page_size: 1,
            ..Default::default()
        })
        .await?;
    // Idle: the writer has committed nothing for 300 ms (its open-time
    // writes and the first tick are behind it), polled with a deadline.
    cluster
        .wait_quiet(Duration::from_millis(300), Duration::from_secs(10))
        .await;
    row.rss_idle_mb = harness::rss_mb();
    row.peak_rss_mb = harness::peak_rss_mb();
    row.note = Some("in-process node with its client; P4 during/after: P1 rss columns".into());
    cluster.stop().await;
    Ok(row)
}
