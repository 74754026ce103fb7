//! Why a node operation did not produce its value: one type for every
//! flow, converted into a gRPC status in one place (`api/mod.rs`).
//!
//! The protocol's refusals keep their [`CoreError`] (its class decides the
//! code: NOT_FOUND, FAILED_PRECONDITION with blockers, INVALID_ARGUMENT
//! with the field, ABORTED, UNAVAILABLE); storage and writer failures are
//! transient (UNAVAILABLE); what another region's node said or failed to
//! say keeps its classification, a [`RemoteError`] of the port for calls to
//! other regions (`crate::peers`).

use cascade_core::CoreError;

use crate::peers::RemoteError;
use crate::store::StoreError;

/// Why a node operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    /// The protocol refused, or a region it needs is unavailable.
    #[error(transparent)]
    Refused(#[from] CoreError),
    /// The store could not be read or written.
    #[error(transparent)]
    Storage(#[from] StoreError),
    /// The writer is restarting or the node is stopping.
    #[error(transparent)]
    Writer(#[from] WriterUnavailable),
    /// Another region's node answered with an error, could not be asked,
    /// or gave an answer this node cannot read.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// The writer is not answering (restarting, or the node is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the node's writer is unavailable: {0}")]
pub struct WriterUnavailable(pub(crate) String);

/// A read through the core's `StateRead` over the store failed: the
/// storage is unavailable, as for any other step.
impl From<cascade_core::error::StorageError> for Fault {
    fn from(e: cascade_core::error::StorageError) -> Self {
        Fault::Refused(CoreError::Storage(e))
    }
}
