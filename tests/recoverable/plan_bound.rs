//! Plan-bound deletes over three regions: a dry run's token binds the
//! delete to the closure it found; a dependent created (or a member
//! deleted) in another region before the delete makes it ABORTED, naming
//! the change, with nothing changed; an unchanged closure is deleted
//! exactly as planned; and `[limits] confirm_above` refuses a large cascade
//! without a token and takes it with one.

use std::collections::BTreeSet;

use cascade_client::{Client, ClientError};
use cascade_proto::status::error_details;
use cascade_proto::v1;

use crate::support::*;

fn details(e: &ClientError) -> v1::ErrorDetails {
    match e {
        ClientError::Status(status) => error_details(status).unwrap_or_else(|| panic!("no details in {e}")),
        other => panic!("not a status: {other}"),
    }
}

fn reason(e: &ClientError) -> v1::ErrorReason {
    v1::ErrorReason::try_from(details(e).reason).unwrap_or(v1::ErrorReason::Unspecified)
}

async fn dry_run(client: &Client, name: &str) -> v1::Plan {
    client
        .delete(v1::DeleteRequest {
            dry_run: true,
            ..delete_req(name, true)
        })
        .await
        .unwrap_or_else(|e| panic!("dry run of {name}: {e}"))
        .plan
        .unwrap_or_else(|| panic!("dry run of {name}: no plan"))
}

fn bound(name: &str, token: &str) -> v1::DeleteRequest {
    v1::DeleteRequest {
        expect_plan: token.to_owned(),
        ..delete_req(name, true)
    }
}

/// The plan's members as `(name, action)`: `delete`, or `unset FIELD`.
fn planned(plan: &v1::Plan) -> BTreeSet<(String, String)> {
    let deleted = plan.deleted.iter().map(|d| (d.name.clone(), "delete".to_owned()));
    let unset = plan.unset.iter().map(|u| {
        let name = u.resource.as_ref().map(|r| r.name.clone()).unwrap_or_default();
        (name, format!("unset {}", u.field))
    });
    deleted.chain(unset).collect()
}

/// What the operation did, in the same terms as [`planned`].
fn done(op: &v1::Operation) -> BTreeSet<(String, String)> {
    op.outcomes
        .iter()
        .filter_map(|o| {
            let name = o.resource.as_ref()?.name.clone();
            match v1::OutcomeAction::try_from(o.action) {
                Ok(v1::OutcomeAction::Deleted) => Some((name, "delete".to_owned())),
                Ok(v1::OutcomeAction::Unset) => Some((name, format!("unset {}", o.field))),
                _ => None,
            }
        })
        .collect()
}

/// A network in ra with ports in rb and rc, and a floating IP in rc whose
/// port reference is unset by the cascade.
async fn network_across_regions(c: &Cluster) {
    c.client("ra")
        .batch_create(vec![
            spec_in("ra/project/p", &[]),
            spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
        ])
        .await
        .unwrap();
    for port in ["rb/port/b0", "rb/port/b1"] {
        c.client("rb")
            .create(spec_in(port, &[("network", &["ra/network/net"])]))
            .await
            .unwrap();
    }
    c.client("rc")
        .batch_create(vec![
            spec_in("rc/project/pc", &[]),
            spec_in("rc/port/c0", &[("network", &["ra/network/net"])]),
        ])
        .await
        .unwrap();
    c.client("rc")
        .create(spec_in(
            "rc/floating_ip/f",
            &[("project", &["rc/project/pc"]), ("port", &["rc/port/c0"])],
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_token_binds_the_delete_to_the_closure_its_dry_run_found() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    network_across_regions(&c).await;
    let net = "ra/network/net";
    let a = c.client("ra");

    let plan = dry_run(a, net).await;
    assert!(plan.token.starts_with("p1-"), "{plan:?}");
    assert!(plan.token_missing.is_empty(), "{plan:?}");
    assert_eq!(plan.members, 5, "the network, three ports, one unset: {plan:?}");
    assert_eq!(
        dry_run(c.client("rb"), net).await.token,
        plan.token,
        "the same closure, the same token, whichever node is asked"
    );

    // A dependent created in another region after the dry run, and a
    // member deleted in a third: the delete is refused, naming both.
    c.client("rb")
        .create(spec_in("rb/port/late", &[("network", &[net])]))
        .await
        .unwrap();
    delete_and_wait(c.client("rc"), "rc/floating_ip/f", false).await;
    let err = a.delete(bound(net, &plan.token)).await.unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::Aborted), "{err}");
    assert_eq!(reason(&err), v1::ErrorReason::PlanChanged, "{err}");
    let changes: BTreeSet<(String, String, bool)> = details(&err)
        .plan_changes
        .iter()
        .map(|m| (m.name.clone(), m.action.clone(), m.added))
        .collect();
    assert_eq!(
        changes,
        BTreeSet::from([
            ("rb/port/late".to_owned(), "delete".to_owned(), true),
            ("rc/floating_ip/f".to_owned(), "unset port".to_owned(), false),
        ]),
        "{err}"
    );
    assert_eq!(details(&err).plan_members, 5, "{err}");
    assert!(err.to_string().contains("rb/port/late (delete)"), "{err}");
    // Nothing changed.
    assert_eq!(state(&a.get(net).await.unwrap()), v1::ResourceState::Active);
    assert_eq!(
        state(&c.client("rb").get("rb/port/late").await.unwrap()),
        v1::ResourceState::Active
    );

    // A fresh plan of the unchanged closure: deleted exactly as planned.
    let plan = dry_run(a, net).await;
    let op = a
        .delete(bound(net, &plan.token))
        .await
        .unwrap_or_else(|e| panic!("bound delete: {e}"))
        .operation
        .expect("an operation");
    let finished = wait_operation(a, &op.id).await;
    assert_eq!(
        v1::OperationState::try_from(finished.state),
        Ok(v1::OperationState::Succeeded),
        "{finished:?}"
    );
    assert_eq!(done(&finished), planned(&plan), "the outcomes are the plan's members");
    assert_eq!(planned(&plan).len() as u64, plan.members);
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_above_refuses_a_large_cascade_without_a_token_and_takes_it_with_one() {
    let c = start_cluster_with(&["ra", "rb", "rc"], |s| s.limits.confirm_above = Some(3)).await;
    network_across_regions(&c).await;
    let a = c.client("ra");
    let net = "ra/network/net";

    let err = a.delete(delete_req(net, true)).await.unwrap_err();
    assert_eq!(code(&err), Some(tonic::Code::FailedPrecondition), "{err}");
    assert_eq!(reason(&err), v1::ErrorReason::PlanRequired, "{err}");
    assert_eq!(details(&err).plan_members, 5, "{err}");
    assert_eq!(details(&err).field, "expect_plan", "{err}");
    let said = err.to_string();
    assert!(
        said.contains("changes 5 resources") && said.contains("confirm_above = 3") && said.contains("--expect-plan"),
        "{said}"
    );
    assert_eq!(
        state(&a.get(net).await.unwrap()),
        v1::ResourceState::Active,
        "nothing changed"
    );

    // A cascade at or under the threshold needs no token: rb's port alone.
    let small = delete_and_wait(c.client("rb"), "rb/port/b1", true).await;
    assert_eq!(
        v1::OperationState::try_from(small.state),
        Ok(v1::OperationState::Succeeded)
    );

    // With its plan's token the large one starts.
    let plan = dry_run(a, net).await;
    assert_eq!(plan.members, 4, "{plan:?}");
    let op = a
        .delete(bound(net, &plan.token))
        .await
        .unwrap_or_else(|e| panic!("bound delete: {e}"))
        .operation
        .expect("an operation");
    let finished = wait_operation(a, &op.id).await;
    assert_eq!(done(&finished), planned(&plan));
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}
