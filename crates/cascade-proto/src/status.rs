//! Core errors ↔ gRPC statuses a client can act on.
//!
//! | core class | gRPC code |
//! |---|---|
//! | InvalidArgument (the field is named in the message and details) | INVALID_ARGUMENT |
//! | NotFound | NOT_FOUND |
//! | AlreadyExists | ALREADY_EXISTS |
//! | FailedPrecondition (blockers/dependents in the details) | FAILED_PRECONDITION |
//! | Aborted (etag mismatch) | ABORTED |
//! | Unavailable (storage, writer restarting) | UNAVAILABLE |

use cascade_core::{CoreError, ErrorCode};
use prost::Message;
use tonic::{Code, Status};

use crate::v1;

pub fn code_of(code: ErrorCode) -> Code {
    match code {
        ErrorCode::InvalidArgument => Code::InvalidArgument,
        ErrorCode::NotFound => Code::NotFound,
        ErrorCode::AlreadyExists => Code::AlreadyExists,
        ErrorCode::FailedPrecondition => Code::FailedPrecondition,
        ErrorCode::Aborted => Code::Aborted,
        ErrorCode::Unavailable => Code::Unavailable,
        ErrorCode::Internal => Code::Internal,
    }
}

fn dependents(list: &[cascade_core::error::Dependent]) -> Vec<v1::Dependent> {
    list.iter()
        .map(|d| v1::Dependent {
            referrer: d.referrer.to_string(),
            field: d.field.clone(),
            on_delete: d.on_delete.to_string(),
        })
        .collect()
}

/// The status for a core error, with structured details where a client can use them.
pub fn status_from_core(err: &CoreError) -> Status {
    let code = code_of(err.code());
    let details = match err {
        CoreError::InvalidArgument { field, .. } => Some(v1::ErrorDetails {
            field: field.clone(),
            ..Default::default()
        }),
        CoreError::DeleteRefused {
            blockers,
            dependents: deps,
            more,
            ..
        } => Some(v1::ErrorDetails {
            field: String::new(),
            blockers: dependents(blockers),
            dependents: dependents(deps),
            more: *more as u64,
        }),
        CoreError::TargetDeleting { field, .. }
        | CoreError::TargetNotFound { field, .. }
        | CoreError::TargetUidMismatch { field, .. }
        | CoreError::RemoteReference { field, .. } => Some(v1::ErrorDetails {
            field: field.clone(),
            ..Default::default()
        }),
        _ => None,
    };
    match details {
        Some(d) => Status::with_details(code, err.to_string(), d.encode_to_vec().into()),
        None => Status::new(code, err.to_string()),
    }
}

/// The structured details a Cascade server put in a status, if any.
pub fn error_details(status: &Status) -> Option<v1::ErrorDetails> {
    if status.details().is_empty() {
        return None;
    }
    v1::ErrorDetails::decode(status.details()).ok()
}

/// A request field that could not be decoded.
pub fn invalid_field(field: &str, message: impl std::fmt::Display) -> Status {
    let details = v1::ErrorDetails {
        field: field.to_owned(),
        ..Default::default()
    };
    Status::with_details(
        Code::InvalidArgument,
        format!("{field}: {message}"),
        details.encode_to_vec().into(),
    )
}
