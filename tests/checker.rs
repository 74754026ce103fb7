//! The invariant checker (`cascade_client::check`) against a real
//! three-region cluster: clean after cross-region cascades, and failing when
//! it is pointed at the wrong nodes.

// Test code, not a node: poll deadlines and elapsed times are real time,
// and made-up ids need no IdSource (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use cascade_client::check::{check_cluster, check_cluster_with_schema, CheckReport, ViolationKind};
use cascade_client::cli::{self, CheckArgs, ClientArgs, Command, Output};
use cascade_client::ClientError;
use cascade_proto::v1;
use support::*;

/// Checks until the report is clean (a release may still be in flight just
/// after quiescence), or panics with the last report after 15s.
async fn assert_clean(regions: &[(String, String)]) -> CheckReport {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // With the cluster's schema every reference is classified: a live
        // cross-region allow_dangling reference is not marked dangling, so
        // the dump alone cannot tell it is untracked.
        let schema = cascade_core::Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).unwrap();
        let report = check_cluster_with_schema(regions, Some(&schema), None)
            .await
            .expect("checker reads every region");
        if report.violations.is_empty() {
            return report;
        }
        assert!(
            Instant::now() < deadline,
            "invariant violations: {:#?}",
            report.violations
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// ra: project p, network net (project p).
/// rb: subnet s (net), ports b0/b1 (net, subnet s, qos rc/q allow_dangling,
///     security group rc/sg unset).
/// rc: project pc, security group sg (pc), qos q, port c0 (net), floating
///     ip f (project pc, port c0).
async fn build(c: &Cluster) {
    let a = c.client("ra");
    let b = c.client("rb");
    let cc = c.client("rc");
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    cc.batch_create(vec![
        spec_in("rc/project/pc", &[]),
        spec_in("rc/security_group/sg", &[("project", &["rc/project/pc"])]),
        spec_in("rc/qos_policy/q", &[]),
    ])
    .await
    .unwrap();
    b.create(spec_in("rb/subnet/s", &[("network", &["ra/network/net"])]))
        .await
        .unwrap();
    for i in 0..2 {
        let port = b
            .create(spec_in(
                &format!("rb/port/b{i}"),
                &[
                    ("network", &["ra/network/net"]),
                    ("subnet", &["rb/subnet/s"]),
                    ("qos_policy", &["rc/qos_policy/q"]),
                    ("security_groups", &["rc/security_group/sg"]),
                ],
            ))
            .await
            .unwrap();
        assert_eq!(state(&port), v1::ResourceState::Active);
    }
    cc.create(spec_in("rc/port/c0", &[("network", &["ra/network/net"])]))
        .await
        .unwrap();
    cc.create(spec_in(
        "rc/floating_ip/f",
        &[("project", &["rc/project/pc"]), ("port", &["rc/port/c0"])],
    ))
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_before_and_after_cross_region_cascades() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    build(&c).await;
    let regions = c.endpoints();
    wait_quiescent(&c).await;
    let before = assert_clean(&regions).await;
    assert_eq!(before.regions.len(), 3);
    assert_eq!(before.resources, 10, "{before:#?}");
    // Owner rows: net ← s, b0, b1, c0; p ← net; s ← b0, b1; sg ← b0, b1;
    // pc ← sg, f; c0 ← f. Mirrors: s, b0, b1, c0 → net; b0, b1 → sg. The
    // allow_dangling qos references keep none.
    assert_eq!((before.owner_rows, before.mirror_rows), (12, 6), "{before:#?}");
    assert_eq!(before.unclassified_refs, 0, "{before:#?}");

    // An allow_dangling target goes: the ports keep a dangling reference.
    delete_and_wait(c.client("rc"), "rc/qos_policy/q", false).await;
    // The unset side: the security group goes, the ports lose it.
    delete_and_wait(c.client("rc"), "rc/security_group/sg", true).await;
    // The cascade across the three regions.
    let op = c
        .client("rb")
        .delete(delete_req("ra/network/net", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    let done = wait_operation(c.client("ra"), &op.id).await;
    assert_eq!(
        v1::OperationState::try_from(done.state),
        Ok(v1::OperationState::Succeeded),
        "{done:?}"
    );
    wait_quiescent(&c).await;
    let after = assert_clean(&regions).await;
    // Left: p, pc, f (port unset).
    assert_eq!(after.resources, 3, "{after:#?}");
    assert_eq!(after.deleting, 0);
    let f = c.client("rc").get("rc/floating_ip/f").await.unwrap();
    assert!(targets(&f, "port").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_cascade_is_explained_not_a_violation() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let a = c.client("ra");
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/gw", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    c.client("rb")
        .batch_create(vec![
            spec_in("rb/project/pb", &[]),
            spec_in(
                "rb/router/r",
                &[("project", &["rb/project/pb"]), ("gateway_network", &["ra/network/gw"])],
            ),
        ])
        .await
        .unwrap();
    wait_quiescent(&c).await;
    assert_clean(&c.endpoints()).await;
    // The cascade from the project reaches the gateway network, which the
    // router in rb blocks: the network is BLOCKED, the project waits for it.
    a.delete(delete_req("ra/project/p", true)).await.unwrap();
    eventually(Duration::from_secs(30), "the network to be blocked", || async {
        let r = a.get("ra/network/gw").await.ok()?;
        let status = r.deletion.as_ref()?.status;
        (status == v1::DeletionStatus::Blocked as i32).then_some(())
    })
    .await;
    let report = assert_clean(&c.endpoints()).await;
    assert_eq!(report.deleting, 2, "{report:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_command_fails_on_wrong_nodes_and_needs_no_server() {
    let c = start_cluster(&["ra", "rb"]).await;
    c.client("ra").create(spec_in("ra/project/p", &[])).await.unwrap();
    c.client("rb")
        .create(spec_in("rb/security_group/sg", &[("project", &["ra/project/p"])]))
        .await
        .unwrap();
    wait_quiescent(&c).await;
    let ra = c.node("ra").node.endpoint();
    let rb = c.node("rb").node.endpoint();
    // --server points nowhere: check does not use it.
    let args = ClientArgs {
        server: "http://127.0.0.1:1".into(),
        output: Output::Json,
        utc: false,
        tls: Default::default(),
        token: None,
    };
    let check = |regions: Vec<String>| {
        Command::Check(CheckArgs {
            regions,
            config: None,
            schema: None,
        })
    };
    let ok = cli::run(&args, check(vec![format!("ra={ra}"), format!("rb={rb}")]))
        .await
        .unwrap();
    assert_eq!(ok, 0);
    // The nodes swapped: each answers for the other region.
    let swapped = cli::run(&args, check(vec![format!("ra={rb}"), format!("rb={ra}")]))
        .await
        .unwrap();
    assert_eq!(swapped, 1);
    let report = check_cluster(&[("ra".into(), rb.clone()), ("rb".into(), ra.clone())])
        .await
        .unwrap();
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.kind == ViolationKind::RegionMismatch),
        "{report:#?}"
    );
    // An unreachable region is an error, not a clean report.
    let err = check_cluster(&[("ra".into(), ra), ("rb".into(), "http://127.0.0.1:1".into())])
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
    let err = cli::run(&args, check(vec!["rb".into()])).await.unwrap_err();
    assert!(err.to_string().contains("REGION=ENDPOINT"), "{err}");
}

#[tokio::test]
async fn the_check_command_reads_a_node_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    std::fs::write(
        &path,
        "region = \"ra\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"/tmp/x\"\n",
    )
    .unwrap();
    let args = ClientArgs {
        server: "http://127.0.0.1:1".into(),
        output: Output::Text,
        utc: false,
        tls: Default::default(),
        token: None,
    };
    let err = cli::run(
        &args,
        Command::Check(CheckArgs {
            regions: vec![],
            config: Some(path.clone()),
            schema: None,
        }),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("port 0"), "{err}");
    // A dialable listen: the node is not running, so the connect fails (it
    // got as far as dialing the configured address and peer).
    std::fs::write(
        &path,
        "region = \"ra\"\nlisten = \"0.0.0.0:1\"\n[peers]\nrb = \"http://127.0.0.1:2\"\n",
    )
    .unwrap();
    let err = cli::run(
        &args,
        Command::Check(CheckArgs {
            regions: vec![],
            config: Some(path),
            schema: None,
        }),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ClientError::Connect { addr, .. } if addr.contains("127.0.0.1:1")),
        "{err}"
    );
}

/// A remote allow_dangling target is deleted and purged while its referrers
/// live on: once the PURGED event has removed the importer's tombstone, the
/// importer's own store cannot tell the target is gone, so List and Dump
/// (not only Get) must ask the owner. The simulation found Dump reporting
/// such a reference as not dangling, which the checker flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_allow_dangling_target_purged_reads_dangling_in_get_list_and_dump() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    build(&c).await;
    let regions = c.endpoints();
    delete_and_wait(c.client("rc"), "rc/qos_policy/q", false).await;
    wait_quiescent(&c).await;
    let qos_marks = |r: &v1::Resource| -> Vec<bool> {
        r.refs
            .iter()
            .filter(|f| f.field == "qos_policy")
            .flat_map(|f| f.targets.iter().map(|t| t.dangling))
            .collect()
    };
    let got = c.client("rb").get("rb/port/b0").await.unwrap();
    assert_eq!(qos_marks(&got), [true], "Get: {got:?}");
    let listed = c
        .client("rb")
        .list(v1::ListRequest {
            kind: "port".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.resources.len(), 2);
    for r in &listed.resources {
        assert_eq!(qos_marks(r), [true], "List: {r:?}");
    }
    let dumped = dump(&c.node("rb").node.endpoint()).await.unwrap();
    let ports: Vec<_> = dumped.resources.iter().filter(|r| r.kind == "port").collect();
    assert_eq!(ports.len(), 2);
    for r in ports {
        assert_eq!(qos_marks(r), [true], "Dump: {r:?}");
    }
    assert_clean(&regions).await;
}
