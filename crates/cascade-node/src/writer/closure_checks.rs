//! The roots waiting for other regions' parts, which the writer reports
//! and the reconciler's closure check takes (see [`ClosureChecks`]).

use std::sync::Arc;

/// Operations to check for a finished cross-region closure. In memory: a
/// root that waits is re-examined by the writer every
/// `Policy::closure_check_ms`, which reports it again (also after a restart).
#[derive(Clone, Default)]
pub struct ClosureChecks(Arc<Checks>);

#[derive(Default)]
struct Checks {
    waiting: std::sync::Mutex<std::collections::BTreeSet<cascade_core::OperationId>>,
    /// Woken when the writer reports one (at most one permit kept).
    reported: Arc<tokio::sync::Notify>,
}

impl ClosureChecks {
    /// The operations reported and not yet taken by the check.
    pub fn lock(
        &self,
    ) -> std::sync::LockResult<std::sync::MutexGuard<'_, std::collections::BTreeSet<cascade_core::OperationId>>> {
        self.0.waiting.lock()
    }

    /// Reports roots that wait only for other regions' parts, and wakes
    /// the reconciler to check them now rather than at its next tick
    /// (`links.rs`): the last release of a cascade waited up to a tick
    /// there (200 ms in cascade-bench's P2) before the root could go.
    pub(crate) fn report(&self, ids: impl IntoIterator<Item = cascade_core::OperationId>) {
        if let Ok(mut waiting) = self.lock() {
            waiting.extend(ids);
        }
        self.0.reported.notify_one();
    }

    /// What [`Self::report`] wakes.
    pub(crate) fn reported(&self) -> Arc<tokio::sync::Notify> {
        self.0.reported.clone()
    }
}
