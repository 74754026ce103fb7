//! Regions of several `cascade serve` processes over one real PostgreSQL
//! server (started by `cascade-testpg`, a database per region): start
//! them, ask which node writes, kill, freeze and thaw nodes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cascade_client::Client;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::{free_ports, spawn_server, ServerProcess};

/// The lease's time to live in these tests: short, so failovers are quick.
pub const TEST_LEASE_TTL: Duration = Duration::from_secs(2);

/// One region: its nodes' ports (in the order of its config files) and the
/// processes running now.
pub struct HaRegion {
    pub name: String,
    pub ports: Vec<u16>,
    pub running: BTreeMap<usize, ServerProcess>,
}

/// Regions of `nodes` processes each, every region a database of its own
/// on one PostgreSQL server, each node's config naming every node of the
/// other regions.
pub struct HaCluster {
    pub dir: tempfile::TempDir,
    pub regions: Vec<HaRegion>,
}

impl HaCluster {
    /// Writes the configs; starts nothing. `extra(region)` is appended to
    /// each of the region's configs (a `[deletion]` table, say).
    pub fn configure(
        pg: &'static cascade_testpg::TestServer,
        regions: &[&str],
        nodes: usize,
        extra: impl Fn(&str) -> String,
    ) -> Self {
        Self::configure_with_ttl(pg, regions, nodes, Some(TEST_LEASE_TTL), extra)
    }

    /// [`HaCluster::configure`] with the lease's time to live `ttl` (None:
    /// the node's default).
    pub fn configure_with_ttl(
        pg: &'static cascade_testpg::TestServer,
        regions: &[&str],
        nodes: usize,
        ttl: Option<Duration>,
        extra: impl Fn(&str) -> String,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports = free_ports(regions.len() * nodes);
        let regions: Vec<HaRegion> = regions
            .iter()
            .zip(ports.chunks(nodes))
            .map(|(name, ports)| HaRegion {
                name: name.to_string(),
                ports: ports.to_vec(),
                running: BTreeMap::new(),
            })
            .collect();
        let password_file = dir.path().join("pg-password");
        for region in &regions {
            let db = pg.fresh_database(&region.name);
            std::fs::write(&password_file, db.password()).unwrap();
            for (i, port) in region.ports.iter().enumerate() {
                let mut text = format!(
                    "region = \"{}\"\nlisten = \"127.0.0.1:{port}\"\n\n[auth]\nmode = \"none\"\n\n[storage]\nengine = \"postgres\"\n\
                     url = \"{}\"\npassword_file = \"{}\"\n\n[ha]\nnode_name = \"{}-{i}\"\n{}\n[peers]\n",
                    region.name,
                    db.url(),
                    password_file.display(),
                    region.name,
                    ttl.map_or_else(String::new, |t| format!("lease_ttl_ms = {}\n", t.as_millis())),
                );
                for peer in regions.iter().filter(|p| p.name != region.name) {
                    let addresses: Vec<String> =
                        peer.ports.iter().map(|p| format!("\"http://127.0.0.1:{p}\"")).collect();
                    text += &format!("{} = [{}]\n", peer.name, addresses.join(", "));
                }
                text += &format!("\n{}\n", extra(&region.name));
                std::fs::write(Self::config_path(dir.path(), &region.name, i), text).unwrap();
            }
        }
        Self { dir, regions }
    }

    fn config_path(dir: &std::path::Path, region: &str, node: usize) -> PathBuf {
        dir.join(format!("{region}-{node}.toml"))
    }

    pub fn config(&self, region: &str, node: usize) -> PathBuf {
        Self::config_path(self.dir.path(), region, node)
    }

    fn region(&self, region: &str) -> &HaRegion {
        self.regions
            .iter()
            .find(|r| r.name == region)
            .expect("a region of the cluster")
    }

    fn region_mut(&mut self, region: &str) -> &mut HaRegion {
        self.regions
            .iter_mut()
            .find(|r| r.name == region)
            .expect("a region of the cluster")
    }

    /// Starts every node of every region.
    pub fn start_all(&mut self) {
        let all: Vec<(String, usize)> = self
            .regions
            .iter()
            .flat_map(|r| (0..r.ports.len()).map(|i| (r.name.clone(), i)))
            .collect();
        for (region, i) in all {
            self.start(&region, i);
        }
    }

    pub fn start(&mut self, region: &str, node: usize) {
        let server = spawn_server(&self.config(region, node));
        self.region_mut(region).running.insert(node, server);
    }

    /// SIGKILL.
    pub fn kill(&mut self, region: &str, node: usize) {
        drop(self.region_mut(region).running.remove(&node).expect("running"));
    }

    pub fn pid(&self, region: &str, node: usize) -> u32 {
        self.region(region).running.get(&node).expect("running").pid()
    }

    pub fn endpoint(&self, region: &str, node: usize) -> String {
        format!("http://127.0.0.1:{}", self.region(region).ports[node])
    }

    /// The first node of each region, for the checker (any node forwards).
    pub fn endpoints(&self) -> Vec<(String, String)> {
        self.regions
            .iter()
            .map(|r| {
                let node = r.running.keys().next().copied().unwrap_or(0);
                (r.name.clone(), self.endpoint(&r.name, node))
            })
            .collect()
    }

    pub async fn client(&self, region: &str, node: usize) -> Client {
        Client::connect(&self.endpoint(region, node))
            .await
            .expect("client connects")
    }

    /// The nodes of `region` that say they are its writer now.
    pub async fn writers(&self, region: &str) -> Vec<usize> {
        let mut writers = Vec::new();
        for &i in self.region(region).running.keys() {
            if health(&self.endpoint(region, i), cascade_node::WRITER_HEALTH_SERVICE).await
                == Some(ServingStatus::Serving)
            {
                writers.push(i);
            }
        }
        writers
    }

    /// Waits until exactly one node of `region` writes and every other
    /// running node of it is a healthy standby (it knows the writer and
    /// reaches it), and says which one writes.
    pub async fn wait_writer(&self, region: &str, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            let writers = self.writers(region).await;
            if let [one] = writers.as_slice() {
                let mut ready = true;
                for &i in self.region(region).running.keys() {
                    ready &= health(&self.endpoint(region, i), "").await == Some(ServingStatus::Serving);
                }
                if ready {
                    return *one;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{region}: no single writer within {limit:?} (writers: {writers:?})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A node's gRPC health for `service` (None: it did not answer within a
/// second).
pub async fn health(endpoint: &str, service: &str) -> Option<ServingStatus> {
    let asked = async {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await
            .ok()?;
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .ok()?;
        ServingStatus::try_from(answer.into_inner().status).ok()
    };
    tokio::time::timeout(Duration::from_secs(1), asked).await.ok().flatten()
}
