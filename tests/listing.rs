//! Listing across regions (issue 25, parts 1 and 2): one region, another
//! (forwarded), every region with a region stopped or silent; selectors by
//! attribute and prefix paged over 10,000 resources while others are
//! created and deleted; references and `cascade tree` on the real demo.

// Test code: poll deadlines and elapsed times are real time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::Client;
use cascade_proto::v1;
use support::demo::Demo;
use support::fault_proxy::Fault;
use support::{start_cluster, start_cluster_behind_proxies};

/// A project with attributes (projects need no reference).
fn project(name: &str, attributes: &[(&str, &str)]) -> v1::ResourceSpec {
    v1::ResourceSpec {
        name: name.to_owned(),
        attributes: attributes
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

/// Every page of a listing to the end, with what each page said was
/// unreachable. Panics if it does not end within `max_pages`.
async fn walk(client: &Client, req: v1::ListRequest, max_pages: usize) -> (Vec<String>, Vec<Vec<String>>) {
    let mut names = Vec::new();
    let mut unreachable = Vec::new();
    let mut token = String::new();
    for _ in 0..max_pages {
        let page = client
            .list(v1::ListRequest {
                page_token: token,
                ..req.clone()
            })
            .await
            .expect("a page");
        assert!(page.resources.len() <= req.page_size as usize);
        names.extend(page.resources.into_iter().map(|r| r.name));
        unreachable.push(page.unreachable.into_iter().map(|u| u.region).collect());
        token = page.next_page_token;
        if token.is_empty() {
            return (names, unreachable);
        }
    }
    panic!("the listing did not end within {max_pages} pages");
}

/// Each whitespace-separated line of `out`, as its words.
fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn ports(range: std::ops::RangeInclusive<u32>) -> Vec<String> {
    range.map(|i| format!("us-east/port/p{i}")).collect()
}

#[tokio::test]
async fn the_demo_lists_other_regions_references_and_trees_from_its_default_node() {
    let demo = Demo::start(true);
    // The default node is eu-west: its own listing has no port.
    let own = demo.cascade_ok(&["list", "--kind", "port"]);
    assert!(!own.contains("us-east/port/"), "{own}");
    // Every region, and us-east by name (forwarded): the six ports.
    for args in [
        &["list", "--kind", "port", "--all-regions"][..],
        &["list", "--kind", "port", "--region", "us-east"][..],
    ] {
        let out = demo.cascade_ok(args);
        let listed: Vec<String> = rows(&out)
            .into_iter()
            .skip(1)
            .map(|r| {
                assert_eq!(r.get(1).map(String::as_str), Some("ACTIVE"), "{out}");
                r[0].clone()
            })
            .collect();
        assert_eq!(listed, ports(1..=6), "cascade {args:?}:\n{out}");
    }
    // Prefix and attribute selector over every region.
    let out = demo.cascade_ok(&["list", "--all-regions", "--prefix", "net1-", "-l", "cidr"]);
    let listed: Vec<String> = rows(&out).into_iter().skip(1).map(|r| r[0].clone()).collect();
    assert_eq!(listed, ["eu-west/subnet/net1-a", "eu-west/subnet/net1-b"], "{out}");
    let out = demo.cascade_ok(&["list", "--all-regions", "-l", "owner in (bob),!missing"]);
    let listed: Vec<String> = rows(&out).into_iter().skip(1).map(|r| r[0].clone()).collect();
    assert_eq!(listed, ["ap-south/project/ops", "eu-west/project/legacy"], "{out}");
    // A selector that does not parse: refused, with where and a short quote.
    let bad = demo.cascade(&["list", "--all-regions", "-l", "env=staging,tier~db"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(
        err.contains("InvalidArgument") && err.contains("at character 16") && err.contains("\"~db\""),
        "{err}"
    );

    // Who points at net1, in every region, with field and policy.
    let out = demo.cascade_ok(&["list", "--referencing", "eu-west/network/net1"]);
    let found = rows(&out);
    assert_eq!(found[0], ["REFERRER", "FIELD", "POLICY", "TARGET"], "{out}");
    let expected: BTreeSet<Vec<String>> = ["eu-west/subnet/net1-a", "eu-west/subnet/net1-b"]
        .into_iter()
        .map(str::to_owned)
        .chain(ports(1..=6))
        .map(|referrer| {
            vec![
                referrer,
                "network".to_owned(),
                "cascade".to_owned(),
                "eu-west/network/net1".to_owned(),
            ]
        })
        .collect();
    let got: BTreeSet<Vec<String>> = found.into_iter().skip(1).collect();
    assert_eq!(got, expected, "{out}");
    // The same rows three at a time, each once.
    let out = demo.cascade_ok(&[
        "list",
        "--referencing",
        "eu-west/network/net1",
        "--page-size",
        "3",
        "--all",
    ]);
    let paged: Vec<Vec<String>> = rows(&out).into_iter().skip(1).collect();
    assert_eq!(paged.len(), expected.len(), "{out}");
    assert_eq!(paged.into_iter().collect::<BTreeSet<_>>(), expected, "{out}");
    // What p4 points at, asked of eu-west and answered by us-east.
    let out = demo.cascade_ok(&["list", "--referenced-by", "us-east/port/p4"]);
    let got: BTreeSet<Vec<String>> = rows(&out).into_iter().skip(1).collect();
    assert!(
        got.contains(&vec![
            "us-east/port/p4".to_owned(),
            "security_groups".to_owned(),
            "unset".to_owned(),
            "eu-west/security_group/web".to_owned()
        ]),
        "{out}"
    );
    assert_eq!(got.len(), 3, "network, subnet, security_groups: {out}");
    let out = demo.cascade_ok(&[
        "list",
        "--referenced-by",
        "us-east/port/p4",
        "--page-size",
        "1",
        "--all",
    ]);
    assert_eq!(rows(&out).into_iter().skip(1).collect::<BTreeSet<_>>(), got, "{out}");

    // The tree under net1: the subnets, and the us-east ports under both
    // net1 and their subnet, with their states; p4's floating IP below it.
    let out = demo.cascade_ok(&["tree", "eu-west/network/net1"]);
    assert!(out.starts_with("eu-west/network/net1  ACTIVE\n"), "{out}");
    for line in [
        "├─ eu-west/subnet/net1-a  ACTIVE  (network, cascade)",
        "us-east/port/p1  ACTIVE  (network, cascade)",
        "us-east/port/p2  ACTIVE  (subnet, cascade)",
        "ap-south/floating_ip/fip1  ACTIVE  (port, unset)",
        "ap-south/port_group/web-ports  ACTIVE  (ports, cascade)",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
    assert!(!out.contains("(cut:"), "{out}");
}

#[tokio::test]
async fn a_stopped_region_is_named_and_the_others_are_listed_within_the_deadline() {
    let mut cluster = start_cluster(&["eu-west", "us-east", "ap-south"]).await;
    for region in ["eu-west", "us-east", "ap-south"] {
        let specs = (0..5)
            .map(|i| project(&format!("{region}/project/p{i}"), &[]))
            .collect();
        cluster.client(region).batch_create(specs).await.expect("projects");
    }
    cluster.stop("ap-south").await;
    let eu = cluster.client("eu-west").clone();
    let started = Instant::now();
    let page = eu
        .list_within(
            v1::ListRequest {
                all_regions: true,
                page_size: 100,
                ..Default::default()
            },
            Duration::from_secs(3),
        )
        .await
        .expect("the listing succeeds without ap-south");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "{took:?}");
    let names: Vec<&str> = page.resources.iter().map(|r| r.name.as_str()).collect();
    let expected: Vec<String> = ["eu-west", "us-east"]
        .iter()
        .flat_map(|r| (0..5).map(move |i| format!("{r}/project/p{i}")))
        .collect();
    assert_eq!(names, expected);
    assert_eq!(page.unreachable.len(), 1, "{:?}", page.unreachable);
    assert_eq!(page.unreachable[0].region, "ap-south");
    assert!(!page.unreachable[0].reason.is_empty());
    assert!(page.next_page_token.is_empty(), "nothing is left to ask");
    // Small pages: paging ends, and every page names ap-south.
    let (names, unreachable) = walk(
        &eu,
        v1::ListRequest {
            all_regions: true,
            page_size: 3,
            ..Default::default()
        },
        20,
    )
    .await;
    assert_eq!(names, expected);
    assert!(
        unreachable.iter().all(|u| u == &["ap-south".to_owned()]),
        "{unreachable:?}"
    );

    // The binary: the items, a warning naming the region, exit status 1.
    let endpoint = cluster.node("eu-west").node.endpoint();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
            .args(["--server", &endpoint, "list", "--all-regions", "--timeout", "3"])
            .env_remove("CASCADE_OUTPUT")
            .output()
            .expect("cascade runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("us-east/project/p4"), "{stdout}");
    assert!(
        stderr.contains("warning: region ap-south did not answer:") && stderr.contains("the listing is incomplete"),
        "{stderr}"
    );
    // `-o json`: the items and the unreachable region.
    let endpoint = cluster.node("eu-west").node.endpoint();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
            .args(["--server", &endpoint, "-o", "json", "list", "--all-regions"])
            .output()
            .expect("cascade runs")
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["resources"].as_array().map(Vec::len), Some(10), "{json}");
    assert_eq!(json["unreachable"][0]["region"], "ap-south", "{json}");
}

#[tokio::test]
async fn a_silent_region_is_given_up_within_the_callers_deadline() {
    let proxied = start_cluster_behind_proxies(&["eu-west", "us-east", "ap-south"], |_| {}).await;
    let eu = proxied.cluster.client("eu-west").clone();
    eu.batch_create(vec![project("eu-west/project/a", &[])]).await.unwrap();
    // Every byte between eu-west and ap-south is lost, nothing is closed.
    proxied.peer_proxy("eu-west", "ap-south").set(Fault::Silent);
    let started = Instant::now();
    let page = eu
        .list_within(
            v1::ListRequest {
                all_regions: true,
                ..Default::default()
            },
            Duration::from_secs(2),
        )
        .await
        .expect("the listing answers without ap-south");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(
        page.resources.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ["eu-west/project/a"]
    );
    let silent: Vec<(&str, &str)> = page
        .unreachable
        .iter()
        .map(|u| (u.region.as_str(), u.reason.as_str()))
        .collect();
    assert_eq!(silent.len(), 1, "{silent:?}");
    assert_eq!(silent[0].0, "ap-south");
    assert!(silent[0].1.starts_with("did not answer within"), "{silent:?}");
}

/// Attributes of the `i`th resource: env staging for even i, tier db for
/// every tenth, rare for three far apart (RARE).
fn attributes_of(i: usize) -> Vec<(&'static str, &'static str)> {
    let mut attributes = vec![
        ("env", if i.is_multiple_of(2) { "staging" } else { "prod" }),
        ("tier", if i.is_multiple_of(10) { "db" } else { "web" }),
    ];
    if RARE.contains(&i) {
        attributes.push(("rare", "yes"));
    }
    attributes
}

/// The resources with attribute `rare`: in name order the first, the one
/// in the middle (api-09999) and the last of eu-west's 10,000 (web-04999),
/// after more rows than one page examines.
const RARE: [usize; 3] = [7, 4999, 9999];

/// Creates and deletes resources that match both selectors until `stop`:
/// returns every name it created.
fn churn(client: Client, region: &'static str, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<BTreeSet<String>> {
    tokio::spawn(async move {
        let mut made = BTreeSet::new();
        let mut n = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let name = format!("{region}/project/web-churn-{n:05}");
            client
                .create(project(&name, &[("env", "staging"), ("tier", "web")]))
                .await
                .expect("churn create");
            made.insert(name);
            if n >= 3 {
                let old = format!("{region}/project/web-churn-{:05}", n - 3);
                client
                    .delete(v1::DeleteRequest {
                        name: old,
                        requested_by: "churn".into(),
                        ..Default::default()
                    })
                    .await
                    .expect("churn delete");
            }
            n += 1;
        }
        made
    })
}

/// Seen names: none twice, every stable one, nothing but stable and churned.
fn check_walk(what: &str, seen: &[String], stable: &BTreeSet<String>, churned: &BTreeSet<String>) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for n in seen {
        *counts.entry(n).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, c)| **c > 1).collect();
    assert!(twice.is_empty(), "{what}: listed twice: {twice:?}");
    let missed: Vec<_> = stable.iter().filter(|n| !counts.contains_key(n.as_str())).collect();
    assert!(
        missed.is_empty(),
        "{what}: missed {} such as {:?}",
        missed.len(),
        missed.first()
    );
    let stray: Vec<_> = counts
        .keys()
        .filter(|n| !stable.contains(**n) && !churned.contains(**n))
        .collect();
    assert!(stray.is_empty(), "{what}: listed what it should not: {stray:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_page_over_ten_thousand_resources_while_others_come_and_go() {
    let cluster = start_cluster(&["eu-west", "us-east", "ap-south"]).await;
    let eu = cluster.client("eu-west").clone();
    let started = Instant::now();
    // 10,000 projects in eu-west: web-00000…web-04999, api-05000…api-09999.
    let id = |i: usize| {
        if i < 5000 {
            format!("eu-west/project/web-{i:05}")
        } else {
            format!("eu-west/project/api-{i:05}")
        }
    };
    for batch in 0..10 {
        let specs = (batch * 1000..(batch + 1) * 1000)
            .map(|i| project(&id(i), &attributes_of(i)))
            .collect();
        eu.batch_create(specs).await.expect("a batch of 1,000");
    }
    let created = started.elapsed();
    // And 300 in each other region, for the listing of every region.
    for region in ["us-east", "ap-south"] {
        let specs = (0..300)
            .map(|i| project(&format!("{region}/project/web-{i:05}"), &attributes_of(i)))
            .collect();
        cluster.client(region).batch_create(specs).await.expect("300");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let eu_churn = churn(cluster.client("eu-west").clone(), "eu-west", stop.clone());
    let us_churn = churn(cluster.client("us-east").clone(), "us-east", stop.clone());

    let walked = Instant::now();
    let selector = "env=staging,tier!=db";
    let (by_attribute, _) = walk(
        &eu,
        v1::ListRequest {
            kind: "project".into(),
            attribute_selector: selector.into(),
            page_size: 97,
            ..Default::default()
        },
        1000,
    )
    .await;
    let (by_prefix, _) = walk(
        &eu,
        v1::ListRequest {
            name_prefix: "web-".into(),
            page_size: 97,
            ..Default::default()
        },
        1000,
    )
    .await;
    let (everywhere, unreachable) = walk(
        &eu,
        v1::ListRequest {
            all_regions: true,
            kind: "project".into(),
            name_prefix: "web-".into(),
            attribute_selector: selector.into(),
            page_size: 97,
            ..Default::default()
        },
        1000,
    )
    .await;
    // A selector that 3 of 10,000 match: the first page examines as many
    // rows as it may and comes back short with a token, the next finds
    // the last one.
    let mut rare = Vec::new();
    let mut short_pages = 0;
    let mut token = String::new();
    for _ in 0..100 {
        let page = eu
            .list(v1::ListRequest {
                attribute_selector: "rare".into(),
                page_size: 97,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap();
        rare.extend(page.resources.into_iter().map(|r| r.name));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
        short_pages += 1;
    }
    assert!(token.is_empty(), "the rare walk did not end");
    assert!(short_pages >= 1, "no page came back short with a token");
    let rare_expected: BTreeSet<String> = RARE.iter().map(|i| id(*i)).collect();
    check_walk("-l rare", &rare, &rare_expected, &BTreeSet::new());
    let walk_time = walked.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut churned = eu_churn.await.unwrap();
    churned.extend(us_churn.await.unwrap());
    println!(
        "10,000 created in {created:?}; four walks in {walk_time:?} with {} churned; total {:?}",
        churned.len(),
        started.elapsed()
    );
    assert!(churned.len() > 10, "the churn ran during the walks: {}", churned.len());
    assert!(unreachable.iter().all(Vec::is_empty), "{unreachable:?}");

    let matches = |i: usize| i.is_multiple_of(2) && !i.is_multiple_of(10);
    let stable: BTreeSet<String> = (0..10_000).filter(|i| matches(*i)).map(id).collect();
    assert_eq!(stable.len(), 4000);
    check_walk("-l", &by_attribute, &stable, &churned);
    let stable: BTreeSet<String> = (0..5000).map(id).collect();
    check_walk("--prefix", &by_prefix, &stable, &churned);
    let stable: BTreeSet<String> = ["ap-south", "eu-west", "us-east"]
        .iter()
        .flat_map(|r| {
            let n = if *r == "eu-west" { 5000 } else { 300 };
            (0..n)
                .filter(|i| matches(*i))
                .map(move |i| format!("{r}/project/web-{i:05}"))
        })
        .collect();
    check_walk("--all-regions", &everywhere, &stable, &churned);
    // Each region's part comes in name order.
    let mut sorted = everywhere.clone();
    sorted.sort();
    assert_eq!(everywhere, sorted);
}

#[tokio::test]
async fn bad_selectors_tokens_and_combinations_are_refused_as_invalid_arguments() {
    let cluster = start_cluster(&["eu-west", "us-east"]).await;
    let eu = cluster.client("eu-west");
    let refused = |r: Result<v1::ListResponse, cascade_client::ClientError>| {
        let e = r.expect_err("refused");
        assert_eq!(e.code(), Some(tonic::Code::InvalidArgument), "{e}");
        e.to_string()
    };
    let long_tail = format!("env=x,{}", "~".repeat(900));
    for (selector, expected) in [
        ("env=staging,tier~db", "at character 16"),
        ("tier in db", "expected '(' and a set of values"),
        (long_tail.as_str(), "(900 bytes)"),
    ] {
        for all_regions in [false, true] {
            let message = refused(
                eu.list(v1::ListRequest {
                    attribute_selector: selector.to_owned(),
                    all_regions,
                    ..Default::default()
                })
                .await,
            );
            assert!(message.contains(expected) && message.len() < 400, "{message}");
        }
    }
    let message = refused(
        eu.list(v1::ListRequest {
            region: "us-east".into(),
            all_regions: true,
            ..Default::default()
        })
        .await,
    );
    assert!(message.contains("region"), "{message}");
    let message = refused(
        eu.list(v1::ListRequest {
            region: "mars".into(),
            ..Default::default()
        })
        .await,
    );
    assert!(
        message.contains("\"mars\" is not a region of this cluster"),
        "{message}"
    );
    // A token of one listing used with other selectors.
    for region in ["eu-west", "us-east"] {
        let specs = (0..3)
            .map(|i| project(&format!("{region}/project/p{i}"), &[]))
            .collect();
        cluster.client(region).batch_create(specs).await.unwrap();
    }
    let first = eu
        .list(v1::ListRequest {
            all_regions: true,
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!first.next_page_token.is_empty());
    // A token naming a region this cluster does not have (another
    // cluster's, or made up) is refused, not asked about.
    let mut stranger = cascade_proto::page_token::ListPageToken::decode(&first.next_page_token)
        .expect("a token of this node decodes")
        .expect("a token");
    stranger
        .regions
        .insert("mars".into(), cascade_core::listing::RegionPosition::Start);
    let message = refused(
        eu.list(v1::ListRequest {
            all_regions: true,
            page_size: 2,
            page_token: stranger.encode(),
            ..Default::default()
        })
        .await,
    );
    assert!(
        message.contains("\"mars\", which is not a region of this cluster"),
        "{message}"
    );
    // A position that is not a name of its own region: refused, not a
    // region given up because it refused the position (why did the walk
    // end "incomplete" on a tampered token? it was not checked).
    let mut foreign = cascade_proto::page_token::ListPageToken::decode(&first.next_page_token)
        .expect("a token of this node decodes")
        .expect("a token");
    foreign.regions.insert(
        "us-east".into(),
        cascade_core::listing::RegionPosition::After("eu-west/project/p0".into()),
    );
    let message = refused(
        eu.list(v1::ListRequest {
            all_regions: true,
            page_size: 2,
            page_token: foreign.encode(),
            ..Default::default()
        })
        .await,
    );
    assert!(message.contains("holds a position of region"), "{message}");
    let message = refused(
        eu.list(v1::ListRequest {
            all_regions: true,
            page_size: 2,
            name_prefix: "p".into(),
            page_token: first.next_page_token,
            ..Default::default()
        })
        .await,
    );
    assert!(message.contains("other selectors"), "{message}");
}
