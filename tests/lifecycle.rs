//! When deletions must not simply run: liens that protect a resource,
//! orphan deletes that keep the dependents, finalizer controllers that
//! fail and are asked again, and the schema check that finds stuck paths.
//! Real nodes in three regions; every call goes through the public API, and
//! the checker runs at the end.

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

/// `cascade schema check` over seed 002's stuck case: it names the path
/// and the blocker, exits 0 (a warning), and exits 1 on an error.
#[test]
fn schema_check_names_seed_002s_stuck_path_and_fails_on_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let stuck = dir.path().join("stuck.toml");
    std::fs::write(&stuck, SEED_002_SCHEMA).unwrap();
    let run = |file: &std::path::Path, json: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_cascade"));
        cmd.arg("schema").arg("check").arg(file);
        if json {
            cmd.args(["-o", "json"]);
        }
        cmd.output().expect("cascade runs")
    };
    let out = run(&stuck, false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("a → c (via c.a)") && text.contains("(d.c)"), "{text}");
    let out = run(&stuck, true);
    #[allow(clippy::disallowed_methods)] // test code: reads the CLI's output, not stored data
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["stuck"][0]["path"], serde_json::json!(["a", "c"]));
    assert_eq!(json["stuck"][0]["blocked_by"], "d.c");

    let broken = dir.path().join("broken.toml");
    std::fs::write(
        &broken,
        "[kinds.port.refs.network]\nkind = \"netwrk\"\non_delete = \"cascade\"\n",
    )
    .unwrap();
    let out = run(&broken, false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("kinds.port.refs.network: unknown kind \"netwrk\""),
        "{text}"
    );
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/schemas/neutron.toml");
    let out = run(&example, false);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: "));
}

/// A finalizer controller as a person writes one: it watches the deletion
/// events of its kind on its region's node and answers, through any node,
/// for the finalizer `dns`: a failure for the first `failures` requests
/// (the DELETING event, then each FINALIZER_RETRY), then done. Returns,
/// per request, the event's time and the time of the failure it answered
/// before it (None for the first).
async fn run_dns_controller(
    watch_on: &cascade_client::Client,
    answer_via: &cascade_client::Client,
    name: &str,
    failures: usize,
    requests: usize,
) -> Vec<(i64, Option<i64>)> {
    let kind = name.split('/').nth(1).expect("region/kind/id");
    let mut events = watch_on.watch(0, kind).await.expect("watch");
    let mut asked = Vec::new();
    let mut last_failure: Option<i64> = None;
    while asked.len() < requests {
        let event = tokio::time::timeout(std::time::Duration::from_secs(30), events.message())
            .await
            .expect("the controller is asked again in time")
            .expect("the stream stays up")
            .expect("the stream does not end");
        let kind = v1::EventType::try_from(event.r#type).unwrap_or(v1::EventType::Unspecified);
        let about = event.resource.as_ref().map(|r| r.name.as_str());
        if about != Some(name) || !matches!(kind, v1::EventType::Deleting | v1::EventType::FinalizerRetry) {
            continue;
        }
        asked.push((event.time_ms, last_failure));
        let uid = event.resource.map(|r| r.uid).unwrap_or_default();
        if asked.len() <= failures {
            let r = answer_via
                .report_finalizer_failure(v1::ReportFinalizerFailureRequest {
                    name: name.to_owned(),
                    uid,
                    finalizer: "dns".to_owned(),
                    reason: format!("zone locked ({})", asked.len()),
                })
                .await
                .expect("failure reported");
            let d = r.deletion.expect("DELETING");
            last_failure = Some(d.finalizer_failures[0].last_time_ms);
        } else {
            answer_via
                .remove_finalizer(v1::RemoveFinalizerRequest {
                    name: name.to_owned(),
                    uid,
                    finalizer: "dns".to_owned(),
                })
                .await
                .expect("finalizer removed");
        }
    }
    asked
}

fn with_finalizer(mut s: v1::ResourceSpec, finalizer: &str) -> v1::ResourceSpec {
    s.finalizers = vec![finalizer.to_owned()];
    s
}

/// Issue 11's first case: the controller fails three times, is asked again
/// after each backoff (base 200 ms, doubling), then succeeds, and the
/// cross-region cascade finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_controller_that_fails_three_times_then_succeeds_finishes_the_cascade() {
    let c = start_cluster_with(&["ra", "rb", "rc"], |s| {
        s.policy.backoff_base_ms = 200;
        s.policy.backoff_cap_ms = 5_000;
        s.policy.max_attempts = 5;
    })
    .await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        with_finalizer(spec_in("ra/network/net", &[("project", &["ra/project/p"])]), "dns"),
    ])
    .await
    .unwrap();
    b.create(spec_in("rb/port/x", &[("network", &["ra/network/net"])]))
        .await
        .unwrap();

    let controller = {
        let (watch_on, answer_via) = (a.clone(), b.clone());
        tokio::spawn(async move { run_dns_controller(&watch_on, &answer_via, "ra/network/net", 3, 4).await })
    };
    let op = delete_and_wait(b, "ra/project/p", true).await;
    assert_eq!(op_state(&op), v1::OperationState::Succeeded, "{op:?}");
    assert_eq!(
        outcome_of(&op, "ra/network/net").action,
        v1::OutcomeAction::Deleted as i32
    );
    assert_eq!(outcome_of(&op, "rb/port/x").action, v1::OutcomeAction::Deleted as i32);
    let asked = controller.await.expect("controller");
    assert_eq!(asked.len(), 4, "the DELETING event and three retries: {asked:?}");
    for (attempt, (asked_at, failed_at)) in asked.iter().enumerate().skip(1) {
        let backoff = 200i64 << (attempt - 1);
        let failed_at = failed_at.expect("a retry follows a failure");
        assert!(
            asked_at - failed_at >= backoff,
            "retry {attempt} came {} ms after the failure, before its backoff of {backoff} ms",
            asked_at - failed_at
        );
    }
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// A controller that always fails: the deletion ends FAILED after the
/// maximum with a DELETION_FAILED event carrying the last reason; a later
/// RemoveFinalizer still finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_that_always_fails_ends_failed_and_a_later_removal_finishes_it() {
    let c = start_cluster_with(&["ra", "rb"], |s| {
        s.policy.backoff_base_ms = 50;
        s.policy.max_attempts = 3;
    })
    .await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    a.create(with_finalizer(spec_in("ra/project/p", &[]), "dns"))
        .await
        .unwrap();
    b.create(spec_in("rb/network/n", &[("project", &["ra/project/p"])]))
        .await
        .unwrap();
    let controller = {
        let (watch_on, answer_via) = (a.clone(), a.clone());
        tokio::spawn(async move { run_dns_controller(&watch_on, &answer_via, "ra/project/p", 3, 3).await })
    };
    let op = b
        .delete(delete_req("ra/project/p", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    controller.await.expect("controller");
    let failed = eventually(std::time::Duration::from_secs(30), "the deletion to fail", || async {
        let r = a.get("ra/project/p").await.ok()?;
        let d = r.deletion?;
        (d.status == v1::DeletionStatus::Failed as i32).then_some(d)
    })
    .await;
    assert!(failed.message.contains("zone locked (3)"), "{failed:?}");
    assert_eq!(failed.finalizer_failures[0].failures, 3);
    let mut events = a.watch(0, "project").await.unwrap();
    let event = loop {
        let e = events.message().await.unwrap().expect("event");
        if e.r#type == v1::EventType::DeletionFailed as i32 {
            break e;
        }
    };
    assert!(event.message.contains("zone locked (3)"), "{event:?}");
    let running = b.get_operation(&op.id, 100).await.unwrap();
    assert_eq!(running.progress.unwrap().failed, 1, "{running:?}");

    b.remove_finalizer(v1::RemoveFinalizerRequest {
        name: "ra/project/p".into(),
        uid: String::new(),
        finalizer: "dns".into(),
    })
    .await
    .unwrap();
    wait_gone(b, "ra/project/p").await;
    let done = wait_operation(b, &op.id).await;
    assert_eq!(op_state(&done), v1::OperationState::Succeeded, "{done:?}");
    assert_eq!(
        outcome_of(&done, "ra/project/p").action,
        v1::OutcomeAction::Deleted as i32
    );
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// Seed 002's schema: deleting an `a` cascades to its `c`s; a `d`, which
/// no cascade from an `a` reaches, may block a `c`.
const SEED_002_SCHEMA: &str = "[kinds.a]\n[kinds.d]\n[kinds.c.refs.a]\nkind = \"a\"\non_delete = \"cascade\"\n\
                               [kinds.d.refs.c]\nkind = \"c\"\non_delete = \"block\"\n";

/// Issue 11: seed 002's stuck case across regions. ra's `a` cascades to
/// rc's `c`, which rb's `d` (unrelated to the `a`) blocks. ExplainDeletion,
/// asked through any node by name or by operation, names the blocker and
/// its region and flags the `c` stuck (the CLI draws it and exits 1);
/// deleting the `d` lets the operation finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_a_blocker_in_another_region_and_flags_seed_002s_stuck_cascade() {
    let schema = std::sync::Arc::new(cascade_core::Schema::from_toml(SEED_002_SCHEMA).expect("schema"));
    let mut c = start_cluster_with(&["ra", "rb", "rc"], |s| s.schema = schema.clone()).await;
    let (a, b, rc) = (c.client("ra").clone(), c.client("rb").clone(), c.client("rc").clone());
    let (a, b, rc) = (&a, &b, &rc);
    a.create(spec_in("ra/a/x", &[])).await.unwrap();
    rc.create(spec_in("rc/c/y", &[("a", &["ra/a/x"])])).await.unwrap();
    b.create(spec_in("rb/d/z", &[("c", &["rc/c/y"])])).await.unwrap();
    let op = b.delete(delete_req("ra/a/x", true)).await.unwrap().operation.unwrap();
    let explained = eventually(std::time::Duration::from_secs(30), "c to be blocked", || async {
        let e = b
            .explain_deletion(v1::ExplainDeletionRequest {
                name: "ra/a/x".into(),
                operation_id: String::new(),
            })
            .await
            .ok()?;
        e.stuck.then_some(e)
    })
    .await;
    assert_eq!(explained.operation_id, op.id);
    assert!(explained.unreachable_regions.is_empty(), "{explained:?}");
    let find = |name: &str| {
        explained
            .deletions
            .iter()
            .find(|d| d.resource.as_ref().is_some_and(|r| r.name == name))
            .unwrap_or_else(|| panic!("{name} is not explained: {explained:?}"))
    };
    let root = find("ra/a/x");
    assert!(!root.stuck && root.parent.is_empty(), "{root:?}");
    assert!(
        root.reasons
            .iter()
            .any(|r| r.contains("waits for the 1 deletion(s) its cascade started")),
        "{root:?}"
    );
    let blocked = find("rc/c/y");
    assert_eq!((blocked.parent.as_str(), blocked.field.as_str()), ("ra/a/x", "a"));
    assert!(blocked.stuck, "{blocked:?}");
    assert_eq!(
        blocked.reasons,
        ["blocked by rb/d/z (region rb, field c): live, not being deleted, and outside this deletion: stuck until it is deleted or its reference changed"]
    );
    // By operation id, through another node: the same explanation.
    let by_op = rc
        .explain_deletion(v1::ExplainDeletionRequest {
            name: String::new(),
            operation_id: op.id.clone(),
        })
        .await
        .unwrap();
    assert_eq!(by_op.deletions.len(), explained.deletions.len());
    assert!(by_op.stuck);
    // The CLI draws the tree and exits 1 while something is stuck.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["--server", &c.node("rc").node.endpoint(), "explain", "ra/a/x"])
        .output()
        .expect("cascade runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("└─ rc/c/y (via a)  BLOCKED  [stuck]") && text.contains("blocked by rb/d/z (region rb"),
        "{text}"
    );

    // A region that cannot be asked is named, and so is what waits on it.
    c.stop("rc").await;
    let partial = b
        .explain_deletion(v1::ExplainDeletionRequest {
            name: "ra/a/x".into(),
            operation_id: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(partial.unreachable_regions, ["rc"], "{partial:?}");
    let root = partial
        .deletions
        .iter()
        .find(|d| d.resource.as_ref().is_some_and(|r| r.name == "ra/a/x"))
        .expect("the root is explained by its own region");
    assert!(
        root.reasons
            .iter()
            .any(|r| r == "region rc is unreachable: it acts once it is back"),
        "{root:?}"
    );
    c.restart("rc").await;

    // Deleting the blocker lets the cascade finish.
    delete_and_wait(b, "rb/d/z", false).await;
    let done = wait_operation(b, &op.id).await;
    assert_eq!(op_state(&done), v1::OperationState::Succeeded, "{done:?}");
    let after = b
        .explain_deletion(v1::ExplainDeletionRequest {
            name: String::new(),
            operation_id: op.id.clone(),
        })
        .await
        .unwrap();
    assert!(after.deletions.is_empty() && !after.stuck, "{after:?}");
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}
