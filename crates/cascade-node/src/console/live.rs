//! Live pages: a server-sent event stream per open page that reads the
//! API again every `LIVE_EVERY` as the page's caller and sends the page's
//! live part, rendered and escaped here (`console.js` swaps it in). An
//! operation's stream ends with a `done` event once the operation is done;
//! every stream ends when the node stops. At most `MAX_LIVE_STREAMS` are
//! open at once per node (each costs two API reads a second).

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::context::{operation_id, Console};
use super::error::ConsoleError;
use super::pages::{self, Rate};
use super::session::Caller;
use cascade_proto::v1;

/// How often a live page reads the API again.
pub(crate) const LIVE_EVERY: Duration = Duration::from_secs(1);

/// Reads a rate is measured over: members finished between the oldest
/// kept read and this one, per second.
const RATE_READS: usize = 5;

/// Live streams open at once on one node; more are refused (503) and the
/// browser's EventSource tries again later.
pub(crate) const MAX_LIVE_STREAMS: usize = 64;

/// What one stream carries from one read to the next.
struct Live {
    console: Arc<Console>,
    caller: Caller,
    ticks: Interval,
    /// The last reads (at most `RATE_READS`, oldest first): when, and
    /// members finished by then (per operation).
    reads: VecDeque<(Instant, BTreeMap<String, u64>)>,
    /// The operation is done: one `done` event is left to send.
    ending: bool,
    ended: bool,
    _permit: OwnedSemaphorePermit,
}

impl Live {
    fn new(console: Arc<Console>, caller: Caller, permit: OwnedSemaphorePermit, every: Duration) -> Self {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            console,
            caller,
            ticks,
            reads: VecDeque::new(),
            ending: false,
            ended: false,
            _permit: permit,
        }
    }

    /// Waits for the next read's time; false when the node stops first.
    async fn next_tick(&mut self) -> Option<Instant> {
        let mut stopping = self.console.stopping.clone();
        tokio::select! {
            at = self.ticks.tick() => Some(at),
            _ = stopping.wait_for(|stop| *stop) => None,
        }
    }

    /// Members per second of each operation over the last reads (up to
    /// `RATE_READS`: one slow second does not make the rate jump).
    fn rates(&mut self, at: Instant, finished: BTreeMap<String, u64>) -> BTreeMap<String, f64> {
        let mut rates = BTreeMap::new();
        if let Some((then, before)) = self.reads.front() {
            let seconds = at.duration_since(*then).as_secs_f64();
            if seconds > 0.0 {
                for (id, now) in &finished {
                    if let Some(was) = before.get(id) {
                        rates.insert(id.clone(), now.saturating_sub(*was) as f64 / seconds);
                    }
                }
            }
        }
        if self.reads.len() == RATE_READS {
            self.reads.pop_front();
        }
        self.reads.push_back((at, finished));
        rates
    }
}

fn finished_members(op: &v1::Operation) -> u64 {
    op.progress.map(|p| p.deleted + p.unset).unwrap_or(0)
}

fn update(markup: maud::Markup) -> Event {
    Event::default().event("update").data(markup.into_string())
}

fn problem(e: &ConsoleError) -> Event {
    Event::default().event("problem").data(e.to_string())
}

/// A place among the live streams, if one is free.
fn permit(console: &Console) -> Option<OwnedSemaphorePermit> {
    console.live_streams.clone().try_acquire_owned().ok()
}

/// The answer when every place is taken.
fn busy(console: &Console) -> Response {
    pages::failure(
        &console.region,
        &ConsoleError::Unavailable(format!(
            "{MAX_LIVE_STREAMS} live pages are open on this node already; try again shortly"
        )),
        "/operations",
    )
}

/// `GET /operations/{id}/live`.
pub(super) async fn operation(State(console): State<Arc<Console>>, caller: Caller, Path(id): Path<String>) -> Response {
    let id = match operation_id(&id) {
        Ok(id) => id,
        Err(e) => return pages::failure(&console.region, &e, "/operations"),
    };
    let Some(permit) = permit(&console) else {
        return busy(&console);
    };
    let live = Live::new(console, caller, permit, LIVE_EVERY);
    let stream = futures::stream::unfold((live, id), |(mut live, id)| async move {
        if live.ended {
            return None;
        }
        if live.ending {
            live.ended = true;
            return Some((Ok(Event::default().event("done").data("done")), (live, id)));
        }
        let at = live.next_tick().await?;
        let (op, explained) = futures::join!(
            live.console.backend.operation(&live.caller, &id, 1, ""),
            live.console.backend.explain(&live.caller, &id)
        );
        let event = match op {
            Err(e) => problem(&e),
            Ok(op) => {
                let explained = (!op.done).then(|| explained.map_err(|e| e.to_string()));
                let rate = if op.done {
                    live.ending = true;
                    average_rate(&op)
                } else {
                    let finished = BTreeMap::from([(id.clone(), finished_members(&op))]);
                    live.rates(at, finished).get(&id).copied().map(Rate::Live)
                };
                update(pages::live_operation(
                    &op,
                    explained.as_ref().map(|r| r.as_ref().map_err(Clone::clone)),
                    rate,
                ))
            }
        };
        Some((Ok::<_, Infallible>(event), (live, id)))
    });
    sse(stream)
}

/// `GET /operations/live`.
pub(super) async fn operations(State(console): State<Arc<Console>>, caller: Caller) -> Response {
    let Some(permit) = permit(&console) else {
        return busy(&console);
    };
    let live = Live::new(console, caller, permit, LIVE_EVERY * 2);
    let stream = futures::stream::unfold(live, |mut live| async move {
        let at = live.next_tick().await?;
        let event = match live.console.backend.running_operations(&live.caller).await {
            Err(e) => problem(&e),
            Ok(running) => {
                let finished = running
                    .by_operation
                    .iter()
                    .filter_map(|(id, op)| Some((id.clone(), finished_members(op.operation.as_ref()?))))
                    .collect();
                let rates = live.rates(at, finished);
                update(pages::operations_table(&running, &|id| rates.get(id).copied()))
            }
        };
        Some((Ok::<_, Infallible>(event), live))
    });
    sse(stream)
}

fn sse(stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    let mut response = Sse::new(stream).keep_alive(KeepAlive::default()).into_response();
    // A proxy must not hold the events back.
    response
        .headers_mut()
        .insert("x-accel-buffering", axum::http::HeaderValue::from_static("no"));
    response
}

/// A done operation's members per second from its start to its end.
pub(super) fn average_rate(op: &v1::Operation) -> Option<Rate> {
    let took_ms = op.end_time_ms.checked_sub(op.create_time_ms).filter(|ms| *ms > 0)?;
    Some(Rate::Average(finished_members(op) as f64 * 1000.0 / took_ms as f64))
}
