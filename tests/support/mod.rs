//! Shared helpers of the integration tests: real nodes on 127.0.0.1:0,
//! clients, resource specs, and polling with a deadline.

// Test code, not a node: poll deadlines and elapsed times are real time,
// and made-up ids need no IdSource (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Progress and results go to the terminal (`--nocapture`).
#![allow(clippy::print_stdout, clippy::print_stderr)]
#![allow(dead_code)]

pub mod demo;
pub mod fault_proxy;
pub mod ha;
mod operating;
mod process;

// Not every test binary uses them (this module is compiled into each).
#[allow(unused_imports)]
pub use operating::{cascade_status, scrape};
#[allow(unused_imports)]
pub use process::{free_ports, spawn_server, ProcCluster, ServerProcess};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::{Client, ClientError, ClientTls};
use cascade_core::{RegionId, Schema};
use cascade_node::{NodeSettings, RunningNode};
use cascade_proto::v1;
use cascade_proto::v1::peer_client::PeerClient;
use cascade_tls::DevPki;
use fault_proxy::FaultProxy;
use tokio::net::TcpListener;
use tonic::transport::Channel;

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

/// Deletes `name` through `client` and waits until its operation is done.
pub async fn delete_and_wait(client: &Client, name: &str, cascade: bool) -> v1::Operation {
    let op = client
        .delete(delete_req(name, cascade))
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"))
        .operation
        .unwrap_or_else(|| panic!("delete {name}: no operation"));
    wait_operation(client, &op.id).await
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
    /// Each region's settings, so a stopped node restarts as itself.
    settings: Vec<(String, NodeSettings)>,
    /// Stopped nodes: their address and data directory, kept for a restart.
    stopped: Vec<(String, SocketAddr, tempfile::TempDir)>,
    /// How clients reach the nodes (None: plain text).
    pub client_tls: Option<ClientTls>,
}

impl Cluster {
    /// `(region, endpoint)` of every running node, for the checker.
    pub fn endpoints(&self) -> Vec<(String, String)> {
        self.nodes.iter().map(|(r, n)| (r.clone(), n.node.endpoint())).collect()
    }

    /// Gracefully stops a region's node, keeping its data directory and
    /// address for [`Cluster::restart`].
    pub async fn stop(&mut self, region: &str) {
        let i = self
            .nodes
            .iter()
            .position(|(r, _)| r == region)
            .unwrap_or_else(|| panic!("no running region {region}"));
        let (region, test_node) = self.nodes.remove(i);
        let TestNode { node, client, dir } = test_node;
        drop(client);
        let addr = node.addr;
        node.stop().await.expect("node stops cleanly");
        self.stopped.push((region, addr, dir));
    }

    /// Starts a stopped region's node again on the same address and data directory.
    pub async fn restart(&mut self, region: &str) {
        self.restart_with(region, |_| {}).await;
    }

    /// [`Cluster::restart`] with settings changed by `tweak` (kept): an upgrade, say.
    pub async fn restart_with(&mut self, region: &str, tweak: impl FnOnce(&mut NodeSettings)) {
        let i = self
            .stopped
            .iter()
            .position(|(r, _, _)| r == region)
            .unwrap_or_else(|| panic!("region {region} is not stopped"));
        let (region, addr, dir) = self.stopped.remove(i);
        let listener = eventually(Duration::from_secs(10), &format!("{addr} to be free again"), || async {
            TcpListener::bind(addr).await.ok()
        })
        .await;
        let saved = self.settings.iter_mut().find(|(r, _)| *r == region);
        let saved = &mut saved.expect("settings of the region").1;
        tweak(saved);
        let settings = saved.clone();
        let node = RunningNode::start(settings, listener).await.expect("node restarts");
        let client = Client::connect_with(&node.endpoint(), self.client_tls.as_ref())
            .await
            .expect("client connects");
        self.nodes.push((region, TestNode { node, client, dir }));
    }

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

/// `cascade_peer_events_received_total` of `region`'s link to `peer`, by
/// type (the node must serve its metrics).
pub async fn peer_events_received(c: &Cluster, region: &str, peer: &str, event_type: &str) -> f64 {
    let metrics = scrape(c.node(region).node.metrics_addr().expect("metrics served")).await;
    metrics
        .get(&format!(
            "cascade_peer_events_received_total{{peer=\"{peer}\",type=\"{event_type}\"}}"
        ))
        .copied()
        .unwrap_or(0.0)
}

/// Starts one node per region, each with the others as peers. Listeners are
/// bound first so every node knows every address before any starts.
pub async fn start_cluster(regions: &[&str]) -> Cluster {
    start_cluster_with(regions, |_| {}).await
}

pub async fn start_cluster_with(regions: &[&str], tweak: impl Fn(&mut NodeSettings)) -> Cluster {
    start_cluster_on(regions, None, tweak, |_| Default::default()).await
}

/// A cluster whose nodes run on the given stores (region → store) instead
/// of an engine on disk. A restarted node opens its data directory's
/// engine, not the store.
pub async fn start_cluster_on_stores(
    regions: &[&str],
    tweak: impl Fn(&mut NodeSettings),
    store: impl Fn(&str) -> Option<Arc<dyn cascade_node::store::Store>>,
) -> Cluster {
    start_cluster_on(regions, None, tweak, |region| cascade_node::NodeEnv {
        store: store(region),
        ..Default::default()
    })
    .await
}

/// A cluster whose nodes run in surroundings of the test's (region →
/// [`cascade_node::NodeEnv`]: a store, a test authorizer). A restarted
/// node gets the default surroundings.
pub async fn start_cluster_with_env(
    regions: &[&str],
    tweak: impl Fn(&mut NodeSettings),
    env: impl Fn(&str) -> cascade_node::NodeEnv,
) -> Cluster {
    start_cluster_on(regions, None, tweak, env).await
}

/// A cluster with mutual TLS: each node has its region's certificate of `pki`.
pub async fn start_cluster_tls(regions: &[&str], pki: &DevPki) -> Cluster {
    start_cluster_on(regions, Some(pki), |_| {}, |_| Default::default()).await
}

/// A cluster with mutual TLS and settings of its own.
pub async fn start_cluster_tls_with(regions: &[&str], pki: &DevPki, tweak: impl Fn(&mut NodeSettings)) -> Cluster {
    start_cluster_on(regions, Some(pki), tweak, |_| Default::default()).await
}

async fn start_cluster_on(
    regions: &[&str],
    pki: Option<&DevPki>,
    tweak: impl Fn(&mut NodeSettings),
    env: impl Fn(&str) -> cascade_node::NodeEnv,
) -> Cluster {
    let listeners = bind_listeners(regions.len()).await;
    let scheme = if pki.is_some() { "https" } else { "http" };
    let addrs: Vec<String> = listeners
        .iter()
        .map(|l| format!("{scheme}://{}", l.local_addr().unwrap()))
        .collect();
    start_cluster_from(listeners, regions, pki, tweak, env, |_, j| addrs[j].clone()).await
}

async fn bind_listeners(n: usize) -> Vec<TcpListener> {
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.expect("bind"));
    }
    listeners
}

/// Starts region `i` on `listeners[i]`, dialling region `j` at
/// `peer_addr(i, j)`.
async fn start_cluster_from(
    listeners: Vec<TcpListener>,
    regions: &[&str],
    pki: Option<&DevPki>,
    tweak: impl Fn(&mut NodeSettings),
    env: impl Fn(&str) -> cascade_node::NodeEnv,
    peer_addr: impl Fn(usize, usize) -> String,
) -> Cluster {
    let client_tls = pki.map(DevPki::client);
    let mut nodes = Vec::new();
    let mut saved = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let dir = tempfile::tempdir().expect("temp dir");
        let schema = Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).unwrap();
        let mut settings = NodeSettings::new(
            RegionId::parse(regions[i]).unwrap(),
            Arc::new(schema),
            Some(dir.path().to_owned()),
        );
        settings.tick = Duration::from_millis(50);
        settings.check_interval = Duration::from_millis(500);
        for (j, region) in regions.iter().enumerate() {
            if j != i {
                settings
                    .peers
                    .insert(RegionId::parse(region).unwrap(), peer_addr(i, j).into());
            }
        }
        if let Some(pki) = pki {
            settings.tls = Some(pki.node_tls(regions[i]).expect("region certificate"));
        }
        tweak(&mut settings);
        saved.push((regions[i].to_owned(), settings.clone()));
        let node = RunningNode::start_with(settings, env(regions[i]), listener)
            .await
            .expect("node starts");
        let client = Client::connect_with(&node.endpoint(), client_tls.as_ref())
            .await
            .expect("client connects");
        nodes.push((regions[i].to_owned(), TestNode { node, client, dir }));
    }
    Cluster {
        nodes,
        settings: saved,
        stopped: Vec::new(),
        client_tls,
    }
}

/// A cluster in which every connection goes through a [`FaultProxy`]:
/// region X dials region Y through `peer_proxy(X, Y)` (one proxy per
/// ordered pair), and `client(X)` reaches X's node through
/// `client_proxy(X)`. `cluster.client(X)` still dials the node directly
/// (for reads a test checks with), and the checker reads the nodes
/// directly too. Plain text only.
pub struct ProxiedCluster {
    pub cluster: Cluster,
    peer_proxies: std::collections::BTreeMap<(String, String), FaultProxy>,
    client_proxies: std::collections::BTreeMap<String, FaultProxy>,
    clients: std::collections::BTreeMap<String, Client>,
}

impl ProxiedCluster {
    /// The proxy region `from` dials region `to` through.
    pub fn peer_proxy(&self, from: &str, to: &str) -> &FaultProxy {
        self.peer_proxies
            .get(&(from.to_owned(), to.to_owned()))
            .unwrap_or_else(|| panic!("no proxy from {from} to {to}"))
    }

    /// The proxy in front of `region`'s node for clients.
    pub fn client_proxy(&self, region: &str) -> &FaultProxy {
        self.client_proxies
            .get(region)
            .unwrap_or_else(|| panic!("no client proxy of {region}"))
    }

    /// A client of `region`'s node through its client proxy.
    pub fn client(&self, region: &str) -> &Client {
        self.clients
            .get(region)
            .unwrap_or_else(|| panic!("no client of {region}"))
    }

    /// Every proxy: the peers' (in region order), then the clients'.
    pub fn proxies(&self) -> impl Iterator<Item = &FaultProxy> {
        self.peer_proxies.values().chain(self.client_proxies.values())
    }
}

/// Starts one node per region (as [`start_cluster_with`]) with a
/// [`FaultProxy`] on every connection between them and in front of each
/// for clients (see [`ProxiedCluster`]). Every proxy starts in
/// [`fault_proxy::Fault::Pass`].
pub async fn start_cluster_behind_proxies(regions: &[&str], tweak: impl Fn(&mut NodeSettings)) -> ProxiedCluster {
    let listeners = bind_listeners(regions.len()).await;
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut peer_proxies = std::collections::BTreeMap::new();
    let mut peer_uris = std::collections::BTreeMap::new();
    for (i, from) in regions.iter().enumerate() {
        for (j, to) in regions.iter().enumerate() {
            if i != j {
                let proxy = FaultProxy::start(addrs[j]).await;
                peer_uris.insert((i, j), proxy.uri());
                peer_proxies.insert((from.to_string(), to.to_string()), proxy);
            }
        }
    }
    let cluster = start_cluster_from(
        listeners,
        regions,
        None,
        tweak,
        |_| Default::default(),
        |i, j| peer_uris[&(i, j)].clone(),
    )
    .await;
    let mut client_proxies = std::collections::BTreeMap::new();
    let mut clients = std::collections::BTreeMap::new();
    for (region, addr) in regions.iter().zip(&addrs) {
        let proxy = FaultProxy::start(*addr).await;
        let client = Client::connect(&proxy.uri())
            .await
            .expect("client connects through its proxy");
        clients.insert(region.to_string(), client);
        client_proxies.insert(region.to_string(), proxy);
    }
    ProxiedCluster {
        cluster,
        peer_proxies,
        client_proxies,
        clients,
    }
}

/// The names of a region's CREATING resources, from its dump.
pub fn creating(d: &v1::DumpResponse) -> Vec<String> {
    d.resources
        .iter()
        .filter(|r| state(r) == v1::ResourceState::Creating)
        .map(|r| r.name.clone())
        .collect()
}

/// A spec with full names (`{region}/{kind}/{id}`) everywhere.
pub fn spec_in(name: &str, refs: &[(&str, &[&str])]) -> v1::ResourceSpec {
    spec(name, refs)
}

/// A client presenting `region`'s certificate of `pki` (a region's identity).
pub fn as_region(pki: &DevPki, region: &str) -> ClientTls {
    pki.node_tls(region).expect("region certificate").as_client()
}

/// A Peer client over TLS as `tls`, reaching the node of `server_region`.
pub async fn peer_as(endpoint: &str, tls: &ClientTls, server_region: &str) -> PeerClient<Channel> {
    let channel = cascade_client::client::connect_channel(endpoint, Some(tls), Some(server_region))
        .await
        .expect("TLS connection");
    PeerClient::new(channel).max_decoding_message_size(cascade_proto::MAX_MESSAGE_BYTES)
}

/// A `Peer` client of a node (what other regions call), for peer reads and
/// dumps.
pub async fn peer_client(endpoint: &str) -> PeerClient<Channel> {
    PeerClient::connect(endpoint.to_owned())
        .await
        .expect("peer client connects")
        .max_decoding_message_size(cascade_proto::MAX_MESSAGE_BYTES)
}

/// One region's `Peer.Dump`.
pub async fn dump(endpoint: &str) -> Result<v1::DumpResponse, tonic::Status> {
    peer_client(endpoint)
        .await
        .dump(v1::DumpRequest {})
        .await
        .map(|r| r.into_inner())
}

/// Why a region is not quiescent yet (None when it is): queued releases,
/// unsettled creates, deletion work, remote deletions not yet applied, or
/// resources still CREATING or DELETING.
pub fn unquiet(d: &v1::DumpResponse) -> Option<String> {
    let busy: Vec<&str> = d
        .resources
        .iter()
        .filter(|r| matches!(state(r), v1::ResourceState::Creating | v1::ResourceState::Deleting))
        .map(|r| r.name.as_str())
        .collect();
    let quiet = d.pending_releases == 0
        && d.pending_attach == 0
        && d.queued_work == 0
        && d.remote_deletions.is_empty()
        && busy.is_empty();
    (!quiet).then(|| {
        format!(
            "{}: pending_releases={} pending_attach={} queued_work={} remote_deletions={} busy={busy:?}",
            d.region,
            d.pending_releases,
            d.pending_attach,
            d.queued_work,
            d.remote_deletions.len()
        )
    })
}

/// What the cluster's dumps say of each remote deletion a region still
/// keeps: the owner's resource by that name (its uid and state, or gone),
/// the owner's last revision and the keeper's cursor on the owner. So that
/// a quiescence wait that times out names why a tombstone stayed (a
/// PURGED not applied, a resync that re-created it) instead of a count.
pub fn remote_deletions_explained(dumps: &[v1::DumpResponse]) -> Vec<String> {
    let mut lines = Vec::new();
    for keeper in dumps {
        for deletion in &keeper.remote_deletions {
            let owner = dumps.iter().find(|d| {
                d.resources.iter().any(|r| r.name == deletion.name)
                    || deletion.name.starts_with(&format!("{}/", d.region))
            });
            let at_owner = owner
                .and_then(|o| o.resources.iter().find(|r| r.name == deletion.name))
                .map(|r| format!("uid={} state={:?}", r.uid, state(r)))
                .unwrap_or_else(|| "gone".into());
            let (owner_region, owner_revision) = owner.map_or(("?", 0), |o| (o.region.as_str(), o.last_revision));
            let cursor = keeper.cursors.get(owner_region).copied();
            lines.push(format!(
                "{} keeps {} uid={}: at its owner {owner_region}: {at_owner}, last_revision={owner_revision}; \
                 {}'s cursor on it={cursor:?}",
                keeper.region, deletion.name, deletion.uid, keeper.region
            ));
        }
    }
    lines
}

/// Waits until every region is quiescent (see [`unquiet`]).
pub async fn wait_quiescent_at(regions: &[(String, String)]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut why = Vec::new();
        let mut dumps = Vec::new();
        for (region, endpoint) in regions {
            match dump(endpoint).await {
                Ok(d) => {
                    why.extend(unquiet(&d));
                    dumps.push(d);
                }
                Err(e) => why.push(format!("{region}: dump failed: {e}")),
            }
        }
        if why.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            why.extend(remote_deletions_explained(&dumps));
            panic!("cluster not quiescent after 30s: {why:#?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn wait_quiescent(cluster: &Cluster) {
    wait_quiescent_at(&cluster.endpoints()).await
}

/// Runs the invariant checker over the regions (at quiescence) and asserts
/// it finds nothing. A checker that is not implemented yet is skipped with
/// a note. Violations are re-checked for a few seconds, so a message still
/// in flight (a release, a check) does not fail the test.
pub async fn assert_no_violations_at(regions: &[(String, String)]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match cascade_client::check::check_cluster(regions).await {
            Err(e) if e.to_string().contains("not implemented") => {
                eprintln!("invariant checker skipped: {e}");
                return;
            }
            Err(e) => panic!("invariant checker failed: {e}"),
            Ok(report) if report.violations.is_empty() => {
                assert_eq!(
                    report.regions.len(),
                    regions.len(),
                    "the checker read every region: {report:?}"
                );
                return;
            }
            Ok(report) => {
                assert!(
                    Instant::now() < deadline,
                    "invariant violations at quiescence: {:#?}",
                    report.violations
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn assert_no_violations(cluster: &Cluster) {
    assert_no_violations_at(&cluster.endpoints()).await
}

/// A codec that sends and receives message bytes as they are, for requests
/// the generated clients cannot make (undecodable, oversized).
#[derive(Clone, Copy, Default)]
pub struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(buf);
        Ok(Some(bytes::Buf::copy_to_bytes(buf, n).to_vec()))
    }
}

/// Calls `path` (e.g. `/cascade.v1.Resources/Get`) at `endpoint` with
/// `message` as the request's bytes, exactly (no size limit on this side).
pub async fn raw_call(endpoint: &str, path: &'static str, message: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let channel = Channel::from_shared(endpoint.to_owned())
        .expect("endpoint")
        .connect()
        .await
        .expect("raw channel connects");
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
    grpc.ready().await.expect("raw channel ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(message), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}
