//! Calls this node makes to another region's node on a client's behalf,
//! and the one rule that turns their outcome into this node's answer.
//!
//! Forwarded requests (Create, BatchCreate, Get, Update, Delete for a name
//! of another region), the Lookup and Attach of a cross-region reference,
//! and the parts of an aggregated operation all go through
//! [`call_owner`], which classifies what came back:
//!
//! - **The owner answered** with a status of its own: [`OwnerError::Answered`].
//!   A forwarded call passes it through unchanged, so the same condition
//!   gets the same code and details whichever node the client asked.
//! - **The owner could not be asked**: connection refused or reset, a frozen
//!   or killed process, an HTTP/2 keepalive that went unanswered, any other
//!   transport failure, or no answer within the deadline:
//!   [`OwnerError::Unreachable`], UNAVAILABLE naming the region (clients
//!   retry it). Without this, tonic reports most transport failures as
//!   UNKNOWN "transport error".
//! - **The owner's answer could not be decoded** by this node:
//!   [`OwnerError::BadAnswer`], INTERNAL (neither the client's fault, which
//!   INVALID_ARGUMENT would say, nor something a retry fixes).
//!
//! Telling them apart without guessing from codes or messages: tonic builds
//! the status of a server's answer from its `grpc-status` with no error
//! source, and the status of a local failure (the transport, this node's own
//! decoder) from an error it keeps as the status's source; the decoder marks
//! its failures ([`cascade_proto::codec::is_undecodable`]).

use std::future::Future;
use std::time::Duration;

use cascade_core::CoreError;
use cascade_proto::status_from_core;
use tonic::{Response, Status};

/// Deadline of a forwarded client call. The owner may itself call other
/// regions for it (a create's Lookup and Attach, each bounded by
/// [`crate::peers::PEER_CALL_TIMEOUT`]), so this is longer than those; a
/// dead or frozen owner is noticed sooner by the channel's HTTP/2 keepalive.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a call to another region's node did not return a value.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// The owner answered with this status.
    #[error("answered {:?}: {}", .0.code(), .0.message())]
    Answered(Status),
    /// The owner could not be asked, or did not answer in time
    /// (`CoreError::RegionUnavailable`).
    #[error(transparent)]
    Unreachable(CoreError),
    /// The owner's answer could not be decoded here.
    #[error("the answer of region {region} to {rpc} could not be decoded: {}", .status.message())]
    BadAnswer {
        region: String,
        rpc: &'static str,
        status: Status,
    },
}

impl OwnerError {
    /// The owner refused the request itself as malformed
    /// (INVALID_ARGUMENT): asking again, or elsewhere, cannot help.
    pub(crate) fn refused_the_request(&self) -> bool {
        matches!(self, OwnerError::Answered(s) if s.code() == tonic::Code::InvalidArgument)
    }

    /// The status this node answers its own client with.
    pub(crate) fn into_status(self) -> Status {
        match self {
            OwnerError::Answered(status) => status,
            OwnerError::Unreachable(e) => status_from_core(&e),
            OwnerError::BadAnswer { region, rpc, status } => Status::internal(format!(
                "the answer of region {region} to {rpc} could not be decoded: {}",
                status.message()
            )),
        }
    }

    /// The same, as the protocol sees a failed peer call: an owner that
    /// could not be asked, or whose answer was unusable, is unavailable.
    pub(crate) fn unavailable(region: &str, reason: impl Into<String>) -> Self {
        OwnerError::Unreachable(CoreError::RegionUnavailable {
            region: region.to_owned(),
            reason: reason.into(),
        })
    }
}

impl From<OwnerError> for Status {
    fn from(e: OwnerError) -> Self {
        e.into_status()
    }
}

/// Calls `rpc` at `region`'s node with a deadline and classifies the
/// outcome (see the module doc).
pub(crate) async fn call_owner<T>(
    region: &str,
    rpc: &'static str,
    deadline: Duration,
    call: impl Future<Output = Result<Response<T>, Status>>,
) -> Result<T, OwnerError> {
    match tokio::time::timeout(deadline, call).await {
        Ok(result) => classify(region, rpc, result),
        Err(_) => Err(OwnerError::unavailable(
            region,
            format!("{rpc} got no answer within {deadline:?}"),
        )),
    }
}

/// The rule itself, for a call that finished (see the module doc).
pub(crate) fn classify<T>(
    region: &str,
    rpc: &'static str,
    result: Result<Response<T>, Status>,
) -> Result<T, OwnerError> {
    let status = match result {
        Ok(response) => return Ok(response.into_inner()),
        Err(status) => status,
    };
    if cascade_proto::codec::is_undecodable(&status) {
        return Err(OwnerError::BadAnswer {
            region: region.to_owned(),
            rpc,
            status,
        });
    }
    if std::error::Error::source(&status).is_some() {
        return Err(OwnerError::unavailable(
            region,
            format!("{rpc}: {}", describe_transport(&status)),
        ));
    }
    Err(OwnerError::Answered(status))
}

/// A transport failure with its causes (the interesting part is often two
/// levels down: "connection reset", "keep-alive timed out").
fn describe_transport(status: &Status) -> String {
    let mut parts = vec![status.message().to_owned()];
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        let text = e.to_string();
        if !parts.contains(&text) {
            parts.push(text);
        }
        cause = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn an_answer_passes_through_and_a_transport_failure_is_unavailable() {
        let answered = Status::failed_precondition("refs.network: eu-west/network/n is being deleted");
        match classify::<()>("eu-west", "Create", Err(answered)) {
            Err(OwnerError::Answered(s)) => assert_eq!(s.code(), Code::FailedPrecondition),
            other => panic!("{other:?}"),
        }
        // What tonic makes of a broken connection: UNKNOWN with the error as source.
        let broken = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        )));
        assert_eq!(broken.code(), Code::Unknown);
        let s = classify::<()>("us-east", "Get", Err(broken)).unwrap_err().into_status();
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert!(
            s.message().contains("us-east") && s.message().contains("reset"),
            "{s:?}"
        );
        let details = cascade_proto::error_details(&s).expect("details");
        assert_eq!(details.region, "us-east");
        assert_eq!(details.reason, cascade_proto::v1::ErrorReason::RegionUnavailable as i32);
    }

    #[tokio::test]
    async fn no_answer_within_the_deadline_is_unavailable() {
        let never = std::future::pending::<Result<Response<()>, Status>>();
        let s = call_owner("us-east", "Delete", Duration::from_millis(10), never)
            .await
            .unwrap_err()
            .into_status();
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    }
}
