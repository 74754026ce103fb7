//! The outbox in the store: one row per commit (or a few, past
//! [`MAX_EVENTS_PER_OUTBOX_ROW`] or [`MAX_OUTBOX_ROW_BYTES`]), keyed by the
//! revision of the row's last event; how rows are written, read from any
//! revision, and compacted; and the floor below which events are gone.
//!
//! A row of one event is that event's value under its own revision, as
//! every row was before runs (issue 28: one key write per commit instead
//! of one per event); a row of several is a run ([`super::stored::EventRun`],
//! version byte [`super::VERSION_POSTCARD_V6`]). Both read as one sequence,
//! so a store written before runs needs no migration. A read from revision
//! r scans from r's key: the first row found is the one that holds r, or
//! the first above it when r is gone (compacted, or a gap the stream
//! reports), and only that row's events below r are passed over, by their
//! heads. Compaction removes whole rows, so the floor is always the first
//! revision of a row and a stream's check that a page starts exactly at
//! the revision it needs means what it did.

use cascade_core::model::{Event, EventType, Revision};

use super::records::{self, decode_keyed};
use super::{revision_key, Record, StoreState, VERSION_POSTCARD_V6};
use crate::store::{Batch, StoreError, Table};

/// The first revision still in the outbox (everything below was compacted).
const OUTBOX_FLOOR: &[u8] = b"outbox_floor";

/// The most events one outbox row holds: a commit with more writes more
/// rows. A read from a revision inside a row passes over the row's events
/// below it by their heads, and compaction keeps a row that straddles its
/// bound: both are bounded by this, at most half of a stream's page of
/// 512 events. A work step (512 referrer changes at most by default)
/// emits about one event per resource it deletes, so its events take a
/// row or three.
pub const MAX_EVENTS_PER_OUTBOX_ROW: usize = 256;

/// The most bytes of events one outbox row holds (its framing adds a few
/// bytes per event); one event larger than this is a row of its own. It
/// bounds what a read holds for one row. On PostgreSQL a value over about
/// 2 KB is compressed and kept out of line in chunks of about 2 KB
/// (TOAST): a full row is then about 33 chunk rows before compression,
/// where its events were up to 256 rows of their own. 256 DELETING events
/// with their snapshots (about 280 bytes each) are about 70 KiB, so on a
/// cascade the two limits meet; a few snapshots of large resources fill a
/// row before the count does.
pub const MAX_OUTBOX_ROW_BYTES: usize = 64 * 1024;

/// Outbox rows the first scan of a read asks for: enough for a page of
/// big rows (a few commits of a cascade), few for rows of one event,
/// whose average size the next scan then asks by.
const FIRST_OUTBOX_SCAN_ROWS: usize = 4;

/// Outbox rows one scan of a compaction reads (of the `limit` rows a call
/// may remove): at most 2 MiB of values at once.
const COMPACTION_SCAN_ROWS: usize = 32;

/// What a Watch filters an event on: its revision, its type and its
/// resource's name, and whether other regions are sent it
/// ([`EventHead::concerns_importers`]). Read from a stored event without
/// decoding the rest ([`StoreState::events_wanted`]), or taken from a
/// decoded one ([`EventHead::of`]), so that one filter serves both.
#[derive(Debug, Clone, Copy)]
pub struct EventHead<'a> {
    pub revision: Revision,
    pub event_type: EventType,
    /// The resource's name as stored (`{region}/{kind}/{id}`).
    pub resource: &'a str,
    cause: CauseOf<'a>,
}

/// Whether an event's `cause` is set: known once the event is decoded;
/// of a stored one, read from its value when asked, since it lies past
/// the snapshot.
#[derive(Debug, Clone, Copy)]
enum CauseOf<'a> {
    Known(bool),
    Stored(&'a [u8]),
}

impl<'a> EventHead<'a> {
    /// The head of an event already decoded (the live feed's).
    pub fn of(event: &'a Event) -> Self {
        Self {
            revision: event.revision,
            event_type: event.event_type,
            resource: event.resource.name.as_str(),
            cause: CauseOf::Known(event.cause.is_some()),
        }
    }

    /// [`Event::concerns_importers`], without decoding the event into the
    /// model: a stored PURGED's `cause` is read from its value in place
    /// (borrowed, no name parsed, nothing allocated but a snapshot's
    /// lists, and a leaf's PURGED has none). A peer's Watch passes over
    /// most of a cascade's events so (the PURGED of every leaf it purged),
    /// and decoded each whole to drop it (issue 28's P2). A value that
    /// does not decode says yes: the decode of the whole event that
    /// follows reports it.
    pub fn concerns_importers(&self) -> bool {
        if self.event_type != EventType::Purged {
            return self.event_type.concerns_importers();
        }
        let has_cause = match self.cause {
            CauseOf::Known(has_cause) => has_cause,
            CauseOf::Stored(value) => records::event_cause_is_set(value).unwrap_or(false),
        };
        self.event_type.concerns_importers_given_cause(has_cause)
    }

    /// The kind part of the resource's name.
    pub fn kind(&self) -> &'a str {
        self.resource.split('/').nth(1).unwrap_or_default()
    }
}

/// An entry of a filtered read of the outbox ([`StoreState::events_wanted`]).
#[derive(Debug)]
pub enum Listed {
    /// An event the filter wanted, decoded (boxed: a page is mostly
    /// passed entries, which need not each take an event's size).
    Event(Box<Event>),
    /// An event the filter passed over: its revision alone (a stream must
    /// still count it to see that the revisions it read are contiguous).
    Passed(Revision),
}

impl Listed {
    pub fn revision(&self) -> Revision {
        match self {
            Listed::Event(e) => e.revision,
            Listed::Passed(r) => *r,
        }
    }
}

/// The revision of a stored event: from its head, or from the whole
/// event when it is legacy JSON (which has no head to read apart).
fn revision_of(value: &[u8]) -> Result<Revision, StoreError> {
    Ok(match records::event_head(value)? {
        Some(head) => head.revision,
        None => decode_keyed::<Event>(Table::Outbox, &[], value)?.revision,
    })
}

/// Puts a step's events, in revision order, as outbox rows into `b`.
pub(super) fn put_events(b: &mut Batch, events: &[Event]) -> Result<(), StoreError> {
    // One row per commit, keyed by its last event's revision (more when
    // it passes a row's limits): a key write per commit, not per event.
    let mut row: Vec<Vec<u8>> = Vec::new();
    let mut row_bytes = 0;
    let mut last = 0;
    for e in events {
        let value = e.encode(Table::Outbox)?;
        if !row.is_empty() && (row.len() == MAX_EVENTS_PER_OUTBOX_ROW || row_bytes + value.len() > MAX_OUTBOX_ROW_BYTES)
        {
            b.put(
                Table::Outbox,
                revision_key(last),
                records::encode_outbox_row(std::mem::take(&mut row))?,
            );
            row_bytes = 0;
        }
        row_bytes += value.len();
        row.push(value);
        last = e.revision;
    }
    if !row.is_empty() {
        b.put(Table::Outbox, revision_key(last), records::encode_outbox_row(row)?);
    }
    Ok(())
}

impl StoreState<'_> {
    /// Events with revision >= `from`, at most `limit`. A read that ends
    /// inside a row (one commit's events) leaves the rest of it to the
    /// next read, which reads that row again and passes over what it took.
    pub fn events_from(&self, from: Revision, limit: usize) -> Result<Vec<Event>, StoreError> {
        let mut out = Vec::new();
        self.walk_outbox(from, limit, |value| {
            out.push(decode_keyed(Table::Outbox, &[], value)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// [`StoreState::events_from`] for a Watch: each event's head is read
    /// first and the event decoded only when `wanted` takes it; the others
    /// are listed by revision. A peer's Watch sends only the deletion
    /// events of a region whose outbox is mostly CREATED events, and read
    /// every one back whole to drop it (11.6 % of a cross-region create's
    /// instructions; docs/BENCHMARKS.md, "Decoding stored records").
    pub fn events_wanted(
        &self,
        from: Revision,
        limit: usize,
        wanted: &dyn Fn(&EventHead<'_>) -> bool,
    ) -> Result<Vec<Listed>, StoreError> {
        let mut out = Vec::new();
        self.walk_outbox(from, limit, |value| {
            out.push(match records::event_head(value)? {
                Some(head) => {
                    let revision = head.revision;
                    let seen = EventHead {
                        revision,
                        event_type: head.event_type.into(),
                        resource: &head.resource.name,
                        cause: CauseOf::Stored(value),
                    };
                    if wanted(&seen) {
                        Listed::Event(Box::new(decode_keyed(Table::Outbox, &[], value)?))
                    } else {
                        Listed::Passed(revision)
                    }
                }
                None => {
                    let event: Event = decode_keyed(Table::Outbox, &[], value)?;
                    if wanted(&EventHead::of(&event)) {
                        Listed::Event(Box::new(event))
                    } else {
                        Listed::Passed(event.revision)
                    }
                }
            });
            Ok(())
        })?;
        Ok(out)
    }

    /// Hands `visit` the stored value of each event with revision >=
    /// `from`, oldest first, at most `limit` of them. A row is keyed by
    /// the revision of its last event, so the first row at or after
    /// `from`'s key is the one that holds `from` (or the first above it,
    /// when `from` is gone): only its events below `from` are passed over,
    /// by their heads. Rows are scanned a few at a time, as many as the
    /// events still wanted take at the rows' size so far, so that a page of
    /// 512 events does not read 512 rows of a cascade's commits.
    fn walk_outbox(
        &self,
        from: Revision,
        limit: usize,
        mut visit: impl FnMut(&[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut after = from.checked_sub(1).map(revision_key);
        let (mut taken, mut rows_read, mut events_read) = (0usize, 0usize, 0usize);
        let mut skipping = true;
        while taken < limit {
            let left = limit - taken;
            let ask = match events_read.checked_div(rows_read) {
                None => left.min(FIRST_OUTBOX_SCAN_ROWS),
                Some(per_row) => left.div_ceil(per_row.max(1)),
            };
            let page = self.store.scan(Table::Outbox, &[], after.as_deref(), ask)?;
            for (_, row) in &page {
                rows_read += 1;
                for value in records::outbox_row_events(row)? {
                    events_read += 1;
                    if skipping {
                        // A row of one event is under its own revision,
                        // at or above `from`; only a run starts below it.
                        if matches!(row.first(), Some(&VERSION_POSTCARD_V6)) && revision_of(value)? < from {
                            continue;
                        }
                        skipping = false;
                    }
                    visit(value)?;
                    taken += 1;
                    if taken == limit {
                        return Ok(());
                    }
                }
            }
            match page.last() {
                Some((last, _)) if page.len() == ask => after = Some(last.clone()),
                _ => break,
            }
        }
        Ok(())
    }

    pub fn outbox_floor(&self) -> Result<Revision, StoreError> {
        self.counter(Table::Meta, OUTBOX_FLOOR, 1)
    }

    /// Removes the outbox rows whose events are all below `below` (at most
    /// `limit` rows per call; a row's key is its last event's revision) and
    /// raises the floor past them, to the first revision of the row after
    /// the last one removed: a row that straddles `below` stays whole, and
    /// its events below `below` with it. Returns how far the floor rose,
    /// the events removed.
    pub fn compact_outbox(&self, below: Revision, limit: usize) -> Result<usize, StoreError> {
        let floor = self.outbox_floor()?;
        if below <= floor {
            return Ok(0);
        }
        // From the floor, not the first key: everything below it was
        // removed, and on an LSM engine each removed key is a tombstone a
        // scan from the start would step over again (quadratic: 16 % of the
        // writer's CPU in a 1M cascade on fjall, `perf record`).
        let mut after = floor.checked_sub(1).map(revision_key);
        let mut batch = Batch::default();
        let mut new_floor = floor;
        // A few rows a scan: a scan returns the values with the keys, and a
        // batch of 1,000 rows of a cascade's commits read in one scan held
        // up to 64 MB at once (fjall's peak RSS in P1 flat at 100k rose
        // from 147 to 230 MB).
        'scan: while batch.len() < limit {
            let ask = (limit - batch.len()).min(COMPACTION_SCAN_ROWS);
            let rows = self.store.scan(Table::Outbox, &[], after.as_deref(), ask)?;
            let full = rows.len() == ask;
            for (k, _) in rows {
                let rev = u64::from_be_bytes(k.as_slice().try_into().map_err(|_| StoreError::Corrupt {
                    table: Table::Outbox.name(),
                    message: "outbox key is not 8 bytes".into(),
                })?);
                if rev >= below {
                    break 'scan;
                }
                after = Some(k.clone());
                batch.remove(Table::Outbox, k);
                new_floor = rev + 1;
            }
            if !full {
                break;
            }
        }
        if batch.is_empty() {
            return Ok(0);
        }
        let removed = usize::try_from(new_floor - floor).unwrap_or(usize::MAX);
        batch.put(Table::Meta, OUTBOX_FLOOR.to_vec(), new_floor.to_be_bytes().to_vec());
        // No flush of its own: the removal claims nothing durable (the
        // events are past the retention and every peer's acknowledgement,
        // and the floor moves in the same batch), so a crash that loses it
        // only keeps them a while longer, and the writer's next flush makes
        // it durable. A flush per batch was one fsync per 1,000 events,
        // which a cascade of a million paid about 900 times on sled.
        self.store.commit(batch)?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests;
