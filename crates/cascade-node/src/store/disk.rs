//! What a disk can refuse that may clear by itself (a full disk, a
//! read-only remount), and how a store learns that its directory takes
//! writes again before it reopens its engine ([`Store::reopen`]).

use std::fmt;
use std::path::Path;

#[cfg(doc)]
use super::Store;
use super::StoreError;

/// Why a store refused, when the reason may clear (see
/// [`StoreError::Unavailable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskCondition {
    /// No space left on the device (ENOSPC) or a disk quota reached (EDQUOT).
    Full,
    /// The file system is read-only (EROFS), as after an error remount.
    ReadOnly,
    /// The engine refuses every write since an earlier failed one (fjall's
    /// poisoned database): only a reopen clears it.
    Refusing,
    /// The engine is being reopened ([`Store::reopen`]): a read or write
    /// is refused at once instead of waiting for the open (sled replays
    /// its log, seconds on a big database, and the caller is often a
    /// runtime worker); it clears when the reopen ends.
    Reopening,
    /// The database server does not answer (connection refused, reset or
    /// timed out; the server shutting down or restarting), or a statement
    /// ran out of time: the store's connections are made again once it
    /// answers.
    DatabaseUnreachable,
}

impl fmt::Display for DiskCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DiskCondition::Full => "disk full",
            DiskCondition::ReadOnly => "read-only file system",
            DiskCondition::Refusing => "engine refusing writes after a failed one",
            DiskCondition::Reopening => "engine being reopened",
            DiskCondition::DatabaseUnreachable => "database unreachable",
        })
    }
}

impl DiskCondition {
    /// The condition an IO error reports, if it is one that may clear.
    /// EIO is not: a device that fails reads or writes is not retried into
    /// (sled and fjall both re-read their files when they reopen).
    pub(crate) fn of_io(e: &std::io::Error) -> Option<Self> {
        use std::io::ErrorKind;
        match e.kind() {
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded => Some(DiskCondition::Full),
            ErrorKind::ReadOnlyFilesystem => Some(DiskCondition::ReadOnly),
            _ => None,
        }
    }
}

/// An IO error as a store error: [`StoreError::Unavailable`] when it may
/// clear, else [`StoreError::Engine`]; `message` says what was being done.
pub(crate) fn from_io(e: &std::io::Error, message: String) -> StoreError {
    match DiskCondition::of_io(e) {
        Some(condition) => StoreError::Unavailable { condition, message },
        None => StoreError::Engine(message),
    }
}

/// The file [`probe_writable`] writes in a data directory, and removes.
pub const WRITE_PROBE: &str = "WRITE_PROBE";

/// What the probe writes: room for the engine's next log segment (sled's
/// are 512 KiB), so a directory that takes it is likely to take the
/// engine's next writes too.
pub const WRITE_PROBE_BYTES: usize = 1024 * 1024;

/// Whether `dir` takes writes again: a file written, fsynced and removed.
/// An engine is reopened only after this succeeds, so its files are not
/// touched (and fjall keeps serving reads from its poisoned handles) while
/// the disk is still full or read-only.
pub(crate) fn probe_writable(dir: &Path) -> Result<(), StoreError> {
    use std::io::Write;
    let path = dir.join(WRITE_PROBE);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&path)?;
        f.write_all(&vec![0u8; WRITE_PROBE_BYTES])?;
        f.sync_all()
    };
    let written = write();
    // Removed whether or not it was written whole: it must not hold the
    // space it probed for.
    let removed = std::fs::remove_file(&path);
    written.map_err(|e| from_io(&e, format!("{} takes no writes yet: {e}", dir.display())))?;
    removed.map_err(|e| from_io(&e, format!("cannot remove {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::{Batch, FjallStore, SledStore, Store, Table};

    fn put(table: Table, key: &[u8], value: &[u8]) -> Batch {
        let mut b = Batch::default();
        b.put(table, key.to_vec(), value.to_vec());
        b
    }

    /// [`Store::reopen`] in place: what was committed and flushed is there
    /// after it, the store takes writes, a reader running beside the
    /// reopens reads it or is told the engine is being reopened (never
    /// another error, never a half-open store), and the write probe leaves
    /// nothing behind.
    /// (What a reopen heals, a full disk, is tested over a real one in
    /// `tests/faults/disk_full.rs`.)
    fn reopens_in_place(store: Arc<dyn Store>, dir: &Path) {
        store.commit(put(Table::Resources, b"before", b"1")).unwrap();
        store.flush().unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match store.get(Table::Resources, b"before") {
                        Ok(got) => {
                            assert_eq!(got.as_deref(), Some(&b"1"[..]));
                            reads += 1;
                        }
                        Err(StoreError::Unavailable {
                            condition: DiskCondition::Reopening,
                            ..
                        }) => {}
                        Err(e) => panic!("a read beside a reopen: {e}"),
                    }
                }
                reads
            })
        };
        for n in 0u8..3 {
            store.reopen().expect("reopens");
            store.commit(put(Table::Resources, &[b'k', n], b"after")).unwrap();
            store.flush().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().expect("the reader never failed") > 0);
        let keys_now: Vec<Vec<u8>> = store
            .scan(Table::Resources, b"", None, 10)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys_now,
            [
                b"before".to_vec(),
                b"k\0".to_vec(),
                b"k\x01".to_vec(),
                b"k\x02".to_vec()
            ]
        );
        assert!(!dir.join(WRITE_PROBE).exists(), "the write probe is removed");
    }

    #[test]
    fn sled_and_fjall_stores_reopen_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let sled_dir = dir.path().join("sled");
        reopens_in_place(Arc::new(SledStore::open(&sled_dir).unwrap()), &sled_dir);
        let fjall_dir = dir.path().join("fjall");
        reopens_in_place(Arc::new(FjallStore::open(&fjall_dir).unwrap()), &fjall_dir);
    }
}
