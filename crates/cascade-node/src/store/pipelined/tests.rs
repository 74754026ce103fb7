use std::sync::atomic::AtomicBool;

use super::*;
use crate::store::tests::{batch_numbered, conformance};
use crate::store::{scan_from_floor, writers_view_of, FjallStore, MemoryStore, SledStore};

fn put(table: Table, key: &str, value: &str) -> Batch {
    let mut batch = Batch::default();
    batch.put(table, key.as_bytes().to_vec(), value.as_bytes().to_vec());
    batch
}

fn remove(table: Table, key: &str) -> Batch {
    let mut batch = Batch::default();
    batch.remove(table, key.as_bytes().to_vec());
    batch
}

fn value(store: &dyn Store, key: &str) -> Option<String> {
    store
        .get(Table::Resources, key.as_bytes())
        .expect("a read")
        .map(|v| String::from_utf8(v).expect("utf-8"))
}

/// A memory engine whose commits fail while `failing` is set (a full
/// disk, say).
#[derive(Default)]
struct FailingCommits {
    inner: MemoryStore,
    failing: AtomicBool,
}

impl Store for FailingCommits {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.inner.scan(table, prefix, after, limit)
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Engine("the disk is full".into()));
        }
        self.inner.commit(batch)
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[test]
fn a_pipelined_view_over_memory_conforms_with_and_without_its_bounds_reached() {
    let view = PipelinedStore::new(Arc::new(MemoryStore::default())).unwrap();
    conformance(&view);
    // Two keys at most: most commits apply the staged set to the engine.
    let view = PipelinedStore::with_bounds(Arc::new(MemoryStore::default()), 2, 1 << 20).unwrap();
    conformance(&view);
}

#[test]
fn a_pipelined_view_over_fjall_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Store> = Arc::new(FjallStore::open(&dir.path().join("a")).unwrap());
    conformance(&PipelinedStore::new(engine).unwrap());
}

/// The writer's view of sled, whose reads of the engine do not wait for
/// the batch its commit thread is landing (`sled_store.rs`), conforms.
#[test]
fn a_pipelined_view_over_sled_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Store> = Arc::new(SledStore::open(&dir.path().join("a")).unwrap());
    conformance(writers_view_of(&engine).unwrap().as_ref());
}

/// The writer reads the engine while its commit thread applies a batch
/// key by key (sled: without the batch lock everyone else waits for), and
/// still sees each batch whole, from its staged set: every read below
/// runs while batch n may be half applied in the engine, and must see n
/// everywhere ([`batch_numbered`]).
#[test]
fn the_writers_reads_over_sled_see_a_landing_batch_whole() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Store> = Arc::new(SledStore::open(&dir.path().join("a")).unwrap());
    let view = writers_view_of(&engine).unwrap();
    let read = |table| {
        view.get(table, b"n")
            .unwrap()
            .map_or(0, |v| u64::from_be_bytes(v.as_slice().try_into().unwrap()))
    };
    for n in 1..=100u64 {
        view.commit(batch_numbered(n)).unwrap();
        view.start_flush().unwrap();
        for _ in 0..3 {
            assert_eq!(read(Table::Outbox), n);
            let page = view.scan(Table::Backrefs, b"", None, 1000).unwrap();
            assert_eq!(page.len(), 200);
            assert!(
                page.iter().all(|(_, v)| v.as_slice() == n.to_be_bytes()),
                "batch {n}: a scan saw two batches"
            );
            assert_eq!(read(Table::Resources), n);
        }
        view.finish_flush().unwrap();
    }
    assert_eq!(read(Table::Outbox), 100);
}

/// The writer's reads see its commits from the commit on, through the
/// flight; everyone else (the engine itself) once the flight landed.
#[test]
fn the_writer_reads_its_commits_in_flight_and_others_once_they_landed() {
    let engine: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let view = PipelinedStore::new(engine.clone()).unwrap();
    view.commit(put(Table::Resources, "a", "1")).unwrap();
    view.commit(put(Table::Resources, "b", "2")).unwrap();
    view.commit(remove(Table::Resources, "b")).unwrap();
    assert_eq!(value(&view, "a").as_deref(), Some("1"));
    assert_eq!(value(&view, "b"), None);
    assert_eq!(value(engine.as_ref(), "a"), None, "not landed before the flush");
    view.start_flush().unwrap();
    assert_eq!(value(&view, "a").as_deref(), Some("1"), "seen while in flight");
    assert_eq!(view.scan(Table::Resources, b"", None, 10).unwrap().len(), 1);
    view.finish_flush().unwrap();
    assert_eq!(value(engine.as_ref(), "a").as_deref(), Some("1"));
    assert_eq!(value(engine.as_ref(), "b"), None);
    assert_eq!(value(&view, "a").as_deref(), Some("1"));
    assert!(view.nothing_staged(), "landed writes are read from the engine");
    // A removal staged over a landed row hides it from the writer only.
    view.commit(remove(Table::Resources, "a")).unwrap();
    assert_eq!(value(&view, "a"), None);
    assert!(view.scan(Table::Resources, b"", None, 10).unwrap().is_empty());
    assert_eq!(value(engine.as_ref(), "a").as_deref(), Some("1"));
    view.flush().unwrap();
    assert_eq!(value(engine.as_ref(), "a"), None);
}

/// A flight whose engine commit failed landed nothing: its writes are
/// gone from the writer's reads too, and it reports the failure once.
#[test]
fn a_failed_flight_reports_once_and_leaves_no_write_visible() {
    let engine = Arc::new(FailingCommits::default());
    let view = PipelinedStore::new(engine.clone()).unwrap();
    view.commit(put(Table::Resources, "kept", "1")).unwrap();
    view.flush().unwrap();
    engine.failing.store(true, Ordering::SeqCst);
    view.commit(put(Table::Resources, "lost", "2")).unwrap();
    view.commit(remove(Table::Resources, "kept")).unwrap();
    view.start_flush().unwrap();
    assert!(view.finish_flush().is_err());
    assert!(view.finish_flush().is_ok(), "reported once");
    assert_eq!(value(&view, "lost"), None);
    assert_eq!(value(&view, "kept").as_deref(), Some("1"), "its removal did not land");
    engine.failing.store(false, Ordering::SeqCst);
    view.commit(put(Table::Resources, "next", "3")).unwrap();
    view.start_flush().unwrap();
    view.finish_flush().unwrap();
    assert_eq!(value(engine.as_ref(), "next").as_deref(), Some("3"));
    assert_eq!(value(engine.as_ref(), "lost"), None);
}

/// Over its bounds a commit lands the staged set at once; if that fails,
/// the commits staged before it must not be told they landed: the next
/// flush fails too.
#[test]
fn a_failed_landing_over_the_bounds_fails_the_next_flush() {
    let engine = Arc::new(FailingCommits::default());
    let view = PipelinedStore::with_bounds(engine.clone(), 2, 1 << 20).unwrap();
    view.commit(put(Table::Resources, "a", "1")).unwrap();
    engine.failing.store(true, Ordering::SeqCst);
    let mut batch = put(Table::Resources, "b", "2");
    batch.put(Table::Resources, b"c".to_vec(), b"3".to_vec());
    assert!(view.commit(batch).is_err());
    engine.failing.store(false, Ordering::SeqCst);
    assert!(view.flush().is_err(), "the first commit's write was lost with the set");
    assert_eq!(value(&view, "a"), None);
    view.flush().unwrap();
}

/// A scan from a table's floor through the view finds a staged put below
/// where the engine's rows start (the view keeps floors of its own).
#[test]
fn a_scan_from_the_floor_finds_a_staged_key_below_the_engines_first_row() {
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<dyn Store> = Arc::new(FjallStore::open(&dir.path().join("a")).unwrap());
    let view = PipelinedStore::new(engine).unwrap();
    view.commit(put(Table::DueIndex, "m", "")).unwrap();
    view.flush().unwrap();
    let first = |view: &PipelinedStore| scan_from_floor(view, Table::DueIndex, 1).unwrap()[0].0.clone();
    assert_eq!(first(&view), b"m".to_vec(), "raises the floor to m");
    view.commit(put(Table::DueIndex, "c", "")).unwrap();
    assert_eq!(first(&view), b"c".to_vec());
    view.start_flush().unwrap();
    view.finish_flush().unwrap();
    assert_eq!(first(&view), b"c".to_vec());
}

/// A commit that skips its flush (an importer's cursor, the outbox's
/// compaction) is applied for everyone by `land`, unflushed: the node's
/// streams and API read it at once, as they did before the pipeline
/// (`watch_gaps` and `cross_region_crash` waited for such writes in vain
/// when only a flush applied them).
#[test]
fn land_applies_what_is_staged_for_every_reader_without_a_flight() {
    let engine: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let view = PipelinedStore::new(engine.clone()).unwrap();
    view.commit(put(Table::Resources, "cursor", "7")).unwrap();
    assert_eq!(value(engine.as_ref(), "cursor"), None);
    view.land().unwrap();
    assert_eq!(value(engine.as_ref(), "cursor").as_deref(), Some("7"));
    assert!(view.nothing_staged());
    // After a flight too: the flight's own writes first, then the rest.
    view.commit(put(Table::Resources, "a", "1")).unwrap();
    view.start_flush().unwrap();
    view.land().unwrap();
    view.commit(put(Table::Resources, "cursor", "8")).unwrap();
    view.land().unwrap();
    assert_eq!(value(engine.as_ref(), "a").as_deref(), Some("1"));
    assert_eq!(value(engine.as_ref(), "cursor").as_deref(), Some("8"));
    view.finish_flush().unwrap();
}
