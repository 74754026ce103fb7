//! What an operator looks at, as the tests read it: a node's `/metrics`
//! scrape and `cascade status -o json`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET /metrics`, as Prometheus scrapes it: every sample, keyed by its
/// name and labels as exposed (`name{a="1",b="2"}`).
pub async fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics listener answers");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: cascade\r\n\r\n")
        .await
        .expect("request sent");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("response read");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain"), "{head}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').expect("sample line");
            (key.to_owned(), value.parse::<f64>().unwrap_or(f64::NAN))
        })
        .collect()
}

/// Runs `cascade status -o json` against `endpoint`: its exit code and output.
pub async fn cascade_status(endpoint: &str) -> (i32, serde_json::Value) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["--server", endpoint, "-o", "json", "status"])
        .env_remove("CASCADE_ADMIN_TOKEN")
        .output()
        .await
        .expect("cascade status runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), json)
}
