//! `cascade serve` processes for the tests that kill, freeze or restart a
//! node as an operator's machine would: one process, free ports below the
//! ephemeral range, and a cluster of one process per region.

use cascade_client::Client;

/// A `cascade serve` child process; dropping it SIGKILLs it (no chance to
/// flush or finish: the crash tests rely on that).
pub struct ServerProcess {
    child: std::process::Child,
    /// The address it printed on its first line.
    pub endpoint: String,
}

impl ServerProcess {
    /// The process id, for signals (`freeze`, `thaw`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Sends a signal with `kill(1)` (no libc binding needed).
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill(1) runs");
    assert!(status.success(), "kill {signal} {pid}: {status}");
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cascade serve --config <config>` and waits for its
/// `listening on ADDR` line. The server logs at `error`; set
/// `TEST_CASCADE_LOG` (e.g. `info`) to see more.
pub fn spawn_server(config: &std::path::Path) -> ServerProcess {
    spawn_server_with_env(config, &[])
}

/// [`spawn_server`] with more variables in the server's environment.
pub fn spawn_server_with_env(config: &std::path::Path, env: &[(&str, &str)]) -> ServerProcess {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["serve", "--config"])
        .arg(config)
        .env(
            "CASCADE_LOG",
            std::env::var("TEST_CASCADE_LOG").unwrap_or_else(|_| "error".into()),
        )
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("cascade serve starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    let mut reader = BufReader::new(stdout);
    reader.read_line(&mut line).expect("first line");
    // The rest is drained, not dropped: a server that prints another line
    // (`console on …` with `[console]`) would die of EPIPE otherwise.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    ServerProcess {
        child,
        endpoint: format!("http://{addr}"),
    }
}

/// Loopback ports for server processes a test starts, which must know
/// each other's addresses before any of them binds.
///
/// They come from below the kernel's ephemeral range (`ip_local_port_range`,
/// 32768 and up on Linux), which is where every `127.0.0.1:0` listener of
/// the in-process tests running beside this one, and every outgoing
/// connection, gets its port. A port from that range, bound to check and
/// released (as this did before), is one such a listener can be given
/// too, and so is the port of a server the test killed. Once, under CI's
/// load, a forwarded call "to the killed owner" was answered
/// (`an_owner_frozen_then_killed_mid_call_is_unavailable_for_forwarded_calls`
/// got a resource back): the likely cause is that a node of another test
/// in the same binary, also named us-east and holding the same names,
/// started on `127.0.0.1:0` and was given the killed owner's port, and the
/// channel's reconnect reached it. Below the ephemeral range that cannot
/// happen. Each test process starts at its own offset and hands a port out
/// once.
pub fn free_ports(n: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000; // below 32768
    let offset = std::process::id().wrapping_mul(97) % SPAN;
    let mut ports = Vec::with_capacity(n);
    for _ in 0..SPAN {
        if ports.len() == n {
            break;
        }
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(FIRST + (offset + k) % SPAN).expect("below 32768");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), n, "no free port below the ephemeral range");
    ports
}

/// One config file per region, each naming the others as peers. `deletion`
/// is the `[deletion]` table of the given region (others get `tick_ms = 50`).
pub struct ProcCluster {
    pub dir: tempfile::TempDir,
    pub regions: Vec<(String, u16)>,
    pub servers: std::collections::BTreeMap<String, ServerProcess>,
}

impl ProcCluster {
    pub fn new(regions: &[&str], deletion: impl Fn(&str) -> String) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports = free_ports(regions.len());
        let regions: Vec<(String, u16)> = regions.iter().map(|r| r.to_string()).zip(ports).collect();
        for (region, port) in &regions {
            let mut text = format!(
                "region = \"{region}\"\nlisten = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n\n[auth]\nmode = \"none\"\n\n[peers]\n",
                dir.path().join(region).display()
            );
            for (peer, peer_port) in regions.iter().filter(|(p, _)| p != region) {
                text += &format!("{peer} = \"http://127.0.0.1:{peer_port}\"\n");
            }
            text += &format!("\n[deletion]\n{}\n", deletion(region));
            std::fs::write(dir.path().join(format!("{region}.toml")), text).unwrap();
        }
        let mut cluster = Self {
            dir,
            regions,
            servers: std::collections::BTreeMap::new(),
        };
        for (region, _) in cluster.regions.clone() {
            cluster.start(&region);
        }
        cluster
    }

    pub fn config(&self, region: &str) -> std::path::PathBuf {
        self.dir.path().join(format!("{region}.toml"))
    }

    pub fn start(&mut self, region: &str) {
        self.start_with_env(region, &[]);
    }

    /// Starts a region's server with more variables in its environment.
    pub fn start_with_env(&mut self, region: &str, env: &[(&str, &str)]) {
        let server = spawn_server_with_env(&self.config(region), env);
        self.servers.insert(region.to_owned(), server);
    }

    /// SIGKILL: no flush, no graceful anything.
    pub fn kill(&mut self, region: &str) {
        drop(self.take(region));
    }

    /// The running server of a region, to be killed elsewhere (by dropping).
    pub fn take(&mut self, region: &str) -> ServerProcess {
        self.servers.remove(region).expect("running")
    }

    /// SIGSTOP: the process keeps its sockets (connections stay open, the
    /// kernel still accepts new ones) but answers nothing.
    pub fn freeze(&self, region: &str) {
        signal(self.servers.get(region).expect("running").pid(), "-STOP");
    }

    /// SIGCONT after [`ProcCluster::freeze`].
    pub fn thaw(&self, region: &str) {
        signal(self.servers.get(region).expect("running").pid(), "-CONT");
    }

    pub fn endpoint(&self, region: &str) -> String {
        let port = self.regions.iter().find(|(r, _)| r == region).unwrap().1;
        format!("http://127.0.0.1:{port}")
    }

    pub fn endpoints(&self) -> Vec<(String, String)> {
        self.regions
            .iter()
            .map(|(r, _)| (r.clone(), self.endpoint(r)))
            .collect()
    }

    pub async fn client(&self, region: &str) -> Client {
        Client::connect(&self.endpoint(region)).await.expect("client connects")
    }
}
