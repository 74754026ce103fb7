//! Streaming the outbox from a revision as gRPC: replay what is durable,
//! then follow the live feed ([`OutboxFeed`], `outbox.rs`), going back to
//! the store whenever the feed skips ahead (the receiver lagged). Used by
//! the client `Watch` and the peers' `Watch`.

use cascade_core::model::{Event, Revision};
use cascade_proto::status::storage_unavailable;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tracing::{debug, Instrument, Span};

use crate::codec::StoreState;
use crate::outbox::OutboxFeed;

/// Streams events with revision >= `from` that pass `wanted`, converted by `wire`.
pub fn outbox_stream<T: Send + 'static>(
    feed: OutboxFeed,
    from: Revision,
    wanted: impl Fn(&Event) -> bool + Send + Sync + 'static,
    wire: impl Fn(&Event) -> T + Send + Sync + 'static,
    span: Span,
) -> ReceiverStream<Result<T, Status>> {
    let (tx, rx) = mpsc::channel(256);
    let OutboxFeed {
        store,
        mut live,
        mut shutting_down,
    } = feed;
    tokio::spawn(
        async move {
            // 0 or 1: from the oldest retained event. Older than that was
            // compacted: the caller must resync (OUT_OF_RANGE).
            let floor = match (StoreState { store: store.as_ref() }).outbox_floor() {
                Ok(f) => f,
                Err(e) => {
                    let _ = tx.send(Err(storage_unavailable(e))).await;
                    return;
                }
            };
            if from > 1 && from < floor {
                let _ = tx
                    .send(Err(Status::out_of_range(format!(
                        "revision {from} was compacted; the outbox starts at {floor}"
                    ))))
                    .await;
                return;
            }
            let mut next = from.max(floor);
            loop {
                loop {
                    let page = match (StoreState { store: store.as_ref() }).events_from(next, 512) {
                        Ok(p) => p,
                        Err(e) => {
                            let _ = tx.send(Err(storage_unavailable(e))).await;
                            return;
                        }
                    };
                    let Some(last) = page.last() else { break };
                    next = last.revision + 1;
                    for e in page.iter().filter(|e| wanted(e)) {
                        if tx.send(Ok(wire(e))).await.is_err() {
                            return;
                        }
                    }
                }
                loop {
                    // Biased, not random: the same run polls in the same
                    // order (a simulation replays), and a busy feed cannot
                    // starve the shutdown and closed checks.
                    let received = tokio::select! {
                        biased;
                        _ = shutting_down.wait_for(|s| *s) => return,
                        _ = tx.closed() => return,
                        r = live.recv() => r,
                    };
                    match received {
                        Ok(e) if e.revision < next => continue,
                        Ok(e) if e.revision == next => {
                            next += 1;
                            if wanted(&e) && tx.send(Ok(wire(&e))).await.is_err() {
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
mod tests {
    use super::*;
    use crate::store::{Batch, MemoryStore, Store, Table};
    use futures::StreamExt;
    use std::sync::Arc;
    use tokio::sync::watch;

    #[tokio::test]
    async fn a_compacted_revision_answers_out_of_range() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut batch = Batch::default();
        for rev in 1..=10u64 {
            batch.put(Table::Outbox, rev.to_be_bytes().to_vec(), b"{}".to_vec());
        }
        store.commit(batch).unwrap();
        let removed = StoreState { store: store.as_ref() }.compact_outbox(6, 100).unwrap();
        assert_eq!(removed, 5);
        let (events, _) = broadcast::channel(4);
        let (_stop_tx, stop) = watch::channel(false);
        let feed = OutboxFeed {
            store: store.clone(),
            live: events.subscribe(),
            shutting_down: stop,
        };
        let mut stream = outbox_stream(feed, 3, |_| true, |e: &Event| e.revision, Span::none());
        let first = stream.next().await.expect("an answer");
        let status = first.expect_err("revision 3 was compacted");
        assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");
    }
}
