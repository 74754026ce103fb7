//! How the protocol sees and changes state without doing IO.
//!
//! The node implements [`StateRead`] over its store; a step of the protocol
//! reads through a [`Tx`] (the snapshot plus the step's own writes, so later
//! reads of the step see earlier ones) and ends with a [`WriteSet`]: the
//! final value of every key it touched and the events it emits. The node
//! commits a write set in one atomic transaction.
//!
//! Architecture invariant: reads through `StateRead` and the commit of the
//! resulting `WriteSet` are not interleaved with any other write to the same
//! node. The node guarantees it with a single writer.

use std::collections::BTreeMap;

use crate::error::StorageError;
use crate::model::{
    BackRef, BackRefKey, DeletionRecord, Event, Operation, Outcome, Resource, Revision, Timestamp, WorkItem,
};
use crate::name::{OperationId, ResourceName, Uid};

/// Read access to one node's durable state.
pub trait StateRead {
    fn resource(&self, name: &ResourceName) -> Result<Option<Resource>, StorageError>;
    fn name_of(&self, uid: Uid) -> Result<Option<ResourceName>, StorageError>;
    /// Back-references of `target`, in key order, after `after` (exclusive).
    fn backrefs(&self, target: Uid, after: Option<&BackRefKey>, limit: usize) -> Result<Vec<BackRef>, StorageError>;
    fn deletion(&self, uid: Uid) -> Result<Option<DeletionRecord>, StorageError>;
    fn operation(&self, id: OperationId) -> Result<Option<Operation>, StorageError>;
    fn work(&self, uid: Uid) -> Result<Option<WorkItem>, StorageError>;
    /// What an operation last recorded for a resource.
    fn outcome(&self, op: OperationId, name: &ResourceName) -> Result<Option<Outcome>, StorageError>;
    /// Up to `limit` queue entries whose `next_attempt_at <= now`.
    fn due_work(&self, now: Timestamp, limit: usize) -> Result<Vec<WorkItem>, StorageError>;
    /// The revision the next event gets.
    fn next_revision(&self) -> Result<Revision, StorageError>;
}

/// Everything one step writes: final values per key (None = delete) and the
/// events, in revision order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WriteSet {
    pub resources: BTreeMap<ResourceName, Option<Resource>>,
    pub uid_index: BTreeMap<Uid, Option<ResourceName>>,
    pub backrefs: BTreeMap<BackRefKey, Option<BackRef>>,
    pub deletions: BTreeMap<Uid, Option<DeletionRecord>>,
    pub operations: BTreeMap<OperationId, Option<Operation>>,
    pub outcomes: BTreeMap<(OperationId, ResourceName), Outcome>,
    pub work: BTreeMap<Uid, Option<WorkItem>>,
    pub events: Vec<Event>,
    /// Set when events were appended.
    pub next_revision: Option<Revision>,
}

impl WriteSet {
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
            && self.uid_index.is_empty()
            && self.backrefs.is_empty()
            && self.deletions.is_empty()
            && self.operations.is_empty()
            && self.outcomes.is_empty()
            && self.work.is_empty()
            && self.events.is_empty()
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
    }
}

/// A snapshot with the pending writes of one step laid over it.
pub struct Tx<'s, S: StateRead + ?Sized> {
    base: &'s S,
    writes: WriteSet,
    next_revision: Option<Revision>,
}

impl<'s, S: StateRead + ?Sized> Tx<'s, S> {
    pub fn new(base: &'s S) -> Self {
        Self {
            base,
            writes: WriteSet::default(),
            next_revision: None,
        }
    }

    pub fn finish(mut self) -> WriteSet {
        self.writes.next_revision = self.next_revision;
        self.writes
    }

    /// Discards the step's writes (used by dry runs).
    pub fn pending_writes(&self) -> &WriteSet {
        &self.writes
    }

    pub fn resource(&self, name: &ResourceName) -> Result<Option<Resource>, StorageError> {
        match self.writes.resources.get(name) {
            Some(v) => Ok(v.clone()),
            None => self.base.resource(name),
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

    pub fn put_resource(&mut self, r: Resource) {
        self.writes.uid_index.insert(r.uid, Some(r.name.clone()));
        self.writes.resources.insert(r.name.clone(), Some(r));
    }

    pub fn remove_resource(&mut self, name: &ResourceName, uid: Uid) {
        self.writes.uid_index.insert(uid, None);
        self.writes.resources.insert(name.clone(), None);
    }

    pub fn backrefs(
        &self,
        target: Uid,
        after: Option<&BackRefKey>,
        limit: usize,
    ) -> Result<Vec<BackRef>, StorageError> {
        let in_range = |k: &BackRefKey| k.target == target && after.is_none_or(|a| k > a);
        let overlay: Vec<(&BackRefKey, &Option<BackRef>)> =
            self.writes.backrefs.iter().filter(|(k, _)| in_range(k)).collect();
        // Ask the base for enough rows that overlay deletions cannot starve the page.
        let base = self.base.backrefs(target, after, limit + overlay.len())?;
        let mut merged: BTreeMap<BackRefKey, BackRef> = base.into_iter().map(|b| (b.key(), b)).collect();
        for (k, v) in overlay {
            match v {
                Some(b) => merged.insert(k.clone(), b.clone()),
                None => merged.remove(k),
            };
        }
        Ok(merged.into_values().take(limit).collect())
    }

    pub fn put_backref(&mut self, b: BackRef) {
        self.writes.backrefs.insert(b.key(), Some(b));
    }

    pub fn remove_backref(&mut self, key: BackRefKey) {
        self.writes.backrefs.insert(key, None);
    }

    pub fn deletion(&self, uid: Uid) -> Result<Option<DeletionRecord>, StorageError> {
        match self.writes.deletions.get(&uid) {
            Some(v) => Ok(v.clone()),
            None => self.base.deletion(uid),
        }
    }

    pub fn put_deletion(&mut self, d: DeletionRecord) {
        self.writes.deletions.insert(d.target.uid, Some(d));
    }

    pub fn remove_deletion(&mut self, uid: Uid) {
        self.writes.deletions.insert(uid, None);
    }

    pub fn operation(&self, id: OperationId) -> Result<Option<Operation>, StorageError> {
        match self.writes.operations.get(&id) {
            Some(v) => Ok(v.clone()),
            None => self.base.operation(id),
        }
    }

    pub fn put_operation(&mut self, op: Operation) {
        self.writes.operations.insert(op.id, Some(op));
    }

    pub fn outcome(&self, op: OperationId, name: &ResourceName) -> Result<Option<Outcome>, StorageError> {
        match self.writes.outcomes.get(&(op, name.clone())) {
            Some(v) => Ok(Some(v.clone())),
            None => self.base.outcome(op, name),
        }
    }

    pub fn put_outcome(&mut self, op: OperationId, outcome: Outcome) {
        self.writes
            .outcomes
            .insert((op, outcome.resource.name.clone()), outcome);
    }

    pub fn work(&self, uid: Uid) -> Result<Option<WorkItem>, StorageError> {
        match self.writes.work.get(&uid) {
            Some(v) => Ok(v.clone()),
            None => self.base.work(uid),
        }
    }

    pub fn put_work(&mut self, w: WorkItem) {
        self.writes.work.insert(w.target.uid, Some(w));
    }

    pub fn remove_work(&mut self, uid: Uid) {
        self.writes.work.insert(uid, None);
    }

    pub fn due_work(&self, now: Timestamp, limit: usize) -> Result<Vec<WorkItem>, StorageError> {
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

    /// The revision the next emitted event will get.
    pub fn peek_revision(&self) -> Result<Revision, StorageError> {
        match self.next_revision {
            Some(r) => Ok(r),
            None => self.base.next_revision(),
        }
    }
}
