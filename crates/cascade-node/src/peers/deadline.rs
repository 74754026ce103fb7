//! When a client's call must be answered by, as the domain carries it to
//! the calls it makes on other regions for that call: [`Deadline`].
//!
//! The wire edge reads the client's `grpc-timeout` when its call arrives
//! (`api/forward.rs`'s `caller_deadline`) and makes it a [`Deadline`]: that
//! instant less a margin for the answer to get back ([`answer_margin`]).
//! Each call to another region made for the client is then bounded by what
//! is left of it, and by [`PEER_CALL_TIMEOUT`] when that is shorter
//! ([`Deadline::for_call`]); with nothing left, the call is not made and
//! the request fails with `CoreError::DeadlineExceeded` (DEADLINE_EXCEEDED),
//! as it does when a call times out on the caller's time
//! ([`Deadline::blame`]).
//!
//! Calls made by background tasks (a link's Watch and resync, the outbox
//! of releases, acks, the periodic check, the reconciler's attach) have no
//! caller: [`Deadline::NONE`], bounded by [`PEER_CALL_TIMEOUT`] alone.

use std::time::Duration;

use cascade_core::{CoreError, Timestamp};
use tokio::time::Instant;

use super::{RemoteError, PEER_CALL_TIMEOUT};

/// What a call that waits on other regions keeps of its caller's deadline
/// for its own answer to get back: a tenth of it, at least 20 ms.
pub(crate) fn answer_margin(caller: Duration) -> Duration {
    (caller / 10).max(Duration::from_millis(20))
}

/// The instant a client's call must be answered by, less the margin for
/// the answer ([`answer_margin`]); or none (no caller, or a caller without
/// a deadline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    answer_by: Option<Instant>,
}

impl Deadline {
    /// No caller's deadline: each call bounded by [`PEER_CALL_TIMEOUT`].
    pub(crate) const NONE: Deadline = Deadline { answer_by: None };

    /// The deadline of a call that arrived just now whose caller gave it
    /// `caller` (its `grpc-timeout`), if any.
    pub(crate) fn from_caller(caller: Option<Duration>) -> Self {
        Self::from_caller_at(crate::clock::monotonic_now(), caller)
    }

    /// A deadline `left` from now, for work whose bound is already net of
    /// its answer's margin (the root's own part of an undelete, within
    /// what its drive has left of the client's deadline).
    pub(crate) fn within(left: Duration) -> Self {
        Deadline {
            answer_by: crate::clock::monotonic_now().checked_add(left),
        }
    }

    fn from_caller_at(now: Instant, caller: Option<Duration>) -> Self {
        // A `grpc-timeout` can say 99,999,999 hours: one past what the
        // clock can add counts as none.
        Deadline {
            answer_by: caller.and_then(|c| now.checked_add(c.saturating_sub(answer_margin(c)))),
        }
    }

    /// What is left of it (None: no caller's deadline).
    pub(crate) fn left(&self) -> Option<Duration> {
        self.answer_by
            .map(|at| at.saturating_duration_since(crate::clock::monotonic_now()))
    }

    /// Whether the caller's time has run out.
    pub(crate) fn passed(&self) -> bool {
        self.left().is_some_and(|left| left.is_zero())
    }

    /// The bound of one call `call` to `region` made now: what is left of
    /// the caller's deadline, and at most [`PEER_CALL_TIMEOUT`]. With
    /// nothing left, `CoreError::DeadlineExceeded`: the caller does not
    /// call the region at all.
    pub(crate) fn for_call(&self, region: &str, call: &str) -> Result<Duration, CoreError> {
        self.for_call_within(PEER_CALL_TIMEOUT, region, call)
    }

    /// [`Deadline::for_call`] for a call whose own bound is `bound` rather
    /// than [`PEER_CALL_TIMEOUT`] (a client's call forwarded to its owner,
    /// which may itself call other regions: `api/forward.rs`'s
    /// `FORWARD_TIMEOUT`).
    pub(crate) fn for_call_within(&self, bound: Duration, region: &str, call: &str) -> Result<Duration, CoreError> {
        match self.left() {
            None => Ok(bound),
            Some(left) if left.is_zero() => Err(CoreError::DeadlineExceeded {
                region: region.to_owned(),
                call: call.to_owned(),
            }),
            Some(left) => Ok(left.min(bound)),
        }
    }

    /// A call to `region` that failed for want of an answer (the region
    /// unavailable) once the caller's time ran out: it ran out on the
    /// caller's time, so `CoreError::DeadlineExceeded`. An owner's own
    /// refusal, and any failure while time is left, stay as they are.
    pub(crate) fn blame(&self, region: &str, call: &str, e: CoreError) -> CoreError {
        match e {
            CoreError::RegionUnavailable { .. } if self.passed() => CoreError::DeadlineExceeded {
                region: region.to_owned(),
                call: call.to_owned(),
            },
            other => other,
        }
    }

    /// [`Deadline::blame`] for a call's [`RemoteError`]: one that did not
    /// get an answer, or whose answer is that the call itself ran out of
    /// time (the region's node ended it on the deadline it carried), is
    /// the caller's deadline once that passed.
    pub(crate) fn blame_remote(&self, region: &str, call: &str, e: RemoteError) -> RemoteError {
        use super::RelayedCode::{Cancelled, DeadlineExceeded};
        if !self.passed() {
            return e;
        }
        let timed_out = match &e {
            RemoteError::Unreachable(CoreError::RegionUnavailable { .. }) => true,
            RemoteError::Answered(s) => matches!(s.code, Cancelled | DeadlineExceeded),
            _ => false,
        };
        if timed_out {
            RemoteError::Unreachable(CoreError::DeadlineExceeded {
                region: region.to_owned(),
                call: call.to_owned(),
            })
        } else {
            e
        }
    }
}

/// A step of a change (a create, update, delete, lien, finalizer report,
/// operation control, undelete, purge or Admin action) that a node of
/// another region forwarded and gave up on at `answer_by` (the instant its
/// call carried: `api/forward.rs`'s `ANSWER_BY`), taken at `now` in
/// `region`: refused once that passed (`CoreError::DeadlineExceeded`), so
/// that a change its client was answered DEADLINE_EXCEEDED for has not
/// happened. Called first in the writer's step of the change, so that no
/// window lies between the check and the commit. A call held on the way
/// arrives after its forwarder gave up, and its own `grpc-timeout` counts
/// from its arrival. None (not forwarded): nothing to refuse.
pub(crate) fn still_awaited(
    answer_by: Option<Timestamp>,
    now: Timestamp,
    region: &str,
    call: &str,
) -> Result<(), CoreError> {
    match answer_by {
        Some(by) if now > by => Err(CoreError::DeadlineExceeded {
            region: region.to_owned(),
            call: call.to_owned(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_is_a_tenth_of_the_callers_deadline_and_at_least_twenty_milliseconds() {
        assert_eq!(answer_margin(Duration::from_secs(1)), Duration::from_millis(100));
        assert_eq!(answer_margin(Duration::from_millis(100)), Duration::from_millis(20));
        assert_eq!(answer_margin(Duration::ZERO), Duration::from_millis(20));
    }

    /// A call that arrived `ago` with a deadline of `caller`.
    fn arrived(ago: Duration, caller: Duration) -> Deadline {
        let now = crate::clock::monotonic_now();
        let then = now.checked_sub(ago).expect("the clock goes back that far");
        Deadline::from_caller_at(then, Some(caller))
    }

    #[test]
    fn a_call_gets_what_is_left_of_the_callers_deadline_up_to_the_peer_call_bound() {
        let second = Duration::from_secs(1);
        let within = arrived(Duration::ZERO, second).for_call("us-east", "Attach").unwrap();
        // 900 ms: a tenth kept for the answer (less the microseconds since).
        assert!(
            within <= Duration::from_millis(900) && within > Duration::from_millis(800),
            "{within:?}"
        );
        let later = arrived(Duration::from_millis(600), second)
            .for_call("us-east", "Attach")
            .unwrap();
        assert!(
            later <= Duration::from_millis(300) && later > Duration::from_millis(200),
            "{later:?}"
        );
        let long = arrived(Duration::ZERO, Duration::from_secs(60));
        assert_eq!(long.for_call("us-east", "Attach"), Ok(PEER_CALL_TIMEOUT));
        assert_eq!(Deadline::NONE.for_call("us-east", "Attach"), Ok(PEER_CALL_TIMEOUT));
        assert!(!Deadline::NONE.passed());
        assert_eq!(Deadline::from_caller(None), Deadline::NONE);

        // Less than the margin left: the region is not asked at all.
        let spent = arrived(Duration::from_millis(950), second);
        assert!(spent.passed());
        assert_eq!(
            spent.for_call("us-east", "Attach"),
            Err(CoreError::DeadlineExceeded {
                region: "us-east".into(),
                call: "Attach".into()
            })
        );
        // A deadline too far off for the clock is none (99,999,999 hours).
        assert_eq!(
            Deadline::from_caller(Some(Duration::from_secs(99_999_999 * 3600))).for_call("us-east", "Attach"),
            Ok(PEER_CALL_TIMEOUT)
        );
    }

    #[test]
    fn only_a_call_left_unanswered_on_the_callers_time_is_the_callers_deadline() {
        let unavailable = || CoreError::RegionUnavailable {
            region: "us-east".into(),
            reason: "Attach got no answer".into(),
        };
        let hundred = Duration::from_millis(100);
        // Time left: an unavailable region is that.
        let fresh = arrived(Duration::ZERO, Duration::from_secs(10));
        assert_eq!(fresh.blame("us-east", "Attach", unavailable()), unavailable());
        let spent = arrived(hundred, hundred);
        assert_eq!(
            spent.blame("us-east", "Attach", unavailable()),
            CoreError::DeadlineExceeded {
                region: "us-east".into(),
                call: "Attach".into()
            }
        );
        // The owner's own refusal stays one, however late it came.
        let refused = CoreError::AttachRefused {
            region: "us-east".into(),
            reason: "no".into(),
        };
        assert_eq!(spent.blame("us-east", "Attach", refused.clone()), refused);
        // Without a caller's deadline nothing is ever the caller's.
        assert_eq!(Deadline::NONE.blame("us-east", "Attach", unavailable()), unavailable());
    }

    #[test]
    fn a_forwarded_action_is_refused_once_its_forwarder_gave_up() {
        let by = Some(Timestamp(1_000));
        assert_eq!(still_awaited(by, Timestamp(1_000), "rb", "ForcePurge"), Ok(()));
        assert_eq!(
            still_awaited(by, Timestamp(1_001), "rb", "ForcePurge"),
            Err(CoreError::DeadlineExceeded {
                region: "rb".into(),
                call: "ForcePurge".into()
            })
        );
        assert_eq!(still_awaited(None, Timestamp(u64::MAX), "rb", "ForcePurge"), Ok(()));
    }
}
