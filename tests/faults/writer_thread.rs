//! The writer's own thread (`writer/handle.rs`, `WriterThread::Own`): a
//! node stopped and opened again in one process (as these tests and an
//! HA process do) answers, and leaves no writer thread behind.

use crate::support;

/// A region of its own, so no other test of this binary runs a writer
/// thread of that name: Linux shows 15 bytes of a thread's name, and
/// `writer-thread-a` is 15.
const REGION: &str = "thread-a";

/// The threads of this process named as the writer of [`REGION`] is
/// (`/proc/self/task/*/comm`: what `top -H` and `perf` show).
fn writer_threads() -> usize {
    let name = format!("writer-{REGION}");
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task is readable");
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Stopped three times and started again: each time the node serves what
/// it committed before and takes new writes, one writer thread runs while
/// it runs, and none once its stop returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_and_started_again_in_one_process_answers_and_leaves_no_writer_thread() {
    let mut cluster = support::start_cluster(&[REGION]).await;
    let first = format!("{REGION}/project/p0");
    cluster
        .client(REGION)
        .create(support::spec(&first, &[]))
        .await
        .expect("the first node takes a create");
    assert_eq!(writer_threads(), 1, "the node's writer runs on a thread of its own");
    for round in 1..=3 {
        cluster.stop(REGION).await;
        assert_eq!(
            writer_threads(),
            0,
            "round {round}: the writer's thread ended with its node's stop"
        );
        cluster.restart(REGION).await;
        let client = cluster.client(REGION);
        client
            .get(&first)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the restarted node answers a read: {e}"));
        client
            .create(support::spec(&format!("{REGION}/project/p{round}"), &[]))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the restarted node takes a create: {e}"));
        assert_eq!(
            writer_threads(),
            1,
            "round {round}: one writer thread, not one per start"
        );
    }
}

/// The writer's supervisor ended without a stop (as a panic in its own
/// handler ends it: nothing supervises it). Before, the node went on as if
/// nothing happened: health SERVING, every call waiting for a writer that
/// was gone, and a region's writer renewing its lease so no standby took
/// over. Now the node says NOT_SERVING, refuses, and its server ends with
/// an error (a process exits, for its supervisor to restart it); started
/// again on its store, it serves what it had committed.
///
/// Why our checks missed it: every test stopped the supervisor through
/// its handle, or failed the writer below it, which the supervisor
/// restarts (`writer_restarts.rs`); none ended the supervisor itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_supervisor_that_ends_unasked_stops_the_node_instead_of_serving_nothing() {
    use std::sync::Arc;
    use std::time::Duration;

    use cascade_node::store::{MemoryStore, Store};
    use cascade_node::NodeError;
    use tonic_health::pb::health_check_response::ServingStatus;

    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let (node, client, channel) = crate::serve_on_store(crate::ticking_settings(), store.clone()).await;
    client
        .create(support::spec("project/kept", &[]))
        .await
        .expect("a healthy node writes");
    assert_eq!(crate::health(&channel).await, Some(ServingStatus::Serving));

    node.end_writer_supervisor_unasked();
    // A process would exit here: its server ends by itself.
    support::eventually(Duration::from_secs(10), "the node's server ends by itself", || async {
        node.has_ended().then_some(())
    })
    .await;
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        client.create(support::spec("project/refused", &[])),
    )
    .await
    .expect("a create is answered, not held");
    assert!(refused.is_err(), "nothing writes once the writer ended: {refused:?}");
    match node.stop().await {
        Err(NodeError::WriterEnded) => {}
        other => panic!("the node's server ends saying its writer ended: {other:?}"),
    }

    let (again, client, _) = crate::serve_on_store(crate::ticking_settings(), store).await;
    client
        .get(&support::full("project/kept"))
        .await
        .expect("started again on its store, the node serves what it committed");
    client
        .create(support::spec("project/after", &[]))
        .await
        .expect("and writes again");
    again.stop().await.expect("a node stopped when asked stops cleanly");
}
