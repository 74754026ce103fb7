//! The deletion semantics of DESIGN.md ("Semantics details the tests hold"),
//! each over gRPC against a real node on 127.0.0.1:0: block references, a
//! blocked cascade and its report, list (owner) references, cycles,
//! re-creation under a new uid, repeated deletes, creates under a DELETING
//! target, dry runs, Watch resumption, finalizers, List pagination and etags.
//!
//! Size: about 1,300 lines in one file: one test per semantic rule of
//! DESIGN.md, in the document's order, sharing one fixture. Reading it next
//! to DESIGN.md is the point.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use cascade_client::{Client, ClientError};
use cascade_proto::v1;
use futures::StreamExt;
use support::*;

const LIMIT: Duration = Duration::from_secs(30);

/// The gRPC status inside a client error (panics on a transport error).
fn status(err: &ClientError) -> &tonic::Status {
    match err {
        ClientError::Status(s) => s,
        other => panic!("expected a gRPC status, got {other}"),
    }
}

fn assert_code(err: &ClientError, expected: tonic::Code) {
    assert_eq!(code(err), Some(expected), "unexpected error: {err}");
}

fn with_attr(mut s: v1::ResourceSpec, key: &str, value: &str) -> v1::ResourceSpec {
    s.attributes.insert(key.to_owned(), value.to_owned());
    s
}

fn with_finalizers(mut s: v1::ResourceSpec, finalizers: &[&str]) -> v1::ResourceSpec {
    s.finalizers = finalizers.iter().map(|f| f.to_string()).collect();
    s
}

async fn get(c: &Client, name: &str) -> v1::Resource {
    c.get(&full(name)).await.unwrap_or_else(|e| panic!("get {name}: {e}"))
}

async fn get_state(c: &Client, name: &str) -> v1::ResourceState {
    state(&get(c, name).await)
}

fn deletion_status(r: &v1::Resource) -> v1::DeletionStatus {
    let d = r
        .deletion
        .as_ref()
        .unwrap_or_else(|| panic!("{} has no deletion record", r.name));
    v1::DeletionStatus::try_from(d.status).unwrap_or(v1::DeletionStatus::Unspecified)
}

fn op_state(op: &v1::Operation) -> v1::OperationState {
    v1::OperationState::try_from(op.state).unwrap_or(v1::OperationState::Unspecified)
}

fn event_type(e: &v1::WatchEvent) -> v1::EventType {
    v1::EventType::try_from(e.r#type).unwrap_or(v1::EventType::Unspecified)
}

fn event_name(e: &v1::WatchEvent) -> &str {
    e.resource.as_ref().map(|r| r.name.as_str()).unwrap_or("")
}

/// The next event of a Watch stream, within a deadline.
async fn next_event(stream: &mut tonic::Streaming<v1::WatchEvent>) -> v1::WatchEvent {
    tokio::time::timeout(LIMIT, stream.next())
        .await
        .expect("a watch event within the deadline")
        .expect("the watch stream is still open")
        .expect("a watch event, not an error")
}

/// Waits until `name` is DELETING with its deletion record BLOCKED.
async fn wait_blocked(c: &Client, name: &str) -> v1::Resource {
    let name = full(name);
    eventually(LIMIT, &format!("{name} to be DELETING and BLOCKED"), || async {
        let r = c.get(&name).await.ok()?;
        let blocked = state(&r) == v1::ResourceState::Deleting
            && r.deletion
                .as_ref()
                .is_some_and(|d| d.status == v1::DeletionStatus::Blocked as i32);
        blocked.then_some(r)
    })
    .await
}

/// Project p1 owns network n1; router r2 of project p2 uses n1 as its
/// gateway (a `block` reference). Deleting p1 with cascade leaves n1 held in
/// DELETING, blocked by r2. Returns the operation id.
async fn blocked_cascade(c: &Client) -> String {
    c.batch_create(vec![
        spec("project/p1", &[]),
        spec("network/n1", &[("project", &["project/p1"])]),
        spec("project/p2", &[]),
        spec(
            "router/r2",
            &[("project", &["project/p2"]), ("gateway_network", &["network/n1"])],
        ),
    ])
    .await
    .expect("topology created");
    let response = c
        .delete(delete_req("project/p1", true))
        .await
        .expect("cascade delete of p1 accepted");
    assert!(!response.already_deleting);
    let op = response.operation.expect("an operation");
    wait_blocked(c, "network/n1").await;
    op.id
}

#[tokio::test]
async fn block_reference_refuses_a_user_delete_and_names_the_blocker() {
    let t = start_node().await;
    let c = &t.client;
    c.batch_create(vec![
        spec("project/p", &[]),
        spec("network/ext", &[("project", &["project/p"])]),
        spec(
            "router/r",
            &[("project", &["project/p"]), ("gateway_network", &["network/ext"])],
        ),
    ])
    .await
    .unwrap();

    for cascade in [false, true] {
        let err = c.delete(delete_req("network/ext", cascade)).await.unwrap_err();
        assert_code(&err, tonic::Code::FailedPrecondition);
        let s = status(&err);
        assert!(
            s.message().contains("eu-west/router/r"),
            "cascade={cascade}: {}",
            s.message()
        );
        let details = cascade_proto::error_details(s).expect("error details on a refused delete");
        let blockers: Vec<_> = details
            .blockers
            .iter()
            .map(|b| (b.referrer.as_str(), b.field.as_str()))
            .collect();
        assert_eq!(
            blockers,
            vec![("eu-west/router/r", "gateway_network")],
            "cascade={cascade}"
        );
        assert_eq!(details.blockers[0].on_delete, "block");
        assert_eq!(
            get_state(c, "network/ext").await,
            v1::ResourceState::Active,
            "cascade={cascade}"
        );
    }
    assert_eq!(get_state(c, "router/r").await, v1::ResourceState::Active);
    // A dry run is refused the same way: the precondition holds for it too.
    let mut dry = delete_req("network/ext", true);
    dry.dry_run = true;
    assert_code(&c.delete(dry).await.unwrap_err(), tonic::Code::FailedPrecondition);
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn blocked_cascade_is_reported_and_finishes_when_the_blocker_goes() {
    let t = start_node().await;
    let c = &t.client;
    let op_id = blocked_cascade(c).await;

    let n1 = wait_blocked(c, "network/n1").await;
    let d = n1.deletion.clone().unwrap();
    assert_eq!(d.operation_id, op_id);
    assert!(d.reason.contains("cascade from eu-west/project/p1"), "{}", d.reason);
    let blockers: Vec<_> = d
        .blockers
        .iter()
        .map(|b| (b.referrer.as_str(), b.field.as_str(), b.referrer_deleting))
        .collect();
    assert_eq!(blockers, vec![("eu-west/router/r2", "gateway_network", false)]);
    assert!(
        d.message.contains("eu-west/router/r2"),
        "message names the blocker: {}",
        d.message
    );
    assert!(
        d.message.contains("stuck"),
        "a live blocker makes it stuck: {}",
        d.message
    );

    // The operation keeps running, with one blocked item; the root stays readable.
    let op = eventually(LIMIT, "operation to report the block", || async {
        let op = c.get_operation(&op_id, 100).await.ok()?;
        (op.progress.as_ref()?.blocked == 1).then_some(op)
    })
    .await;
    assert!(!op.done, "{op:?}");
    assert_eq!(op_state(&op), v1::OperationState::Running);
    assert!(op.outcomes.iter().any(|o| o.action == v1::OutcomeAction::Blocked as i32
        && o.resource.as_ref().is_some_and(|r| r.name == "eu-west/network/n1")
        && o.blockers.iter().any(|b| b.referrer == "eu-west/router/r2")));
    assert_eq!(get_state(c, "project/p1").await, v1::ResourceState::Deleting);
    // The blocker is untouched.
    assert_eq!(get_state(c, "router/r2").await, v1::ResourceState::Active);

    // The blocker goes: the cascade finishes.
    c.delete(delete_req("router/r2", false))
        .await
        .expect("router delete accepted");
    let op = wait_operation(c, &op_id).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded, "{op:?}");
    let p = op.progress.unwrap();
    assert_eq!((p.deleted, p.pending, p.blocked, p.failed), (2, 0, 0, 0), "{p:?}");
    wait_gone(c, "network/n1").await;
    wait_gone(c, "project/p1").await;
    wait_gone(c, "router/r2").await;
    assert_eq!(get_state(c, "project/p2").await, v1::ResourceState::Active);
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn blocked_cascade_finishes_when_the_blocker_drops_the_reference() {
    let t = start_node().await;
    let c = &t.client;
    let op_id = blocked_cascade(c).await;

    let r2 = get(c, "router/r2").await;
    let updated = c
        .update(spec("router/r2", &[("project", &["project/p2"])]), &r2.etag)
        .await
        .expect("dropping the gateway reference is allowed");
    assert!(targets(&updated, "gateway_network").is_empty());

    let op = wait_operation(c, &op_id).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded, "{op:?}");
    wait_gone(c, "network/n1").await;
    wait_gone(c, "project/p1").await;
    assert_eq!(get_state(c, "router/r2").await, v1::ResourceState::Active);
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn list_reference_owner_goes_with_its_last_element() {
    let t = start_node().await;
    let c = &t.client;
    c.batch_create(vec![
        spec("project/p", &[]),
        spec("network/n", &[("project", &["project/p"])]),
        spec("port/p1", &[("network", &["network/n"])]),
        spec("port/p2", &[("network", &["network/n"])]),
        spec("port_group/g", &[("ports", &["port/p1", "port/p2"])]),
    ])
    .await
    .unwrap();

    // Deleting one element removes it from the list; the group survives.
    let op = delete_and_wait(c, "port/p1", true).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded);
    assert_eq!(
        op.progress.as_ref().map(|p| (p.deleted, p.unset)),
        Some((1, 1)),
        "{op:?}"
    );
    wait_gone(c, "port/p1").await;
    let g = get(c, "port_group/g").await;
    assert_eq!(state(&g), v1::ResourceState::Active);
    assert_eq!(targets(&g, "ports"), vec!["eu-west/port/p2"]);

    // Deleting the last element deletes the owner.
    let op = c.delete(delete_req("port/p2", true)).await.unwrap().operation.unwrap();
    wait_gone(c, "port/p2").await;
    wait_gone(c, "port_group/g").await;
    let op = wait_operation(c, &op.id).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded);
    assert_eq!(op.progress.as_ref().map(|p| p.deleted), Some(2), "{op:?}");
    assert_eq!(get_state(c, "network/n").await, v1::ResourceState::Active);
    t.node.stop().await.unwrap();
}

const CYCLE_SCHEMA: &str = r#"
[kinds.a.refs.peer]
kind = "b"
on_delete = "cascade"

[kinds.b.refs.peer]
kind = "a"
on_delete = "cascade"
required = true
"#;

#[tokio::test]
async fn cascade_cycle_unwinds() {
    let t = start_node_with(CYCLE_SCHEMA, |_| {}).await;
    let c = &t.client;
    let a = c.create(spec("a/x", &[])).await.unwrap();
    c.create(spec("b/y", &[("peer", &["a/x"])])).await.unwrap();
    let a = c
        .update(spec("a/x", &[("peer", &["b/y"])]), &a.etag)
        .await
        .expect("closing the cycle");
    assert_eq!(targets(&a, "peer"), vec!["eu-west/b/y"]);

    let op = delete_and_wait(c, "a/x", true).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded, "{op:?}");
    assert_eq!(op.progress.as_ref().map(|p| p.deleted), Some(2), "{op:?}");
    wait_gone(c, "a/x").await;
    wait_gone(c, "b/y").await;
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn recreated_name_gets_a_new_uid_and_no_stale_effects() {
    let t = start_node().await;
    let c = &t.client;
    c.create(spec("project/p", &[])).await.unwrap();
    let old = c
        .create(spec("network/n", &[("project", &["project/p"])]))
        .await
        .unwrap();
    c.create(spec("port/old-port", &[("network", &["network/n"])]))
        .await
        .unwrap();

    let op = c
        .delete(delete_req("network/n", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    wait_gone(c, "network/n").await;
    wait_gone(c, "port/old-port").await;
    assert_eq!(
        op_state(&wait_operation(c, &op.id).await),
        v1::OperationState::Succeeded
    );

    let new = c
        .create(spec("network/n", &[("project", &["project/p"])]))
        .await
        .expect("name is free again");
    assert_ne!(new.uid, old.uid, "a fresh uid for the new incarnation");
    assert_eq!(state(&new), v1::ResourceState::Active);
    assert!(new.deletion.is_none());

    // A reference pinned to the old incarnation does not attach to the new one.
    let mut pinned = spec("port/pinned", &[("network", &["network/n"])]);
    pinned.refs[0].targets[0].uid = old.uid.clone();
    let err = c.create(pinned).await.unwrap_err();
    assert_code(&err, tonic::Code::FailedPrecondition);
    // The message says what is known (a purged uid leaves no record that
    // it was this name's, so it does not claim "re-created").
    let expected = format!("network/n has uid {}, not {}", new.uid, old.uid);
    assert!(status(&err).message().contains(&expected), "{err}");

    // A delete pinned to the old uid does not touch the new incarnation.
    let mut req = delete_req("network/n", true);
    req.uid = old.uid.clone();
    assert_code(&c.delete(req.clone()).await.unwrap_err(), tonic::Code::NotFound);
    req.allow_missing = true;
    let response = c.delete(req).await.expect("allow_missing makes it a no-op");
    assert!(response.operation.is_none(), "{response:?}");
    assert!(!response.already_deleting);
    let now = get(c, "network/n").await;
    assert_eq!(state(&now), v1::ResourceState::Active);
    assert_eq!(now.uid, new.uid);

    // Nothing references the new incarnation: a delete without cascade is accepted.
    let op = c
        .delete(delete_req("network/n", false))
        .await
        .expect("no dependents")
        .operation
        .unwrap();
    let op = wait_operation(c, &op.id).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded);
    assert_eq!(op.progress.as_ref().map(|p| p.deleted), Some(1), "{op:?}");
    wait_gone(c, "network/n").await;
    assert_eq!(get_state(c, "project/p").await, v1::ResourceState::Active);

    // Every event names the incarnation it is about.
    let mut events = c.watch(0, "network").await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 6 {
        let e = next_event(&mut events).await;
        let uid = e.resource.as_ref().unwrap().uid.clone();
        let incarnation = if uid == old.uid {
            "old"
        } else if uid == new.uid {
            "new"
        } else {
            panic!("event for an unknown uid: {e:?}")
        };
        seen.push((event_type(&e), incarnation));
    }
    use v1::EventType::{Created, Deleting, Purged};
    assert_eq!(
        seen,
        vec![
            (Created, "old"),
            (Deleting, "old"),
            (Purged, "old"),
            (Created, "new"),
            (Deleting, "new"),
            (Purged, "new")
        ]
    );
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn repeated_delete_of_a_deleting_resource_answers_ok_with_the_same_operation() {
    let t = start_node().await;
    let c = &t.client;
    let op_id = blocked_cascade(c).await;

    // The root, again (with or without cascade).
    for cascade in [true, false] {
        let again = c
            .delete(delete_req("project/p1", cascade))
            .await
            .expect("a repeated delete answers OK");
        assert!(again.already_deleting, "{again:?}");
        assert_eq!(again.operation.as_ref().map(|o| o.id.as_str()), Some(op_id.as_str()));
    }
    // A resource the cascade reached: even though a block reference holds it.
    let again = c
        .delete(delete_req("network/n1", false))
        .await
        .expect("a repeated delete answers OK");
    assert!(again.already_deleting, "{again:?}");
    assert_eq!(again.operation.as_ref().map(|o| o.id.as_str()), Some(op_id.as_str()));
    assert_eq!(get_state(c, "network/n1").await, v1::ResourceState::Deleting);
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn nothing_attaches_to_a_deleting_resource() {
    let t = start_node().await;
    let c = &t.client;
    blocked_cascade(c).await;

    // A new child of the DELETING network.
    let err = c
        .create(spec("port/late", &[("network", &["network/n1"])]))
        .await
        .unwrap_err();
    assert_code(&err, tonic::Code::FailedPrecondition);
    assert!(status(&err).message().contains("being deleted"), "{err}");
    assert!(status(&err).message().contains("eu-west/network/n1"), "{err}");
    assert_code(&c.get(&full("port/late")).await.unwrap_err(), tonic::Code::NotFound);

    // An existing referrer cannot be updated while it keeps the reference.
    let r2 = get(c, "router/r2").await;
    let changed = with_attr(
        spec(
            "router/r2",
            &[("project", &["project/p2"]), ("gateway_network", &["network/n1"])],
        ),
        "note",
        "changed",
    );
    let err = c.update(changed, &r2.etag).await.unwrap_err();
    assert_code(&err, tonic::Code::FailedPrecondition);
    assert!(status(&err).message().contains("being deleted"), "{err}");
    let after = get(c, "router/r2").await;
    assert_eq!(after.etag, r2.etag, "the refused update changed nothing");
    assert!(after.attributes.is_empty());

    // Nor can a resource under a DELETING parent be created through a batch.
    let err = c
        .batch_create(vec![spec("subnet/s-late", &[("network", &["network/n1"])])])
        .await
        .unwrap_err();
    assert_code(&err, tonic::Code::FailedPrecondition);
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn nothing_attaches_to_a_resource_held_by_a_finalizer() {
    let t = start_node().await;
    let c = &t.client;
    c.create(spec("project/p", &[])).await.unwrap();
    c.create(with_finalizers(
        spec("network/n", &[("project", &["project/p"])]),
        &["x"],
    ))
    .await
    .unwrap();
    c.delete(delete_req("network/n", false)).await.unwrap();
    wait_blocked(c, "network/n").await;

    let err = c
        .create(spec("port/late", &[("network", &["network/n"])]))
        .await
        .unwrap_err();
    assert_code(&err, tonic::Code::FailedPrecondition);
    assert!(status(&err).message().contains("being deleted"), "{err}");
    assert_eq!(get_state(c, "network/n").await, v1::ResourceState::Deleting);
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn dry_run_reports_a_plan_and_changes_nothing() {
    let t = start_node().await;
    let c = &t.client;
    c.batch_create(vec![
        spec("project/p", &[]),
        spec("project/other", &[]),
        spec("network/n", &[("project", &["project/p"])]),
        spec("subnet/s", &[("network", &["network/n"])]),
        spec("port/x", &[("network", &["network/n"]), ("subnet", &["subnet/s"])]),
        spec(
            "floating_ip/f",
            &[("project", &["project/other"]), ("port", &["port/x"])],
        ),
        spec(
            "router/r",
            &[("project", &["project/other"]), ("gateway_network", &["network/n"])],
        ),
    ])
    .await
    .unwrap();
    let before = c.list(v1::ListRequest::default()).await.unwrap().resources;
    assert_eq!(before.len(), 7);
    let last_revision = before.iter().map(|r| r.revision).max().unwrap();

    let mut req = delete_req("project/p", true);
    req.dry_run = true;
    let response = c.delete(req).await.expect("dry run");
    assert!(response.operation.is_none(), "a dry run starts nothing: {response:?}");
    let plan = response.plan.expect("a plan");
    assert!(!plan.truncated);
    let deleted: BTreeSet<_> = plan.deleted.iter().map(|r| r.name.as_str()).collect();
    let expected: BTreeSet<_> = [
        "eu-west/project/p",
        "eu-west/network/n",
        "eu-west/subnet/s",
        "eu-west/port/x",
    ]
    .into_iter()
    .collect();
    assert_eq!(deleted, expected);
    assert_eq!(plan.deleted.len(), 4, "no duplicates: {:?}", plan.deleted);
    assert_eq!(plan.deleted[0].name, "eu-west/project/p", "the root first");
    assert!(plan.deleted.iter().all(|r| !r.uid.is_empty()));
    let unset: Vec<_> = plan
        .unset
        .iter()
        .map(|u| (u.resource.as_ref().unwrap().name.as_str(), u.field.as_str()))
        .collect();
    assert_eq!(unset, vec![("eu-west/floating_ip/f", "port")]);
    let blocked: Vec<_> = plan
        .blocked
        .iter()
        .map(|b| {
            let blocker = b.blocker.as_ref().unwrap();
            (
                b.resource.as_ref().unwrap().name.as_str(),
                blocker.referrer.as_str(),
                blocker.field.as_str(),
                blocker.referrer_deleting,
            )
        })
        .collect();
    assert_eq!(
        blocked,
        vec![("eu-west/network/n", "eu-west/router/r", "gateway_network", false)]
    );

    // Nothing changed.
    let after = c.list(v1::ListRequest::default()).await.unwrap().resources;
    assert_eq!(after.len(), before.len());
    for (b, a) in before.iter().zip(&after) {
        assert_eq!((&a.name, &a.uid, a.revision), (&b.name, &b.uid, b.revision));
        assert_eq!(state(a), v1::ResourceState::Active, "{}", a.name);
    }
    assert_eq!(targets(&get(c, "floating_ip/f").await, "port"), vec!["eu-west/port/x"]);

    // No event after the last create but the marker's own.
    c.create(spec("project/marker", &[])).await.unwrap();
    let mut events = c.watch(0, "").await.unwrap();
    loop {
        let e = next_event(&mut events).await;
        assert_ne!(event_type(&e), v1::EventType::Deleting, "{e:?}");
        assert!(e.operation_id.is_empty(), "no operation ran: {e:?}");
        if event_name(&e) == "eu-west/project/marker" {
            assert_eq!(e.revision, last_revision + 1, "the dry run emitted nothing");
            break;
        }
    }
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn watch_resumes_without_gap_or_duplicate() {
    let t = start_node().await;
    let c = &t.client;
    for p in ["a", "b", "c", "d", "e"] {
        c.create(spec(&format!("project/{p}"), &[])).await.unwrap();
    }

    // Read three events, then drop the stream.
    let mut stream = c.watch(0, "").await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(next_event(&mut stream).await);
    }
    drop(stream);
    let revisions: Vec<u64> = seen.iter().map(|e| e.revision).collect();
    assert!(revisions.windows(2).all(|w| w[1] == w[0] + 1), "{revisions:?}");
    let names: Vec<_> = seen.iter().map(event_name).collect();
    assert_eq!(
        names,
        vec!["eu-west/project/a", "eu-west/project/b", "eu-west/project/c"]
    );
    let last_seen = *revisions.last().unwrap();

    // More changes while nobody watches.
    let a = get(c, "project/a").await;
    c.update(with_attr(spec("project/a", &[]), "k", "v"), &a.etag)
        .await
        .unwrap();
    c.create(spec("network/n", &[("project", &["project/a"])]))
        .await
        .unwrap();
    c.create(spec("port/x", &[("network", &["network/n"])])).await.unwrap();

    // Resume right after the last event seen.
    let mut stream = c.watch(last_seen + 1, "").await.unwrap();
    let expected = [
        ("eu-west/project/d", v1::EventType::Created),
        ("eu-west/project/e", v1::EventType::Created),
        ("eu-west/project/a", v1::EventType::Updated),
        ("eu-west/network/n", v1::EventType::Created),
        ("eu-west/port/x", v1::EventType::Created),
    ];
    for (i, (name, ty)) in expected.iter().enumerate() {
        let e = next_event(&mut stream).await;
        assert_eq!(e.revision, last_seen + 1 + i as u64, "consecutive revisions: {e:?}");
        assert_eq!((event_name(&e), event_type(&e)), (*name, *ty), "{e:?}");
    }
    // Live events continue the same sequence: nothing replayed twice.
    c.create(spec("project/z", &[])).await.unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!(e.revision, last_seen + 1 + expected.len() as u64, "{e:?}");
    assert_eq!(event_name(&e), "eu-west/project/z");
    drop(stream);

    // A kind filter passes only that kind, replayed and live.
    let mut ports = c.watch(0, "port").await.unwrap();
    let e = next_event(&mut ports).await;
    assert_eq!(
        (event_name(&e), event_type(&e)),
        ("eu-west/port/x", v1::EventType::Created)
    );
    c.create(spec("project/y", &[])).await.unwrap();
    c.create(spec("port/w", &[("network", &["network/n"])])).await.unwrap();
    let e = next_event(&mut ports).await;
    assert_eq!(
        (event_name(&e), event_type(&e)),
        ("eu-west/port/w", v1::EventType::Created),
        "{e:?}"
    );
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn finalizer_holds_a_deletion_until_removed() {
    let t = start_node().await;
    let c = &t.client;
    c.create(with_attr(
        with_finalizers(spec("project/p", &[]), &["x"]),
        "owner",
        "me",
    ))
    .await
    .unwrap();

    let op = c
        .delete(delete_req("project/p", false))
        .await
        .unwrap()
        .operation
        .unwrap();
    let held = wait_blocked(c, "project/p").await;
    assert_eq!(deletion_status(&held), v1::DeletionStatus::Blocked);
    let message = &held.deletion.as_ref().unwrap().message;
    assert!(message.contains("finalizer") && message.contains('x'), "{message}");
    assert_eq!(held.finalizers, vec!["x".to_owned()]);
    let running = c.get_operation(&op.id, 100).await.unwrap();
    assert!(!running.done);

    // Changing anything but the finalizers is refused while DELETING.
    let err = c
        .update(with_attr(spec("project/p", &[]), "owner", "someone-else"), "")
        .await
        .unwrap_err();
    assert_code(&err, tonic::Code::FailedPrecondition);
    assert_eq!(get_state(c, "project/p").await, v1::ResourceState::Deleting);

    // Removing the finalizer (same attributes and references) lets it go.
    let updated = c
        .update(with_attr(spec("project/p", &[]), "owner", "me"), &held.etag)
        .await
        .expect("removing a finalizer is allowed while DELETING");
    assert!(updated.finalizers.is_empty());
    wait_gone(c, "project/p").await;
    let op = wait_operation(c, &op.id).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded, "{op:?}");
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn list_pages_and_state_filter() {
    let t = start_node().await;
    let c = &t.client;
    let mut specs = vec![
        spec("project/p", &[]),
        spec("network/n", &[("project", &["project/p"])]),
    ];
    for i in 0..25 {
        let s = spec(&format!("port/port-{i:02}"), &[("network", &["network/n"])]);
        // Three of them will stay DELETING on their finalizer.
        specs.push(if i % 10 == 3 { with_finalizers(s, &["hold"]) } else { s });
    }
    c.batch_create(specs).await.unwrap();

    let list_all = |state: v1::ResourceState| async move {
        let mut token = String::new();
        let mut pages = Vec::new();
        loop {
            let page = c
                .list(v1::ListRequest {
                    kind: "port".into(),
                    state: state as i32,
                    page_size: 10,
                    page_token: token,
                    ..Default::default()
                })
                .await
                .unwrap();
            pages.push(page.resources.iter().map(|r| r.name.clone()).collect::<Vec<_>>());
            if page.next_page_token.is_empty() {
                return (pages, page.resources);
            }
            token = page.next_page_token;
        }
    };

    let (pages, _) = list_all(v1::ResourceState::Unspecified).await;
    let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![10, 10, 5]);
    let all: Vec<String> = pages.concat();
    let unique: BTreeSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), 25, "no duplicates: {all:?}");
    assert!(all.iter().all(|n| n.starts_with("eu-west/port/")));

    for i in [3, 13, 23] {
        c.delete(delete_req(&format!("port/port-{i:02}"), false)).await.unwrap();
    }
    for i in [3, 13, 23] {
        wait_blocked(c, &format!("port/port-{i:02}")).await;
    }
    let (pages, last) = list_all(v1::ResourceState::Deleting).await;
    assert_eq!(pages.len(), 1);
    assert_eq!(
        pages[0],
        vec!["eu-west/port/port-03", "eu-west/port/port-13", "eu-west/port/port-23"]
    );
    assert!(last
        .iter()
        .all(|r| state(r) == v1::ResourceState::Deleting && r.deletion.is_some()));

    let (pages, _) = list_all(v1::ResourceState::Active).await;
    let active: Vec<String> = pages.concat();
    assert_eq!(active.len(), 22);
    assert!(!active
        .iter()
        .any(|n| n.ends_with("-03") || n.ends_with("-13") || n.ends_with("-23")));
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn etag_preconditions() {
    let t = start_node().await;
    let c = &t.client;
    let created = c.create(spec("project/p", &[])).await.unwrap();
    assert!(!created.etag.is_empty());

    let err = c
        .update(with_attr(spec("project/p", &[]), "k", "1"), "not-the-etag")
        .await
        .unwrap_err();
    assert_code(&err, tonic::Code::Aborted);
    assert!(status(&err).message().contains("etag"), "{err}");
    assert!(
        get(c, "project/p").await.attributes.is_empty(),
        "a refused update changes nothing"
    );

    let updated = c
        .update(with_attr(spec("project/p", &[]), "k", "1"), &created.etag)
        .await
        .expect("the current etag");
    assert_ne!(updated.etag, created.etag, "an update moves the etag");
    assert_eq!(updated.attributes.get("k").map(String::as_str), Some("1"));

    // The old etag is stale now.
    let err = c
        .update(with_attr(spec("project/p", &[]), "k", "2"), &created.etag)
        .await
        .unwrap_err();
    assert_code(&err, tonic::Code::Aborted);

    let mut req = delete_req("project/p", false);
    req.etag = created.etag.clone();
    assert_code(&c.delete(req).await.unwrap_err(), tonic::Code::Aborted);
    assert_eq!(get_state(c, "project/p").await, v1::ResourceState::Active);

    let mut req = delete_req("project/p", false);
    req.etag = updated.etag.clone();
    let op = c
        .delete(req)
        .await
        .expect("delete with the current etag")
        .operation
        .unwrap();
    wait_operation(c, &op.id).await;
    wait_gone(c, "project/p").await;
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn unset_dependents_need_no_cascade() {
    let t = start_node().await;
    let c = &t.client;
    c.batch_create(vec![
        spec("project/p", &[]),
        spec("network/n", &[("project", &["project/p"])]),
        spec("security_group/sg1", &[("project", &["project/p"])]),
        spec("security_group/sg2", &[("project", &["project/p"])]),
        spec(
            "port/x",
            &[
                ("network", &["network/n"]),
                ("security_groups", &["security_group/sg1", "security_group/sg2"]),
            ],
        ),
    ])
    .await
    .unwrap();

    let op = c
        .delete(delete_req("security_group/sg1", false))
        .await
        .expect("unset dependents need no cascade");
    let op = wait_operation(c, &op.operation.unwrap().id).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded);
    assert_eq!(
        op.progress.as_ref().map(|p| (p.deleted, p.unset)),
        Some((1, 1)),
        "{op:?}"
    );
    let unset: Vec<_> = op
        .outcomes
        .iter()
        .filter(|o| o.action == v1::OutcomeAction::Unset as i32)
        .map(|o| (o.resource.as_ref().unwrap().name.as_str(), o.field.as_str()))
        .collect();
    assert_eq!(unset, vec![("eu-west/port/x", "security_groups")]);
    wait_gone(c, "security_group/sg1").await;
    let port = get(c, "port/x").await;
    assert_eq!(state(&port), v1::ResourceState::Active);
    assert_eq!(targets(&port, "security_groups"), vec!["eu-west/security_group/sg2"]);
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn allow_dangling_reference_reads_dangling_and_never_binds_to_a_new_incarnation() {
    let t = start_node().await;
    let c = &t.client;
    c.batch_create(vec![
        spec("project/p", &[]),
        spec("network/n", &[("project", &["project/p"])]),
        spec("qos_policy/q", &[]),
        spec(
            "port/x",
            &[("network", &["network/n"]), ("qos_policy", &["qos_policy/q"])],
        ),
    ])
    .await
    .unwrap();
    let before = get(c, "port/x").await;
    assert!(before.refs.iter().flat_map(|f| &f.targets).all(|t| !t.dangling));

    // Nothing depends on the policy in a way that blocks or cascades.
    let op = c
        .delete(delete_req("qos_policy/q", false))
        .await
        .unwrap()
        .operation
        .unwrap();
    wait_operation(c, &op.id).await;
    wait_gone(c, "qos_policy/q").await;
    let port = get(c, "port/x").await;
    assert_eq!(state(&port), v1::ResourceState::Active);
    let qos: Vec<_> = port
        .refs
        .iter()
        .filter(|f| f.field == "qos_policy")
        .flat_map(|f| &f.targets)
        .collect();
    assert_eq!(qos.len(), 1);
    assert!(qos[0].dangling, "the target is gone: {qos:?}");

    // A new policy under the same name is another incarnation: still dangling.
    let new = c.create(spec("qos_policy/q", &[])).await.unwrap();
    let port = get(c, "port/x").await;
    let qos: Vec<_> = port
        .refs
        .iter()
        .filter(|f| f.field == "qos_policy")
        .flat_map(|f| &f.targets)
        .collect();
    assert_ne!(qos[0].uid, new.uid);
    assert!(qos[0].dangling, "the reference is to the old incarnation: {qos:?}");
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn list_owner_inside_one_cascade_is_deleted_not_unset() {
    let t = start_node().await;
    let c = &t.client;
    c.batch_create(vec![
        spec("project/p", &[]),
        spec("network/n", &[("project", &["project/p"])]),
        spec("port/p1", &[("network", &["network/n"])]),
        spec("port/p2", &[("network", &["network/n"])]),
        spec("port_group/g", &[("ports", &["port/p1", "port/p2"])]),
    ])
    .await
    .unwrap();

    let mut dry = delete_req("network/n", true);
    dry.dry_run = true;
    let plan = c.delete(dry).await.unwrap().plan.unwrap();
    let planned: BTreeSet<_> = plan.deleted.iter().map(|r| r.name.as_str()).collect();
    assert!(planned.contains("eu-west/port_group/g"), "{planned:?}");
    assert!(
        plan.unset.is_empty(),
        "the group is deleted, not unset: {:?}",
        plan.unset
    );

    let op = delete_and_wait(c, "network/n", true).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded);
    wait_gone(c, "port_group/g").await;
    let outcome = op
        .outcomes
        .iter()
        .find(|o| o.resource.as_ref().is_some_and(|r| r.name == "eu-west/port_group/g"))
        .expect("an outcome for the group");
    assert_eq!(outcome.action, v1::OutcomeAction::Deleted as i32);
    assert_eq!(
        op.progress.as_ref().map(|p| (p.deleted, p.unset)),
        Some((4, 0)),
        "{op:?}"
    );
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn name_of_a_deleting_resource_is_not_free() {
    let t = start_node().await;
    let c = &t.client;
    blocked_cascade(c).await;
    let err = c
        .create(spec("network/n1", &[("project", &["project/p2"])]))
        .await
        .unwrap_err();
    assert_code(&err, tonic::Code::AlreadyExists);
    assert!(status(&err).message().contains("being deleted"), "{err}");
    assert_eq!(get_state(c, "network/n1").await, v1::ResourceState::Deleting);
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn cascaded_child_with_a_finalizer_holds_the_root() {
    let t = start_node().await;
    let c = &t.client;
    c.create(spec("project/p", &[])).await.unwrap();
    c.create(with_finalizers(
        spec("network/n", &[("project", &["project/p"])]),
        &["ipam"],
    ))
    .await
    .unwrap();
    let op = c
        .delete(delete_req("project/p", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    let held = wait_blocked(c, "network/n").await;
    assert!(held.deletion.as_ref().unwrap().message.contains("ipam"), "{held:?}");
    assert_eq!(
        get_state(c, "project/p").await,
        v1::ResourceState::Deleting,
        "the root waits"
    );
    assert!(!c.get_operation(&op.id, 10).await.unwrap().done);

    // The finalizer's controller writes back what it read, minus the finalizer.
    let mut done = v1::ResourceSpec {
        name: held.name.clone(),
        attributes: held.attributes.clone(),
        refs: held.refs.clone(),
        finalizers: Vec::new(),
    };
    for f in &mut done.refs {
        for t in &mut f.targets {
            t.dangling = false;
        }
    }
    c.update(done, &held.etag).await.expect("finalizer removed");
    let op = wait_operation(c, &op.id).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded, "{op:?}");
    wait_gone(c, "network/n").await;
    wait_gone(c, "project/p").await;
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn blocked_deletion_fails_after_the_maximum_attempts_and_can_still_finish() {
    let t = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        s.policy.max_attempts = 2;
        s.policy.backoff_base_ms = 10;
        s.policy.backoff_cap_ms = 20;
    })
    .await;
    let c = &t.client;
    let op_id = blocked_cascade(c).await;

    let failed = eventually(LIMIT, "n1 deletion to be FAILED", || async {
        let r = c.get(&full("network/n1")).await.ok()?;
        (deletion_status(&r) == v1::DeletionStatus::Failed).then_some(r)
    })
    .await;
    assert_eq!(
        state(&failed),
        v1::ResourceState::Deleting,
        "a failed deletion stays readable"
    );
    let message = &failed.deletion.as_ref().unwrap().message;
    assert!(
        message.contains("eu-west/router/r2"),
        "the last error names the blocker: {message}"
    );

    let op = wait_operation(c, &op_id).await;
    assert_eq!(op_state(&op), v1::OperationState::Failed, "{op:?}");
    assert_eq!(op.progress.as_ref().map(|p| p.failed), Some(1), "{op:?}");
    assert!(op.outcomes.iter().any(|o| o.action == v1::OutcomeAction::Failed as i32
        && o.resource.as_ref().is_some_and(|r| r.name == "eu-west/network/n1")));

    let mut events = c.watch(0, "network").await.unwrap();
    loop {
        let e = next_event(&mut events).await;
        if event_type(&e) == v1::EventType::DeletionFailed {
            assert_eq!(event_name(&e), "eu-west/network/n1");
            assert_eq!(e.operation_id, op_id);
            break;
        }
    }
    drop(events);

    // The blocker goes: the failed deletion still finishes.
    c.delete(delete_req("router/r2", false)).await.unwrap();
    wait_gone(c, "network/n1").await;
    // The report follows: the failure is replaced by the deletion.
    let after = c.get_operation(&op_id, 100).await.unwrap();
    assert!(after.done);
    let p = after.progress.unwrap();
    assert_eq!((p.deleted, p.pending, p.failed), (2, 0, 0), "{after:?}");
    assert_eq!(op_state(&after), v1::OperationState::Succeeded, "{after:?}");
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn operation_outcomes_are_paged() {
    let t = start_node().await;
    let c = &t.client;
    let mut specs = vec![
        spec("project/p", &[]),
        spec("network/n", &[("project", &["project/p"])]),
    ];
    for i in 0..25 {
        specs.push(spec(&format!("port/x-{i:02}"), &[("network", &["network/n"])]));
    }
    c.batch_create(specs).await.unwrap();
    let op = c
        .delete(delete_req("network/n", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    wait_operation(c, &op.id).await;

    let mut token = String::new();
    let mut names = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let page = c
            .raw()
            .get_operation(v1::GetOperationRequest {
                id: op.id.clone(),
                outcomes_page_size: 10,
                outcomes_page_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        sizes.push(page.outcomes.len());
        names.extend(page.outcomes.iter().map(|o| o.resource.clone().unwrap().name));
        if page.next_outcomes_page_token.is_empty() {
            break;
        }
        token = page.next_outcomes_page_token;
    }
    assert_eq!(sizes, vec![10, 10, 6]);
    let unique: BTreeSet<_> = names.iter().collect();
    assert_eq!(unique.len(), 26, "network + 25 ports, no duplicates: {names:?}");
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn blocker_inside_the_same_cascade_does_not_hold_it() {
    let t = start_node().await;
    let c = &t.client;
    c.batch_create(vec![
        spec("project/p", &[]),
        spec("network/n", &[("project", &["project/p"])]),
        spec(
            "router/r",
            &[("project", &["project/p"]), ("gateway_network", &["network/n"])],
        ),
    ])
    .await
    .unwrap();

    let mut dry = delete_req("project/p", true);
    dry.dry_run = true;
    let plan = c.delete(dry).await.unwrap().plan.unwrap();
    assert_eq!(plan.deleted.len(), 3, "{plan:?}");
    assert!(plan.blocked.is_empty(), "the blocker goes with the cascade: {plan:?}");

    let op = delete_and_wait(c, "project/p", true).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded, "{op:?}");
    let p = op.progress.unwrap();
    assert_eq!((p.deleted, p.pending, p.blocked, p.failed), (3, 0, 0, 0), "{p:?}");
    for gone in ["project/p", "network/n", "router/r"] {
        wait_gone(c, gone).await;
    }
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn update_moves_back_references() {
    let t = start_node().await;
    let c = &t.client;
    c.batch_create(vec![
        spec("project/p", &[]),
        spec("network/n1", &[("project", &["project/p"])]),
        spec("network/n2", &[("project", &["project/p"])]),
        spec("port/x", &[("network", &["network/n1"])]),
    ])
    .await
    .unwrap();
    let err = c.delete(delete_req("network/n1", false)).await.unwrap_err();
    assert_code(&err, tonic::Code::FailedPrecondition);

    let x = get(c, "port/x").await;
    c.update(spec("port/x", &[("network", &["network/n2"])]), &x.etag)
        .await
        .unwrap();

    // n1 has no dependents any more; n2 has the port.
    let op = c
        .delete(delete_req("network/n1", false))
        .await
        .expect("no dependents left")
        .operation
        .unwrap();
    let op = wait_operation(c, &op.id).await;
    assert_eq!(op.progress.as_ref().map(|p| p.deleted), Some(1), "only n1: {op:?}");
    wait_gone(c, "network/n1").await;
    assert_eq!(get_state(c, "port/x").await, v1::ResourceState::Active);
    let err = c.delete(delete_req("network/n2", false)).await.unwrap_err();
    let listed = cascade_proto::error_details(status(&err)).unwrap().dependents;
    assert_eq!(
        listed.iter().map(|d| d.referrer.as_str()).collect::<Vec<_>>(),
        vec!["eu-west/port/x"]
    );
    c.delete(delete_req("network/n2", true)).await.unwrap();
    wait_gone(c, "port/x").await;
    t.node.stop().await.unwrap();
}

#[tokio::test]
async fn delete_with_the_current_uid_is_accepted() {
    let t = start_node().await;
    let c = &t.client;
    let p = c.create(spec("project/p", &[])).await.unwrap();
    let mut req = delete_req("project/p", false);
    req.uid = p.uid.clone();
    let op = c.delete(req).await.expect("matching uid").operation.unwrap();
    assert_eq!(op.root.as_ref().map(|r| r.uid.as_str()), Some(p.uid.as_str()));
    wait_gone(c, "project/p").await;
    t.node.stop().await.unwrap();
}

/// Creates race a cascade delete of their parent: every create either
/// lands before the network enters DELETING (and is then cascaded) or is
/// refused; at quiescence no port references the purged network.
#[tokio::test]
async fn creates_racing_a_cascade_leave_no_dangling_reference() {
    let t = start_node().await;
    let c = &t.client;
    c.create(spec("project/p", &[])).await.unwrap();
    let net = c
        .create(spec("network/n", &[("project", &["project/p"])]))
        .await
        .unwrap();
    for i in 0..5 {
        c.create(spec(&format!("port/pre-{i}"), &[("network", &["network/n"])]))
            .await
            .unwrap();
    }

    let creators: Vec<_> = (0..4)
        .map(|w| {
            let c = c.clone();
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for i in 0..40 {
                    let name = format!("port/w{w}-{i}");
                    let r = c.create(spec(&name, &[("network", &["network/n"])])).await;
                    outcomes.push((name, r.map(|r| r.uid).map_err(|e| code(&e))));
                }
                outcomes
            })
        })
        .collect();
    let deleter = {
        let c = c.clone();
        tokio::spawn(async move { c.delete(delete_req("network/n", true)).await })
    };
    let op = deleter.await.unwrap().expect("cascade accepted").operation.unwrap();
    let mut refused = 0;
    for creator in creators {
        for (name, outcome) in creator.await.unwrap() {
            match outcome {
                Ok(_) => {}
                Err(Some(tonic::Code::FailedPrecondition | tonic::Code::NotFound)) => refused += 1,
                Err(other) => panic!("{name}: unexpected {other:?}"),
            }
        }
    }
    let op = wait_operation(c, &op.id).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded, "{op:?}");
    wait_gone(c, "network/n").await;
    let ports = c
        .list(v1::ListRequest {
            kind: "port".into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .resources;
    let dangling: Vec<_> = ports
        .iter()
        .filter(|p| p.refs.iter().flat_map(|f| &f.targets).any(|t| t.uid == net.uid))
        .map(|p| p.name.as_str())
        .collect();
    assert!(
        dangling.is_empty(),
        "ports left referencing the purged network: {dangling:?}"
    );
    let p = op.progress.unwrap();
    assert_eq!(
        p.deleted as usize + refused,
        1 + 5 + 160,
        "every port was cascaded or refused: {p:?}"
    );
    t.node.stop().await.unwrap();
}
