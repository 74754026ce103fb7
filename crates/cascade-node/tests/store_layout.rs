//! The store's indexes: the retry queue in due order and the `block`
//! back-references. They are kept in the same batch as the rows they index,
//! and a store written before they existed (layout 1) gets them on open.
//!
//! Why this test exists: both indexes are read instead of their tables (a
//! work step reads only what is due, a delete only the blocking rows), so an
//! index that drifts from its table silently loses deletion work or lets a
//! delete through a blocker. The protocol tests run on the core's in-memory
//! state, which has no indexes, so they cannot see such a drift.

// Test code: JSON rows as an older node wrote them.
#![allow(clippy::disallowed_methods)]

use cascade_core::auth::Principal;
use cascade_core::model::{BackRef, DueOperation, DueWork, RefTarget, RemoteDeletion, Timestamp, WorkItem};
use cascade_core::schema::OnDelete;
use cascade_core::state::{StateRead, WriteSet};
use cascade_core::{OperationId, ResourceName, Uid};
use cascade_node::codec::{backref_key, encode_writes, StoreState};
use cascade_node::store::{Batch, MemoryStore, Store, Table};

fn target(name: &str, n: u128) -> RefTarget {
    RefTarget {
        name: ResourceName::parse(name).expect("name"),
        uid: Uid(uuid::Uuid::from_u128(n)),
    }
}

fn work(t: &RefTarget, due: u64) -> WorkItem {
    WorkItem::due_now(t.clone(), Timestamp(due))
}

/// A due entry as the index lists it.
fn due(t: &RefTarget, operation: DueOperation) -> DueWork {
    DueWork { uid: t.uid, operation }
}

/// An entry under no operation (none of these tests writes a deletion record).
fn due_alone(t: &RefTarget) -> DueWork {
    due(t, DueOperation::Recorded(None))
}

fn row(to: &RefTarget, from: &RefTarget, field: &str, on_delete: OnDelete) -> BackRef {
    BackRef {
        target: to.clone(),
        referrer: from.clone(),
        field: field.into(),
        on_delete,
        generation: 0,
        attached_at: Timestamp(0),
    }
}

fn commit(store: &dyn Store, writes: &WriteSet) {
    let batch = encode_writes(&StoreState { store }, writes).expect("encode");
    store.commit(batch).expect("commit");
}

fn count(store: &dyn Store, table: Table) -> usize {
    store.scan(table, &[], None, usize::MAX).expect("scan").len()
}

#[test]
fn a_store_of_layout_1_gets_its_indexes_on_upgrade() {
    let store = MemoryStore::default();
    let net = target("r/network/n", 1);
    let port = target("r/port/p", 2);
    let lock = target("r/lock/l", 3);
    let deleting = target("r/network/gone", 4);
    // What a node of the previous layout left: rows, no indexes, no version.
    let mut old = Batch::default();
    old.put(
        Table::RetryQueue,
        deleting.uid.as_bytes().to_vec(),
        json(&work(&deleting, 5)),
    );
    let cascade_row = row(&net, &port, "network", OnDelete::Cascade);
    let block_row = row(&net, &lock, "network", OnDelete::Block);
    old.put(Table::Backrefs, backref_key(&cascade_row.key()), json(&cascade_row));
    old.put(Table::Backrefs, backref_key(&block_row.key()), json(&block_row));
    store.commit(old).expect("commit");

    let state = StoreState { store: &store };
    state.upgrade().expect("upgrade");
    assert_eq!(state.due_work(Timestamp(4), 10).expect("due"), vec![], "not due yet");
    // An older node's index entry says nothing of the operation: the
    // work step reads the records for it.
    assert_eq!(
        state.due_work(Timestamp(5), 10).expect("due"),
        vec![due(&deleting, DueOperation::Unrecorded)]
    );
    assert_eq!(state.blocking_backrefs(net.uid, 10).expect("blocking"), vec![block_row]);
    // Once upgraded, opening again changes nothing.
    let writes_before = count(&store, Table::Meta);
    state.upgrade().expect("second upgrade");
    assert_eq!(count(&store, Table::Meta), writes_before);
    assert_eq!(count(&store, Table::DueIndex), 1);
}

#[test]
fn a_store_of_a_newer_layout_is_refused() {
    let store = MemoryStore::default();
    let mut batch = Batch::default();
    batch.put(Table::Meta, b"layout_version".to_vec(), 99u64.to_be_bytes().to_vec());
    store.commit(batch).expect("commit");
    let err = StoreState { store: &store }.upgrade().expect_err("a newer layout");
    assert!(err.to_string().contains("layout 99, written by a newer node"), "{err}");
}

#[test]
fn the_indexes_follow_every_write_of_their_tables() {
    let store = MemoryStore::default();
    let state = StoreState { store: &store };
    state.upgrade().expect("a fresh store");
    let a = target("r/network/a", 1);
    let b = target("r/network/b", 2);

    // Scheduled, rescheduled later, rescheduled earlier, removed.
    let mut w = WriteSet::default();
    w.work.insert(a.uid, Some(work(&a, 10)));
    w.work.insert(b.uid, Some(work(&b, 20)));
    commit(&store, &w);
    assert_eq!(state.due_work(Timestamp(15), 10).expect("due"), vec![due_alone(&a)]);
    let mut w = WriteSet::default();
    w.work.insert(a.uid, Some(work(&a, 30)));
    commit(&store, &w);
    assert_eq!(state.due_work(Timestamp(25), 10).expect("due"), vec![due_alone(&b)]);
    assert_eq!(count(&store, Table::DueIndex), 2, "the old due time of a is gone");
    let mut w = WriteSet::default();
    w.work.insert(b.uid, None);
    commit(&store, &w);
    assert_eq!(state.due_work(Timestamp(100), 10).expect("due"), vec![due_alone(&a)]);
    assert_eq!(count(&store, Table::DueIndex), 1);
    // `limit` is honoured in due order.
    let mut w = WriteSet::default();
    w.work.insert(b.uid, Some(work(&b, 1)));
    commit(&store, &w);
    assert_eq!(state.due_work(Timestamp(100), 1).expect("due"), vec![due_alone(&b)]);

    // Only `block` rows are indexed, and they leave with their row.
    let port = target("r/port/p", 3);
    let lock = target("r/lock/l", 4);
    let cascade_row = row(&a, &port, "network", OnDelete::Cascade);
    let block_row = row(&a, &lock, "network", OnDelete::Block);
    let mut w = WriteSet::default();
    w.backrefs.insert(cascade_row.key(), Some(cascade_row.clone()));
    w.backrefs.insert(block_row.key(), Some(block_row.clone()));
    commit(&store, &w);
    assert_eq!(
        state.blocking_backrefs(a.uid, 10).expect("blocking"),
        vec![block_row.clone()]
    );
    assert_eq!(state.blocking_backrefs(b.uid, 10).expect("blocking"), vec![]);
    let mut w = WriteSet::default();
    w.backrefs.insert(block_row.key(), None);
    commit(&store, &w);
    assert_eq!(state.blocking_backrefs(a.uid, 10).expect("blocking"), vec![]);
    assert_eq!(count(&store, Table::BlockingBackrefs), 0);
    assert_eq!(state.backrefs(a.uid, None, 10).expect("rows"), vec![cascade_row]);
}

/// A record as the previous layout stored it.
fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("plain records serialize")
}

/// A work step looks at many more due entries than it takes, to share
/// itself between operations; each entry's operation comes from the
/// index's scan, written when the entry is queued or moved: from the same
/// step's writes, or from the store when the record was written before.
#[test]
fn the_due_index_records_whose_operation_each_entry_works_for() {
    let store = MemoryStore::default();
    let state = StoreState { store: &store };
    state.upgrade().expect("a fresh store");
    let op = OperationId(uuid::Uuid::from_u128(77));
    let tombstone = |t: &RefTarget| RemoteDeletion {
        target: t.clone(),
        operation: op,
        seen_at: Timestamp(1),
        purged: false,
        no_cascade: false,
        forced: false,
        principal: Principal::anonymous(),
        retain_ms: 0,
    };
    let queued_with = target("r2/network/with", 1);
    let queued_after = target("r2/network/after", 2);

    // The tombstone and the entry in one step.
    let mut w = WriteSet::default();
    w.remote_deletions
        .insert(queued_with.uid, Some(tombstone(&queued_with)));
    w.work.insert(queued_with.uid, Some(work(&queued_with, 10)));
    // The tombstone first; its entry in a later step, read from the store.
    w.remote_deletions
        .insert(queued_after.uid, Some(tombstone(&queued_after)));
    commit(&store, &w);
    let mut w = WriteSet::default();
    w.work.insert(queued_after.uid, Some(work(&queued_after, 11)));
    commit(&store, &w);
    assert_eq!(
        state.due_work(Timestamp(20), 10).expect("due"),
        vec![
            due(&queued_with, DueOperation::Recorded(Some(op))),
            due(&queued_after, DueOperation::Recorded(Some(op))),
        ]
    );

    // A soft-deleted member's expiry, queued by the step that removes its
    // deletion record: under no operation.
    let expiring = target("r/network/expiring", 3);
    let mut w = WriteSet::default();
    w.deletions.insert(expiring.uid, None);
    w.work.insert(expiring.uid, Some(work(&expiring, 12)));
    commit(&store, &w);
    assert_eq!(
        state.due_work(Timestamp(12), 10).expect("due")[2],
        due(&expiring, DueOperation::Recorded(None))
    );

    // A value it cannot read says nothing, as an older node's.
    let mut garbled = Batch::default();
    let mut key = 10u64.to_be_bytes().to_vec();
    key.extend_from_slice(queued_with.uid.as_bytes());
    garbled.put(Table::DueIndex, key, vec![1, 2, 3]);
    store.commit(garbled).expect("commit");
    assert_eq!(
        state.due_work(Timestamp(10), 10).expect("due"),
        vec![due(&queued_with, DueOperation::Unrecorded)]
    );
}

/// A store that counts its point reads.
struct CountingReads {
    inner: MemoryStore,
    gets: std::sync::atomic::AtomicUsize,
}

impl Store for CountingReads {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, cascade_node::store::StoreError> {
        self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.get(table, key)
    }
    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<cascade_node::store::Entry>, cascade_node::store::StoreError> {
        self.inner.scan(table, prefix, after, limit)
    }
    fn commit(&self, batch: Batch) -> Result<(), cascade_node::store::StoreError> {
        self.inner.commit(batch)
    }
    fn flush(&self) -> Result<(), cascade_node::store::StoreError> {
        self.inner.flush()
    }
}

/// The window a work step looks at is one scan of the index, whatever its
/// size. Each of its entries cost two point reads (its queue entry and its
/// deletion record) before the index said whose it is: on a tree cascade
/// of 1M, whose steps take a few items of a window of up to 1,024, that
/// was about a tenth of the cascade's CPU (docs/BENCHMARKS.md, "A work
/// step's window from the due index alone"). Why our checks missed it:
/// they counted what a step writes and the tombstones its scans pass,
/// never the reads of entries it does not take.
#[test]
fn a_work_steps_window_of_due_entries_costs_no_point_read() {
    let store = CountingReads {
        inner: MemoryStore::default(),
        gets: Default::default(),
    };
    let state = StoreState { store: &store };
    state.upgrade().expect("a fresh store");
    let mut w = WriteSet::default();
    for n in 0..1_000u64 {
        let t = target(&format!("r/network/n{n}"), u128::from(n) + 1);
        w.work.insert(t.uid, Some(work(&t, n)));
    }
    commit(&store, &w);
    let before = store.gets.load(std::sync::atomic::Ordering::Relaxed);
    let window = state.due_work(Timestamp(10_000), 1_024).expect("due");
    assert_eq!(window.len(), 1_000);
    assert_eq!(store.gets.load(std::sync::atomic::Ordering::Relaxed) - before, 0);
}
