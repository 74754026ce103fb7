//! A store as the writer's steps read it: the engine's error of a read it
//! refused is kept for the writer, which cannot tell it from the protocol's
//! error (`CoreError::Storage` carries only a message, and a record that
//! does not decode reads the same).
//!
//! Why: a refused read is the store in trouble (sled, once a write failed,
//! refuses reads that must split a page), and the writer heals it as it
//! heals a refused commit (`writer/healing.rs`); a record that does not
//! decode is the data's fault, which neither a retry nor a reopen mends,
//! and must not turn health NOT_SERVING. Only reads are watched: a refused
//! commit or flush is the writer's own call, and it sees that error whole.

use std::sync::{Arc, Mutex, PoisonError};

use super::{Batch, Entry, Prefetch, ScanFloors, Store, StoreError, Table};

/// `inner`, with the error of the last read it refused kept until taken.
pub(crate) struct WatchedReads {
    inner: Arc<dyn Store>,
    refused: Mutex<Option<StoreError>>,
}

impl WatchedReads {
    pub(crate) fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            refused: Mutex::new(None),
        }
    }

    /// The error of the last read refused since the last call (None: the
    /// engine refused none).
    pub(crate) fn take_refused(&self) -> Option<StoreError> {
        self.refused.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    fn note<T>(&self, read: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &read {
            *self.refused.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.clone());
        }
        read
    }
}

impl Store for WatchedReads {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.note(self.inner.get(table, key))
    }
    fn get_in(&self, table: Table, key: &[u8], read: &mut dyn FnMut(&[u8])) -> Result<(), StoreError> {
        self.note(self.inner.get_in(table, key, read))
    }
    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.note(self.inner.get_many(table, keys))
    }
    fn prefetch(&self, reads: &Prefetch) -> Result<(), StoreError> {
        self.note(self.inner.prefetch(reads))
    }
    fn prefetches(&self) -> bool {
        self.inner.prefetches()
    }
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.note(self.inner.scan(table, prefix, after, limit))
    }
    fn scan_in(
        &self,
        table: Table,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        read: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), StoreError> {
        self.note(self.inner.scan_in(table, prefix, after, limit, read))
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.inner.commit(batch)
    }
    fn land(&self) -> Result<(), StoreError> {
        self.inner.land()
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn start_flush(&self) -> Result<(), StoreError> {
        self.inner.start_flush()
    }
    fn start_flush_then(&self, landed: Box<dyn FnOnce() + Send>) -> Result<(), StoreError> {
        self.inner.start_flush_then(landed)
    }
    fn finish_flush(&self) -> Result<(), StoreError> {
        self.inner.finish_flush()
    }
    fn overlaps_flushes(&self) -> bool {
        self.inner.overlaps_flushes()
    }
    fn commits_on_top_of_a_flight(&self) -> bool {
        self.inner.commits_on_top_of_a_flight()
    }
    fn waits_on_io(&self) -> bool {
        self.inner.waits_on_io()
    }
    fn reopen(&self) -> Result<(), StoreError> {
        self.inner.reopen()
    }
    fn scan_floors(&self) -> Option<&ScanFloors> {
        self.inner.scan_floors()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{DiskCondition, MemoryStore};

    /// Refuses every read of the resources table, as a full disk would.
    struct RefusesResources(MemoryStore);

    impl Store for RefusesResources {
        fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
            if table == Table::Resources {
                return Err(StoreError::Unavailable {
                    condition: DiskCondition::Full,
                    message: "refused".into(),
                });
            }
            self.0.get(table, key)
        }
        fn scan(
            &self,
            table: Table,
            prefix: &[u8],
            after: Option<&[u8]>,
            limit: usize,
        ) -> Result<Vec<Entry>, StoreError> {
            self.0.scan(table, prefix, after, limit)
        }
        fn commit(&self, batch: Batch) -> Result<(), StoreError> {
            self.0.commit(batch)
        }
        fn flush(&self) -> Result<(), StoreError> {
            self.0.flush()
        }
    }

    #[test]
    fn a_refused_read_is_kept_once_and_what_succeeds_keeps_nothing() {
        let watched = WatchedReads::new(Arc::new(RefusesResources(MemoryStore::default())));
        watched.get(Table::Meta, b"k").expect("the meta table reads");
        assert!(watched.take_refused().is_none());
        watched.get(Table::Resources, b"k").expect_err("refused");
        let refused = watched.take_refused().expect("the refusal was kept");
        assert!(refused.may_clear(), "{refused:?}");
        assert!(watched.take_refused().is_none(), "taken once");
    }
}
