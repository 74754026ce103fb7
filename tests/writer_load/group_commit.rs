//! Group commit (issue 28): client writes that queue while the writer is
//! busy run one after the other and share one flush, and each is answered
//! only after it (`writer/group.rs`). Counted, not timed: the node's
//! `WriteStats` counts the batches committed and the flushes that made
//! them durable. Before group commit every batch had its own flush.

use std::sync::Arc;

use crate::support::*;
use cascade_core::{RegionId, Schema};
use cascade_node::{Node, NodeSettings};
use futures::future::join_all;
use tokio::net::TcpListener;

/// Creates sent at once. The writer runs the first alone while the others
/// queue behind it, so the next flush covers many.
const CREATES: usize = 200;
/// Of them, every tenth names a resource an earlier one of the burst
/// already created: refused (ALREADY_EXISTS), and nothing else of its
/// group is.
const DUPLICATE_EVERY: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_share_flushes_and_a_refusal_fails_only_itself() {
    let dir = tempfile::tempdir().expect("temp dir");
    let schema = Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).expect("schema");
    let settings = NodeSettings::new(
        RegionId::parse(REGION).unwrap(),
        Arc::new(schema),
        Some(dir.path().to_owned()),
    );
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
