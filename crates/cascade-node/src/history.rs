//! A resource's history (`Resources.GetHistory`): its events found in
//! this region's outbox, a page at a time, newest first; what each means
//! is the core's (`cascade_core::history`).
//!
//! The outbox is keyed by revision alone, so a page walks a span of
//! revisions below where the last page stopped and keeps the resource's
//! events: at most [`HISTORY_SPAN`] revisions a page, so one call's work is
//! bounded whatever the outbox's size, and a page may hold fewer events
//! than asked (its token goes on below the span). Events below the
//! outbox's floor were compacted: a page that reaches the floor says so.

use cascade_core::history::{entries, HistoryEntry};
use cascade_core::model::{Event, Revision};
use cascade_core::ResourceName;

use crate::error::Fault;
use crate::node::Node;

/// Events a page holds when the caller names no size.
pub(crate) const HISTORY_PAGE_DEFAULT: usize = 50;
/// The most events a page may hold.
pub(crate) const MAX_HISTORY_PAGE: usize = 200;
/// The most revisions one page examines.
pub(crate) const HISTORY_SPAN: u64 = 20_000;
/// Outbox events read from the store at a time.
const SCAN_CHUNK: usize = 1_000;

/// One page of a history.
#[derive(Debug)]
pub(crate) struct HistoryPage {
    /// Newest first.
    pub entries: Vec<HistoryEntry>,
    /// Where the next page starts (its events are below this revision);
    /// None: no older event is kept.
    pub next_before: Option<Revision>,
    /// Events below this revision were compacted (None: none ever were).
    pub compacted_before: Option<Revision>,
}

impl Node {
    /// The events of `name` below revision `before` (None: the newest),
    /// at most `page_size` of them, newest first.
    pub(crate) fn history(
        &self,
        name: &ResourceName,
        before: Option<Revision>,
        page_size: usize,
    ) -> Result<HistoryPage, Fault> {
        let state = self.state();
        let floor = state.outbox_floor()?;
        let upper = match before {
            Some(before) => before,
            None => state.next_revision_stored()?,
        };
        let lower = floor.max(upper.saturating_sub(HISTORY_SPAN));
        // The page's events and the one just before them (to tell what an
        // update did to the references), oldest first.
        let keep = page_size + 1;
        let mut found: std::collections::VecDeque<Event> = std::collections::VecDeque::with_capacity(keep);
        let mut from = lower;
        'scan: while from < upper {
            let chunk = state.events_from(from, SCAN_CHUNK)?;
            let Some(last) = chunk.last() else { break };
            from = last.revision + 1;
            for event in chunk {
                if event.revision >= upper {
                    break 'scan;
                }
                if event.resource.name == *name {
                    if found.len() == keep {
                        found.pop_front();
                    }
                    found.push_back(event);
                }
            }
        }
        let found = Vec::from(found);
        let (before_page, page) = match found.split_first() {
            Some((first, rest)) if found.len() == keep => (Some(first), rest),
            _ => (None, found.as_slice()),
        };
        let next_before = if before_page.is_some() {
            page.first().map(|e| e.revision)
        } else {
            (lower > floor).then_some(lower)
        };
        Ok(HistoryPage {
            entries: entries(before_page, page),
            next_before,
            compacted_before: (floor > 1).then_some(floor),
        })
    }
}
