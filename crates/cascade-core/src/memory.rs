//! An in-memory [`StateRead`] that applies [`WriteSet`]s: the reference
//! state for unit tests, property tests and model checking of the protocol.

use std::collections::BTreeMap;

use crate::error::StorageError;
use crate::model::{
    AuditEntry, BackRef, BackRefKey, DeletionRecord, DueOperation, DueWork, Event, Operation, Outcome, PendingAttach,
    PendingRelease, RemoteDeletion, Resource, Revision, Timestamp, WorkItem,
};
use crate::name::{OperationId, ResourceName, Uid};
use crate::state::{StateRead, WriteSet};

/// One node's whole durable state as maps, one per table of the node's
/// store (see the matching fields of [`WriteSet`]). Its fields are public so
/// tests and the model checker can inspect and compare states.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryState {
    /// Resources by name (every state, CREATING included).
    pub resources: BTreeMap<ResourceName, Resource>,
    /// Uid → name of the incarnation that has it.
    pub uid_index: BTreeMap<Uid, ResourceName>,
    /// Back-references, the owner's rows and the importer's mirrors alike.
    pub backrefs: BTreeMap<BackRefKey, BackRef>,
    /// Deletion records of DELETING resources, by uid.
    pub deletions: BTreeMap<Uid, DeletionRecord>,
    /// This region's part of every operation.
    pub operations: BTreeMap<OperationId, Operation>,
    /// Per-resource outcomes of each operation.
    pub outcomes: BTreeMap<(OperationId, ResourceName), Outcome>,
    /// The retry queue, by uid of the DELETING resource.
    pub work: BTreeMap<Uid, WorkItem>,
    /// The outbox, in revision order (never compacted here).
    pub events: Vec<Event>,
    /// The revision the next event gets (0 reads as 1).
    pub next_revision: Revision,
    /// Tombstones of other regions' DELETING resources.
    pub remote_deletions: BTreeMap<Uid, RemoteDeletion>,
    /// Releases queued for other regions: (owner region, key) → release.
    pub pending_releases: BTreeMap<(String, BackRefKey), PendingRelease>,
    /// Per peer region, the last revision of its outbox applied here.
    pub cursors: BTreeMap<String, Revision>,
    /// Cross-region attaches committed here and not yet confirmed.
    pub pending_attach: BTreeMap<Uid, PendingAttach>,
    /// The next release generation (0 reads as 1).
    pub generation: u64,
    /// The audit log, in the order it was written.
    pub audit: Vec<AuditEntry>,
}

fn apply_map<K: Ord, V>(map: &mut BTreeMap<K, V>, writes: BTreeMap<K, Option<V>>) {
    for (k, v) in writes {
        match v {
            Some(v) => map.insert(k, v),
            None => map.remove(&k),
        };
    }
}

impl MemoryState {
    /// Commits a step's write set, as the node's one atomic batch would.
    pub fn apply(&mut self, w: WriteSet) {
        apply_map(&mut self.resources, w.resources);
        apply_map(&mut self.uid_index, w.uid_index);
        apply_map(&mut self.backrefs, w.backrefs);
        apply_map(&mut self.deletions, w.deletions);
        apply_map(&mut self.operations, w.operations);
        self.outcomes.extend(w.outcomes);
        apply_map(&mut self.work, w.work);
        self.events.extend(w.events);
        if let Some(r) = w.next_revision {
            self.next_revision = r;
        }
        apply_map(&mut self.remote_deletions, w.remote_deletions);
        apply_map(&mut self.pending_releases, w.pending_releases);
        self.cursors.extend(w.cursors);
        apply_map(&mut self.pending_attach, w.pending_attach);
        if let Some(g) = w.generation {
            self.generation = g;
        }
        self.audit.extend(w.audit);
    }
}

impl StateRead for MemoryState {
    fn resource(&self, name: &ResourceName) -> Result<Option<Resource>, StorageError> {
        Ok(self.resources.get(name).cloned())
    }
    fn name_of(&self, uid: Uid) -> Result<Option<ResourceName>, StorageError> {
        Ok(self.uid_index.get(&uid).cloned())
    }
    fn backrefs(&self, target: Uid, after: Option<&BackRefKey>, limit: usize) -> Result<Vec<BackRef>, StorageError> {
        // A range from the position, not a pass over every row of every
        // target: with one row per leaf, a cascade's "is it referenced?"
        // per leaf made the whole cascade quadratic here (a 20,000-leaf
        // cascade took 47.6 s of wall time; the tests and the model
        // checker run on this).
        use std::ops::Bound;
        let start = match after {
            Some(a) if a.target >= target => Bound::Excluded(a.clone()),
            _ => Bound::Included(BackRefKey {
                target,
                referrer: Uid(uuid::Uuid::nil()),
                field: String::new(),
            }),
        };
        Ok(self
            .backrefs
            .range((start, Bound::Unbounded))
            .take_while(|(k, _)| k.target == target)
            .take(limit)
            .map(|(_, v)| v.clone())
            .collect())
    }
    fn backref(&self, key: &BackRefKey) -> Result<Option<BackRef>, StorageError> {
        Ok(self.backrefs.get(key).cloned())
    }
    fn deletion(&self, uid: Uid) -> Result<Option<DeletionRecord>, StorageError> {
        Ok(self.deletions.get(&uid).cloned())
    }
    fn operation(&self, id: OperationId) -> Result<Option<Operation>, StorageError> {
        Ok(self.operations.get(&id).cloned())
    }
    fn work(&self, uid: Uid) -> Result<Option<WorkItem>, StorageError> {
        Ok(self.work.get(&uid).cloned())
    }
    fn outcome(&self, op: OperationId, name: &ResourceName) -> Result<Option<Outcome>, StorageError> {
        Ok(self.outcomes.get(&(op, name.clone())).cloned())
    }
    fn due_work(&self, now: Timestamp, limit: usize) -> Result<Vec<DueWork>, StorageError> {
        // The operation as the node's index records it: the deletion
        // record's, or the tombstone's for another region's resource.
        let operation_of = |uid: &Uid| {
            self.deletions
                .get(uid)
                .map(|d| d.operation)
                .or_else(|| self.remote_deletions.get(uid).map(|t| t.operation))
        };
        Ok(self
            .work
            .values()
            .filter(|w| w.next_attempt_at <= now)
            .take(limit)
            .map(|w| DueWork {
                uid: w.target.uid,
                operation: DueOperation::Recorded(operation_of(&w.target.uid)),
            })
            .collect())
    }
    fn next_revision(&self) -> Result<Revision, StorageError> {
        Ok(self.next_revision.max(1))
    }
    fn remote_deletion(&self, uid: Uid) -> Result<Option<RemoteDeletion>, StorageError> {
        Ok(self.remote_deletions.get(&uid).cloned())
    }
    fn pending_attach(&self, uid: Uid) -> Result<Option<PendingAttach>, StorageError> {
        Ok(self.pending_attach.get(&uid).cloned())
    }
    fn any_pending_attach(&self) -> Result<bool, StorageError> {
        Ok(!self.pending_attach.is_empty())
    }
    fn remote_deletions(&self) -> Result<Vec<RemoteDeletion>, StorageError> {
        Ok(self.remote_deletions.values().cloned().collect())
    }
    fn pending_release(&self, region: &str, key: &BackRefKey) -> Result<Option<PendingRelease>, StorageError> {
        Ok(self.pending_releases.get(&(region.to_owned(), key.clone())).cloned())
    }
    fn cursor(&self, region: &str) -> Result<Revision, StorageError> {
        Ok(self.cursors.get(region).copied().unwrap_or(0))
    }
    fn generation(&self) -> Result<u64, StorageError> {
        Ok(self.generation.max(1))
    }
}
