//! Cross-region deletion over real gRPC between three region nodes.

mod support;

use std::time::Duration;

use cascade_proto::v1;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_in_a_with_ports_in_b_and_c_cascades_across_regions() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let a = c.client("ra");
    let b = c.client("rb");
    let cc = c.client("rc");
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    b.batch_create(vec![spec_in("rb/project/pb", &[])]).await.unwrap();
    for i in 0..5 {
        b.create(spec_in(&format!("rb/port/b{i}"), &[("network", &["ra/network/net"])]))
            .await
            .unwrap();
    }
    cc.batch_create(vec![
        spec_in("rc/project/pc", &[]),
        spec_in("rc/port/c0", &[("network", &["ra/network/net"])]),
    ])
    .await
    .unwrap();
    let fip = cc
        .create(spec_in("rc/floating_ip/f", &[("project", &["rc/project/pc"]), ("port", &["rc/port/c0"])]))
        .await
        .unwrap();
    assert_eq!(state(&fip), v1::ResourceState::Active);
    // A port in B is ACTIVE and points at A's network by uid.
    let port = b.get("rb/port/b0").await.unwrap();
    assert_eq!(state(&port), v1::ResourceState::Active);
    let net = a.get("ra/network/net").await.unwrap();
    assert_eq!(port.refs[0].targets[0].uid, net.uid);

    // Without cascade the remote dependents are listed.
    let err = a.delete(delete_req("ra/network/net", false)).await.unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    assert!(err.to_string().contains("rb/port/b0"), "{err}");

    // Dry run spans the regions.
    let plan = a
        .delete(v1::DeleteRequest {
            dry_run: true,
            ..delete_req("ra/network/net", true)
        })
        .await
        .unwrap()
        .plan
        .unwrap();
    let deleted: Vec<_> = plan.deleted.iter().map(|d| d.name.as_str()).collect();
    assert!(deleted.contains(&"rb/port/b3") && deleted.contains(&"rc/port/c0"), "{deleted:?}");
    assert!(plan.unset.iter().any(|u| u.resource.as_ref().unwrap().name == "rc/floating_ip/f"));

    // Any node accepts the delete and forwards it to the owner.
    let op = b.delete(delete_req("ra/network/net", true)).await.unwrap().operation.unwrap();
    let done = wait_operation(a, &op.id).await;
    assert_eq!(v1::OperationState::try_from(done.state), Ok(v1::OperationState::Succeeded), "{done:?}");
    let p = done.progress.unwrap();
    assert_eq!(p.deleted, 7, "network + 5 ports in B + 1 port in C: {p:?}");
    assert_eq!(p.unset, 1, "{p:?}");
    wait_gone(a, "ra/network/net").await;
    for gone in ["rb/port/b0", "rb/port/b4", "rc/port/c0"] {
        let e = c.client("ra").get(gone).await.unwrap_err();
        assert_eq!(code(&e), Some(tonic::Code::NotFound), "{gone}");
    }
    let fip = cc.get("rc/floating_ip/f").await.unwrap();
    assert!(targets(&fip, "port").is_empty());
    let _ = Duration::from_secs(1);
}
