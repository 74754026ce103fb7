//! A failed flush that takes back commits which skipped their own flush,
//! in a process that lives on: the peer links follow again from the
//! stored cursor, so no event is skipped.
//!
//! An importer applies a PURGED whose only effect is to drop its tombstone
//! (and move its cursor): a commit that claims nothing, so it skips its
//! flush (`writer/durable.rs`). PostgreSQL keeps such a commit staged, and
//! a failed transaction drops it; a disk engine reopened after a failed
//! flush keeps only what reached its files. A crash that loses it is safe:
//! the restarted link follows from the stored cursor, and the owner sends
//! the PURGED again. But the process need not crash: before, the link
//! went on past the events taken back, the next event moved the cursor
//! over them, and the tombstone stayed for good (a region that never
//! quiesced, `remote_deletions=1`: the CI failure of
//! `high_availability::the_owners_writer_killed_mid_cascade_…`, whose
//! quiescence wait now names each tombstone kept and its owner's state).
//!
//! Why our checks missed it: the crash tests lose unflushed commits only
//! with the process, whose links start again from the stored cursor; and
//! an importer accepts any revision above its cursor, so a gap passes
//! unseen. Here a memory store takes back what it committed since its
//! last flush when that flush fails, as PostgreSQL does.

// Test code: real time for deadlines; progress printed.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use cascade_node::store::{Batch, Entry, MemoryStore, Store, StoreError, Table};
use cascade_proto::v1;

/// A memory store that, once armed, fails the first flush covering a
/// tombstone's removal and takes back everything committed since the last
/// successful flush (as PostgreSQL drops a failed transaction's staged
/// writes).
#[derive(Default)]
struct TakesBackOnFailedFlush {
    inner: MemoryStore,
    /// Each key written since the last flush, with its value before.
    undo: Mutex<Batch>,
    /// A commit since the last flush removed a tombstone.
    tombstone_removed: AtomicBool,
    armed: AtomicBool,
    taken_back: AtomicU64,
    /// Its flushes fly (`Store::start_flush`), as PostgreSQL's do: the
    /// flush is decided when the writer finishes it.
    overlaps: bool,
    flying: AtomicBool,
    /// Commits made while a flight was in progress: never.
    commits_on_a_flight: AtomicU64,
}

impl Store for TakesBackOnFailedFlush {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.inner.scan(table, prefix, after, limit)
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if self.flying.load(Ordering::SeqCst) {
            self.commits_on_a_flight.fetch_add(1, Ordering::SeqCst);
        }
        let mut undo = self.undo.lock().unwrap();
        for (table, key, value) in &batch.ops {
            undo.ops.push((*table, key.clone(), self.inner.get(*table, key)?));
            if *table == Table::RemoteDeletions && value.is_none() {
                self.tombstone_removed.store(true, Ordering::SeqCst);
            }
        }
        self.inner.commit(batch)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.flying.store(false, Ordering::SeqCst);
        let mut undo = self.undo.lock().unwrap();
        if self.tombstone_removed.swap(false, Ordering::SeqCst) && self.armed.swap(false, Ordering::SeqCst) {
            let restore = Batch {
                ops: undo.ops.drain(..).rev().collect(),
            };
            self.inner.commit(restore)?;
            self.taken_back.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Engine(
                "the transaction failed; what it staged is dropped (simulated)".into(),
            ));
        }
        undo.ops.clear();
        self.inner.flush()
    }
    fn start_flush(&self) -> Result<(), StoreError> {
        if !self.overlaps {
            return self.flush();
        }
        if self.flying.swap(true, Ordering::SeqCst) {
            self.flush()?;
            self.flying.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
    fn finish_flush(&self) -> Result<(), StoreError> {
        if self.flying.swap(false, Ordering::SeqCst) {
            return self.flush();
        }
        Ok(())
    }
    fn overlaps_flushes(&self) -> bool {
        self.overlaps
    }
    fn waits_on_io(&self) -> bool {
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_tombstone_taken_back_by_a_failed_flush_is_dropped_again_when_the_link_follows_from_the_stored_cursor()
{
    a_purged_tombstone_taken_back_is_dropped_again(Arc::new(TakesBackOnFailedFlush::default())).await;
}

/// The same with the importer's flushes in flight while its writer goes
/// on (PostgreSQL's, `Store::start_flush`): the flight that fails takes
/// back the PURGED's commit, and the link must still follow again from
/// the stored cursor (bug 6 of the first overlapped build's review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_tombstone_taken_back_by_a_failed_flight_is_dropped_again_when_the_link_follows_from_the_stored_cursor(
) {
    let importer = Arc::new(TakesBackOnFailedFlush {
        overlaps: true,
        ..TakesBackOnFailedFlush::default()
    });
    a_purged_tombstone_taken_back_is_dropped_again(importer.clone()).await;
    assert_eq!(importer.commits_on_a_flight.load(Ordering::SeqCst), 0);
}

async fn a_purged_tombstone_taken_back_is_dropped_again(importer: Arc<TakesBackOnFailedFlush>) {
    let c = start_cluster_on_stores(
        &["ra", "rb"],
        |s| s.tick = Duration::from_millis(50),
        |region| (region == "rb").then(|| importer.clone() as Arc<dyn Store>),
    )
    .await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/n", &[("project", &["ra/project/p"])]),
        spec_in("ra/network/m", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    b.batch_create(vec![
        spec_in("rb/port/x", &[("network", &["ra/network/n"])]),
        spec_in("rb/port/y", &[("network", &["ra/network/m"])]),
    ])
    .await
    .unwrap();

    // rb applies n's DELETING (its tombstone), deletes its port, releases;
    // ra purges n; rb applies the PURGED without a flush of its own, and
    // the flush that should make it durable fails and takes it back.
    importer.armed.store(true, Ordering::SeqCst);
    let done = delete_and_wait(a, "ra/network/n", true).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    eventually(Duration::from_secs(30), "rb's flush after the PURGED fails", || async {
        (importer.taken_back.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    let mut n = 0;
    eventually(Duration::from_secs(30), "rb heals: a create succeeds", || {
        n += 1;
        let name = format!("rb/project/after{n}");
        async move { b.create(spec_in(&name, &[])).await.ok() }
    })
    .await;

    // An event after the PURGED: the link must not apply it over the gap.
    let done = delete_and_wait(a, "ra/network/m", true).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    wait_quiescent(&c).await;
    let rb = dump(&c.node("rb").node.endpoint()).await.unwrap();
    assert!(rb.remote_deletions.is_empty(), "{:?}", rb.remote_deletions);
    assert_no_violations(&c).await;
}
