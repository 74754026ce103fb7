//! Why a call to another region's node did not return a value, in the
//! domain's terms: [`RemoteError`].
//!
//! Three outcomes, told apart at the wire edge (`api/forward.rs` has the
//! rule and how it tells them apart without guessing):
//!
//! - **the owner answered** with an error of its own: [`RemoteError::Answered`],
//!   kept whole as a [`RelayedStatus`] (plain data: code, message, details,
//!   metadata), so that a node relaying it to its own client answers
//!   exactly what the owner said, details included;
//! - **the owner could not be asked**, or did not answer in time:
//!   [`RemoteError::Unreachable`], a `CoreError::RegionUnavailable`;
//! - **the owner's answer could not be read** here: [`RemoteError::BadAnswer`].
//!
//! Nothing here is a wire type: `api/` builds a [`RelayedStatus`] from the
//! gRPC status it received and turns it back into the same status when it
//! relays it (`api/mod.rs` is where a `Fault` holding one becomes a status).

use cascade_core::CoreError;

/// Why a call to another region's node did not return a value.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The owner answered with this error.
    #[error("answered {:?}: {}", .0.code, .0.message)]
    Answered(RelayedStatus),
    /// The owner could not be asked, or did not answer in time
    /// (`CoreError::RegionUnavailable`).
    #[error(transparent)]
    Unreachable(CoreError),
    /// The owner's answer could not be decoded here (`message` says why).
    #[error("the answer of region {region} to {rpc} could not be decoded: {message}")]
    BadAnswer {
        region: String,
        rpc: &'static str,
        message: String,
    },
}

impl RemoteError {
    /// The owner refused the request itself as malformed
    /// (INVALID_ARGUMENT): asking again, or elsewhere, cannot help.
    pub(crate) fn refused_the_request(&self) -> bool {
        matches!(self, RemoteError::Answered(s) if s.code == RelayedCode::InvalidArgument)
    }

    /// The same, as the protocol sees a failed peer call: an owner that
    /// could not be asked, or whose answer was unusable, is unavailable.
    pub(crate) fn unavailable(region: &str, reason: impl Into<String>) -> Self {
        RemoteError::Unreachable(CoreError::RegionUnavailable {
            region: region.to_owned(),
            reason: reason.into(),
        })
    }
}

/// An error another region's node answered, as plain data: everything a
/// gRPC status carries across the wire, so that the wire edge rebuilds the
/// very status the owner sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayedStatus {
    pub code: RelayedCode,
    pub message: String,
    /// The encoded details (Cascade's `ErrorDetails`), as sent.
    pub details: Vec<u8>,
    /// The answer's other headers and trailers, name and raw value, in the
    /// order received (binary ones as they travel, base64).
    pub metadata: Vec<(String, Vec<u8>)>,
}

/// The canonical status codes, numbered as gRPC numbers them (a code this
/// node does not know reads as `Unknown`, as gRPC reads it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayedCode {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl RelayedCode {
    /// The code numbered `n`.
    pub(crate) fn from_number(n: i32) -> Self {
        use RelayedCode as C;
        match n {
            0 => C::Ok,
            1 => C::Cancelled,
            3 => C::InvalidArgument,
            4 => C::DeadlineExceeded,
            5 => C::NotFound,
            6 => C::AlreadyExists,
            7 => C::PermissionDenied,
            8 => C::ResourceExhausted,
            9 => C::FailedPrecondition,
            10 => C::Aborted,
            11 => C::OutOfRange,
            12 => C::Unimplemented,
            13 => C::Internal,
            14 => C::Unavailable,
            15 => C::DataLoss,
            16 => C::Unauthenticated,
            _ => C::Unknown,
        }
    }

    /// Its number.
    pub(crate) fn number(self) -> i32 {
        self as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_keeps_its_number() {
        for n in 0..=16 {
            assert_eq!(RelayedCode::from_number(n).number(), n);
        }
        assert_eq!(RelayedCode::from_number(17), RelayedCode::Unknown);
        assert_eq!(RelayedCode::from_number(-1), RelayedCode::Unknown);
    }
}
