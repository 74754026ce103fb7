//! Issue 27, the audit log over real nodes: every change a client makes is
//! recorded with its principal, the node and the region it came through,
//! in the change's own commit; ListAudit filters by principal, resource,
//! action and time across pages; retention prunes by count and by age in
//! the background while writes go on, and removes nothing else.
//!
//! Authentication is off on these nodes: the principal is `anonymous`
//! (`unauthenticated`), the rule `authentication off`. The identity and
//! policy parts' tests cover the other principals.

// Test code: poll deadlines are real time (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::time::Duration;

use cascade_client::AdminClient;
use cascade_proto::v1;

use crate::support::*;

const TOKEN: &str = "audit-test-admin-token-0123456789";

async fn admin_of(n: &TestNode) -> AdminClient {
    AdminClient::connect_with(&n.node.endpoint(), None, Some(TOKEN.to_owned()))
        .await
        .expect("admin client connects")
}

/// Every entry `filter` selects, page after page of `page_size`.
async fn audit_log(admin: &AdminClient, filter: v1::ListAuditRequest, page_size: u32) -> Vec<v1::AuditEntry> {
    let mut all = Vec::new();
    let mut token = String::new();
    for _ in 0..10_000 {
        let page = admin
            .list_audit(v1::ListAuditRequest {
                page_size,
                page_token: token,
                ..filter.clone()
            })
            .await
            .expect("ListAudit answers");
        assert!(
            page.entries.len() <= page_size as usize,
            "a page of {}",
            page.entries.len()
        );
        all.extend(page.entries);
        token = page.next_page_token;
        if token.is_empty() {
            return all;
        }
    }
    panic!("ListAudit never ended");
}

fn project(id: &str) -> v1::ResourceSpec {
    spec(&format!("project/{id}"), &[])
}

/// A create, a batch create, an update, a lien added and removed, and a
/// delete each appear once, in order, with the principal, how it proved
/// itself, this node, the region the call came through and the rule; a
/// dry run changes nothing and is not audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_appears_with_its_principal_and_node() {
    let n = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        s.admin.token = Some(TOKEN.to_owned());
    })
    .await;
    let c = &n.client;
    let created = c.create(project("p1")).await.expect("create");
    c.batch_create(vec![project("b1"), project("b2")])
        .await
        .expect("batch create");
    let mut changed = project("p1");
    changed.attributes.insert("owner".into(), "team-a".into());
    let updated = c.update(changed, &created.etag).await.expect("update");
    c.add_lien(v1::AddLienRequest {
        name: full("project/p1"),
        lien_id: "keep".into(),
        reason: "audit test".into(),
        requested_by: "tester".into(),
        etag: updated.etag.clone(),
    })
    .await
    .expect("add lien");
    c.remove_lien(v1::RemoveLienRequest {
        name: full("project/p1"),
        lien_id: "keep".into(),
        ..Default::default()
    })
    .await
    .expect("remove lien");
    c.delete(v1::DeleteRequest {
        dry_run: true,
        ..delete_req("project/p1", false)
    })
    .await
    .expect("dry run");
    delete_and_wait(c, "project/p1", false).await;

    let admin = admin_of(&n).await;
    let log = audit_log(&admin, v1::ListAuditRequest::default(), 100).await;
    let about_p1: Vec<&str> = log
        .iter()
        .filter(|e| e.target == full("project/p1"))
        .map(|e| e.action.as_str())
        .collect();
    assert_eq!(
        about_p1,
        ["create", "update", "add_lien", "remove_lien", "delete"],
        "{log:#?}"
    );
    let batch: BTreeSet<&str> = log
        .iter()
        .filter(|e| e.action == "create" && e.target != full("project/p1"))
        .map(|e| e.target.as_str())
        .collect();
    assert_eq!(
        batch,
        BTreeSet::from([full("project/b1").as_str(), full("project/b2").as_str()])
    );
    assert_eq!(log.len(), 7, "one entry per change, nothing for the dry run: {log:#?}");
    for e in &log {
        assert_eq!(
            (
                e.who.as_str(),
                e.via.as_str(),
                e.node.as_str(),
                e.through.as_str(),
                e.region.as_str(),
                e.rule.as_str(),
                e.outcome.as_str()
            ),
            (
                "anonymous",
                "unauthenticated",
                n.node.endpoint().as_str(),
                REGION,
                REGION,
                "authentication off",
                "ok"
            ),
            "{e:#?}"
        );
    }
    let lien = log.iter().find(|e| e.action == "add_lien").expect("the lien's entry");
    assert_eq!(lien.reason, "tester", "the caller's note is kept: {lien:#?}");
    let delete = log.iter().find(|e| e.action == "delete").expect("the delete's entry");
    assert_eq!(
        delete.reason, "test",
        "requested_by stays the caller's note: {delete:#?}"
    );
}

/// Each filter (principal, resource, action, a time window, and several at
/// once) returns exactly the entries of the whole log it selects, each
/// once, in order, over pages of two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_return_exactly_the_matching_entries_across_pages() {
    let n = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        s.admin.token = Some(TOKEN.to_owned());
    })
    .await;
    let c = &n.client;
    for i in 0..12u32 {
        let created = c.create(project(&format!("p{i}"))).await.expect("create");
        if i.is_multiple_of(3) {
            let mut changed = project(&format!("p{i}"));
            changed.attributes.insert("tier".into(), "gold".into());
            c.update(changed, &created.etag).await.expect("update");
        }
        if i.is_multiple_of(4) {
            delete_and_wait(c, &format!("project/p{i}"), false).await;
        }
        if i == 5 {
            // Another principal: what a refused caller presented.
            let stranger = AdminClient::connect_with(&n.node.endpoint(), None, None)
                .await
                .expect("admin client connects");
            stranger
                .retry_deletion(v1::RetryDeletionRequest {
                    name: full("project/p5"),
                    reason: "not mine".into(),
                })
                .await
                .expect_err("no token: refused");
        }
        // Entries a few milliseconds apart, so a time window has edges.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let admin = admin_of(&n).await;
    let log = audit_log(&admin, v1::ListAuditRequest::default(), 1000).await;
    assert_eq!(
        log.len(),
        12 + 4 + 3 + 1,
        "creates, updates, deletes, the refusal: {log:#?}"
    );
    let ids = |entries: &[v1::AuditEntry]| entries.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
    let expect =
        |keep: &dyn Fn(&v1::AuditEntry) -> bool| ids(&log.iter().filter(|e| keep(e)).cloned().collect::<Vec<_>>());
    let (since, until) = (log[5].time_ms, log[log.len() - 5].time_ms);
    let cases: Vec<(&str, v1::ListAuditRequest, Vec<String>)> = vec![
        (
            "principal",
            v1::ListAuditRequest {
                principal: "no credentials".into(),
                ..Default::default()
            },
            expect(&|e| e.who == "no credentials"),
        ),
        (
            "resource",
            v1::ListAuditRequest {
                resource: full("project/p0"),
                ..Default::default()
            },
            expect(&|e| e.target == full("project/p0")),
        ),
        (
            "action",
            v1::ListAuditRequest {
                action: "update".into(),
                ..Default::default()
            },
            expect(&|e| e.action == "update"),
        ),
        (
            "time window",
            v1::ListAuditRequest {
                since_ms: since,
                until_ms: until,
                ..Default::default()
            },
            expect(&|e| e.time_ms >= since && e.time_ms < until),
        ),
        (
            "principal, action and since",
            v1::ListAuditRequest {
                principal: "anonymous".into(),
                action: "delete".into(),
                since_ms: since,
                ..Default::default()
            },
            expect(&|e| e.who == "anonymous" && e.action == "delete" && e.time_ms >= since),
        ),
    ];
    for (what, filter, expected) in cases {
        assert!(!expected.is_empty(), "{what}: the log has such entries");
        assert!(expected.len() < log.len(), "{what}: the filter leaves some out");
        let got = audit_log(&admin, filter, 2).await;
        assert_eq!(ids(&got), expected, "{what}");
    }
    assert_eq!(expect(&|e| e.who == "no credentials").len(), 1);
    assert_eq!(expect(&|e| e.action == "update").len(), 4);
    assert_eq!(expect(&|e| e.target == full("project/p0")).len(), 3);
}

/// The value of `metric` on `n`'s metrics listener.
async fn metric(n: &TestNode, name: &str) -> f64 {
    let metrics = scrape(n.node.metrics_addr().expect("metrics served")).await;
    metrics.get(name).copied().unwrap_or(f64::NAN)
}

/// `[audit] max_entries = 20`: while 100 creates go on, the oldest entries
/// are pruned in the background; the log ends with exactly the newest 20,
/// the count and the metrics say so, and every resource is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_by_count_keeps_the_newest_entries_while_writes_go_on() {
    let n = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        s.admin.token = Some(TOKEN.to_owned());
        s.audit.max_entries = 20;
        s.metrics_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    })
    .await;
    let admin = admin_of(&n).await;
    let mut pruned_while_writing = false;
    for i in 0..100 {
        n.client.create(project(&format!("p{i:03}"))).await.expect("create");
        if i > 40 && !pruned_while_writing {
            pruned_while_writing = metric(&n, "cascade_audit_pruned_total").await > 0.0;
        }
    }
    assert!(pruned_while_writing, "retention pruned while the creates went on");
    eventually(Duration::from_secs(20), "the log to hold 20 entries", || async {
        (metric(&n, "cascade_audit_entries").await == 20.0).then_some(())
    })
    .await;
    let log = audit_log(&admin, v1::ListAuditRequest::default(), 7).await;
    let targets: Vec<String> = log.iter().map(|e| e.target.clone()).collect();
    let newest: Vec<String> = (80..100).map(|i| full(&format!("project/p{i:03}"))).collect();
    assert_eq!(targets, newest, "the oldest went first, the newest stay");
    assert_eq!(metric(&n, "cascade_audit_pruned_total").await, 80.0);
    let listed = n
        .client
        .list(v1::ListRequest {
            region: REGION.into(),
            kind: "project".into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(listed.resources.len(), 100, "retention removes audit entries only");
}

/// `[audit] retain = 1s`: the first creates' entries are pruned once they
/// are a second old, while creates go on every 100 ms; the recent ones stay
/// and every resource is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_by_age_prunes_old_entries_while_writes_go_on() {
    let n = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        s.admin.token = Some(TOKEN.to_owned());
        s.audit.retain = Duration::from_secs(1);
    })
    .await;
    let admin = admin_of(&n).await;
    for i in 0..5 {
        n.client.create(project(&format!("old{i}"))).await.expect("create");
    }
    let first = audit_log(&admin, v1::ListAuditRequest::default(), 100).await;
    assert!(first.iter().any(|e| e.target.contains("/old")), "{first:#?}");
    let started = std::time::Instant::now();
    let mut created = 0;
    let mut pruned_at = None;
    while started.elapsed() < Duration::from_secs(15) {
        n.client
            .create(project(&format!("new{created}")))
            .await
            .expect("create");
        created += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let log = audit_log(&admin, v1::ListAuditRequest::default(), 100).await;
        if log.iter().all(|e| !e.target.contains("/old")) {
            pruned_at = Some(started.elapsed());
            let newest = log.last().expect("the newest entry stays");
            assert_eq!(newest.target, full(&format!("project/new{}", created - 1)));
            let oldest_age = newest.time_ms - log[0].time_ms;
            assert!(
                oldest_age <= 2_000,
                "entries older than the retention remain: {oldest_age} ms"
            );
            break;
        }
    }
    let pruned_at = pruned_at.expect("the old entries are pruned within 15 s");
    println!("entries older than 1 s pruned after {pruned_at:?}, {created} creates meanwhile");
    for i in 0..5 {
        n.client
            .get(&full(&format!("project/old{i}")))
            .await
            .expect("the resource stays");
    }
}
