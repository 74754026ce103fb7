//! Calls this node makes to another region's node on a client's behalf,
//! and the one rule that turns their outcome into this node's answer.
//!
//! Forwarded requests (every Resources call about a name or region of
//! another region's, and the Admin calls about one: [`forward`]), the
//! Lookup and Attach of a cross-region reference, and the parts of an
//! aggregated operation all go through [`call_owner`], which classifies
//! what came back:
//!
//! - **The owner answered** with a status of its own: [`RemoteError::Answered`],
//!   the status as plain data ([`RelayedStatus`]: code, message, details,
//!   metadata; [`relayed`]). A forwarded call passes it through unchanged
//!   ([`relayed_status`] rebuilds the very status), so the same condition
//!   gets the same code and details whichever node the client asked.
//! - **The owner could not be asked**: connection refused or reset, a frozen
//!   or killed process, an HTTP/2 keepalive that went unanswered, any other
//!   transport failure, or no answer within the deadline:
//!   [`RemoteError::Unreachable`], UNAVAILABLE naming the region (clients
//!   retry it); DEADLINE_EXCEEDED instead once the deadline was the
//!   client's ([`forward`]). Without this, tonic reports most transport
//!   failures as UNKNOWN "transport error".
//! - **The owner's answer could not be decoded** by this node:
//!   [`RemoteError::BadAnswer`], INTERNAL (neither the client's fault, which
//!   INVALID_ARGUMENT would say, nor something a retry fixes).
//!
//! Telling them apart without guessing from codes or messages: tonic builds
//! the status of a server's answer from its `grpc-status` with no error
//! source, and the status of a local failure (the transport, this node's own
//! decoder) from an error it keeps as the status's source; the decoder marks
//! its failures ([`cascade_proto::codec::is_undecodable`]).
//!
//! [`RemoteError`] is the domain's (`crate::peers`, the port for calls to
//! other regions): this module builds it from what tonic returned, and turns
//! it back into the status this node answers with ([`status_of`]).
//!
//! A call that gathers from other regions for its client (ExplainDeletion)
//! has one deadline in all, derived from the client's own ([`caller_deadline`],
//! [`budget_within`]) rather than [`FORWARD_TIMEOUT`]; forwarded, it carries
//! that deadline to the owner. Every forwarded call carries the client's
//! deadline and the instant its forwarder gives up ([`forward`],
//! [`ANSWER_BY`]), and the calls a node makes on other regions while it
//! serves a client's create, update or delete (the Lookup and Attach of a
//! cross-region reference, a delete's KeepsAnotherTarget) are each bounded
//! by what is left of the client's deadline ([`deadline_of`],
//! `crate::peers::Deadline`), and at most
//! [`crate::peers::PEER_CALL_TIMEOUT`].

use std::future::Future;
use std::time::Duration;

use cascade_core::Timestamp;
use cascade_proto::status_from_core;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::peers::{answer_margin, Deadline, RelayedCode, RelayedStatus, RemoteError};

/// Deadline of a forwarded client call. The owner may itself call other
/// regions for it (a create's Lookup and Attach, each bounded by
/// [`crate::peers::PEER_CALL_TIMEOUT`]), so this is longer than those; a
/// dead or frozen owner is noticed sooner by the channel's HTTP/2 keepalive.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// The deadline the caller gave its call, from the `grpc-timeout` request
/// header (up to 8 digits and a unit: `H`, `M`, `S`, `m`, `u`, `n`); None
/// without one, or with one that does not parse (as tonic's server reads it).
pub(crate) fn caller_deadline(metadata: &MetadataMap) -> Option<Duration> {
    let text = metadata.get("grpc-timeout")?.to_str().ok()?;
    let digits = text.get(..text.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    Some(match text.get(digits.len()..)? {
        "H" => Duration::from_secs(value * 3600),
        "M" => Duration::from_secs(value * 60),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

/// The time a call that gathers from other regions has: `default`, or less
/// when the caller's own deadline ([`caller_deadline`]) leaves less, keeping
/// a tenth of it (at least 20 ms) for the answer to get back
/// ([`crate::peers::answer_margin`]).
pub(crate) fn budget_within(default: Duration, metadata: &MetadataMap) -> Duration {
    match caller_deadline(metadata) {
        Some(caller) => default.min(caller.saturating_sub(answer_margin(caller))),
        None => default,
    }
}

/// The caller's deadline as the domain carries it to the calls it makes on
/// other regions for this call (a create's Lookup and Attach, a delete's
/// KeepsAnotherTarget): read from its `grpc-timeout` now, as the call
/// arrives ([`caller_deadline`]).
pub(crate) fn deadline_of(metadata: &MetadataMap) -> Deadline {
    Deadline::from_caller(caller_deadline(metadata))
}

/// A client's call as it arrives: its deadline for the calls this node
/// makes on other regions for it, a forward to its owner included
/// ([`deadline_of`]), and, when another region's node forwarded it here,
/// the instant that node gives up ([`answer_by`]), past which the change
/// it asks for is refused in its step (`crate::peers::still_awaited`).
pub(crate) fn deadlines<T>(request: &Request<T>) -> (Deadline, Option<Timestamp>) {
    let metadata = request.metadata();
    (deadline_of(metadata), answer_by(metadata))
}

/// `message` as a call to another region's node that carries `budget` as
/// its `grpc-timeout`: the owner keeps to the client's deadline too.
pub(crate) fn with_timeout<T>(message: T, budget: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(budget);
    request
}

/// The header in which a forwarded call carries the instant its forwarder
/// gives up, in milliseconds of that node's clock (a `Timestamp`). A
/// `grpc-timeout` counts from when the call arrives, and a call held on
/// the way (a partition that heals) arrives after its forwarder gave up
/// and answered DEADLINE_EXCEEDED: the owner refuses a change (a create,
/// update, delete, lien, finalizer report, operation control, undelete,
/// purge or Admin action) whose step comes after this instant ([`answer_by`],
/// `crate::peers::still_awaited`), so that an action refused for time has
/// not happened (as long as the two nodes' clocks agree to within it).
pub(crate) const ANSWER_BY: &str = "cascade-answer-by-ms";

/// The instant a forwarded call's forwarder gives up ([`ANSWER_BY`]);
/// None for a call that was not forwarded, or a value that is no number.
pub(crate) fn answer_by(metadata: &MetadataMap) -> Option<Timestamp> {
    let text = metadata.get(ANSWER_BY)?.to_str().ok()?;
    if text.is_empty() || text.len() > 20 {
        return None;
    }
    text.parse().ok().map(Timestamp)
}

/// Runs `work`, this node's side of a change (its writer step, and the
/// audit entry of a refusal), to its end: in a task of its own when
/// another region's node forwarded the call (`answer_by` Some, read by
/// [`answer_by`]). A forwarder that gives up resets its call, and the
/// server then drops the call's handler at its next await: the step,
/// queued in the writer, ran all the same, but the audit entry of its
/// refusal for time (the very case of a forward that arrived late) was
/// never written. A call not forwarded runs in its handler as before (a
/// client that cancels cuts it there: see `cluster.rs` on a cut create).
pub(crate) async fn to_the_end<T>(
    answer_by: Option<Timestamp>,
    work: impl Future<Output = Result<T, Status>> + Send + 'static,
) -> Result<T, Status>
where
    T: Send + 'static,
{
    if answer_by.is_none() {
        return work.await;
    }
    match tokio::spawn(work.in_current_span()).await {
        Ok(done) => done,
        Err(e) => Err(Status::internal(format!("the change stopped before its answer: {e}"))),
    }
}

/// Forwards a client's call `rpc` to its owner `region` (`send` makes the
/// call of `request`), within what is left of the client's `deadline` and
/// at most `bound` (the call's own: [`FORWARD_TIMEOUT`], or an
/// ExplainDeletion's `EXPLAIN_BUDGET`). The call carries that time as its
/// `grpc-timeout`, so that the owner keeps to it too, and the instant this
/// node gives up, `now` (its clock) plus that time ([`ANSWER_BY`]). With
/// nothing left the owner is not asked; an owner that does not answer in
/// time, or that ends the call on the deadline it carried, is the client's
/// deadline once that has passed: either way DEADLINE_EXCEEDED naming the
/// region (`CoreError::DeadlineExceeded`), not UNAVAILABLE. An owner that
/// does not answer within `bound` while the client's deadline has time left
/// (or without one) is UNAVAILABLE naming the region.
pub(crate) async fn forward<M, T, Fut>(
    region: &str,
    rpc: &'static str,
    deadline: &Deadline,
    bound: Duration,
    now: Timestamp,
    mut request: Request<M>,
    send: impl FnOnce(Request<M>) -> Fut,
) -> Result<T, RemoteError>
where
    Fut: Future<Output = Result<Response<T>, Status>>,
{
    let budget = deadline
        .for_call_within(bound, region, rpc)
        .map_err(RemoteError::Unreachable)?;
    request.set_timeout(budget);
    let millis = u64::try_from(budget.as_millis()).unwrap_or(u64::MAX);
    if let Ok(by) = now.plus_millis(millis).0.to_string().parse() {
        request.metadata_mut().insert(ANSWER_BY, by);
    }
    call_owner(region, rpc, budget, send(request))
        .await
        .map_err(|e| deadline.blame_remote(region, rpc, e))
}

/// The status this node answers its own client with.
pub(crate) fn status_of(e: RemoteError) -> Status {
    match e {
        RemoteError::Answered(answered) => relayed_status(&answered),
        RemoteError::Unreachable(e) => status_from_core(&e),
        RemoteError::BadAnswer { region, rpc, message } => Status::internal(format!(
            "the answer of region {region} to {rpc} could not be decoded: {message}"
        )),
    }
}

impl From<RemoteError> for Status {
    fn from(e: RemoteError) -> Self {
        status_of(e)
    }
}

/// An owner's status as plain data, all of it: code, message, details and
/// metadata (what tonic read from the answer's headers and trailers).
pub(crate) fn relayed(status: &Status) -> RelayedStatus {
    let headers = status.metadata().clone().into_headers();
    RelayedStatus {
        code: RelayedCode::from_number(status.code() as i32),
        message: status.message().to_owned(),
        details: status.details().to_vec(),
        metadata: headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
            .collect(),
    }
}

/// The very status the owner sent, from [`relayed`]'s copy of it.
pub(crate) fn relayed_status(answered: &RelayedStatus) -> Status {
    let mut headers = http::HeaderMap::with_capacity(answered.metadata.len());
    for (name, value) in &answered.metadata {
        // They were a header name and value when they arrived.
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    Status::with_details_and_metadata(
        tonic::Code::from(answered.code.number()),
        answered.message.clone(),
        answered.details.clone().into(),
        MetadataMap::from_headers(headers),
    )
}

/// Calls `rpc` at `region`'s node with a deadline and classifies the
/// outcome (see the module doc).
pub(crate) async fn call_owner<T>(
    region: &str,
    rpc: &'static str,
    deadline: Duration,
    call: impl Future<Output = Result<Response<T>, Status>>,
) -> Result<T, RemoteError> {
    match tokio::time::timeout(deadline, call).await {
        Ok(result) => classify(region, rpc, result),
        Err(_) => Err(RemoteError::unavailable(
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
) -> Result<T, RemoteError> {
    let status = match result {
        Ok(response) => return Ok(response.into_inner()),
        Err(status) => status,
    };
    if cascade_proto::codec::is_undecodable(&status) {
        return Err(RemoteError::BadAnswer {
            region: region.to_owned(),
            rpc,
            message: status.message().to_owned(),
        });
    }
    if std::error::Error::source(&status).is_some() {
        return Err(RemoteError::unavailable(
            region,
            format!("{rpc}: {}", describe_transport(&status)),
        ));
    }
    Err(RemoteError::Answered(relayed(&status)))
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
    use cascade_core::CoreError;
    use std::cell::RefCell;
    use tonic::Code;

    fn is_deadline_exceeded(answer: Result<(), RemoteError>, rpc: &str) {
        match answer {
            Err(RemoteError::Unreachable(CoreError::DeadlineExceeded { region, call })) => {
                assert_eq!((region.as_str(), call.as_str()), ("rb", rpc));
            }
            other => panic!("expected the client's deadline, got {other:?}"),
        }
    }

    /// With none of the client's deadline left the owner is not asked; an
    /// owner that does not answer within it is the client's deadline, not
    /// UNAVAILABLE; and the call carries both the time it has and the
    /// instant its forwarder gives up.
    #[tokio::test]
    async fn a_forward_keeps_to_the_clients_deadline_and_carries_it() {
        let sent = RefCell::new(None);
        let send = |r: Request<()>| {
            let carried = (caller_deadline(r.metadata()), answer_by(r.metadata()));
            *sent.borrow_mut() = Some(carried);
            std::future::pending::<Result<Response<()>, Status>>()
        };
        let spent = Deadline::within(Duration::ZERO);
        is_deadline_exceeded(
            forward(
                "rb",
                "ForcePurge",
                &spent,
                FORWARD_TIMEOUT,
                Timestamp(1_000),
                Request::new(()),
                send,
            )
            .await,
            "ForcePurge",
        );
        assert_eq!(*sent.borrow(), None, "not sent");

        let short = Deadline::within(Duration::from_millis(50));
        let send = |r: Request<()>| {
            let carried = (caller_deadline(r.metadata()), answer_by(r.metadata()));
            *sent.borrow_mut() = Some(carried);
            std::future::pending::<Result<Response<()>, Status>>()
        };
        is_deadline_exceeded(
            forward(
                "rb",
                "ListDeletions",
                &short,
                FORWARD_TIMEOUT,
                Timestamp(1_000),
                Request::new(()),
                send,
            )
            .await,
            "ListDeletions",
        );
        let (timeout, by) = sent.borrow().expect("sent");
        let timeout = timeout.expect("a grpc-timeout");
        assert!(
            timeout <= Duration::from_millis(50) && timeout > Duration::ZERO,
            "{timeout:?}"
        );
        let by = by.expect("the instant it gives up").0;
        assert!((1_000..=1_050).contains(&by), "{by}");
    }

    /// The owner's side of a change: forwarded, it runs to its end though
    /// its call is dropped (the forwarder's reset); not forwarded, it is
    /// cut with its call, as before.
    #[tokio::test]
    async fn a_forwarded_change_runs_to_its_end_when_its_call_is_dropped() {
        for (answer_by, finishes) in [(Some(Timestamp(1_000)), true), (None, false)] {
            let (go, wait) = tokio::sync::oneshot::channel::<()>();
            let (finished, done) = tokio::sync::oneshot::channel();
            let work = async move {
                let _ = wait.await;
                let _ = finished.send(());
                Ok::<_, Status>(())
            };
            let call = tokio::spawn(to_the_end(answer_by, work));
            // The call starts (its work is under way), then is dropped.
            tokio::task::yield_now().await;
            call.abort();
            let _ = call.await;
            let _ = go.send(());
            assert_eq!(done.await.is_ok(), finishes, "forwarded: {}", answer_by.is_some());
        }
    }

    #[test]
    fn an_answer_passes_through_and_a_transport_failure_is_unavailable() {
        let answered = Status::failed_precondition("refs.network: eu-west/network/n is being deleted");
        match classify::<()>("eu-west", "Create", Err(answered)) {
            Err(RemoteError::Answered(s)) => assert_eq!(s.code, RelayedCode::FailedPrecondition),
            other => panic!("{other:?}"),
        }
        // What tonic makes of a broken connection: UNKNOWN with the error as source.
        let broken = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        )));
        assert_eq!(broken.code(), Code::Unknown);
        let s = status_of(classify::<()>("us-east", "Get", Err(broken)).unwrap_err());
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert!(
            s.message().contains("us-east") && s.message().contains("reset"),
            "{s:?}"
        );
        let details = cascade_proto::error_details(&s).expect("details");
        assert_eq!(details.region, "us-east");
        assert_eq!(details.reason, cascade_proto::v1::ErrorReason::RegionUnavailable as i32);
    }

    #[test]
    fn the_callers_deadline_is_read_from_grpc_timeout_and_bounds_the_budget() {
        let with = |value: &str| {
            let mut m = MetadataMap::new();
            m.insert("grpc-timeout", value.parse().unwrap());
            m
        };
        let read = |value: &str| caller_deadline(&with(value));
        assert_eq!(read("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(read("2M"), Some(Duration::from_secs(120)));
        assert_eq!(read("30S"), Some(Duration::from_secs(30)));
        assert_eq!(read("500m"), Some(Duration::from_millis(500)));
        assert_eq!(read("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(read("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "S", "123456789S", "1.5S", "-1S", "10x", "10", " 1S"] {
            assert_eq!(read(bad), None, "{bad:?}");
        }
        assert_eq!(caller_deadline(&MetadataMap::new()), None);

        let two = Duration::from_secs(2);
        assert_eq!(budget_within(two, &MetadataMap::new()), two);
        assert_eq!(budget_within(two, &with("30S")), two);
        assert_eq!(budget_within(two, &with("1S")), Duration::from_millis(900));
        assert_eq!(budget_within(two, &with("100m")), Duration::from_millis(80));
        assert_eq!(budget_within(two, &with("10m")), Duration::ZERO);
    }

    #[tokio::test]
    async fn no_answer_within_the_deadline_is_unavailable() {
        let never = std::future::pending::<Result<Response<()>, Status>>();
        let s = status_of(
            call_owner("us-east", "Delete", Duration::from_millis(10), never)
                .await
                .unwrap_err(),
        );
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    }

    #[test]
    fn a_relayed_answer_is_the_status_the_owner_sent() {
        let details = cascade_proto::v1::ErrorDetails {
            reason: cascade_proto::v1::ErrorReason::Deleting as i32,
            field: "refs.network".into(),
            ..Default::default()
        };
        let mut sent = cascade_proto::status::with_details(
            Code::FailedPrecondition,
            "refs.network: eu-west/network/n is being deleted",
            &details,
        );
        sent.metadata_mut().insert("x-owner", "eu-west".parse().unwrap());
        sent.metadata_mut().append("x-owner", "again".parse().unwrap());
        sent.metadata_mut().insert_bin(
            "x-trace-bin",
            tonic::metadata::MetadataValue::from_bytes(b"\x00\x01raw"),
        );
        let answered = match classify::<()>("eu-west", "Create", Err(sent.clone())) {
            Err(RemoteError::Answered(answered)) => answered,
            other => panic!("{other:?}"),
        };
        let relayed = status_of(RemoteError::Answered(answered));
        assert_eq!(relayed.code(), sent.code());
        assert_eq!(relayed.message(), sent.message());
        assert_eq!(relayed.details(), sent.details());
        assert_eq!(
            relayed.metadata().clone().into_headers(),
            sent.metadata().clone().into_headers()
        );
        assert_eq!(
            cascade_proto::error_details(&relayed),
            cascade_proto::error_details(&sent)
        );
    }
}
