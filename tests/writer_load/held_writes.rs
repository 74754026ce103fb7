//! A client's write while a long cascade runs in the same region: it waits
//! for the work step in progress and at most one more, never for a backlog
//! of them (issue 10: "other writes of the region are not held").
//!
//! The writer runs one message at a time: client writes and `Work` steps
//! share its mailbox. The periodic tick used to cast `Work` itself, next to
//! the `Work` each step casts to continue; every step replaced itself, so
//! the tick's extras were never drained and the backlog grew by one per
//! tick for the whole cascade. cascade-bench saw creates wait behind 20
//! steps four seconds into a 300k cascade, and 14 s at 1M on sled. No test
//! wrote during a cascade longer than a tick, and the benchmark's p99 was
//! filed as unexplained; this test is that write, and it counts steps
//! (events committed), not milliseconds, so it holds on any machine.

use std::time::Duration;

use crate::support::*;

/// Referrer changes per work step: a step lasts much longer than a
/// create's round trip, so two consecutive creates have at most about one
/// step between them unless the writer makes a create wait.
const BUDGET: usize = 32;
const PORTS: usize = 6_000;
/// Steps a create may see committed since the previous create: one during
/// the client's round trip, the step in progress when it arrives, the one
/// `Work` queued before it, and slack for a slow machine. The old backlog
/// was dozens of steps after a second of cascade.
const STEPS_BETWEEN_CREATES: u64 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_during_a_long_cascade_waits_for_one_work_step_not_a_backlog() {
    let node = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        // Ticks far more often than a step lasts: the old backlog grew fastest.
        s.tick = Duration::from_millis(1);
        s.policy.batch_budget = BUDGET;
    })
    .await;
    let client = &node.client;
    crate::a_network_with_ports(client, PORTS).await;

    let op = client.delete(delete_req("network/n", true)).await.unwrap();
    let id = op.operation.expect("an operation").id;

    // Consecutive creates: the revisions between two of them are the
    // events the writer committed in between. A step of BUDGET referrers
    // commits at most 2 events per referrer (its purge and, for a
    // DELETING one, its DELETING event).
    let most_between = STEPS_BETWEEN_CREATES * 2 * BUDGET as u64;
    let mut previous = client.create(spec("qos_policy/probe0", &[])).await.unwrap().revision;
    let mut during_cascade = 0;
    let mut worst = 0;
    for i in 1..1_000 {
        let created = client.create(spec(&format!("qos_policy/probe{i}"), &[])).await.unwrap();
        let between = created.revision - previous - 1;
        previous = created.revision;
        // Only a create the cascade ran all through counts.
        if client.get_operation(&id, 1).await.unwrap().done {
            break;
        }
        during_cascade += 1;
        worst = worst.max(between);
        assert!(
            worst <= most_between,
            "create {i} came {between} events after the previous one (at most {most_between} expected: \
             {STEPS_BETWEEN_CREATES} steps of {BUDGET})"
        );
    }
    assert!(
        during_cascade >= 10,
        "the cascade of {PORTS} ports in steps of {BUDGET} ended after {during_cascade} creates: too short to tell"
    );
    wait_operation(client, &id).await;
}
