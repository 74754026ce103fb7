//! Crash-loop soak (issue 4): three `cascade serve` processes on real sled,
//! a workload of cross-region cascades, and SIGKILL of one node every few
//! seconds with a restart on the same data directory. At the end every
//! accepted deletion has finished and the invariant checker finds nothing.
//!
//! `cargo test --test soak` runs a short soak (about 15 s of kills).
//! A long run: `CASCADE_SOAK_SECS=600 cargo test --release --test soak -- --nocapture`
//! (it prints kills survived and deletions completed).

// Test code, not a node: poll deadlines and elapsed times are real time,
// and made-up ids need no IdSource (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Progress and results go to the terminal (`--nocapture`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::Client;
use cascade_proto::v1;
use support::*;

const REGIONS: [&str; 3] = ["ra", "rb", "rc"];

fn soak_duration() -> Duration {
    let secs = std::env::var("CASCADE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    Duration::from_secs(secs)
}

/// One workload round: a project and network in `owner`, five ports on it
/// in the next region, a floating IP (unset reference) in the third, then a
/// cascade delete of the project. Returns the operation id if the delete
/// was accepted; any call may fail while a node is down (the round stops).
async fn round(clients: &[Client], k: usize) -> Result<Option<String>, cascade_client::ClientError> {
    let owner = REGIONS[k % 3];
    let importer = REGIONS[(k + 1) % 3];
    let third = REGIONS[(k + 2) % 3];
    let client = |region: &str| &clients[REGIONS.iter().position(|r| *r == region).unwrap_or(0)];
    client(owner)
        .batch_create(vec![
            spec(&format!("{owner}/project/p{k}"), &[]),
            spec(
                &format!("{owner}/network/n{k}"),
                &[("project", &[&format!("{owner}/project/p{k}")])],
            ),
        ])
        .await?;
    let network = format!("{owner}/network/n{k}");
    let ports: Vec<_> = (0..5)
        .map(|i| {
            spec(
                &format!("{importer}/port/k{k}-{i}"),
                &[("network", &[network.as_str()])],
            )
        })
        .collect();
    client(importer).batch_create(ports).await?;
    let port = format!("{importer}/port/k{k}-0");
    client(third)
        .create(spec(
            &format!("{third}/floating_ip/f{k}"),
            &[
                ("project", &[&format!("{third}/project/base")]),
                ("port", &[port.as_str()]),
            ],
        ))
        .await?;
    let response = client(owner)
        .delete(delete_req(&format!("{owner}/project/p{k}"), true))
        .await?;
    Ok(response.operation.map(|op| op.id))
}

async fn connect_all(cluster: &[(String, String)]) -> Vec<Client> {
    let mut out = Vec::new();
    for (_, endpoint) in cluster {
        out.push(
            eventually(Duration::from_secs(30), "a node to accept connections", || async {
                Client::connect(endpoint).await.ok()
            })
            .await,
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop_soak_finishes_every_accepted_deletion() {
    let cluster = ProcCluster::new(&REGIONS, |_| "tick_ms = 50\ncheck_interval_ms = 1000".to_owned());
    let endpoints = cluster.endpoints();
    let clients = connect_all(&endpoints).await;
    for (i, region) in REGIONS.iter().enumerate() {
        clients[i]
            .create(spec(&format!("{region}/project/base"), &[]))
            .await
            .unwrap();
    }

    // The killer: SIGKILL one node every 2–3.5 s, restart it after 300 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut cluster = cluster;
            let mut kills = 0usize;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2_000 + (kills as u64 * 577) % 1_500));
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let region = REGIONS[(kills * 7 + 1) % 3];
                cluster.kill(region);
                std::thread::sleep(Duration::from_millis(300));
                cluster.start(region);
                kills += 1;
            }
            (cluster, kills)
        })
    };

    let deadline = Instant::now() + soak_duration();
    let mut accepted = Vec::new();
    let mut rounds = 0;
    let mut interrupted = 0;
    while Instant::now() < deadline {
        // Fresh clients each round: a restarted node has a new connection.
        let clients = connect_all(&endpoints).await;
        match round(&clients, rounds).await {
            Ok(Some(op)) => accepted.push(op),
            Ok(None) => {}
            Err(_) => interrupted += 1,
        }
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (_cluster, kills) = tokio::task::spawn_blocking(move || killer.join().expect("killer thread"))
        .await
        .unwrap();

    // Every accepted deletion finishes, across all regions.
    let clients = connect_all(&endpoints).await;
    for id in &accepted {
        let done = eventually(
            Duration::from_secs(120),
            &format!("operation {id} to finish"),
            || async {
                let op = clients[0].get_operation(id, 0).await.ok()?;
                op.done.then_some(op)
            },
        )
        .await;
        assert_eq!(
            v1::OperationState::try_from(done.state),
            Ok(v1::OperationState::Succeeded),
            "operation {id}: {done:?}"
        );
    }
    wait_quiescent_at(&endpoints).await;
    assert_no_violations_at(&endpoints).await;
    println!(
        "soak: {:?}, {kills} kills survived, {rounds} rounds ({interrupted} cut short by a kill), {} deletions accepted and completed, 0 violations",
        soak_duration(),
        accepted.len()
    );
    assert!(kills >= 2, "the soak killed nodes");
    assert!(!accepted.is_empty(), "some deletions were accepted");
}
