//! Budgets, pause, resume and cancel of a cascade across three regions
//! (issue 29, item 5), over real nodes: what a user sees through the
//! client, the Admin API and the invariant checker (`cascade check`).

// Test code: real time for poll deadlines.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use cascade_client::{AdminClient, Client};
use cascade_proto::v1;

use crate::support::{
    assert_no_violations, dump, eventually, spec, start_cluster_with, state, wait_operation, Cluster,
};

const REGIONS: [&str; 3] = ["ra", "rb", "rc"];
const TOKEN: &str = "test-admin-token-budget-0123456789";

async fn cluster() -> Cluster {
    start_cluster_with(&REGIONS, |s| {
        s.admin.token = Some(TOKEN.to_owned());
    })
    .await
}

async fn admin(c: &Cluster, region: &str) -> AdminClient {
    AdminClient::connect_with(&c.node(region).node.endpoint(), None, Some(TOKEN.to_owned()))
        .await
        .expect("admin client connects")
}

/// A project in `ra` and `per_region` networks in each region that cascade
/// from it (a 1 + 3 × per_region member closure). Returns the project.
async fn project_with_networks(c: &Cluster, id: &str, per_region: usize) -> String {
    let project = format!("ra/project/{id}");
    c.client("ra")
        .create(spec(&project, &[]))
        .await
        .expect("create the project");
    for region in REGIONS {
        let specs: Vec<v1::ResourceSpec> = (0..per_region)
            .map(|i| spec(&format!("{region}/network/{id}-{i}"), &[("project", &[&project])]))
            .collect();
        for chunk in specs.chunks(200) {
            c.client(region)
                .batch_create(chunk.to_vec())
                .await
                .unwrap_or_else(|e| panic!("create the networks of {region}: {e}"));
        }
    }
    project
}

/// The networks of `id` still ACTIVE, in every region (from each region's
/// own dump: what it stores, not what it says).
async fn active_networks(c: &Cluster, id: &str) -> usize {
    let mut active = 0;
    for region in REGIONS {
        let d = dump(&c.node(region).node.endpoint()).await.expect("dump");
        let prefix = format!("{region}/network/{id}-");
        active += d
            .resources
            .iter()
            .filter(|r| r.name.starts_with(&prefix) && state(r) == v1::ResourceState::Active)
            .count();
    }
    active
}

/// Other writes go on in every region while an operation is held: each
/// region creates a project with a network and deletes both, to the end
/// (so each writer has run work steps since the last look). The network
/// matters: a project nothing references is purged in the step that
/// accepts its delete (`work::finish_accepted`), without a work step, and
/// this barrier, with a bare project, then proved nothing.
async fn other_writes_finish(c: &Cluster, round: usize) {
    for region in REGIONS {
        let name = format!("{region}/project/other-{round}");
        let client: &Client = c.client(region);
        client.create(spec(&name, &[])).await.expect("create another project");
        client
            .create(spec(
                &format!("{region}/network/other-{round}"),
                &[("project", &[&name])],
            ))
            .await
            .expect("create a network of it");
        let op = client
            .delete(v1::DeleteRequest {
                name: name.clone(),
                cascade: true,
                ..Default::default()
            })
            .await
            .expect("delete it")
            .operation
            .expect("an operation");
        let done = wait_operation(client, &op.id).await;
        assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{name}");
    }
}

fn bounded(project: &str, max_deletions: u64, rate_per_second: u32) -> v1::DeleteRequest {
    v1::DeleteRequest {
        name: project.to_owned(),
        cascade: true,
        requested_by: "test".into(),
        max_deletions,
        rate_per_second,
        ..Default::default()
    }
}

/// The outcome of the operation's root, as GetOperation reports it.
async fn root_outcome(client: &Client, op: &str, root: &str) -> Option<v1::Outcome> {
    let view = client.get_operation(op, 1000).await.ok()?;
    view.outcomes
        .into_iter()
        .find(|o| o.resource.as_ref().is_some_and(|r| r.name == root))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_budget_of_100_deletes_exactly_100_members_across_regions_and_extending_it_finishes() {
    let c = cluster().await;
    let project = project_with_networks(&c, "b", 333).await;
    assert_eq!(active_networks(&c, "b").await, 999);
    let op = c
        .client("ra")
        .delete(bounded(&project, 100, 0))
        .await
        .expect("a bounded delete is accepted")
        .operation
        .expect("an operation");
    assert_eq!(op.max_deletions, 100);

    // The root and 99 networks, from all three regions together.
    let reason = "budget reached (100 of 100)";
    eventually(
        Duration::from_secs(30),
        "the root held BLOCKED by its budget",
        || async {
            let outcome = root_outcome(c.client("ra"), &op.id, &project).await?;
            (outcome.action == v1::OutcomeAction::Blocked as i32 && outcome.message == reason).then_some(())
        },
    )
    .await;
    eventually(Duration::from_secs(30), "99 networks entered", || async {
        (active_networks(&c, "b").await == 900).then_some(())
    })
    .await;
    // Nothing beyond the budget, while every region's writer works on.
    for round in 0..3 {
        other_writes_finish(&c, round).await;
        assert_eq!(active_networks(&c, "b").await, 900, "round {round}: the budget holds");
    }
    let view = c
        .client("rb")
        .get_operation(&op.id, 0)
        .await
        .expect("any region reads it");
    assert_eq!(view.budget_used, 100);
    assert_eq!(view.max_deletions, 100);

    // ExplainDeletion, from another region, says why the root waits.
    let explained = c
        .client("rc")
        .explain_deletion(v1::ExplainDeletionRequest {
            operation_id: op.id.clone(),
            ..Default::default()
        })
        .await
        .expect("explain");
    let root = explained
        .deletions
        .iter()
        .find(|d| d.resource.as_ref().is_some_and(|r| r.name == project))
        .expect("the root is explained");
    assert!(root.reasons.iter().any(|r| r.starts_with(reason)), "{:?}", root.reasons);

    // Extended through another region's node: the cascade finishes.
    let extended = admin(&c, "rc")
        .await
        .extend_budget(v1::ExtendBudgetRequest {
            operation_id: op.id.clone(),
            max_deletions: 1_000,
            reason: "the whole project goes".into(),
        })
        .await
        .expect("extend the budget");
    assert_eq!(extended.max_deletions, 1_000);
    let done = wait_operation(c.client("ra"), &op.id).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32);
    assert_eq!(done.budget_used, 1_000);
    assert_eq!(active_networks(&c, "b").await, 0);
    assert_no_violations(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_cascade_deletes_nothing_in_any_region_until_it_is_resumed() {
    let c = cluster().await;
    let project = project_with_networks(&c, "p", 100).await;
    // Slow enough to pause halfway: 5 new members a second per region.
    let op = c
        .client("ra")
        .delete(bounded(&project, 0, 5))
        .await
        .expect("a delete with a rate is accepted")
        .operation
        .expect("an operation");
    eventually(
        Duration::from_secs(30),
        "the cascade to start in every region",
        || async { (active_networks(&c, "p").await <= 297).then_some(()) },
    )
    .await;
    let paused = c
        .client("rb")
        .pause_operation(v1::PauseOperationRequest {
            id: op.id.clone(),
            reason: "look first".into(),
        })
        .await
        .expect("pause, asked of another region");
    assert!(
        paused.unreachable_regions.is_empty(),
        "{:?}",
        paused.unreachable_regions
    );
    let view = c.client("rc").get_operation(&op.id, 0).await.expect("read it");
    assert_eq!(view.state, v1::OperationState::Paused as i32);
    let held = active_networks(&c, "p").await;
    assert!(held > 0, "paused before the end");
    for round in 0..3 {
        other_writes_finish(&c, round).await;
        assert_eq!(
            active_networks(&c, "p").await,
            held,
            "round {round}: nothing deleted while paused"
        );
    }
    c.client("rc")
        .resume_operation(v1::ResumeOperationRequest {
            id: op.id.clone(),
            reason: String::new(),
        })
        .await
        .expect("resume");
    let done = wait_operation(c.client("ra"), &op.id).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32);
    assert_eq!(active_networks(&c, "p").await, 0);
    assert_no_violations(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_cascade_stops_spreading_and_ends_cancelled() {
    let c = cluster().await;
    let project = project_with_networks(&c, "c", 100).await;
    let op = c
        .client("ra")
        .delete(bounded(&project, 0, 5))
        .await
        .expect("accepted")
        .operation
        .expect("an operation");
    eventually(Duration::from_secs(30), "the cascade to start", || async {
        (active_networks(&c, "c").await <= 297).then_some(())
    })
    .await;
    let cancelled = c
        .client("rc")
        .cancel_operation(v1::CancelOperationRequest {
            id: op.id.clone(),
            reason: "wrong project".into(),
        })
        .await
        .expect("cancel");
    assert_eq!(cancelled.state, v1::OperationState::Cancelled as i32);
    // What was already deleting finishes; nothing new starts.
    let held = eventually(Duration::from_secs(30), "the cascade to stop", || async {
        let before = active_networks(&c, "c").await;
        other_writes_finish(&c, 9).await;
        let after = active_networks(&c, "c").await;
        (before == after).then_some(after)
    })
    .await;
    assert!(held > 0, "cancelled before the end");
    for round in 0..2 {
        other_writes_finish(&c, round).await;
        assert_eq!(
            active_networks(&c, "c").await,
            held,
            "round {round}: nothing new after the cancel"
        );
    }
    // The root says why once its next check ran: it was held by the rate
    // when the cancel came (on a loaded machine that check may come after
    // the networks stopped, so it is waited for, not assumed).
    let root_message = eventually(Duration::from_secs(30), "the root to say it was cancelled", || async {
        let view = c.client("rb").get_operation(&op.id, 1000).await.expect("read it");
        assert_eq!(view.state, v1::OperationState::Cancelled as i32);
        let root = view
            .outcomes
            .iter()
            .find(|o| o.resource.as_ref().is_some_and(|r| r.name == project))
            .expect("the root's outcome")
            .message
            .clone();
        root.starts_with("operation cancelled by").then_some(root)
    })
    .await;
    assert!(root_message.contains("no new member is deleted"), "{root_message}");
    // Cancelling again is refused: it ended.
    let again = c
        .client("ra")
        .resume_operation(v1::ResumeOperationRequest {
            id: op.id.clone(),
            reason: String::new(),
        })
        .await
        .expect_err("a cancelled operation cannot be resumed");
    assert_eq!(again.code(), Some(tonic::Code::FailedPrecondition));
}
