use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::Duration;

use super::*;
use crate::store::tests::put;

/// How long a test waits for something that must happen (a thread's
/// answer), before it calls it a hang.
const MUST_HAPPEN: Duration = Duration::from_secs(30);

/// A crash between a batch's journal entry and the end of its writes
/// (here: after the first of three) leaves the batch in the journal, and
/// the next open applies all of it before anyone reads: what the
/// transaction sled rolled back before is now finished.
#[test]
fn a_batch_a_crash_interrupted_is_finished_by_the_next_open() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SledStore::open(dir.path()).expect("opens");
    store
        .commit(put(&[(Table::Backrefs, b"gone", b"before")]))
        .expect("commits");
    let mut interrupted = Batch::default();
    interrupted.put(Table::Resources, b"r".to_vec(), b"1".to_vec());
    interrupted.put(Table::Outbox, b"o".to_vec(), b"1".to_vec());
    interrupted.remove(Table::Backrefs, b"gone".to_vec());
    store
        .with(|h| {
            h.journal
                .insert(JOURNAL_KEY, journal::encode(&interrupted.ops))
                .map_err(|e| engine("test", e))?;
            h.apply(&interrupted.ops[..1])
        })
        .expect("journals the batch and applies its first write");
    store.flush().expect("flushes");
    assert_eq!(store.get(Table::Outbox, b"o").expect("reads"), None, "not applied yet");
    drop(store);

    let store = SledStore::open(dir.path()).expect("opens again");
    assert_eq!(store.get(Table::Resources, b"r").expect("reads"), Some(b"1".to_vec()));
    assert_eq!(store.get(Table::Outbox, b"o").expect("reads"), Some(b"1".to_vec()));
    assert_eq!(store.get(Table::Backrefs, b"gone").expect("reads"), None);
    let journal_empty = store
        .with(|h| {
            h.journal
                .is_empty()
                .then_some(())
                .ok_or_else(|| StoreError::Engine("kept".into()))
        })
        .is_ok();
    assert!(journal_empty, "the finished batch's entry is cleared");
}

/// While a commit applies its batch (here: holds the batch lock), a
/// reader waits for it, so that it never sees half of it; the pipelined
/// writer's handle does not wait, which is what lets the writer's next
/// step run beside its flight landing.
#[test]
fn a_reader_waits_for_a_landing_batch_and_the_pipelined_writers_handle_does_not() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = Arc::new(SledStore::open(dir.path()).expect("opens"));
    store.commit(put(&[(Table::Meta, b"k", b"v")])).expect("commits");
    let writers = store.for_pipelined_writer().expect("sled has a writer's handle");

    let landing = store.batches.write().unwrap_or_else(PoisonError::into_inner);
    let read_on = |store: Arc<dyn Store>| {
        let (answered, answer) = channel();
        std::thread::spawn(move || {
            let _ = answered.send(store.get(Table::Meta, b"k").map_err(|e| e.to_string()));
        });
        answer
    };
    let writer_read = read_on(writers);
    assert_eq!(
        writer_read
            .recv_timeout(MUST_HAPPEN)
            .expect("the writer's read answers"),
        Ok(Some(b"v".to_vec()))
    );
    let other_read = read_on(store.clone());
    assert_eq!(
        other_read.recv_timeout(Duration::from_millis(200)),
        Err(RecvTimeoutError::Timeout),
        "another reader read while a batch was landing"
    );
    drop(landing);
    assert_eq!(
        other_read
            .recv_timeout(MUST_HAPPEN)
            .expect("answers once the batch landed"),
        Ok(Some(b"v".to_vec()))
    );
}
