//! Shared helpers of the integration tests: real nodes on 127.0.0.1:0,
//! clients, resource specs, and polling with a deadline.

#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::{Client, ClientError};
use cascade_core::{RegionId, Schema};
use cascade_node::{NodeSettings, RunningNode};
use cascade_proto::v1;
use tokio::net::TcpListener;

pub const REGION: &str = "eu-west";

/// A node serving on a free loopback port, with its data directory.
pub struct TestNode {
    pub node: RunningNode,
    pub client: Client,
    /// Kept so the directory lives as long as the node.
    pub dir: tempfile::TempDir,
}

pub async fn start_node() -> TestNode {
    start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |_| {}).await
}

pub async fn start_node_with(schema: &str, tweak: impl FnOnce(&mut NodeSettings)) -> TestNode {
    let dir = tempfile::tempdir().expect("temp dir");
    let schema = Schema::from_toml(schema).expect("test schema");
    let mut settings = NodeSettings::new(
        RegionId::parse(REGION).unwrap(),
        Arc::new(schema),
        Some(dir.path().to_owned()),
    );
    settings.tick = Duration::from_millis(50);
    tweak(&mut settings);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let node = RunningNode::start(settings, listener).await.expect("node starts");
    let client = Client::connect(&node.endpoint()).await.expect("client connects");
    TestNode { node, client, dir }
}

/// `name` is `kind/id` in the test region; refs are `(field, [kind/id…])`.
pub fn spec(name: &str, refs: &[(&str, &[&str])]) -> v1::ResourceSpec {
    v1::ResourceSpec {
        name: full(name),
        attributes: Default::default(),
        refs: refs
            .iter()
            .map(|(field, targets)| v1::ReferenceField {
                field: field.to_string(),
                targets: targets
                    .iter()
                    .map(|t| v1::ObjectRef {
                        name: full(t),
                        ..Default::default()
                    })
                    .collect(),
            })
            .collect(),
        finalizers: Vec::new(),
    }
}

pub fn full(name: &str) -> String {
    if name.matches('/').count() == 2 {
        name.to_owned()
    } else {
        format!("{REGION}/{name}")
    }
}

pub fn delete_req(name: &str, cascade: bool) -> v1::DeleteRequest {
    v1::DeleteRequest {
        name: full(name),
        cascade,
        requested_by: "test".into(),
        ..Default::default()
    }
}

pub fn code(e: &ClientError) -> Option<tonic::Code> {
    e.code()
}

/// Polls `check` until it returns Some, or panics with `what` after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `name` answers NOT_FOUND.
pub async fn wait_gone(client: &Client, name: &str) {
    let name = full(name);
    eventually(Duration::from_secs(30), &format!("{name} to be purged"), || async {
        match client.get(&name).await {
            Err(e) if e.code() == Some(tonic::Code::NotFound) => Some(()),
            _ => None,
        }
    })
    .await
}

/// Waits until the operation is done and returns it with its outcomes.
pub async fn wait_operation(client: &Client, id: &str) -> v1::Operation {
    eventually(
        Duration::from_secs(60),
        &format!("operation {id} to finish"),
        || async {
            let op = client.get_operation(id, 1000).await.ok()?;
            op.done.then_some(op)
        },
    )
    .await
}

pub fn state(r: &v1::Resource) -> v1::ResourceState {
    v1::ResourceState::try_from(r.state).unwrap_or(v1::ResourceState::Unspecified)
}

pub fn targets<'a>(r: &'a v1::Resource, field: &str) -> Vec<&'a str> {
    r.refs
        .iter()
        .filter(|f| f.field == field)
        .flat_map(|f| f.targets.iter().map(|t| t.name.as_str()))
        .collect()
}

/// Several region nodes on loopback that know each other as peers.
pub struct Cluster {
    pub nodes: Vec<(String, TestNode)>,
}

impl Cluster {
    pub fn client(&self, region: &str) -> &Client {
        &self.node(region).client
    }

    pub fn node(&self, region: &str) -> &TestNode {
        &self
            .nodes
            .iter()
            .find(|(r, _)| r == region)
            .unwrap_or_else(|| panic!("no region {region}"))
            .1
    }
}

/// Starts one node per region, each with the others as peers. Listeners are
/// bound first so every node knows every address before any starts.
pub async fn start_cluster(regions: &[&str]) -> Cluster {
    start_cluster_with(regions, |_| {}).await
}

pub async fn start_cluster_with(regions: &[&str], tweak: impl Fn(&mut NodeSettings)) -> Cluster {
    let mut listeners = Vec::new();
    for _ in regions {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.expect("bind"));
    }
    let addrs: Vec<String> = listeners
        .iter()
        .map(|l| format!("http://{}", l.local_addr().unwrap()))
        .collect();
    let mut nodes = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let dir = tempfile::tempdir().expect("temp dir");
        let schema = Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).unwrap();
        let mut settings =
            NodeSettings::new(RegionId::parse(regions[i]).unwrap(), Arc::new(schema), Some(dir.path().to_owned()));
        settings.tick = Duration::from_millis(50);
        settings.check_interval = Duration::from_millis(500);
        for (j, region) in regions.iter().enumerate() {
            if j != i {
                settings.peers.insert(RegionId::parse(region).unwrap(), addrs[j].clone());
            }
        }
        tweak(&mut settings);
        let node = RunningNode::start(settings, listener).await.expect("node starts");
        let client = Client::connect(&node.endpoint()).await.expect("client connects");
        nodes.push((regions[i].to_owned(), TestNode { node, client, dir }));
    }
    Cluster { nodes }
}

/// A spec with full names (`{region}/{kind}/{id}`) everywhere.
pub fn spec_in(name: &str, refs: &[(&str, &[&str])]) -> v1::ResourceSpec {
    spec(name, refs)
}
