//! A standby of a region (`cascade_node::serve_standby`) in front of its
//! writer: every call and stream forwarded, health of its own as the writer
//! stops, freezes and comes back, and the caller's identity (region,
//! administrator, principal) relayed so that nobody can forge it.

#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use cascade_client::client::connect_channel;
use cascade_client::ClientTls;
use cascade_node::{serve_standby, StandbySettings, WRITER_HEALTH_SERVICE};
use cascade_proto::v1;
use cascade_proto::v1::peer_client::PeerClient;
use cascade_tls::DevPki;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::ServerReflectionRequest;

use crate::support::*;
use crate::{backref_row, topology, REGIONS};

// ---------------------------------------------------------------------------
// A standby of a region (`cascade_node::serve_standby`): every call
// forwarded to the writer, health of its own, the caller's identity relayed.

/// A standby serving on a free port, told its writer through `writer`.
struct Standby {
    endpoint: String,
    writer: tokio::sync::watch::Sender<Option<String>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), cascade_node::NodeError>>,
}

impl Standby {
    async fn start(settings: StandbySettings, writer: Option<String>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let scheme = if settings.tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://{}", listener.local_addr().unwrap());
        let (writer, follows) = tokio::sync::watch::channel(writer);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let task = tokio::spawn(serve_standby(settings, incoming, follows, async {
            let _ = stopped.await;
        }));
        Self {
            endpoint,
            writer,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task)
            .await
            .expect("standby task")
            .expect("standby stops cleanly");
    }
}

fn standby_settings(region: &str, tls: Option<cascade_tls::NodeTls>) -> StandbySettings {
    let mut settings = StandbySettings::of_node(&cascade_node::NodeSettings::new(
        cascade_core::RegionId::parse(region).unwrap(),
        std::sync::Arc::new(cascade_core::Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).unwrap()),
        None,
    ));
    settings.tls = tls;
    settings.writer_check_every = Duration::from_millis(200);
    settings
}

/// The standby's health for `service`, as a probe reads it.
async fn health_of(endpoint: &str, tls: Option<&ClientTls>, service: &str) -> ServingStatus {
    let channel = connect_channel(endpoint, tls, None).await.expect("health channel");
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .expect("the standby answers health itself")
        .into_inner()
        .status;
    ServingStatus::try_from(status).expect("a serving status")
}

/// Waits until every service the standby reports on reads `want`; returns how long it took.
async fn wait_health(endpoint: &str, tls: Option<&ClientTls>, want: ServingStatus, limit: Duration) -> Duration {
    let started = Instant::now();
    eventually(limit, &format!("the standby to report {want:?}"), || async {
        for service in ["", "cascade.v1.Resources", "cascade.v1.Peer", "cascade.v1.Admin"] {
            if health_of(endpoint, tls, service).await != want {
                return None;
            }
        }
        Some(())
    })
    .await;
    started.elapsed()
}

/// Create, Get, List, Delete, Watch (events committed after it started) and
/// WatchOperation, all through a standby in front of a writer over mutual
/// TLS; stopping the standby ends a forwarded watch at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_forwards_calls_and_streams_to_its_writer() {
    let pki = DevPki::generate(&["ra", "rb"]).unwrap();
    let c = start_cluster_tls(&["ra", "rb"], &pki).await;
    let standby = Standby::start(
        standby_settings("ra", Some(pki.node_tls("ra").unwrap())),
        Some(c.node("ra").node.endpoint()),
    )
    .await;
    let client = cascade_client::Client::connect_with(&standby.endpoint, Some(&pki.client()))
        .await
        .expect("a client with the CA connects to the standby");
    wait_health(
        &standby.endpoint,
        Some(&pki.client()),
        ServingStatus::Serving,
        Duration::from_secs(5),
    )
    .await;

    // A watch opened through the standby before anything is committed.
    let mut events = client.watch(0, "").await.expect("watch through the standby");
    client
        .batch_create(vec![
            spec_in("ra/project/p", &[]),
            spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
        ])
        .await
        .expect("create through the standby");
    // Another region's name: the writer forwards it on.
    client
        .create(spec_in("rb/port/b0", &[("network", &["ra/network/net"])]))
        .await
        .expect("create of another region's name through the standby");
    let net = client.get("ra/network/net").await.expect("get through the standby");
    assert_eq!(c.client("ra").get("ra/network/net").await.unwrap().uid, net.uid);
    let listed = client
        .list(v1::ListRequest::default())
        .await
        .expect("list through the standby");
    let names: Vec<&str> = listed.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["ra/network/net", "ra/project/p"], "{listed:?}");

    let deleted = client
        .delete(delete_req("ra/project/p", true))
        .await
        .expect("delete through the standby")
        .operation
        .expect("an operation");
    let mut progress = client.watch_operation(&deleted.id).await.expect("watch the operation");
    let done = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(op) = progress.message().await.expect("the operation's stream") {
            if op.done {
                return op;
            }
        }
        panic!("the operation's stream ended before the operation")
    })
    .await
    .expect("the operation finishes within 30 s");
    assert_eq!(done.state(), v1::OperationState::Succeeded, "{done:?}");
    assert_eq!(done.progress.unwrap().deleted, 3, "project, network and the port in rb");

    // The watch opened first saw what was committed after it, through to the purge.
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        let mut seen = Vec::new();
        while let Some(event) = events.message().await.expect("the watch stream") {
            let kind = event.r#type();
            let name = event.resource.map(|r| r.name).unwrap_or_default();
            seen.push((kind, name.clone()));
            if kind == v1::EventType::Purged && name == "ra/project/p" {
                return seen;
            }
        }
        panic!("the watch ended early: {seen:?}")
    })
    .await
    .expect("the watch sees the project purged within 10 s");
    assert!(
        seen.contains(&(v1::EventType::Created, "ra/network/net".to_owned())),
        "{seen:?}"
    );
    wait_gone(&client, "rb/port/b0").await;
    drop(events);

    // Stopping (the process is to become the writer) ends forwarded
    // streams with UNAVAILABLE, which a watcher resumes elsewhere, instead
    // of waiting on them.
    let mut open = client.watch(0, "").await.expect("a watch through the standby");
    open.message().await.expect("the first event").expect("an event");
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), standby.stop())
        .await
        .expect("the standby stops within 5 s with a watch open");
    println!("standby stopped in {:?} with a watch open", started.elapsed());
    let ended = loop {
        match open.message().await {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    let status = ended.expect_err("the watch ends with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("stopping; retry"), "{status:?}");
}

/// Health SERVING while the writer answers, NOT_SERVING within a few
/// seconds of it stopping (calls UNAVAILABLE at once, naming it), SERVING
/// again when it is back; a new writer's address sends calls there; no
/// writer at all is UNAVAILABLE too; a message over the standby's limit is
/// not forwarded. Plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_serving_while_its_writer_answers_and_follows_the_writer_it_is_told() {
    let mut c = start_cluster(&["ra"]).await;
    let other = start_cluster(&["ra"]).await;
    let first = c.node("ra").node.endpoint();
    let mut settings = standby_settings("ra", None);
    settings.max_message_bytes = 64 * 1024;
    let standby = Standby::start(settings, None).await;
    let client = cascade_client::Client::connect(&standby.endpoint).await.unwrap();

    // No writer known.
    let err = client.get("ra/project/p").await.unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::Unavailable), "{err}");
    assert!(
        err.to_string().contains("region ra has no writer right now; retry"),
        "{err}"
    );
    assert_eq!(health_of(&standby.endpoint, None, "").await, ServingStatus::NotServing);

    standby.writer.send_replace(Some(first.clone()));
    let took = wait_health(&standby.endpoint, None, ServingStatus::Serving, Duration::from_secs(5)).await;
    println!("SERVING {took:?} after the writer was named");
    assert_eq!(
        health_of(&standby.endpoint, None, WRITER_HEALTH_SERVICE).await,
        ServingStatus::NotServing,
        "a standby is never the writer"
    );
    client
        .create(spec_in("ra/project/p", &[]))
        .await
        .expect("create through the standby");
    // Reflection is the writer's, over a stream both ways: each question
    // is answered before the next is sent.
    let channel = connect_channel(&standby.endpoint, None, None).await.unwrap();
    let (ask, questions) = tokio::sync::mpsc::channel(1);
    let mut answers = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(questions))
        .await
        .expect("reflection through the standby")
        .into_inner();
    for _ in 0..2 {
        ask.send(ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        })
        .await
        .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), answers.message())
            .await
            .expect("an answer to each question as it is asked")
            .expect("reflection answers")
            .expect("one answer");
        assert!(format!("{answer:?}").contains("cascade.v1.Resources"), "{answer:?}");
    }
    drop(ask);
    // A message over the standby's limit is not forwarded (the writer's limit is larger).
    let mut large = spec_in("ra/project/large", &[]);
    large.attributes.insert("note".into(), "x".repeat(80 * 1024));
    let err = client.create(large).await.unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::ResourceExhausted), "{err}");
    assert!(
        err.to_string().contains("over this node's limit of 65536 bytes"),
        "{err}"
    );

    // The writer stops: calls fail at once, health follows within seconds.
    c.stop("ra").await;
    let started = Instant::now();
    let err = client.get("ra/project/p").await.unwrap_err();
    let call_took = started.elapsed();
    assert_eq!(code(&err), Some(tonic::Code::Unavailable), "{err}");
    let address = first.trim_start_matches("http://");
    assert!(err.to_string().contains(address), "names the writer's address: {err}");
    assert!(call_took < Duration::from_secs(1), "UNAVAILABLE took {call_took:?}");
    let took = wait_health(
        &standby.endpoint,
        None,
        ServingStatus::NotServing,
        Duration::from_secs(5),
    )
    .await;
    println!("writer stopped: a call UNAVAILABLE in {call_took:?}, NOT_SERVING in {took:?}");

    // Back on the same address: SERVING, and what it had is there.
    c.restart("ra").await;
    let took = wait_health(&standby.endpoint, None, ServingStatus::Serving, Duration::from_secs(5)).await;
    println!("writer back: SERVING in {took:?}");
    client
        .get("ra/project/p")
        .await
        .expect("the writer's resource through the standby");

    // A standby named as the writer (a lease row naming a process that is
    // now a standby): no loop, UNAVAILABLE at once.
    standby.writer.send_replace(Some(standby.endpoint.clone()));
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(5), client.get("ra/project/p"))
        .await
        .expect("an answer within 5 s, not a loop")
        .unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::Unavailable), "{err}");
    assert!(err.to_string().contains("a standby was named as the writer"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );

    // Another writer: calls go there.
    standby.writer.send_replace(Some(other.node("ra").node.endpoint()));
    let err = client.get("ra/project/p").await.unwrap_err();
    assert_eq!(
        code(&err),
        Some(tonic::Code::NotFound),
        "the new writer never had it: {err}"
    );
    client
        .create(spec_in("ra/project/q", &[]))
        .await
        .expect("create on the new writer");
    other
        .client("ra")
        .get("ra/project/q")
        .await
        .expect("created on the new writer");
    standby.stop().await;
}

/// Under mutual TLS the writer sees the standby's certificate: the standby
/// passes on the region the caller's certificate names and the
/// administrator it verified, and neither can be forged, through the
/// standby or straight to the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_relays_the_callers_region_and_administrator_and_nobody_can_forge_them() {
    let pki = DevPki::generate(&REGIONS).unwrap();
    let c = start_cluster_tls_with(&REGIONS, &pki, |s| {
        s.admin.identities = vec!["alice.admin".to_owned()];
    })
    .await;
    topology(&c).await;
    let writer = c.node("ra").node.endpoint();
    let mut settings = standby_settings("ra", Some(pki.node_tls("ra").unwrap()));
    settings.admin_identities = vec!["alice.admin".to_owned()];
    let standby = Standby::start(settings, Some(writer.clone())).await;
    let net = c.client("ra").get("ra/network/net").await.unwrap();
    let port = c.client("rb").get("rb/port/b0").await.unwrap();
    let row = backref_row(&net, &port, port.revision);
    let attach_as = |region: &str, forged: Option<&str>| {
        let mut request = tonic::Request::new(v1::AttachRequest {
            from_region: region.into(),
            backrefs: vec![row.clone()],
        });
        if let Some(forged) = forged {
            request
                .metadata_mut()
                .insert("cascade-relayed-region", forged.parse().unwrap());
        }
        request
    };

    // rb's Attach through ra's standby is rb's.
    let mut rb = peer_as(&standby.endpoint, &as_region(&pki, "rb"), "ra").await;
    rb.attach(attach_as("rb", None))
        .await
        .expect("rb attaches as itself through the standby");
    let err = rb.attach(attach_as("rc", None)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("names region rb, not rc"), "{err:?}");

    // rb forging the relayed region, through the standby and straight to the writer.
    for endpoint in [&standby.endpoint, &writer] {
        let mut rb = peer_as(endpoint, &as_region(&pki, "rb"), "ra").await;
        let err = rb.attach(attach_as("rc", Some("rc"))).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{endpoint}: {err:?}");
        assert!(err.message().contains("names region rb, not rc"), "{endpoint}: {err:?}");
    }
    // A client with only the CA is no region, whatever it says.
    for endpoint in [&standby.endpoint, &writer] {
        let mut anonymous = PeerClient::new(connect_channel(endpoint, Some(&pki.client()), None).await.unwrap());
        let err = anonymous.attach(attach_as("rb", Some("rb"))).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{endpoint}: {err:?}");
    }

    // An administrator through the standby is audited as itself, through it.
    let client_with = |name: &str| {
        let (cert, key) = pki.issue_client(name).expect("client certificate");
        ClientTls {
            identity: Some((cert, key)),
            ..pki.client()
        }
    };
    let alice = cascade_client::AdminClient::connect_with(&standby.endpoint, Some(&client_with("alice.admin")), None)
        .await
        .unwrap();
    let refused = alice
        .retry_deletion(v1::RetryDeletionRequest {
            name: "ra/network/net".into(),
            reason: "through a standby".into(),
        })
        .await
        .expect_err("the network is not being deleted");
    assert_ne!(code(&refused), Some(tonic::Code::PermissionDenied), "{refused}");
    let log = alice
        .list_audit(v1::ListAuditRequest {
            region: "ra".into(),
            ..Default::default()
        })
        .await
        .expect("alice reads the audit log through the standby")
        .entries;
    assert!(
        log.iter()
            .any(|e| e.who == "alice.admin (through a standby of ra)" && e.action == "RetryDeletion"),
        "{log:?}"
    );
    // Nobody becomes alice by saying so, through the standby or to the writer.
    for endpoint in [&standby.endpoint, &writer] {
        let channel = connect_channel(endpoint, Some(&pki.client()), None).await.unwrap();
        let mut request = tonic::Request::new(v1::ListAuditRequest {
            region: "ra".into(),
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("cascade-admin-for", "alice.admin".parse().unwrap());
        request
            .metadata_mut()
            .insert("cascade-relayed-region", "rb".parse().unwrap());
        let status = v1::admin_client::AdminClient::new(channel)
            .list_audit(request)
            .await
            .expect_err("a forged identity is no administrator");
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{endpoint}: {status:?}");
    }
    standby.stop().await;
}

/// A writer that accepts but does not answer (a paused process, a
/// partition that holds every byte): the standby is NOT_SERVING within a
/// check or two, and a call ends at its own deadline instead of hanging;
/// once the writer answers again, SERVING. A connection to the writer cut
/// mid-stream ends a forwarded watch with UNAVAILABLE. Plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_of_a_frozen_writer_is_not_serving_and_its_calls_end_at_their_deadline() {
    let c = start_cluster(&["ra"]).await;
    let proxy = crate::support::fault_proxy::FaultProxy::start(c.node("ra").node.addr).await;
    let standby = Standby::start(standby_settings("ra", None), Some(proxy.uri())).await;
    wait_health(&standby.endpoint, None, ServingStatus::Serving, Duration::from_secs(5)).await;
    let client = cascade_client::Client::connect(&standby.endpoint).await.unwrap();
    client
        .create(spec_in("ra/project/p", &[]))
        .await
        .expect("create through the standby");

    proxy.set(crate::support::fault_proxy::Fault::Hold);
    let took = wait_health(
        &standby.endpoint,
        None,
        ServingStatus::NotServing,
        Duration::from_secs(5),
    )
    .await;
    let mut request = tonic::Request::new(v1::GetRequest {
        name: "ra/project/p".into(),
        show_deleted: false,
    });
    request.set_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(5), client.raw().get(request))
        .await
        .expect("the call ends at its deadline, not later")
        .unwrap_err();
    let call_took = started.elapsed();
    // CANCELLED when this server's timer fires first (tonic's word for
    // it), DEADLINE_EXCEEDED when the channel to the writer's does.
    assert!(
        matches!(err.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled),
        "{err:?}"
    );
    assert!(call_took < Duration::from_secs(2), "ended after {call_took:?}");
    println!("writer frozen: NOT_SERVING in {took:?}, a call with a 500 ms deadline ended in {call_took:?}");

    proxy.set(crate::support::fault_proxy::Fault::Pass);
    let took = wait_health(&standby.endpoint, None, ServingStatus::Serving, Duration::from_secs(10)).await;
    println!("writer answers again: SERVING in {took:?}");
    client
        .get("ra/project/p")
        .await
        .expect("a get through the standby again");

    // The connection to the writer cut mid-stream (a killed writer): the
    // forwarded watch ends with UNAVAILABLE, which a watcher resumes from.
    let mut watch = client.watch(0, "").await.expect("a watch through the standby");
    watch.message().await.expect("the first event").expect("an event");
    proxy.reset_all();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => continue,
                other => break other,
            }
        }
    })
    .await
    .expect("the watch ends within 5 s of the cut");
    let status = ended.expect_err("the watch ends with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("went away mid-answer"), "{status:?}");
    standby.stop().await;
}

/// `[auth] mode = "required"` on a standby and its writer (a tokens file,
/// a Cedar policy): the standby authenticates its callers itself, refuses
/// a call without credentials, or one that claims a principal in the
/// vouching header, UNAUTHENTICATED before it reaches the writer, and
/// vouches for the caller it found: the writer decides on and audits the
/// token's principal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_authenticates_its_callers_and_vouches_for_them_to_its_writer() {
    const TOKEN: &str = "standby-test-token-0123456789";
    let files = tempfile::tempdir().unwrap();
    let sha256: String = ring::digest::digest(&ring::digest::SHA256, TOKEN.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tokens = files.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!("[[token]]\nprincipal = \"ci-bot\"\ngroups = [\"deployers\"]\nsha256 = \"{sha256}\"\n"),
    )
    .unwrap();
    let policy = files.path().join("policy.cedar");
    std::fs::write(
        &policy,
        "@id(\"deployers\")\npermit (principal in Cascade::Group::\"deployers\", action, resource);\n",
    )
    .unwrap();
    let auth = cascade_node::auth::AuthSettings {
        mode: cascade_node::auth::AuthMode::Required,
        tokens_file: Some(tokens.clone()),
        policy_file: Some(policy.clone()),
        ..Default::default()
    };
    let pki = DevPki::generate(&["ra", "rb"]).unwrap();
    let c = start_cluster_tls_with(&["ra", "rb"], &pki, |s| s.auth = auth.clone()).await;
    let mut settings = standby_settings("ra", Some(pki.node_tls("ra").unwrap()));
    settings.auth = auth.clone();
    let standby = Standby::start(settings, Some(c.node("ra").node.endpoint())).await;
    let writer = c.node("ra").node.endpoint();

    // No credentials: refused by the standby, nothing reaches the writer.
    let anonymous = cascade_client::Client::connect_with(&standby.endpoint, Some(&pki.client()))
        .await
        .unwrap();
    let refused = anonymous.create(spec_in("ra/project/nobody", &[])).await.unwrap_err();
    assert_eq!(code(&refused), Some(tonic::Code::Unauthenticated), "{refused}");
    let ci = cascade_client::Client::connect_with(&writer, Some(&pki.client()))
        .await
        .unwrap()
        .with_token(TOKEN)
        .unwrap();
    let missing = ci.get("ra/project/nobody").await.unwrap_err();
    assert_eq!(code(&missing), Some(tonic::Code::NotFound), "{missing}");

    // A caller claiming to be somebody else in the vouching header, even
    // with a valid token of its own: refused by the standby, as the writer
    // would (only a region's certificate vouches), and nothing is created.
    let through_standby = |with_forged_claim: bool| {
        let mut request = tonic::Request::new(v1::CreateRequest {
            resource: Some(spec_in("ra/project/through-standby", &[])),
        });
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        if with_forged_claim {
            let forged = cascade_proto::principal_to_bytes(&v1::Principal {
                id: "root".into(),
                groups: vec!["admins".into()],
                via: "token".into(),
            });
            request.metadata_mut().insert_bin(
                "cascade-principal-bin",
                tonic::metadata::BinaryMetadataValue::from_bytes(&forged),
            );
        }
        request
    };
    let channel = connect_channel(&standby.endpoint, Some(&pki.client()), None)
        .await
        .unwrap();
    let mut raw = v1::resources_client::ResourcesClient::new(channel);
    let forged = raw.create(through_standby(true)).await.unwrap_err();
    assert_eq!(forged.code(), tonic::Code::Unauthenticated, "{forged:?}");
    assert!(forged.message().contains("vouching header"), "{forged:?}");
    let missing = ci.get("ra/project/through-standby").await.unwrap_err();
    assert_eq!(code(&missing), Some(tonic::Code::NotFound), "{missing}");

    // The token alone: the standby vouches for its principal to the writer.
    raw.create(through_standby(false))
        .await
        .expect("the token's principal may create through the standby");
    ci.get("ra/project/through-standby")
        .await
        .expect("created on the writer");

    // The writer's audit log names the token's principal, never the claim.
    let admin = cascade_client::AdminClient::connect_with(&writer, Some(&pki.client()), Some(TOKEN.to_owned()))
        .await
        .unwrap();
    let log = admin
        .list_audit(v1::ListAuditRequest {
            region: "ra".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .entries;
    let created: Vec<_> = log
        .iter()
        .filter(|e| e.action == "create" && e.target == "ra/project/through-standby")
        .collect();
    assert_eq!(created.len(), 1, "{log:#?}");
    assert_eq!(created[0].who, "ci-bot", "{log:#?}");
    assert_eq!(created[0].via, "token", "{log:#?}");
    assert_eq!(created[0].rule, "deployers", "{log:#?}");
    assert!(log.iter().all(|e| e.who != "root"), "{log:#?}");
    assert!(
        log.iter().all(|e| e.target != "ra/project/nobody"),
        "the refused create reached the writer: {log:#?}"
    );
    standby.stop().await;
}
