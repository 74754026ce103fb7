//! How the protocol sees and changes state without doing IO.
//!
//! The node implements [`StateRead`] over its store; a step of the protocol
//! reads through a [`Tx`] (the snapshot plus the step's own writes, so later
//! reads of the step see earlier ones) and ends with a [`WriteSet`]: the
//! final value of every key it touched and the events it emits. The node
//! commits a write set in one atomic transaction. A target's
//! back-references are walked a page at a time with [`BackRefPages`].
//!
//! Architecture invariant: reads through `StateRead` and the commit of the
//! resulting `WriteSet` are not interleaved with any other write to the same
//! node. The node guarantees it with a single writer.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use crate::error::StorageError;
use crate::model::{
    AuditEntry, BackRef, BackRefKey, DeletionRecord, DueWork, Event, Operation, Outcome, PendingAttach, PendingRelease,
    RefTarget, RemoteDeletion, Resource, ResourceState, Revision, Timestamp, WorkItem,
};
use crate::name::{OperationId, ResourceName, Uid};
use crate::schema::OnDelete;

/// Read access to one node's durable state.
pub trait StateRead {
    /// The resource stored under `name`, in any state.
    fn resource(&self, name: &ResourceName) -> Result<Option<Resource>, StorageError>;
    /// The name of the incarnation with this uid (the uid index), if it still exists.
    fn name_of(&self, uid: Uid) -> Result<Option<ResourceName>, StorageError>;
    /// Back-references of `target`, in key order, after `after` (exclusive),
    /// at most `limit`, and fewer only when no row follows: a walk ends at
    /// a page shorter than it asked for ([`BackRefPages`]).
    fn backrefs(&self, target: Uid, after: Option<&BackRefKey>, limit: usize) -> Result<Vec<BackRef>, StorageError>;
    /// One back-reference row.
    fn backref(&self, key: &BackRefKey) -> Result<Option<BackRef>, StorageError>;
    /// The `block` back-references of `target`, in key order, at most
    /// `limit`: what refuses a delete of it. This default walks every row
    /// of the target; a store keeps an index instead, so that accepting a
    /// delete with cascade does not read a million referrers first.
    fn blocking_backrefs(&self, target: Uid, limit: usize) -> Result<Vec<BackRef>, StorageError> {
        let mut out = Vec::new();
        let mut after: Option<BackRefKey> = None;
        while out.len() < limit {
            let page = self.backrefs(target, after.as_ref(), 1024)?;
            let Some(last) = page.last() else { break };
            after = Some(last.key());
            out.extend(page.into_iter().filter(|b| b.on_delete == OnDelete::Block));
        }
        out.truncate(limit);
        Ok(out)
    }
    /// The deletion record of a DELETING resource.
    fn deletion(&self, uid: Uid) -> Result<Option<DeletionRecord>, StorageError>;
    /// This region's part of an operation.
    fn operation(&self, id: OperationId) -> Result<Option<Operation>, StorageError>;
    /// The retry-queue entry of a DELETING resource.
    fn work(&self, uid: Uid) -> Result<Option<WorkItem>, StorageError>;
    /// What an operation last recorded for a resource.
    fn outcome(&self, op: OperationId, name: &ResourceName) -> Result<Option<Outcome>, StorageError>;
    /// Up to `limit` queue entries whose `next_attempt_at <= now`, in due
    /// order, as the due index lists them (no entry read).
    fn due_work(&self, now: Timestamp, limit: usize) -> Result<Vec<DueWork>, StorageError>;
    /// The revision the next event gets.
    fn next_revision(&self) -> Result<Revision, StorageError>;
    /// The tombstone of a remote resource seen entering DELETING.
    fn remote_deletion(&self, uid: Uid) -> Result<Option<RemoteDeletion>, StorageError>;
    /// The unconfirmed cross-region attaches of a local resource.
    fn pending_attach(&self, uid: Uid) -> Result<Option<PendingAttach>, StorageError>;
    /// Whether any local resource has unconfirmed cross-region attaches.
    /// A step asks it once and, told no, answers [`Self::pending_attach`]
    /// from its own writes alone: every purged resource asks for its
    /// pending attach, nearly always of an empty table, and on sled that
    /// read was a tenth of the writer's time in a flat cascade
    /// (docs/BENCHMARKS.md, "Reads of empty tables"). A state that cannot
    /// tell cheaply answers true, and every read goes to it as before.
    fn any_pending_attach(&self) -> Result<bool, StorageError> {
        Ok(true)
    }
    /// Every tombstone of a remote resource this node holds.
    fn remote_deletions(&self) -> Result<Vec<RemoteDeletion>, StorageError>;
    /// The release of `key` queued for the owner `region`, if any.
    fn pending_release(&self, region: &str, key: &BackRefKey) -> Result<Option<PendingRelease>, StorageError>;
    /// The last revision of `region`'s outbox this node applied.
    fn cursor(&self, region: &str) -> Result<Revision, StorageError>;
    /// This node's release generation (see [`crate::model::BackRef::generation`]).
    fn generation(&self) -> Result<u64, StorageError>;
}

/// Everything one step writes: final values per key (None = delete) and the
/// events, in revision order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WriteSet {
    /// Resources put or removed.
    pub resources: BTreeMap<ResourceName, Option<Resource>>,
    /// Uid index entries, kept in step with `resources`.
    pub uid_index: BTreeMap<Uid, Option<ResourceName>>,
    /// Back-reference rows attached or dropped.
    pub backrefs: BTreeMap<BackRefKey, Option<BackRef>>,
    /// Deletion records written or removed (at purge).
    pub deletions: BTreeMap<Uid, Option<DeletionRecord>>,
    /// Operation parts written (never removed by a step).
    pub operations: BTreeMap<OperationId, Option<Operation>>,
    /// Outcomes recorded (only ever overwritten, never removed).
    pub outcomes: BTreeMap<(OperationId, ResourceName), Outcome>,
    /// Retry-queue entries scheduled or removed.
    pub work: BTreeMap<Uid, Option<WorkItem>>,
    /// Events to append to the outbox, with their revisions assigned.
    pub events: Vec<Event>,
    /// Set when events were appended.
    pub next_revision: Option<Revision>,
    /// Tombstones of remote resources added or removed.
    pub remote_deletions: BTreeMap<Uid, Option<RemoteDeletion>>,
    /// (owner region, key) → release to send.
    pub pending_releases: BTreeMap<(String, BackRefKey), Option<PendingRelease>>,
    /// Region → last applied revision of its outbox.
    pub cursors: BTreeMap<String, Revision>,
    /// CREATING resources whose cross-region attach is not settled yet.
    pub pending_attach: BTreeMap<Uid, Option<PendingAttach>>,
    /// The next release generation, when the step took one.
    pub generation: Option<u64>,
    /// Audit log entries appended (administrative actions).
    pub audit: Vec<AuditEntry>,
    /// The schema put in force, in its stored form (issue 31: a reload
    /// stores it in the batch of its audit entry, so a restart finds the
    /// schema the region's data was last checked against).
    pub schema_in_force: Option<String>,
    /// The state the snapshot held for each resource this step put or
    /// removed, where the step read it before writing it (not a key
    /// write: the node's metrics count resources by state from it, so it
    /// need not read and decode again what the step has just read; a
    /// resource missing here is read back from the store).
    pub stored_states: BTreeMap<ResourceName, ResourceState>,
}

impl WriteSet {
    /// Whether the step changed nothing (the node then skips the commit).
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
            && self.uid_index.is_empty()
            && self.backrefs.is_empty()
            && self.deletions.is_empty()
            && self.operations.is_empty()
            && self.outcomes.is_empty()
            && self.work.is_empty()
            && self.events.is_empty()
            && self.remote_deletions.is_empty()
            && self.pending_releases.is_empty()
            && self.cursors.is_empty()
            && self.pending_attach.is_empty()
            && self.generation.is_none()
            && self.audit.is_empty()
            && self.schema_in_force.is_none()
    }

    /// Number of keys written: the unit of the storage cost of a step.
    pub fn key_writes(&self) -> usize {
        self.resources.len()
            + self.uid_index.len()
            + self.backrefs.len()
            + self.deletions.len()
            + self.operations.len()
            + self.outcomes.len()
            + self.work.len()
            + self.events.len()
            + usize::from(self.next_revision.is_some())
            + self.remote_deletions.len()
            + self.pending_releases.len()
            + self.cursors.len()
            + self.pending_attach.len()
            + usize::from(self.generation.is_some())
            + self.audit.len()
            + usize::from(self.schema_in_force.is_some())
    }
}

/// A snapshot with the pending writes of one step laid over it.
pub struct Tx<'s, S: StateRead + ?Sized> {
    base: &'s S,
    writes: WriteSet,
    next_revision: Option<Revision>,
    /// Uids of the resources this step read from the snapshot: their uid
    /// index entry is stored and names them (the store keeps the two in
    /// step; the invariant checker's `uid_index` check), so writing one of
    /// them back under its name need not rewrite the entry (an unset
    /// referrer and a member entering DELETING each spared a key write).
    /// With the state each was read in, for [`WriteSet::stored_states`].
    indexed: RefCell<BTreeMap<Uid, ResourceState>>,
    /// [`StateRead::any_pending_attach`] of `base`, once asked: the
    /// snapshot does not change under a step.
    base_has_pending_attaches: Cell<Option<bool>>,
}

macro_rules! overlay_get {
    ($self:ident, $map:ident, $key:expr, $base:expr) => {
        match $self.writes.$map.get($key) {
            Some(v) => Ok(v.clone()),
            None => $base,
        }
    };
}

impl<'s, S: StateRead + ?Sized> Tx<'s, S> {
    /// A step over the snapshot `base`, with nothing written yet.
    pub fn new(base: &'s S) -> Self {
        Self {
            base,
            writes: WriteSet::default(),
            next_revision: None,
            indexed: RefCell::new(BTreeMap::new()),
            base_has_pending_attaches: Cell::new(None),
        }
    }

    /// Ends the step: its writes, to be committed as one batch.
    pub fn finish(mut self) -> WriteSet {
        self.writes.next_revision = self.next_revision;
        self.writes
    }

    /// The step's writes so far, without ending it (a dry run reports them
    /// and then drops the `Tx`, so nothing is committed).
    pub fn pending_writes(&self) -> &WriteSet {
        &self.writes
    }

    /// The resource under `name`, as this step left it.
    pub fn resource(&self, name: &ResourceName) -> Result<Option<Resource>, StorageError> {
        match self.writes.resources.get(name) {
            Some(v) => Ok(v.clone()),
            None => {
                let stored = self.base.resource(name)?;
                if let Some(r) = &stored {
                    self.indexed.borrow_mut().insert(r.uid, r.state);
                }
                Ok(stored)
            }
        }
    }

    /// The resource with this uid, if that incarnation still exists.
    pub fn resource_by_uid(&self, uid: Uid) -> Result<Option<Resource>, StorageError> {
        let name = match self.writes.uid_index.get(&uid) {
            Some(v) => v.clone(),
            None => self.base.name_of(uid)?,
        };
        let Some(name) = name else { return Ok(None) };
        Ok(self.resource(&name)?.filter(|r| r.uid == uid))
    }

    /// The incarnation `t` names, if it still exists: read by its name and
    /// kept only if the uid is the one named. A uid names one resource,
    /// under one name, for ever, so this is [`Tx::resource_by_uid`]
    /// without the read of the uid index (a back-reference row names its
    /// referrer both ways: a cascade's walk reads each referrer this way).
    pub fn incarnation(&self, t: &RefTarget) -> Result<Option<Resource>, StorageError> {
        let found = self.resource(&t.name)?.filter(|r| r.uid == t.uid);
        // The check's own read may fail where the step's succeeded (sled,
        // once a write failed on a full disk, refuses a read that must first
        // split a leaf): that is the store in trouble, not a disagreement,
        // and the step itself does not make that read. Taken for one, it
        // panicked a debug build's writer in every incarnation, and the node
        // never retried its store (`tests/failing_reads.rs`; the node's in
        // `faults::disk_full::a_cascade_cut_by_a_full_disk_on_a_store_that_also_refuses_reads_finishes_once_the_disk_is_freed`).
        debug_assert!(
            self.resource_by_uid(t.uid)
                .map_or(true, |by_uid| by_uid.as_ref() == found.as_ref()),
            "{} read by name and by uid disagree",
            t.name
        );
        Ok(found)
    }

    /// Whether this step wrote (created or changed) the resource `name`.
    pub fn is_written(&self, name: &ResourceName) -> bool {
        self.writes.resources.get(name).is_some_and(Option::is_some)
    }

    /// Writes a resource, and its uid index entry unless the store already
    /// holds that entry unchanged (a resource read from the snapshot and
    /// written back under its name: an update).
    pub fn put_resource(&mut self, r: Resource) {
        let read_as = self.indexed.get_mut().get(&r.uid).copied();
        let stored_entry = read_as.is_some() && !self.writes.uid_index.contains_key(&r.uid);
        if !stored_entry {
            self.writes.uid_index.insert(r.uid, Some(r.name.clone()));
        }
        let name = r.name.clone();
        self.write_resource(name, Some(r), read_as);
    }

    /// Removes a resource and its uid index entry (a purge).
    pub fn remove_resource(&mut self, name: &ResourceName, uid: Uid) {
        let read_as = self.indexed.get_mut().get(&uid).copied();
        self.writes.uid_index.insert(uid, None);
        self.write_resource(name.clone(), None, read_as);
    }

    /// Writes the final value of `name`, and at the step's first write of
    /// it keeps the snapshot's state when the step read it (`read_as`: the
    /// state its uid was read in; a uid names one incarnation, so one
    /// name). One search of the step's resources for both (a cascade
    /// writes one resource per member).
    fn write_resource(&mut self, name: ResourceName, value: Option<Resource>, read_as: Option<ResourceState>) {
        use std::collections::btree_map::Entry;
        match self.writes.resources.entry(name) {
            Entry::Vacant(first) => {
                if let Some(state) = read_as {
                    self.writes.stored_states.insert(first.key().clone(), state);
                }
                first.insert(value);
            }
            Entry::Occupied(mut again) => {
                again.insert(value);
            }
        }
    }

    /// Back-references of `target` after `after`, up to `limit`, merged
    /// with this step's own attaches and drops.
    pub fn backrefs(
        &self,
        target: Uid,
        after: Option<&BackRefKey>,
        limit: usize,
    ) -> Result<Vec<BackRef>, StorageError> {
        let overlay: Vec<(&BackRefKey, &Option<BackRef>)> = self.overlay_backrefs_after(target, after).collect();
        // Ask the base for enough rows that overlay deletions cannot starve the page.
        let mut base = self.base.backrefs(target, after, limit.saturating_add(overlay.len()))?;
        if overlay.is_empty() {
            // Nothing of this step's own past the position (a walk's next
            // page; whether a leaf has any referrer): the base's rows are
            // the answer, without a map of them to merge into.
            base.truncate(limit);
            return Ok(base);
        }
        let mut merged: BTreeMap<BackRefKey, BackRef> = base.into_iter().map(|b| (b.key(), b)).collect();
        for (k, v) in overlay {
            match v {
                Some(b) => merged.insert(k.clone(), b.clone()),
                None => merged.remove(k),
            };
        }
        Ok(merged.into_values().take(limit).collect())
    }

    /// This step's writes of `target`'s back-references. The overlay is
    /// ordered by target first: only this target's rows are visited (a step
    /// may hold hundreds of other targets' rows).
    fn overlay_backrefs(&self, target: Uid) -> impl Iterator<Item = (&BackRefKey, &Option<BackRef>)> {
        self.overlay_backrefs_after(target, None)
    }

    /// This step's writes of `target`'s back-references after the key
    /// `after` (all of them when `None`). A walk removes every row it acts
    /// on, so starting at the position, not at the target's first key,
    /// spares each page a pass over the rows earlier pages removed.
    fn overlay_backrefs_after<'a>(
        &'a self,
        target: Uid,
        after: Option<&BackRefKey>,
    ) -> impl Iterator<Item = (&'a BackRefKey, &'a Option<BackRef>)> {
        use std::ops::Bound;
        let start = match after {
            // (A position past this target's rows leaves none.)
            Some(a) if a.target >= target => Bound::Excluded(a.clone()),
            _ => Bound::Included(BackRefKey {
                target,
                referrer: Uid(uuid::Uuid::nil()),
                field: String::new(),
            }),
        };
        self.writes
            .backrefs
            .range((start, Bound::Unbounded))
            .take_while(move |(k, _)| k.target == target)
    }

    /// The `block` back-references of `target`, as this step left them.
    pub fn blocking_backrefs(&self, target: Uid, limit: usize) -> Result<Vec<BackRef>, StorageError> {
        let overlay: Vec<_> = self.overlay_backrefs(target).collect();
        let base = self
            .base
            .blocking_backrefs(target, limit.saturating_add(overlay.len()))?;
        let mut merged: BTreeMap<BackRefKey, BackRef> = base.into_iter().map(|b| (b.key(), b)).collect();
        for (k, v) in overlay {
            match v {
                Some(b) if b.on_delete == OnDelete::Block => merged.insert(k.clone(), b.clone()),
                _ => merged.remove(k),
            };
        }
        Ok(merged.into_values().take(limit).collect())
    }

    /// One back-reference row, as this step left it.
    pub fn backref(&self, key: &BackRefKey) -> Result<Option<BackRef>, StorageError> {
        overlay_get!(self, backrefs, key, self.base.backref(key))
    }

    /// Attaches (or rewrites) a back-reference row.
    pub fn put_backref(&mut self, b: BackRef) {
        self.writes.backrefs.insert(b.key(), Some(b));
    }

    /// Drops a back-reference row.
    pub fn remove_backref(&mut self, key: BackRefKey) {
        self.writes.backrefs.insert(key, None);
    }

    /// The deletion record of `uid`, as this step left it.
    pub fn deletion(&self, uid: Uid) -> Result<Option<DeletionRecord>, StorageError> {
        match self.writes.deletions.get(&uid) {
            Some(v) => Ok(v.clone()),
            None => self.base.deletion(uid),
        }
    }

    /// Writes a deletion record (keyed by its target's uid).
    pub fn put_deletion(&mut self, d: DeletionRecord) {
        self.writes.deletions.insert(d.target.uid, Some(d));
    }

    /// Removes a deletion record (at purge).
    pub fn remove_deletion(&mut self, uid: Uid) {
        self.writes.deletions.insert(uid, None);
    }

    /// This region's part of an operation, as this step left it.
    pub fn operation(&self, id: OperationId) -> Result<Option<Operation>, StorageError> {
        match self.writes.operations.get(&id) {
            Some(v) => Ok(v.clone()),
            None => self.base.operation(id),
        }
    }

    /// What `f` makes of this region's part of an operation, as this step
    /// left it, without a copy of it (a cascade reads the operation once
    /// per referrer: cloning it there was a clone of its root, principal
    /// and `reached` set per deleted leaf).
    pub fn with_operation<R>(
        &self,
        id: OperationId,
        f: impl FnOnce(&Operation) -> R,
    ) -> Result<Option<R>, StorageError> {
        match self.writes.operations.get(&id) {
            Some(v) => Ok(v.as_ref().map(f)),
            None => Ok(self.base.operation(id)?.as_ref().map(f)),
        }
    }

    /// This region's part of an operation, to change in place: read from
    /// the snapshot into the step's writes the first time, then changed
    /// there (so a step that counts 512 referrers in one operation copies
    /// it once, not 512 times). Marks it written: only for a change.
    pub fn operation_mut(&mut self, id: OperationId) -> Result<Option<&mut Operation>, StorageError> {
        if !self.writes.operations.contains_key(&id) {
            let Some(op) = self.base.operation(id)? else {
                return Ok(None);
            };
            self.writes.operations.insert(id, Some(op));
        }
        Ok(self.writes.operations.get_mut(&id).and_then(Option::as_mut))
    }

    /// Writes an operation part.
    pub fn put_operation(&mut self, op: Operation) {
        self.writes.operations.insert(op.id, Some(op));
    }

    /// What operation `op` last recorded for `name`, as this step left it.
    pub fn outcome(&self, op: OperationId, name: &ResourceName) -> Result<Option<Outcome>, StorageError> {
        match self.writes.outcomes.get(&(op, name.clone())) {
            Some(v) => Ok(Some(v.clone())),
            None => self.base.outcome(op, name),
        }
    }

    /// Records (replaces) the outcome of one resource in operation `op`.
    pub fn put_outcome(&mut self, op: OperationId, outcome: Outcome) {
        self.writes
            .outcomes
            .insert((op, outcome.resource.name.clone()), outcome);
    }

    /// The retry-queue entry of `uid`, as this step left it.
    pub fn work(&self, uid: Uid) -> Result<Option<WorkItem>, StorageError> {
        match self.writes.work.get(&uid) {
            Some(v) => Ok(v.clone()),
            None => self.base.work(uid),
        }
    }

    /// Schedules (or reschedules) deletion work for a resource.
    pub fn put_work(&mut self, w: WorkItem) {
        self.writes.work.insert(w.target.uid, Some(w));
    }

    /// Appends an entry to the audit log.
    pub fn put_audit(&mut self, entry: AuditEntry) {
        self.writes.audit.push(entry);
    }

    /// Removes a resource's queue entry (its deletion is done or failed).
    pub fn remove_work(&mut self, uid: Uid) {
        self.writes.work.insert(uid, None);
    }

    /// Due queue entries of the snapshot (not of this step's writes: work
    /// a step schedules runs in a later step).
    pub fn due_work(&self, now: Timestamp, limit: usize) -> Result<Vec<DueWork>, StorageError> {
        self.base.due_work(now, limit)
    }

    /// Appends an event, assigning it the next revision, and returns that revision.
    pub fn emit(&mut self, mut event: Event) -> Result<Revision, StorageError> {
        let revision = match self.next_revision {
            Some(r) => r,
            None => self.base.next_revision()?,
        };
        event.revision = revision;
        if let Some(snapshot) = event.snapshot.as_mut() {
            snapshot.revision = revision;
        }
        self.next_revision = Some(revision + 1);
        self.writes.events.push(event);
        Ok(revision)
    }

    /// The tombstone of a remote resource, as this step left it.
    pub fn remote_deletion(&self, uid: Uid) -> Result<Option<RemoteDeletion>, StorageError> {
        overlay_get!(self, remote_deletions, &uid, self.base.remote_deletion(uid))
    }

    /// Tombstones of one region (with this step's own changes).
    pub fn remote_deletions_of(&self, region: &str) -> Result<Vec<RemoteDeletion>, StorageError> {
        let mut all: BTreeMap<Uid, RemoteDeletion> = self
            .base
            .remote_deletions()?
            .into_iter()
            .map(|d| (d.target.uid, d))
            .collect();
        for (uid, v) in &self.writes.remote_deletions {
            match v {
                Some(d) => all.insert(*uid, d.clone()),
                None => all.remove(uid),
            };
        }
        Ok(all.into_values().filter(|d| d.target.name.region() == region).collect())
    }

    /// Writes a tombstone (keyed by its target's uid).
    pub fn put_remote_deletion(&mut self, d: RemoteDeletion) {
        self.writes.remote_deletions.insert(d.target.uid, Some(d));
    }

    /// Removes a tombstone.
    pub fn remove_remote_deletion(&mut self, uid: Uid) {
        self.writes.remote_deletions.insert(uid, None);
    }

    /// The release of `key` queued for the owner `region`, as this step left it.
    pub fn pending_release(&self, region: &str, key: &BackRefKey) -> Result<Option<PendingRelease>, StorageError> {
        overlay_get!(
            self,
            pending_releases,
            &(region.to_owned(), key.clone()),
            self.base.pending_release(region, key)
        )
    }

    /// Queues a release for the owner `region` (durable until it acknowledges).
    pub fn put_pending_release(&mut self, region: &str, p: PendingRelease) {
        self.writes
            .pending_releases
            .insert((region.to_owned(), p.backref.key()), Some(p));
    }

    /// Removes a queued release (the owner acknowledged it).
    pub fn remove_pending_release(&mut self, region: &str, key: BackRefKey) {
        self.writes.pending_releases.insert((region.to_owned(), key), None);
    }

    /// The last revision of `region`'s outbox applied, as this step left it.
    pub fn cursor(&self, region: &str) -> Result<Revision, StorageError> {
        match self.writes.cursors.get(region) {
            Some(v) => Ok(*v),
            None => self.base.cursor(region),
        }
    }

    /// Advances the cursor of `region`'s outbox, in the same step as the
    /// effects of the events it covers.
    pub fn set_cursor(&mut self, region: &str, revision: Revision) {
        self.writes.cursors.insert(region.to_owned(), revision);
    }

    /// The unconfirmed attaches of a local resource, as this step left them.
    pub fn pending_attach(&self, uid: Uid) -> Result<Option<PendingAttach>, StorageError> {
        if let Some(written) = self.writes.pending_attach.get(&uid) {
            return Ok(written.clone());
        }
        let any = match self.base_has_pending_attaches.get() {
            Some(any) => any,
            None => {
                let any = self.base.any_pending_attach()?;
                self.base_has_pending_attaches.set(Some(any));
                any
            }
        };
        if any {
            self.base.pending_attach(uid)
        } else {
            Ok(None)
        }
    }

    /// Records the durable intent to attach (keyed by the resource's uid).
    pub fn put_pending_attach(&mut self, p: PendingAttach) {
        self.writes.pending_attach.insert(p.resource.uid, Some(p));
    }

    /// Removes the intent (the attaches were confirmed or given up).
    pub fn remove_pending_attach(&mut self, uid: Uid) {
        self.writes.pending_attach.insert(uid, None);
    }

    /// Takes the next release generation.
    pub fn next_generation(&mut self) -> Result<u64, StorageError> {
        let g = match self.writes.generation {
            Some(g) => g,
            None => self.base.generation()?,
        };
        self.writes.generation = Some(g + 1);
        Ok(g)
    }

    /// The revision the next emitted event will get.
    pub fn peek_revision(&self) -> Result<Revision, StorageError> {
        match self.next_revision {
            Some(r) => Ok(r),
            None => self.base.next_revision(),
        }
    }
}

/// A walk over the back-references of one target, a page at a time, in key
/// order: the one way the protocol reads a target's back-references in full.
///
/// It holds the continuation key, not a borrow of the [`Tx`], so a caller
/// may write through the same `Tx` between pages (the deletion engine drops
/// the rows it acts on). Each page starts after the last key of the one
/// before, so a row the caller removed or added behind that key is not seen
/// again.
///
/// A page shorter than the limit asked for is the last: the walk ends
/// there without reading again. So a caller must not add rows of the
/// target past the position between pages, and none does: rows are
/// attached by a create, an update, an undelete and a peer's attach, never
/// in a step that walks (a deletion's member with a few referrers read its
/// rows twice, the second time to find nothing).
#[derive(Debug, Clone)]
pub struct BackRefPages {
    target: Uid,
    after: Option<BackRefKey>,
    /// The last page was shorter than asked for: nothing is left.
    past_end: bool,
}

impl BackRefPages {
    /// A walk from the first back-reference of `target`.
    pub fn new(target: Uid) -> Self {
        Self::resume(target, None)
    }

    /// A walk of `target`'s back-references after the key `after` (from the
    /// first when `None`): a walk resumed where an earlier step left it.
    pub fn resume(target: Uid, after: Option<BackRefKey>) -> Self {
        Self {
            target,
            after,
            past_end: false,
        }
    }

    /// The last key this walk has returned (where a later walk resumes).
    pub fn position(&self) -> Option<&BackRefKey> {
        self.after.as_ref()
    }

    /// The next up to `limit` back-references, or `None` once the walk is
    /// past the last one. `limit` must not be 0: an empty page ends the walk.
    pub fn next_page<S: StateRead + ?Sized>(
        &mut self,
        tx: &Tx<'_, S>,
        limit: usize,
    ) -> Result<Option<Vec<BackRef>>, StorageError> {
        debug_assert!(limit > 0, "a page of 0 back-references would end the walk early");
        if self.past_end {
            return Ok(None);
        }
        let page = tx.backrefs(self.target, self.after.as_ref(), limit)?;
        self.past_end = page.len() < limit;
        let Some(last) = page.last() else { return Ok(None) };
        self.after = Some(last.key());
        Ok(Some(page))
    }
}
