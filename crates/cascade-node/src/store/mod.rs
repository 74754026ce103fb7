//! The narrow storage interface the node needs, and its engines.
//!
//! The protocol never sees an engine: it reads through
//! [`crate::codec::StoreState`] and its writes arrive here as one [`Batch`]
//! that an engine must apply atomically across tables. That is all an
//! engine has to offer (point reads, ordered prefix scans, atomic
//! multi-table batches), so a second engine can be measured against sled
//! without touching the protocol.

mod memory;
mod sled_store;

pub use memory::MemoryStore;
pub use sled_store::SledStore;

/// The logical tables. An engine maps each to a tree, a column family or a key prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// name → resource
    Resources,
    /// uid → name (finds an incarnation; a re-created name has a new uid)
    UidIndex,
    /// target uid ‖ referrer uid ‖ field → back-reference
    Backrefs,
    /// uid → deletion record (the deletion table of seed 000)
    Deletions,
    /// operation id → operation
    Operations,
    /// operation id ‖ name → outcome
    Outcomes,
    /// uid → work item (the retry queue of seed 004)
    RetryQueue,
    /// due time (big endian) ‖ uid → nothing: the retry queue in the order
    /// it falls due, so a work step reads only what is due
    DueIndex,
    /// revision (big endian) → event
    Outbox,
    /// small named counters
    Meta,
    /// remote uid → tombstone of a remote resource seen DELETING
    RemoteDeletions,
    /// owner region ‖ 0 ‖ back-reference key → release not yet acknowledged
    PendingReleases,
    /// peer region → last applied revision of its outbox
    Cursors,
    /// uid → CREATING resource whose cross-region attach is unsettled
    PendingAttach,
}

impl Table {
    pub const ALL: [Table; 14] = [
        Table::Resources,
        Table::UidIndex,
        Table::Backrefs,
        Table::Deletions,
        Table::Operations,
        Table::Outcomes,
        Table::RetryQueue,
        Table::DueIndex,
        Table::Outbox,
        Table::Meta,
        Table::RemoteDeletions,
        Table::PendingReleases,
        Table::Cursors,
        Table::PendingAttach,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Table::Resources => "resources",
            Table::UidIndex => "uid_index",
            Table::Backrefs => "backrefs",
            Table::Deletions => "deletions",
            Table::Operations => "operations",
            Table::Outcomes => "outcomes",
            Table::RetryQueue => "retry_queue",
            Table::DueIndex => "due_index",
            Table::Outbox => "outbox",
            Table::Meta => "meta",
            Table::RemoteDeletions => "remote_deletions",
            Table::PendingReleases => "pending_releases",
            Table::Cursors => "cursors",
            Table::PendingAttach => "pending_attach",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Writes to apply all together or not at all.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub ops: Vec<(Table, Vec<u8>, Option<Vec<u8>>)>,
}

impl Batch {
    pub fn put(&mut self, table: Table, key: Vec<u8>, value: Vec<u8>) {
        self.ops.push((table, key, Some(value)));
    }
    pub fn remove(&mut self, table: Table, key: Vec<u8>) {
        self.ops.push((table, key, None));
    }
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage engine: {0}")]
    Engine(String),
    #[error("corrupt record in table {table}: {message}")]
    Corrupt { table: &'static str, message: String },
}

/// One key-value pair as stored.
pub type Entry = (Vec<u8>, Vec<u8>);

pub trait Store: Send + Sync + 'static {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Entries whose key starts with `prefix`, in key order, strictly after
    /// `after` when given, at most `limit`.
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError>;
    /// Applies every write of the batch atomically.
    fn commit(&self, batch: Batch) -> Result<(), StoreError>;
    /// Makes every committed batch durable.
    fn flush(&self) -> Result<(), StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(store: &dyn Store) {
        let mut b = Batch::default();
        b.put(Table::Resources, b"a/x/1".to_vec(), b"1".to_vec());
        b.put(Table::Resources, b"a/x/2".to_vec(), b"2".to_vec());
        b.put(Table::Resources, b"a/y/1".to_vec(), b"3".to_vec());
        b.put(Table::Meta, b"k".to_vec(), b"v".to_vec());
        store.commit(b).unwrap();
        let all = store.scan(Table::Resources, b"a/x/", None, 10).unwrap();
        assert_eq!(all.len(), 2);
        let after = store.scan(Table::Resources, b"a/x/", Some(b"a/x/1"), 10).unwrap();
        assert_eq!(after, vec![(b"a/x/2".to_vec(), b"2".to_vec())]);
        assert_eq!(store.scan(Table::Resources, b"", None, 1).unwrap().len(), 1);
        let mut b = Batch::default();
        b.remove(Table::Resources, b"a/x/1".to_vec());
        store.commit(b).unwrap();
        assert_eq!(store.get(Table::Resources, b"a/x/1").unwrap(), None);
        assert_eq!(store.get(Table::Meta, b"k").unwrap(), Some(b"v".to_vec()));
        // Tables are separate key spaces.
        assert_eq!(store.get(Table::Outbox, b"k").unwrap(), None);
        store.flush().unwrap();
    }

    #[test]
    fn memory_store_behaves() {
        exercise(&MemoryStore::default());
    }

    #[test]
    fn sled_store_behaves_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SledStore::open(dir.path()).unwrap();
            exercise(&s);
        }
        let s = SledStore::open(dir.path()).unwrap();
        assert_eq!(s.get(Table::Resources, b"a/x/2").unwrap(), Some(b"2".to_vec()));
    }
}
