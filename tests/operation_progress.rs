//! An operation's progress per region (`Operation.region_progress`) and
//! the operations a caller may read (`Resources.ListOperations`), over
//! real nodes in three regions: each region's counts, read by whichever
//! node answers, add up to the totals; a stopped region is named as
//! unreachable, not shown as zeros; a listing of every region pages to
//! its end and filters by state.

use std::collections::BTreeMap;
use std::time::Duration;

use cascade_proto::v1;

mod support;
use support::{delete_and_wait, eventually, spec_in, start_cluster};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// A network in eu-west with `ports` ports in each region pointing at it.
async fn network_with_ports(cluster: &support::Cluster, network: &str, ports: usize) {
    let project = "eu-west/project/p";
    let client = cluster.client("eu-west");
    client.create(spec_in(project, &[])).await.expect("the project");
    client
        .create(spec_in(network, &[("project", &[project])]))
        .await
        .expect("the network");
    for region in REGIONS {
        let id = network.rsplit('/').next().unwrap_or_default();
        let specs = (0..ports)
            .map(|i| spec_in(&format!("{region}/port/{id}-p{i}"), &[("network", &[network])]))
            .collect();
        cluster.client(region).batch_create(specs).await.expect("ports");
    }
}

fn counts(p: Option<v1::Progress>) -> [u64; 5] {
    let p = p.unwrap_or_default();
    [p.deleted, p.unset, p.pending, p.blocked, p.failed]
}

fn sum(op: &v1::Operation) -> [u64; 5] {
    op.region_progress.iter().fold([0; 5], |mut acc, r| {
        for (a, c) in acc.iter_mut().zip(counts(r.progress)) {
            *a += c;
        }
        acc
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_regions_counts_add_up_to_the_totals_and_a_stopped_region_is_named_unreachable() {
    let mut cluster = start_cluster(&REGIONS).await;
    network_with_ports(&cluster, "eu-west/network/n", 5).await;
    let done = delete_and_wait(cluster.client("eu-west"), "eu-west/network/n", true).await;
    assert_eq!(done.state(), v1::OperationState::Succeeded, "{done:?}");

    // Through every node: the same per-region counts, each region's own.
    for asked in REGIONS {
        let op = cluster
            .client(asked)
            .get_operation(&done.id, 0)
            .await
            .expect("the operation");
        let per_region: BTreeMap<&str, ([u64; 5], bool)> = op
            .region_progress
            .iter()
            .map(|r| (r.region.as_str(), (counts(r.progress), r.reachable)))
            .collect();
        assert_eq!(
            per_region,
            BTreeMap::from([
                ("ap-south", ([5, 0, 0, 0, 0], true)),
                // The network and its five ports.
                ("eu-west", ([6, 0, 0, 0, 0], true)),
                ("us-east", ([5, 0, 0, 0, 0], true)),
            ]),
            "asked through {asked}"
        );
        assert_eq!(sum(&op), counts(op.progress), "asked through {asked}");
    }

    // A region whose part cannot be read is listed as such: not zeros
    // that would read as "nothing happened there".
    cluster.stop("ap-south").await;
    let op = eventually(Duration::from_secs(30), "ap-south named unreachable", || async {
        let op = cluster.client("us-east").get_operation(&done.id, 0).await.ok()?;
        op.unreachable_regions.contains(&"ap-south".to_owned()).then_some(op)
    })
    .await;
    let ap = op
        .region_progress
        .iter()
        .find(|r| r.region == "ap-south")
        .unwrap_or_else(|| panic!("ap-south among the regions: {op:?}"));
    assert!(!ap.reachable, "{ap:?}");
    assert_eq!(ap.state(), v1::OperationState::Unspecified, "its state is unknown");
    let reachable: Vec<&str> = op
        .region_progress
        .iter()
        .filter(|r| r.reachable)
        .map(|r| r.region.as_str())
        .collect();
    assert_eq!(reachable, ["eu-west", "us-east"]);
    assert_eq!(sum(&op), counts(op.progress), "the totals are of what could be read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_operations_pages_every_regions_operations_to_the_end_and_filters_by_state() {
    let cluster = start_cluster(&REGIONS).await;
    let mut ids = Vec::new();
    // Two operations rooted in eu-west, one in us-east.
    for network in ["eu-west/network/a", "eu-west/network/b", "us-east/network/c"] {
        let region = network.split('/').next().unwrap_or_default();
        let project = format!(
            "{region}/project/for-{}",
            network.rsplit('/').next().unwrap_or_default()
        );
        let client = cluster.client(region);
        client.create(spec_in(&project, &[])).await.expect("a project");
        client
            .create(spec_in(network, &[("project", &[project.as_str()])]))
            .await
            .expect("a network");
        ids.push(delete_and_wait(cluster.client(region), network, true).await.id);
    }
    // A page of one per region, through ap-south's node (which owns none).
    let client = cluster.client("ap-south");
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = client
            .list_operations(v1::ListOperationsRequest {
                page_size: 1,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .expect("a page");
        assert!(page.unreachable.is_empty(), "{page:?}");
        for op in &page.operations {
            assert_eq!(op.state(), v1::OperationState::Succeeded);
            assert_eq!(sum(op), counts(op.progress), "{op:?}");
            seen.push(op.id.clone());
        }
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    seen.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(seen, expected, "every operation once");

    // A token is for the filters it was issued with.
    let first = client
        .list_operations(v1::ListOperationsRequest {
            page_size: 1,
            ..Default::default()
        })
        .await
        .expect("a first page");
    assert!(!first.next_page_token.is_empty(), "{first:?}");
    let refused = client
        .list_operations(v1::ListOperationsRequest {
            page_size: 1,
            page_token: first.next_page_token,
            state: v1::OperationState::Failed as i32,
            ..Default::default()
        })
        .await
        .expect_err("a token of other filters is refused");
    assert!(refused.to_string().contains("page_token"), "{refused}");

    let running = client
        .list_operations(v1::ListOperationsRequest {
            state: v1::OperationState::Running as i32,
            ..Default::default()
        })
        .await
        .expect("the running ones");
    assert!(running.operations.is_empty(), "none is running: {running:?}");

    // One region's, forwarded to its node.
    let us = client
        .list_operations(v1::ListOperationsRequest {
            region: "us-east".into(),
            ..Default::default()
        })
        .await
        .expect("us-east's");
    let us: Vec<&str> = us.operations.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(us, [ids[2].as_str()]);
}
