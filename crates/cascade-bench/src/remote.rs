//! The cross-region scenarios: P2 (a cascade over five regions), P3 (how
//! long an importer takes to act on an owner's deletion) and P5
//! (BatchCreate of resources whose references cross regions).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use cascade_proto::v1;
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::harness::{
    self, batch_create, delete_request, ms, percentile, round3, spec, Cluster, ClusterSpec, Result, Specs,
};
use crate::local::measure_deletion;
use crate::spec::{Row, RowSpec};

fn region_names(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("r{i}")).collect()
}

/// P2: a network in `r0`, `n` ports referencing it spread evenly over all
/// `regions` (so `1/regions` of them are local to the root, the rest
/// remote). Delete it with cascade; the rate is over the whole closure.
pub async fn p2(spec_: &RowSpec) -> Result<Row> {
    let mut row = Row::for_spec(spec_);
    let regions = region_names(spec_.regions);
    let cluster = Cluster::start(ClusterSpec::for_row(spec_, &regions)).await?;
    row.rss_idle_mb = harness::rss_mb();
    let root = "r0/network/n".to_owned();
    cluster
        .client(0)
        .batch_create(vec![
            spec("r0/project/p".into(), &[]),
            spec(root.clone(), &[("project", &["r0/project/p"])]),
        ])
        .await?;

    // Every region populates its share at once, as a client per region would.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, region) in regions.iter().enumerate() {
        // Ports p{i}, p{i+R}, p{i+2R}, …: region i's share of 0..n.
        let count = spec_.n.saturating_sub(i as u64).div_ceil(regions.len() as u64);
        let (region, root, stride) = (region.clone(), root.clone(), regions.len() as u64);
        let specs = Specs::new(count, move |k| {
            spec(
                format!("{region}/port/p{}", i as u64 + k * stride),
                &[("network", &[&root])],
            )
        });
        let client = cluster.client(i).clone();
        let region = regions[i].clone();
        tasks.push(tokio::spawn(async move {
            batch_create(&client, specs, 1_000, 1)
                .await
                .map_err(|e| format!("populating {region}: {e}"))
        }));
    }
    for t in tasks {
        t.await??;
    }
    let populate = started.elapsed().as_secs_f64();
    row.populate_s = Some(round3(populate));
    row.populate_rate_per_s = Some((spec_.n as f64 / populate).round());
    cluster
        .wait_quiet(Duration::from_millis(500), Duration::from_secs(30))
        .await;

    measure_deletion(&cluster, 0, &root, spec_.n, spec_.delete_probe, &mut row).await?;
    let spread = format!("root in r0, ports spread over r0..r{}", regions.len() - 1);
    row.note = Some(match row.note.take() {
        Some(n) => format!("{spread}; {n}"),
        None => spread,
    });
    cluster.stop().await;
    Ok(row)
}

/// How many regions each region imports from in P3.
const IMPORTS: usize = 5;

/// The regions `j` imports from: the next five.
fn imports_from(j: usize, r: usize) -> Vec<usize> {
    (1..=IMPORTS.min(r - 1)).map(|d| (j + d) % r).collect()
}

/// The regions importing from `i`: the previous five.
fn importers_of(i: usize, r: usize) -> Vec<usize> {
    (1..=IMPORTS.min(r - 1)).map(|d| (i + r - d) % r).collect()
}

/// P3: every region owns networks, and holds one port on each network of
/// the five regions it imports from. Delete the networks one at a time;
/// a sample is the time from the owner's DELETING event of a network to
/// the importer's first event of its port leaving the live state (DELETING,
/// or PURGED for a port nothing references, which skips DELETING), both as
/// seen by Watch streams of this process.
pub async fn p3(spec_: &RowSpec) -> Result<Row> {
    let mut row = Row::for_spec(spec_);
    let r = spec_.regions;
    if r < 2 {
        return Err("p3 needs at least two regions".into());
    }
    let regions = region_names(r);
    let fan = IMPORTS.min(r - 1);
    let per_region = spec_.samples.div_ceil(r * fan).max(1);
    let peers_of = |j: usize| -> Vec<usize> {
        let set: BTreeSet<usize> = imports_from(j, r).into_iter().chain(importers_of(j, r)).collect();
        set.into_iter().collect()
    };
    let cluster = Cluster::start(ClusterSpec {
        peers_of: Some(&peers_of),
        ..ClusterSpec::for_row(spec_, &regions)
    })
    .await?;
    row.rss_idle_mb = harness::rss_mb();
    for (i, region) in regions.iter().enumerate() {
        let project = format!("{region}/project/p");
        let mut specs = vec![spec(project.clone(), &[])];
        specs.extend((0..per_region).map(|k| spec(format!("{region}/network/net{k}"), &[("project", &[&project])])));
        cluster.client(i).batch_create(specs).await?;
    }
    let started = Instant::now();
    for (j, region) in regions.iter().enumerate() {
        let specs: Vec<v1::ResourceSpec> = imports_from(j, r)
            .into_iter()
            .flat_map(|i| {
                let regions = &regions;
                (0..per_region).map(move |k| {
                    let target = format!("{}/network/net{k}", regions[i]);
                    spec(format!("{region}/port/i{i}-n{k}"), &[("network", &[&target])])
                })
            })
            .collect();
        let specs = Specs::new(specs.len() as u64, move |k| specs[k as usize].clone());
        batch_create(cluster.client(j), specs, 1_000, 1).await?;
    }
    row.populate_s = Some(round3(started.elapsed().as_secs_f64()));
    cluster
        .wait_quiet(Duration::from_millis(300), Duration::from_secs(30))
        .await;

    // One Watch per region; DELETING and PURGED events go to one channel
    // with the time they arrived (the first one per name counts).
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, Instant)>();
    let mut watchers = Vec::new();
    for m in &cluster.members {
        let mut stream = m.client.watch(0, "").await?;
        let tx = tx.clone();
        watchers.push(tokio::spawn(async move {
            while let Some(Ok(e)) = stream.next().await {
                if e.r#type == v1::EventType::Deleting as i32 || e.r#type == v1::EventType::Purged as i32 {
                    if let Some(res) = e.resource {
                        if tx.send((res.name, Instant::now())).is_err() {
                            break;
                        }
                    }
                }
            }
        }));
    }
    drop(tx);

    let mut seen: HashMap<String, Instant> = HashMap::new();
    let mut latencies = Vec::new();
    let started = Instant::now();
    'outer: for k in 0..per_region {
        for (i, owner) in regions.iter().enumerate() {
            let network = format!("{owner}/network/net{k}");
            let ports: Vec<String> = importers_of(i, r)
                .into_iter()
                .map(|j| format!("{}/port/i{i}-n{k}", regions[j]))
                .collect();
            cluster.client(i).delete(delete_request(&network)).await?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while !(seen.contains_key(&network) && ports.iter().all(|p| seen.contains_key(p))) {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, rx.recv()).await {
                    Ok(Some((name, at))) => {
                        seen.entry(name).or_insert(at);
                    }
                    Ok(None) => return Err("the watch streams ended".into()),
                    Err(_) => {
                        return Err(format!("{network}: importers did not act within 10 s").into());
                    }
                }
            }
            let owner_at = seen[&network];
            for p in &ports {
                latencies.push(ms(seen[p].saturating_duration_since(owner_at)));
            }
            if latencies.len() >= spec_.samples {
                break 'outer;
            }
        }
    }
    let wall = started.elapsed().as_secs_f64();
    row.wall_s = Some(round3(wall));
    row.rate_per_s = Some((latencies.len() as f64 / wall).round());
    row.samples = Some(latencies.len() as u64);
    row.p50_ms = percentile(&latencies, 0.50);
    row.p99_ms = percentile(&latencies, 0.99);
    row.max_ms = percentile(&latencies, 1.0);
    row.peak_rss_mb = harness::peak_rss_mb();
    row.peer_watch_streams = Some(cluster.members.iter().map(|m| m.peers as u64).sum());
    row.import_streams = Some((r * fan) as u64);
    row.note = Some(format!(
        "{r} regions, each importing from {fan}; deletes one at a time; tick {} ms",
        spec_.tick_ms
    ));
    for w in watchers {
        w.abort();
    }
    cluster.stop().await;
    Ok(row)
}

/// P5: `r1` BatchCreates `n` ports referencing a network in `r0`, in
/// batches of 1,000 from two concurrent callers; references per second.
pub async fn p5(spec_: &RowSpec) -> Result<Row> {
    let mut row = Row::for_spec(spec_);
    let regions = region_names(2);
    let cluster = Cluster::start(ClusterSpec::for_row(spec_, &regions)).await?;
    cluster
        .client(0)
        .batch_create(vec![
            spec("r0/project/p".into(), &[]),
            spec("r0/network/n".into(), &[("project", &["r0/project/p"])]),
        ])
        .await?;
    let specs = Specs::new(spec_.n, |k| {
        spec(format!("r1/port/p{k}"), &[("network", &["r0/network/n"])])
    });
    let before = cluster.stats();
    let started = Instant::now();
    let latencies = batch_create(cluster.client(1), specs, 1_000, 2).await?;
    let wall = started.elapsed().as_secs_f64();
    let after = cluster
        .wait_quiet(Duration::from_millis(300), Duration::from_secs(30))
        .await;
    let d = harness::delta(after, before);
    row.wall_s = Some(round3(wall));
    row.rate_per_s = Some((spec_.n as f64 / wall).round());
    row.p50_ms = percentile(&latencies, 0.50);
    row.p99_ms = percentile(&latencies, 0.99);
    row.key_writes = Some(d.key_writes);
    row.value_bytes = Some(d.value_bytes);
    row.batches = Some(d.batches);
    row.peak_rss_mb = harness::peak_rss_mb();
    row.note = Some(format!(
        "references/s; batches of 1000, 2 callers; {:.1} key writes per reference (both regions)",
        d.key_writes as f64 / spec_.n.max(1) as f64
    ));
    cluster.stop().await;
    Ok(row)
}
