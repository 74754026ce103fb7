//! Group commit (issue 28): client writes that queue while the writer is
//! busy run one after the other and share one flush, and each is answered
//! only after it (`writer/group.rs`); a client write that arrives while a
//! work step runs shares the step's flush. Counted, not timed: the node's
//! `WriteStats` counts the batches committed and the flushes that made
//! them durable. Before group commit every batch had its own flush.

use std::sync::Arc;

use crate::support::*;
use cascade_core::{RegionId, Schema};
use cascade_node::{Node, NodeSettings, WriteStats};
use futures::future::join_all;
use tokio::net::TcpListener;

/// Creates sent at once. The writer runs the first alone while the others
/// queue behind it, so the next flush covers many.
const CREATES: usize = 200;
/// Of them, every tenth names a resource an earlier one of the burst
/// already created: refused (ALREADY_EXISTS), and nothing else of its
/// group is.
const DUPLICATE_EVERY: usize = 10;

/// The node's tick here: many ticks fall within the burst, so a write the
/// node made of its own accord at every tick would be counted every run,
/// not only when a loaded machine slowed the burst past a tick. (One made
/// at the first tick only, the audit log's count, failed CI that way; it
/// is gone, and `codec::tests::a_fresh_stores_first_audited_write_…` pins
/// that: a tick this short comes before the warm-up create, and would
/// not see it.)
const TICK_DURING_THE_BURST: std::time::Duration = std::time::Duration::from_millis(5);

/// A node on disk serving on a free port, with its writer's counters;
/// dropping `stop` stops it.
struct Counted {
    client: cascade_client::Client,
    stats: Arc<WriteStats>,
    stop: tokio::sync::oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<Result<(), cascade_node::NodeError>>,
    _dir: tempfile::TempDir,
}

async fn counted_node(tweak: impl FnOnce(&mut NodeSettings)) -> Counted {
    let dir = tempfile::tempdir().expect("temp dir");
    let schema = Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).expect("schema");
    let mut settings = NodeSettings::new(
        RegionId::parse(REGION).unwrap(),
        Arc::new(schema),
        Some(dir.path().to_owned()),
    );
    tweak(&mut settings);
    let node = Node::open(settings).await.expect("node opens");
    let stats = node.write_stats();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(node.serve(listener, async {
        let _ = stopped.await;
    }));
    let client = cascade_client::Client::connect(&endpoint)
        .await
        .expect("client connects");
    Counted {
        client,
        stats,
        stop,
        serving,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_share_flushes_and_a_refusal_fails_only_itself() {
    let Counted {
        client,
        stats,
        stop,
        serving,
        _dir,
    } = counted_node(|s| s.tick = TICK_DURING_THE_BURST).await;
    // The node's own start-up writes are done before counting.
    client.create(spec("qos_policy/warm-up", &[])).await.unwrap();

    let batches_before = stats.snapshot().batches;
    let flushes_before = stats.flushes();
    let name = |i: usize| {
        if i % DUPLICATE_EVERY == DUPLICATE_EVERY - 1 {
            format!("qos_policy/q{}", i - 1)
        } else {
            format!("qos_policy/q{i}")
        }
    };
    let answers = join_all((0..CREATES).map(|i| {
        let client = &client;
        async move { (i, client.create(spec(&name(i), &[])).await) }
    }))
    .await;
    let batches = stats.snapshot().batches - batches_before;
    let flushes = stats.flushes() - flushes_before;

    let mut created = 0;
    let mut refused = 0;
    for (i, answer) in answers {
        match answer {
            Ok(r) => {
                created += 1;
                assert_eq!(r.name, full(&name(i)));
            }
            Err(e) => {
                refused += 1;
                assert_eq!(e.code(), Some(tonic::Code::AlreadyExists), "create {i}: {e}");
            }
        }
    }
    // Each name once: the duplicate of a name, or the name itself (the two
    // race), is refused, never both and never another create of the group.
    let duplicates = CREATES / DUPLICATE_EVERY;
    assert_eq!((created, refused), (CREATES - duplicates, duplicates));
    for i in 0..CREATES {
        client
            .get(&full(&name(i)))
            .await
            .expect("every answered create is readable");
    }
    println!("{CREATES} creates: {batches} batches, {flushes} flushes");
    assert_eq!(batches as usize, created, "one batch per create that succeeded");
    assert!(
        (flushes as usize) < created / 2,
        "{created} creates sent at once were made durable by {flushes} flushes: \
         queued creates should share them"
    );
    let _ = stop.send(());
    let _ = serving.await;
}

/// Referrer changes per work step, and ports: a cascade of a hundred or so
/// steps, each much longer than a create's round trip.
const STEP_BUDGET: usize = 32;
const PORTS: usize = 4_000;

/// A create sent while a work step runs joins the step's group: one flush
/// makes both durable, and the create waits for the rest of the step and
/// that flush instead of the step's flush and then its own. Before, every
/// work step and every create sent one at a time had a flush of its own
/// (flushes equal to batches).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_during_a_cascade_shares_the_work_steps_flush() {
    let Counted {
        client,
        stats,
        stop,
        serving,
        _dir,
    } = counted_node(|s| s.policy.batch_budget = STEP_BUDGET).await;
    crate::a_network_with_ports(&client, PORTS).await;
    let op = client.delete(delete_req("network/n", true)).await.unwrap();
    let id = op.operation.expect("an operation").id;

    // Creates one after another, as a user's: only those the cascade ran
    // all through count, with the batches and flushes up to the last.
    let (batches_before, flushes_before) = (stats.snapshot().batches, stats.flushes());
    let (mut counted, mut batches, mut flushes) = (0u64, 0, 0);
    for i in 0..2_000 {
        let name = format!("qos_policy/during{i}");
        client.create(spec(&name, &[])).await.unwrap();
        client.get(&full(&name)).await.expect("an answered create is readable");
        if client.get_operation(&id, 1).await.unwrap().done {
            break;
        }
        counted += 1;
        batches = stats.snapshot().batches - batches_before;
        flushes = stats.flushes() - flushes_before;
    }
    println!("{counted} creates during the cascade: {batches} batches, {flushes} flushes");
    assert!(
        counted >= 20,
        "the cascade of {PORTS} ports in steps of {STEP_BUDGET} ended after {counted} creates: too short to tell"
    );
    assert!(
        batches - flushes >= counted / 2,
        "{counted} creates during the cascade and its work steps committed {batches} batches in {flushes} flushes: \
         at least half of the creates should have shared a work step's flush"
    );
    wait_operation(&client, &id).await;
    let _ = stop.send(());
    let _ = serving.await;
}
