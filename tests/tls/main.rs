//! Mutual TLS between region nodes: the cross-region protocol runs over it,
//! a region's identity comes from its certificate, and a region may attach,
//! release, watch and acknowledge only as itself. A standby of a region in
//! front of its writer: `standby.rs`.

// Test code: `Instant::now` bounds the polling of the checker.
#![allow(clippy::disallowed_methods)]

mod standby;
#[path = "../support/mod.rs"]
mod support;

use cascade_client::check::check_cluster_with_schema;
use cascade_client::client::connect_channel;
use cascade_client::{ClientError, ClientTls};
use cascade_proto::v1;
use cascade_proto::v1::peer_client::PeerClient;
use cascade_tls::DevPki;
use support::*;

const REGIONS: [&str; 3] = ["ra", "rb", "rc"];

/// The back-reference row of `port`'s `network` field to `net`, as a
/// region attaches it (`generation`: the referrer's revision it is of).
fn backref_row(net: &v1::Resource, port: &v1::Resource, generation: u64) -> v1::PeerBackRef {
    let object = |r: &v1::Resource| v1::ObjectRef {
        name: r.name.clone(),
        uid: r.uid.clone(),
        dangling: false,
    };
    v1::PeerBackRef {
        target: Some(object(net)),
        referrer: Some(object(port)),
        field: "network".into(),
        generation,
        ..Default::default()
    }
}

/// ra/network/net with ports in rb and rc; rc's port has a floating IP.
/// Runs the checker over TLS with `identity` until it finds nothing, for up
/// to 10 s: the last PURGED event of a finished operation may still be on
/// its way to an importer, whose tombstone is then briefly a
/// `stale_remote_deletion` (the flake the unified checker's run showed).
/// Returns the clean report; fails with the last violations.
async fn check_until_clean(c: &Cluster, identity: &ClientTls) -> cascade_client::check::CheckReport {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let report = check_cluster_with_schema(&c.endpoints(), None, Some(identity))
            .await
            .expect("checker over TLS");
        if report.violations.is_empty() || std::time::Instant::now() > deadline {
            assert!(report.violations.is_empty(), "{:#?}", report.violations);
            return report;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn topology(c: &Cluster) {
    c.client("ra")
        .batch_create(vec![
            spec_in("ra/project/p", &[]),
            spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
        ])
        .await
        .unwrap();
    c.client("rb")
        .create(spec_in("rb/port/b0", &[("network", &["ra/network/net"])]))
        .await
        .unwrap();
    c.client("rc")
        .batch_create(vec![
            spec_in("rc/project/pc", &[]),
            spec_in("rc/port/c0", &[("network", &["ra/network/net"])]),
        ])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_region_cascade_runs_over_mutual_tls_and_the_checker_finds_nothing() {
    let pki = DevPki::generate(&REGIONS).unwrap();
    let c = start_cluster_tls(&REGIONS, &pki).await;
    assert!(c.node("ra").node.endpoint().starts_with("https://"));
    topology(&c).await;
    let done = delete_and_wait(c.client("ra"), "ra/network/net", true).await;
    assert_eq!(done.state(), v1::OperationState::Succeeded, "{done:?}");
    assert_eq!(done.progress.unwrap().deleted, 3, "network and both remote ports");
    for name in ["rb/port/b0", "rc/port/c0"] {
        wait_gone(c.client(&name[..2]), name).await;
    }

    // The checker reads every region through the Peer API with a region's identity.
    let identity = as_region(&pki, "ra");
    let report = check_until_clean(&c, &identity).await;
    assert_eq!(report.regions.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_cannot_release_attach_watch_or_ack_as_another() {
    let pki = DevPki::generate(&REGIONS).unwrap();
    let c = start_cluster_tls(&REGIONS, &pki).await;
    topology(&c).await;
    let ra = c.node("ra").node.endpoint();
    let net = c.client("ra").get("ra/network/net").await.unwrap();
    let port = c.client("rb").get("rb/port/b0").await.unwrap();
    let row = backref_row(&net, &port, u64::MAX);

    // rc, with its own certificate, claims to be rb to drop rb's back-reference.
    let mut rc = peer_as(&ra, &as_region(&pki, "rc"), "ra").await;
    let err = rc
        .release(v1::ReleaseRequest {
            from_region: "rb".into(),
            backrefs: vec![row.clone()],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("names region rc, not rb"), "{err:?}");
    let err = rc
        .attach(v1::AttachRequest {
            from_region: "rb".into(),
            backrefs: vec![row.clone()],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    let err = rc
        .watch(v1::PeerWatchRequest {
            region: "rb".into(),
            from_revision: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    let err = rc
        .ack(v1::AckRequest {
            region: "rb".into(),
            revision: u64::MAX,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");

    // Releasing as itself is allowed, but rb's row is not rc's to release.
    let report = rc
        .release(v1::ReleaseRequest {
            from_region: "rc".into(),
            backrefs: vec![row.clone()],
        })
        .await
        .expect("release as itself")
        .into_inner();
    assert_eq!((report.released, report.foreign), (0, 1), "{report:?}");

    // rb's back-reference is still at the owner: deleting the network without cascade names the port.
    let err = c
        .client("ra")
        .delete(delete_req("ra/network/net", false))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    assert!(err.to_string().contains("rb/port/b0"), "{err}");
    let identity = as_region(&pki, "ra");
    check_until_clean(&c, &identity).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_calls_need_a_region_certificate_and_clients_need_only_the_ca() {
    let pki = DevPki::generate(&REGIONS).unwrap();
    let c = start_cluster_tls(&REGIONS, &pki).await;
    topology(&c).await;
    let ra = c.node("ra").node.endpoint();

    // A client with only the CA reads and writes through the Resources API …
    let client = cascade_client::Client::connect_with(&ra, Some(&pki.client()))
        .await
        .unwrap();
    client.get("rb/port/b0").await.expect("forwarded over mutual TLS");
    // … but is not a region: Peer calls are refused.
    let mut anonymous = PeerClient::new(connect_channel(&ra, Some(&pki.client()), None).await.unwrap());
    let err = anonymous.dump(v1::DumpRequest {}).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    let err = anonymous
        .release(v1::ReleaseRequest {
            from_region: "rb".into(),
            backrefs: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");

    // A region certificate of another CA is no region: its calls are
    // UNAUTHENTICATED (the node's acceptor, `api/tls_accept.rs`).
    let stranger = DevPki::generate(&["rb"]).unwrap();
    let forged = ClientTls {
        ca_pem: pki.ca_cert_pem.clone(),
        ..as_region(&stranger, "rb")
    };
    let mut peer = PeerClient::new(connect_channel(&ra, Some(&forged), Some("ra")).await.unwrap());
    let refused = peer.dump(v1::DumpRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    // A node that is not the region the caller means to reach cannot pose as it.
    let err = connect_channel(&ra, Some(&as_region(&pki, "rb")), Some("rc"))
        .await
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");

    // Without the CA, an https:// address is a usage error, not a hang.
    let err = cascade_client::Client::connect_with(&ra, None).await.err().unwrap();
    assert!(err.to_string().contains("--ca-cert"), "{err}");
}
