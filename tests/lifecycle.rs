//! When deletions must not simply run: liens that protect a resource, and
//! orphan deletes that keep the dependents. Real nodes in three regions;
//! every call goes through the public API, and the checker runs at the end.

mod support;

use cascade_client::ClientError;
use cascade_proto::status::error_details;
use cascade_proto::v1;
use support::*;

fn lien(name: &str, id: &str, reason: &str) -> v1::AddLienRequest {
    v1::AddLienRequest {
        name: name.to_owned(),
        lien_id: id.to_owned(),
        reason: reason.to_owned(),
        requested_by: "alice".to_owned(),
        etag: String::new(),
    }
}

fn unlien(name: &str, id: &str) -> v1::RemoveLienRequest {
    v1::RemoveLienRequest {
        name: name.to_owned(),
        lien_id: id.to_owned(),
        etag: String::new(),
    }
}

fn details(e: &ClientError) -> v1::ErrorDetails {
    match e {
        ClientError::Status(status) => error_details(status).unwrap_or_else(|| panic!("no details in {e}")),
        other => panic!("not a status: {other}"),
    }
}

fn reason(e: &ClientError) -> v1::ErrorReason {
    v1::ErrorReason::try_from(details(e).reason).unwrap_or(v1::ErrorReason::Unspecified)
}

fn op_state(op: &v1::Operation) -> v1::OperationState {
    v1::OperationState::try_from(op.state).unwrap_or(v1::OperationState::Unspecified)
}

fn outcome_of<'a>(op: &'a v1::Operation, name: &str) -> &'a v1::Outcome {
    op.outcomes
        .iter()
        .find(|o| o.resource.as_ref().is_some_and(|r| r.name == name))
        .unwrap_or_else(|| panic!("no outcome for {name} in {op:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lien_refuses_a_delete_and_holds_a_cascade_until_it_is_removed() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
        spec_in("ra/port/a0", &[("network", &["ra/network/net"])]),
    ])
    .await
    .unwrap();
    for i in 0..3 {
        b.create(spec_in(&format!("rb/port/b{i}"), &[("network", &["ra/network/net"])]))
            .await
            .unwrap();
    }

    // A lien on the network: its delete is refused, whichever node is asked.
    let protected = b
        .add_lien(lien("ra/network/net", "legal-hold", "audit 2026"))
        .await
        .unwrap();
    assert_eq!(protected.liens.len(), 1, "{protected:?}");
    assert_eq!(protected.liens[0].origin, "alice");
    for via in [a, b] {
        let err = via.delete(delete_req("ra/network/net", true)).await.unwrap_err();
        assert_eq!(code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
        assert_eq!(reason(&err), v1::ErrorReason::Liened, "{err}");
        assert!(
            err.to_string().contains("legal-hold") && err.to_string().contains("audit 2026"),
            "{err}"
        );
        let d = details(&err);
        assert_eq!(d.liens.len(), 1);
        assert_eq!(
            (d.liens[0].id.as_str(), d.liens[0].reason.as_str()),
            ("legal-hold", "audit 2026")
        );
        assert_eq!(d.resource.unwrap().name, "ra/network/net");
    }
    // The same lien again is a no-op; the same id for another reason is not.
    let again = a
        .add_lien(lien("ra/network/net", "legal-hold", "audit 2026"))
        .await
        .unwrap();
    assert_eq!(again.etag, protected.etag, "a repeated AddLien changes nothing");
    let err = a
        .add_lien(lien("ra/network/net", "legal-hold", "other"))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::AlreadyExists), "{err}");
    assert_eq!(details(&err).field, "lien_id");
    let err = a.add_lien(lien("ra/network/net", "x", " ")).await.unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::InvalidArgument), "{err}");
    assert_eq!(details(&err).field, "reason");
    let err = b.remove_lien(unlien("ra/network/net", "nope")).await.unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::NotFound), "{err}");
    assert_eq!(reason(&err), v1::ErrorReason::Lien);
    let lifted = b.remove_lien(unlien("ra/network/net", "legal-hold")).await.unwrap();
    assert!(lifted.liens.is_empty());

    // A lien on a dependent in another region: the cascade reaches it and
    // waits there, BLOCKED and explained, while everything else goes.
    b.add_lien(lien("rb/port/b1", "in-use", "attached to a VM"))
        .await
        .unwrap();
    let op = a
        .delete(delete_req("ra/network/net", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    let held = eventually(
        std::time::Duration::from_secs(30),
        "rb/port/b1 held by its lien",
        || async {
            let r = b.get("rb/port/b1").await.ok()?;
            let d = r.deletion.clone()?;
            (d.status == v1::DeletionStatus::Blocked as i32).then_some(r)
        },
    )
    .await;
    let message = held.deletion.unwrap().message;
    assert!(
        message.contains("lien in-use") && message.contains("attached to a VM"),
        "{message}"
    );
    for gone in ["ra/port/a0", "rb/port/b0", "rb/port/b2"] {
        wait_gone(a, gone).await;
    }
    let running = a.get_operation(&op.id, 100).await.unwrap();
    assert_eq!(op_state(&running), v1::OperationState::Running, "{running:?}");
    assert!(!running.done);
    let b1 = outcome_of(&running, "rb/port/b1");
    assert_eq!(b1.action, v1::OutcomeAction::Blocked as i32, "{b1:?}");
    // Adding a lien to a resource being deleted is refused.
    let err = b.add_lien(lien("rb/port/b1", "late", "too late")).await.unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::FailedPrecondition), "{err}");

    a.remove_lien(unlien("rb/port/b1", "in-use")).await.unwrap();
    let done = wait_operation(a, &op.id).await;
    assert_eq!(op_state(&done), v1::OperationState::Succeeded, "{done:?}");
    assert_eq!(done.progress.unwrap().deleted, 5, "net, a0, b0, b1, b2");
    wait_gone(a, "ra/network/net").await;
    wait_gone(a, "rb/port/b1").await;
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_delete_keeps_dependents_in_two_regions_with_the_reference_cleared() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let (a, b, cc) = (c.client("ra"), c.client("rb"), c.client("rc"));
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
        spec_in("ra/network/other", &[("project", &["ra/project/p"])]),
        spec_in("ra/port/a0", &[("network", &["ra/network/net"])]),
    ])
    .await
    .unwrap();
    b.create(spec_in("rb/port/b0", &[("network", &["ra/network/net"])]))
        .await
        .unwrap();
    cc.create(spec_in("rc/port/c0", &[("network", &["ra/network/net"])]))
        .await
        .unwrap();
    // A list owner whose only element is a port of the closure: under
    // orphan the port is not deleted, so the group keeps it.
    b.create(spec_in("rb/port_group/g", &[("ports", &["rb/port/b0"])]))
        .await
        .unwrap();
    let orphan = |dry_run: bool| v1::DeleteRequest {
        dry_run,
        propagation: v1::PropagationPolicy::Orphan as i32,
        ..delete_req("ra/network/net", false)
    };

    // Orphan and cascade contradict each other.
    let err = b
        .delete(v1::DeleteRequest {
            cascade: true,
            ..orphan(false)
        })
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::InvalidArgument), "{err}");
    assert_eq!(details(&err).field, "propagation");

    // The dry run, across regions: only the network goes, three ports lose it.
    let plan = a.delete(orphan(true)).await.unwrap().plan.unwrap();
    let deleted: Vec<&str> = plan.deleted.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(deleted, ["ra/network/net"], "{plan:?}");
    let mut unset: Vec<&str> = plan
        .unset
        .iter()
        .map(|u| u.resource.as_ref().unwrap().name.as_str())
        .collect();
    unset.sort();
    assert_eq!(unset, ["ra/port/a0", "rb/port/b0", "rc/port/c0"], "{plan:?}");

    let op = b.delete(orphan(false)).await.unwrap().operation.unwrap();
    assert!(!op.cascade);
    let done = wait_operation(a, &op.id).await;
    assert_eq!(op_state(&done), v1::OperationState::Succeeded, "{done:?}");
    let p = done.progress.unwrap();
    assert_eq!((p.deleted, p.unset), (1, 3), "{p:?}");
    for port in ["ra/port/a0", "rb/port/b0", "rc/port/c0"] {
        let o = outcome_of(&done, port);
        assert_eq!(o.action, v1::OutcomeAction::Unset as i32, "{o:?}");
        assert_eq!(o.field, "network");
        let r = a.get(port).await.unwrap();
        assert_eq!(state(&r), v1::ResourceState::Active, "{port}");
        assert!(targets(&r, "network").is_empty(), "{port} keeps no reference: {r:?}");
    }
    let group = b.get("rb/port_group/g").await.unwrap();
    assert_eq!(targets(&group, "ports"), ["rb/port/b0"]);
    wait_gone(a, "ra/network/net").await;

    // `network` is required: the orphaned port lives without it, and its
    // next update must set it again.
    let err = b.update(spec_in("rb/port/b0", &[]), "").await.unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::InvalidArgument), "{err}");
    assert_eq!(details(&err).field, "refs.network");
    b.update(spec_in("rb/port/b0", &[("network", &["ra/network/other"])]), "")
        .await
        .unwrap();

    // A `block` referrer still refuses an orphan delete.
    a.create(spec_in(
        "ra/router/r",
        &[
            ("project", &["ra/project/p"]),
            ("gateway_network", &["ra/network/other"]),
        ],
    ))
    .await
    .unwrap();
    let err = a
        .delete(v1::DeleteRequest {
            propagation: v1::PropagationPolicy::Orphan as i32,
            ..delete_req("ra/network/other", false)
        })
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    assert!(err.to_string().contains("ra/router/r"), "{err}");
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}
