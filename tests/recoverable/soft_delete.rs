//! Soft delete with a window: a cascade deleted with a retention keeps its
//! members, in every region, DELETED (hidden from Get and List, listed with
//! `show_deleted`, their names reserved) until the window ends, then purges
//! them; its unset referrers survive; the checker finds nothing wrong.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::{Client, ClientError};
use cascade_proto::status::error_details;
use cascade_proto::v1;

use crate::support::*;

pub(crate) fn details(e: &ClientError) -> v1::ErrorDetails {
    match e {
        ClientError::Status(status) => error_details(status).unwrap_or_else(|| panic!("no details in {e}")),
        other => panic!("not a status: {other}"),
    }
}

pub(crate) fn reason(e: &ClientError) -> v1::ErrorReason {
    v1::ErrorReason::try_from(details(e).reason).unwrap_or(v1::ErrorReason::Unspecified)
}

/// A port of `region` on `network`, in the security groups `groups`.
pub(crate) fn port(name: &str, network: &str, groups: &[&str]) -> v1::ResourceSpec {
    let mut refs: Vec<(&str, &[&str])> = vec![("network", std::slice::from_ref(&network))];
    if !groups.is_empty() {
        refs.push(("security_groups", groups));
    }
    spec_in(name, &refs)
}

/// Every resource of `region` listed with `show_deleted` (of `kind`), to
/// the last page.
pub(crate) async fn list_all(client: &Client, region: &str, kind: &str, show_deleted: bool) -> Vec<v1::Resource> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list(v1::ListRequest {
                kind: kind.to_owned(),
                region: region.to_owned(),
                page_size: 1000,
                page_token: token.clone(),
                show_deleted,
                ..Default::default()
            })
            .await
            .unwrap();
        out.extend(page.resources);
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
}

/// The cascade the tests delete: in ra a project `p` with a network `n`
/// and a security group `sg`; `per_region` ports on `n` in each of ra, rb
/// and rc (cascade referrers, deleted with it); and in each region
/// `unset_per_region` ports on another network (`n2`, of another project)
/// in the security group `sg` (unset referrers: they survive without it).
/// Returns the names of the members.
pub(crate) async fn build(c: &Cluster, per_region: usize, unset_per_region: usize) -> Vec<String> {
    let a = c.client("ra");
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/n", &[("project", &["ra/project/p"])]),
        spec_in("ra/security_group/sg", &[("project", &["ra/project/p"])]),
        spec_in("ra/project/keep", &[]),
        spec_in("ra/network/n2", &[("project", &["ra/project/keep"])]),
    ])
    .await
    .unwrap();
    let mut members = vec![
        "ra/project/p".to_owned(),
        "ra/network/n".to_owned(),
        "ra/security_group/sg".to_owned(),
    ];
    for region in ["ra", "rb", "rc"] {
        let names: Vec<String> = (0..per_region).map(|i| format!("{region}/port/m{i:04}")).collect();
        for chunk in names.chunks(500) {
            c.client(region)
                .batch_create(chunk.iter().map(|n| port(n, "ra/network/n", &[])).collect())
                .await
                .unwrap();
        }
        members.extend(names);
        let unset: Vec<v1::ResourceSpec> = (0..unset_per_region)
            .map(|i| {
                port(
                    &format!("{region}/port/u{i}"),
                    "ra/network/n2",
                    &["ra/security_group/sg"],
                )
            })
            .collect();
        c.client(region).batch_create(unset).await.unwrap();
    }
    members
}

pub(crate) async fn delete_with_retention(client: &Client, name: &str, retention_seconds: u64) -> v1::Operation {
    let op = client
        .delete(v1::DeleteRequest {
            retention_seconds,
            ..delete_req(name, true)
        })
        .await
        .unwrap()
        .operation
        .expect("an operation");
    assert_eq!(
        op.retention_seconds, retention_seconds,
        "the operation carries its retention"
    );
    wait_operation(client, &op.id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_deleted_with_a_retention_is_kept_hidden_in_every_region() {
    const PER_REGION: usize = 333;
    const UNSET_PER_REGION: usize = 5;
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let a = c.client("ra");
    let members = build(&c, PER_REGION, UNSET_PER_REGION).await;
    assert_eq!(members.len(), 3 + 3 * PER_REGION);

    let started = Instant::now();
    let before_ms = wall_ms();
    let op = delete_with_retention(a, "ra/project/p", 3600).await;
    let after_ms = wall_ms();
    eprintln!(
        "deleted {} members with a retention in {:?}",
        members.len(),
        started.elapsed()
    );
    assert_eq!(
        v1::OperationState::try_from(op.state),
        Ok(v1::OperationState::Succeeded),
        "{op:?}"
    );
    let progress = op.progress.unwrap();
    assert_eq!(progress.deleted, members.len() as u64, "every member counts as deleted");
    assert_eq!(progress.unset, 3 * UNSET_PER_REGION as u64);
    assert_eq!(progress.pending, 0);

    // Every member, in its own region: NOT_FOUND to a Get, saying it is
    // soft-deleted and until when.
    for name in &members {
        let region = name.split('/').next().unwrap();
        let e = c.client(region).get(name).await.unwrap_err();
        assert_eq!(code(&e), Some(tonic::Code::NotFound), "{name}: {e}");
        assert_eq!(reason(&e), v1::ErrorReason::SoftDeleted, "{name}: {e}");
        let expire = details(&e).expire_time_ms;
        assert!(
            expire >= before_ms + 3_600_000 && expire <= after_ms + 3_600_000,
            "{name}: expires at {expire}"
        );
    }
    // Another region's node answers the same for it (the Get is forwarded).
    let e = c.client("rc").get("ra/network/n").await.unwrap_err();
    assert_eq!(reason(&e), v1::ErrorReason::SoftDeleted, "{e}");

    // With show_deleted: Get and List show them, DELETED, with the times.
    let n = a.get_with("ra/network/n", true).await.unwrap();
    assert_eq!(state(&n), v1::ResourceState::Deleted);
    assert_eq!(n.expire_time_ms - n.delete_time_ms, 3_600_000);
    assert_eq!(n.deleted_by_operation, op.id);
    assert_eq!(
        targets(&n, "project"),
        ["ra/project/p"],
        "its references stay in the record"
    );
    for region in ["ra", "rb", "rc"] {
        let listed = list_all(c.client(region), region, "port", true).await;
        let deleted: Vec<&v1::Resource> = listed
            .iter()
            .filter(|r| state(r) == v1::ResourceState::Deleted)
            .collect();
        assert_eq!(deleted.len(), PER_REGION, "{region}: the soft-deleted ports, listed");
        for r in &deleted {
            assert!(
                r.delete_time_ms >= before_ms && r.delete_time_ms <= after_ms,
                "{}",
                r.name
            );
            assert_eq!(r.expire_time_ms, r.delete_time_ms + 3_600_000, "{}", r.name);
            assert_eq!(r.deleted_by_operation, op.id);
        }
        // Without show_deleted a listing leaves them out.
        let live = list_all(c.client(region), region, "port", false).await;
        assert_eq!(
            live.len(),
            UNSET_PER_REGION,
            "{region}: only the unset referrers are listed"
        );
        // The unset referrers survive in every region, without the group.
        for u in &live {
            assert_eq!(state(u), v1::ResourceState::Active, "{}", u.name);
            assert!(
                targets(u, "security_groups").is_empty(),
                "{} keeps the deleted group",
                u.name
            );
            assert_eq!(targets(u, "network"), ["ra/network/n2"]);
        }
    }

    // The names stay reserved: a create is ALREADY_EXISTS, SOFT_DELETED.
    for (region, name) in [("ra", "ra/network/n"), ("rb", "rb/port/m0007"), ("rc", "rc/port/m0300")] {
        let spec = if name.contains("/port/") {
            port(name, "ra/network/n2", &[])
        } else {
            spec_in(name, &[("project", &["ra/project/keep"])])
        };
        let e = c.client(region).create(spec).await.unwrap_err();
        assert_eq!(code(&e), Some(tonic::Code::AlreadyExists), "{name}: {e}");
        assert_eq!(reason(&e), v1::ErrorReason::SoftDeleted, "{name}: {e}");
    }
    // And a buried resource is no reference target, from any region.
    let e = c
        .client("rb")
        .create(port("rb/port/late", "ra/network/n", &[]))
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(tonic::Code::FailedPrecondition), "{e}");

    // The checker (`cascade check`) finds nothing: DELETED is not live and
    // is no leak while its window lasts.
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kinds_short_retention_expires_and_the_members_are_purged() {
    // Ports are kept 5 seconds by their kind; networks and projects are
    // purged at once (this delete asks for no retention).
    let schema = cascade_core::Schema::from_toml(&cascade_core::schema::EXAMPLE_SCHEMA.replace(
        "[kinds.port.refs.network]",
        "[kinds.port]\nretain = \"5s\"\n\n[kinds.port.refs.network]",
    ))
    .unwrap();
    let c = start_cluster_with(&["ra", "rb", "rc"], |s| s.schema = Arc::new(schema.clone())).await;
    let members = build(&c, 20, 2).await;
    let ports: Vec<&String> = members.iter().filter(|m| m.contains("/port/")).collect();
    let op = delete_with_retention(c.client("ra"), "ra/project/p", 0).await;
    assert_eq!(op.progress.unwrap().deleted, members.len() as u64);

    // Purged at once: the network, without a trace.
    let e = c.client("ra").get_with("ra/network/n", true).await.unwrap_err();
    assert_eq!(reason(&e), v1::ErrorReason::NotFound, "{e}");
    // Kept: the ports, for now.
    let kept = c.client("rb").get_with(ports[30], true).await.unwrap();
    assert_eq!(state(&kept), v1::ResourceState::Deleted);
    assert_eq!(kept.expire_time_ms - kept.delete_time_ms, 5_000);
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;

    // When the window ends, each port is purged for real, in every region.
    for name in &ports {
        let region = name.split('/').next().unwrap();
        let client = c.client(region);
        eventually(
            Duration::from_secs(30),
            &format!("{name} purged at its expiry"),
            || async {
                match client.get_with(name, true).await {
                    Err(e) if reason(&e) == v1::ErrorReason::NotFound => Some(()),
                    _ => None,
                }
            },
        )
        .await;
    }
    for region in ["ra", "rb", "rc"] {
        let listed = list_all(c.client(region), region, "port", true).await;
        assert!(
            listed.iter().all(|r| state(r) == v1::ResourceState::Active),
            "{region}: nothing soft-deleted is left"
        );
    }
    // The names are free again.
    c.client("rb")
        .create(port("rb/port/m0003", "ra/network/n2", &[]))
        .await
        .unwrap();
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_beyond_the_nodes_maximum_is_refused() {
    let c = start_cluster(&["ra"]).await;
    let a = c.client("ra");
    a.create(spec_in("ra/project/p", &[])).await.unwrap();
    let e = a
        .delete(v1::DeleteRequest {
            retention_seconds: 31 * 86_400,
            ..delete_req("ra/project/p", true)
        })
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(tonic::Code::InvalidArgument), "{e}");
    assert_eq!(details(&e).field, "retention_seconds");
    assert_eq!(state(&a.get("ra/project/p").await.unwrap()), v1::ResourceState::Active);
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
