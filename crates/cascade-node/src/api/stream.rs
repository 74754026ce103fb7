//! Streaming the outbox from a revision as gRPC: replay what is durable,
//! then follow the live feed ([`OutboxFeed`], `outbox.rs`), going back to
//! the store whenever the feed skips ahead (the receiver lagged). Used by
//! the client `Watch` and the peers' `Watch`.
//!
//! Never a silent gap. Revisions are dense (the core's `Tx::emit` numbers
//! a step's events from the stored next revision, and they commit in the
//! step's one batch with the new next revision; only compaction removes
//! events, from the bottom, raising the floor in the same batch). So every
//! read of the store checks that the page starts at exactly the revision
//! the stream needs next; when it does not, the floor read *after* that
//! page says whether it was compacted (a compaction that removed it before
//! the page read raised the floor first). A compacted one ends the stream
//! with OUT_OF_RANGE naming it and the floor to resume from
//! (`cascade_proto::status::compacted`), the same status as a fresh watch
//! from below the floor, and `Overtaken` (`outbox.rs`) counts and warns.
//! What a stream read before a compaction is still sent: it is contiguous.
//!
//! The filter sees an event's head ([`EventHead`]: revision, type, name),
//! so a replay from the store decodes only the events it sends and passes
//! over the others by revision (a peer's Watch sends the deletion events
//! of an outbox that is mostly CREATED events).

use cascade_core::model::{Event, Revision};
use cascade_proto::status::{compacted, storage_unavailable};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tracing::{debug, error, Instrument, Span};

use crate::codec::{EventHead, Listed, StoreState};
use crate::outbox::{OutboxFeed, Watcher};
use crate::store::{Store, StoreError};

/// How much a stream holds: items queued for the connection (a slow reader
/// fills it, then the stream waits; HTTP/2 flow control holds more in the
/// connection's windows) and events read from the store at once; and
/// how many events it passes over without sending before it says so.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pacing {
    pub(crate) queued: usize,
    pub(crate) page: usize,
    /// Events passed over without an item sent, after which the stream
    /// sends a progress mark ([`Sent::PassedThrough`]); one is also sent
    /// whenever a replay from the store catches up.
    pub(crate) progress_every: u64,
    /// How long an event of the live feed passed over waits at most for
    /// its progress mark (fewer than `progress_every` came after it).
    pub(crate) mark_within: std::time::Duration,
}

/// The servers' pacing: 256 items queued, pages of 512 events, a progress
/// mark every 2,048 events passed over or half a second after the first
/// of them. A peer's cursor, and so the owner's outbox compaction, is at
/// most that far behind what it was sent (compaction keeps
/// `outbox_retention`, 100,000 events by default, anyway). Each mark is a
/// step of the importer's writer, so not one per create of the owner: P5
/// (100k cross-region creates, none of them sent) commits 47 batches more
/// for its marks, 349 against 302, at a rate within the machine's noise
/// (docs/BENCHMARKS.md, "A peer's watch leaves out the leaves' PURGED").
pub(crate) const PACING: Pacing = Pacing {
    queued: 256,
    page: 512,
    progress_every: 2_048,
    mark_within: std::time::Duration::from_millis(500),
};

/// What a stream asks its converter to make an item of.
pub(crate) enum Sent<'a> {
    /// An event whose head the filter wanted: None passes over it too.
    Event(&'a Event),
    /// The stream has passed every event up to this revision, and those it
    /// did not send were passed over: a peer's progress mark (its cursor
    /// moves there), None for a client's watch.
    PassedThrough(Revision),
}

/// A converter that sends every event the head filter wanted, and no
/// progress mark: a client's watch.
pub(crate) fn events_only<T>(
    wire: impl Fn(&Event) -> T + Send + Sync + 'static,
) -> impl Fn(Sent<'_>) -> Option<T> + Send + Sync + 'static {
    move |sent| match sent {
        Sent::Event(e) => Some(wire(e)),
        Sent::PassedThrough(_) => None,
    }
}

/// Streams events with revision >= `from` whose head passes `wanted`, converted by
/// `wire` (which may pass over an event too, and makes the progress marks
/// of [`Sent::PassedThrough`], or none). `from` 0 means from the oldest
/// retained event; below the floor, or overtaken by compaction later, the
/// stream ends with OUT_OF_RANGE (reason COMPACTED, the revision to resume from).
pub fn outbox_stream<T: Send + 'static>(
    feed: OutboxFeed,
    from: Revision,
    watcher: Watcher,
    wanted: impl Fn(&EventHead<'_>) -> bool + Send + Sync + 'static,
    wire: impl Fn(Sent<'_>) -> Option<T> + Send + Sync + 'static,
    span: Span,
) -> ReceiverStream<Result<T, Status>> {
    paced_outbox_stream(feed, from, watcher, wanted, wire, span, PACING)
}

/// [`outbox_stream`] with its buffers' sizes given (small ones in tests, so
/// a reader is slow after a few events).
pub(crate) fn paced_outbox_stream<T: Send + 'static>(
    feed: OutboxFeed,
    from: Revision,
    watcher: Watcher,
    wanted: impl Fn(&EventHead<'_>) -> bool + Send + Sync + 'static,
    wire: impl Fn(Sent<'_>) -> Option<T> + Send + Sync + 'static,
    span: Span,
    pacing: Pacing,
) -> ReceiverStream<Result<T, Status>> {
    let (tx, rx) = mpsc::channel(pacing.queued.max(1));
    let OutboxFeed {
        store,
        mut live,
        mut shutting_down,
        overtaken,
        published,
    } = feed;
    tokio::spawn(
        async move {
            let page_size = pacing.page.max(1);
            // 0: from the oldest retained event, wherever compaction moves
            // it before anything was passed. Any other revision is taken
            // at its word: 1 asks for everything since the first event,
            // and below the floor that is OUT_OF_RANGE, not a silent start
            // at the floor (a peer link with cursor 0 asks for 1).
            let from_oldest = from == 0;
            let mut next = if from_oldest {
                match (StoreState { store: store.as_ref() }).outbox_floor() {
                    Ok(f) => f,
                    Err(e) => {
                        let _ = tx.send(Err(storage_unavailable(e))).await;
                        return;
                    }
                }
            } else {
                from
            };
            let mut passed_any = false;
            // Events passed over since the last item sent.
            let mut unsent = 0u64;
            let progress_every = pacing.progress_every.max(1);
            // When the live feed's events passed over are said at the
            // latest: set by the first of them after an item.
            let mark_due = tokio::time::sleep(pacing.mark_within);
            tokio::pin!(mark_due);
            // Sends the progress mark through `next - 1`; false: the
            // receiver is gone.
            macro_rules! progress_mark {
                () => {{
                    unsent = 0;
                    match wire(Sent::PassedThrough(next.saturating_sub(1))) {
                        Some(mark) => tx.send(Ok(mark)).await.is_ok(),
                        None => true,
                    }
                }};
            }
            loop {
                loop {
                    let page = match read_page(store.as_ref(), next, page_size, published.below(), &wanted) {
                        Ok(Page::Events(page)) => page,
                        Ok(Page::CaughtUp) => break,
                        Ok(Page::Compacted { floor }) if from_oldest && !passed_any => {
                            next = floor;
                            continue;
                        }
                        Ok(Page::Compacted { floor }) => {
                            overtaken.report(&watcher, next, floor);
                            let _ = tx.send(Err(compacted(next, floor))).await;
                            return;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(storage_unavailable(e))).await;
                            return;
                        }
                    };
                    passed_any = true;
                    for entry in page {
                        next = entry.revision() + 1;
                        let item = match entry {
                            Listed::Event(e) => wire(Sent::Event(&e)),
                            Listed::Passed(_) => None,
                        };
                        match item {
                            Some(item) => {
                                unsent = 0;
                                if tx.send(Ok(item)).await.is_err() {
                                    return;
                                }
                            }
                            None => unsent += 1,
                        }
                        if unsent >= progress_every && !progress_mark!() {
                            return;
                        }
                    }
                    // One page a poll. A send to a channel with room does
                    // not yield, and a replay that sends nothing (a peer's
                    // over a cascade's leaves or a burst of creates) read
                    // page after page in one poll, holding a worker of the
                    // node's runtime while a client's call waited behind it
                    // (issue 28's P2: a create's p99 went from 50 ms to
                    // 220–255 ms once marks came 16 times less often).
                    tokio::task::yield_now().await;
                }
                // Caught up: whatever was passed over is said now, not
                // when the next event comes, which may be long.
                if unsent > 0 && !progress_mark!() {
                    return;
                }
                loop {
                    // Biased, not random: the same run polls in the same
                    // order (a simulation replays), and a busy feed cannot
                    // starve the shutdown and closed checks.
                    let received = tokio::select! {
                        biased;
                        _ = shutting_down.wait_for(|s| *s) => return,
                        _ = tx.closed() => return,
                        r = live.recv() => Some(r),
                        () = &mut mark_due, if unsent > 0 => None,
                    };
                    let Some(received) = received else {
                        if !progress_mark!() {
                            return;
                        }
                        continue;
                    };
                    match received {
                        Ok(e) if e.revision < next => continue,
                        Ok(e) if e.revision == next => {
                            next += 1;
                            passed_any = true;
                            let item = if wanted(&EventHead::of(&e)) {
                                wire(Sent::Event(&e))
                            } else {
                                None
                            };
                            match item {
                                Some(item) => {
                                    unsent = 0;
                                    if tx.send(Ok(item)).await.is_err() {
                                        return;
                                    }
                                }
                                None => {
                                    unsent += 1;
                                    if unsent == 1 {
                                        mark_due
                                            .as_mut()
                                            .reset(crate::clock::monotonic_now() + pacing.mark_within);
                                    }
                                }
                            }
                            if unsent >= progress_every && !progress_mark!() {
                                return;
                            }
                        }
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => return,
                    }
                }
                debug!(next, "stream fell behind the live feed; replaying from the store");
            }
        }
        .instrument(span),
    );
    ReceiverStream::new(rx)
}

/// What one read of the outbox found at the revision a stream needs next.
enum Page {
    /// Events from exactly that revision on, contiguous: those the filter
    /// wanted, decoded, and the others by revision.
    Events(Vec<Listed>),
    /// Nothing there yet: follow the live feed.
    CaughtUp,
    /// It was compacted; `floor` is the oldest revision retained.
    Compacted { floor: Revision },
}

/// Reads up to `limit` events from `next`, below `published` (what the
/// writer flushed and published; above it a batch may be partly applied,
/// or lost if its flush failed: those come from the live feed), checking
/// that nothing between `next` and the first one read is missing. Only the
/// events `wanted` takes are decoded past their head.
fn read_page(
    store: &dyn Store,
    next: Revision,
    limit: usize,
    published: Revision,
    wanted: &dyn Fn(&EventHead<'_>) -> bool,
) -> Result<Page, StoreError> {
    let state = StoreState { store };
    if next >= published {
        // Nothing durable to replay yet; but `next` may have been
        // compacted (compaction follows the published events).
        let floor = state.outbox_floor()?;
        return Ok(if floor > next {
            Page::Compacted { floor }
        } else {
            Page::CaughtUp
        });
    }
    let limit = usize::try_from(published - next).map_or(limit, |before| before.min(limit));
    let mut page = state.events_wanted(next, limit, wanted)?;
    let first = page.first().map(Listed::revision);
    // Cut the page at the first revision out of sequence (never, with
    // dense revisions): the next read starts there and finds out why.
    let contiguous = page.iter().zip(next..).take_while(|(e, r)| e.revision() == *r).count();
    page.truncate(contiguous);
    if !page.is_empty() {
        return Ok(Page::Events(page));
    }
    // `next` is not there: not committed yet, or compacted. The floor is
    // read after the page: a compaction that removed `next` before the page
    // read raised the floor in the same batch, so it is seen here.
    let floor = state.outbox_floor()?;
    if floor > next {
        return Ok(Page::Compacted { floor });
    }
    match first {
        None => Ok(Page::CaughtUp),
        // Missing above the floor: no compaction removed it. Said as an
        // error, and the stream ends as if compacted up to what is there,
        // so the client re-lists instead of passing over the hole.
        Some(present) => {
            error!(
                next,
                present, floor, "outbox revisions missing above the compaction floor"
            );
            Ok(Page::Compacted { floor: present })
        }
    }
}

/// `inner`, with `beat()` sent whenever it has had nothing to send for
/// `every`: a follower that hears nothing for several beats knows the
/// link is dead, not quiet (the peer links' silence timeout). The sleep
/// starts again after each item, so a busy stream sends no beats.
pub fn with_heartbeats<T, S, B>(
    inner: S,
    every: std::time::Duration,
    beat: B,
) -> impl futures::Stream<Item = Result<T, Status>> + Send
where
    T: Send + 'static,
    S: futures::Stream<Item = Result<T, Status>> + Send + Unpin + 'static,
    B: Fn() -> T + Send + Sync + 'static,
{
    use futures::StreamExt;
    futures::stream::unfold((inner, beat), move |(mut inner, beat)| async move {
        tokio::select! {
            biased;
            item = inner.next() => item.map(|item| (item, (inner, beat))),
            () = tokio::time::sleep(every) => {
                let b = beat();
                Some((Ok(b), (inner, beat)))
            }
        }
    })
}

#[cfg(test)]
mod tests;
