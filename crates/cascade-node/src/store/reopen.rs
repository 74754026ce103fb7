//! An engine's open handles behind a lock, so that a store can be reopened
//! in place: what sled and fjall share for healing (`Store::reopen`).
//!
//! Both keep a failed write's error for good (sled's `global_error`,
//! fjall's poisoned database), and both lock their files until their last
//! handle is dropped, so a reopen drops the old handles first, then opens
//! the directory again. Readers take the lock shared and never see a
//! half-open store. They never wait for a reopen either: while one holds
//! the lock they are refused at once ([`DiskCondition::Reopening`]),
//! because the open can take seconds (sled replays its log) and a reader
//! is often a runtime worker, whose heartbeats and timers would stop
//! meanwhile (two workers on a small node). Between a failed open and the
//! next reopen they get an error that says so.

use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock, TryLockError};

use super::{probe_writable, Batch, DiskCondition, ScanFloors, StoreError};

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
    /// The tables' scan floors, forgotten at each reopen.
    floors: ScanFloors,
}

impl<H: EngineHandles> Reopenable<H> {
    pub(super) fn open(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        Ok(Self {
            open: RwLock::new(Some(H::open(dir, cache_bytes)?)),
            dir: dir.to_owned(),
            cache_bytes,
            floors: ScanFloors::default(),
        })
    }

    pub(super) fn floors(&self) -> &ScanFloors {
        &self.floors
    }

    /// Runs `commit` on the open handles with the scan floors lowered for
    /// `batch` first ([`ScanFloors::before_commit`]).
    pub(super) fn commit(
        &self,
        batch: &Batch,
        commit: impl FnOnce(&H) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.floors.before_commit(batch);
        let result = self.with(commit);
        self.floors.landed();
        result
    }

    /// Runs `f` on the open handles, or fails at once with
    /// [`StoreError::Unavailable`] ([`DiskCondition::Reopening`]) while a
    /// reopen is under way: it never blocks on the lock.
    ///
    /// Only [`Self::reopen`] ever takes the lock for writing, so a
    /// `try_read` that would block means a reopen holds the lock or waits
    /// for it (std's lock may prefer a waiting writer and refuse new
    /// readers meanwhile: that is a reopen under way too), never another
    /// reader. A poisoned lock means a reopen panicked (only a writer
    /// poisons it): the handles are then whole or gone (taken before the
    /// open, set in one assignment), and gone reads as a failed reopen.
    pub(super) fn with<R>(&self, f: impl FnOnce(&H) -> Result<R, StoreError>) -> Result<R, StoreError> {
        let open = match self.open.try_read() {
            Ok(open) => open,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Err(StoreError::Unavailable {
                    condition: DiskCondition::Reopening,
                    message: format!(
                        "{}: the database at {} is being reopened (after a failure that may clear): retry shortly",
                        H::ENGINE,
                        self.dir.display()
                    ),
                })
            }
        };
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
    /// The one place that takes the lock for writing (see [`Self::with`]).
    pub(super) fn reopen(&self) -> Result<(), StoreError> {
        probe_writable(&self.dir)?;
        let mut open = self.open.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = open.take() {
            old.close();
        }
        // A batch whose commit reported an error may be found now.
        self.floors.forget();
        *open = Some(H::open(&self.dir, self.cache_bytes)?);
        Ok(())
    }
}

// Test code: how long a read waited is real time (clippy.toml).
#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use std::sync::mpsc::{channel, Receiver, Sender};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;

    /// The open of [`Gated`] handles, when a test sets it: it says it has
    /// started, then waits to be let go (at most [`GATED_OPEN`]).
    struct Gate {
        started: Sender<()>,
        go: Receiver<()>,
    }

    static GATE: Mutex<Option<Gate>> = Mutex::new(None);

    /// How long a gated open lasts when nobody lets it go: the slow open
    /// (a replayed sled log) a reader must not wait for.
    const GATED_OPEN: Duration = Duration::from_secs(3);

    /// Handles whose open can be held up (only the test below sets the gate).
    struct Gated;

    impl EngineHandles for Gated {
        const ENGINE: &'static str = "gated";

        fn open(_dir: &Path, _cache_bytes: u64) -> Result<Self, StoreError> {
            let gate = GATE.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(gate) = gate {
                let _ = gate.started.send(());
                let _ = gate.go.recv_timeout(GATED_OPEN);
            }
            Ok(Gated)
        }
    }

    /// A reader beside a slow reopen is refused at once, UNAVAILABLE with a
    /// condition that clears (not blocked for the open's length on what may
    /// be a runtime worker), and reads again once the reopen is done.
    #[test]
    fn a_read_during_a_reopen_is_refused_at_once_and_reads_again_after() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = std::sync::Arc::new(Reopenable::<Gated>::open(dir.path(), 0).expect("opens"));
        store.with(|_| Ok(())).expect("reads before the reopen");

        let (started, open_started) = channel();
        let (let_go, go) = channel();
        *GATE.lock().unwrap_or_else(PoisonError::into_inner) = Some(Gate { started, go });
        let reopening = {
            let store = store.clone();
            std::thread::spawn(move || store.reopen())
        };
        open_started
            .recv_timeout(Duration::from_secs(30))
            .expect("the reopen reached its open");

        let asked = Instant::now();
        let refused = store.with(|_| Ok(()));
        let waited = asked.elapsed();
        let _ = let_go.send(());
        assert!(
            waited < GATED_OPEN / 3,
            "a reader waited {waited:?} for a reopen whose open takes {GATED_OPEN:?}"
        );
        let e = refused.expect_err("a read while the engine is being reopened");
        assert!(
            matches!(
                e,
                StoreError::Unavailable {
                    condition: DiskCondition::Reopening,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.may_clear(), "{e:?}");
        assert!(e.to_string().contains("is being reopened"), "{e}");

        reopening
            .join()
            .expect("the reopen did not panic")
            .expect("the reopen succeeded");
        store.with(|_| Ok(())).expect("reads after the reopen");
    }
}
