//! Streaming the outbox from a revision: replay what is durable, then follow
//! the live feed, going back to the store whenever the feed skips ahead (the
//! receiver lagged). Used by the client `Watch` and the peers' `Watch`.

use std::sync::Arc;

use cascade_core::model::{Event, Revision};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tracing::{debug, Instrument, Span};

use crate::codec::StoreState;
use crate::store::Store;

/// Where a stream reads from and when it must stop.
pub struct OutboxFeed {
    pub store: Arc<dyn Store>,
    /// Subscribed before the replay starts, so nothing falls in between.
    pub live: broadcast::Receiver<Arc<Event>>,
    pub shutting_down: watch::Receiver<bool>,
}

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
            let mut next = from.max(1);
            loop {
                loop {
                    let page = match (StoreState { store: store.as_ref() }).events_from(next, 512) {
                        Ok(p) => p,
                        Err(e) => {
                            let _ = tx.send(Err(Status::unavailable(e.to_string()))).await;
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
                    let received = tokio::select! {
                        r = live.recv() => r,
                        _ = shutting_down.wait_for(|s| *s) => return,
                        _ = tx.closed() => return,
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
