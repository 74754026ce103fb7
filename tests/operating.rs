//! What operators' tools see of a node: gRPC reflection in both versions
//! (grpcurl, Postman and grpcio ask v1alpha), and logs a collector can
//! read (no colour codes in a file; one JSON object per line on request).

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use support::*;
use tokio_stream::StreamExt;
use tonic_reflection::pb::{v1, v1alpha};

/// Both reflection versions list the same services, Cascade's three among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1_and_v1alpha_list_the_services() {
    let n = start_node().await;
    let channel = tonic::transport::Endpoint::from_shared(n.node.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connects");

    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = alpha
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1alpha answers")
        .into_inner();
    let answer = answers.next().await.expect("one answer").expect("ok");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("not a service list: {answer:?}");
    };
    let alpha_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();

    let mut current = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = current
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1 answers")
        .into_inner();
    let answer = answers.next().await.expect("one answer").expect("ok");
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) = answer.message_response
    else {
        panic!("not a service list: {answer:?}");
    };
    let v1_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();

    let cascade = |names: &[String]| -> Vec<String> {
        let mut ours: Vec<String> = names
            .iter()
            .filter(|n| n.starts_with("cascade.") || n.starts_with("grpc.health"))
            .cloned()
            .collect();
        ours.sort();
        ours
    };
    assert_eq!(
        cascade(&alpha_names),
        [
            "cascade.v1.Admin",
            "cascade.v1.Peer",
            "cascade.v1.Resources",
            "grpc.health.v1.Health"
        ],
        "v1alpha: {alpha_names:?}"
    );
    assert_eq!(cascade(&v1_names), cascade(&alpha_names), "v1: {v1_names:?}");
}

/// Runs `cascade serve` with stderr to a pipe until it logs that it
/// serves, then stops it with SIGTERM; returns everything it logged.
fn serve_logs(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cascade"));
    cmd.args([
        "serve",
        "--auth",
        "none",
        "--region",
        "eu-west",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
    ])
    .arg(dir.path().join("data"))
    .env_remove("CASCADE_LOG_FORMAT")
    .env("CASCADE_LOG", "info")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("cascade serve starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let mut logged = Vec::new();
    // Up to the "serving" line (the process ends the stream if it dies).
    for line in lines.by_ref() {
        let line = line.expect("readable");
        let serving = line.contains("serving");
        logged.push(line);
        if serving {
            break;
        }
    }
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    logged.extend(lines.map_while(Result::ok));
    let status = child.wait().expect("it stops");
    assert!(
        status.success(),
        "cascade serve exited {status}:\n{}",
        logged.join("\n")
    );
    logged.join("\n")
}

#[test]
fn logs_to_a_file_carry_no_colour_codes_and_json_is_one_object_per_line() {
    let text = serve_logs(&[]);
    assert!(!text.trim().is_empty(), "it logged something");
    assert!(
        !text.contains('\u{1b}'),
        "escape codes in logs that are not a terminal:\n{text}"
    );
    assert!(text.contains("INFO") && text.contains("serving"), "{text}");

    let json = serve_logs(&[("CASCADE_LOG_FORMAT", "json")]);
    let mut parsed = 0;
    for line in json.lines().filter(|l| !l.trim().is_empty()) {
        #[allow(clippy::disallowed_methods)] // test code: reads the node's log, not stored data
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v.get("level").is_some() && v.get("fields").is_some(), "{line}");
        parsed += 1;
    }
    assert!(parsed > 0, "no log line:\n{json}");
}
