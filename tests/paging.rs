//! Paging properties of every paged call: List (`page_size`,
//! `page_token`), GetOperation's outcomes (`outcomes_page_size`,
//! `outcomes_page_token`, across three regions, through every node) and
//! Watch resumed from a revision. With page sizes 1, 2, 3, 7 and larger
//! than the total, every item comes exactly once and the token ends (each
//! loop is bounded: a token that never empties fails the test).

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use cascade_client::Client;
use cascade_proto::v1;
use futures::StreamExt;
use support::*;

const SIZES: [u32; 5] = [1, 2, 3, 7, 1000];

/// Three regions, in an order that is not alphabetical (the token's region
/// order is), with eu-west the origin of the deletion.
const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// Pages through `fetch` until the token is empty; fails after `bound`
/// pages. Returns the items in the order received.
async fn page_all<F, Fut>(what: &str, bound: usize, mut fetch: F) -> Vec<String>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = (Vec<String>, String)>,
{
    let mut items = Vec::new();
    let mut token = String::new();
    for _ in 0..bound {
        let (page, next) = fetch(token).await;
        items.extend(page);
        if next.is_empty() {
            return items;
        }
        token = next;
    }
    panic!("{what}: the page token did not end within {bound} pages (got {items:?})");
}

/// Every item once, and exactly the expected ones.
fn assert_once(what: &str, items: &[String], expected: &BTreeSet<String>) {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let duplicated: Vec<&String> = items.iter().filter(|i| !seen.insert((*i).clone())).collect();
    assert!(duplicated.is_empty(), "{what}: duplicated {duplicated:?} in {items:?}");
    let missing: Vec<&String> = expected.difference(&seen).collect();
    let extra: Vec<&String> = seen.difference(expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: missing {missing:?}, unexpected {extra:?}"
    );
}

/// One page of an operation's outcomes (the resource names).
async fn outcomes_page(client: &Client, id: &str, size: u32, token: String) -> (Vec<String>, String) {
    let op = client
        .raw()
        .get_operation(v1::GetOperationRequest {
            id: id.to_owned(),
            outcomes_page_size: size,
            outcomes_page_token: token,
        })
        .await
        .unwrap_or_else(|e| panic!("GetOperation page: {e:?}"))
        .into_inner();
    let names = op
        .outcomes
        .iter()
        .map(|o| o.resource.as_ref().expect("outcome resource").name.clone())
        .collect();
    (names, op.next_outcomes_page_token)
}

/// Bug 5's topology: a network in eu-west and ports on it in every region,
/// deleted with cascade: 10 outcomes, 4 in eu-west and 3 in each of the
/// others. Returns the cluster, the operation id and the 10 names.
async fn ten_outcomes_over_three_regions() -> (Cluster, String, BTreeSet<String>) {
    let c = start_cluster(&REGIONS).await;
    let eu = c.client("eu-west");
    eu.batch_create(vec![
        spec_in("eu-west/project/p", &[]),
        spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]),
    ])
    .await
    .unwrap();
    let mut expected: BTreeSet<String> = ["eu-west/network/n".to_owned()].into();
    for region in REGIONS {
        let ports: Vec<v1::ResourceSpec> = (0..3)
            .map(|i| spec_in(&format!("{region}/port/p{i}"), &[("network", &["eu-west/network/n"])]))
            .collect();
        expected.extend(ports.iter().map(|p| p.name.clone()));
        c.client(region).batch_create(ports).await.unwrap();
    }
    assert_eq!(expected.len(), 10);
    let done = delete_and_wait(eu, "eu-west/network/n", true).await;
    assert_eq!(done.progress.as_ref().map(|p| p.deleted), Some(10), "{done:?}");
    (c, done.id, expected)
}

/// Bug 5 exactly: 10 outcomes over 3 regions, `outcomes_page_size = 2`.
/// Through the origin, 12 outcomes came back (4 duplicated, 2 missing);
/// through another node the token never emptied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_outcomes_over_three_regions_page_by_two_exactly_once_through_every_node() {
    let (c, id, expected) = ten_outcomes_over_three_regions().await;
    for region in REGIONS {
        let client = c.client(region);
        let items = page_all(&format!("through {region}"), 20, |token| {
            outcomes_page(client, &id, 2, token)
        })
        .await;
        assert_once(&format!("page size 2 through {region}"), &items, &expected);
        assert_eq!(items.len(), 10);
    }
}

/// Every page size, through every node, and a token issued by one node
/// continued by the next (round robin): every outcome once, the token ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operation_outcomes_page_exactly_once_for_every_size_through_every_node() {
    let (c, id, expected) = ten_outcomes_over_three_regions().await;
    for size in SIZES {
        for region in REGIONS {
            let client = c.client(region);
            let items = page_all(&format!("size {size} through {region}"), 12, |token| {
                outcomes_page(client, &id, size, token)
            })
            .await;
            assert_once(&format!("size {size} through {region}"), &items, &expected);
        }
        // Each page through the next node.
        let mut items = Vec::new();
        let mut token = String::new();
        let mut ended = false;
        for turn in 0..12 {
            let client = c.client(REGIONS[turn % REGIONS.len()]);
            let (page, next) = outcomes_page(client, &id, size, token).await;
            items.extend(page);
            if next.is_empty() {
                ended = true;
                break;
            }
            token = next;
        }
        assert!(ended, "size {size} round robin: the token did not end ({items:?})");
        assert_once(&format!("size {size} round robin"), &items, &expected);
    }
    // The token is opaque, and a made-up one is refused by name.
    for bad in ["eu-west/port/p1", "not a token", "AAAA"] {
        let err = c
            .client("us-east")
            .raw()
            .get_operation(v1::GetOperationRequest {
                id: id.clone(),
                outcomes_page_size: 2,
                outcomes_page_token: bad.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad:?}: {err:?}");
        let details = cascade_proto::error_details(&err).expect("details");
        assert_eq!(details.field, "outcomes_page_token", "{bad:?}: {err:?}");
    }
}

/// List pages by name within a region, with and without a kind filter.
#[tokio::test]
async fn list_pages_exactly_once_for_every_size() {
    let t = start_node().await;
    let c = &t.client;
    c.create(spec("project/p", &[])).await.unwrap();
    c.create(spec("network/n", &[("project", &["project/p"])]))
        .await
        .unwrap();
    let mut ports = Vec::new();
    for i in 0..11 {
        let s = spec(&format!("port/p{i:02}"), &[("network", &["network/n"])]);
        ports.push(s.name.clone());
        c.create(s).await.unwrap();
    }
    let mut all: BTreeSet<String> = ports.iter().cloned().collect();
    all.insert(full("project/p"));
    all.insert(full("network/n"));
    let ports: BTreeSet<String> = ports.into_iter().collect();
    for size in SIZES {
        for (kind, expected) in [("", &all), ("port", &ports)] {
            let what = format!("List kind {kind:?} size {size}");
            let items = page_all(&what, 20, |token| async move {
                let page = c
                    .list(v1::ListRequest {
                        kind: kind.to_owned(),
                        page_size: size,
                        page_token: token,
                        ..Default::default()
                    })
                    .await
                    .unwrap_or_else(|e| panic!("List: {e}"));
                (
                    page.resources.into_iter().map(|r| r.name).collect(),
                    page.next_page_token,
                )
            })
            .await;
            assert_once(&what, &items, expected);
        }
    }
    let err = c
        .list(v1::ListRequest {
            page_token: "not a name".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    t.node.stop().await.unwrap();
}

/// Reads up to `n` events of a watch from `from` (fewer if none comes for
/// a moment: the watch follows the live feed and never ends by itself).
async fn watch_some(client: &Client, from: u64, n: usize) -> Vec<u64> {
    let mut stream = client.watch(from, "").await.expect("watch");
    let mut revisions = Vec::new();
    while revisions.len() < n {
        match tokio::time::timeout(Duration::from_millis(500), stream.next()).await {
            Ok(Some(Ok(e))) => revisions.push(e.revision),
            Ok(Some(Err(s))) => panic!("watch from {from}: {s:?}"),
            Ok(None) | Err(_) => break,
        }
    }
    revisions
}

/// Watch resumed from the revision after the last one seen, in chunks of
/// every size: every event once, in order, up to the last.
#[tokio::test]
async fn watch_resumed_from_a_revision_sees_every_event_once() {
    let t = start_node().await;
    let c = &t.client;
    c.create(spec("project/p", &[])).await.unwrap();
    for i in 0..9 {
        c.create(spec(&format!("network/n{i}"), &[("project", &["project/p"])]))
            .await
            .unwrap();
    }
    let all = watch_some(c, 1, 1000).await;
    assert!(all.len() >= 10, "{all:?}");
    assert!(all.windows(2).all(|w| w[0] < w[1]), "in order: {all:?}");
    let last = *all.last().expect("events");
    let expected: BTreeSet<String> = all.iter().map(u64::to_string).collect();
    for size in SIZES {
        let mut seen = Vec::new();
        let mut from = 1;
        let mut ended = false;
        for _ in 0..all.len() + 2 {
            let chunk = watch_some(c, from, size as usize).await;
            let Some(&tail) = chunk.last() else {
                ended = true;
                break;
            };
            seen.extend(chunk);
            if tail == last {
                ended = true;
                break;
            }
            from = tail + 1;
        }
        assert!(ended, "size {size}: resuming did not reach revision {last}: {seen:?}");
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "size {size}: in order: {seen:?}");
        let seen: Vec<String> = seen.iter().map(u64::to_string).collect();
        assert_once(&format!("Watch chunks of {size}"), &seen, &expected);
    }
    t.node.stop().await.unwrap();
}
