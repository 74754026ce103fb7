//! Cross-region deletion over real gRPC between three region nodes.

// Test code: elapsed times are real time, and are printed (`--nocapture`).
#![allow(clippy::disallowed_methods, clippy::print_stderr)]

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
        .create(spec_in(
            "rc/floating_ip/f",
            &[("project", &["rc/project/pc"]), ("port", &["rc/port/c0"])],
        ))
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
    assert!(
        deleted.contains(&"rb/port/b3") && deleted.contains(&"rc/port/c0"),
        "{deleted:?}"
    );
    assert!(plan
        .unset
        .iter()
        .any(|u| u.resource.as_ref().unwrap().name == "rc/floating_ip/f"));

    // Any node accepts the delete and forwards it to the owner.
    let op = b
        .delete(delete_req("ra/network/net", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    let done = wait_operation(a, &op.id).await;
    assert_eq!(
        v1::OperationState::try_from(done.state),
        Ok(v1::OperationState::Succeeded),
        "{done:?}"
    );
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

fn op_state(op: &v1::Operation) -> v1::OperationState {
    v1::OperationState::try_from(op.state).unwrap_or(v1::OperationState::Unspecified)
}

fn deletion_status(r: &v1::Resource) -> v1::DeletionStatus {
    r.deletion
        .as_ref()
        .and_then(|d| v1::DeletionStatus::try_from(d.status).ok())
        .unwrap_or(v1::DeletionStatus::Unspecified)
}

/// Names of the operation's outcomes with `action`, sorted.
fn outcomes_with(op: &v1::Operation, action: v1::OutcomeAction) -> Vec<String> {
    let mut names: Vec<String> = op
        .outcomes
        .iter()
        .filter(|o| o.action == action as i32)
        .map(|o| o.resource.as_ref().unwrap().name.clone())
        .collect();
    names.sort();
    names
}

fn port_on(name: &str, network: &str) -> v1::ResourceSpec {
    spec_in(name, &[("network", &[network])])
}

/// Every `(field, target uid)` any resource of the dumps references, and
/// every back-reference row's target uid.
fn uids_referenced(dumps: &[v1::DumpResponse]) -> (Vec<String>, Vec<String>) {
    let refs = dumps
        .iter()
        .flat_map(|d| d.resources.iter())
        .flat_map(|r| r.refs.iter())
        .flat_map(|f| f.targets.iter().map(|t| t.uid.clone()))
        .collect();
    let rows = dumps
        .iter()
        .flat_map(|d| d.backrefs.iter())
        .map(|b| b.target.as_ref().unwrap().uid.clone())
        .collect();
    (refs, rows)
}

async fn dump_all(c: &Cluster) -> Vec<v1::DumpResponse> {
    let mut out = Vec::new();
    for (_, endpoint) in c.endpoints() {
        out.push(dump(&endpoint).await.expect("dump"));
    }
    out
}

/// Seed 001's topology spread over three regions, plus a `block` reference
/// from C to a second network of A: the cascade of the first network
/// converges, the blocked one is refused with its blocker named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_001_topology_with_a_blocked_gateway_converges() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let (a, b, cc) = (c.client("ra"), c.client("rb"), c.client("rc"));
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
        spec_in("ra/network/ext", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    b.batch_create(
        (0..3)
            .map(|i| port_on(&format!("rb/port/b{i}"), "ra/network/net"))
            .collect(),
    )
    .await
    .unwrap();
    cc.batch_create(vec![
        spec_in("rc/project/pc", &[]),
        port_on("rc/port/c0", "ra/network/net"),
        spec_in(
            "rc/router/r",
            &[
                ("project", &["rc/project/pc"]),
                ("gateway_network", &["ra/network/ext"]),
            ],
        ),
    ])
    .await
    .unwrap();
    // (A separate call: the batch case has its own test below.)
    cc.create(spec_in(
        "rc/floating_ip/f",
        &[("project", &["rc/project/pc"]), ("port", &["rc/port/c0"])],
    ))
    .await
    .unwrap();

    // The gateway network is blocked by C's router, with or without cascade,
    // asked of its owner or of another region.
    for (via, cascade) in [(a, false), (a, true), (b, true)] {
        let err = via.delete(delete_req("ra/network/ext", cascade)).await.unwrap_err();
        assert_eq!(code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
        assert!(err.to_string().contains("rc/router/r"), "cascade={cascade}: {err}");
    }
    assert_eq!(
        state(&a.get("ra/network/ext").await.unwrap()),
        v1::ResourceState::Active
    );

    let done = delete_and_wait(a, "ra/network/net", true).await;
    assert_eq!(op_state(&done), v1::OperationState::Succeeded, "{done:?}");
    let p = done.progress.unwrap();
    assert_eq!(
        (p.deleted, p.unset, p.pending, p.blocked, p.failed),
        (5, 1, 0, 0, 0),
        "{p:?}"
    );
    assert_eq!(
        outcomes_with(&done, v1::OutcomeAction::Deleted),
        ["ra/network/net", "rb/port/b0", "rb/port/b1", "rb/port/b2", "rc/port/c0"]
    );
    assert_eq!(outcomes_with(&done, v1::OutcomeAction::Unset), ["rc/floating_ip/f"]);

    wait_gone(a, "ra/network/net").await;
    for gone in ["rb/port/b0", "rb/port/b2", "rc/port/c0"] {
        let e = b.get(gone).await.unwrap_err();
        assert_eq!(code(&e), Some(tonic::Code::NotFound), "{gone}");
    }
    let fip = cc.get("rc/floating_ip/f").await.unwrap();
    assert_eq!(state(&fip), v1::ResourceState::Active);
    assert!(targets(&fip, "port").is_empty(), "{fip:?}");
    let router = cc.get("rc/router/r").await.unwrap();
    assert_eq!(state(&router), v1::ResourceState::Active);
    assert_eq!(targets(&router, "gateway_network"), ["ra/network/ext"]);
    for kept in ["ra/project/p", "ra/network/ext"] {
        assert_eq!(state(&a.get(kept).await.unwrap()), v1::ResourceState::Active, "{kept}");
    }
    // The blocker still stands after the other cascade.
    let err = a.delete(delete_req("ra/network/ext", true)).await.unwrap_err();
    assert!(err.to_string().contains("rc/router/r"), "{err}");

    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// Seed 000 across regions: while A's network is DELETING (held by a block
/// from C), a user read shows it DELETING, a peer read answers NOT_FOUND,
/// and B cannot attach to it; after the purge the name is re-created under
/// a new uid that nothing old touches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_network_is_gone_to_peers_and_its_name_is_reusable() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let (a, b, cc) = (c.client("ra"), c.client("rb"), c.client("rc"));
    let a_endpoint = c.node("ra").node.endpoint();
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/n", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    b.batch_create(vec![
        port_on("rb/port/x0", "ra/network/n"),
        port_on("rb/port/x1", "ra/network/n"),
    ])
    .await
    .unwrap();
    // The router is not in p's closure: its project is C's.
    cc.batch_create(vec![
        spec_in("rc/project/pc", &[]),
        spec_in(
            "rc/router/r",
            &[("project", &["rc/project/pc"]), ("gateway_network", &["ra/network/n"])],
        ),
    ])
    .await
    .unwrap();
    let old = a.get("ra/network/n").await.unwrap().uid;

    let op = a
        .delete(delete_req("ra/project/p", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    let held = eventually(Duration::from_secs(10), "n to be held by C's router", || async {
        let n = a.get("ra/network/n").await.ok()?;
        (state(&n) == v1::ResourceState::Deleting && deletion_status(&n) == v1::DeletionStatus::Blocked).then_some(n)
    })
    .await;
    let blockers = &held.deletion.as_ref().unwrap().blockers;
    assert!(
        blockers
            .iter()
            .any(|bl| bl.referrer == "rc/router/r" && !bl.referrer_deleting),
        "{blockers:?}"
    );
    // B's ports were cascaded although n itself is held.
    wait_gone(b, "rb/port/x0").await;
    wait_gone(b, "rb/port/x1").await;

    // A user read through B is forwarded to the owner: DELETING, same uid.
    let seen = b.get("ra/network/n").await.unwrap();
    assert_eq!(
        (state(&seen), seen.uid.as_str()),
        (v1::ResourceState::Deleting, old.as_str())
    );
    // A repeated delete answers OK.
    let again = b.delete(delete_req("ra/network/n", true)).await.unwrap();
    assert!(again.already_deleting, "{again:?}");
    // A peer read: the resource is already gone.
    let e = peer_client(&a_endpoint)
        .await
        .lookup(v1::LookupRequest {
            name: "ra/network/n".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    // No new reference attaches to it, by name or by the old uid.
    let by_name = port_on("rb/port/late", "ra/network/n");
    let mut by_uid = port_on("rb/port/late-uid", "ra/network/n");
    by_uid.refs[0].targets[0].uid = old.clone();
    for spec in [by_name, by_uid] {
        let name = spec.name.clone();
        let e = b.create(spec).await.unwrap_err();
        assert!(
            matches!(code(&e), Some(tonic::Code::NotFound | tonic::Code::FailedPrecondition)),
            "{name}: {e}"
        );
        let e = b.get(&name).await.unwrap_err();
        assert_eq!(code(&e), Some(tonic::Code::NotFound), "{name}: {e}");
    }
    let e = a
        .create(spec_in("ra/subnet/s", &[("network", &["ra/network/n"])]))
        .await
        .unwrap_err();
    assert!(
        matches!(code(&e), Some(tonic::Code::NotFound | tonic::Code::FailedPrecondition)),
        "{e}"
    );
    let creating = b
        .list(v1::ListRequest {
            state: v1::ResourceState::Creating as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(creating.resources.is_empty(), "{creating:?}");
    let b_dump = dump(&c.node("rb").node.endpoint()).await.unwrap();
    assert!(
        b_dump.resources.iter().all(|r| !r.name.starts_with("rb/port/late")),
        "no leftover of the refused creates: {:?}",
        b_dump.resources
    );

    // Unblock: the router goes, the network and the project are purged.
    cc.delete(delete_req("rc/router/r", false)).await.unwrap();
    let done = wait_operation(a, &op.id).await;
    assert_eq!(op_state(&done), v1::OperationState::Succeeded, "{done:?}");
    let p = done.progress.unwrap();
    assert_eq!(
        (p.deleted, p.pending, p.blocked, p.failed),
        (4, 0, 0, 0),
        "p, n, x0, x1: {p:?}"
    );
    wait_gone(a, "ra/network/n").await;
    wait_gone(a, "ra/project/p").await;

    // Re-create the same names: a new incarnation.
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/n", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    let new = a.get("ra/network/n").await.unwrap().uid;
    assert_ne!(new, old);
    let x0 = b.create(port_on("rb/port/x0", "ra/network/n")).await.unwrap();
    assert_eq!(state(&x0), v1::ResourceState::Active);
    assert_eq!(x0.refs[0].targets[0].uid, new);

    wait_quiescent(&c).await;
    let dumps = dump_all(&c).await;
    let (refs, rows) = uids_referenced(&dumps);
    assert!(
        !refs.contains(&old) && !rows.contains(&old),
        "the old incarnation is not referenced"
    );
    let a_rows: Vec<_> = dumps
        .iter()
        .find(|d| d.region == "ra")
        .unwrap()
        .backrefs
        .iter()
        .filter(|r| r.target.as_ref().unwrap().uid == new)
        .map(|r| r.referrer.as_ref().unwrap().name.clone())
        .collect();
    assert_eq!(a_rows, ["rb/port/x0"], "only the new port holds the new network");
    let c_dump = dumps.iter().find(|d| d.region == "rc").unwrap();
    assert!(c_dump.resources.iter().all(|r| r
        .refs
        .iter()
        .all(|f| f.targets.iter().all(|t| t.name != "ra/network/n"))));
    assert_no_violations(&c).await;
}

/// A cascade that crosses A→B→C→A: A's project owns B's network, which owns
/// C's port, which is the last element of A's port group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cascade_chain_through_three_regions_back_to_the_first_unwinds() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let (a, b, cc) = (c.client("ra"), c.client("rb"), c.client("rc"));
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/project/keep", &[]),
        spec_in("ra/network/keep", &[("project", &["ra/project/keep"])]),
        port_on("ra/port/keep", "ra/network/keep"),
    ])
    .await
    .unwrap();
    b.create(spec_in("rb/network/n", &[("project", &["ra/project/p"])]))
        .await
        .unwrap();
    cc.create(port_on("rc/port/pt", "rb/network/n")).await.unwrap();
    a.batch_create(vec![
        spec_in("ra/port_group/g", &[("ports", &["rc/port/pt"])]),
        spec_in("ra/port_group/g2", &[("ports", &["rc/port/pt", "ra/port/keep"])]),
    ])
    .await
    .unwrap();

    let plan = a
        .delete(v1::DeleteRequest {
            dry_run: true,
            ..delete_req("ra/project/p", true)
        })
        .await
        .unwrap()
        .plan
        .unwrap();
    let mut planned: Vec<_> = plan.deleted.iter().map(|d| d.name.as_str()).collect();
    planned.sort();
    assert_eq!(
        planned,
        ["ra/port_group/g", "ra/project/p", "rb/network/n", "rc/port/pt"],
        "{plan:?}"
    );

    let done = delete_and_wait(a, "ra/project/p", true).await;
    assert_eq!(op_state(&done), v1::OperationState::Succeeded, "{done:?}");
    let p = done.progress.unwrap();
    assert_eq!((p.deleted, p.pending, p.blocked, p.failed), (4, 0, 0, 0), "{p:?}");
    assert_eq!(
        outcomes_with(&done, v1::OutcomeAction::Deleted),
        ["ra/port_group/g", "ra/project/p", "rb/network/n", "rc/port/pt"]
    );
    wait_gone(a, "ra/project/p").await;
    wait_gone(b, "rb/network/n").await;
    wait_gone(cc, "rc/port/pt").await;
    wait_gone(a, "ra/port_group/g").await;
    // The group with another port only lost the element.
    let g2 = eventually(Duration::from_secs(10), "g2 to lose C's port", || async {
        let g2 = a.get("ra/port_group/g2").await.ok()?;
        (targets(&g2, "ports") == ["ra/port/keep"]).then_some(g2)
    })
    .await;
    assert_eq!(state(&g2), v1::ResourceState::Active);
    for kept in ["ra/project/keep", "ra/network/keep", "ra/port/keep"] {
        assert_eq!(state(&a.get(kept).await.unwrap()), v1::ResourceState::Active, "{kept}");
    }

    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// B's node goes down mid-cascade: A's deletion waits on B (and says so),
/// C's part completes; B restarts on its data directory, resumes from its
/// cursor, and the deletion completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_region_resumes_the_cascade_after_restart() {
    let mut c = start_cluster(&["ra", "rb", "rc"]).await;
    {
        let (a, b, cc) = (c.client("ra"), c.client("rb"), c.client("rc"));
        a.batch_create(vec![
            spec_in("ra/project/p", &[]),
            spec_in("ra/network/n", &[("project", &["ra/project/p"])]),
        ])
        .await
        .unwrap();
        b.batch_create(
            (0..5)
                .map(|i| port_on(&format!("rb/port/b{i}"), "ra/network/n"))
                .collect(),
        )
        .await
        .unwrap();
        cc.batch_create(
            (0..2)
                .map(|i| port_on(&format!("rc/port/c{i}"), "ra/network/n"))
                .collect(),
        )
        .await
        .unwrap();
    }
    c.stop("rb").await;

    let (a, cc) = (c.client("ra"), c.client("rc"));
    let op = a
        .delete(delete_req("ra/network/n", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    wait_gone(cc, "rc/port/c0").await;
    wait_gone(cc, "rc/port/c1").await;
    let n = eventually(Duration::from_secs(10), "n to wait on rb", || async {
        let n = a.get("ra/network/n").await.ok()?;
        let msg = n.deletion.as_ref()?.message.clone();
        (deletion_status(&n) == v1::DeletionStatus::Waiting && msg.contains("rb")).then_some(n)
    })
    .await;
    assert_eq!(state(&n), v1::ResourceState::Deleting);
    let running = a.get_operation(&op.id, 100).await.unwrap();
    assert!(!running.done, "{running:?}");
    assert_eq!(op_state(&running), v1::OperationState::Running);
    assert!(running.unreachable_regions.iter().any(|r| r == "rb"), "{running:?}");

    c.restart("rb").await;
    let a = c.client("ra");
    let done = wait_operation(a, &op.id).await;
    assert_eq!(op_state(&done), v1::OperationState::Succeeded, "{done:?}");
    let p = done.progress.unwrap();
    assert_eq!((p.deleted, p.pending, p.blocked, p.failed), (8, 0, 0, 0), "{p:?}");
    assert!(done.unreachable_regions.is_empty(), "{done:?}");
    wait_gone(a, "ra/network/n").await;
    let b = c.client("rb");
    for i in 0..5 {
        wait_gone(b, &format!("rb/port/b{i}")).await;
    }
    assert_eq!(state(&a.get("ra/project/p").await.unwrap()), v1::ResourceState::Active);

    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// BatchCreate promises that "a later resource may reference an earlier
/// one"; it does not hold when the earlier one references another region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_create_may_reference_an_earlier_cross_region_resource() {
    let c = start_cluster(&["ra", "rc"]).await;
    c.client("ra")
        .batch_create(vec![
            spec_in("ra/project/p", &[]),
            spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
        ])
        .await
        .unwrap();
    let created = c
        .client("rc")
        .batch_create(vec![
            spec_in("rc/project/pc", &[]),
            port_on("rc/port/c0", "ra/network/net"),
            spec_in(
                "rc/floating_ip/f",
                &[("project", &["rc/project/pc"]), ("port", &["rc/port/c0"])],
            ),
        ])
        .await
        .unwrap();
    assert!(
        created.iter().all(|r| state(r) == v1::ResourceState::Active),
        "{created:?}"
    );
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// Issue 26: a region given as several addresses (its nodes: a writer and
/// standbys that forward to it) is reached through whichever answers.
/// Here each region lists the other as two addresses, the first a node
/// that is down (nothing listens on its port): the links come up, a
/// reference across the regions is resolved and attached, a cascade is
/// forwarded and finishes, without a call waiting on the dead node, and
/// `cascade status` shows both addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_at_two_addresses_of_which_the_first_is_down_still_links_and_cascades() {
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    }; // closed again here: a node that is down
    let c = start_cluster_with(&["ra", "rb"], |s| {
        for addresses in s.peers.values_mut() {
            let listed = [vec![down.clone()], addresses.as_slice().to_vec()].concat();
            *addresses = cascade_node::peers::PeerAddresses::new(listed).unwrap();
        }
    })
    .await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    let started = std::time::Instant::now();
    b.create(spec_in("rb/port/x", &[("network", &["ra/network/net"])]))
        .await
        .unwrap();
    let resolved = started.elapsed();
    // The dial timeout is 3 s: a create that waited on the dead node first
    // would take at least that.
    assert!(resolved < Duration::from_secs(2), "the create took {resolved:?}");
    b.create(spec_in("rb/port/y", &[("network", &["ra/network/net"])]))
        .await
        .unwrap();
    eprintln!("a create resolving its reference in ra took {resolved:?}");

    // rb's client deletes ra's network: forwarded to ra, cascaded to rb.
    let op = delete_and_wait(b, "ra/network/net", true).await;
    assert_eq!(op.state, v1::OperationState::Succeeded as i32, "{op:?}");
    for name in ["rb/port/x", "rb/port/y"] {
        wait_gone(b, name).await;
    }
    let (code, status) = cascade_status(&c.node("ra").node.endpoint()).await;
    assert_eq!(code, 0, "{status}");
    let rb = status["regions"]
        .as_array()
        .and_then(|regions| regions.iter().find(|r| r["region"] == "rb"))
        .unwrap_or_else(|| panic!("rb is not in {status}"));
    let listed = format!("{down}, {}", c.node("rb").node.endpoint());
    assert_eq!(rb["address"], listed.as_str(), "{status}");
    assert_eq!(rb["link_connected"], true, "{status}");
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// A release goes to its owner as soon as the importer has committed it,
/// not at the link's next tick: in cascade-bench's P2 each importer's
/// releases waited up to a tick (`--tick-ms` 200) before each send
/// (docs/BENCHMARKS.md, "Across regions: P5 and P2"). With ticks of ten
/// minutes, the owner's row of a port cascaded in the other region is gone
/// within seconds (before: at the importer link's next tick).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_goes_once_it_is_committed_not_at_the_links_next_tick() {
    let c = start_cluster_with(&["ra", "rb"], |s| {
        s.tick = Duration::from_secs(600);
        s.check_interval = Duration::from_secs(600);
    })
    .await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    b.create(port_on("rb/port/p0", "ra/network/net")).await.unwrap();
    // The links' first tick comes at their start; from here only a send
    // woken by the commit can deliver the release within the deadline.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let owner = c
        .endpoints()
        .into_iter()
        .find(|(r, _)| r == "ra")
        .map(|(_, e)| e)
        .expect("ra's endpoint");
    let rows_from_rb = |d: &v1::DumpResponse| {
        d.backrefs
            .iter()
            .filter(|row| row.referrer.as_ref().is_some_and(|r| r.name.starts_with("rb/")))
            .count()
    };
    assert_eq!(
        rows_from_rb(&dump(&owner).await.expect("dump")),
        1,
        "rb's port is attached"
    );
    a.delete(delete_req("ra/network/net", true)).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if rows_from_rb(&dump(&owner).await.expect("dump")) == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the owner still holds rb's row after 20 s: the release waited for the link's tick"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(b.get("rb/port/p0").await.is_err(), "the port was cascaded in rb");
}

/// The root of a cascade that reached another region goes once the writer
/// reports that it waits only for that region's part: the reconciler's
/// closure check is woken by the report, not left to its next tick (ten
/// minutes here; 200 ms in cascade-bench's P2, where every cross-region
/// cascade ended with that wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_region_cascades_root_goes_once_its_closure_is_reported_not_at_the_next_tick() {
    let c = start_cluster_with(&["ra", "rb"], |s| {
        s.tick = Duration::from_secs(600);
        s.check_interval = Duration::from_secs(600);
    })
    .await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    b.create(port_on("rb/port/p0", "ra/network/net")).await.unwrap();
    let op = a
        .delete(delete_req("ra/network/net", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while a.get("ra/network/net").await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the root still stands after 20 s: its closure check waited for the reconciler's tick"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let done = a.get_operation(&op.id, 0).await.unwrap();
    assert_eq!(
        v1::OperationState::try_from(done.state),
        Ok(v1::OperationState::Succeeded),
        "{done:?}"
    );
    assert_eq!(done.progress.unwrap().deleted, 2, "the port in rb and the network");
}

/// A cascade over ports nothing in another region references sends the
/// other regions nothing of them: each port is purged as a leaf, and its
/// PURGED event (no DELETING came before it) concerns no other region, so
/// the owner's watch leaves it out and marks how far it passed instead.
/// The other region's cursor still reaches the owner's last revision, so
/// the owner's outbox compacts past them, and past the creates after
/// them, which no other region is sent either (before, a peer's cursor
/// stayed at the last event it was sent, however many creates followed). Before, every leaf's
/// PURGED went to every other region, to move its cursor only: most of a
/// cascade's cross-region traffic in issue 28's P2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_over_local_leaves_sends_other_regions_only_its_root_and_their_cursors_follow() {
    const LEAVES: usize = 60;
    let c = start_cluster_with(&["ra", "rb"], |s| {
        s.metrics_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    })
    .await;
    let a = c.client("ra");
    let mut specs = vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/m", &[("project", &["ra/project/p"])]),
    ];
    specs.extend((0..LEAVES).map(|i| port_on(&format!("ra/port/q{i}"), "ra/network/m")));
    a.batch_create(specs).await.unwrap();
    let op = a
        .delete(delete_req("ra/network/m", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    let done = wait_operation(a, &op.id).await;
    assert_eq!(op_state(&done), v1::OperationState::Succeeded, "{done:?}");
    assert_eq!(done.progress.unwrap().deleted, LEAVES as u64 + 1);

    // And creates, which no other region is sent either: the last
    // revisions of ra's outbox are events rb is not sent.
    for i in 0..3 {
        a.create(spec_in(&format!("ra/project/after{i}"), &[])).await.unwrap();
    }
    let (a_endpoint, b_endpoint) = (c.node("ra").node.endpoint(), c.node("rb").node.endpoint());
    let last = dump(&a_endpoint).await.unwrap().last_revision;
    eventually(
        Duration::from_secs(20),
        "rb's cursor for ra to reach ra's last revision",
        || async { (dump(&b_endpoint).await.unwrap().cursors.get("ra") == Some(&last)).then_some(()) },
    )
    .await;
    // The network's DELETING and PURGED; none of its leaves'.
    assert_eq!(peer_events_received(&c, "rb", "ra", "deleting").await, 1.0);
    assert_eq!(
        peer_events_received(&c, "rb", "ra", "purged").await,
        1.0,
        "rb was sent the PURGED of leaves it could hold nothing of"
    );
}
