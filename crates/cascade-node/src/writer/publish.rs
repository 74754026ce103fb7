//! Publishing what failed commits left behind: the writer's half of the
//! outbox's published mark (`outbox::Published`).

use std::sync::Arc;

use tracing::{debug, info};

use super::WriterState;
use crate::codec::StoreState;

/// Events of failed commits that landed, sent on the live feed at most at
/// once ([`WriterState::publish_landed`]): a wake-up for the streams, which
/// read any others from the store.
const MAX_LANDED_PUBLISHED: usize = 4_096;

impl WriterState {
    /// Publishes the events below `upto` that no successful flush
    /// published: committed by a step whose commit or flush failed, they
    /// landed all the same (fjall recovers a batch whose journal write
    /// failed; a later flush writes sled's). Streams read the store only
    /// below the published mark, so they see these now, in order, and a
    /// stream that waits on the live feed is woken by them. At most
    /// `MAX_LANDED_PUBLISHED` events are sent on the feed; streams find
    /// the others in the store when the next event wakes them.
    pub(super) fn publish_landed(&self, upto: u64) {
        let from = self.ctx.published.below();
        if upto <= from {
            return;
        }
        let state = StoreState {
            store: self.ctx.store.as_ref(),
        };
        let count = usize::try_from(upto - from)
            .unwrap_or(usize::MAX)
            .min(MAX_LANDED_PUBLISHED);
        let landed = state.events_from(from, count);
        self.ctx.published.advance(upto);
        match landed {
            Ok(events) => {
                let events: Vec<_> = events.into_iter().filter(|e| e.revision < upto).collect();
                if !events.is_empty() {
                    info!(region = %self.ctx.region, events = events.len(), from, upto,
                        "events of commits that failed but landed are published");
                }
                for e in events {
                    let _ = self.ctx.events.send(Arc::new(e));
                }
            }
            Err(e) => debug!(error = %e, "landed events not read; streams read them from the store"),
        }
    }
}
