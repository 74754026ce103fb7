//! W3C trace context across regions, so that one deletion's spans in every
//! region it reaches belong to one trace.
//!
//! Two ways out of a node, two ways in:
//! - a call to another region carries the caller's span context in its
//!   gRPC metadata (`api/trace_propagation.rs`: an interceptor on every
//!   channel to a peer); the serving node opens the call's span as its
//!   child (the same file's `request_span`, tonic's `trace_fn`);
//! - a cross-region cascade is not a call but an event on the owner's
//!   outbox, read by the importers over a long-lived `Peer.Watch`. The
//!   writer notes the `traceparent` of the step that committed each event
//!   peers are sent ([`TraceMarks`], in memory, the last
//!   [`TRACE_MARKS_KEPT`]); the Watch stream sends it with the event; the
//!   importer applies the event in a span whose parent it is.
//!
//! What is a span, a trace or a propagator is OpenTelemetry's: the node
//! only reads the current span's context (`tracing-opentelemetry`) and uses
//! the global propagator. Without a subscriber that bridges to
//! OpenTelemetry (the binary installs one only with an OTLP endpoint; the
//! tests install an in-memory one), there is no context: nothing is added
//! to calls or events, and this costs a lookup per committed step.
//!
//! The marks are not stored: after a restart, or for an event older than
//! the last [`TRACE_MARKS_KEPT`], the importer's span starts a trace of its
//! own. Traces are a diagnostic; a durable copy in every outbox record
//! would cost every deletion bytes on disk for it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C header (and map key) of a span context.
const TRACEPARENT: &str = "traceparent";

/// Events whose `traceparent` a node remembers for its Watch streams.
pub(crate) const TRACE_MARKS_KEPT: usize = 16_384;

/// Deletion operations whose trace a node remembers.
pub(crate) const OPERATION_TRACES_KEPT: usize = 4_096;

use cascade_core::OperationId;

/// The current span's context as a `traceparent` value, when there is one.
pub(crate) fn current_traceparent() -> Option<String> {
    let context = Span::current().context();
    let mut carrier = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.inject_context(&context, &mut carrier));
    carrier.remove(TRACEPARENT)
}

/// The context a `traceparent` names.
fn context_of(traceparent: &str) -> opentelemetry::Context {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&carrier))
}

/// Makes `span` a child of the span `traceparent` names (from a peer event).
pub(crate) fn adopt_parent(span: &Span, traceparent: &str) {
    let _ = span.set_parent(context_of(traceparent));
}

/// Links `span` to the span `traceparent` names: a step that applies
/// events of several traces is the child of one and linked to the others.
pub(crate) fn link_to(span: &Span, traceparent: &str) {
    use opentelemetry::trace::TraceContextExt;
    let context = context_of(traceparent);
    let linked = context.span().span_context().clone();
    if linked.is_valid() {
        span.add_link(linked);
    }
}

/// Revision → `traceparent` of the step that committed it, for the last
/// [`TRACE_MARKS_KEPT`] traced events peers are sent (revisions only grow,
/// so the oldest is dropped first and a lookup is a binary search); and
/// deletion operation → the trace it belongs to, for the last
/// [`OPERATION_TRACES_KEPT`] operations.
///
/// Why per operation: a deletion's later events are committed by the
/// writer's background work steps (deeper cascade levels, retries,
/// purges), which no caller's span encloses. Their events carry the trace
/// the operation was first seen in (its Delete call here, or the owner's
/// event at an importer), so that importers keep joining the deletion's
/// trace, not the work step's.
#[derive(Debug, Default)]
pub(crate) struct TraceMarks {
    events: Mutex<VecDeque<(u64, String)>>,
    operations: Mutex<OperationTraces>,
}

/// Operation → trace, the oldest forgotten first.
#[derive(Debug, Default)]
struct OperationTraces {
    traces: HashMap<OperationId, String>,
    order: VecDeque<OperationId>,
}

impl TraceMarks {
    /// Notes that `op` belongs to the trace `traceparent` names, unless a
    /// trace is already known for it (the first one stays).
    pub(crate) fn remember_operation(&self, op: OperationId, traceparent: &str) {
        let Ok(mut ops) = self.operations.lock() else { return };
        if ops.traces.contains_key(&op) {
            return;
        }
        if ops.order.len() == OPERATION_TRACES_KEPT {
            if let Some(oldest) = ops.order.pop_front() {
                ops.traces.remove(&oldest);
            }
        }
        ops.order.push_back(op);
        ops.traces.insert(op, traceparent.to_owned());
    }

    /// Whether any operation's trace is known.
    pub(crate) fn knows_operations(&self) -> bool {
        self.operations.lock().is_ok_and(|ops| !ops.traces.is_empty())
    }

    /// The trace `op` belongs to, if known.
    pub(crate) fn operation_trace(&self, op: OperationId) -> Option<String> {
        self.operations.lock().ok()?.traces.get(&op).cloned()
    }

    /// Notes that `revision` was committed under `traceparent`.
    pub(crate) fn note(&self, revision: u64, traceparent: &str) {
        let Ok(mut marks) = self.events.lock() else { return };
        if marks.back().is_some_and(|(last, _)| *last >= revision) {
            // Out of order: cannot happen (one writer), and a lookup must
            // stay a binary search; the mark is only a diagnostic.
            return;
        }
        if marks.len() == TRACE_MARKS_KEPT {
            marks.pop_front();
        }
        marks.push_back((revision, traceparent.to_owned()));
    }

    /// Forgets the marks from `revision` on (their step did not commit,
    /// and the next step reuses the revisions).
    pub(crate) fn forget_from(&self, revision: u64) {
        let Ok(mut marks) = self.events.lock() else { return };
        while marks.back().is_some_and(|(r, _)| *r >= revision) {
            marks.pop_back();
        }
    }

    /// The `traceparent` `revision` was committed under, if still known.
    pub(crate) fn of(&self, revision: u64) -> Option<String> {
        let marks = self.events.lock().ok()?;
        let i = marks.binary_search_by_key(&revision, |(r, _)| *r).ok()?;
        marks.get(i).map(|(_, t)| t.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_marks_keep_the_newest_and_find_them() {
        let marks = TraceMarks::default();
        for revision in 1..=(TRACE_MARKS_KEPT as u64 + 10) {
            marks.note(revision, &format!("t{revision}"));
        }
        assert_eq!(marks.of(1), None, "the oldest were dropped");
        assert_eq!(marks.of(10), None);
        assert_eq!(marks.of(11).as_deref(), Some("t11"));
        let last = TRACE_MARKS_KEPT as u64 + 10;
        assert_eq!(marks.of(last).as_deref(), Some(format!("t{last}").as_str()));
        assert_eq!(marks.of(last + 1), None);
        marks.note(5, "late");
        assert_eq!(marks.of(5), None, "an out-of-order mark is ignored");
        marks.forget_from(last);
        assert_eq!(marks.of(last), None, "a step that did not commit");
        assert!(marks.of(last - 1).is_some());
        marks.note(last, "again");
        assert_eq!(marks.of(last).as_deref(), Some("again"));
    }

    #[test]
    fn an_operation_keeps_its_first_trace_and_the_oldest_are_forgotten() {
        let marks = TraceMarks::default();
        let ops: Vec<OperationId> = (0..=OPERATION_TRACES_KEPT as u128)
            .map(|i| OperationId(uuid::Uuid::from_u128(i + 1)))
            .collect();
        marks.remember_operation(ops[0], "first");
        marks.remember_operation(ops[0], "second");
        assert_eq!(marks.operation_trace(ops[0]).as_deref(), Some("first"));
        for op in &ops[1..] {
            marks.remember_operation(*op, "later");
        }
        assert_eq!(marks.operation_trace(ops[0]), None, "the oldest is forgotten");
        assert_eq!(marks.operation_trace(ops[1]).as_deref(), Some("later"));
    }
}
