//! Cross-region durability with real `cascade serve` processes: a region
//! SIGKILLed in the middle of a cascade it imports, and in the middle of
//! cross-region creates, restarts from the same configuration and converges
//! with nothing applied twice and nothing half-attached. Each scenario runs
//! once per storage engine.

// Test code, not a node: poll deadlines and elapsed times are real time,
// and made-up ids need no IdSource (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Progress and results go to the terminal (`--nocapture`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod support;

use std::collections::{BTreeMap, BTreeSet};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cascade_node::store::{StorageEngine, ENGINE_MARKER};
use cascade_proto::v1;
use support::*;

fn port_on(name: &str, network: &str) -> v1::ResourceSpec {
    spec_in(name, &[("network", &[network])])
}

/// The `[deletion]` table's lines, then a `[storage]` table naming the
/// engine: `ProcCluster` writes the `[deletion]` table last in each region's
/// config, so the text may open a table after it.
fn deletion_and_engine(deletion: &str, engine: StorageEngine) -> String {
    format!("{deletion}\n\n[storage]\nengine = \"{engine}\"")
}

/// Every region's data directory was written by `engine`.
fn assert_engine(cluster: &ProcCluster, engine: StorageEngine) {
    for (region, _) in &cluster.regions {
        let marker = std::fs::read_to_string(cluster.dir.path().join(region).join(ENGINE_MARKER)).unwrap();
        assert_eq!(marker.trim(), engine.name(), "{region}");
    }
}

/// Modest: a cross-region BatchCreate settles (activates) its resources one
/// writer step each, ~15 ms apiece in a debug build.
const PORTS: usize = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_an_importing_region_mid_cascade_then_restart_completes_once_on_sled() {
    sigkill_of_an_importing_region_mid_cascade_then_restart_completes_once(StorageEngine::Sled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_an_importing_region_mid_cascade_then_restart_completes_once_on_fjall() {
    sigkill_of_an_importing_region_mid_cascade_then_restart_completes_once(StorageEngine::Fjall).await;
}

/// B imports a 600-port cascade from A and is SIGKILLed in the middle of
/// it; restarted from the same config it resumes from its cursor. Every
/// port is deleted once and every unset applied once.
async fn sigkill_of_an_importing_region_mid_cascade_then_restart_completes_once(engine: StorageEngine) {
    let mut cluster = ProcCluster::new(&["ra", "rb", "rc"], |region| {
        let deletion = if region == "rb" {
            // Small steps, so the kill lands mid-cascade.
            "batch_budget = 10\ntick_ms = 50\ncheck_interval_ms = 500"
        } else {
            "tick_ms = 50\ncheck_interval_ms = 500"
        };
        deletion_and_engine(deletion, engine)
    });
    let t0 = Instant::now();
    let (a, b, cc) = (
        cluster.client("ra").await,
        cluster.client("rb").await,
        cluster.client("rc").await,
    );
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/n", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    b.create(spec_in("rb/project/pb", &[])).await.unwrap();
    for chunk in (0..PORTS).collect::<Vec<_>>().chunks(300) {
        b.batch_create(
            chunk
                .iter()
                .map(|i| port_on(&format!("rb/port/p{i}"), "ra/network/n"))
                .collect(),
        )
        .await
        .unwrap();
    }
    cc.create(spec_in("rc/project/pc", &[])).await.unwrap();
    // Two unset referrers: one local to B, one in C pointing into B.
    b.create(spec_in(
        "rb/floating_ip/fb",
        &[("project", &["rb/project/pb"]), ("port", &["rb/port/p7"])],
    ))
    .await
    .unwrap();
    cc.create(spec_in(
        "rc/floating_ip/fc",
        &[("project", &["rc/project/pc"]), ("port", &["rb/port/p599"])],
    ))
    .await
    .unwrap();

    eprintln!("setup took {:?}", t0.elapsed());
    let started = Instant::now();
    let op = a
        .delete(delete_req("ra/network/n", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    // Watch B's own part of the operation (no fan-out) and kill B as soon as
    // it is under way.
    let mut b_peer = peer_client(&cluster.endpoint("rb")).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let at_kill = loop {
        assert!(
            Instant::now() < deadline,
            "B's part of the cascade never showed progress"
        );
        let part = b_peer
            .operation_part(v1::GetOperationRequest {
                id: op.id.clone(),
                ..Default::default()
            })
            .await;
        let Ok(part) = part.map(|p| p.into_inner()) else {
            continue;
        };
        let p = part.progress.unwrap_or_default();
        assert!(
            p.deleted < PORTS as u64,
            "B finished its part before the kill could land: {p:?}"
        );
        if p.deleted >= 20 {
            break p;
        }
    };
    drop(b);
    cluster.kill("rb");
    eprintln!("killed rb after {:?} at {at_kill:?} (B's part)", started.elapsed());

    // While B is down, A's operation cannot finish and says why.
    let waiting = a.get_operation(&op.id, 0).await.unwrap();
    assert!(!waiting.done, "{waiting:?}");
    assert!(waiting.unreachable_regions.iter().any(|r| r == "rb"), "{waiting:?}");

    cluster.start("rb");
    let b = cluster.client("rb").await;
    let restarted = Instant::now();
    let done = wait_operation(&a, &op.id).await;
    eprintln!("completed {:?} after the restart", restarted.elapsed());
    assert_eq!(
        v1::OperationState::try_from(done.state),
        Ok(v1::OperationState::Succeeded),
        "{done:?}"
    );
    let p = done.progress.unwrap();
    assert_eq!(
        p.deleted,
        PORTS as u64 + 1,
        "every port and the network, each once: {p:?}"
    );
    assert_eq!(p.unset, 2, "both floating ips, once each: {p:?}");
    assert_eq!((p.pending, p.blocked, p.failed), (0, 0, 0), "{p:?}");

    wait_gone(&a, "ra/network/n").await;
    let ports = b
        .list(v1::ListRequest {
            kind: "port".into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(ports.resources.is_empty(), "{} ports left", ports.resources.len());
    for (client, fip) in [(&b, "rb/floating_ip/fb"), (&cc, "rc/floating_ip/fc")] {
        let f = client.get(fip).await.unwrap();
        assert_eq!(state(&f), v1::ResourceState::Active, "{fip}");
        assert!(targets(&f, "port").is_empty(), "{fip}: {f:?}");
    }
    assert_eq!(state(&a.get("ra/project/p").await.unwrap()), v1::ResourceState::Active);

    wait_quiescent_at(&cluster.endpoints()).await;
    assert_no_violations_at(&cluster.endpoints()).await;
    assert_engine(&cluster, engine);
}

/// B is SIGKILLed while ~50 creates of ports on A's network are in flight.
/// After the restart every port is either ACTIVE in B with its
/// back-reference at A, or absent from both: never one without the other.
async fn sigkill_during_cross_region_creates(b_tick_ms: u64, engine: StorageEngine) {
    let mut cluster = ProcCluster::new(&["ra", "rb"], |region| {
        let tick = if region == "rb" { b_tick_ms } else { 50 };
        deletion_and_engine(&format!("tick_ms = {tick}\ncheck_interval_ms = 500"), engine)
    });
    let a = cluster.client("ra").await;
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/n", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    let net_uid = a.get("ra/network/n").await.unwrap().uid;

    const N: usize = 50;
    let b = cluster.client("rb").await;
    // B dies as soon as creates are visibly cut between their durable
    // CREATING write and ACTIVE, or at the first acknowledgement.
    let victim = Arc::new(Mutex::new(Some(cluster.take("rb"))));
    let ok = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for i in 0..N {
        let (b, ok, victim) = (b.clone(), ok.clone(), victim.clone());
        calls.push(tokio::spawn(async move {
            let r = b.create(port_on(&format!("rb/port/q{i}"), "ra/network/n")).await;
            if r.is_ok() && ok.fetch_add(1, Ordering::SeqCst) == 0 {
                drop(victim.lock().unwrap().take());
            }
            r.is_ok()
        }));
    }
    let b_endpoint = cluster.endpoint("rb");
    let mut peer = peer_client(&b_endpoint).await;
    while victim.lock().unwrap().is_some() {
        match peer.dump(v1::DumpRequest {}).await {
            Ok(d) if d.get_ref().pending_attach >= 3 => drop(victim.lock().unwrap().take()),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    drop(victim.lock().unwrap().take());
    let mut acknowledged = BTreeSet::new();
    for (i, call) in calls.into_iter().enumerate() {
        if call.await.unwrap() {
            acknowledged.insert(format!("rb/port/q{i}"));
        }
    }
    drop(victim.lock().unwrap().take());
    eprintln!("{} of {N} creates acknowledged before the kill", acknowledged.len());
    assert!(acknowledged.len() < N, "the kill should cut some creates short");

    cluster.start("rb");
    let endpoints = cluster.endpoints();
    wait_quiescent_at(&endpoints).await;

    let a_dump = dump(&cluster.endpoint("ra")).await.unwrap();
    let b_dump = dump(&cluster.endpoint("rb")).await.unwrap();
    // Back-references at A (owner rows) and mirrors in B, by referrer.
    let rows = |d: &v1::DumpResponse| -> BTreeMap<String, String> {
        d.backrefs
            .iter()
            .filter(|r| r.target.as_ref().unwrap().uid == net_uid)
            .map(|r| {
                let referrer = r.referrer.as_ref().unwrap();
                (referrer.name.clone(), referrer.uid.clone())
            })
            .collect()
    };
    let (owner_rows, mirror_rows) = (rows(&a_dump), rows(&b_dump));
    let ports: BTreeMap<String, &v1::Resource> = b_dump
        .resources
        .iter()
        .filter(|r| r.kind == "port")
        .map(|r| (r.name.clone(), r))
        .collect();
    let mut active = 0;
    for i in 0..N {
        let name = format!("rb/port/q{i}");
        match ports.get(&name) {
            Some(r) => {
                assert_eq!(state(r), v1::ResourceState::Active, "{name}: {r:?}");
                assert_eq!(r.refs[0].targets[0].uid, net_uid, "{name}");
                assert_eq!(
                    owner_rows.get(&name),
                    Some(&r.uid),
                    "{name}: ACTIVE in B, A must hold it"
                );
                assert_eq!(mirror_rows.get(&name), Some(&r.uid), "{name}: B's mirror row");
                active += 1;
            }
            None => {
                assert!(!acknowledged.contains(&name), "{name}: acknowledged, then lost");
                assert!(!owner_rows.contains_key(&name), "{name}: absent in B, leaked at A");
                assert!(!mirror_rows.contains_key(&name), "{name}: absent in B, mirror left");
            }
        }
    }
    assert_eq!(owner_rows.len(), active, "no other rows at A: {owner_rows:?}");
    eprintln!("{active} of {N} ports ACTIVE after the restart");
    assert_no_violations_at(&endpoints).await;

    // And the network's cascade counts exactly those.
    let op = a
        .delete(delete_req("ra/network/n", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    let done = wait_operation(&a, &op.id).await;
    assert_eq!(
        v1::OperationState::try_from(done.state),
        Ok(v1::OperationState::Succeeded),
        "{done:?}"
    );
    assert_eq!(done.progress.unwrap().deleted, active as u64 + 1);
    wait_quiescent_at(&endpoints).await;
    assert_no_violations_at(&endpoints).await;
    assert_engine(&cluster, engine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_cross_region_creates_leaves_each_port_whole_or_absent_on_sled() {
    sigkill_during_cross_region_creates(50, StorageEngine::Sled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_cross_region_creates_leaves_each_port_whole_or_absent_on_fjall() {
    sigkill_during_cross_region_creates(50, StorageEngine::Fjall).await;
}

/// At the default tick (200 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_cross_region_creates_at_the_default_tick_on_sled() {
    sigkill_during_cross_region_creates(200, StorageEngine::Sled).await;
}

/// At the default tick (200 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_cross_region_creates_at_the_default_tick_on_fjall() {
    sigkill_during_cross_region_creates(200, StorageEngine::Fjall).await;
}

/// An importer's commits that skip their flush (the cursor moved over
/// events that concern nothing there, the tombstone of a target its owner
/// purged removed, releases the owner acknowledged removed: see
/// `WriterState::commit_as`) are lost in a crash, and the owner sending
/// the same again repairs it: nothing is applied twice or left behind.
/// Every commit it means to lose follows a round trip that ends B's
/// flushed step first (the releases' for the PURGED, a create's for the
/// progress mark): it once lost them only when A's watch happened to send
/// them apart from a flushed DELETING, and on a loaded machine (CI) it
/// sent a second network's DELETING and PURGED in one page, which B
/// applied in one flushed commit, and nothing was lost.
/// B runs fjall made to keep unflushed commits in the process, so the
/// SIGKILL loses them as a power loss would (by default fjall hands each
/// commit to the operating system at once, and a SIGKILL loses nothing),
/// and B ticks every ten minutes, so no tick flushes them first. Only on
/// fjall: sled flushes in the background every 500 ms, so whether a kill
/// loses anything there is a matter of timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_that_loses_an_importers_unflushed_commits_has_them_sent_again_on_fjall() {
    const PORTS: usize = 10;
    const CREATES: usize = 3;
    let engine = StorageEngine::Fjall;
    let mut cluster = ProcCluster::new(&["ra", "rb"], |region| {
        let deletion = if region == "rb" {
            "tick_ms = 600000\ncheck_interval_ms = 600000"
        } else {
            "tick_ms = 50\ncheck_interval_ms = 500"
        };
        deletion_and_engine(deletion, engine)
    });
    // B again, with its metrics (what the restart received) and the knob;
    // killed once it serves: a kill inside its first open of the store is
    // not what this test is about (it once landed inside fjall's creation
    // of the database, which `store::tests::a_fjall_database_whose_creation_was_cut_short_opens_afresh`
    // now covers).
    let serving = Instant::now() + Duration::from_secs(30);
    while support::ha::health(&cluster.endpoint("rb"), "").await
        != Some(tonic_health::pb::health_check_response::ServingStatus::Serving)
    {
        assert!(Instant::now() < serving, "rb serves after its first start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.kill("rb");
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], free_ports(1)[0]));
    let config = cluster.config("rb");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("metrics_listen = \"{metrics}\"\n{text}")).unwrap();
    let knob = [(cascade_node::store::KEEP_UNFLUSHED_IN_PROCESS, "1")];
    cluster.start_with_env("rb", &knob);

    let (a, b) = (cluster.client("ra").await, cluster.client("rb").await);
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/n", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    b.batch_create(
        (0..PORTS)
            .map(|i| port_on(&format!("rb/port/p{i}"), "ra/network/n"))
            .collect(),
    )
    .await
    .unwrap();

    // The network's cascade: B applies its DELETING (flushed: it purges
    // the ports and queues their releases), then, without flushes of their
    // own, the acknowledgement of the releases and the network's PURGED.
    let op = a
        .delete(delete_req("ra/network/n", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    let done = wait_operation(&a, &op.id).await;
    assert_eq!(
        v1::OperationState::try_from(done.state),
        Ok(v1::OperationState::Succeeded),
        "{done:?}"
    );
    // Creates in A, which B is not sent: A's watch passes over them with a
    // progress mark, which moves B's cursor in a commit that skips its
    // flush. After the creates were acknowledged, so never in B's step
    // that applied the DELETING.
    a.batch_create(
        (0..CREATES)
            .map(|i| spec_in(&format!("ra/project/later{i}"), &[]))
            .collect(),
    )
    .await
    .unwrap();
    let (a_endpoint, b_endpoint) = (cluster.endpoint("ra"), cluster.endpoint("rb"));
    let last = dump(&a_endpoint).await.unwrap().last_revision;
    let applied_all = |d: &v1::DumpResponse| d.cursors.get("ra") == Some(&last) && unquiet(d).is_none();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !applied_all(&dump(&b_endpoint).await.unwrap()) {
        assert!(Instant::now() < deadline, "B never applied A's events up to {last}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    cluster.kill("rb");
    cluster.start_with_env("rb", &knob);
    let endpoints = cluster.endpoints();
    wait_quiescent_at(&endpoints).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !applied_all(&dump(&b_endpoint).await.unwrap()) {
        assert!(
            Instant::now() < deadline,
            "B never caught up with A's events after the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The crash lost what skipped its flush, and A sent it again: the
    // restarted B received the network's PURGED, which it had applied
    // before the kill, and caught up to `last` above only by a progress
    // mark sent again (no event after the PURGED is B's).
    let resent = scrape(metrics)
        .await
        .get("cascade_peer_events_received_total{peer=\"ra\",type=\"purged\"}")
        .copied()
        .unwrap_or(0.0);
    assert!(
        resent >= 1.0,
        "the restarted B was sent no PURGED event again: nothing was lost?"
    );
    eprintln!("{resent} PURGED events sent again after the restart");

    // Applied again to the same effect, and the releases sent again
    // changed nothing: the operation counts each port once.
    let done = a.get_operation(&op.id, 0).await.unwrap();
    let p = done.progress.unwrap();
    assert_eq!(
        p.deleted,
        PORTS as u64 + 1,
        "every port and the network, each once: {p:?}"
    );
    assert_eq!((p.pending, p.blocked, p.failed), (0, 0, 0), "{p:?}");
    let a_dump = dump(&a_endpoint).await.unwrap();
    assert!(
        a_dump.backrefs.is_empty(),
        "A holds no row of B's ports: {:?}",
        a_dump.backrefs
    );
    let b_dump = dump(&b_endpoint).await.unwrap();
    assert!(b_dump.remote_deletions.is_empty(), "{:?}", b_dump.remote_deletions);
    assert!(
        !b_dump.resources.iter().any(|r| r.kind == "port"),
        "B's ports stay gone"
    );
    assert_no_violations_at(&endpoints).await;
    assert_engine(&cluster, engine);
}
