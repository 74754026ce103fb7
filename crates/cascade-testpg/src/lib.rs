//! A real PostgreSQL for tests: one throwaway server per test binary,
//! started on first use, and a fresh database per test.
//!
//! Unit tests of the node crate and the integration tests in `tests/`
//! start PostgreSQL the same way, through [`fresh_database`]:
//!
//! - the binaries (`initdb`, `pg_ctl`, `psql`) come from `CASCADE_PG_BIN`,
//!   else from `PATH`, else from the highest `/usr/lib/postgresql/*/bin`
//!   (Debian keeps them off `PATH`);
//! - `initdb` runs in a temporary directory, as the `postgres` user when
//!   the tests run as root (initdb refuses root), and `pg_ctl start` serves
//!   it on a free port of 127.0.0.1 with its socket in that directory and
//!   without fsync (`fsync=off`: these are functional tests; a stopped
//!   server loses nothing, the OS keeps what was written, but commits stay
//!   synchronous: `synchronous_commit=off` would lose the last commits of a
//!   server stopped with `-m immediate`);
//! - TCP connections need a real password (scram-sha-256) for the role
//!   [`ROLE`], whose password is [`PASSWORD`], so a wrong password is
//!   refused as it would be in production; the harness itself talks to the
//!   server as the superuser over the socket;
//! - nothing is left behind: a watchdog process, started with the server
//!   in its own process group, stops the server and removes the directory
//!   as soon as the test binary is gone, even when it panicked or was
//!   killed (statics are never dropped);
//! - without PostgreSQL, [`server`] returns None after writing once per
//!   binary, straight to the process's stderr (libtest does not capture
//!   it), that the PostgreSQL tests were skipped and how to install it;
//!   with `CASCADE_TEST_PG_REQUIRED=1` (CI) a missing PostgreSQL panics
//!   instead, so CI never skips them silently.
//!
//! Fault tests that stop and restart PostgreSQL ([`TestServer::stop_server`],
//! [`TestServer::start_server`]) start a server of their own
//! ([`TestServer::start`]), so they do not stop it under the other tests
//! of their binary.

// A test harness: it reports a skipped suite on stderr by design, and its
// deadlines (waiting for a server) are real time.
#![allow(clippy::print_stderr, clippy::disallowed_methods)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// The directory of the PostgreSQL binaries to use, when set.
pub const BIN_ENV: &str = "CASCADE_PG_BIN";
/// Set to `1` (CI): a missing PostgreSQL fails the tests instead of skipping them.
pub const REQUIRED_ENV: &str = "CASCADE_TEST_PG_REQUIRED";
/// The role tests connect as over TCP.
pub const ROLE: &str = "cascade";
/// [`ROLE`]'s password (distinctive, so that a test can check that no
/// error or log line ever shows it).
pub const PASSWORD: &str = "cascade-test-pw-7Qx9";
/// The superuser the harness creates databases as, over the socket only.
const SUPERUSER: &str = "postgres";

/// A PostgreSQL server in a temporary directory, stopped and removed when
/// the test binary exits (or, for a server of one's own, when dropped).
#[derive(Debug)]
pub struct TestServer {
    bin: PathBuf,
    /// The temporary directory: `data/`, the socket and `log`.
    root: PathBuf,
    port: u16,
    /// Whether the server's processes run as the `postgres` user (the
    /// tests run as root).
    as_postgres: bool,
    databases: AtomicU64,
    /// Serialises stop and start.
    lifecycle: Mutex<()>,
}

/// A database of its own for one test, owned by [`ROLE`].
#[derive(Debug)]
pub struct TestDatabase {
    server: &'static TestServer,
    name: String,
}

static SHARED: OnceLock<Option<TestServer>> = OnceLock::new();

/// The binary's shared server, started on first use; None (after saying
/// so once on stderr) when PostgreSQL is not installed.
///
/// # Panics
/// When PostgreSQL is installed but does not start, or is missing while
/// [`REQUIRED_ENV`] is `1`.
pub fn server() -> Option<&'static TestServer> {
    SHARED
        .get_or_init(|| match find_binaries() {
            Some(bin) => Some(TestServer::start_with(bin).unwrap_or_else(|e| panic!("PostgreSQL: {e}"))),
            None => {
                let binary = binary_name();
                if std::env::var(REQUIRED_ENV).is_ok_and(|v| v == "1") {
                    panic!(
                        "the PostgreSQL tests ({binary}) need initdb and pg_ctl, and {REQUIRED_ENV}=1: \
                         apt-get install postgresql (Debian), or set {BIN_ENV}"
                    );
                }
                // Straight to the process's stderr: libtest captures
                // `eprintln!` of a passing test, and this must be seen.
                let line = format!(
                    "skipped: the PostgreSQL tests ({binary}) need initdb and pg_ctl: \
                     apt-get install postgresql (Debian), or set {BIN_ENV}\n"
                );
                let _ = std::io::stderr().write_all(line.as_bytes());
                None
            }
        })
        .as_ref()
}

/// A fresh database on the shared server, named after `hint` (a test's
/// name); None without PostgreSQL (the test returns early and passes).
pub fn fresh_database(hint: &str) -> Option<TestDatabase> {
    server().map(|s| s.fresh_database(hint))
}

impl TestServer {
    /// A server of one's own (for tests that stop and restart it), kept
    /// until the test binary exits (the watchdog removes it then); None
    /// without PostgreSQL, as [`server`].
    ///
    /// # Panics
    /// When PostgreSQL is installed but does not start.
    pub fn start() -> Option<&'static TestServer> {
        // Through `server()` so a missing PostgreSQL is reported (or
        // required) the same way.
        server()?;
        let started = TestServer::start_with(find_binaries()?).unwrap_or_else(|e| panic!("PostgreSQL: {e}"));
        Some(Box::leak(Box::new(started)))
    }

    fn start_with(bin: PathBuf) -> Result<TestServer, String> {
        let root = temp_root()?;
        let as_postgres = running_as_root();
        let mut server = TestServer {
            bin,
            root,
            port: 0,
            as_postgres,
            databases: AtomicU64::new(0),
            lifecycle: Mutex::new(()),
        };
        if as_postgres {
            run(Command::new("chown").arg(format!("{SUPERUSER}:")).arg(&server.root))?;
        }
        server.start_watchdog()?;
        run(server
            .pg("initdb")
            .arg("-D")
            .arg(server.data())
            .args(["-U", SUPERUSER, "--auth-local=trust", "--auth-host=scram-sha-256"])
            .args(["-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"]))?;
        // A free port: bound then let go (another process may take it in
        // between; the start is then retried on another).
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port()?;
            match server.start_server_result() {
                Ok(()) => {
                    server.superuser_sql(
                        "postgres",
                        &format!("CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{PASSWORD}'"),
                    )?;
                    return Ok(server);
                }
                Err(e) => last = e,
            }
        }
        Err(format!("could not start on a free port: {last}"))
    }

    /// The TCP port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A fresh database, named after `hint`.
    pub fn fresh_database(&'static self, hint: &str) -> TestDatabase {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let clean: String = hint
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let name = format!("t_{clean}_{n}");
        self.superuser_sql("postgres", &format!("CREATE DATABASE {name} OWNER {ROLE}"))
            .unwrap_or_else(|e| panic!("PostgreSQL: {e}"));
        TestDatabase { server: self, name }
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`: a crash, as
    /// a failover test wants); its data stays for [`Self::start_server`].
    pub fn stop_server(&self) {
        let _one = self.lifecycle.lock().unwrap_or_else(PoisonError::into_inner);
        run(self
            .pg("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"]))
        .unwrap_or_else(|e| panic!("PostgreSQL: {e}"));
    }

    /// Starts the server again, on the same port with the same data.
    pub fn start_server(&self) {
        let _one = self.lifecycle.lock().unwrap_or_else(PoisonError::into_inner);
        self.start_server_result().unwrap_or_else(|e| panic!("PostgreSQL: {e}"));
    }

    fn start_server_result(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
             -c full_page_writes=off -c max_connections=300",
            self.port,
            self.root.display()
        );
        run(self
            .pg("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.root.join("log"))
            .args(["-w", "-t", "60", "-o", &options, "start"]))
    }

    /// Runs `sql` as the superuser in `database` (over the socket), with
    /// psql; its output (unaligned, tuples only) or its error.
    pub fn superuser_sql(&self, database: &str, sql: &str) -> Result<String, String> {
        let output = Command::new(self.bin.join("psql"))
            .arg("-h")
            .arg(&self.root)
            .args(["-p", &self.port.to_string(), "-U", SUPERUSER, "-d", database])
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        } else {
            Err(format!(
                "psql {sql:?}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// A PostgreSQL program, as the `postgres` user when running as root.
    fn pg(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", SUPERUSER, "--"]).arg(path);
            c
        } else {
            Command::new(path)
        };
        command.stdin(Stdio::null());
        command
    }

    /// A process of its own group (a Ctrl-C to the tests does not reach
    /// it) that waits for this test binary to be gone, then stops the
    /// server and removes its directory.
    fn start_watchdog(&self) -> Result<(), String> {
        use std::os::unix::process::CommandExt;
        let script = r#"
            while kill -0 "$1" 2>/dev/null; do sleep 0.2; done
            if [ "$4" = root ]; then runuser -u postgres -- "$2" -D "$3/data" -m immediate stop
            else "$2" -D "$3/data" -m immediate stop; fi
            rm -rf "$3"
        "#;
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("cascade-testpg-watchdog")
            .arg(std::process::id().to_string())
            .arg(self.bin.join("pg_ctl"))
            .arg(&self.root)
            .arg(if self.as_postgres { "root" } else { "user" })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map(drop)
            .map_err(|e| format!("cannot start the watchdog: {e}"))
    }
}

impl Drop for TestServer {
    /// Only a server whose start failed is dropped (the others live until
    /// the binary exits, and the watchdog removes them): stop what may run
    /// and remove its directory now.
    fn drop(&mut self) {
        let _ = self
            .pg("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl TestDatabase {
    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A URL to it as [`ROLE`] over TCP, without the password.
    pub fn url(&self) -> String {
        format!("postgres://{ROLE}@127.0.0.1:{}/{}", self.server.port, self.name)
    }

    /// [`ROLE`]'s password.
    pub fn password(&self) -> &'static str {
        PASSWORD
    }

    /// The server it is on (to stop and start it, or for its port).
    pub fn server(&self) -> &'static TestServer {
        self.server
    }

    /// Runs `sql` in this database as the superuser (to tamper with what a
    /// node wrote, or to look at it); its output or its error.
    pub fn superuser_sql(&self, sql: &str) -> Result<String, String> {
        self.server.superuser_sql(&self.name, sql)
    }
}

/// Where `initdb`, `pg_ctl` and `psql` are (see the crate's doc).
fn find_binaries() -> Option<PathBuf> {
    let complete = |dir: &Path| ["initdb", "pg_ctl", "psql"].iter().all(|p| dir.join(p).is_file());
    if let Some(dir) = std::env::var_os(BIN_ENV) {
        let dir = PathBuf::from(dir);
        return complete(&dir).then_some(dir);
    }
    // On PATH, maybe as links into the versioned directory (which has
    // psql too), so follow them.
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path).find_map(|dir| {
            let initdb = std::fs::canonicalize(dir.join("initdb")).ok()?;
            let dir = initdb.parent()?.to_owned();
            complete(&dir).then_some(dir)
        })
    });
    on_path.or_else(|| {
        let versions = std::fs::read_dir("/usr/lib/postgresql").ok()?;
        versions
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let version: u32 = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                complete(&bin).then_some((version, bin))
            })
            .max_by_key(|(version, _)| *version)
            .map(|(_, bin)| bin)
    })
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn temp_root() -> Result<PathBuf, String> {
    static N: AtomicU64 = AtomicU64::new(0);
    let root = std::env::temp_dir().join(format!(
        "cascade-pg-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    Ok(root)
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The test binary's name without cargo's hash (`cascade_node`, `ha`).
fn binary_name() -> String {
    let exe = std::env::current_exe().ok();
    let name = exe
        .as_deref()
        .and_then(Path::file_stem)
        .and_then(|s| s.to_str())
        .unwrap_or("tests");
    match name.rsplit_once('-') {
        Some((base, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => base.to_owned(),
        _ => name.to_owned(),
    }
}
