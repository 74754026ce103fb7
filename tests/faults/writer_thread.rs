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
