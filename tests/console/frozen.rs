//! A region frozen while a cross-region cascade runs (issue 30, Done-when
//! 3): every link to and from ap-south goes through the fault-injecting
//! proxy, which then goes silent (connections accepted and kept open,
//! nothing answered: a SIGSTOPped process as its peers see it). The
//! operations page, the operation page and the frozen region's resource
//! page each load within a second, as the browser measures it, and name
//! ap-south. Then the same with a real SIGSTOP of ap-south's process.

use std::time::Duration;

use crate::browser::Browser;
use crate::support::fault_proxy::Fault;
use crate::support::{delete_req, spec_in, start_cluster_behind_proxies};
use crate::{console_of, with_console};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];
const FROZEN: &str = "ap-south";
const ADMIN_TOKEN: &str = "console-frozen-admin-7Qw2";

/// What a person is promised: a page within a second, frozen region or not.
const PAGE_WITHIN: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_region_frozen_mid_cascade_the_pages_load_within_a_second_and_name_it() {
    let Some(mut browser) = Browser::launch("frozen::pages_within_a_second").await else {
        return;
    };
    let proxied = start_cluster_behind_proxies(&REGIONS, |s| {
        with_console(s);
        s.admin.token = Some(ADMIN_TOKEN.to_owned());
    })
    .await;
    let cluster = &proxied.cluster;
    cluster
        .client("eu-west")
        .batch_create(vec![
            spec_in("eu-west/project/p", &[]),
            spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]),
        ])
        .await
        .expect("eu-west");
    for region in ["us-east", "ap-south"] {
        let ports = (0..50)
            .map(|i| spec_in(&format!("{region}/port/p{i}"), &[("network", &["eu-west/network/n"])]))
            .collect();
        cluster.client(region).batch_create(ports).await.expect("ports");
    }
    // A `block` router in the region to be frozen keeps the cascade
    // running however fast the rest goes (seed 002).
    cluster
        .client(FROZEN)
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

    let console = console_of(cluster, "eu-west");
    let operation_url = format!("{console}/operations/{}", op.id);
    // Signed in straight to the operation's page: a `goto` right after the
    // form's submit raced its redirect, and the redirect could win (CI
    // once ended on /operations and waited there for 60 s).
    browser
        .goto(&format!("{console}/login?next=/operations/{}", op.id))
        .await;
    browser
        .eval(&format!(
            "document.querySelector('#token').value = '{ADMIN_TOKEN}'; document.querySelector('form.login').submit(); true"
        ))
        .await;
    browser
        .wait_for(
            "the cascade running, held by the router",
            Duration::from_secs(60),
            "document.querySelector('#stuck') !== null && document.querySelector('#state').dataset.state === 'RUNNING'",
        )
        .await;

    // Freeze: every link to and from ap-south goes silent.
    for other in ["eu-west", "us-east"] {
        proxied.peer_proxy(other, FROZEN).set(Fault::Silent);
        proxied.peer_proxy(FROZEN, other).set(Fault::Silent);
    }

    let pages = [
        (
            "the operations page",
            format!("{console}/operations"),
            format!("document.querySelector('.unreachable[data-region=\"{FROZEN}\"]') !== null"),
        ),
        (
            "the operation page",
            operation_url.clone(),
            format!("document.querySelector('.unreachable[data-region=\"{FROZEN}\"]') !== null"),
        ),
        (
            "the frozen region's resource page",
            format!("{console}/resources/ap-south/router/r"),
            format!("document.querySelector('.unreachable[data-region=\"{FROZEN}\"]') !== null"),
        ),
    ];
    for (what, url, names_it) in &pages {
        browser.goto(url).await;
        let loaded = browser.loaded().await;
        eprintln!(
            "{what} with {FROZEN} frozen loaded in {:?} ({} bytes)",
            loaded.took, loaded.html_bytes
        );
        let text = browser.text("body").await.unwrap_or_default();
        assert_eq!(
            browser.eval(names_it).await,
            serde_json::Value::Bool(true),
            "{what} names {FROZEN} as unreachable:\n{text}"
        );
        assert!(
            loaded.took < PAGE_WITHIN,
            "{what} loaded within {PAGE_WITHIN:?} with {FROZEN} frozen: {:?}",
            loaded.took
        );
    }
}

/// The same with a real SIGSTOP: each region is a `cascade serve`
/// process (tests/support/process.rs), and ap-south's is stopped with
/// `kill -STOP` mid-cascade (its sockets stay open, the kernel still
/// accepts connections, nothing answers), then continued at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_region_sigstopped_mid_cascade_the_pages_load_within_a_second_and_name_it() {
    let Some(mut browser) = Browser::launch("frozen::sigstop").await else {
        return;
    };
    let consoles: std::collections::BTreeMap<String, u16> = REGIONS
        .iter()
        .map(|r| r.to_string())
        .zip(crate::support::free_ports(REGIONS.len()))
        .collect();
    let for_config = consoles.clone();
    // The `[deletion]` table is the one the helper lets a test write; the
    // console's table follows it.
    let cluster = tokio::task::spawn_blocking(move || {
        crate::support::ProcCluster::new(&REGIONS, |region| {
            format!(
                "tick_ms = 50\n\n[console]\nlisten = \"127.0.0.1:{}\"\n",
                for_config[region]
            )
        })
    })
    .await
    .expect("three `cascade serve` processes");
    let eu = cluster.client("eu-west").await;
    eu.batch_create(vec![
        spec_in("eu-west/project/p", &[]),
        spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]),
    ])
    .await
    .expect("eu-west");
    cluster
        .client(FROZEN)
        .await
        .batch_create(vec![
            spec_in("ap-south/project/q", &[]),
            spec_in("ap-south/port/a", &[("network", &["eu-west/network/n"])]),
            spec_in(
                "ap-south/router/r",
                &[
                    ("project", &["ap-south/project/q"]),
                    ("gateway_network", &["eu-west/network/n"]),
                ],
            ),
        ])
        .await
        .expect("ap-south's port and router");
    let op = eu
        .delete(delete_req("eu-west/project/p", true))
        .await
        .expect("accepted")
        .operation
        .expect("an operation");
    let console = format!("http://127.0.0.1:{}", consoles["eu-west"]);
    let operation_url = format!("{console}/operations/{}", op.id);
    browser.goto(&operation_url).await;
    browser
        .wait_for(
            "the cascade running, held by the router",
            Duration::from_secs(60),
            "document.querySelector('#stuck') !== null && document.querySelector('#state').dataset.state === 'RUNNING'",
        )
        .await;

    cluster.freeze(FROZEN);
    let pages = [
        ("the operations page", format!("{console}/operations")),
        ("the operation page", operation_url.clone()),
        (
            "the frozen region's resource page",
            format!("{console}/resources/ap-south/router/r"),
        ),
    ];
    let names_it = format!("document.querySelector('.unreachable[data-region=\"{FROZEN}\"]') !== null");
    let mut seen = Vec::new();
    for (what, url) in &pages {
        browser.goto(url).await;
        let loaded = browser.loaded().await;
        let named = browser.eval(&names_it).await;
        let text = browser.text("body").await.unwrap_or_default();
        seen.push((*what, loaded.took, named, text));
    }
    // Continued before any assertion: a failure leaves no stopped process.
    cluster.thaw(FROZEN);
    for (what, took, named, text) in seen {
        eprintln!("{what} with {FROZEN} SIGSTOPped loaded in {took:?}");
        assert_eq!(
            named,
            serde_json::Value::Bool(true),
            "{what} names {FROZEN} as unreachable:\n{text}"
        );
        assert!(
            took < PAGE_WITHIN,
            "{what} loaded within {PAGE_WITHIN:?} with {FROZEN} stopped: {took:?}"
        );
    }
}
