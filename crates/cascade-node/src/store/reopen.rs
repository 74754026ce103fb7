//! An engine's open handles behind a lock, so that a store can be reopened
//! in place: what sled and fjall share for healing (`Store::reopen`).
//!
//! Both keep a failed write's error for good (sled's `global_error`,
//! fjall's poisoned database), and both lock their files until their last
//! handle is dropped, so a reopen drops the old handles first, then opens
//! the directory again. Readers take the lock shared and never see a
//! half-open store; between a failed open and the next reopen they get an
//! error that says so.

use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};

use super::{probe_writable, StoreError};

/// One engine's handles on a directory.
pub(super) trait EngineHandles: Sized {
    /// The engine's name, for errors.
    const ENGINE: &'static str;

    /// Opens (or creates) the database in `dir` with a cache of `cache_bytes`.
    fn open(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError>;

    /// Lets the handles go before the directory is opened again.
    fn close(self) {
        drop(self);
    }
}

/// The handles of an open store, and what it takes to open them again.
pub(super) struct Reopenable<H> {
    dir: PathBuf,
    cache_bytes: u64,
    /// None only after a reopen whose open failed (the old handles had to
    /// go first); the next reopen tries again.
    open: RwLock<Option<H>>,
}

impl<H: EngineHandles> Reopenable<H> {
    pub(super) fn open(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        Ok(Self {
            open: RwLock::new(Some(H::open(dir, cache_bytes)?)),
            dir: dir.to_owned(),
            cache_bytes,
        })
    }

    /// Runs `f` on the open handles. A poisoned lock only means a reader
    /// panicked: the handles are whole (they are replaced in one assignment).
    pub(super) fn with<R>(&self, f: impl FnOnce(&H) -> Result<R, StoreError>) -> Result<R, StoreError> {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        match open.as_ref() {
            Some(handles) => f(handles),
            None => Err(StoreError::Engine(format!(
                "{}: the database at {} is closed: its reopen failed, and is retried",
                H::ENGINE,
                self.dir.display()
            ))),
        }
    }

    /// Opens the directory again, once it takes writes ([`probe_writable`]):
    /// the engine's files are not touched while the disk is still full.
    pub(super) fn reopen(&self) -> Result<(), StoreError> {
        probe_writable(&self.dir)?;
        let mut open = self.open.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = open.take() {
            old.close();
        }
        *open = Some(H::open(&self.dir, self.cache_bytes)?);
        Ok(())
    }
}
