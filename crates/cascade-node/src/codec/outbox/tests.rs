//! The outbox's rows: a commit's events in one row under its last
//! revision, rows written before runs (one event each) read in the same
//! sequence, reads from any revision, and compaction of whole rows.

// Test code: legacy JSON rows, as nodes before the binary encoding wrote them.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicUsize, Ordering};

use cascade_core::auth::{Principal, Via};
use cascade_core::model::{Event, EventType, RefTarget, Revision, Timestamp};
use cascade_core::state::WriteSet;
use cascade_core::{ResourceName, Uid};
use proptest::prelude::*;

use super::super::{decode_keyed, encode_writes, records, revision_key, Listed, Record, StoreState};
use super::{MAX_EVENTS_PER_OUTBOX_ROW, MAX_OUTBOX_ROW_BYTES};
use crate::store::{Batch, Entry, MemoryStore, Store, StoreError, Table};

/// An event at `revision`, in the layout `revision` picks (1, 3 or 4:
/// every run holds values of several layouts), with a `message_len`-byte
/// message.
fn event(revision: Revision, message_len: usize) -> Event {
    let principal = match revision % 3 {
        1 => Principal {
            id: "alice".into(),
            groups: vec!["ops".into()],
            via: Via::Token,
        },
        _ => Principal::anonymous(),
    };
    Event {
        revision,
        event_type: if revision.is_multiple_of(2) {
            EventType::Deleting
        } else {
            EventType::Created
        },
        resource: RefTarget {
            name: ResourceName::parse(&format!("eu-west/port/p{revision}")).expect("a name"),
            uid: Uid(uuid::Uuid::from_u128(u128::from(revision))),
        },
        snapshot: None,
        operation: None,
        message: "m".repeat(message_len),
        time: Timestamp(revision),
        no_cascade: false,
        cause: None,
        principal,
        retain_ms: if revision % 3 == 2 { 60_000 } else { 0 },
    }
}

fn events(revisions: std::ops::RangeInclusive<Revision>) -> Vec<Event> {
    revisions.map(|r| event(r, 8)).collect()
}

/// Commits `events` as one step does (one batch, through `encode_writes`);
/// returns the outbox keys it wrote, as revisions.
fn commit_step(store: &dyn Store, events: Vec<Event>) -> Vec<Revision> {
    let writes = WriteSet {
        next_revision: events.last().map(|e| e.revision + 1),
        events,
        ..WriteSet::default()
    };
    let batch = encode_writes(&StoreState { store }, &writes).expect("encodes");
    let keys = batch
        .ops
        .iter()
        .filter(|(table, _, _)| *table == Table::Outbox)
        .map(|(_, key, _)| revision_of_key(key))
        .collect();
    store.commit(batch).expect("commits");
    keys
}

/// What nodes before runs wrote: each event a row of its own, under its
/// revision (the encoder `encode_writes` had), and legacy JSON when asked.
fn commit_old_rows(store: &dyn Store, events: &[Event], json: bool) {
    let mut batch = Batch::default();
    for e in events {
        let value = if json {
            serde_json::to_vec(e).expect("JSON")
        } else {
            e.encode(Table::Outbox).expect("encodes")
        };
        batch.put(Table::Outbox, revision_key(e.revision), value);
    }
    store.commit(batch).expect("commits");
}

fn revision_of_key(key: &[u8]) -> Revision {
    u64::from_be_bytes(key.try_into().expect("8 bytes"))
}

fn revisions(events: &[Event]) -> Vec<Revision> {
    events.iter().map(|e| e.revision).collect()
}

fn outbox_keys(store: &dyn Store) -> Vec<Revision> {
    store
        .scan(Table::Outbox, &[], None, usize::MAX)
        .expect("scans")
        .iter()
        .map(|(k, _)| revision_of_key(k))
        .collect()
}

#[test]
fn a_commits_events_are_one_row_under_its_last_revision_and_a_lone_event_keeps_its_bytes() {
    let store = MemoryStore::default();
    assert_eq!(
        commit_step(&store, events(1..=3)),
        vec![3],
        "one key write for three events"
    );
    let lone = event(4, 8);
    assert_eq!(commit_step(&store, vec![lone.clone()]), vec![4]);
    let value = |r: Revision| {
        store
            .get(Table::Outbox, &revision_key(r))
            .expect("reads")
            .expect("a row")
    };
    assert_eq!(value(3)[0], super::VERSION_POSTCARD_V6, "a run of events");
    assert_eq!(
        value(4),
        lone.encode(Table::Outbox).expect("encodes"),
        "one event: the value every row held before runs"
    );
    let state = StoreState { store: &store };
    assert_eq!(state.events_from(0, usize::MAX).expect("reads"), events(1..=4));
}

#[test]
fn a_commit_past_a_rows_limits_is_written_as_more_rows() {
    let store = MemoryStore::default();
    let many = events(1..=600);
    assert_eq!(
        commit_step(&store, many.clone()),
        vec![256, 512, 600],
        "{MAX_EVENTS_PER_OUTBOX_ROW} events a row at most"
    );
    // Three events of 40 KiB: two would pass a row's bytes.
    let big: Vec<Event> = (601..=603).map(|r| event(r, 40 * 1024)).collect();
    assert_eq!(commit_step(&store, big.clone()), vec![601, 602, 603]);
    // Small events around one larger than a row's bytes: it is a row of its own.
    let mut mixed = vec![event(604, 8), event(605, 8)];
    mixed.push(event(606, MAX_OUTBOX_ROW_BYTES + 1));
    mixed.push(event(607, 8));
    assert_eq!(commit_step(&store, mixed.clone()), vec![605, 606, 607]);
    let state = StoreState { store: &store };
    let all: Vec<Event> = many.into_iter().chain(big).chain(mixed).collect();
    assert_eq!(state.events_from(1, usize::MAX).expect("reads"), all);
}

/// Rows of old and new builds, any layout each (legacy JSON included), and
/// commits of several events: as one sequence from every revision and
/// with every limit; and compaction removes whole rows.
fn mixed_outbox(old: u64, json: bool, commits: &[u64]) -> (MemoryStore, Vec<Event>, Vec<Revision>) {
    let store = MemoryStore::default();
    let before = events(1..=old);
    commit_old_rows(&store, &before, false);
    let mut all = before;
    if json {
        let legacy = event(old + 1, 8);
        commit_old_rows(&store, std::slice::from_ref(&legacy), true);
        all.push(legacy);
    }
    for n in commits {
        let first = all.len() as u64 + 1;
        let step = events(first..=first + n - 1);
        commit_step(&store, step.clone());
        all.extend(step);
    }
    let keys = outbox_keys(&store);
    (store, all, keys)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn old_rows_and_runs_read_as_one_sequence_from_any_revision(
        old in 0u64..5,
        json in any::<bool>(),
        commits in prop::collection::vec(1u64..7, 0..6),
        limit in prop_oneof![1usize..10, Just(usize::MAX)],
    ) {
        let (store, all, _) = mixed_outbox(old, json, &commits);
        let state = StoreState { store: &store };
        let last = all.len() as u64;
        for from in 0..=last + 1 {
            let expected: Vec<Event> = all.iter().filter(|e| e.revision >= from).take(limit).cloned().collect();
            prop_assert_eq!(&state.events_from(from, limit).expect("reads"), &expected, "from {}", from);
            // The filtered read: the same revisions, the wanted ones whole.
            let listed = state.events_wanted(from, limit, &|h| h.revision % 2 == 1).expect("reads");
            prop_assert_eq!(listed.iter().map(Listed::revision).collect::<Vec<_>>(), revisions(&expected));
            for (entry, e) in listed.iter().zip(&expected) {
                match entry {
                    Listed::Event(read) => prop_assert_eq!(&**read, e),
                    Listed::Passed(r) => prop_assert!(r % 2 == 0),
                }
            }
        }
        // Page by page, each page from the revision after the last one
        // read (a page may end inside a row): every event once, in order.
        let mut paged = Vec::new();
        let mut from = 1;
        loop {
            let page = state.events_from(from, limit.min(4)).expect("reads");
            let Some(last) = page.last() else { break };
            from = last.revision + 1;
            paged.extend(page);
        }
        prop_assert_eq!(paged, all);
    }

    #[test]
    fn compaction_removes_whole_rows_and_the_floor_is_the_first_revision_kept(
        old in 0u64..5,
        json in any::<bool>(),
        commits in prop::collection::vec(1u64..7, 0..6),
        below in 0u64..30,
        rows_per_call in prop_oneof![Just(1usize), Just(usize::MAX)],
    ) {
        let (store, all, keys) = mixed_outbox(old, json, &commits);
        let state = StoreState { store: &store };
        // Rows whose last revision is below `below` go; the floor is then
        // the revision after the last of them.
        let expected_floor = keys.iter().filter(|k| **k < below).max().map_or(1, |k| k + 1);
        let mut risen = 0;
        loop {
            let n = state.compact_outbox(below, rows_per_call).expect("compacts");
            if n == 0 { break; }
            risen += n;
        }
        let floor = state.outbox_floor().expect("reads");
        prop_assert_eq!(floor, expected_floor);
        prop_assert_eq!(risen as u64, floor - 1, "how far the floor rose, in events");
        let kept: Vec<Event> = all.iter().filter(|e| e.revision >= floor).cloned().collect();
        prop_assert_eq!(state.events_from(0, usize::MAX).expect("reads"), kept.clone());
        prop_assert_eq!(state.events_from(floor, usize::MAX).expect("reads"), kept);
    }
}

/// `value` with the first `len` bytes of the message `m…m` made invalid
/// UTF-8: the event's head still reads, its body does not.
fn damaged(value: &[u8], len: usize) -> Vec<u8> {
    let message = "m".repeat(len);
    let at = value
        .windows(len)
        .position(|w| w == message.as_bytes())
        .expect("the value holds the message");
    let mut out = value.to_vec();
    out[at..at + len].fill(0xff);
    out
}

/// A filtered read inside a run reads each event's head and decodes only
/// what it keeps: a damaged event it passes over (or starts past) is not
/// decoded, and one it wants is corruption.
#[test]
fn a_filtered_read_of_a_run_decodes_only_the_events_it_keeps() {
    let store = MemoryStore::default();
    let [one, two, three] = [event(1, 8), event(2, 8), event(3, 8)];
    let values = vec![
        damaged(&one.encode(Table::Outbox).expect("encodes"), 8),
        damaged(&two.encode(Table::Outbox).expect("encodes"), 8),
        three.encode(Table::Outbox).expect("encodes"),
    ];
    let mut batch = Batch::default();
    batch.put(
        Table::Outbox,
        revision_key(3),
        records::encode_outbox_row(values).expect("encodes"),
    );
    store.commit(batch).expect("commits");
    let state = StoreState { store: &store };
    let listed = state
        .events_wanted(1, 10, &|h| h.revision == 3)
        .expect("passes over 1 and 2");
    assert!(
        matches!(listed.as_slice(), [Listed::Passed(1), Listed::Passed(2), Listed::Event(e)] if **e == three),
        "{listed:?}"
    );
    assert_eq!(state.events_from(3, 10).expect("starts past 1 and 2"), vec![three]);
    assert!(matches!(
        state.events_wanted(1, 10, &|h| h.revision == 2),
        Err(StoreError::Corrupt { table: "outbox", .. })
    ));
}

/// A run that does not read is corruption of the outbox, as is a run of
/// none and a run inside a run; and an older build, which reads a row as
/// one event, finds a run corrupt (what a downgrade meets).
#[test]
fn a_run_that_does_not_read_is_corruption_and_an_older_build_cannot_read_one() {
    let run = records::encode_outbox_row(vec![
        event(1, 8).encode(Table::Outbox).expect("encodes"),
        event(2, 8).encode(Table::Outbox).expect("encodes"),
    ])
    .expect("encodes");
    let nested = records::encode_outbox_row(vec![run.clone(), event(3, 8).encode(Table::Outbox).expect("encodes")])
        .expect("encodes");
    let short = run[..run.len() - 1].to_vec();
    for (what, value) in [
        ("cut short", short),
        ("of no events", vec![super::VERSION_POSTCARD_V6, 0]),
        ("inside a run", nested),
    ] {
        let store = MemoryStore::default();
        let mut batch = Batch::default();
        batch.put(Table::Outbox, revision_key(3), value);
        store.commit(batch).expect("commits");
        let state = StoreState { store: &store };
        assert!(
            matches!(
                state.events_from(1, 10),
                Err(StoreError::Corrupt { table: "outbox", .. })
            ),
            "a run {what}"
        );
    }
    match decode_keyed::<Event>(Table::Outbox, &[], &run) {
        Err(StoreError::Corrupt { message, .. }) => assert!(message.contains("0x06"), "{message}"),
        other => panic!("a run read as one event: {other:?}"),
    }
}

/// A store that counts the outbox rows its scans return.
#[derive(Default)]
struct CountingStore {
    inner: MemoryStore,
    scans: AtomicUsize,
    rows: AtomicUsize,
    most_rows_in_a_scan: AtomicUsize,
}

impl Store for CountingStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let page = self.inner.scan(table, prefix, after, limit)?;
        if table == Table::Outbox {
            self.scans.fetch_add(1, Ordering::Relaxed);
            self.rows.fetch_add(page.len(), Ordering::Relaxed);
            self.most_rows_in_a_scan.fetch_max(page.len(), Ordering::Relaxed);
        }
        Ok(page)
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.inner.commit(batch)
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A page of a stream reads about the rows it needs: of a cascade's big
/// rows a few, not one per event asked; of rows of one event, the page's
/// rows in two scans.
#[test]
fn a_read_scans_about_the_rows_its_events_take() {
    let big = CountingStore::default();
    for step in 0..10u64 {
        commit_step(&big, events(step * 256 + 1..=step * 256 + 256));
    }
    let state = StoreState { store: &big };
    assert_eq!(state.events_from(100, 512).expect("reads").len(), 512);
    assert_eq!(big.scans.load(Ordering::Relaxed), 1);
    assert!(
        big.rows.load(Ordering::Relaxed) <= 4,
        "{:?} rows for 512 events",
        big.rows
    );

    let small = CountingStore::default();
    commit_old_rows(&small, &events(1..=2000), false);
    let state = StoreState { store: &small };
    assert_eq!(state.events_from(1, 512).expect("reads").len(), 512);
    assert_eq!(small.rows.load(Ordering::Relaxed), 512, "no row past the page");
    assert_eq!(small.scans.load(Ordering::Relaxed), 2);
}

/// Compaction reads rows a few at a time (a scan returns their values,
/// up to 64 KiB each), and still removes up to its limit in one batch.
#[test]
fn compaction_scans_a_few_rows_at_a_time_and_removes_its_limit() {
    let store = CountingStore::default();
    for step in 0..100u64 {
        commit_step(&store, events(step * 3 + 1..=step * 3 + 3));
    }
    let state = StoreState { store: &store };
    assert_eq!(state.compact_outbox(241, 1_000).expect("compacts"), 240, "80 rows of 3");
    assert_eq!(state.outbox_floor().expect("reads"), 241);
    assert!(
        store.most_rows_in_a_scan.load(Ordering::Relaxed) <= super::COMPACTION_SCAN_ROWS,
        "{:?} rows in one scan",
        store.most_rows_in_a_scan
    );
    assert_eq!(
        state.compact_outbox(301, 10).expect("compacts"),
        30,
        "10 rows, its limit"
    );
    assert_eq!(state.outbox_floor().expect("reads"), 271);
}
