//! The operation page over three regions: a large cascade followed live
//! (the counts rise in one page session, no reload) to a final state that
//! is `cascade operation`'s exactly; seed 002's stuck case, its blocker
//! named with its region and field, freed live; a region that stops
//! answering named on the page while the page keeps answering.

use std::time::{Duration, Instant};

use cascade_proto::v1;
use serde_json::Value;

use crate::browser::Browser;
use crate::support::{delete_req, spec_in, start_cluster_with, Cluster};
use crate::{console_of, with_console};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// The administrator's token (`[admin] token`) of the stuck test's cluster.
const ADMIN_TOKEN: &str = "console-admin-token-3Kp8";

/// Ports per region referring to eu-west's network: with the network,
/// 3 × 3,333 + 1 = 10,000 members (issue 30's figure).
const PORTS_PER_REGION: usize = 3_333;

/// `cascade -o json operation ID`, as a user runs it.
async fn cascade_operation(endpoint: &str, id: &str) -> Value {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["--server", endpoint, "-o", "json", "operation", id])
        .env_remove("CASCADE_TOKEN")
        .output()
        .await
        .expect("cascade operation runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The page's state and five counts, as a person reads them.
async fn shown(browser: &mut Browser) -> (String, [u64; 5]) {
    let state = browser.text("#state").await.unwrap_or_default();
    let mut counts = [0; 5];
    for (i, what) in ["deleted", "unset", "pending", "blocked", "failed"].iter().enumerate() {
        counts[i] = browser
            .text(&format!("#count-{what}"))
            .await
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("no count of {what} on the page"));
    }
    (state.trim().to_owned(), counts)
}

fn counts_of(operation: &Value) -> [u64; 5] {
    let p = &operation["progress"];
    ["deleted", "unset", "pending", "blocked", "failed"].map(|k| p[k].as_u64().unwrap_or(0))
}

async fn populate(cluster: &Cluster) {
    let eu = cluster.client("eu-west");
    eu.batch_create(vec![
        spec_in("eu-west/project/p", &[]),
        spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]),
    ])
    .await
    .expect("eu-west's project and network");
    for region in REGIONS {
        let client = cluster.client(region);
        for chunk in (0..PORTS_PER_REGION).collect::<Vec<_>>().chunks(500) {
            let specs = chunk
                .iter()
                .map(|i| spec_in(&format!("{region}/port/p{i}"), &[("network", &["eu-west/network/n"])]))
                .collect();
            client.batch_create(specs).await.expect("ports");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operation_page_follows_a_ten_thousand_member_cascade_live_to_cascade_operations_final_state() {
    let Some(mut browser) = Browser::launch("operation::ten_thousand_live").await else {
        return;
    };
    let cluster = start_cluster_with(&REGIONS, with_console).await;
    let started = Instant::now();
    populate(&cluster).await;
    eprintln!(
        "setup of {} resources took {:?}",
        3 * PORTS_PER_REGION + 2,
        started.elapsed()
    );

    // Held to a rate, so that the cascade runs for seconds whatever the
    // machine: the page reads the API once a second (`LIVE_EVERY`), and
    // unslowed the 10,000 members were gone in about a second on CI
    // (the page saw only [1663, 10000]). 600 a second per region: at least
    // 5.5 s, several reads while it runs.
    let op = cluster
        .client("eu-west")
        .delete(v1::DeleteRequest {
            rate_per_second: 600,
            ..delete_req("eu-west/network/n", true)
        })
        .await
        .expect("the delete is accepted")
        .operation
        .expect("an operation");
    // Through another region's node: a page works through any node.
    let console = console_of(&cluster, "us-east");
    let opened = Instant::now();
    browser.goto(&format!("{console}/operations/{}", op.id)).await;
    eprintln!("the operation page loaded in {:?}", opened.elapsed());
    // A mark in this document: it is still there at the end only if the
    // page was never reloaded.
    browser.eval("window.sameDocument = true").await;

    let mut deleted_seen: Vec<u64> = Vec::new();
    let limit = Instant::now() + Duration::from_secs(600);
    let (state, counts) = loop {
        let (state, counts) = shown(&mut browser).await;
        if deleted_seen.last() != Some(&counts[0]) {
            deleted_seen.push(counts[0]);
            if deleted_seen.len() == 2 && state == "RUNNING" {
                browser.screenshot("operation-running").await;
            }
        }
        if state != "RUNNING" {
            break (state, counts);
        }
        assert!(Instant::now() < limit, "still RUNNING after 10 minutes: {counts:?}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    };
    browser.screenshot("operation-done").await;
    eprintln!(
        "the page showed deleted = {deleted_seen:?} and ended {state} after {:?}",
        opened.elapsed()
    );
    assert_eq!(state, "SUCCEEDED");
    assert!(
        deleted_seen.windows(2).all(|w| w[0] < w[1]),
        "the deleted count only rises: {deleted_seen:?}"
    );
    assert!(
        deleted_seen.len() >= 3,
        "the page showed the count rising at least twice while it ran: {deleted_seen:?}"
    );
    assert_eq!(
        browser.eval("window.sameDocument === true").await,
        Value::Bool(true),
        "reloaded"
    );
    browser
        .wait_for(
            "the stream's end",
            Duration::from_secs(10),
            "document.querySelector('#live').dataset.done === 'true'",
        )
        .await;

    // The final state is `cascade operation`'s exactly (asked of another node).
    let (state, counts) = {
        let (s, c) = shown(&mut browser).await;
        assert_eq!((s.as_str(), c), (state.as_str(), counts));
        (s, c)
    };
    let cli = cascade_operation(&cluster.node("eu-west").node.endpoint(), &op.id).await;
    assert_eq!(cli["state"].as_str(), Some(state.as_str()), "{cli}");
    assert_eq!(counts_of(&cli), counts, "{cli}");
    assert_eq!(
        counts[0],
        3 * PORTS_PER_REGION as u64 + 1,
        "every member deleted: {cli}"
    );
    assert_eq!(
        browser.text("#operation-id").await.as_deref(),
        cli["id"].as_str(),
        "the page is the operation's"
    );
}

/// Seed 002: a router in ap-south holds eu-west's network with `block`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stuck_cascade_shows_its_blocker_region_and_field_and_turns_succeeded_live_when_it_is_deleted() {
    let Some(mut browser) = Browser::launch("operation::stuck").await else {
        return;
    };
    let cluster = start_cluster_with(&REGIONS, |s| {
        with_console(s);
        s.admin.token = Some(ADMIN_TOKEN.to_owned());
    })
    .await;
    cluster
        .client("eu-west")
        .batch_create(vec![
            spec_in("eu-west/project/p", &[]),
            spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]),
            spec_in("eu-west/subnet/s", &[("network", &["eu-west/network/n"])]),
        ])
        .await
        .expect("eu-west");
    cluster
        .client("us-east")
        .create(spec_in("us-east/port/u", &[("network", &["eu-west/network/n"])]))
        .await
        .expect("us-east's port");
    cluster
        .client("ap-south")
        .batch_create(vec![
            spec_in("ap-south/project/q", &[]),
            spec_in(
                "ap-south/router/r",
                &[
                    ("project", &["ap-south/project/q"]),
                    ("gateway_network", &["eu-west/network/n"]),
                ],
            ),
        ])
        .await
        .expect("ap-south's router");
    let op = cluster
        .client("eu-west")
        .delete(delete_req("eu-west/project/p", true))
        .await
        .expect("accepted")
        .operation
        .expect("an operation");

    let console = console_of(&cluster, "eu-west");
    // The operations page lists every region's deletions: an
    // administrator's (Admin.ListDeletions), signed in with the token.
    browser.goto(&format!("{console}/login?next=/operations")).await;
    browser
        .eval(&format!(
            "document.querySelector('#token').value = '{ADMIN_TOKEN}'; document.querySelector('form.login').submit(); true"
        ))
        .await;
    let row = format!(r#"document.querySelector('tr[data-operation="{}"]')"#, op.id);
    // Read in the same evaluation: a live update may replace the row.
    let listed = browser
        .wait_for(
            "the operation among the running ones, stuck",
            Duration::from_secs(60),
            &format!("{row}?.querySelector('.stuck') ? {row}.innerText : null"),
        )
        .await;
    let listed = listed.as_str().unwrap_or_default();
    for part in ["eu-west/project/p", "RUNNING", "eu-west", "blocked"] {
        assert!(listed.contains(part), "{part} in the operations page's row: {listed}");
    }

    browser.goto(&format!("{console}/operations/{}", op.id)).await;
    browser.eval("window.sameDocument = true").await;
    let network = r#"document.querySelector('li.member[data-name="eu-west/network/n"]')"#;
    browser
        .wait_for(
            "the network flagged stuck",
            Duration::from_secs(60),
            &format!("{network}.classList.contains('stuck') && document.querySelector('#stuck') !== null"),
        )
        .await;
    let held = browser
        .eval(&format!("{network}.querySelector('.reasons').textContent"))
        .await;
    let held = held.as_str().unwrap_or_default();
    for part in ["ap-south/router/r", "region ap-south", "field gateway_network", "stuck"] {
        assert!(held.contains(part), "the reason names {part:?}: {held}");
    }
    assert_eq!(
        browser.eval(&format!("{network}.dataset.region")).await,
        Value::String("eu-west".into())
    );
    assert_eq!(browser.text("#state").await.as_deref(), Some("RUNNING"));
    browser.screenshot("operation-stuck").await;

    // The blocker goes: the same page turns SUCCEEDED without a reload.
    cluster
        .client("ap-south")
        .delete(delete_req("ap-south/router/r", false))
        .await
        .expect("the blocker is deleted");
    browser
        .wait_for(
            "SUCCEEDED",
            Duration::from_secs(60),
            "document.querySelector('#state').dataset.state === 'SUCCEEDED'",
        )
        .await;
    assert_eq!(
        browser.eval("window.sameDocument === true").await,
        Value::Bool(true),
        "reloaded"
    );
    let cli = cascade_operation(&cluster.node("us-east").node.endpoint(), &op.id).await;
    let (state, counts) = shown(&mut browser).await;
    assert_eq!(cli["state"].as_str(), Some(state.as_str()));
    assert_eq!(counts_of(&cli), counts, "{cli}");
}

/// A region's node stopped: the page answers within a second and names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_page_names_a_region_that_does_not_answer_and_still_answers_within_a_second() {
    let Some(mut browser) = Browser::launch("operation::unreachable").await else {
        return;
    };
    let mut cluster = start_cluster_with(&REGIONS, with_console).await;
    cluster
        .client("eu-west")
        .batch_create(vec![
            spec_in("eu-west/project/p", &[]),
            spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]),
        ])
        .await
        .expect("eu-west");
    cluster
        .client("us-east")
        .create(spec_in("us-east/port/u", &[("network", &["eu-west/network/n"])]))
        .await
        .expect("us-east's port");
    // A `block` router keeps the operation running (seed 002).
    cluster
        .client("ap-south")
        .batch_create(vec![
            spec_in("ap-south/project/q", &[]),
            spec_in(
                "ap-south/router/r",
                &[
                    ("project", &["ap-south/project/q"]),
                    ("gateway_network", &["eu-west/network/n"]),
                ],
            ),
        ])
        .await
        .expect("ap-south's router");
    let op = cluster
        .client("eu-west")
        .delete(delete_req("eu-west/project/p", true))
        .await
        .expect("accepted")
        .operation
        .expect("an operation");
    let console = console_of(&cluster, "eu-west");
    let url = format!("{console}/operations/{}", op.id);
    browser.goto(&url).await;
    browser
        .wait_for(
            "the tree",
            Duration::from_secs(60),
            "document.querySelector('#stuck') !== null",
        )
        .await;

    cluster.stop("ap-south").await;
    let started = Instant::now();
    browser.goto(&url).await;
    let took = started.elapsed();
    eprintln!("the operation page with ap-south stopped loaded in {took:?}");
    let named = browser
        .eval("Array.from(document.querySelectorAll('.unreachable')).map(e => e.dataset.region)")
        .await;
    assert_eq!(named, serde_json::json!(["ap-south"]), "the page names the region");
    assert!(
        took < Duration::from_secs(1),
        "the page answered within a second: {took:?}"
    );
    // The live part says so too, and keeps going.
    browser
        .wait_for(
            "a live update naming ap-south",
            Duration::from_secs(10),
            "Number(document.querySelector('#live').dataset.updates) >= 1 && \
             document.querySelector('#live .unreachable[data-region=\"ap-south\"]') !== null",
        )
        .await;
}
