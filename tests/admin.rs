//! The operators' API (`cascade.v1.Admin`) over real nodes: finding a
//! deletion that does not finish, retrying a failed one, the audit log, and
//! the gate that keeps everyone but an administrator out (a token without
//! TLS; a certificate identity with mutual TLS, forwarded between regions).

mod support;

use cascade_client::{AdminClient, ClientError};
use cascade_proto::v1;
use std::time::Duration;
use support::*;

const TOKEN: &str = "test-admin-token-0123456789";

async fn admin(c: &Cluster, region: &str, token: Option<&str>) -> AdminClient {
    AdminClient::connect_with(&c.node(region).node.endpoint(), None, token.map(str::to_owned))
        .await
        .expect("admin client connects")
}

fn deletions(region: &str, status: v1::DeletionStatus, stuck: bool) -> v1::ListDeletionsRequest {
    v1::ListDeletionsRequest {
        region: region.to_owned(),
        status: status as i32,
        stuck,
        ..Default::default()
    }
}

fn audit(region: &str) -> v1::ListAuditRequest {
    v1::ListAuditRequest {
        region: region.to_owned(),
        ..Default::default()
    }
}

fn denied(result: Result<impl std::fmt::Debug, ClientError>) -> String {
    match result {
        Err(ClientError::Status(s)) if s.code() == tonic::Code::PermissionDenied => s.message().to_owned(),
        other => panic!("expected PERMISSION_DENIED, got {other:?}"),
    }
}

fn failure(uid: &str, reason: &str) -> v1::ReportFinalizerFailureRequest {
    v1::ReportFinalizerFailureRequest {
        name: "ra/project/p".into(),
        uid: uid.to_owned(),
        finalizer: "dns".into(),
        reason: reason.to_owned(),
    }
}

/// Issue 11: a finalizer that always fails ends FAILED; an administrator
/// finds it (through another region's node), retries it, and the
/// controller, asked again, finishes it; everyone else is refused, and the
/// audit log shows who did what, and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_administrator_finds_and_retries_a_failed_deletion_and_the_audit_log_says_who_and_why() {
    let c = start_cluster_with(&["ra", "rb"], |s| {
        s.policy.backoff_base_ms = 50;
        s.policy.max_attempts = 2;
        s.admin.token = Some(TOKEN.to_owned());
    })
    .await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    let mut p = spec_in("ra/project/p", &[]);
    p.finalizers = vec!["dns".into()];
    let p = a.create(p).await.unwrap();
    b.create(spec_in("rb/network/n", &[("project", &["ra/project/p"])]))
        .await
        .unwrap();
    let op = b
        .delete(delete_req("ra/project/p", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    for attempt in 1..=2 {
        a.report_finalizer_failure(failure(&p.uid, &format!("zone locked ({attempt})")))
            .await
            .unwrap();
    }
    eventually(Duration::from_secs(30), "the deletion to fail", || async {
        let d = a.get("ra/project/p").await.ok()?.deletion?;
        (d.status == v1::DeletionStatus::Failed as i32).then_some(())
    })
    .await;

    // Nobody but an administrator gets in, through any node.
    for via in ["ra", "rb"] {
        let anonymous = admin(&c, via, None).await;
        let why = denied(
            anonymous
                .list_deletions(deletions("ra", v1::DeletionStatus::Unspecified, false))
                .await,
        );
        assert!(why.contains("no credentials is not an administrator"), "{why}");
        let wrong = admin(&c, via, Some("not-the-token-at-all")).await;
        denied(
            wrong
                .retry_deletion(v1::RetryDeletionRequest {
                    name: "ra/project/p".into(),
                    reason: "let me".into(),
                })
                .await,
        );
    }
    let d = a.get("ra/project/p").await.unwrap().deletion.unwrap();
    assert_eq!(
        d.status,
        v1::DeletionStatus::Failed as i32,
        "a refused retry changed nothing"
    );

    // The administrator finds it from rb: FAILED and stuck, with its reason.
    let root = admin(&c, "rb", Some(TOKEN)).await;
    let failed = root
        .list_deletions(deletions("ra", v1::DeletionStatus::Failed, true))
        .await
        .unwrap()
        .deletions;
    assert_eq!(failed.len(), 1, "{failed:?}");
    let entry = &failed[0];
    let resource = entry.resource.as_ref().unwrap();
    assert_eq!((resource.name.as_str(), entry.stuck), ("ra/project/p", true));
    assert!(
        resource.deletion.as_ref().unwrap().message.contains("zone locked (2)"),
        "{entry:?}"
    );
    let blocked = root
        .list_deletions(deletions("ra", v1::DeletionStatus::Blocked, false))
        .await
        .unwrap();
    assert!(blocked.deletions.is_empty(), "{blocked:?}");
    let young = root
        .list_deletions(v1::ListDeletionsRequest {
            older_than_ms: 3_600_000,
            ..deletions("ra", v1::DeletionStatus::Unspecified, false)
        })
        .await
        .unwrap();
    assert!(
        young.deletions.is_empty(),
        "nothing has been deleting for an hour: {young:?}"
    );

    // Retried through rb, forwarded to ra: the controller is asked again.
    let mut events = a.watch(0, "project").await.unwrap();
    let retried = root
        .retry_deletion(v1::RetryDeletionRequest {
            name: "ra/project/p".into(),
            reason: "dns fixed (ticket 42)".into(),
        })
        .await
        .unwrap();
    let d = retried.resource.unwrap().deletion.unwrap();
    assert_ne!(d.status, v1::DeletionStatus::Failed as i32, "{d:?}");
    assert!(d.finalizer_failures.is_empty(), "the count starts from zero: {d:?}");
    let asked = loop {
        let e = tokio::time::timeout(Duration::from_secs(30), events.message())
            .await
            .expect("asked again in time")
            .unwrap()
            .expect("event");
        if e.r#type == v1::EventType::FinalizerRetry as i32 && e.message.contains("retried by token") {
            break e;
        }
    };
    assert!(asked.message.contains("attempt 1 of 2"), "{asked:?}");
    a.remove_finalizer(v1::RemoveFinalizerRequest {
        name: "ra/project/p".into(),
        uid: p.uid.clone(),
        finalizer: "dns".into(),
    })
    .await
    .unwrap();
    wait_gone(b, "ra/project/p").await;
    let done = wait_operation(b, &op.id).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");

    // The audit log of ra: the refused attempts, then the retry, with who and why.
    let log = root.list_audit(audit("ra")).await.unwrap().entries;
    let retry = log
        .iter()
        .find(|e| e.action == "RetryDeletion" && e.outcome == "ok")
        .unwrap_or_else(|| panic!("no retry in {log:?}"));
    assert_eq!(
        (
            retry.who.as_str(),
            retry.target.as_str(),
            retry.reason.as_str(),
            retry.region.as_str()
        ),
        ("token", "ra/project/p", "dns fixed (ticket 42)", "ra")
    );
    let refusals: Vec<&v1::AuditEntry> = log
        .iter()
        .filter(|e| e.outcome.starts_with("PERMISSION_DENIED"))
        .collect();
    assert!(
        refusals
            .iter()
            .any(|e| e.who == "no credentials" && e.action == "ListDeletions"),
        "{log:?}"
    );
    assert!(
        refusals
            .iter()
            .any(|e| e.who.contains("not this node's admin token") && e.action == "RetryDeletion"),
        "{log:?}"
    );
    assert!(
        log.windows(2).all(|w| w[0].time_ms <= w[1].time_ms),
        "oldest first: {log:?}"
    );
    // Paged one by one, the same entries, each once.
    let mut paged = Vec::new();
    let mut token = String::new();
    loop {
        let page = root
            .list_audit(v1::ListAuditRequest {
                region: "ra".into(),
                page_size: 1,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap();
        paged.extend(page.entries.into_iter().map(|e| e.id));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    let ids: Vec<String> = log.iter().map(|e| e.id.clone()).collect();
    assert_eq!(paged, ids);
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// With mutual TLS, an administrator is a client certificate the config
/// names; a call forwarded to another region carries the identity the first
/// node verified. A region's certificate, or another person's, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_mutual_tls_an_administrator_is_a_named_certificate_also_through_another_region() {
    let pki = cascade_tls::DevPki::generate(&["ra", "rb"]).expect("dev pki");
    let c = start_cluster_tls_with(&["ra", "rb"], &pki, |s| {
        s.admin.identities = vec!["alice.admin".to_owned()];
    })
    .await;
    let client_with = |name: &str| {
        let (cert, key) = pki.issue_client(name).expect("client certificate");
        cascade_client::ClientTls {
            identity: Some((cert, key)),
            ..pki.client()
        }
    };
    let connect = |tls: cascade_client::ClientTls| {
        let endpoint = c.node("rb").node.endpoint();
        async move { AdminClient::connect_with(&endpoint, Some(&tls), None).await.unwrap() }
    };
    let alice = connect(client_with("alice.admin")).await;
    for region in ["rb", "ra"] {
        alice
            .list_deletions(deletions(region, v1::DeletionStatus::Unspecified, false))
            .await
            .unwrap_or_else(|e| panic!("alice lists {region}: {e}"));
    }
    let bob = connect(client_with("bob.admin")).await;
    let why = denied(bob.list_audit(audit("ra")).await);
    assert!(
        why.contains("certificate \"bob.admin\" is not an administrator"),
        "{why}"
    );
    let region_cert = {
        let (cert, key) = pki.regions.get("ra").cloned().expect("ra's certificate");
        cascade_client::ClientTls {
            identity: Some((cert, key)),
            ..pki.client()
        }
    };
    let posing = connect(region_cert).await;
    denied(posing.list_audit(audit("rb")).await);
    // The log of ra shows alice's listing came through rb.
    let log = alice.list_audit(audit("ra")).await.unwrap().entries;
    assert!(
        log.is_empty() || log.iter().all(|e| e.action != "ListDeletions"),
        "listings are not audited: {log:?}"
    );
    let rb_log = alice.list_audit(audit("rb")).await.unwrap().entries;
    assert!(
        rb_log
            .iter()
            .any(|e| e.who == "certificate \"bob.admin\"" && e.outcome.starts_with("PERMISSION_DENIED")),
        "{rb_log:?}"
    );
}

/// The identity a forwarding region vouches for (`cascade-admin-for`) is
/// whatever the caller put in a header: a certified region that sends one
/// of 8 KB is refused with a short message that quotes it (a prefix and
/// its length), not with the header echoed whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_forwarded_identity_of_8_kb_is_refused_in_a_short_message() {
    let pki = cascade_tls::DevPki::generate(&["ra", "rb"]).expect("dev pki");
    let c = start_cluster_tls_with(&["ra", "rb"], &pki, |s| {
        s.admin.identities = vec!["alice.admin".to_owned()];
    })
    .await;
    let (cert, key) = pki.regions.get("ra").cloned().expect("ra's certificate");
    let tls = cascade_client::ClientTls {
        identity: Some((cert, key)),
        ..pki.client()
    };
    let channel = cascade_client::client::connect_channel(&c.node("rb").node.endpoint(), Some(&tls), None)
        .await
        .expect("ra's certificate connects to rb");
    let forged = "m".repeat(8 * 1024);
    let mut request = tonic::Request::new(audit("rb"));
    request
        .metadata_mut()
        .insert("cascade-admin-for", forged.parse().expect("an ASCII header value"));
    let status = v1::admin_client::AdminClient::new(channel)
        .list_audit(request)
        .await
        .expect_err("a forged identity is no administrator");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    let why = status.message();
    assert!(why.len() < 1024, "a refusal of {} bytes: {why}", why.len());
    assert!(why.contains("vouching for \"mmm"), "{why}");
    assert!(why.contains(&format!("({} bytes)", forged.len())), "{why}");
}

/// Issue 11: ForcePurge of a deletion stuck on a live blocker in another
/// region and a failing finalizer: refused to anyone but an administrator,
/// without a reason, or (without force) before the threshold; then the
/// blocker in the other region loses its reference and survives, the
/// resource and its project are purged, the operation succeeds, the
/// checker finds no violation, and the audit log says who and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_purge_unsets_a_blocker_in_another_region_and_finishes_the_cascade() {
    let c = start_cluster_with(&["ra", "rb"], |s| {
        s.policy.backoff_base_ms = 50;
        s.policy.max_attempts = 2;
        s.admin.token = Some(TOKEN.to_owned());
    })
    .await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    let mut net = spec_in("ra/network/net", &[("project", &["ra/project/p1"])]);
    net.finalizers = vec!["dns".into()];
    a.batch_create(vec![spec_in("ra/project/p1", &[]), net]).await.unwrap();
    b.batch_create(vec![
        spec_in("rb/project/p2", &[]),
        spec_in("rb/port/x", &[("network", &["ra/network/net"])]),
        spec_in(
            "rb/router/r",
            &[
                ("project", &["rb/project/p2"]),
                ("gateway_network", &["ra/network/net"]),
            ],
        ),
    ])
    .await
    .unwrap();
    let op = b
        .delete(delete_req("ra/project/p1", true))
        .await
        .unwrap()
        .operation
        .unwrap();
    eventually(Duration::from_secs(30), "the network's deletion to fail", || async {
        let d = a.get("ra/network/net").await.ok()?.deletion?;
        (d.status == v1::DeletionStatus::Failed as i32).then_some(())
    })
    .await;
    wait_gone(b, "rb/port/x").await;

    let force = |reason: &str, force: bool| v1::ForcePurgeRequest {
        name: "ra/network/net".into(),
        reason: reason.into(),
        force,
    };
    denied(admin(&c, "rb", None).await.force_purge(force("mine", true)).await);
    let root = admin(&c, "rb", Some(TOKEN)).await;
    let refused = |r: Result<v1::DeletionEntry, ClientError>| match r {
        Err(ClientError::Status(s)) => (s.code(), cascade_proto::status::error_details(&s).map(|d| d.field)),
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        refused(root.force_purge(force("", true)).await),
        (tonic::Code::InvalidArgument, Some("reason".to_owned()))
    );
    assert_eq!(
        refused(root.force_purge(force("stuck", false)).await),
        (tonic::Code::FailedPrecondition, Some("force".to_owned())),
        "younger than the hour the nodes wait by default"
    );
    let forced = root
        .force_purge(force("router r is being decommissioned (ticket 7)", true))
        .await
        .unwrap();
    let d = forced.resource.unwrap().deletion.unwrap();
    assert_eq!(d.forced.map(|f| f.by), Some("token".to_owned()));

    wait_gone(b, "ra/network/net").await;
    let done = wait_operation(b, &op.id).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    let router = b.get("rb/router/r").await.unwrap();
    assert_eq!(state(&router), v1::ResourceState::Active);
    assert!(targets(&router, "gateway_network").is_empty(), "{router:?}");
    let log = root.list_audit(audit("ra")).await.unwrap().entries;
    let entry = log
        .iter()
        .find(|e| e.action == "ForcePurge (force)" && e.outcome == "ok")
        .unwrap_or_else(|| panic!("no force purge in {log:?}"));
    assert_eq!(
        (entry.who.as_str(), entry.reason.as_str()),
        ("token", "router r is being decommissioned (ticket 7)")
    );
    assert!(
        log.iter()
            .any(|e| e.action == "ForcePurge" && e.outcome.starts_with("FailedPrecondition")),
        "the refused attempt is audited too: {log:?}"
    );
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// `region`'s entry in `cascade status -o json` as `asked` answers it.
async fn status_of(c: &Cluster, asked: &str, region: &str) -> serde_json::Value {
    let (code, status) = cascade_status(&c.node(asked).node.endpoint()).await;
    assert_eq!(code, 0, "{status}");
    status["regions"]
        .as_array()
        .and_then(|regions| regions.iter().find(|r| r["region"] == region))
        .cloned()
        .unwrap_or_else(|| panic!("{region} is not in {status}"))
}

/// Issue 26, mixed versions: rb runs as a node of the protocol before
/// DELETION_FORCED (version 1), ra as this binary. ra never relies on rb
/// applying a forced deletion: a force purge that rb's `block` referrer
/// holds is refused, naming rb and its version; one that only `cascade`
/// referrers in rb saw goes through and rb is sent DELETING in place of
/// DELETION_FORCED; both regions stay consistent. `cascade status` shows
/// each region's versions. rb then restarts as this binary on the same
/// data (an upgrade), and the same force purge goes through with
/// DELETION_FORCED: rb's router loses the reference that held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_of_the_older_protocol_is_never_sent_deletion_forced_and_forcing_waits_for_its_upgrade() {
    let current = cascade_proto::PROTOCOL_VERSION;
    let mut c = start_cluster_with(&["ra", "rb"], |s| {
        s.policy.backoff_base_ms = 50;
        s.policy.max_attempts = 2;
        s.admin.token = Some(TOKEN.to_owned());
        s.metrics_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        if s.region.as_str() == "rb" {
            s.protocol_version = current - 1;
        }
    })
    .await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    // `net` is held by rb's router (block); `lone` only by rb's port (cascade).
    let held = |name: &str, project: &str| {
        let mut spec = spec_in(name, &[("project", &[project])]);
        spec.finalizers = vec!["dns".into()];
        spec
    };
    a.batch_create(vec![
        spec_in("ra/project/p1", &[]),
        held("ra/network/net", "ra/project/p1"),
        held("ra/network/lone", "ra/project/p1"),
    ])
    .await
    .unwrap();
    b.batch_create(vec![
        spec_in("rb/project/p2", &[]),
        spec_in("rb/port/x", &[("network", &["ra/network/lone"])]),
        spec_in(
            "rb/router/r",
            &[
                ("project", &["rb/project/p2"]),
                ("gateway_network", &["ra/network/net"]),
            ],
        ),
    ])
    .await
    .unwrap();
    a.delete(delete_req("ra/project/p1", true)).await.unwrap();
    // Both stay DELETING: `net` blocked by rb's router, each held by its finalizer.
    eventually(Duration::from_secs(30), "net's deletion to fail, blocked", || async {
        let d = a.get("ra/network/net").await.ok()?.deletion?;
        (d.status == v1::DeletionStatus::Failed as i32).then_some(())
    })
    .await;
    wait_gone(b, "rb/port/x").await;
    assert!(a.get("ra/network/lone").await.unwrap().deletion.is_some());

    // Each region's versions, as ra sees them: rb heard on the link, and
    // what each says of itself.
    let rb = eventually(Duration::from_secs(10), "ra to hear rb's version", || async {
        let rb = status_of(&c, "ra", "rb").await;
        (rb["protocol_version"] == current - 1).then_some(rb)
    })
    .await;
    assert_eq!(rb["figures"]["protocol_version"], current - 1, "{rb}");
    assert_eq!(rb["figures"]["binary_version"], env!("CARGO_PKG_VERSION"), "{rb}");
    let ra = status_of(&c, "ra", "ra").await;
    assert_eq!(ra["protocol_version"], current, "{ra}");
    assert_eq!(ra["figures"]["protocol_version"], current, "{ra}");
    assert_eq!(status_of(&c, "rb", "ra").await["protocol_version"], current);

    let root = admin(&c, "ra", Some(TOKEN)).await;
    let force = |name: &str| v1::ForcePurgeRequest {
        name: name.into(),
        reason: "decommissioned".into(),
        force: true,
    };
    match root.force_purge(force("ra/network/net")).await {
        Err(ClientError::Status(s)) => {
            assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");
            let details = cascade_proto::status::error_details(&s).expect("details");
            assert_eq!(details.region, "rb", "{s:?}");
            assert!(
                s.message().contains("rb/router/r") && s.message().contains("protocol version 1"),
                "{s:?}"
            );
        }
        other => panic!("a force purge rb's block referrer holds must be refused, got {other:?}"),
    }
    let still = a.get("ra/network/net").await.unwrap();
    assert!(still.deletion.unwrap().forced.is_none(), "not forced");

    // Nothing of rb holds `lone`: forced through, rb is sent DELETING.
    root.force_purge(force("ra/network/lone")).await.unwrap();
    wait_gone(a, "ra/network/lone").await;
    // lone's PURGED comes after its forced event in ra's outbox.
    eventually(Duration::from_secs(10), "rb to receive lone's PURGED", || async {
        (peer_events_received(&c, "rb", "ra", "purged").await >= 1.0).then_some(())
    })
    .await;
    assert!(peer_events_received(&c, "rb", "ra", "deleting").await >= 3.0);
    assert_eq!(
        peer_events_received(&c, "rb", "ra", "deletion_forced").await,
        0.0,
        "ra sent DELETION_FORCED to a node of version 1"
    );
    let router = b.get("rb/router/r").await.unwrap();
    assert_eq!(targets(&router, "gateway_network"), ["ra/network/net"]);
    assert_no_violations(&c).await;

    // The upgrade: rb again, as this binary, on the same data.
    c.stop("rb").await;
    c.restart_with("rb", |s| s.protocol_version = current).await;
    eventually(Duration::from_secs(10), "ra to hear rb's new version", || async {
        let rb = status_of(&c, "ra", "rb").await;
        (rb["protocol_version"] == current && rb["figures"]["protocol_version"] == current).then_some(())
    })
    .await;
    let forced = admin(&c, "ra", Some(TOKEN))
        .await
        .force_purge(force("ra/network/net"))
        .await
        .unwrap();
    assert!(forced.resource.unwrap().deletion.unwrap().forced.is_some());
    let (a, b) = (c.client("ra"), c.client("rb"));
    wait_gone(a, "ra/network/net").await;
    let router = b.get("rb/router/r").await.unwrap();
    assert_eq!(state(&router), v1::ResourceState::Active);
    assert!(targets(&router, "gateway_network").is_empty(), "{router:?}");
    assert!(
        peer_events_received(&c, "rb", "ra", "deletion_forced").await >= 1.0,
        "the upgraded rb is sent DELETION_FORCED"
    );
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}
