//! A 100,000-member operation's page (issue 30, Done-when 7): the page a
//! browser is sent stays one page however large the operation is. Its
//! outcomes come a page at a time with a working "Next page" link, and its
//! tree is drawn collapsed below the open levels and cut at the drawn
//! maximum. One region is enough for the size.
//!
//! The load time is printed (`--nocapture`), not asserted: no timed tests
//! for performance. docs/BENCHMARKS.md ("Console") has the figure.

use std::time::{Duration, Instant};

use cascade_proto::v1;

use crate::browser::Browser;
use crate::support::{delete_req, eventually, spec_in, start_cluster_with};
use crate::{console_of, with_console};

/// Networks under the project; under each, this many ports, each with a
/// trunk, each with a subport (of the trunk and the port, as the schema
/// requires): 1 + 100 + 3 × 100 × 333 = 100,001 members, four or five
/// levels deep.
const NETWORKS: usize = 100;
const PORTS_PER_NETWORK: usize = 333;

/// Members the operation may delete (`max_deletions`).
const BUDGET: u64 = 50_000;

/// Resources per `BatchCreate` (each batch is one atomic write).
const CHUNK: usize = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_thousand_member_operation_page_pages_its_outcomes_and_collapses_its_tree() {
    let Some(mut browser) = Browser::launch("large::hundred_thousand").await else {
        return;
    };
    let cluster = start_cluster_with(&["eu-west"], with_console).await;
    let client = cluster.client("eu-west");
    let started = Instant::now();
    let mut specs = vec![spec_in("eu-west/project/p", &[])];
    specs.extend(
        (0..NETWORKS).map(|n| spec_in(&format!("eu-west/network/n{n}"), &[("project", &["eu-west/project/p"])])),
    );
    client.batch_create(specs).await.expect("the project and its networks");
    for n in 0..NETWORKS {
        let network = format!("eu-west/network/n{n}");
        let port = |i: usize| format!("eu-west/port/n{n}-p{i}");
        let trunk = |i: usize| format!("eu-west/trunk/n{n}-t{i}");
        let ports: Vec<_> = (0..PORTS_PER_NETWORK)
            .map(|i| spec_in(&port(i), &[("network", &[network.as_str()])]))
            .collect();
        let trunks: Vec<_> = (0..PORTS_PER_NETWORK)
            .map(|i| spec_in(&trunk(i), &[("parent_port", &[port(i).as_str()])]))
            .collect();
        let subports: Vec<_> = (0..PORTS_PER_NETWORK)
            .map(|i| {
                spec_in(
                    &format!("eu-west/subport/n{n}-s{i}"),
                    &[("trunk", &[trunk(i).as_str()]), ("port", &[port(i).as_str()])],
                )
            })
            .collect();
        for level in [ports, trunks, subports] {
            for chunk in level.chunks(CHUNK) {
                client.batch_create(chunk.to_vec()).await.expect("a batch");
            }
        }
    }
    let members = 1 + NETWORKS + 3 * NETWORKS * PORTS_PER_NETWORK;
    eprintln!("created {members} resources in {:?}", started.elapsed());

    // A budget of half the members: the other half stays BLOCKED
    // ("budget reached") and the operation RUNNING, so the page is read
    // while it runs (the tree is drawn only then) however fast the rest
    // went.
    let op = client
        .delete(v1::DeleteRequest {
            max_deletions: BUDGET,
            ..delete_req("eu-west/project/p", true)
        })
        .await
        .expect("accepted")
        .operation
        .expect("an operation");
    eventually(
        Duration::from_secs(300),
        "the budget reached, a second page of outcomes",
        || async {
            let read = client.get_operation(&op.id, 50).await.ok()?;
            let blocked = read.progress.map(|p| p.blocked).unwrap_or(0);
            (!read.next_outcomes_page_token.is_empty() && blocked > 0).then_some(())
        },
    )
    .await;

    let console = console_of(&cluster, "eu-west");
    browser.goto(&format!("{console}/operations/{}", op.id)).await;
    let loaded = browser.loaded().await;
    println!(
        "the {members}-member operation's page loaded in {:?}; its HTML is {} bytes",
        loaded.took, loaded.html_bytes
    );
    let rows = browser
        .eval("document.querySelectorAll('table.outcomes tr.outcome').length")
        .await;
    let rows = rows.as_u64().unwrap_or(0);
    assert!((1..=50).contains(&rows), "one page of outcomes: {rows}");
    let drawn = browser.eval("document.querySelectorAll('li.member').length").await;
    let drawn = drawn.as_u64().unwrap_or(0);
    assert_eq!(
        browser.eval("document.querySelector('#state').dataset.state").await,
        "RUNNING",
        "read while it runs (the tree is drawn only then)"
    );
    assert!((1..=2_000).contains(&drawn), "at most 2,000 members drawn: {drawn}");
    // Open exactly above the open levels (the console's `OPEN_LEVELS`, 2),
    // collapsed below, counted by the `details` around each. Which members
    // are still in flight when the budget is reached depends on how the
    // steps fell, so a run may draw none below the open levels (CI saw
    // "0 of 38 collapsed": every drawn member within two levels); the
    // rule is checked on whatever is drawn, and the unit test
    // `a_member_deeper_than_the_open_levels_is_collapsed` draws a deep one
    // for sure.
    let misdrawn = browser
        .eval(
            "Array.from(document.querySelectorAll('ul.tree details')).filter(d => { \
               let depth = 0; let up = d.parentElement.closest('details'); \
               while (up) { depth += 1; up = up.parentElement.closest('details'); } \
               return d.open !== (depth < 2); }).map(d => d.dataset.key)",
        )
        .await;
    let collapsed = browser
        .eval("Array.from(document.querySelectorAll('ul.tree details')).filter(d => !d.open).length")
        .await;
    assert!(
        misdrawn.as_array().is_some_and(Vec::is_empty),
        "members open below the open levels or collapsed above them: {misdrawn}; {collapsed} collapsed of {}; {drawn} drawn; {}",
        browser.eval("document.querySelectorAll('ul.tree details').length").await,
        browser.eval("Array.from(document.querySelectorAll('ul.tree > li')).slice(0, 5).map(l => l.dataset.name + ' ' + l.querySelectorAll('li').length).join(', ') + ' | ' + (document.querySelector('.tree-section .note')?.textContent ?? '') + ' | ' + (document.querySelector('.in-flight')?.innerText ?? '')").await
    );
    let with_children = browser
        .eval("document.querySelectorAll('ul.tree details').length")
        .await;
    assert!(
        with_children.as_u64() > Some(0),
        "the root and its members in flight are drawn with their children: {with_children}"
    );
    println!("{collapsed} of {with_children} members with children drawn collapsed below the open levels");
    let first = browser
        .eval("Array.from(document.querySelectorAll('tr.outcome td:first-child')).map(t => t.textContent)")
        .await;
    browser
        .eval("document.querySelector('p.pager a.next').click(); true")
        .await;
    let second = browser
        .wait_for(
            "the second page of outcomes",
            Duration::from_secs(30),
            "location.search.startsWith('?outcomes=') && document.readyState === 'complete' ? \
             Array.from(document.querySelectorAll('tr.outcome td:first-child')).map(t => t.textContent) : null",
        )
        .await;
    assert!(second.as_array().is_some_and(|s| !s.is_empty()), "{second}");
    assert_ne!(first, second, "the next page shows other outcomes");
}
