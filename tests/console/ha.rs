//! The console of a region of several nodes over one PostgreSQL database
//! (`[ha]`): every node serves it, a standby's pages read through its own
//! API (which forwards to the writer), and a standby that takes over
//! keeps serving it on the same address.

use std::io::Write as _;
use std::time::{Duration, Instant};

use crate::hosts::request;
use crate::support::ha::HaCluster;
use crate::support::{delete_req, free_ports, spec_in};

/// GETs `path` from the console at `addr` until it answers 200 within
/// `limit`; every answer on the way must be an HTTP answer (the console
/// listens throughout), and the 200's body is returned.
async fn page_within(addr: &str, path: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let (status, answer) = request(addr, "GET", path, addr, "").await;
        if status == 200 {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "{path} on {addr}: no page within {limit:?}; the last answer: {status} {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standbys_console_serves_an_operation_and_keeps_serving_it_after_the_writer_is_killed() {
    let Some(pg) = cascade_testpg::server() else { return };
    let mut cluster = HaCluster::configure(pg, &["eu-west"], 2, |_| String::new());
    let consoles: Vec<String> = free_ports(2).iter().map(|p| format!("127.0.0.1:{p}")).collect();
    for (node, console) in consoles.iter().enumerate() {
        let mut config = std::fs::OpenOptions::new()
            .append(true)
            .open(cluster.config("eu-west", node))
            .expect("the node's config");
        writeln!(config, "\n[console]\nlisten = \"{console}\"").expect("the console's address");
    }
    cluster.start_all();
    let writer = cluster.wait_writer("eu-west", Duration::from_secs(20)).await;
    let standby = 1 - writer;
    let client = cluster.client("eu-west", standby).await;
    client
        .create(spec_in("eu-west/project/ha-console", &[]))
        .await
        .expect("create");
    let operation = client
        .delete(delete_req("eu-west/project/ha-console", true))
        .await
        .expect("delete")
        .operation
        .expect("an operation")
        .id;
    let path = format!("/operations/{operation}");

    let console = &consoles[standby];
    let before = page_within(console, &path, Duration::from_secs(20)).await;
    assert!(before.contains(&operation), "{before}");
    assert!(before.contains("SUCCEEDED"), "{before}");

    cluster.kill("eu-west", writer);
    // The standby takes the lease over; its console answered all along
    // and serves the page again as the writer.
    let after = page_within(console, &path, Duration::from_secs(30)).await;
    assert!(after.contains(&operation), "{after}");
    assert_eq!(cluster.wait_writer("eu-west", Duration::from_secs(30)).await, standby);
    let again = page_within(console, &path, Duration::from_secs(10)).await;
    assert!(again.contains("SUCCEEDED"), "{again}");
}
