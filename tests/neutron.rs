//! Seed 001 end to end over gRPC: cascade deletion of a Neutron network with
//! subnets, 50 ports, a trunk with subports and a router interface.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use cascade_proto::v1;
use futures::StreamExt;
use support::*;

async fn build_topology(client: &cascade_client::Client) {
    let mut specs = vec![
        spec("project/p", &[]),
        spec("security_group/sg", &[("project", &["project/p"])]),
        spec("network/net", &[("project", &["project/p"])]),
        spec("subnet/s1", &[("network", &["network/net"])]),
        spec("subnet/s2", &[("network", &["network/net"])]),
    ];
    for i in 0..50 {
        let subnet = if i % 2 == 0 { "subnet/s1" } else { "subnet/s2" };
        specs.push(spec(
            &format!("port/port-{i}"),
            &[
                ("network", &["network/net"]),
                ("subnet", &[subnet]),
                ("security_groups", &["security_group/sg"]),
            ],
        ));
    }
    specs.extend([
        spec("trunk/t", &[("parent_port", &["port/port-0"])]),
        spec("subport/t-1", &[("trunk", &["trunk/t"]), ("port", &["port/port-1"])]),
        spec("subport/t-2", &[("trunk", &["trunk/t"]), ("port", &["port/port-2"])]),
        spec("router/r", &[("project", &["project/p"])]),
        spec(
            "router_interface/ri",
            &[("router", &["router/r"]), ("subnet", &["subnet/s1"])],
        ),
        spec(
            "floating_ip/fip",
            &[("project", &["project/p"]), ("port", &["port/port-7"])],
        ),
    ]);
    client.batch_create(specs).await.expect("topology created");
}

#[tokio::test]
async fn network_cascade_deletes_its_closure_and_unsets_the_floating_ip() {
    let t = start_node().await;
    let c = &t.client;
    build_topology(c).await;

    // Without cascade: refused, with the dependents listed.
    let err = c.delete(delete_req("network/net", false)).await.unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    let tonic_status = match &err {
        cascade_client::ClientError::Status(s) => s,
        other => panic!("expected a status, got {other}"),
    };
    let details = cascade_proto::error_details(tonic_status).expect("details listed");
    let listed: BTreeSet<_> = details.dependents.iter().map(|d| d.referrer.as_str()).collect();
    assert!(
        listed.contains("eu-west/subnet/s1") && listed.contains("eu-west/port/port-0"),
        "{listed:?}"
    );
    assert_eq!(
        details.dependents.len() as u64 + details.more,
        52,
        "2 subnets + 50 ports"
    );
    // Nothing changed.
    assert_eq!(
        state(&c.get(&full("network/net")).await.unwrap()),
        v1::ResourceState::Active
    );

    // With cascade: accepted at once with an operation; the root reads DELETING.
    let response = c.delete(delete_req("network/net", true)).await.unwrap();
    let op = response.operation.expect("an operation");
    assert!(!op.id.is_empty());
    let mut progress = c.watch_operation(&op.id).await.unwrap();
    assert_eq!(v1::OperationState::try_from(op.state), Ok(v1::OperationState::Running));

    // WatchOperation reports progress to completion.
    let mut reports = Vec::new();
    while let Some(report) = tokio::time::timeout(Duration::from_secs(60), progress.next())
        .await
        .expect("progress within a minute")
    {
        let report = report.unwrap();
        let done = report.done;
        reports.push(report);
        if done {
            break;
        }
    }
    let last = reports.last().expect("at least one report");
    assert_eq!(
        v1::OperationState::try_from(last.state),
        Ok(v1::OperationState::Succeeded)
    );
    let p = last.progress.unwrap();
    // network + 2 subnets + 50 ports + trunk + 2 subports + router interface
    assert_eq!(p.deleted, 57, "{p:?}");
    assert_eq!(p.pending, 0);
    assert_eq!(p.failed, 0);
    assert!(p.unset >= 1, "the floating ip was unset: {p:?}");
    let deleted_counts: Vec<u64> = reports.iter().map(|r| r.progress.unwrap().deleted).collect();
    assert!(
        deleted_counts.windows(2).all(|w| w[0] <= w[1]),
        "progress never goes back: {deleted_counts:?}"
    );

    // Every dependent is gone, the rest survives.
    for gone in [
        "network/net",
        "subnet/s1",
        "subnet/s2",
        "port/port-0",
        "port/port-49",
        "trunk/t",
        "subport/t-1",
        "router_interface/ri",
    ] {
        let e = c.get(&full(gone)).await.unwrap_err();
        assert_eq!(code(&e), Some(tonic::Code::NotFound), "{gone}: {e}");
    }
    for kept in ["project/p", "router/r", "security_group/sg"] {
        assert_eq!(
            state(&c.get(&full(kept)).await.unwrap()),
            v1::ResourceState::Active,
            "{kept}"
        );
    }
    let fip = c.get(&full("floating_ip/fip")).await.unwrap();
    assert_eq!(state(&fip), v1::ResourceState::Active);
    assert!(
        targets(&fip, "port").is_empty(),
        "port reference cleared: {:?}",
        fip.refs
    );
    assert_eq!(targets(&fip, "project"), vec!["eu-west/project/p"]);

    // The per-resource report (seed 001's 207 body) names every resource.
    let full_op = c.get_operation(&op.id, 1000).await.unwrap();
    let deleted: BTreeSet<_> = full_op
        .outcomes
        .iter()
        .filter(|o| o.action == v1::OutcomeAction::Deleted as i32)
        .map(|o| o.resource.clone().unwrap().name)
        .collect();
    assert_eq!(deleted.len(), 57);
    assert!(full_op
        .outcomes
        .iter()
        .any(|o| o.action == v1::OutcomeAction::Unset as i32 && o.field == "port"));

    // The event log shows the root DELETING first and purged last: it stayed
    // readable (state DELETING) until its whole closure was gone.
    let mut events = c.watch(0, "").await.unwrap();
    let mut for_op = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .ok()
        .flatten()
    {
        let e = e.unwrap();
        if e.operation_id == op.id {
            for_op.push(e);
        }
        if for_op
            .iter()
            .filter(|e| e.r#type == v1::EventType::Purged as i32)
            .count()
            == 57
        {
            break;
        }
    }
    let first = for_op.first().expect("events of the operation");
    assert_eq!(first.r#type, v1::EventType::Deleting as i32);
    assert_eq!(first.resource.clone().unwrap().name, "eu-west/network/net");
    let snapshot = first.snapshot.clone().expect("snapshot of the deleting root");
    assert_eq!(state(&snapshot), v1::ResourceState::Deleting);
    let last_purge = for_op
        .iter()
        .rev()
        .find(|e| e.r#type == v1::EventType::Purged as i32)
        .unwrap();
    assert_eq!(last_purge.resource.clone().unwrap().name, "eu-west/network/net");
    t.node.stop().await.unwrap();
}
