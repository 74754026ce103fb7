//! Progress per region, and the operations page for every caller, over
//! three TLS regions requiring a token under the shipped example policy
//! (`deploy/auth/policy.cedar`): a reader (get, list, watch; no admin
//! verb) follows a cross-region cascade on its operation page, whose
//! per-region rows rise without a reload and end equal to the API's
//! `region_progress` (summing to `progress`); the reader finds the
//! operation on the operations page (`ListOperations`, not the
//! administrator's deletion tables); a caller the policy allows nothing
//! sees an empty list with a note, not an error page.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cascade_client::Client;
use cascade_proto::v1;

use crate::browser::Browser;
use crate::console_of;
use crate::signed_in::{secured, sign_in, REGIONS};
use crate::support::spec_in;

/// In `admins`: may do everything (starts the cascade).
const ADMIN_TOKEN: &str = "console-progress-admin-token-6Yb3";
/// In `readers`: may get, list and watch, nothing else.
const READER_TOKEN: &str = "console-progress-reader-token-2Qm8";
/// In no group the policy names: may see the cluster's status, nothing more.
const NOBODY_TOKEN: &str = "console-progress-nobody-token-9Lc5";

/// Ports per region referring to eu-west's network.
const PORTS_PER_REGION: usize = 150;

const PROJECT: &str = "eu-west/project/p";
const NETWORK: &str = "eu-west/network/n";

/// The operation page's rows per region: region → reachable and the five
/// counts (deleted, unset, pending, blocked, failed), as a person reads them.
async fn region_rows(browser: &mut Browser) -> BTreeMap<String, (bool, [u64; 5])> {
    let rows = browser
        .eval(
            "Array.from(document.querySelectorAll('#region-progress tbody tr')).map(r => [r.dataset.regionProgress, \
             r.dataset.reachable === 'true', ['deleted', 'unset', 'pending', 'blocked', 'failed'].map(k => \
             Number(r.querySelector(`[data-count=${k}]`)?.textContent ?? 0))])",
        )
        .await;
    let rows: Vec<(String, bool, [u64; 5])> =
        serde_json::from_value(rows.clone()).unwrap_or_else(|e| panic!("{e}: {rows}"));
    rows.into_iter()
        .map(|(region, reachable, c)| (region, (reachable, c)))
        .collect()
}

fn counts(p: Option<v1::Progress>) -> [u64; 5] {
    let p = p.unwrap_or_default();
    [p.deleted, p.unset, p.pending, p.blocked, p.failed]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_sees_each_regions_progress_rise_live_and_the_operation_listed_and_a_caller_allowed_nothing_an_empty_list(
) {
    let Some(mut browser) = Browser::launch("progress::per_region_and_every_caller").await else {
        return;
    };
    let secured = secured(&[
        (ADMIN_TOKEN, "admin", "admins"),
        (READER_TOKEN, "reader", "readers"),
        (NOBODY_TOKEN, "nobody", "strangers"),
    ])
    .await;
    let (cluster, pki) = (&secured.cluster, &secured.pki);
    let mut admins = BTreeMap::new();
    for region in REGIONS {
        let client = Client::connect_with(&cluster.node(region).node.endpoint(), Some(&pki.client()))
            .await
            .expect("connects")
            .with_token(ADMIN_TOKEN)
            .expect("a token");
        admins.insert(region, client);
    }
    admins["eu-west"]
        .create(spec_in(PROJECT, &[]))
        .await
        .expect("the project");
    admins["eu-west"]
        .create(spec_in(NETWORK, &[("project", &[PROJECT])]))
        .await
        .expect("the network");
    for region in REGIONS {
        let specs = (0..PORTS_PER_REGION)
            .map(|i| spec_in(&format!("{region}/port/p{i}"), &[("network", &[NETWORK])]))
            .collect();
        admins[region].batch_create(specs).await.expect("ports");
    }
    // Slowed by a rate, so the cascade runs for seconds and a page can
    // watch it.
    let op = admins["eu-west"]
        .delete(v1::DeleteRequest {
            name: NETWORK.into(),
            cascade: true,
            rate_per_second: 60,
            ..Default::default()
        })
        .await
        .expect("the delete is accepted")
        .operation
        .expect("an operation");

    // The reader, through another region's node.
    let console = console_of(cluster, "us-east");
    let page = format!("/operations/{}", op.id);
    sign_in(&mut browser, &console, READER_TOKEN, &page).await;
    browser.eval("window.sameDocument = true").await;

    // The rows rise while it runs, in this one document.
    let mut finished_seen: Vec<u64> = Vec::new();
    let limit = Instant::now() + Duration::from_secs(120);
    loop {
        let state = browser.text("#state").await.unwrap_or_default();
        let rows = region_rows(&mut browser).await;
        let finished: u64 = rows.values().map(|(_, c)| c[0] + c[1]).sum();
        if finished_seen.last() != Some(&finished) {
            finished_seen.push(finished);
        }
        if state.trim() != "RUNNING" {
            break;
        }
        assert!(Instant::now() < limit, "still RUNNING after 2 minutes: {rows:?}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(
        browser.eval("window.sameDocument === true").await,
        serde_json::json!(true),
        "the page was never reloaded"
    );
    let rising = finished_seen.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(
        rising >= 2 && finished_seen.iter().any(|n| *n > 0 && *n < 3 * PORTS_PER_REGION as u64),
        "the per-region counts rose while the operation ran: {finished_seen:?}"
    );

    // At the end: the page's rows are the API's region_progress exactly,
    // and they add up to the totals.
    let api = admins["ap-south"]
        .get_operation(&op.id, 0)
        .await
        .expect("the operation");
    assert_eq!(api.state(), v1::OperationState::Succeeded, "{api:?}");
    let from_api: BTreeMap<String, (bool, [u64; 5])> = api
        .region_progress
        .iter()
        .map(|r| (r.region.clone(), (r.reachable, counts(r.progress))))
        .collect();
    let shown = eventually_rows(&mut browser, &from_api).await;
    assert_eq!(shown, from_api);
    assert_eq!(
        shown.keys().map(String::as_str).collect::<Vec<_>>(),
        ["ap-south", "eu-west", "us-east"],
        "a row for every region the cascade reached"
    );
    let mut sum = [0u64; 5];
    for (_, c) in shown.values() {
        for (s, n) in sum.iter_mut().zip(c) {
            *s += n;
        }
    }
    assert_eq!(sum, counts(api.progress), "the rows add up to the totals");
    assert_eq!(sum[0], 3 * PORTS_PER_REGION as u64 + 1, "every port and the network");

    // The reader's operations page lists it (the reader may not read the
    // deletion tables: ListOperations decided per operation).
    browser.goto(&format!("{console}/operations")).await;
    let row = format!(r#"document.querySelector('tr[data-operation="{}"]')"#, op.id);
    let listed = browser
        .wait_for(
            "the operation on the reader's operations page",
            Duration::from_secs(20),
            &format!("{row} ? {row}.innerText : null"),
        )
        .await;
    let listed = listed.as_str().unwrap_or_default();
    for part in [NETWORK, "SUCCEEDED", "eu-west", "us-east", "ap-south"] {
        assert!(listed.contains(part), "{part} in the reader's row: {listed}");
    }

    // A caller the policy allows nothing: an empty list with a note.
    sign_in(&mut browser, &console, NOBODY_TOKEN, "/operations").await;
    let note = browser
        .wait_for(
            "the empty list's note",
            Duration::from_secs(20),
            "document.querySelector('#no-operations')?.textContent ?? null",
        )
        .await;
    assert!(
        note.as_str().unwrap_or_default().contains("No operation you may read"),
        "{note}"
    );
    assert_eq!(
        browser
            .eval("document.querySelectorAll('tr[data-operation]').length")
            .await,
        serde_json::json!(0),
        "nothing listed for a caller allowed nothing"
    );
    assert_eq!(
        browser.eval("document.title").await,
        serde_json::json!("Operations · Cascade console"),
        "the operations page, not an error page"
    );
}

/// The rows once the live page has drawn the final read (its last update
/// may land just after the state turned).
async fn eventually_rows(
    browser: &mut Browser,
    expected: &BTreeMap<String, (bool, [u64; 5])>,
) -> BTreeMap<String, (bool, [u64; 5])> {
    let limit = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = region_rows(browser).await;
        if rows == *expected || Instant::now() > limit {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}
