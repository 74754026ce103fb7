//! What a delete is allowed to delete, seen from a client: `cascade = false`
//! allows no cascade at all, at acceptance and later, in one region and
//! across regions; a dry run predicts the real run across regions; the root
//! stays readable until its whole cross-region closure is finished.
//!
//! Each test is a scenario an outside client (generated from `proto/` by
//! the standard protoc) found wrong; the fixes are in the core
//! (`protocol::check_preconditions`, `apply_to_referrer`, `plan.rs`) and
//! the node's `remote_kept`. Why our own checks missed them: the
//! simulation only deleted with `cascade = true` and checked no intent, and
//! the dry run was compared with the real run in one region only. The
//! simulation's intent oracle and the multi-region property test now cover
//! both (`tests/simulation.rs`, `crates/cascade-core/tests/multi_region.rs`).

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cascade_core::Schema;
use cascade_proto::v1;
use support::*;

/// Owners and list owners (Kubernetes style), notes that slow an owner's
/// deletion (unset referrers), and a sentinel that blocks a component.
const SCHEMA: &str = r#"
[kinds.owner]
[kinds.app]

[kinds.dep_list.refs.owners]
kind = "owner"
on_delete = "cascade"
many = true

[kinds.note.refs.owner]
kind = "owner"
on_delete = "unset"

[kinds.component.refs.app]
kind = "app"
on_delete = "cascade"

[kinds.sentinel.refs.component]
kind = "component"
on_delete = "block"

[kinds.sentinel.refs.app]
kind = "app"
on_delete = "cascade"
"#;

async fn cluster(regions: &[&str], batch_budget: usize) -> Cluster {
    let schema = Arc::new(Schema::from_toml(SCHEMA).expect("test schema"));
    start_cluster_with(regions, move |s| {
        s.schema = schema.clone();
        s.policy.batch_budget = batch_budget;
    })
    .await
}

fn no_cascade(name: &str) -> v1::DeleteRequest {
    delete_req(name, false)
}

async fn create(c: &Cluster, region: &str, name: &str, refs: &[(&str, &[&str])]) {
    c.client(region)
        .create(spec_in(name, refs))
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

/// The names an operation (aggregated over every region) reports DELETED.
fn deleted_by(op: &v1::Operation) -> BTreeSet<String> {
    op.outcomes
        .iter()
        .filter(|o| o.action == v1::OutcomeAction::Deleted as i32)
        .filter_map(|o| o.resource.as_ref().map(|r| r.name.clone()))
        .collect()
}

fn owners_of(r: &v1::Resource) -> Vec<&str> {
    targets(r, "owners")
}

/// Bug 1: `Delete(o1, cascade=false)` is accepted (d keeps o2); while o1's
/// deletion is still walking its referrers, `Delete(o2, cascade=false)` was
/// accepted too and d was deleted, reported DELETED by o2's operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_owner_deleted_without_cascade_while_the_first_is_deleting_is_refused_and_the_list_owner_survives() {
    let c = cluster(&["eu-west"], 1).await;
    let client = c.client("eu-west");
    create(&c, "eu-west", "eu-west/owner/o1", &[]).await;
    create(&c, "eu-west", "eu-west/owner/o2", &[]).await;
    // Notes of o1 created before d sort first in o1's back-references, so
    // with a budget of one referrer per step o1's walk reaches d late.
    let notes: Vec<v1::ResourceSpec> = (0..300)
        .map(|i| spec_in(&format!("eu-west/note/n{i}"), &[("owner", &["eu-west/owner/o1"])]))
        .collect();
    client.batch_create(notes).await.expect("notes");
    create(
        &c,
        "eu-west",
        "eu-west/dep_list/d",
        &[("owners", &["eu-west/owner/o1", "eu-west/owner/o2"])],
    )
    .await;

    let first = client.delete(no_cascade("eu-west/owner/o1")).await.expect("d keeps o2");
    let refused = client
        .delete(no_cascade("eu-west/owner/o2"))
        .await
        .expect_err("deleting o2 too would cascade to d");
    assert_eq!(code(&refused), Some(tonic::Code::FailedPrecondition), "{refused}");
    assert!(refused.to_string().contains("eu-west/dep_list/d"), "{refused}");

    let op = wait_operation(client, &first.operation.expect("operation").id).await;
    assert_eq!(deleted_by(&op), BTreeSet::from(["eu-west/owner/o1".to_owned()]));
    let d = client.get("eu-west/dep_list/d").await.expect("d survives");
    assert_eq!(owners_of(&d), vec!["eu-west/owner/o2"]);
    // Now d would lose its last owner: still refused.
    let refused = client.delete(no_cascade("eu-west/owner/o2")).await.unwrap_err();
    assert_eq!(code(&refused), Some(tonic::Code::FailedPrecondition), "{refused}");
    assert_no_violations(&c).await;
}

/// Bug 1, concurrent form: two `cascade = false` deletes of a list owner's
/// two owners, in the same region and in two others. Whatever the
/// interleaving, d is never deleted: one delete is refused, or both are
/// accepted and d survives with the owners it has left (possibly none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deletes_without_cascade_of_both_owners_never_delete_the_list_owner() {
    let c = cluster(&["eu-west", "us-east", "ap-south"], 512).await;
    for round in 0..6 {
        // Even rounds: both owners and d in one region; odd: three regions.
        let (r1, r2, rd) = if round % 2 == 0 {
            ("eu-west", "eu-west", "eu-west")
        } else {
            ("eu-west", "us-east", "ap-south")
        };
        let (o1, o2, d) = (
            format!("{r1}/owner/a{round}"),
            format!("{r2}/owner/b{round}"),
            format!("{rd}/dep_list/d{round}"),
        );
        create(&c, r1, &o1, &[]).await;
        create(&c, r2, &o2, &[]).await;
        create(&c, rd, &d, &[("owners", &[o1.as_str(), o2.as_str()])]).await;
        let (x, y) = tokio::join!(
            c.client(r1).delete(no_cascade(&o1)),
            c.client(r2).delete(no_cascade(&o2))
        );
        let mut ops = Vec::new();
        for answer in [x, y] {
            match answer {
                Ok(r) => ops.push(r.operation.expect("operation").id),
                Err(e) => assert_eq!(code(&e), Some(tonic::Code::FailedPrecondition), "{e}"),
            }
        }
        assert!(!ops.is_empty(), "at least one of the two deletes is allowed");
        for id in &ops {
            let op = wait_operation(c.client(r1), id).await;
            assert!(!deleted_by(&op).contains(&d), "round {round}: {d} deleted by {op:?}");
        }
        let kept = c.client(rd).get(&d).await.expect("the list owner survives");
        assert_eq!(state(&kept), v1::ResourceState::Active);
    }
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// Bug 2: a list owner in another region that keeps another owner does not
/// make a delete without cascade refuse; one that would lose its last live
/// owner does, listing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_without_cascade_of_one_owner_of_a_remote_list_owner_that_keeps_another_is_accepted() {
    let c = cluster(&["eu-west", "us-east", "ap-south"], 512).await;
    create(&c, "eu-west", "eu-west/owner/a", &[]).await;
    create(&c, "us-east", "us-east/owner/b", &[]).await;
    create(
        &c,
        "ap-south",
        "ap-south/dep_list/r",
        &[("owners", &["eu-west/owner/a", "us-east/owner/b"])],
    )
    .await;
    // Through any node: forwarded to the owner, which asks ap-south.
    let dry = c
        .client("ap-south")
        .delete(v1::DeleteRequest {
            dry_run: true,
            ..no_cascade("eu-west/owner/a")
        })
        .await
        .expect("a dry run without cascade is accepted");
    let plan = dry.plan.expect("plan");
    assert_eq!(plan.deleted.len(), 1, "{plan:?}");
    let accepted = c
        .client("eu-west")
        .delete(no_cascade("eu-west/owner/a"))
        .await
        .expect("r keeps b");
    let op = wait_operation(c.client("eu-west"), &accepted.operation.expect("op").id).await;
    assert_eq!(deleted_by(&op), BTreeSet::from(["eu-west/owner/a".to_owned()]));
    let r = c
        .client("ap-south")
        .get("ap-south/dep_list/r")
        .await
        .expect("r survives");
    assert_eq!(owners_of(&r), vec!["us-east/owner/b"]);

    // b is now r's last owner: refused, naming r, whichever node is asked.
    for via in ["us-east", "eu-west", "ap-south"] {
        let refused = c.client(via).delete(no_cascade("us-east/owner/b")).await.unwrap_err();
        assert_eq!(
            code(&refused),
            Some(tonic::Code::FailedPrecondition),
            "via {via}: {refused}"
        );
        assert!(
            refused.to_string().contains("ap-south/dep_list/r"),
            "via {via}: {refused}"
        );
    }
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// Bug 9: the root of a cascade whose dependent in another region is held
/// by a blocker read NOT_FOUND as soon as its own region's part was done,
/// so the stuck cascade was visible only through the operation. The root
/// stays DELETING (WAITING, naming the regions) until every region's part
/// is finished, as Kubernetes' foreground deletion keeps an owner until
/// its dependents are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_stays_deleting_until_its_remote_closure_is_finished() {
    let c = cluster(&["eu-west", "us-east", "ap-south"], 512).await;
    create(&c, "eu-west", "eu-west/app/a", &[]).await;
    create(&c, "us-east", "us-east/component/c", &[("app", &["eu-west/app/a"])]).await;
    create(
        &c,
        "ap-south",
        "ap-south/sentinel/s",
        &[("component", &["us-east/component/c"])],
    )
    .await;
    let op = c
        .client("eu-west")
        .delete(delete_req("eu-west/app/a", true))
        .await
        .expect("accepted")
        .operation
        .expect("operation");
    // c enters DELETING in us-east and is held there by s.
    eventually(Duration::from_secs(30), "c to be blocked by s", || async {
        let c = c.client("us-east").get("us-east/component/c").await.ok()?;
        let d = c.deletion?;
        (d.status == v1::DeletionStatus::Blocked as i32).then_some(())
    })
    .await;
    // The root's own part is done (c released its reference), but it stays.
    let root = eventually(Duration::from_secs(30), "the root to wait for us-east", || async {
        let a = c.client("ap-south").get("eu-west/app/a").await.ok()?;
        let d = a.deletion.clone()?;
        // Not the transient "waiting on region us-east to release": the
        // release came, and the root waits for us-east's part to finish.
        let waits_for_closure = d.message.contains("waiting for the cascade to finish in us-east");
        (d.status == v1::DeletionStatus::Waiting as i32 && waits_for_closure).then_some(a)
    })
    .await;
    assert_eq!(state(&root), v1::ResourceState::Deleting);
    let running = c.client("eu-west").get_operation(&op.id, 100).await.unwrap();
    assert!(!running.done, "{running:?}");

    // Unblock: the cascade finishes in us-east, and only then the root goes.
    let s_gone = delete_and_wait(c.client("ap-south"), "ap-south/sentinel/s", false).await;
    assert_eq!(s_gone.state, v1::OperationState::Succeeded as i32);
    wait_gone(c.client("eu-west"), "eu-west/app/a").await;
    let done = wait_operation(c.client("eu-west"), &op.id).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    assert_eq!(
        deleted_by(&done),
        BTreeSet::from(["eu-west/app/a".to_owned(), "us-east/component/c".to_owned()])
    );
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// Bug 3: a port group in ap-south lists a port of us-east and one of its
/// own, both on eu-west's network. Each region's part of the dry run saw
/// only its own removed element, so the plan said "unset g twice"; the
/// real cascade deletes g.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_of_a_cascade_reaching_a_list_owner_from_two_regions_deletes_it_as_the_real_run_does() {
    let c = start_cluster(&["eu-west", "us-east", "ap-south"]).await;
    c.client("eu-west")
        .batch_create(vec![
            spec_in("eu-west/project/p", &[]),
            spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]),
        ])
        .await
        .unwrap();
    c.client("us-east")
        .create(spec_in("us-east/port/a", &[("network", &["eu-west/network/n"])]))
        .await
        .unwrap();
    c.client("ap-south")
        .create(spec_in("ap-south/port/b", &[("network", &["eu-west/network/n"])]))
        .await
        .unwrap();
    c.client("ap-south")
        .create(spec_in(
            "ap-south/port_group/g",
            &[("ports", &["us-east/port/a", "ap-south/port/b"])],
        ))
        .await
        .unwrap();
    assert_dry_run_matches_real_run(&c, "eu-west", "eu-west/network/n").await;
}

/// Bug 4: us-east's component is blocked by ap-south's sentinel, which the
/// same cascade deletes: the dry run reported a block that never happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_drops_a_block_whose_blocker_the_closure_deletes_in_another_region() {
    let c = cluster(&["eu-west", "us-east", "ap-south"], 512).await;
    create(&c, "eu-west", "eu-west/app/a", &[]).await;
    create(&c, "us-east", "us-east/component/c", &[("app", &["eu-west/app/a"])]).await;
    create(
        &c,
        "ap-south",
        "ap-south/sentinel/s",
        &[("component", &["us-east/component/c"]), ("app", &["eu-west/app/a"])],
    )
    .await;
    assert_dry_run_matches_real_run(&c, "eu-west", "eu-west/app/a").await;
}

/// Dry-runs a cascade of `root`, runs it, and compares: the same resources
/// deleted, the same unset, no block predicted that the run did not meet.
async fn assert_dry_run_matches_real_run(c: &Cluster, region: &str, root: &str) {
    let client = c.client(region);
    let plan = client
        .delete(v1::DeleteRequest {
            dry_run: true,
            ..delete_req(root, true)
        })
        .await
        .expect("dry run")
        .plan
        .expect("plan");
    assert!(plan.unreachable_regions.is_empty(), "{plan:?}");
    let planned: BTreeSet<String> = plan.deleted.iter().map(|d| d.name.clone()).collect();
    let planned_unset: BTreeSet<(String, String)> = plan
        .unset
        .iter()
        .map(|u| (u.resource.as_ref().expect("resource").name.clone(), u.field.clone()))
        .collect();
    assert_eq!(
        planned_unset.len(),
        plan.unset.len(),
        "an unset is planned once: {plan:?}"
    );
    let op = delete_and_wait(client, root, true).await;
    assert_eq!(op.state, v1::OperationState::Succeeded as i32, "{op:?}");
    assert!(
        plan.blocked.is_empty(),
        "predicted blocks the run did not meet: {plan:?}"
    );
    assert_eq!(planned, deleted_by(&op), "dry run vs real run");
    let unset: BTreeSet<(String, String)> = op
        .outcomes
        .iter()
        .filter_map(|o| match &o.resource {
            Some(r) if o.action == v1::OutcomeAction::Unset as i32 => Some((r.name.clone(), o.field.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(planned_unset, unset, "dry run vs real run (unset)");
    wait_quiescent(c).await;
    assert_no_violations(c).await;
}

/// A delete without cascade must ask the region of a remote list owner
/// whether it keeps another owner; while that region is down the delete
/// can be neither accepted nor refused: UNAVAILABLE naming the region
/// (clients retry), and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_without_cascade_is_unavailable_while_a_remote_list_owners_region_is_down() {
    let mut c = cluster(&["eu-west", "us-east", "ap-south"], 512).await;
    create(&c, "eu-west", "eu-west/owner/a", &[]).await;
    create(&c, "us-east", "us-east/owner/b", &[]).await;
    create(
        &c,
        "ap-south",
        "ap-south/dep_list/r",
        &[("owners", &["eu-west/owner/a", "us-east/owner/b"])],
    )
    .await;
    c.stop("ap-south").await;
    for via in ["eu-west", "us-east"] {
        let e = c.client(via).delete(no_cascade("eu-west/owner/a")).await.unwrap_err();
        assert_eq!(code(&e), Some(tonic::Code::Unavailable), "via {via}: {e}");
        assert!(e.to_string().contains("ap-south"), "via {via}: {e}");
    }
    let a = c.client("eu-west").get("eu-west/owner/a").await.expect("a untouched");
    assert_eq!(state(&a), v1::ResourceState::Active);
    c.restart("ap-south").await;
    let accepted = c
        .client("eu-west")
        .delete(no_cascade("eu-west/owner/a"))
        .await
        .expect("r keeps b, now that ap-south can say so");
    wait_operation(c.client("eu-west"), &accepted.operation.expect("op").id).await;
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}
