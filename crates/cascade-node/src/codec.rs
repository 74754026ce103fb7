//! How core records are laid out in the store: key encodings per table
//! (ordered so prefix scans answer the protocol's questions) and values.
//! [`StoreState`] is the core's `StateRead` over any [`Store`];
//! [`encode_writes`] turns a step's `WriteSet` into one atomic [`Batch`].
//!
//! A value is one version byte, then its body:
//!
//! - [`VERSION_POSTCARD_V1`] (`0x01`): postcard 1 of the record's storage
//!   type in [`stored`], which is the disk format (see there for how it may
//!   evolve). Everything this node writes but a work item, and a
//!   resource (or an event about one) that holds a lien.
//! - [`VERSION_POSTCARD_V2`] (`0x02`): the second layout of a storage type:
//!   the work item's (it gained its walk's position), the resource's
//!   and the event's (a resource's liens, written only when it has one, so
//!   every other resource keeps version 1's bytes), and the deletion
//!   record's (its finalizer failures, written only when a controller
//!   reported one), and the audit entry's (the principal's groups, how it
//!   proved itself, the node, the region it came through and the rule:
//!   every entry a node of issue 27 writes), and a back-reference row's
//!   (version 1 without the uids and the field its key holds, read back
//!   with the key: [`stored::BackRefV2`]). A record
//!   is decoded by its own version byte, so a store holding both opens
//!   without a migration.
//! - [`VERSION_POSTCARD_V3`] also names the third layout of a resource (a
//!   DELETED one's soft-delete window, [`stored::ResourceV3`]) and of an
//!   operation (its retention, [`stored::OperationV3`]);
//!   [`VERSION_POSTCARD_V4`] (`0x04`) the fourth of an event and a tombstone
//!   (the retention a DELETING event carries, [`stored::EventV4`],
//!   [`stored::RemoteDeletionV4`]); [`VERSION_POSTCARD_V2`] the second of an
//!   outcome (an unset's undo record, [`stored::OutcomeV2`]). Each is
//!   written only for a deletion with a retention (`codec/stored/soft.rs`).
//!   [`VERSION_POSTCARD_V4`] is also an operation's fourth layout, wrapping
//!   its third: its budget and controls (issue 29, [`stored::OperationV4`],
//!   `codec/stored/budget.rs`), written only for an operation that has them.
//! - [`VERSION_POSTCARD_V5`] (`0x05`): an operation's fifth layout, an
//!   undelete's (issue 29, [`stored::OperationV5`]), wrapping the fourth.
//! - A resource's row and an outcome's leave out the resource's name,
//!   which their key holds (issue 28, P4; `codec/stored/keyed.rs`), and
//!   read it back from the key: a resource row is [`VERSION_POSTCARD_V4`]
//!   ([`stored::ResourceV4`]: version 1 without the name) or, with a lien
//!   or a window, [`VERSION_POSTCARD_V5`] ([`stored::ResourceV5`]); an
//!   outcome row [`VERSION_POSTCARD_V3`] ([`stored::OutcomeV3`]) or, with
//!   an unset's undo record, [`VERSION_POSTCARD_V4`]
//!   ([`stored::OutcomeV4`]). Written for every such row; a resource or an
//!   outcome encoded on its own keeps its earlier layouts, which (and
//!   legacy JSON) still read, under a key of the name they hold only
//!   ([`Record::agrees_with_key`]: a row filed under another name is
//!   corruption). A node from before reads none of the new layouts: a
//!   downgrade across this change needs the store rebuilt.
//! - [`VERSION_POSTCARD_V6`] (`0x06`): an outbox row holding several
//!   events, one commit's (issue 28, [`stored::EventRun`]): each event's
//!   own value (one of the layouts above) after the other. Since it, the
//!   outbox has one row per commit (or a few, past
//!   [`MAX_EVENTS_PER_OUTBOX_ROW`] or [`MAX_OUTBOX_ROW_BYTES`]), keyed by
//!   the revision of the row's last event, not one row per event: a row of
//!   one event is that event's value under its own revision, exactly as
//!   every row was before, so a store holding both reads as one sequence.
//!   A node from before runs reads a store with none, and refuses a run as
//!   corrupt (`unknown value version byte 0x06`): going back to an older
//!   build after a commit of several events needs the outbox emptied first
//!   (its watchers then resync from the owner's listing, as after a
//!   compaction). How rows are read and compacted: `codec/outbox.rs`.
//! - `{` or `"`: no version byte, the whole value is the JSON of the core
//!   type, as nodes before the binary encoding wrote it (an object; a plain
//!   string for a name in the uid index). Read as it is, so a store from an
//!   earlier version opens without a migration; rows are rewritten in the
//!   binary form whenever a step writes them anyway.
//! - anything else: [`StoreError::Corrupt`], naming the table and the byte.

use cascade_core::error::StorageError;
use cascade_core::model::{
    BackRef, BackRefKey, DeletionRecord, DueOperation, DueWork, Operation, Outcome, PendingAttach, PendingRelease,
    RemoteDeletion, Resource, Revision, Timestamp, WorkItem,
};
use cascade_core::schema::OnDelete;
use cascade_core::state::StateRead;
use cascade_core::{OperationId, ResourceName, Uid};

use crate::store::{scan_from_floor, Batch, Entry, Prefetch, Store, StoreError, Table};
pub use audit_log::AuditPruned;
pub use encode::encode_writes;

mod audit_log;
mod encode;
mod outbox;
pub mod stored;
pub use outbox::{EventHead, Listed, MAX_EVENTS_PER_OUTBOX_ROW, MAX_OUTBOX_ROW_BYTES};
#[cfg(test)]
mod tests;

const NEXT_REVISION: &[u8] = b"next_revision";
/// The schema in force, in its stored form (`schema_in_force::stored_form`).
pub(crate) const SCHEMA_IN_FORCE: &[u8] = b"schema_in_force";

/// A row that does not decode, or an index entry without its row, is met
/// again by every scan that passes it: one line a window, with the count.
static UNDECODED_ROWS: crate::log_throttle::Throttle =
    crate::log_throttle::Throttle::new(crate::log_throttle::DEFAULT_WINDOW);
const GENERATION: &[u8] = b"generation";
/// Pending releases are grouped by the owner region they go to.
pub fn release_key(region: &str, k: &BackRefKey) -> Vec<u8> {
    let mut out = release_prefix(region);
    out.extend_from_slice(&backref_key(k));
    out
}

pub fn release_prefix(region: &str) -> Vec<u8> {
    let mut out = region.as_bytes().to_vec();
    out.push(0);
    out
}

pub fn backref_key(k: &BackRefKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + k.field.len());
    out.extend_from_slice(k.target.as_bytes());
    out.extend_from_slice(k.referrer.as_bytes());
    out.extend_from_slice(k.field.as_bytes());
    out
}

pub fn outcome_key(op: OperationId, name: &ResourceName) -> Vec<u8> {
    let mut out = op.0.as_bytes().to_vec();
    out.extend_from_slice(name.as_str().as_bytes());
    out
}

pub fn revision_key(r: Revision) -> Vec<u8> {
    r.to_be_bytes().to_vec()
}

/// The first byte of a value whose body is postcard 1 of its [`stored`] type.
pub const VERSION_POSTCARD_V1: u8 = 0x01;

/// The first byte of a value whose body is postcard 1 of the second layout
/// of its [`stored`] type. A work item has one (its walk's position,
/// [`stored::WorkItem`]), and a resource and an event (the liens of the
/// resource, [`stored::ResourceV2`], [`stored::EventV2`]), written only when
/// there is a lien, and a deletion record (its finalizer failures,
/// [`stored::DeletionRecordV2`]), written only when there is one; and a
/// back-reference row, without what its key holds ([`stored::BackRefV2`]),
/// written for every row. Every other record is written as version 1.
pub const VERSION_POSTCARD_V2: u8 = 0x02;

/// The first byte of a value whose body is postcard 1 of the third layout
/// of its [`stored`] type: the principal a deletion acts for, appended to
/// the deletion record ([`stored::DeletionRecordV3`]), the event
/// ([`stored::EventV3`]) and the tombstone ([`stored::RemoteDeletionV3`])
/// (the operation's, [`stored::OperationV2`], is its second layout).
/// Written only for a principal other than the anonymous one; every
/// earlier layout reads back as anonymous. It also names an outcome
/// row's third layout, without the resource's name its key holds
/// ([`stored::OutcomeV3`]), written for every outcome row.
pub const VERSION_POSTCARD_V3: u8 = 0x03;

/// The first byte of a value whose body is postcard 1 of the fourth
/// layout of its [`stored`] type: soft delete's retention appended to the
/// event ([`stored::EventV4`], with its snapshot's window) and the
/// tombstone ([`stored::RemoteDeletionV4`]). (The resource's window and the
/// operation's retention are their third layouts, [`stored::ResourceV3`]
/// and [`stored::OperationV3`]; an unset outcome's undo record its second,
/// [`stored::OutcomeV2`].) Written only for a deletion with a retention:
/// every record of one without keeps its bytes. It also names an
/// operation's fourth layout, which wraps the third: its controls (budget,
/// rate, pause, cancel: issue 29, [`stored::OperationV4`]), written only
/// for an operation that has them. And the resource row's fourth layout,
/// version 1 without the name its key holds ([`stored::ResourceV4`]), and
/// the outcome row's, the third with an undo record
/// ([`stored::OutcomeV4`]), written for every such row.
pub const VERSION_POSTCARD_V4: u8 = 0x04;

/// The first byte of a value whose body is postcard 1 of the fifth layout
/// of its [`stored`] type: an operation that is an undelete (issue 29,
/// [`stored::OperationV5`], `codec/stored/undelete.rs`), wrapping the
/// fourth. Written only for an undelete: every deletion keeps its bytes.
/// And the resource row's fifth layout, the fourth with the liens and
/// the window ([`stored::ResourceV5`]), written for a row that has either.
pub const VERSION_POSTCARD_V5: u8 = 0x05;

/// The first byte of an outbox row that holds a run of several events
/// ([`stored::EventRun`]): each event's own value after the other. No
/// record's own layout takes this byte, so a row's first byte tells a run
/// from a single event. Written for a commit of more than one event.
pub const VERSION_POSTCARD_V6: u8 = 0x06;

mod records;
#[cfg(test)]
use records::decode;
use records::decode_keyed;
pub use records::Record;

fn storage(e: StoreError) -> StorageError {
    StorageError(e.to_string())
}

/// Typed reads over a store.
pub struct StoreState<'a> {
    pub store: &'a dyn Store,
}

impl StoreState<'_> {
    /// The record under `key`, decoded from the store's loan of its value
    /// (`Store::get_in`: the memory engine's own bytes, no copy).
    fn get<T: Record>(&self, table: Table, key: &[u8]) -> Result<Option<T>, StoreError> {
        let mut decoded = None;
        self.store
            .get_in(table, key, &mut |value| decoded = Some(decode_keyed(table, key, value)))?;
        decoded.transpose()
    }

    /// Whether `key` has a value, which is not read.
    fn exists(&self, table: Table, key: &[u8]) -> Result<bool, StoreError> {
        let mut found = false;
        self.store.get_in(table, key, &mut |_| found = true)?;
        Ok(found)
    }

    /// Whether `table` has no key, as far as a scan of one from its floor
    /// (`scan_from_floor`) tells: the removed keys ahead of its first live
    /// one are passed about once, not once a question. Always false on a
    /// store that reads ahead (PostgreSQL): its point reads of a page's
    /// keys are answered from what one round trip fetched, where this scan
    /// would be a round trip of its own, so the keys are read as before.
    fn table_is_empty(&self, table: Table) -> Result<bool, StoreError> {
        if self.store.prefetches() {
            return Ok(false);
        }
        Ok(scan_from_floor(self.store, table, 1)?.is_empty())
    }

    /// Decoded entries of a prefix scan, decoded from the store's loans
    /// (`Store::scan_in`); the first that does not decode fails the scan.
    pub fn scan<T: Record>(
        &self,
        table: Table,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        let mut rows = Vec::new();
        let mut failed = None;
        self.store.scan_in(table, prefix, after, limit, &mut |key, value| {
            if failed.is_none() {
                match decode_keyed(table, key, value) {
                    Ok(row) => rows.push(row),
                    Err(e) => failed = Some(e),
                }
            }
        })?;
        failed.map_or(Ok(rows), Err)
    }

    /// A page of the whole back-reference table after the raw key `after`,
    /// and the raw key to continue after (None past the end). A row that
    /// does not decode is skipped with a warning: a round-robin walk must
    /// not stop at it for good.
    pub fn backref_page(
        &self,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<(Vec<BackRef>, Option<Vec<u8>>), StoreError> {
        let page = self.store.scan(Table::Backrefs, &[], after, limit)?;
        let last = page.last().map(|(k, _)| k.clone());
        let rows = page
            .into_iter()
            .filter_map(|(k, v)| match decode_keyed(Table::Backrefs, &k, &v) {
                Ok(row) => Some(row),
                Err(e) => {
                    if let Some(more) = UNDECODED_ROWS.admit() {
                        tracing::warn!(error = %e, suppressed = more.count(), "skipped a back-reference row that does not decode{more}");
                    }
                    None
                }
            })
            .collect();
        Ok((rows, last))
    }

    /// Reads ahead, in one go, what a deletion's walk reads of each
    /// referrer on a page of `target`'s back-references
    /// (`protocol/work.rs`, `apply_to_referrer`): the referrer by uid and
    /// by name, whether anything refers to it, its pending attach, its
    /// outcome in the deletion's operation, its deletion record and queue
    /// entry, and the page's rows in the blocking index (`encode_writes`
    /// reads it for every back-reference it removes). On a store over a
    /// network these are otherwise a round trip each, one after another,
    /// nearly all for keys that do not exist. A hint: a failure is left to
    /// the reads that follow, which report it.
    fn prefetch_referrers(&self, target: Uid, page: &[Entry], rows: &[BackRef]) {
        let mut reads = Prefetch::default();
        // The operation the outcomes are of, when the target is DELETING,
        // and only once it counted an unset referrer: the walk reads a
        // referrer's outcome only then (`bookkeeping::counted_as_unset`).
        // Read ahead always, a flat cascade on PostgreSQL sent a statement
        // of absent keys per page: 2 µs of the server per deleted leaf,
        // a tenth of its flushes' (docs/BENCHMARKS.md, "Outcomes read
        // ahead only when they can be read").
        let operation = match self.get_deletion(target) {
            Ok(deletion) => deletion.map(|d| d.operation).filter(|&operation| {
                // Unknown (a failed read): read ahead, as it is only a hint.
                self.get_operation(operation)
                    .map_or(true, |op| op.is_none_or(|op| op.progress.unset > 0))
            }),
            Err(_) => None,
        };
        for ((key, _), row) in page.iter().zip(rows) {
            let referrer = &row.referrer;
            reads.key(Table::BlockingBackrefs, key.clone());
            // Not its uid index entry: a walk reads a referrer by the name
            // its row gives (`Tx::incarnation`).
            reads.key(Table::Resources, referrer.name.as_str().as_bytes().to_vec());
            reads.key(Table::PendingAttach, referrer.uid.as_bytes().to_vec());
            reads.key(Table::Deletions, referrer.uid.as_bytes().to_vec());
            reads.key(Table::RetryQueue, referrer.uid.as_bytes().to_vec());
            if let Some(operation) = operation {
                reads.key(Table::Outcomes, outcome_key(operation, &referrer.name));
            }
            reads.prefix(Table::Backrefs, referrer.uid.as_bytes().to_vec());
        }
        if let Err(e) = self.store.prefetch(&reads) {
            tracing::debug!(error = %e, "a read-ahead of a back-reference page failed; its reads go one by one");
        }
    }

    pub fn get_resource(&self, name: &ResourceName) -> Result<Option<Resource>, StoreError> {
        self.get(Table::Resources, name.as_str().as_bytes())
    }

    pub fn get_deletion(&self, uid: Uid) -> Result<Option<DeletionRecord>, StoreError> {
        self.get(Table::Deletions, uid.as_bytes())
    }

    pub fn get_operation(&self, id: OperationId) -> Result<Option<Operation>, StoreError> {
        self.get(Table::Operations, id.0.as_bytes())
    }

    pub fn outcomes(
        &self,
        id: OperationId,
        after: Option<&ResourceName>,
        limit: usize,
    ) -> Result<Vec<Outcome>, StoreError> {
        let after = after.map(|n| outcome_key(id, n));
        self.scan(Table::Outcomes, id.0.as_bytes(), after.as_deref(), limit)
    }

    /// Whether this node saw the remote resource `uid` enter DELETING.
    pub fn remote_deletion_of(&self, uid: Uid) -> Result<bool, StoreError> {
        self.exists(Table::RemoteDeletions, uid.as_bytes())
    }

    pub fn uid_exists(&self, uid: Uid) -> Result<bool, StoreError> {
        self.exists(Table::UidIndex, uid.as_bytes())
    }

    fn counter(&self, table: Table, key: &[u8], default: u64) -> Result<u64, StoreError> {
        Ok(match self.store.get(table, key)? {
            Some(b) => u64::from_be_bytes(b.as_slice().try_into().map_err(|_| StoreError::Corrupt {
                table: table.name(),
                message: format!("{} is not 8 bytes", String::from_utf8_lossy(key)),
            })?),
            None => default,
        })
    }

    pub fn next_revision_stored(&self) -> Result<Revision, StoreError> {
        self.counter(Table::Meta, NEXT_REVISION, 1)
    }

    pub fn generation_stored(&self) -> Result<u64, StoreError> {
        self.counter(Table::Meta, GENERATION, 1)
    }

    /// Releases queued for `region`'s owner, oldest key first.
    /// Releases queued for `region`, in key order, after the key `after`
    /// ([`release_key`]) when given.
    pub fn pending_releases(
        &self,
        region: &str,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<PendingRelease>, StoreError> {
        self.scan(Table::PendingReleases, &release_prefix(region), after, limit)
    }

    /// Resources with cross-region references not yet confirmed by their owners.
    /// Unsettled cross-region creates, by uid, after the uid `after` when given.
    pub fn pending_attaches(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<PendingAttach>, StoreError> {
        self.scan(Table::PendingAttach, &[], after, limit)
    }

    pub fn get_pending_attach(&self, uid: Uid) -> Result<Option<PendingAttach>, StoreError> {
        self.get(Table::PendingAttach, uid.as_bytes())
    }

    pub fn get_backref(&self, key: &BackRefKey) -> Result<Option<BackRef>, StoreError> {
        self.get(Table::Backrefs, &backref_key(key))
    }

    /// The last revision of `region`'s outbox this node applied.
    pub fn cursor_of(&self, region: &str) -> Result<Revision, StoreError> {
        self.counter(Table::Cursors, region.as_bytes(), 0)
    }

    /// Every back-reference row of a target.
    pub fn backrefs_of(&self, target: Uid) -> Result<Vec<BackRef>, StoreError> {
        self.scan(Table::Backrefs, target.as_bytes(), None, usize::MAX)
    }

    pub fn cursors(&self) -> Result<Vec<(String, Revision)>, StoreError> {
        self.store
            .scan(Table::Cursors, &[], None, usize::MAX)?
            .into_iter()
            .map(|(k, v)| {
                let region = String::from_utf8(k).map_err(|e| StoreError::Corrupt {
                    table: Table::Cursors.name(),
                    message: e.to_string(),
                })?;
                let rev = u64::from_be_bytes(v.as_slice().try_into().map_err(|_| StoreError::Corrupt {
                    table: Table::Cursors.name(),
                    message: "cursor is not 8 bytes".into(),
                })?);
                Ok((region, rev))
            })
            .collect()
    }

    /// All rows of a table, decoded (the checker's dump; bounded by `limit`).
    pub fn all<T: Record>(&self, table: Table, limit: usize) -> Result<Vec<T>, StoreError> {
        self.scan(table, &[], None, limit)
    }

    pub fn count(&self, table: Table) -> Result<usize, StoreError> {
        Ok(self.store.scan(table, &[], None, usize::MAX)?.len())
    }

    /// Brings a store written by an older version of the node up to this
    /// one's layout, in one batch, before the writer starts. Version 2 added
    /// the indexes [`Table::DueIndex`] and [`Table::BlockingBackrefs`]: they
    /// are built from the retry queue and the back-references.
    pub fn upgrade(&self) -> Result<(), StoreError> {
        let version = self.counter(Table::Meta, LAYOUT_VERSION, 1)?;
        if version > LAYOUT {
            // A newer node wrote it: its records may not read as ours.
            return Err(StoreError::Corrupt {
                table: Table::Meta.name(),
                message: format!(
                    "the store has layout {version}, written by a newer node; this node reads up to layout {LAYOUT}"
                ),
            });
        }
        if version == LAYOUT {
            return Ok(());
        }
        let mut batch = Batch::default();
        for (k, _) in self.store.scan(Table::DueIndex, &[], None, usize::MAX)? {
            batch.remove(Table::DueIndex, k);
        }
        for (k, v) in self.store.scan(Table::RetryQueue, &[], None, usize::MAX)? {
            let w: WorkItem = decode_keyed(Table::RetryQueue, &k, &v)?;
            batch.put(Table::DueIndex, due_key(w.next_attempt_at, w.target.uid), Vec::new());
        }
        for (k, _) in self.store.scan(Table::BlockingBackrefs, &[], None, usize::MAX)? {
            batch.remove(Table::BlockingBackrefs, k);
        }
        for (k, v) in self.store.scan(Table::Backrefs, &[], None, usize::MAX)? {
            let row: BackRef = decode_keyed(Table::Backrefs, &k, &v)?;
            if row.on_delete == OnDelete::Block {
                batch.put(Table::BlockingBackrefs, k, Vec::new());
            }
        }
        tracing::info!(
            from = version,
            to = LAYOUT,
            queued = batch.len(),
            "upgrading the store layout"
        );
        batch.put(Table::Meta, LAYOUT_VERSION.to_vec(), LAYOUT.to_be_bytes().to_vec());
        self.store.commit(batch)?;
        self.store.flush()
    }

    /// The due time of `uid`'s queue entry as stored (before this step).
    fn stored_due(&self, uid: Uid) -> Result<Option<Timestamp>, StoreError> {
        Ok(self
            .get::<WorkItem>(Table::RetryQueue, uid.as_bytes())?
            .map(|w| w.next_attempt_at))
    }
}

/// The layout this node writes (see [`StoreState::upgrade`]).
const LAYOUT: u64 = 2;
const LAYOUT_VERSION: &[u8] = b"layout_version";

/// Due-index keys sort by due time, then uid.
fn due_key(due: Timestamp, uid: Uid) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&due.0.to_be_bytes());
    out.extend_from_slice(uid.as_bytes());
    out
}

/// The due time and uid a due-index key names.
fn parse_due_key(key: &[u8]) -> Result<(Timestamp, Uid), StoreError> {
    let corrupt = || StoreError::Corrupt {
        table: Table::DueIndex.name(),
        message: format!("a key of {} bytes, not 24", key.len()),
    };
    let (due, uid) = key.split_at_checked(8).ok_or_else(corrupt)?;
    let due = u64::from_be_bytes(due.try_into().map_err(|_| corrupt())?);
    let uid = uuid::Uuid::from_slice(uid).map_err(|_| corrupt())?;
    Ok((Timestamp(due), Uid(uid)))
}

/// A due-index entry's value: whose operation the entry works for, so that
/// a work step's window (many more entries than it takes) is one scan, not
/// a read of each entry's deletion record (on a tree cascade of 1M, two
/// reads per entry of a 1,024-entry window, every step: docs/BENCHMARKS.md,
/// "A work step's window from the due index alone"). A tag byte, then the
/// operation's 16 bytes: [`DUE_OPERATION`] and the id, or [`DUE_NO_OPERATION`].
/// An empty value (an older node's) says nothing ([`DueOperation::Unrecorded`]).
fn due_value(operation: Option<OperationId>) -> Vec<u8> {
    match operation {
        Some(op) => {
            let mut out = Vec::with_capacity(17);
            out.push(DUE_OPERATION);
            out.extend_from_slice(op.0.as_bytes());
            out
        }
        None => vec![DUE_NO_OPERATION],
    }
}

/// A due-index value's tag: an operation's id follows.
const DUE_OPERATION: u8 = 1;
/// A due-index value's tag: the entry works for no operation.
const DUE_NO_OPERATION: u8 = 0;

/// What a due-index value says (see [`due_value`]). Anything it cannot
/// read says nothing: the step then reads the records, as for an entry
/// an older node wrote.
fn parse_due_value(value: &[u8]) -> DueOperation {
    match value {
        [DUE_NO_OPERATION] => DueOperation::Recorded(None),
        [DUE_OPERATION, id @ ..] => match uuid::Uuid::from_slice(id) {
            Ok(id) => DueOperation::Recorded(Some(OperationId(id))),
            Err(_) => DueOperation::Unrecorded,
        },
        _ => DueOperation::Unrecorded,
    }
}

impl StateRead for StoreState<'_> {
    fn resource(&self, name: &ResourceName) -> Result<Option<Resource>, StorageError> {
        self.get_resource(name).map_err(storage)
    }
    fn name_of(&self, uid: Uid) -> Result<Option<ResourceName>, StorageError> {
        self.get(Table::UidIndex, uid.as_bytes()).map_err(storage)
    }
    fn backrefs(&self, target: Uid, after: Option<&BackRefKey>, limit: usize) -> Result<Vec<BackRef>, StorageError> {
        let after = after.map(backref_key);
        if !self.store.prefetches() {
            // Nothing to read ahead: the rows decode from the store's loans.
            return self
                .scan(Table::Backrefs, target.as_bytes(), after.as_deref(), limit)
                .map_err(storage);
        }
        let page = self
            .store
            .scan(Table::Backrefs, target.as_bytes(), after.as_deref(), limit)
            .map_err(storage)?;
        let rows = page
            .iter()
            .map(|(k, v)| decode_keyed::<BackRef>(Table::Backrefs, k, v))
            .collect::<Result<Vec<_>, _>>()
            .map_err(storage)?;
        // A page of a walk (not a check that any row exists, limit 1):
        // what acting on each referrer reads.
        if limit > 1 && !rows.is_empty() {
            self.prefetch_referrers(target, &page, &rows);
        }
        Ok(rows)
    }
    fn backref(&self, key: &BackRefKey) -> Result<Option<BackRef>, StorageError> {
        self.get(Table::Backrefs, &backref_key(key)).map_err(storage)
    }
    fn blocking_backrefs(&self, target: Uid, limit: usize) -> Result<Vec<BackRef>, StorageError> {
        let keys = self
            .store
            .scan(Table::BlockingBackrefs, target.as_bytes(), None, limit)
            .map_err(storage)?;
        let mut out = Vec::with_capacity(keys.len());
        for (key, _) in keys {
            match self.get::<BackRef>(Table::Backrefs, &key).map_err(storage)? {
                Some(row) if row.on_delete == OnDelete::Block => out.push(row),
                // Written in one batch with the row; never expected.
                _ => {
                    if let Some(more) = UNDECODED_ROWS.admit() {
                        tracing::warn!(target = %target, suppressed = more.count(), "skipped a blocking-index entry without its block row{more}");
                    }
                }
            }
        }
        Ok(out)
    }
    fn deletion(&self, uid: Uid) -> Result<Option<DeletionRecord>, StorageError> {
        self.get_deletion(uid).map_err(storage)
    }
    fn operation(&self, id: OperationId) -> Result<Option<Operation>, StorageError> {
        self.get_operation(id).map_err(storage)
    }
    fn work(&self, uid: Uid) -> Result<Option<WorkItem>, StorageError> {
        self.get(Table::RetryQueue, uid.as_bytes()).map_err(storage)
    }
    fn outcome(&self, op: OperationId, name: &ResourceName) -> Result<Option<Outcome>, StorageError> {
        self.get(Table::Outcomes, &outcome_key(op, name)).map_err(storage)
    }
    fn due_work(&self, now: Timestamp, limit: usize) -> Result<Vec<DueWork>, StorageError> {
        // The index is in due order: read up to the first entry not yet due.
        // From its floor, not its first key: every step removes or moves
        // later the entries it processed, and on fjall each removed one
        // stays a tombstone that a scan from the first key passed again on
        // every later step (quadratic in the deletions of a cascade: P1
        // unset, issue 28; `tests/tombstones.rs`). The index alone: a step
        // looks at many more entries than it takes, and reads the queue
        // entry only of those it takes (`protocol::process_work_until`).
        let mut out = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        while out.len() < limit {
            let page = match &after {
                None => scan_from_floor(self.store, Table::DueIndex, limit - out.len()),
                Some(after) => self.store.scan(Table::DueIndex, &[], Some(after), limit - out.len()),
            }
            .map_err(storage)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            for (key, value) in page {
                let (due, uid) = parse_due_key(&key).map_err(storage)?;
                if due > now {
                    return Ok(out);
                }
                out.push(DueWork {
                    uid,
                    operation: parse_due_value(&value),
                });
            }
        }
        Ok(out)
    }
    fn next_revision(&self) -> Result<Revision, StorageError> {
        self.next_revision_stored().map_err(storage)
    }
    fn remote_deletion(&self, uid: Uid) -> Result<Option<RemoteDeletion>, StorageError> {
        self.get(Table::RemoteDeletions, uid.as_bytes()).map_err(storage)
    }
    fn pending_attach(&self, uid: Uid) -> Result<Option<PendingAttach>, StorageError> {
        self.get_pending_attach(uid).map_err(storage)
    }
    fn any_pending_attach(&self) -> Result<bool, StorageError> {
        self.table_is_empty(Table::PendingAttach)
            .map(|empty| !empty)
            .map_err(storage)
    }
    fn remote_deletions(&self) -> Result<Vec<RemoteDeletion>, StorageError> {
        self.all(Table::RemoteDeletions, usize::MAX).map_err(storage)
    }
    fn pending_release(&self, region: &str, key: &BackRefKey) -> Result<Option<PendingRelease>, StorageError> {
        self.get(Table::PendingReleases, &release_key(region, key))
            .map_err(storage)
    }
    fn cursor(&self, region: &str) -> Result<Revision, StorageError> {
        self.counter(Table::Cursors, region.as_bytes(), 0).map_err(storage)
    }
    fn generation(&self) -> Result<u64, StorageError> {
        self.generation_stored().map_err(storage)
    }
}
