//! Failure stays local: a cascade waits only for the regions it touches.
//!
//! Real `cascade serve` processes; a region is stopped with SIGSTOP (it
//! keeps its sockets, the kernel still accepts connections to it, and it
//! answers nothing), the hardest kind of unreachable to notice. Before the
//! closure check asked only the regions a cascade reached
//! (`cascade_core::closure`), the root of every cross-region cascade in
//! the cluster stayed DELETING until the stopped region came back.

// Test code: real time for poll deadlines and the timings printed.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod support;

use std::time::{Duration, Instant};

use cascade_client::Client;
use support::{delete_req, eventually, spec, ProcCluster};

/// Fast ticks, so a cascade takes well under a second when nothing is wrong.
fn fast(_region: &str) -> String {
    "tick_ms = 50".to_owned()
}

async fn wait_gone_within(client: &Client, name: &str, limit: Duration) {
    eventually(limit, &format!("{name} to be purged"), || async {
        match client.get(name).await {
            Err(e) if e.code() == Some(tonic::Code::NotFound) => Some(()),
            _ => None,
        }
    })
    .await
}

/// Creates `owner_region/project/{id}` and, in `importer_region`, a
/// network whose project reference cascades from it; deletes the project
/// with cascade and waits until both are purged. Returns how long the delete
/// took to finish.
async fn cascade_across(cluster: &ProcCluster, owner_region: &str, importer_region: &str, id: &str) -> Duration {
    let owner = cluster.client(owner_region).await;
    let importer = cluster.client(importer_region).await;
    let project = format!("{owner_region}/project/{id}");
    let network = format!("{importer_region}/network/{id}");
    owner
        .create(spec(&project, &[]))
        .await
        .unwrap_or_else(|e| panic!("create {project}: {e}"));
    importer
        .create(spec(&network, &[("project", &[&project])]))
        .await
        .unwrap_or_else(|e| panic!("create {network}: {e}"));
    let started = Instant::now();
    let operation = owner
        .delete(delete_req(&project, true))
        .await
        .unwrap_or_else(|e| panic!("delete {project}: {e}"))
        .operation
        .expect("an accepted delete has an operation");
    // The root goes last: when it is gone, the whole closure is.
    wait_gone_within(&owner, &project, Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert!(
        matches!(importer.get(&network).await, Err(e) if e.code() == Some(tonic::Code::NotFound)),
        "{network} was not cascaded before its project went"
    );
    // The operation, asked of any node, is done too: a stopped region the
    // cascade never touched is named, and does not hold it open.
    let asked = Instant::now();
    let op = importer
        .get_operation(&operation.id, 100)
        .await
        .unwrap_or_else(|e| panic!("GetOperation {}: {e}", operation.id));
    assert!(op.done, "{op:?}");
    assert_eq!(op.progress.as_ref().map(|p| p.deleted), Some(2), "{op:?}");
    println!(
        "GetOperation through {importer_region}: done, unreachable {:?}, answered in {:?}",
        op.unreachable_regions,
        asked.elapsed()
    );
    // A client with a deadline of its own shorter than the node's read
    // timeout still gets the operation, not DEADLINE_EXCEEDED: the node
    // reads the other regions within what the caller left it.
    // (Polled: on a loaded machine one answer may miss a live region too;
    // a node that ignored the deadline would wait 2 s for the stopped one
    // every time and never answer within 1.5 s.)
    let asked = Instant::now();
    eventually(
        Duration::from_secs(15),
        "GetOperation within a 1500 ms deadline",
        || async {
            let mut request = tonic::Request::new(cascade_proto::v1::GetOperationRequest {
                id: operation.id.clone(),
                outcomes_page_size: 100,
                outcomes_page_token: String::new(),
            });
            request.set_timeout(Duration::from_millis(1500));
            let op = importer.raw().get_operation(request).await.ok()?.into_inner();
            op.done.then_some(())
        },
    )
    .await;
    println!("... and with a 1500 ms client deadline in {:?}", asked.elapsed());
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_between_two_regions_finishes_while_a_third_region_it_never_touched_is_stopped() {
    let cluster = ProcCluster::new(&["ap-south", "eu-west", "us-east"], fast);
    let all_up = cascade_across(&cluster, "eu-west", "us-east", "before").await;

    cluster.freeze("ap-south");
    // Twice: the second starts while links to the stopped region have
    // already timed out once, the first while they have not yet noticed.
    let one_stopped = cascade_across(&cluster, "eu-west", "us-east", "during").await;
    let again = cascade_across(&cluster, "us-east", "eu-west", "again").await;
    println!(
        "cascade eu-west -> us-east: {all_up:?} with all three up, {one_stopped:?} and {again:?} with ap-south stopped"
    );
    // The stopped region was never needed: both finished while it still
    // was (a check that asks it waits for a peer call that never answers,
    // and never finishes). No timing is asserted; the figures are printed.
    cluster.thaw("ap-south");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_twenty_regions_and_one_stopped_cascades_between_the_others_finish() {
    let names: Vec<String> = (0..20).map(|i| format!("r{i:02}")).collect();
    let regions: Vec<&str> = names.iter().map(String::as_str).collect();
    let cluster = ProcCluster::new(&regions, fast);
    let stopped = "r07";
    cluster.freeze(stopped);
    let others: Vec<&str> = regions.iter().copied().filter(|r| *r != stopped).collect();
    // A ring over the other 19: each region's project has a network in the next.
    let started = Instant::now();
    let cascades = others.iter().enumerate().map(|(i, owner)| {
        let importer = others[(i + 1) % others.len()];
        let cluster = &cluster;
        async move { cascade_across(cluster, owner, importer, "ring").await }
    });
    let took = futures::future::join_all(cascades).await;
    let slowest = took.iter().max().copied().unwrap_or_default();
    println!(
        "19 cross-region cascades with {stopped} of 20 regions stopped: all finished in {:?} (slowest {slowest:?})",
        started.elapsed()
    );
    cluster.thaw(stopped);
}
