//! What an operator watches: Prometheus metrics moving through a
//! cross-region cascade, gRPC health that follows the writer, and `cascade
//! status` naming a frozen region unreachable.

// Test code: real time for deadlines.
#![allow(clippy::disallowed_methods)]

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cascade_core::{RegionId, Schema};
use cascade_node::store::{Batch, Entry, MemoryStore, Store, StoreError, Table};
use cascade_node::{NodeEnv, NodeSettings, RunningNode};
use support::*;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

fn sample(samples: &BTreeMap<String, f64>, key: &str) -> f64 {
    *samples.get(key).unwrap_or_else(|| {
        panic!(
            "no sample {key} in the scrape: {:?}",
            samples.keys().collect::<Vec<_>>()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_shows_a_cross_region_cascade_in_the_metrics() {
    let cluster = start_cluster_with(&["eu-west", "us-east"], |s| {
        s.metrics_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    })
    .await;
    let eu = cluster
        .node("eu-west")
        .node
        .metrics_addr()
        .expect("eu-west serves metrics");
    let us = cluster
        .node("us-east")
        .node
        .metrics_addr()
        .expect("us-east serves metrics");
    let client = cluster.client("eu-west");
    client
        .batch_create(vec![
            spec_in("eu-west/project/p", &[]),
            spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]),
        ])
        .await
        .expect("owner's resources created");
    client
        .batch_create(vec![
            spec_in("us-east/port/a", &[("network", &["eu-west/network/n"])]),
            spec_in("us-east/port/b", &[("network", &["eu-west/network/n"])]),
        ])
        .await
        .expect("importer's resources created");

    let before_eu = scrape(eu).await;
    let before_us = scrape(us).await;
    assert_eq!(sample(&before_eu, r#"cascade_resources{state="active"}"#), 2.0);
    assert_eq!(sample(&before_us, r#"cascade_resources{state="active"}"#), 2.0);
    assert_eq!(sample(&before_eu, "cascade_deletions_accepted_total"), 0.0);
    // The link from each region to the other is up.
    eventually(Duration::from_secs(10), "eu-west's link to us-east", || async {
        (sample(&scrape(eu).await, r#"cascade_peer_connected{peer="us-east"}"#) == 1.0).then_some(())
    })
    .await;

    let missing = client.get("eu-west/network/none").await.expect_err("no such resource");
    assert_eq!(code(&missing), Some(tonic::Code::NotFound));
    let op = delete_and_wait(client, "eu-west/network/n", true).await;
    assert!(op.done, "{op:?}");

    let after_eu = scrape(eu).await;
    assert_eq!(sample(&after_eu, "cascade_deletions_accepted_total"), 1.0);
    assert_eq!(
        sample(&after_eu, r#"cascade_deletions_finished_total{outcome="purged"}"#),
        1.0
    );
    assert_eq!(sample(&after_eu, r#"cascade_resources{state="active"}"#), 1.0);
    assert_eq!(sample(&after_eu, r#"cascade_resources{state="deleting"}"#), 0.0);
    assert!(sample(&after_eu, "cascade_outbox_last_revision") > sample(&before_eu, "cascade_outbox_last_revision"));
    assert!(
        sample(&after_eu, "cascade_writer_batch_keys_count") > sample(&before_eu, "cascade_writer_batch_keys_count")
    );
    assert!(
        sample(
            &after_eu,
            r#"cascade_writer_step_duration_seconds_count{step="delete"}"#
        ) >= 1.0,
        "the Delete step was timed"
    );
    // The gRPC layer counts by method and by the code the client saw.
    assert_eq!(
        sample(
            &after_eu,
            r#"cascade_grpc_server_requests_total{code="NOT_FOUND",method="/cascade.v1.Resources/Get"}"#
        ),
        1.0
    );
    assert!(
        sample(
            &after_eu,
            r#"cascade_grpc_server_requests_total{code="OK",method="/cascade.v1.Resources/Delete"}"#
        ) >= 1.0
    );
    assert!(
        sample(
            &after_eu,
            r#"cascade_grpc_server_request_duration_seconds_count{method="/cascade.v1.Resources/Delete"}"#
        ) >= 1.0
    );
    // The importer cascaded both ports, and they count as finished there.
    let after_us = eventually(Duration::from_secs(10), "us-east's purges to be counted", || async {
        let s = scrape(us).await;
        (sample(&s, r#"cascade_deletions_finished_total{outcome="purged"}"#) == 2.0).then_some(s)
    })
    .await;
    assert_eq!(sample(&after_us, "cascade_deletions_started_total"), 2.0);
    assert_eq!(sample(&after_us, r#"cascade_resources{state="active"}"#), 0.0);
    // us-east acknowledged eu-west's events: nothing it is sent is behind.
    eventually(
        Duration::from_secs(15),
        "us-east to acknowledge eu-west's outbox",
        || async { (sample(&scrape(eu).await, r#"cascade_peer_events_behind{peer="us-east"}"#) == 0.0).then_some(()) },
    )
    .await;
    let now = cascade_node::clock::Clock::now(&cascade_node::clock::SystemClock).0 as f64 / 1000.0;
    let contact = sample(
        &scrape(eu).await,
        r#"cascade_peer_last_contact_timestamp_seconds{peer="us-east"}"#,
    );
    assert!((now - contact).abs() < 60.0, "last contact {contact}, now {now}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_deletion_shows_as_blocked_retried_and_ageing_in_the_metrics() {
    let n = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        s.metrics_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        s.policy.backoff_base_ms = 20;
        s.policy.backoff_cap_ms = 50;
    })
    .await;
    let metrics = n.node.metrics_addr().expect("metrics served");
    n.client
        .batch_create(vec![
            spec("project/p", &[]),
            spec("project/q", &[]),
            spec("network/ext", &[("project", &["project/p"])]),
            // A router of another project holds the network (block).
            spec(
                "router/edge",
                &[("project", &["project/q"]), ("gateway_network", &["network/ext"])],
            ),
        ])
        .await
        .expect("created");
    n.client.delete(delete_req("project/p", true)).await.expect("accepted");
    let held = eventually(Duration::from_secs(10), "the network held, and retried", || async {
        let s = scrape(metrics).await;
        let held = sample(&s, r#"cascade_deletions{status="blocked"}"#) >= 1.0
            && sample(&s, "cascade_deletion_retries_total") >= 2.0
            && sample(&s, "cascade_deletion_longest_running_seconds") > 0.0;
        held.then_some(s)
    })
    .await;
    assert!(sample(&held, "cascade_retry_queue_depth") >= 1.0);
    assert!(sample(&held, r#"cascade_resources{state="deleting"}"#) >= 1.0);
    assert!(
        sample(&held, "cascade_deletion_unfinished_work_seconds")
            >= sample(&held, "cascade_deletion_longest_running_seconds")
    );
    assert_eq!(
        sample(&held, r#"cascade_deletions_finished_total{outcome="failed"}"#),
        0.0
    );

    // The blocker goes: everything finishes, and the gauges go back to 0.
    n.client
        .delete(delete_req("router/edge", false))
        .await
        .expect("router deleted");
    // A scrape is no snapshot: the counters and the tables it reads may be
    // a commit apart (CI once saw deleting 0 beside one pending deletion),
    // so wait for all of it.
    let done = eventually(Duration::from_secs(10), "the cascade to finish", || async {
        let s = scrape(metrics).await;
        let settled = sample(&s, r#"cascade_resources{state="deleting"}"#) == 0.0
            && sample(&s, "cascade_retry_queue_depth") == 0.0
            && ["pending", "blocked", "waiting", "failed"]
                .iter()
                .all(|status| sample(&s, &format!("cascade_deletions{{status=\"{status}\"}}")) == 0.0);
        settled.then_some(s)
    })
    .await;
    for status in ["pending", "blocked", "waiting", "failed"] {
        assert_eq!(
            sample(&done, &format!("cascade_deletions{{status=\"{status}\"}}")),
            0.0,
            "{status}"
        );
    }
    assert_eq!(sample(&done, "cascade_retry_queue_depth"), 0.0);
    assert_eq!(sample(&done, "cascade_deletion_longest_running_seconds"), 0.0);
    assert_eq!(sample(&done, r#"cascade_resources{state="active"}"#), 1.0, "project q");
    assert_eq!(sample(&done, "cascade_deletions_accepted_total"), 2.0);
}

/// A store whose commits fail while `failing` is set (a full disk, a
/// read-only volume).
struct FailingStore {
    inner: MemoryStore,
    failing: Arc<AtomicBool>,
}

impl Store for FailingStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.inner.scan(table, prefix, after, limit)
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Engine("No space left on device (simulated)".into()));
        }
        self.inner.commit(batch)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
}

async fn health(channel: &tonic::transport::Channel, service: &str) -> ServingStatus {
    let answer = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .unwrap_or_else(|e| panic!("health of {service:?}: {e}"));
    ServingStatus::try_from(answer.into_inner().status).unwrap_or(ServingStatus::Unknown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_while_the_writer_cannot_commit_and_serving_again_after() {
    let failing = Arc::new(AtomicBool::new(false));
    let store = Arc::new(FailingStore {
        inner: MemoryStore::default(),
        failing: failing.clone(),
    });
    let settings = NodeSettings::new(
        RegionId::parse(REGION).unwrap(),
        Arc::new(Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).unwrap()),
        None,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node = RunningNode::start_with(
        settings,
        NodeEnv {
            store: Some(store),
            ..NodeEnv::default()
        },
        listener,
    )
    .await
    .expect("node starts");
    let client = cascade_client::Client::connect(&node.endpoint()).await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(node.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let services = ["", "cascade.v1.Resources", "cascade.v1.Peer", "cascade.v1.Admin"];
    for service in services {
        assert_eq!(health(&channel, service).await, ServingStatus::Serving, "{service:?}");
    }

    failing.store(true, Ordering::SeqCst);
    let refused = client
        .create(spec("project/p", &[]))
        .await
        .expect_err("the store refuses the commit");
    assert_eq!(code(&refused), Some(tonic::Code::Unavailable), "{refused}");
    for service in services {
        let status = eventually(Duration::from_secs(5), "NOT_SERVING", || async {
            let s = health(&channel, service).await;
            (s == ServingStatus::NotServing).then_some(s)
        })
        .await;
        assert_eq!(status, ServingStatus::NotServing, "{service:?}");
    }

    // The disk recovers. Nobody writes: the writer's tick probes the
    // store, and health comes back on its own.
    failing.store(false, Ordering::SeqCst);
    for service in services {
        eventually(Duration::from_secs(5), "SERVING again", || async {
            (health(&channel, service).await == ServingStatus::Serving).then_some(())
        })
        .await;
    }
    client.create(spec("project/p", &[])).await.expect("commits again");
    node.stop().await.unwrap();
}

fn region<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    status["regions"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["region"] == name))
        .unwrap_or_else(|| panic!("no region {name} in {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cascade_status_shows_a_frozen_region_as_unreachable() {
    let cluster = ProcCluster::new(&["eu-west", "us-east", "ap-south"], |_| "tick_ms = 50".into());
    let eu = cluster.endpoint("eu-west");
    let client = cluster.client("eu-west").await;
    client
        .batch_create(vec![spec_in("eu-west/project/p", &[])])
        .await
        .expect("created");

    let (code, status) = eventually(Duration::from_secs(20), "every region reachable and linked", || async {
        let (code, status) = cascade_status(&eu).await;
        let linked = ["us-east", "ap-south"]
            .iter()
            .all(|r| region(&status, r)["link_connected"] == true);
        (code == 0 && linked).then_some((code, status))
    })
    .await;
    assert_eq!(code, 0);
    assert_eq!(status["answered_by"], "eu-west");
    assert_eq!(region(&status, "eu-west")["figures"]["resources"]["active"], 1);
    assert_eq!(region(&status, "us-east")["address"], cluster.endpoint("us-east"));

    // A probe's view of the same node, through its own config file.
    let probe = tokio::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["health", "--service", "cascade.v1.Resources", "--config"])
        .arg(cluster.config("eu-west"))
        .output()
        .await
        .expect("cascade health runs");
    assert!(probe.status.success(), "{probe:?}");
    assert_eq!(String::from_utf8_lossy(&probe.stdout).trim(), "SERVING");

    cluster.freeze("ap-south");
    // A frozen node does not answer its probe.
    let frozen_probe = tokio::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["health", "--config"])
        .arg(cluster.config("ap-south"))
        .output()
        .await
        .expect("cascade health runs");
    assert_eq!(frozen_probe.status.code(), Some(1), "{frozen_probe:?}");
    // (A status is reused for a second: poll until it is a fresh one.)
    let (code, status) = eventually(Duration::from_secs(15), "ap-south listed unreachable", || async {
        let (code, status) = cascade_status(&eu).await;
        (region(&status, "ap-south")["reachable"] == false).then_some((code, status))
    })
    .await;
    cluster.thaw("ap-south");
    assert_eq!(code, 1, "a region is unreachable: {status}");
    let frozen = region(&status, "ap-south");
    assert_eq!(frozen["reachable"], false, "{status}");
    assert!(frozen["error"].as_str().is_some_and(|e| !e.is_empty()), "{status}");
    assert!(frozen["figures"].is_null(), "{status}");
    assert_eq!(region(&status, "us-east")["reachable"], true, "{status}");
    assert_eq!(region(&status, "eu-west")["reachable"], true, "{status}");

    // Thawed, it answers again; the text form has a row per region.
    let text = eventually(Duration::from_secs(20), "ap-south to answer again", || async {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
            .args(["--server", &eu, "status"])
            .output()
            .await
            .expect("runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success()).then_some(text)
    })
    .await;
    assert!(text.contains("REACHABLE") && !text.contains("unreachable"), "{text}");
    for r in ["eu-west", "us-east", "ap-south"] {
        assert!(text.lines().any(|l| l.starts_with(r)), "no row for {r}:\n{text}");
    }
}

/// `cascade demo` prints where each region's metrics are, and a scrape
/// there shows a cascade: what its README tour promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_prints_its_metrics_addresses_and_a_scrape_shows_a_cascade() {
    let demo = support::demo::Demo::start(true);
    let endpoint = demo.endpoint("eu-west").to_owned();
    let metrics = demo.metrics("eu-west");

    let before = scrape(metrics).await;
    assert_eq!(sample(&before, "cascade_deletions_accepted_total"), 0.0);
    let active_before = sample(&before, r#"cascade_resources{state="active"}"#);
    assert!(active_before > 0.0, "the demo's eu-west resources");

    // The demo requires authentication: the administrator it printed.
    let client = cascade_client::Client::connect(&endpoint)
        .await
        .expect("connects")
        .with_token(&demo.admin_token)
        .expect("a token");
    let op = delete_and_wait(&client, "eu-west/network/net1", true).await;
    assert!(op.done);
    let after_cascade = scrape(metrics).await;
    assert_eq!(sample(&after_cascade, "cascade_deletions_accepted_total"), 1.0);
    assert!(sample(&after_cascade, r#"cascade_deletions_finished_total{outcome="purged"}"#) >= 1.0);
    assert!(sample(&after_cascade, r#"cascade_resources{state="active"}"#) < active_before);

    let status = demo.terminate();
    assert!(status.success(), "the demo exited {status}");
}
