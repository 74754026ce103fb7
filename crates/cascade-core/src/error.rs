//! Errors of the protocol, each with the status class a client acts on.

use crate::model::Blocker;
use crate::name::{NameError, ResourceName};

/// The status class of an error, independent of any transport. The proto
/// crate maps it to a `tonic::Code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    Aborted,
    Unavailable,
    Internal,
}

/// A resource that keeps a delete from being accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependent {
    pub referrer: ResourceName,
    pub field: String,
    pub on_delete: crate::schema::OnDelete,
}

/// A failure of the storage under the protocol (read or decode).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage: {0}")]
pub struct StorageError(pub String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// A request field is wrong; `field` names it.
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    #[error("{0} not found")]
    NotFound(ResourceName),
    #[error("{name} already exists{detail}")]
    AlreadyExists { name: ResourceName, detail: &'static str },
    /// A reference (or a create under a parent) to a target being deleted.
    #[error("{field}: {target} is being deleted")]
    TargetDeleting { field: String, target: ResourceName },
    #[error("{field}: target {target} not found")]
    TargetNotFound { field: String, target: ResourceName },
    /// The message states what is known: the target's uid is not the one
    /// pinned. Whether the pinned uid was an earlier incarnation of the name
    /// (re-created) or was never this resource's is not known here (a purged
    /// uid leaves no record), so the message does not guess.
    #[error("{field}: {target} has uid {actual}, not {expected}")]
    TargetUidMismatch {
        field: String,
        target: ResourceName,
        expected: String,
        actual: String,
    },
    #[error("{name} is being deleted")]
    Deleting { name: ResourceName },
    #[error("etag mismatch on {name}: expected {expected}, current {actual}")]
    EtagMismatch {
        name: ResourceName,
        expected: String,
        actual: String,
    },
    /// A delete refused because of live references; lists them.
    #[error("{}", describe_refusal(.name, .blockers, .dependents, *.more))]
    DeleteRefused {
        name: ResourceName,
        blockers: Vec<Dependent>,
        dependents: Vec<Dependent>,
        /// How many more were found than are listed.
        more: usize,
    },
    #[error("{name} belongs to region {region}, this node serves {local}")]
    WrongRegion {
        name: ResourceName,
        region: String,
        local: String,
    },
    /// A cross-region target reached the core without its uid (the node
    /// resolves it at the owner first).
    #[error("{field}: cross-region reference to {target} was not resolved at its owner")]
    RemoteReference { field: String, target: ResourceName },
    /// A cross-region create that could not complete: the owner refused the
    /// attach, or a target was deleted meanwhile.
    #[error("create of {name} was aborted: {reason}")]
    CreateAborted { name: ResourceName, reason: String },
    /// The owner of a referenced resource refused to record the reference.
    #[error("region {region} refused the reference: {reason}")]
    AttachRefused { region: String, reason: String },
    /// A peer region could not be reached.
    #[error("region {region} is unavailable: {reason}")]
    RegionUnavailable { region: String, reason: String },
    #[error("operation {0} not found")]
    OperationNotFound(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

fn describe_refusal(name: &ResourceName, blockers: &[Dependent], dependents: &[Dependent], more: usize) -> String {
    let list = |items: &[Dependent]| {
        items
            .iter()
            .map(|d| format!("{} (field {}, {})", d.referrer, d.field, d.on_delete))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut msg = format!("cannot delete {name}: ");
    if !blockers.is_empty() {
        msg += &format!("blocked by {}", list(blockers));
    }
    if !dependents.is_empty() {
        if !blockers.is_empty() {
            msg += "; ";
        }
        msg += &format!(
            "it has dependents that would be deleted, pass cascade to delete them: {}",
            list(dependents)
        );
    }
    if more > 0 {
        msg += &format!(" (and {more} more)");
    }
    msg
}

impl CoreError {
    pub fn code(&self) -> ErrorCode {
        match self {
            CoreError::InvalidName(_) | CoreError::InvalidArgument { .. } | CoreError::WrongRegion { .. } => {
                ErrorCode::InvalidArgument
            }
            CoreError::NotFound(_) | CoreError::TargetNotFound { .. } | CoreError::OperationNotFound(_) => {
                ErrorCode::NotFound
            }
            CoreError::AlreadyExists { .. } => ErrorCode::AlreadyExists,
            CoreError::TargetDeleting { .. }
            | CoreError::TargetUidMismatch { .. }
            | CoreError::Deleting { .. }
            | CoreError::DeleteRefused { .. }
            | CoreError::CreateAborted { .. }
            | CoreError::AttachRefused { .. } => ErrorCode::FailedPrecondition,
            CoreError::RemoteReference { .. } => ErrorCode::Internal,
            CoreError::RegionUnavailable { .. } => ErrorCode::Unavailable,
            CoreError::EtagMismatch { .. } => ErrorCode::Aborted,
            CoreError::Storage(_) => ErrorCode::Unavailable,
        }
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        CoreError::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Used by [`crate::model::DeletionStatus::Blocked`] reasons.
pub fn describe_blockers(blockers: &[Blocker]) -> String {
    blockers
        .iter()
        .map(|b| {
            let state = if b.referrer_deleting {
                "itself being deleted"
            } else {
                "live, not being deleted: stuck until it is deleted or changed"
            };
            format!("blocked by {} (field {}, {state})", b.referrer, b.field)
        })
        .collect::<Vec<_>>()
        .join("; ")
}
