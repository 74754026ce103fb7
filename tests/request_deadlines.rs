//! A client's deadline bounds the calls to other regions a node makes for
//! its request (README, "Creates across regions"): the Lookup of a
//! reference's target and the Attach at its owner give up when the client's
//! time runs out, not after the node's own bound on a peer call (10 s), and
//! the client hears DEADLINE_EXCEEDED naming the region, with the create
//! refused whole: nothing left CREATING behind it. So does a delete whose
//! question to another region (KeepsAnotherTarget) is not answered in time.
//!
//! A call about another region's resource or an Admin call about another
//! region (Get, Delete, Create, ListDeletions, ForcePurge, …) that its node
//! forwards there keeps to the client's deadline the same way, and a
//! forwarded change refused for time has not happened: held on the way, it
//! reaches the owner after its forwarder gave up and is refused there.
//!
//! Real nodes on loopback; one region reaches the other through a fault proxy
//! (`tests/support/fault_proxy.rs`) that holds every byte, as a partition
//! shorter than TCP's timeout does.

// Test code: elapsed times are real time, and are printed (`--nocapture`).
#![allow(clippy::disallowed_methods, clippy::print_stdout)]

mod support;

use std::time::{Duration, Instant};

use cascade_proto::v1;
use cascade_proto::v1::admin_client::AdminClient;
use cascade_proto::v1::resources_client::ResourcesClient;
use support::fault_proxy::Fault;
use support::*;
use tonic::transport::Channel;

/// The client's own deadline.
const CLIENT_DEADLINE: Duration = Duration::from_secs(2);

/// What "about the client's deadline" means on a busy machine: well below
/// the node's own bound on one peer call (10 s), which a create waited out
/// before (and the client's channel cut it at its deadline with CANCELLED).
const ANSWERED_WITHIN: Duration = Duration::from_secs(3);

/// A reference to `name` pinned to `uid` (no Lookup: the create goes
/// straight to its CREATING write and the Attach), or unpinned.
fn target(name: &str, uid: Option<&str>) -> v1::ObjectRef {
    v1::ObjectRef {
        name: name.to_owned(),
        uid: uid.unwrap_or_default().to_owned(),
        ..Default::default()
    }
}

fn port(name: &str, network: v1::ObjectRef) -> v1::ResourceSpec {
    v1::ResourceSpec {
        name: name.to_owned(),
        refs: vec![v1::ReferenceField {
            field: "network".to_owned(),
            targets: vec![network],
        }],
        ..Default::default()
    }
}

/// A Create sent to `endpoint` with the client's deadline
/// ([`CLIENT_DEADLINE`], as `grpc-timeout`): its error and how long it took.
async fn create_with_deadline(endpoint: &str, spec: v1::ResourceSpec) -> (tonic::Status, Duration) {
    let mut client: ResourcesClient<Channel> = ResourcesClient::connect(endpoint.to_owned())
        .await
        .expect("client connects");
    let mut request = tonic::Request::new(v1::CreateRequest { resource: Some(spec) });
    request.set_timeout(CLIENT_DEADLINE);
    let started = Instant::now();
    let answer = client.create(request).await;
    let took = started.elapsed();
    match answer {
        Ok(created) => panic!("the owner of the reference is held, yet the create answered {created:?}"),
        Err(status) => (status, took),
    }
}

/// The client's deadline ran out waiting for region `region`: the node
/// says so itself, DEADLINE_EXCEEDED naming the region, before the client's
/// channel gives up (which says CANCELLED "Timeout expired").
fn assert_deadline_exceeded_naming(status: &tonic::Status, region: &str, took: Duration) {
    assert_eq!(
        status.code(),
        tonic::Code::DeadlineExceeded,
        "{status:?} after {took:?}"
    );
    let details = cascade_proto::error_details(status).unwrap_or_else(|| panic!("no details in {status:?}"));
    assert_eq!(details.region, region, "{status:?}");
    assert_eq!(details.reason, v1::ErrorReason::RegionUnavailable as i32, "{status:?}");
    assert!(took < ANSWERED_WITHIN, "answered after {took:?}: {status:?}");
}

/// What a region's dump holds of `name`: its state, if it is there at all
/// (CREATING included, which a Get does not show).
async fn stored_state(endpoint: &str, name: &str) -> Option<v1::ResourceState> {
    let d = dump(endpoint).await.expect("dump");
    d.resources.iter().find(|r| r.name == name).map(state)
}

/// Region rb creates ports on ra's network while rb's connection to ra is
/// held: with the reference's uid pinned the create is written CREATING
/// and waits on the Attach; unpinned it waits on the Lookup; through ra it
/// is forwarded to rb with the client's deadline and waits there. Each
/// time the client hears DEADLINE_EXCEEDED naming ra within about its
/// deadline, and rb holds nothing of the port (not even CREATING, invisible
/// to a Get, that only a retry or the reconciler would settle). Once ra can
/// be asked again, the same creates succeed afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_region_create_gives_up_at_its_clients_deadline_and_leaves_nothing_behind() {
    let pc = start_cluster_behind_proxies(&["ra", "rb"], |_| {}).await;
    let a = pc.cluster.client("ra");
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
    ])
    .await
    .expect("ra's network");
    let net = a.get("ra/network/net").await.expect("ra's network").uid;
    let rb = pc.cluster.node("rb").node.endpoint();
    let ra = pc.cluster.node("ra").node.endpoint();
    // rb has asked ra once (its channel is up): the hold meets a live connection.
    pc.cluster
        .client("rb")
        .create(port("rb/port/warm", target("ra/network/net", None)))
        .await
        .expect("a create while ra answers");

    pc.peer_proxy("rb", "ra").set(Fault::Hold);
    let creates = [
        (
            "Attach (pinned uid)",
            &rb,
            port("rb/port/attach", target("ra/network/net", Some(&net))),
        ),
        (
            "Lookup (unpinned)",
            &rb,
            port("rb/port/lookup", target("ra/network/net", None)),
        ),
        (
            "forwarded by ra",
            &ra,
            port("rb/port/forwarded", target("ra/network/net", Some(&net))),
        ),
    ];
    for (what, endpoint, spec) in &creates {
        let (status, took) = create_with_deadline(endpoint, spec.clone()).await;
        println!("create waiting on {what} with a {CLIENT_DEADLINE:?} deadline: {took:?}, {status:?}");
        assert_deadline_exceeded_naming(&status, "ra", took);
        // Refused whole, at once: not CREATING waiting for a settle.
        assert_eq!(
            stored_state(&rb, &spec.name).await,
            None,
            "{what}: rb still holds {}",
            spec.name
        );
    }
    let d = dump(&rb).await.expect("rb's dump");
    assert_eq!(d.pending_attach, 0, "no create of rb is left to settle");

    // ra answers again: the very same creates succeed, as fresh creates.
    pc.peer_proxy("rb", "ra").set(Fault::Pass);
    let b = pc.cluster.client("rb");
    for (what, _, spec) in creates {
        let created = eventually(
            Duration::from_secs(20),
            &format!("{what}: a retry to create it"),
            || async {
                match b.create(spec.clone()).await {
                    Ok(r) => Some(r),
                    Err(e) if code(&e) == Some(tonic::Code::Unavailable) => None,
                    Err(e) => panic!("{what}: a retry once ra answers should create it afresh: {e}"),
                }
            },
        )
        .await;
        assert_eq!(state(&created), v1::ResourceState::Active, "{what}");
    }
    wait_quiescent(&pc.cluster).await;
    assert_no_violations(&pc.cluster).await;
}

/// A delete without cascade of ra's port asks rb, where a port group lists
/// it (a `cascade` list owner), whether the group keeps another port. With
/// ra's connection to rb held, the client's deadline bounds that question
/// as it bounds a create's: DEADLINE_EXCEEDED naming rb within about the
/// deadline, and nothing deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_that_asks_another_region_gives_up_at_its_clients_deadline_and_deletes_nothing() {
    let pc = start_cluster_behind_proxies(&["ra", "rb"], |_| {}).await;
    let a = pc.cluster.client("ra");
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
        spec_in("ra/port/p1", &[("network", &["ra/network/net"])]),
    ])
    .await
    .expect("ra's port");
    pc.cluster
        .client("rb")
        .create(spec_in("rb/port_group/g", &[("ports", &["ra/port/p1"])]))
        .await
        .expect("rb's group of ra's port");

    pc.peer_proxy("ra", "rb").set(Fault::Hold);
    let mut client: ResourcesClient<Channel> = ResourcesClient::connect(pc.cluster.node("ra").node.endpoint())
        .await
        .expect("client connects");
    let mut request = tonic::Request::new(delete_req("ra/port/p1", false));
    request.set_timeout(CLIENT_DEADLINE);
    let started = Instant::now();
    let status = client
        .delete(request)
        .await
        .expect_err("rb, which must say whether its group keeps another port, is held");
    let took = started.elapsed();
    println!("delete without cascade waiting on KeepsAnotherTarget with a {CLIENT_DEADLINE:?} deadline: {took:?}, {status:?}");
    assert_deadline_exceeded_naming(&status, "rb", took);
    let port = a.get("ra/port/p1").await.expect("the port is still there");
    assert!(port.deletion.is_none(), "nothing deleted: {port:?}");

    pc.peer_proxy("ra", "rb").set(Fault::Pass);
    wait_quiescent(&pc.cluster).await;
    assert_no_violations(&pc.cluster).await;
}

/// A Get of a resource with an `allow_dangling` reference into another
/// region asks that region whether the target still exists (the local view
/// cannot tell once its tombstone is gone). With rb's connection to ra held,
/// the client's deadline bounds that question too: the Get answers before
/// the deadline with the reference as the local view has it, rather than
/// waiting out the 2 s the question is given without a deadline (after
/// which the client's channel had given up, CANCELLED).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_that_asks_another_region_answers_within_its_clients_deadline() {
    let pc = start_cluster_behind_proxies(&["ra", "rb"], |_| {}).await;
    pc.cluster
        .client("ra")
        .create(spec_in("ra/qos_policy/gold", &[]))
        .await
        .expect("ra's policy");
    let b = pc.cluster.client("rb");
    b.batch_create(vec![
        spec_in("rb/project/p", &[]),
        spec_in("rb/network/local", &[("project", &["rb/project/p"])]),
        spec_in(
            "rb/port/x",
            &[
                ("network", &["rb/network/local"]),
                ("qos_policy", &["ra/qos_policy/gold"]),
            ],
        ),
    ])
    .await
    .expect("rb's port on ra's policy");

    pc.peer_proxy("rb", "ra").set(Fault::Hold);
    let mut client: ResourcesClient<Channel> = ResourcesClient::connect(pc.cluster.node("rb").node.endpoint())
        .await
        .expect("client connects");
    let mut request = tonic::Request::new(v1::GetRequest {
        name: "rb/port/x".to_owned(),
        ..Default::default()
    });
    request.set_timeout(CLIENT_DEADLINE);
    let started = Instant::now();
    let got = client.get(request).await;
    let took = started.elapsed();
    println!("get asking ra about an allow_dangling target with a {CLIENT_DEADLINE:?} deadline: {took:?}");
    let port = got.expect("answered within the client's deadline").into_inner();
    assert!(took < CLIENT_DEADLINE, "{took:?}");
    let qos = port
        .refs
        .iter()
        .find(|f| f.field == "qos_policy")
        .expect("qos_policy kept");
    assert_eq!(
        (qos.targets[0].name.as_str(), qos.targets[0].dangling),
        ("ra/qos_policy/gold", false),
        "as the local view has it"
    );
    pc.peer_proxy("rb", "ra").set(Fault::Pass);
}

/// The `[admin] token` of the cluster of the Admin test.
const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// An Admin call with the administrator's token and the client's deadline
/// ([`CLIENT_DEADLINE`]).
fn as_admin<M>(message: M) -> tonic::Request<M> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CLIENT_DEADLINE);
    let bearer = format!("Bearer {ADMIN_TOKEN}").parse().expect("an ASCII header");
    request.metadata_mut().insert("authorization", bearer);
    request
}

/// An administrator asks ra's node about rb's DELETING project (held by a
/// finalizer) while ra's connection to rb is held: ListDeletions and a
/// ForcePurge, each forwarded to rb, answer DEADLINE_EXCEEDED naming rb
/// within about the client's deadline, rather than waiting out the 30 s a
/// forward is given without one (the client's own channel gave up first,
/// CANCELLED). Once rb answers again, the held ForcePurge reaches it after
/// its forwarder gave up: rb refuses it, and the project is still
/// DELETING, held by its finalizer, not forced, with no ForcePurge carried
/// out in rb's audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_call_forwarded_to_a_held_region_gives_up_at_its_clients_deadline_and_changes_nothing() {
    let pc = start_cluster_behind_proxies(&["ra", "rb"], |s| s.admin.token = Some(ADMIN_TOKEN.to_owned())).await;
    let b = pc.cluster.client("rb");
    let mut project = spec_in("rb/project/p", &[]);
    project.finalizers = vec!["dns".to_owned()];
    b.create(project).await.expect("rb's project");
    b.delete(delete_req("rb/project/p", false))
        .await
        .expect("its deletion, held by its finalizer");
    let mut admin = AdminClient::connect(pc.cluster.node("ra").node.endpoint())
        .await
        .expect("admin client connects");
    let deletions = || v1::ListDeletionsRequest {
        region: "rb".to_owned(),
        ..Default::default()
    };
    // ra has forwarded an Admin call to rb once (its channel is up): the
    // hold meets a live connection.
    let listed = admin
        .list_deletions(as_admin(deletions()))
        .await
        .expect("rb's deletions through ra")
        .into_inner();
    let names: Vec<_> = listed
        .deletions
        .iter()
        .filter_map(|d| d.resource.as_ref())
        .map(|r| r.name.clone())
        .collect();
    assert_eq!(names, ["rb/project/p"]);

    pc.peer_proxy("ra", "rb").set(Fault::Hold);
    let started = Instant::now();
    let status = admin
        .list_deletions(as_admin(deletions()))
        .await
        .expect_err("rb, which owns the deletions, is held");
    let took = started.elapsed();
    println!("ListDeletions forwarded to a held region with a {CLIENT_DEADLINE:?} deadline: {took:?}, {status:?}");
    assert_deadline_exceeded_naming(&status, "rb", took);

    let force = v1::ForcePurgeRequest {
        name: "rb/project/p".to_owned(),
        reason: "the test forces it while rb is held".to_owned(),
        force: true,
    };
    let started = Instant::now();
    let status = admin
        .force_purge(as_admin(force))
        .await
        .expect_err("rb, which owns the project, is held");
    let took = started.elapsed();
    println!("ForcePurge forwarded to a held region with a {CLIENT_DEADLINE:?} deadline: {took:?}, {status:?}");
    assert_deadline_exceeded_naming(&status, "rb", took);

    // rb answers again: the held ForcePurge reaches it now, after its
    // forwarder gave up (its stream reset behind it), and is refused: it
    // changes nothing, and rb's audit log says so. (Before rb checked the
    // instant its forwarder gave up, it was carried out here: "ForcePurge
    // (force)", "ok"; and before the refusal was audited in a task of its
    // own, the reset dropped its entry.)
    pc.peer_proxy("ra", "rb").set(Fault::Pass);
    let audit = v1::ListAuditRequest {
        region: "rb".to_owned(),
        ..Default::default()
    };
    let forced = eventually(Duration::from_secs(20), "the late ForcePurge in rb's audit log", || {
        let (mut admin, audit) = (admin.clone(), audit.clone());
        async move {
            let log = admin.list_audit(as_admin(audit)).await.ok()?.into_inner();
            let forced: Vec<_> = log
                .entries
                .into_iter()
                .filter(|e| e.action.starts_with("ForcePurge"))
                .collect();
            (!forced.is_empty()).then_some(forced)
        }
    })
    .await;
    println!("rb's audit log of the late ForcePurge: {forced:?}");
    assert!(
        forced.iter().all(|e| e.outcome.starts_with("DeadlineExceeded")),
        "a ForcePurge refused for time was carried out when it reached rb: {forced:?}"
    );
    let project = b.get("rb/project/p").await.expect("the project is still there");
    assert_eq!(project.finalizers, ["dns"], "its finalizer still holds it: {project:?}");
    let deletion = project.deletion.expect("still DELETING");
    assert!(deletion.forced.is_none(), "not forced: {deletion:?}");
}

/// `message` with the client's deadline ([`CLIENT_DEADLINE`]) as its
/// `grpc-timeout`.
fn within_deadline<M>(message: M) -> tonic::Request<M> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CLIENT_DEADLINE);
    request
}

/// A Resources client of `region`'s node (not through its client proxy).
async fn resources_at(pc: &ProxiedCluster, region: &str) -> ResourcesClient<Channel> {
    ResourcesClient::connect(pc.cluster.node(region).node.endpoint())
        .await
        .expect("client connects")
}

/// Polls `check` for `limit`, every time asserting that it holds (`what`
/// says what it is): a late change would show within that time.
async fn holds_throughout<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Err(seen) = check().await {
            panic!("{what}: {seen}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// ra's node forwards a Get, a List and a GetHistory about rb to rb while
/// ra's connection to rb is held: each answers DEADLINE_EXCEEDED naming rb
/// within about the client's deadline. (Before they went through the
/// forward that keeps to it, they answered UNAVAILABLE "got no answer
/// within 1.8s": a client could not tell its own deadline from a region
/// that is down.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_forwarded_to_a_held_owner_answers_deadline_exceeded_naming_it() {
    let pc = start_cluster_behind_proxies(&["ra", "rb"], |_| {}).await;
    pc.cluster
        .client("rb")
        .create(spec_in("rb/project/p", &[]))
        .await
        .expect("rb's project");
    let mut client = resources_at(&pc, "ra").await;
    let get = || v1::GetRequest {
        name: "rb/project/p".to_owned(),
        ..Default::default()
    };
    // ra has forwarded a call to rb once (its channel is up): the hold
    // meets a live connection.
    client
        .get(within_deadline(get()))
        .await
        .expect("rb's project through ra");

    pc.peer_proxy("ra", "rb").set(Fault::Hold);
    let started = Instant::now();
    let status = client.get(within_deadline(get())).await.expect_err("rb is held");
    let took = started.elapsed();
    println!("Get forwarded to a held owner with a {CLIENT_DEADLINE:?} deadline: {took:?}, {status:?}");
    assert_deadline_exceeded_naming(&status, "rb", took);

    let list = v1::ListRequest {
        region: "rb".to_owned(),
        ..Default::default()
    };
    let started = Instant::now();
    let status = client.list(within_deadline(list)).await.expect_err("rb is held");
    let took = started.elapsed();
    println!("List forwarded to a held owner with a {CLIENT_DEADLINE:?} deadline: {took:?}, {status:?}");
    assert_deadline_exceeded_naming(&status, "rb", took);

    let history = v1::GetHistoryRequest {
        name: "rb/project/p".to_owned(),
        ..Default::default()
    };
    let started = Instant::now();
    let status = client
        .get_history(within_deadline(history))
        .await
        .expect_err("rb is held");
    let took = started.elapsed();
    println!("GetHistory forwarded to a held owner with a {CLIENT_DEADLINE:?} deadline: {took:?}, {status:?}");
    assert_deadline_exceeded_naming(&status, "rb", took);
    pc.peer_proxy("ra", "rb").set(Fault::Pass);
}

/// ra's node forwards a Delete of rb's project, and a Create of another,
/// to rb while ra's connection to rb is held: each answers
/// DEADLINE_EXCEEDED naming rb within about the client's deadline. Once rb
/// answers again, both reach it after their forwarder gave up (their
/// streams reset behind them) and are refused there: for seconds after,
/// the project is still there and not DELETING, the other was never
/// created (not even CREATING), and rb's audit log has each as a refusal
/// for time. (Before rb checked the instant its forwarder gave up, the
/// late Delete was carried out here, after the client was told it failed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_forwarded_to_a_held_owner_gives_up_at_its_clients_deadline_and_is_not_carried_out_late() {
    let pc = start_cluster_behind_proxies(&["ra", "rb"], |s| s.admin.token = Some(ADMIN_TOKEN.to_owned())).await;
    let b = pc.cluster.client("rb");
    b.create(spec_in("rb/project/kept", &[])).await.expect("rb's project");
    let mut client = resources_at(&pc, "ra").await;
    // ra's channel to rb is up: the hold meets a live connection.
    client
        .get(within_deadline(v1::GetRequest {
            name: "rb/project/kept".to_owned(),
            ..Default::default()
        }))
        .await
        .expect("rb's project through ra");

    pc.peer_proxy("ra", "rb").set(Fault::Hold);
    let started = Instant::now();
    let status = client
        .delete(within_deadline(delete_req("rb/project/kept", false)))
        .await
        .expect_err("rb, which owns the project, is held");
    let took = started.elapsed();
    println!("Delete forwarded to a held owner with a {CLIENT_DEADLINE:?} deadline: {took:?}, {status:?}");
    assert_deadline_exceeded_naming(&status, "rb", took);

    let create = v1::CreateRequest {
        resource: Some(spec_in("rb/project/late", &[])),
    };
    let started = Instant::now();
    let status = client
        .create(within_deadline(create))
        .await
        .expect_err("rb, which would own the project, is held");
    let took = started.elapsed();
    println!("Create forwarded to a held owner with a {CLIENT_DEADLINE:?} deadline: {took:?}, {status:?}");
    assert_deadline_exceeded_naming(&status, "rb", took);

    // rb answers again: the held Delete and Create reach it now.
    pc.peer_proxy("ra", "rb").set(Fault::Pass);
    let rb = pc.cluster.node("rb").node.endpoint();
    holds_throughout(
        Duration::from_secs(3),
        "a change its client was told DEADLINE_EXCEEDED for was carried out when it reached rb",
        || async {
            let kept = b
                .get("rb/project/kept")
                .await
                .map_err(|e| format!("the project: {e}"))?;
            if let Some(deletion) = kept.deletion {
                return Err(format!("the project is DELETING: {deletion:?}"));
            }
            match stored_state(&rb, "rb/project/late").await {
                None => Ok(()),
                Some(state) => Err(format!("rb/project/late is stored, {state:?}")),
            }
        },
    )
    .await;

    // Refused, and audited as refusals are.
    let admin = AdminClient::connect(rb).await.expect("admin client connects");
    let late = eventually(Duration::from_secs(20), "rb's audit log of the late changes", || {
        let mut admin = admin.clone();
        async move {
            let log = admin
                .list_audit(as_admin(v1::ListAuditRequest::default()))
                .await
                .ok()?
                .into_inner();
            let late: Vec<_> = log
                .entries
                .into_iter()
                .filter(|e| {
                    (e.action == "delete" && e.target == "rb/project/kept")
                        || (e.action == "create" && e.target == "rb/project/late")
                })
                .collect();
            (late.len() >= 2).then_some(late)
        }
    })
    .await;
    println!("rb's audit log of the late changes: {late:?}");
    assert!(
        late.iter().all(|e| e.outcome.starts_with("DeadlineExceeded")),
        "each refused for time: {late:?}"
    );
    wait_quiescent(&pc.cluster).await;
    assert_no_violations(&pc.cluster).await;
}
