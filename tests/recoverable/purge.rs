//! Admin.Purge over real nodes in three regions (issue 29, item 4):
//! without force it changes nothing and answers the count and a sample;
//! with force the same members are deleted as one operation, each
//! cascading by the schema; an empty filter, a purge over the bound and a
//! forced purge with a region down are refused, changing nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use cascade_client::{AdminClient, ClientError};
use cascade_proto::v1;

use crate::support::*;

const TOKEN: &str = "purge-test-admin-token-0123";

async fn admin(c: &Cluster, region: &str) -> AdminClient {
    AdminClient::connect_with(&c.node(region).node.endpoint(), None, Some(TOKEN.to_owned()))
        .await
        .expect("admin client connects")
}

fn purge(kind: &str, selector: &str, force: bool) -> v1::PurgeRequest {
    v1::PurgeRequest {
        kind: kind.to_owned(),
        attribute_selector: selector.to_owned(),
        force,
        reason: "dev networks expire".to_owned(),
        ..Default::default()
    }
}

fn with_env(mut spec: v1::ResourceSpec, env: &str) -> v1::ResourceSpec {
    spec.attributes.insert("env".to_owned(), env.to_owned());
    spec
}

/// Every resource of the running regions as (name, uid, state, revision):
/// what "nothing changed" compares.
async fn everything(c: &Cluster) -> BTreeSet<(String, String, i32, u64)> {
    let mut all = BTreeSet::new();
    for (_, endpoint) in c.endpoints() {
        let d = dump(&endpoint).await.expect("dump");
        for r in d.resources {
            all.insert((r.name, r.uid, r.state, r.revision));
        }
    }
    all
}

fn refused(result: Result<v1::PurgeResponse, ClientError>, code: tonic::Code) -> String {
    match result {
        Err(ClientError::Status(s)) if s.code() == code => s.message().to_owned(),
        other => panic!("expected {code:?}, got {other:?}"),
    }
}

async fn state_of(c: &Cluster, name: &str) -> Option<(i32, i32)> {
    let region = name.split('/').next().expect("region");
    let r = c.client(region).get(name).await.ok()?;
    Some((r.state, r.deletion.map_or(0, |d| d.status)))
}

/// The same members the count named are the ones deleted: dev networks in
/// two regions, with their subnets and ports (cascade, one across regions)
/// going too, a floating IP losing its port (unset), and a router's
/// gateway (block) holding its network until the router goes; the
/// operation then finishes with an outcome per resource, and the checker
/// is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_counts_without_force_and_deletes_the_same_members_with_it() {
    let c = start_cluster_with(&["ra", "rb", "rc"], |s| {
        s.admin.token = Some(TOKEN.to_owned());
        s.policy.backoff_base_ms = 50;
        s.limits.max_purge_members = 2;
    })
    .await;
    let (a, b, cc) = (c.client("ra"), c.client("rb"), c.client("rc"));
    a.create(spec_in("ra/project/p", &[])).await.unwrap();
    a.create(with_env(
        spec_in("ra/network/dev1", &[("project", &["ra/project/p"])]),
        "dev",
    ))
    .await
    .unwrap();
    a.create(with_env(
        spec_in("ra/network/prod1", &[("project", &["ra/project/p"])]),
        "prod",
    ))
    .await
    .unwrap();
    a.create(spec_in("ra/subnet/s1", &[("network", &["ra/network/dev1"])]))
        .await
        .unwrap();
    b.create(with_env(
        spec_in("rb/network/dev2", &[("project", &["ra/project/p"])]),
        "dev",
    ))
    .await
    .unwrap();
    b.create(spec_in("rb/port/x1", &[("network", &["rb/network/dev2"])]))
        .await
        .unwrap();
    cc.create(spec_in("rc/port/y1", &[("network", &["ra/network/dev1"])]))
        .await
        .unwrap();
    cc.create(spec_in(
        "rc/floating_ip/f1",
        &[("project", &["ra/project/p"]), ("port", &["rb/port/x1"])],
    ))
    .await
    .unwrap();
    cc.create(spec_in(
        "rc/router/r1",
        &[
            ("project", &["ra/project/p"]),
            ("gateway_network", &["rb/network/dev2"]),
        ],
    ))
    .await
    .unwrap();
    let root = admin(&c, "rc").await;
    let before = everything(&c).await;

    // Without force: the count and the sample, from every region, through
    // a region with no match; nothing changes.
    let counted = root.purge(purge("network", "env=dev", false)).await.unwrap();
    assert_eq!(counted.purge_count, 2, "{counted:?}");
    assert_eq!(counted.purge_sample, vec!["ra/network/dev1", "rb/network/dev2"]);
    assert!(!counted.count_is_lower_bound);
    assert!(counted.unreachable_regions.is_empty(), "{counted:?}");
    assert!(counted.operation.is_none());
    let per_region: Vec<(&str, u64)> = counted
        .regions
        .iter()
        .map(|r| (r.region.as_str(), r.purge_count))
        .collect();
    assert_eq!(per_region, vec![("ra", 1), ("rb", 1), ("rc", 0)]);
    let networks = root.purge(purge("network", "", false)).await.unwrap();
    assert_eq!(networks.purge_count, 3, "{networks:?}");
    let one_region = root
        .purge(v1::PurgeRequest {
            region: "rb".into(),
            ..purge("network", "", false)
        })
        .await
        .unwrap();
    assert_eq!(
        (one_region.purge_count, one_region.purge_sample.clone()),
        (1, vec!["rb/network/dev2".to_owned()])
    );

    // Refused, changing nothing: an empty filter, and a forced purge of
    // more than max_purge_members (2 here).
    let empty = refused(root.purge(purge("", "", true)).await, tonic::Code::InvalidArgument);
    assert!(empty.contains("a purge needs a kind"), "{empty}");
    let too_many = refused(
        root.purge(purge("network", "", true)).await,
        tonic::Code::FailedPrecondition,
    );
    assert!(
        too_many.contains("matches 3 resources") && too_many.contains("[limits] max_purge_members"),
        "{too_many}"
    );
    assert_eq!(
        everything(&c).await,
        before,
        "a purge without force, or refused, changed something"
    );

    // With force: one operation, both members started.
    let forced = root.purge(purge("network", "env=dev", true)).await.unwrap();
    assert_eq!(forced.purge_count, 2, "{forced:?}");
    let started: Vec<(&str, u64)> = forced.regions.iter().map(|r| (r.region.as_str(), r.started)).collect();
    assert_eq!(started, vec![("ra", 1), ("rb", 1), ("rc", 0)]);
    let op = forced.operation.expect("an operation");
    let root_name = op.root.as_ref().map(|r| r.name.clone()).unwrap_or_default();
    assert_eq!(root_name, format!("rc/purge/{}", op.id));
    assert!(
        op.requested_by.contains("kind=network") && op.requested_by.contains("env=dev"),
        "{op:?}"
    );

    // The cascade follows the schema: subnets and ports go (y1 from rc,
    // across regions), f1 loses its port, dev2 waits for r1's block.
    for gone in ["ra/network/dev1", "ra/subnet/s1", "rc/port/y1", "rb/port/x1"] {
        wait_gone(c.client(gone.split('/').next().unwrap()), gone).await;
    }
    eventually(Duration::from_secs(30), "f1 to lose its port", || async {
        let f1 = cc.get("rc/floating_ip/f1").await.ok()?;
        targets(&f1, "port").is_empty().then_some(())
    })
    .await;
    eventually(Duration::from_secs(30), "dev2 to be held by r1", || async {
        let (state, status) = state_of(&c, "rb/network/dev2").await?;
        (state == v1::ResourceState::Deleting as i32 && status == v1::DeletionStatus::Blocked as i32).then_some(())
    })
    .await;
    let running = a.get_operation(&op.id, 100).await.unwrap();
    assert!(!running.done, "dev2 is still held: {running:?}");
    for untouched in ["ra/network/prod1", "ra/project/p", "rc/router/r1", "rc/floating_ip/f1"] {
        let (state, _) = state_of(&c, untouched).await.expect(untouched);
        assert_eq!(state, v1::ResourceState::Active as i32, "{untouched}");
    }

    // The blocker goes: the purge finishes, an outcome per resource.
    cc.delete(delete_req("rc/router/r1", false)).await.unwrap();
    let done = wait_operation(b, &op.id).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    let deleted: BTreeSet<&str> = done
        .outcomes
        .iter()
        .filter(|o| o.action == v1::OutcomeAction::Deleted as i32)
        .filter_map(|o| o.resource.as_ref().map(|r| r.name.as_str()))
        .collect();
    let expected: BTreeSet<&str> = [
        "ra/network/dev1",
        "ra/subnet/s1",
        "rb/network/dev2",
        "rb/port/x1",
        "rc/port/y1",
    ]
    .into_iter()
    .collect();
    assert_eq!(deleted, expected, "{done:?}");
    assert!(
        done.outcomes.iter().any(|o| o.action == v1::OutcomeAction::Unset as i32
            && o.resource.as_ref().is_some_and(|r| r.name == "rc/floating_ip/f1")),
        "{done:?}"
    );
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;

    // Audited where each part started: who, the filter, the operation.
    for region in ["rc", "ra", "rb"] {
        let log = root
            .list_audit(v1::ListAuditRequest {
                region: region.into(),
                action: "Purge (force)".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .entries;
        let ok: Vec<&v1::AuditEntry> = log.iter().filter(|e| e.outcome.starts_with("ok")).collect();
        assert_eq!(ok.len(), 1, "{region}: {log:?}");
        assert!(ok[0].target.contains("kind=network"), "{region}: {:?}", ok[0]);
        assert!(ok[0].outcome.contains(&op.id), "{region}: {:?}", ok[0]);
    }
    let log = root
        .list_audit(v1::ListAuditRequest {
            region: "rc".into(),
            action: "Purge (force)".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .entries;
    assert!(
        log.iter()
            .any(|e| e.outcome.starts_with("FailedPrecondition") && e.outcome.contains("max_purge_members")),
        "the refused purge is audited: {log:?}"
    );
}

/// A region down is named in the count, never skipped; a forced purge is
/// then refused and nothing changes in the regions that answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_down_is_named_and_a_forced_purge_then_starts_nothing() {
    let mut c = start_cluster_with(&["ra", "rb", "rc"], |s| {
        s.admin.token = Some(TOKEN.to_owned());
    })
    .await;
    c.client("ra").create(spec_in("ra/project/p", &[])).await.unwrap();
    c.client("rb").create(spec_in("rb/qos_policy/q1", &[])).await.unwrap();
    c.client("rc").create(spec_in("rc/qos_policy/q2", &[])).await.unwrap();
    c.stop("rc").await;
    let root = admin(&c, "ra").await;
    let before = everything(&c).await;
    let counted = root.purge(purge("qos_policy", "", false)).await.unwrap();
    assert_eq!(counted.unreachable_regions, vec!["rc"], "{counted:?}");
    assert_eq!(counted.purge_count, 1, "{counted:?}");
    let rc = counted.regions.iter().find(|r| r.region == "rc").expect("rc is listed");
    assert!(!rc.error.is_empty(), "{rc:?}");
    let why = refused(
        root.purge(purge("qos_policy", "", true)).await,
        tonic::Code::Unavailable,
    );
    assert!(why.contains("rc") && why.contains("nothing was started"), "{why}");
    assert_eq!(everything(&c).await, before, "a refused forced purge changed something");
    // Naming the regions that answer purges them.
    let forced = root
        .purge(v1::PurgeRequest {
            region: "rb".into(),
            ..purge("qos_policy", "", true)
        })
        .await
        .unwrap();
    let op = forced.operation.expect("an operation");
    wait_gone(c.client("rb"), "rb/qos_policy/q1").await;
    let done = wait_operation(c.client("ra"), &op.id).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    assert_eq!(
        done.root.as_ref().map(|r| r.name.clone()),
        Some(format!("rb/purge/{}", op.id))
    );
}
