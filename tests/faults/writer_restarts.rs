//! A writer that panics at every start is restarted with backoff, and the
//! node heals without a restart of its process once the cause goes away.
//!
//! Before, the supervisor restarted a failed writer at once, forever: a
//! work step that panicked at each start wrote 209,500 log lines in about
//! 15 s, spun a core, and the store's retry (due 100 ms after a start)
//! never ran. Here a store whose reads panic while a flag is set stands
//! for such a bug: every step reads, so every incarnation of the writer
//! panics at its first step (or its start).

// Test code: real time for deadlines and elapsed times; progress printed.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::print_stdout)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use crate::{a_create_succeeds, health, serve_on_store, ticking_settings};
use cascade_node::store::{Batch, Entry, MemoryStore, Store, StoreError, Table};
use tonic_health::pb::health_check_response::ServingStatus;

/// Restarts a 2 s window may hold: the backoff's waits (100 ms doubling to
/// 2 s) allow about five, whatever the machine's load; an immediate
/// restart made thousands.
const RESTARTS_IN_2_S_AT_MOST: u64 = 10;

/// Counts the supervisor's log lines (warnings and errors): what an
/// operator's log holds of the restarts, besides each panic's message.
struct SupervisorLines(Arc<AtomicU64>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SupervisorLines {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "cascade_node::writer::supervisor" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A memory store whose reads panic while `panicking` is set, as a bug in
/// a step would: no error to handle, a panic of the writer's actor.
struct PanicsOnRead {
    inner: MemoryStore,
    panicking: AtomicBool,
    /// Reads that panicked: each one failed an incarnation of the writer.
    panics: AtomicU64,
}

impl PanicsOnRead {
    fn maybe_panic(&self) {
        if self.panicking.load(Ordering::SeqCst) {
            self.panics.fetch_add(1, Ordering::SeqCst);
            panic!("a read panicked (simulated bug)");
        }
    }
}

impl Store for PanicsOnRead {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.maybe_panic();
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.maybe_panic();
        self.inner.scan(table, prefix, after, limit)
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.inner.commit(batch)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn waits_on_io(&self) -> bool {
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_panics_at_every_start_is_restarted_with_backoff_and_serves_again_once_the_cause_is_gone() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    // The process's subscriber (no other test of this binary sets one):
    // the writer logs from the runtime's threads.
    let lines = Arc::new(AtomicU64::new(0));
    tracing_subscriber::registry()
        .with(SupervisorLines(lines.clone()).with_filter(tracing_subscriber::filter::LevelFilter::WARN))
        .try_init()
        .expect("no other subscriber in this test binary");
    let store = Arc::new(PanicsOnRead {
        inner: MemoryStore::default(),
        panicking: AtomicBool::new(false),
        panics: AtomicU64::new(0),
    });
    let mut settings = ticking_settings();
    // Each tick (20 ms) queues a work step, which reads: the writer
    // panics within a tick of each start.
    settings.metrics_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let (node, client, channel) = serve_on_store(settings, store.clone()).await;
    let metrics = node.metrics_addr().expect("metrics served");
    client
        .create(spec("project/p", &[]))
        .await
        .expect("a healthy node writes");
    assert_eq!(health(&channel).await, Some(ServingStatus::Serving));

    store.panicking.store(true, Ordering::SeqCst);
    eventually(Duration::from_secs(10), "the writer's first panic", || async {
        (store.panics.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await;

    // Restarts over 2 s are spaced: a handful, not thousands. Health is
    // polled every 20 ms meanwhile: NOT_SERVING but for the instant a
    // new writer's probe commit succeeds before its first read panics.
    let before = store.panics.load(Ordering::SeqCst);
    let window = Instant::now();
    let (mut not_serving, mut probes) = (0u32, 0u32);
    let mut every = tokio::time::interval(Duration::from_millis(20));
    while window.elapsed() < Duration::from_secs(2) {
        every.tick().await;
        probes += 1;
        if health(&channel).await == Some(ServingStatus::NotServing) {
            not_serving += 1;
        }
    }
    let restarts = store.panics.load(Ordering::SeqCst) - before;
    println!("{restarts} panicked reads in 2 s; NOT_SERVING in {not_serving} of {probes} health checks");
    assert!(
        restarts <= RESTARTS_IN_2_S_AT_MOST,
        "{restarts} panicked reads in 2 s: restarts of the writer are not backed off"
    );
    assert!(
        not_serving * 10 >= probes * 9,
        "health NOT_SERVING while the writer keeps failing: {not_serving} of {probes}"
    );
    // A write while the writer keeps failing is answered UNAVAILABLE
    // promptly (within the backoff's cap and a loaded machine's delays),
    // not held.
    let asked = Instant::now();
    let refused = tokio::time::timeout(Duration::from_secs(5), client.create(spec("project/refused", &[])))
        .await
        .expect("a write is answered while the writer keeps failing");
    assert_eq!(
        refused.err().and_then(|e| e.code()),
        Some(tonic::Code::Unavailable),
        "after {:?}",
        asked.elapsed()
    );

    // The cause goes away: the next restart's writer retries the store,
    // says SERVING, and writes are served, by the same process.
    store.panicking.store(false, Ordering::SeqCst);
    let healed = Instant::now();
    a_create_succeeds(
        &client,
        Duration::from_secs(10),
        "a create succeeds once reads stop panicking",
    )
    .await;
    println!("writes served again {:?} after the cause went away", healed.elapsed());
    eventually(Duration::from_secs(5), "health SERVING again", || async {
        (health(&channel).await == Some(ServingStatus::Serving)).then_some(())
    })
    .await;
    client
        .get(&full("project/p"))
        .await
        .expect("what was written before is kept");
    // One line for the whole episode (the throttle's window is 20 s),
    // where each restart logged one before.
    let total = store.panics.load(Ordering::SeqCst);
    assert_eq!(
        lines.load(Ordering::SeqCst),
        1,
        "the supervisor's lines for {total} panics"
    );
    // Scraped once reads work again: a scrape reads the store too.
    let counted = scrape(metrics).await;
    let restarted = counted.get("cascade_writer_restarts_total").copied().unwrap_or(0.0);
    // Other tasks' reads panicked too (a scrape's, the reconciler's), so
    // the failures counted by the store are an upper bound.
    assert!(
        (2.0..=store.panics.load(Ordering::SeqCst) as f64).contains(&restarted),
        "restarts are counted: {restarted}"
    );
    node.stop().await.unwrap();
}
