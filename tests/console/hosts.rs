//! No DNS rebinding: a request to the console naming a host it is not
//! served as (an attacker's name that resolves to this node) is refused
//! before any page or delete is made; its own address, `localhost` and
//! `[console] allowed_hosts` are served.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::start_node_with;
use crate::with_console;

/// Sends one HTTP/1.1 request with `host` to the console at `addr`;
/// the status code and the body.
pub async fn request(addr: &str, method: &str, path: &str, host: &str, extra: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.expect("connect to the console");
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.expect("send");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_string(&mut answer))
        .await
        .expect("an answer within 10 s")
        .expect("read");
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer}"));
    (status, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_a_foreign_host_is_refused_and_the_consoles_own_names_are_served() {
    let node = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        with_console(s);
        s.console_allowed_hosts = vec!["console.example.com".into()];
    })
    .await;
    let url = node.node.console_url().expect("a console");
    let addr = url.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let port = addr.rsplit_once(':').expect("a port").1.to_owned();
    for own in [
        addr.clone(),
        format!("localhost:{port}"),
        "console.example.com".to_owned(),
    ] {
        let (status, answer) = request(&addr, "GET", "/cluster", &own, "").await;
        assert_ne!(status, 421, "{own}: {answer}");
    }
    // A page read and a delete posted by a rebinding page: its own name in
    // Host and Origin alike.
    let (status, answer) = request(&addr, "GET", "/cluster", &format!("rebind.attacker.example:{port}"), "").await;
    assert_eq!(status, 421, "{answer}");
    assert!(answer.contains("DNS rebinding"), "{answer}");
    assert!(answer.contains("allowed_hosts"), "{answer}");
    let (status, answer) = request(
        &addr,
        "POST",
        "/resources/eu-west/project/p/delete",
        &format!("rebind.attacker.example:{port}"),
        &format!("Origin: http://rebind.attacker.example:{port}\r\n"),
    )
    .await;
    assert_eq!(status, 421, "{answer}");
}
