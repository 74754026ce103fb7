//! Where each peer link's next send of queued releases must start (see
//! [`ReleaseHints`]).

/// The lowest pending-release key the writer queued for each owner region
/// since that region's link last took it.
///
/// Why: a link sends its region's queued releases in key order and each
/// acknowledged one is removed, which in an LSM engine (fjall) leaves a
/// tombstone until compaction. A send that scanned from the first key
/// passed every release sent before it: 19 % of all CPU in cascade-bench's
/// P2 at 1M on fjall. So a link resumes after the last key it sent, and
/// this hint says when a release was queued behind that point (one for
/// another, older target), so that the link starts over instead of
/// missing it. In memory only: after a restart a link starts from the
/// first key.
#[derive(Debug, Default)]
pub struct ReleaseHints(std::sync::Mutex<Hints>, Queued);

/// Owner region → what its link waits on to send releases as soon as one
/// is queued, rather than at its next tick (P2: the importers' releases
/// waited up to a tick, 200 ms in cascade-bench, before each send).
#[derive(Debug, Default)]
struct Queued(std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<tokio::sync::Notify>>>);

impl Queued {
    fn of(&self, region: &str) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        let mut regions = self.0.lock().ok()?;
        Some(regions.entry(region.to_owned()).or_default().clone())
    }
}

#[derive(Debug, Default)]
struct Hints {
    /// Owner region → the lowest key queued for it since its link took it.
    lowest: std::collections::HashMap<String, Vec<u8>>,
    /// Counts the store's reopens: a link that has not taken a hint since
    /// the last one starts from the first key (see [`ReleaseHints::start_over`]).
    reopens: u64,
    /// Owner region → the reopen count its link last took a hint at.
    taken_at: std::collections::HashMap<String, u64>,
}

impl ReleaseHints {
    pub(super) fn note(&self, region: &str, key: Vec<u8>) {
        if let Ok(mut hints) = self.0.lock() {
            match hints.lowest.get_mut(region) {
                Some(lowest) if *lowest <= key => {}
                Some(lowest) => *lowest = key,
                None => {
                    hints.lowest.insert(region.to_owned(), key);
                }
            }
        }
        // Called after the commit that queued it: the release is durable.
        if let Some(queued) = self.1.of(region) {
            queued.notify_one();
        }
    }

    /// Woken (at most one permit kept) each time the writer commits a
    /// release queued for `region`; None if the lock was poisoned.
    pub fn queued(&self, region: &str) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        self.1.of(region)
    }

    /// Every link starts its next send from the first key, as after a
    /// restart: the store was reopened, and a commit that failed before
    /// may have landed with a release queued behind a link's position
    /// (fjall recovers a batch whose journal write reported an error); or
    /// a commit or flush failed, and the removal of an acknowledged
    /// release, committed without a flush of its own, may have been taken
    /// back (PostgreSQL drops what it staged): its row is back behind the
    /// position, and is sent again (the owner answers it as absent).
    pub(super) fn start_over(&self) {
        if let Ok(mut hints) = self.0.lock() {
            hints.reopens += 1;
        }
    }

    /// The lowest key queued for `region` since the last call, if any.
    /// A poisoned lock answers "from the first key" (`Some(empty)`), and
    /// so does the first call after the store was reopened.
    pub fn take(&self, region: &str) -> Option<Vec<u8>> {
        let Ok(mut hints) = self.0.lock() else {
            return Some(Vec::new());
        };
        let reopens = hints.reopens;
        let taken_at = hints.taken_at.insert(region.to_owned(), reopens).unwrap_or(0);
        let lowest = hints.lowest.remove(region);
        if taken_at < reopens {
            return Some(Vec::new());
        }
        lowest
    }
}
