//! The cluster page over three regions: every region with its link and
//! figures (the data of `cascade status`), the audit log filtered by
//! region and action, and a region that stops answering named while the
//! page still answers.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::browser::Browser;
use crate::support::{delete_req, spec_in, start_cluster_with};
use crate::{console_of, with_console};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// The administrator's token (`[admin] token`): the audit log is an
/// administrator's to read.
const ADMIN_TOKEN: &str = "console-cluster-admin-9Rt4";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_page_lists_every_region_filters_the_audit_log_and_names_a_region_that_stopped() {
    let Some(mut browser) = Browser::launch("cluster::regions_and_audit").await else {
        return;
    };
    let mut cluster = start_cluster_with(&REGIONS, |s| {
        with_console(s);
        s.admin.token = Some(ADMIN_TOKEN.to_owned());
    })
    .await;
    let eu = cluster.client("eu-west");
    eu.create(spec_in("eu-west/project/audited", &[]))
        .await
        .expect("create");
    eu.create(spec_in("eu-west/project/kept", &[])).await.expect("create");
    eu.delete(delete_req("eu-west/project/audited", false))
        .await
        .expect("delete");

    let console = console_of(&cluster, "us-east");
    browser.goto(&format!("{console}/login?next=/cluster")).await;
    browser
        .eval(&format!(
            "document.querySelector('#token').value = '{ADMIN_TOKEN}'; document.querySelector('form.login').submit(); true"
        ))
        .await;
    // Every region answers, and us-east follows the other two (its links
    // come up within seconds of the start: the page is read again until).
    browser
        .wait_for(
            "the cluster page",
            Duration::from_secs(20),
            "document.querySelector('table.regions') !== null",
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let rows = loop {
        let seen = browser
            .eval(
                "(() => { const rows = Array.from(document.querySelectorAll('table.regions tbody tr')); \
                  const ok = rows.length === 3 && rows.every(r => r.dataset.reachable === 'true') \
                    && rows.filter(r => r.querySelector('.link').textContent === 'up').length === 2; \
                  return ok ? rows.map(r => r.dataset.region) : null; })()",
            )
            .await;
        if !seen.is_null() {
            break seen;
        }
        assert!(
            Instant::now() < deadline,
            "regions not all reachable and linked in 30 s"
        );
        browser.goto(&format!("{console}/cluster")).await;
    };
    let mut regions: Vec<String> = serde_json::from_value(rows).expect("names");
    regions.sort();
    assert_eq!(regions, ["ap-south", "eu-west", "us-east"]);
    assert_eq!(
        browser
            .eval("document.querySelector('table.regions tr[data-region=\"us-east\"] .link').textContent")
            .await,
        Value::String("self".into())
    );

    // eu-west's audit log, deletes only: the one delete, not the creates.
    browser
        .goto(&format!("{console}/cluster?region=eu-west&action=delete#audit"))
        .await;
    let audited = browser
        .wait_for(
            "eu-west's delete in its audit log",
            Duration::from_secs(20),
            "(() => { const rows = Array.from(document.querySelectorAll('table.audit tbody tr')); \
              return rows.length ? rows.map(r => [r.dataset.action, r.querySelector('.target').textContent, r.querySelector('.outcome').textContent]) : null; })()",
        )
        .await;
    let audited: Vec<(String, String, String)> = serde_json::from_value(audited.clone()).expect("rows");
    assert!(
        audited.iter().all(|(action, _, _)| action == "delete"),
        "only deletes: {audited:?}"
    );
    assert!(
        audited
            .iter()
            .any(|(_, target, outcome)| target == "eu-west/project/audited" && outcome == "ok"),
        "{audited:?}"
    );
    assert!(
        !audited.iter().any(|(_, target, _)| target == "eu-west/project/kept"),
        "{audited:?}"
    );
    // The filter form shows what was asked.
    assert_eq!(
        browser
            .eval("document.querySelector('form.audit-filter input[name=action]').value")
            .await,
        Value::String("delete".into())
    );

    // ap-south stops: every load of the page still answers at once, and
    // names it as soon as the node's status knows (a status is reused for
    // a second, and the link notices a closed peer within seconds).
    cluster.stop("ap-south").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let started = Instant::now();
        browser.goto(&format!("{console}/cluster")).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(3),
            "the page waited {took:?} on a region that does not answer"
        );
        let named = browser
            .eval("Array.from(document.querySelectorAll('.unreachable')).map(e => e.dataset.region)")
            .await;
        if named == serde_json::json!(["ap-south"]) {
            eprintln!("the cluster page naming ap-south stopped loaded in {took:?}");
            break;
        }
        assert_eq!(named, serde_json::json!([]), "only ap-south stopped");
        assert!(Instant::now() < deadline, "ap-south not named within 20 s");
    }
    assert_eq!(
        browser
            .eval("document.querySelector('table.regions tr[data-region=\"ap-south\"]').dataset.reachable")
            .await,
        Value::String("false".into())
    );
}
