//! The outbox stream's tests: contiguity against compaction, pacing,
//! and a peer stream's progress marks.
use super::*;
use crate::codec::encode_writes;
use crate::metrics::NodeMetrics;
use crate::outbox::{Overtaken, Published};
use crate::store::MemoryStore;
use cascade_core::model::{EventType, RefTarget, Timestamp};
use cascade_core::state::WriteSet;
use cascade_core::{ResourceName, Uid};
use cascade_proto::status::resume_revision;
use futures::{FutureExt, StreamExt};
use proptest::prelude::*;
use std::sync::Arc;
use tokio::sync::watch;

/// A node's outbox without the node: the store, the broadcast the
/// writer publishes on after each commit, and the metrics.
struct Outbox {
    store: Arc<dyn Store>,
    events: broadcast::Sender<Arc<Event>>,
    stop: watch::Sender<bool>,
    metrics: Arc<NodeMetrics>,
    published: Arc<Published>,
    /// Tells apart two events given the same revision (one lost with
    /// an unflushed commit, the next committed after the reopen).
    incarnation: std::sync::atomic::AtomicU64,
}

impl Outbox {
    fn new(broadcast_capacity: usize) -> Self {
        Self {
            store: Arc::new(MemoryStore::default()),
            events: broadcast::channel(broadcast_capacity).0,
            stop: watch::channel(false).0,
            metrics: Arc::new(NodeMetrics::new()),
            published: Arc::new(Published::new(1)),
            incarnation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn state(&self) -> StoreState<'_> {
        StoreState {
            store: self.store.as_ref(),
        }
    }

    /// Commits `n` events in one batch, as a writer step does, flushes
    /// them (the published mark moves past them), then publishes them.
    fn commit(&self, n: u64) {
        let events = self.commit_unflushed(n);
        if let Some(last) = events.last() {
            self.published.advance(last.revision + 1);
        }
        for e in events {
            let _ = self.events.send(Arc::new(e));
        }
    }

    /// Commits `n` events one step at a time: a row each, so that
    /// compaction may stop between any two of them (it removes whole
    /// rows, one commit's events).
    fn commit_each(&self, n: u64) {
        for _ in 0..n {
            self.commit(1);
        }
    }

    /// Commits `n` events whose flush fails: readers of the store can
    /// see them, nothing is published. Returns them.
    fn commit_unflushed(&self, n: u64) -> Vec<Event> {
        let first = self.state().next_revision_stored().unwrap();
        let incarnation = self.incarnation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut writes = WriteSet::default();
        for revision in first..first + n {
            writes.events.push(Event {
                revision,
                event_type: EventType::Created,
                resource: RefTarget {
                    name: ResourceName::parse(&format!("eu-west/project/p{revision}")).unwrap(),
                    uid: Uid(uuid::Uuid::from_u128(u128::from(revision))),
                },
                snapshot: None,
                operation: None,
                message: String::new(),
                time: Timestamp(incarnation),
                no_cascade: false,
                cause: None,
                principal: Default::default(),
                retain_ms: 0,
            });
        }
        writes.next_revision = Some(first + n);
        let batch = encode_writes(&self.state(), &writes).unwrap();
        self.store.commit(batch).unwrap();
        writes.events
    }

    /// A later flush succeeds: what failed commits left is durable and
    /// published, as the writer's `publish_landed` does.
    fn flush_landed(&self) {
        let from = self.published.below();
        let next = self.state().next_revision_stored().unwrap();
        let landed = self.state().events_from(from, usize::MAX).unwrap();
        self.published.advance(next);
        for e in landed {
            let _ = self.events.send(Arc::new(e));
        }
    }

    /// The engine is reopened and keeps only what was flushed (sled):
    /// the unflushed events are gone and their revisions given again.
    fn lose_unflushed(&self) {
        let published = self.published.below();
        let next = self.state().next_revision_stored().unwrap();
        let mut batch = crate::store::Batch::default();
        // Every row of a lost commit is keyed by a revision in this
        // range (its last event's): commits are published whole.
        for revision in published..next {
            batch.remove(crate::store::Table::Outbox, crate::codec::revision_key(revision));
        }
        let rewind = WriteSet {
            next_revision: Some(published),
            ..WriteSet::default()
        };
        for op in encode_writes(&self.state(), &rewind).unwrap().ops {
            batch.ops.push(op);
        }
        self.store.commit(batch).unwrap();
    }

    /// The outbox as it is now, from `from`: (revision, incarnation).
    fn history(&self, from: Revision) -> Vec<(Revision, u64)> {
        self.state()
            .events_from(from, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|e| (e.revision, e.time.0))
            .collect()
    }

    /// Compacts so that the newest `keep` events remain; the floor after.
    fn compact_keeping(&self, keep: u64) -> Revision {
        let below = self.state().next_revision_stored().unwrap().saturating_sub(keep);
        self.state().compact_outbox(below, usize::MAX).unwrap();
        self.state().outbox_floor().unwrap()
    }

    fn feed(&self) -> OutboxFeed {
        OutboxFeed {
            store: self.store.clone(),
            live: self.events.subscribe(),
            shutting_down: self.stop.subscribe(),
            overtaken: Arc::new(Overtaken::new(self.metrics.clone())),
            published: self.published.clone(),
        }
    }

    fn stream(
        &self,
        from: Revision,
        wanted: fn(Revision) -> bool,
        pacing: Pacing,
    ) -> ReceiverStream<Result<Revision, Status>> {
        paced_outbox_stream(
            self.feed(),
            from,
            Watcher::Client { addr: None },
            move |e: &EventHead<'_>| wanted(e.revision),
            events_only(|e: &Event| e.revision),
            Span::none(),
            pacing,
        )
    }

    fn overtaken(&self) -> u64 {
        self.metrics.watch_overtaken_count("client")
    }
}

#[tokio::test]
async fn a_compacted_revision_answers_out_of_range_with_the_floor_to_resume_from() {
    let outbox = Outbox::new(4);
    outbox.commit_each(10);
    assert_eq!(outbox.compact_keeping(5), 6);
    let mut stream = outbox.stream(3, |_| true, PACING);
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), stream.next()).await;
    let status = first
        .expect("an answer at once")
        .expect("an answer")
        .expect_err("revision 3 was compacted");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");
    assert_eq!(resume_revision(&status), Some(6), "{status:?}");
    assert!(status.message().contains("revision 3 was compacted"), "{status}");
    assert!(status.message().contains("resume from is 6"), "{status}");
    assert_eq!(outbox.overtaken(), 1, "counted as an overtaken client watch");
}

#[tokio::test]
async fn from_the_oldest_starts_at_the_floor_wherever_it_is() {
    let outbox = Outbox::new(4);
    outbox.commit_each(10);
    outbox.compact_keeping(4);
    let mut stream = outbox.stream(0, |_| true, PACING);
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(stream.next().await.unwrap().unwrap());
    }
    assert_eq!(seen, vec![7, 8, 9, 10]);
}

/// A reader that stops after a few events while compaction passes it:
/// what was read before is still sent, contiguously, then OUT_OF_RANGE.
/// (The stream read from the store again after the compaction and, on
/// main, went on from the floor: 1..=5, then 41.)
#[tokio::test]
async fn a_running_stream_overtaken_by_compaction_ends_instead_of_skipping() {
    let outbox = Outbox::new(4);
    outbox.commit(10);
    let pacing = Pacing {
        queued: 2,
        page: 3,
        ..PACING
    };
    let mut stream = outbox.stream(1, |_| true, pacing);
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(stream.next().await.unwrap().unwrap());
    }
    outbox.commit_each(40);
    let floor = outbox.compact_keeping(10);
    assert_eq!(floor, 41);
    let end = loop {
        let item = tokio::time::timeout(std::time::Duration::from_secs(5), stream.next()).await;
        match item
            .expect("the stream ends, not waits")
            .expect("the stream ends with a status")
        {
            Ok(r) => seen.push(r),
            Err(status) => break status,
        }
    };
    let last = *seen.last().unwrap();
    assert_eq!(seen, (1..=last).collect::<Vec<_>>(), "no gap");
    assert_eq!(end.code(), tonic::Code::OutOfRange, "{end}");
    assert_eq!(resume_revision(&end), Some(41));
    assert!(
        end.message().contains(&format!("revision {} was compacted", last + 1)),
        "{end}"
    );
    assert_eq!(outbox.overtaken(), 1);
}

/// What a peer's stream sends in the test below: an event's revision,
/// or a progress mark's.
#[derive(Debug, PartialEq, Eq)]
enum PeerItem {
    Event(Revision),
    Mark(Revision),
}

/// A peer's stream says how far it passed over what it did not send: a
/// mark after `progress_every` events passed over, one when a replay
/// catches up, and one `mark_within` after an event of the live feed
/// passed over; never a mark past an event not yet sent. Without them
/// a peer's cursor stayed at the last event it was sent, and the
/// owner's outbox kept everything after it.
#[tokio::test]
async fn a_peer_stream_marks_how_far_it_passed_over_what_it_did_not_send() {
    let outbox = Outbox::new(4);
    outbox.commit_each(10);
    let pacing = Pacing {
        progress_every: 4,
        mark_within: std::time::Duration::from_millis(50),
        ..PACING
    };
    let mut stream = paced_outbox_stream(
        outbox.feed(),
        1,
        Watcher::Peer {
            region: "us-east".into(),
        },
        // Revisions 1 and 7 pass the head filter; 7 is then passed
        // over by the converter too, as a leaf's PURGED is.
        |e: &EventHead<'_>| e.revision == 1 || e.revision == 7,
        |sent: Sent<'_>| match sent {
            Sent::Event(e) if e.revision == 7 => None,
            Sent::Event(e) => Some(PeerItem::Event(e.revision)),
            Sent::PassedThrough(r) => Some(PeerItem::Mark(r)),
        },
        Span::none(),
        pacing,
    );
    macro_rules! next {
        () => {
            stream.next().await.unwrap().unwrap()
        };
    }
    assert_eq!(next!(), PeerItem::Event(1));
    // 2 to 5 passed over: the fourth is marked.
    assert_eq!(next!(), PeerItem::Mark(5));
    // 6 to 10 (7 among them) passed over, and the replay catches up.
    assert_eq!(next!(), PeerItem::Mark(9));
    assert_eq!(next!(), PeerItem::Mark(10));
    // Live: two events passed over, then quiet: marked once, after
    // `mark_within` (fewer than `progress_every` came).
    outbox.commit(2);
    assert_eq!(next!(), PeerItem::Mark(12));
    // Nothing more passed over: no mark.
    assert!(
        tokio::time::timeout(pacing.mark_within * 4, stream.next())
            .await
            .is_err(),
        "a mark with nothing passed over"
    );
}

/// A peer's stream overtaken is counted under its own label (its link
/// resyncs from the owner's listing on any OUT_OF_RANGE).
#[tokio::test]
async fn an_overtaken_peer_stream_is_counted_as_a_peer() {
    let outbox = Outbox::new(4);
    outbox.commit_each(10);
    outbox.compact_keeping(2);
    let mut stream = paced_outbox_stream(
        outbox.feed(),
        5,
        Watcher::Peer {
            region: "us-east".into(),
        },
        |_: &EventHead<'_>| true,
        events_only(|e: &Event| e.revision),
        Span::none(),
        PACING,
    );
    let status = stream.next().await.expect("an answer").expect_err("compacted");
    assert_eq!(resume_revision(&status), Some(9), "{status:?}");
    assert_eq!(outbox.metrics.watch_overtaken_count("peer"), 1);
    assert_eq!(outbox.overtaken(), 0, "not a client");
}

/// A commit's events are one row, which compaction removes whole: a
/// row that straddles the bound stays, the floor is its first
/// revision, and a stream from inside it starts exactly where it
/// asked; one from below the floor still ends with OUT_OF_RANGE.
#[tokio::test]
async fn compaction_keeps_a_commit_it_would_cut_and_a_stream_starts_inside_it() {
    let outbox = Outbox::new(4);
    outbox.commit(5);
    outbox.commit(5);
    assert_eq!(outbox.compact_keeping(7), 1, "1..=5 straddles 4: nothing removed");
    assert_eq!(
        outbox.compact_keeping(3),
        6,
        "1..=5 removed, 6..=10 straddles 8 and stays"
    );
    assert_eq!(outbox.history(0).first().map(|e| e.0), Some(6));
    let mut inside = outbox.stream(
        7,
        |_| true,
        Pacing {
            queued: 2,
            page: 2,
            ..PACING
        },
    );
    let mut seen = Vec::new();
    for _ in 0..4 {
        let item = tokio::time::timeout(std::time::Duration::from_secs(5), inside.next()).await;
        seen.push(item.expect("sent at once").expect("an item").expect("an event"));
    }
    assert_eq!(seen, vec![7, 8, 9, 10], "from inside the row, pages ending inside it");
    let mut below = outbox.stream(5, |_| true, PACING);
    let status = below.next().await.expect("an answer").expect_err("5 was compacted");
    assert_eq!(resume_revision(&status), Some(6), "{status:?}");
}

#[derive(Debug, Clone)]
enum Step {
    /// A writer step emitting 1..=4 events.
    Commit(u64),
    /// A writer step whose flush fails: committed, not published.
    CommitUnflushed(u64),
    /// A later flush succeeds: what failed commits left is published.
    FlushLanded,
    /// The engine is reopened and loses what was not flushed (sled).
    LoseUnflushed,
    /// The reconciler compacts, keeping this many of the newest events.
    Compact(u64),
    /// The reader takes up to this many items.
    Read(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1u64..=4).prop_map(Step::Commit),
        1 => (1u64..=3).prop_map(Step::CommitUnflushed),
        1 => Just(Step::FlushLanded),
        1 => Just(Step::LoseUnflushed),
        1 => (0u64..=6).prop_map(Step::Compact),
        3 => (1usize..=5).prop_map(Step::Read),
    ]
}

fn every(_: Revision) -> bool {
    true
}
fn odd(r: Revision) -> bool {
    !r.is_multiple_of(2)
}
fn not_third(r: Revision) -> bool {
    !r.is_multiple_of(3)
}

/// An item of the property test's stream: (revision, incarnation).
type Seen = (Revision, u64);

/// Takes one ready item; false when there was none or the stream ended.
async fn read_one(
    stream: &mut ReceiverStream<Result<Seen, Status>>,
    outbox: &Outbox,
    delivered: &mut Vec<Seen>,
    ended: &mut Option<(Status, Revision)>,
) -> bool {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    match stream.next().now_or_never() {
        Some(Some(Ok(r))) => {
            delivered.push(r);
            true
        }
        Some(Some(Err(status))) => {
            *ended = Some((status, outbox.state().outbox_floor().unwrap()));
            false
        }
        Some(None) | None => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Commits (some whose flush fails, later published or lost with a
    /// reopen), compactions and a slow reader interleaved over one
    /// stream (small buffers, a 2-slot broadcast that lags): the stream
    /// sends events of the outbox as it finally is, revisions `from,
    /// from+1, …` with none skipped (filtered ones are passed, not
    /// sent) and never one that a reopen took back; when it ends it is
    /// OUT_OF_RANGE with a resume revision above the revision it
    /// missed, that was the floor, and is no greater than the floor
    /// now. A stream that does not end delivers everything durable.
    #[test]
    fn compaction_racing_a_stream_never_leaves_a_silent_gap(
        initial in 1u64..12,
        from_offset in 0u64..16,
        filter in 0usize..3,
        queued in 1usize..4,
        page in 1usize..5,
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let wanted: fn(Revision) -> bool = [every, odd, not_third][filter];
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        runtime.block_on(async {
            let outbox = Outbox::new(2);
            outbox.commit(initial);
            let from = 2 + from_offset;
            let mut stream = paced_outbox_stream(
                outbox.feed(),
                from,
                Watcher::Client { addr: None },
                move |e: &EventHead<'_>| wanted(e.revision),
                events_only(|e: &Event| (e.revision, e.time.0)),
                Span::none(),
                Pacing { queued, page, ..PACING },
            );
            let mut floors = vec![outbox.state().outbox_floor().unwrap()];
            // Everything that was ever durable at some revision: what the
            // stream may have sent before a later compaction.
            let mut durable: std::collections::BTreeMap<Revision, u64> = outbox.history(0).into_iter().collect();
            let mut delivered: Vec<Seen> = Vec::new();
            let mut ended: Option<(Status, Revision)> = None;
            for s in &steps {
                match s {
                    Step::Commit(n) => outbox.commit(*n),
                    Step::CommitUnflushed(n) => { outbox.commit_unflushed(*n); }
                    Step::FlushLanded => outbox.flush_landed(),
                    Step::LoseUnflushed => outbox.lose_unflushed(),
                    Step::Compact(keep) => floors.push(outbox.compact_keeping(*keep)),
                    Step::Read(n) => {
                        for _ in 0..*n {
                            if !read_one(&mut stream, &outbox, &mut delivered, &mut ended).await { break; }
                        }
                    }
                }
                let published = outbox.published.below();
                durable.extend(outbox.history(0).into_iter().filter(|(r, _)| *r < published));
                if ended.is_some() { break; }
            }
            outbox.flush_landed();
            let published = outbox.published.below();
            durable.extend(outbox.history(0).into_iter().filter(|(r, _)| *r < published));
            while ended.is_none() && read_one(&mut stream, &outbox, &mut delivered, &mut ended).await {}

            let expected: Vec<Seen> = durable
                .range(from..)
                .filter(|(r, _)| wanted(**r))
                .map(|(r, i)| (*r, *i))
                .collect();
            prop_assert!(
                expected.starts_with(&delivered),
                "a gap, or an event a reopen took back: delivered {:?}, expected a prefix of {:?}", delivered, expected
            );
            match ended {
                None => prop_assert_eq!(&delivered, &expected, "a stream that did not end delivers everything"),
                Some((status, floor_now)) => {
                    prop_assert_eq!(status.code(), tonic::Code::OutOfRange, "{}", status);
                    let resume = resume_revision(&status);
                    prop_assert!(resume.is_some(), "{:?}", status);
                    let resume = resume.unwrap_or_default();
                    let missed_at_least = delivered.last().map_or(from, |l| l.0 + 1);
                    prop_assert!(resume > missed_at_least, "resume {} but the stream could go on at {}", resume, missed_at_least);
                    prop_assert!(floors.contains(&resume), "resume {} was never the floor ({:?})", resume, floors);
                    prop_assert!(resume <= floor_now);
                    prop_assert!(status.message().contains(&format!("resume from is {resume}")), "{}", status);
                }
            }
            Ok(())
        })?;
    }
}
