//! `ConsoleError`: why a page could not be made, as the API said it, with
//! the one mapping to an HTTP status (the same whichever node serves the
//! page, since every node's API answers the same codes).

use axum::http::StatusCode;
use cascade_client::ClientError;
use cascade_proto::v1;
use tonic::Code;

#[derive(Debug, thiserror::Error)]
pub(super) enum ConsoleError {
    /// No token, or one the node did not accept: the page offers to sign in.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller's identity may not read this (the node's policy decided).
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    /// What the browser sent is not a name, an id or a page token.
    #[error("{0}")]
    BadRequest(String),
    /// The node, or a region it asked, did not answer in time.
    #[error("{0}")]
    Unavailable(String),
    /// Something changed since the page was read (ABORTED: a plan-bound
    /// delete whose closure changed since its dry run).
    #[error("{0}")]
    Conflict(String),
    /// A change not sent from a page of this console (its `Origin` is
    /// another site's, or none): refused before the API is asked.
    #[error("{0}")]
    CrossSite(String),
    #[error("{0}")]
    Internal(String),
}

impl ConsoleError {
    pub(super) fn status(&self) -> StatusCode {
        match self {
            ConsoleError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            ConsoleError::Forbidden(_) => StatusCode::FORBIDDEN,
            ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
            ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ConsoleError::Conflict(_) => StatusCode::CONFLICT,
            ConsoleError::CrossSite(_) => StatusCode::FORBIDDEN,
            ConsoleError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A short heading for the page that shows it.
    pub(super) fn title(&self) -> &'static str {
        match self {
            ConsoleError::Unauthenticated(_) => "Sign in",
            ConsoleError::Forbidden(_) => "Not allowed",
            ConsoleError::NotFound(_) => "Not found",
            ConsoleError::BadRequest(_) => "Bad request",
            ConsoleError::Unavailable(_) => "Not answering",
            ConsoleError::Conflict(_) => "Changed meanwhile",
            ConsoleError::CrossSite(_) => "Refused",
            ConsoleError::Internal(_) => "Error",
        }
    }
}

impl From<ClientError> for ConsoleError {
    fn from(e: ClientError) -> Self {
        // The client's text is the node's own message (already bounded, and
        // quoting at most a prefix of what was sent) after the code.
        let text = e.to_string();
        match e.code() {
            Some(Code::Unauthenticated) => ConsoleError::Unauthenticated(text),
            Some(Code::PermissionDenied) => ConsoleError::Forbidden(text),
            Some(Code::NotFound) => ConsoleError::NotFound(text),
            Some(Code::Aborted) => ConsoleError::Conflict(text),
            Some(Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition) => ConsoleError::BadRequest(text),
            Some(Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Cancelled) => {
                ConsoleError::Unavailable(text)
            }
            // The console could not reach its own node.
            None => ConsoleError::Unavailable(text),
            Some(_) => ConsoleError::Internal(text),
        }
    }
}

impl From<tonic::Status> for ConsoleError {
    fn from(s: tonic::Status) -> Self {
        ClientError::from(s).into()
    }
}

/// A change the API refused, with what its status's details add: the
/// members changed since the plan (ABORTED, PLAN_CHANGED) or the members
/// the caller may not change (PERMISSION_DENIED), for the page to list.
#[derive(Debug)]
pub(super) struct Refusal {
    pub error: ConsoleError,
    pub details: Option<v1::ErrorDetails>,
}

impl From<ConsoleError> for Refusal {
    fn from(error: ConsoleError) -> Self {
        Refusal { error, details: None }
    }
}

impl From<tonic::Status> for Refusal {
    fn from(s: tonic::Status) -> Self {
        Refusal {
            details: cascade_proto::status::error_details(&s),
            error: s.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_a_page_can_meet_has_its_status() {
        let cases = [
            (Code::Unauthenticated, StatusCode::UNAUTHORIZED),
            (Code::PermissionDenied, StatusCode::FORBIDDEN),
            (Code::NotFound, StatusCode::NOT_FOUND),
            (Code::Aborted, StatusCode::CONFLICT),
            (Code::InvalidArgument, StatusCode::BAD_REQUEST),
            (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
            (Code::DeadlineExceeded, StatusCode::SERVICE_UNAVAILABLE),
            (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR),
        ];
        for (code, status) in cases {
            let e = ConsoleError::from(tonic::Status::new(code, "why"));
            assert_eq!(e.status(), status, "{code:?}");
            assert!(e.to_string().contains("why"), "{e}");
        }
    }
}
