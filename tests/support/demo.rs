//! `cascade demo` as a user starts it: the real binary, three regions in
//! one child process on free loopback ports, and the `cascade` commands a
//! user types against it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

/// A running `cascade demo`; dropping it kills it and removes its data.
pub struct Demo {
    child: Child,
    /// Its data (and certificates), removed when the demo is dropped.
    _data: tempfile::TempDir,
    /// Every line it printed before it waited for Ctrl-C.
    pub printed: String,
    /// Region → its node's address, in the order printed (eu-west first).
    pub endpoints: BTreeMap<String, String>,
    /// The development CA (None with `--plaintext`).
    pub ca_cert: Option<PathBuf>,
    /// The directory of the development certificates (None with `--plaintext`).
    pub certs: Option<PathBuf>,
    /// The administrator's token it printed (`CASCADE_TOKEN`: principal
    /// `admin`, group `admins`).
    pub admin_token: String,
    /// The limited user's token it printed (`ALICE_TOKEN`: principal
    /// `alice`, group `net-admins` of the example policy).
    pub alice_token: String,
    /// Every `export NAME=VALUE` it printed for the user's shell.
    pub exported: BTreeMap<String, String>,
}

impl Demo {
    /// Starts `cascade demo --listen 127.0.0.1:0` (`--plaintext` when asked)
    /// and reads what it prints up to "Ctrl-C stops the demo".
    pub fn start(plaintext: bool) -> Demo {
        let data = tempfile::tempdir().expect("a temporary directory");
        let mut command = Command::new(env!("CARGO_BIN_EXE_cascade"));
        command.args(["demo", "--listen", "127.0.0.1:0", "--data-dir"]);
        command.arg(data.path());
        if plaintext {
            command.arg("--plaintext");
        }
        let mut child = command
            .env_remove("CASCADE_LOG_FORMAT")
            .env("CASCADE_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cascade demo starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("readable output");
            let last = line.contains("Ctrl-C stops the demo");
            lines.push(line);
            if last {
                break;
            }
        }
        let printed = lines.join("\n");
        assert!(
            printed.contains("Ctrl-C stops the demo"),
            "the demo ended before it served:\n{printed}"
        );
        let mut endpoints = BTreeMap::new();
        let start = lines
            .iter()
            .position(|l| l.starts_with("Cascade demo"))
            .unwrap_or_else(|| panic!("no heading in:\n{printed}"));
        for line in &lines[start + 1..] {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some(region), Some(address), None) if address.contains("://") => {
                    endpoints.insert(region.to_owned(), address.to_owned());
                }
                _ => break,
            }
        }
        assert_eq!(endpoints.len(), 3, "three regions in:\n{printed}");
        let exported: BTreeMap<String, String> = lines
            .iter()
            .filter_map(|l| l.trim().strip_prefix("export ")?.split_once('='))
            .map(|(name, value)| (name.to_owned(), value.trim().to_owned()))
            .collect();
        let ca_cert = exported.get("CASCADE_CA_CERT").map(PathBuf::from);
        let certs = ca_cert.as_ref().and_then(|c| c.parent().map(PathBuf::from));
        let token = |variable: &str| {
            exported
                .get(variable)
                .cloned()
                .unwrap_or_else(|| panic!("no {variable} in:\n{printed}"))
        };
        let admin_token = token("CASCADE_TOKEN");
        let alice_token = token("ALICE_TOKEN");
        Demo {
            child,
            _data: data,
            printed,
            endpoints,
            ca_cert,
            certs,
            admin_token,
            alice_token,
            exported,
        }
    }

    /// The address of `region`'s node.
    pub fn endpoint(&self, region: &str) -> &str {
        self.endpoints
            .get(region)
            .unwrap_or_else(|| panic!("no region {region}"))
    }

    /// The environment the demo tells a user to export: the default node
    /// (eu-west), the CA, the administrator's token; and a fixed time zone
    /// and no colours, so output compares.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("CASCADE_SERVER".to_owned(), self.endpoint("eu-west").to_owned()),
            ("CASCADE_TOKEN".to_owned(), self.admin_token.clone()),
            ("TZ".to_owned(), "UTC".to_owned()),
            ("NO_COLOR".to_owned(), "1".to_owned()),
        ];
        if let Some(ca) = &self.ca_cert {
            env.push(("CASCADE_CA_CERT".to_owned(), ca.display().to_string()));
        }
        env
    }

    /// `cascade ARGS` with [`Demo::env`], as a user in another terminal runs it.
    pub fn cascade(&self, args: &[&str]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cascade"));
        command.args(args);
        for key in [
            "CASCADE_CERT",
            "CASCADE_KEY",
            "CASCADE_OUTPUT",
            "CASCADE_LOG_FORMAT",
            "CASCADE_ADMIN_TOKEN",
            "CASCADE_CONFIRM_ABOVE",
        ] {
            command.env_remove(key);
        }
        command.envs(self.env());
        command.output().expect("cascade runs")
    }

    /// Where `region`'s Prometheus metrics are, as the demo printed it.
    pub fn metrics(&self, region: &str) -> std::net::SocketAddr {
        let start = self
            .printed
            .lines()
            .position(|l| l.starts_with("Prometheus metrics"))
            .unwrap_or_else(|| panic!("no metrics addresses in:\n{}", self.printed));
        let url = self
            .printed
            .lines()
            .skip(start)
            .find_map(|l| l.trim().strip_prefix(region).map(|rest| rest.trim().to_owned()))
            .unwrap_or_else(|| panic!("no metrics address of {region} in:\n{}", self.printed));
        url.strip_prefix("http://")
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("not a metrics URL: {url}"))
    }

    /// `region`'s web console URL, as the demo printed it (`http://` or
    /// `https://`, ending in `/`).
    pub fn console(&self, region: &str) -> String {
        let start = self
            .printed
            .lines()
            .position(|l| l.starts_with("Web console"))
            .unwrap_or_else(|| panic!("no console addresses in:\n{}", self.printed));
        self.printed
            .lines()
            .skip(start)
            .find_map(|l| l.trim().strip_prefix(region).map(|rest| rest.trim().to_owned()))
            .unwrap_or_else(|| panic!("no console URL of {region} in:\n{}", self.printed))
    }

    /// Stops the demo as Ctrl-C or a service manager would (SIGTERM) and
    /// waits for it: its exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().expect("the demo stops")
    }

    /// [`Demo::cascade`], asserting it exits 0; its stdout.
    pub fn cascade_ok(&self, args: &[&str]) -> String {
        let out = self.cascade(args);
        assert!(
            out.status.success(),
            "cascade {args:?} exited {:?}\nstdout:\n{}\nstderr:\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
