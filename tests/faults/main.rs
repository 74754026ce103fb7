//! Faults that must stay local: links between regions that heal and tell
//! the truth through a real fault-injecting proxy (`support::fault_proxy`:
//! a TLS tarpit, a silent partition, a throttled link), creates a client
//! can retry through cut forwards and connection resets, explain and
//! status within their deadline while a region is in trouble, a full
//! disk that heals without a restart, a writer that fails at every
//! start, restarted with backoff, a failed flush that takes back a
//! commit a peer link relied on, and flushes in flight while the writer
//! goes on (one that fails; a writer restarted mid-flight), and a node
//! stopped and started again that leaves no writer thread behind.
//!
//! One test binary: most of these tests wait on the clock (a 25 s tarpit,
//! a minute of resets, deadlines), so they share the test threads with
//! each other instead of running one binary after the other.

#[path = "../support/mod.rs"]
mod support;

mod disk_full;
mod explain_deadline;
mod flights;
mod links_heal;
mod retriable_creates;
mod taken_back;
mod writer_restarts;
#[cfg(target_os = "linux")] // /proc/self/task
mod writer_thread;

use std::sync::Arc;
use std::time::Duration;

use cascade_client::Client;
use cascade_core::{RegionId, Schema};
use cascade_node::store::Store;
use cascade_node::{NodeEnv, NodeSettings, RunningNode};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// The node's gRPC health for its Resources service (None: no answer).
async fn health(channel: &tonic::transport::Channel) -> Option<ServingStatus> {
    let answer = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: "cascade.v1.Resources".to_owned(),
        })
        .await
        .ok()?;
    ServingStatus::try_from(answer.into_inner().status).ok()
}

/// A gRPC channel to `endpoint`, for its health.
async fn channel_to(endpoint: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .expect("an endpoint's address")
        .connect()
        .await
        .expect("the node accepts a connection")
}

/// Settings of a node of `support::REGION` on the example schema that
/// ticks every 20 ms, so that a test's cascade moves in steps it can cut.
fn ticking_settings() -> NodeSettings {
    let mut settings = NodeSettings::new(
        RegionId::parse(support::REGION).expect("the tests' region"),
        Arc::new(Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).expect("the example schema")),
        None,
    );
    settings.tick = Duration::from_millis(20);
    settings
}

/// [`start_on_store`], with a client of the node and a channel for its
/// health.
async fn serve_on_store(
    settings: NodeSettings,
    store: Arc<dyn Store>,
) -> (RunningNode, Client, tonic::transport::Channel) {
    let node = start_on_store(settings, store).await;
    let client = Client::connect(&node.endpoint()).await.expect("a client connects");
    let channel = channel_to(&node.endpoint()).await;
    (node, client, channel)
}

/// A node in this process on `store` (a wrapper that misbehaves on cue),
/// serving on a free port.
async fn start_on_store(settings: NodeSettings, store: Arc<dyn Store>) -> RunningNode {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    RunningNode::start_with(
        settings,
        NodeEnv {
            store: Some(store),
            ..NodeEnv::default()
        },
        listener,
    )
    .await
    .expect("node starts")
}

/// Creates fresh projects until one succeeds, within `limit`: what a
/// client sees of a node that healed.
async fn a_create_succeeds(client: &Client, limit: Duration, what: &str) {
    let mut n = 0;
    support::eventually(limit, what, || {
        n += 1;
        let client = client.clone();
        async move {
            client
                .create(support::spec(&format!("project/after{n}"), &[]))
                .await
                .ok()
        }
    })
    .await;
}
