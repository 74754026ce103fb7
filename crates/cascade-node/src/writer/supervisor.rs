//! The writer's supervisor: restarts a writer that fails, after a backoff,
//! and repoints the handle the node uses.
//!
//! Why the backoff: a work step that panicked at every start made the
//! supervisor restart the writer at once, forever: 209,500 log lines in
//! about 15 s, a core spinning, and the store never retried (its retry was
//! due 100 ms after a start, and every incarnation panicked before). Now a
//! writer that fails (panics, or stops when nobody asked it to):
//!
//! - is counted (`cascade_writer_restarts_total`, at each restart);
//! - turns health NOT_SERVING (the `committing` flag: no writer runs, so no
//!   write would be served), which also makes the next incarnation start
//!   as a writer restarted mid-episode (`writer/healing.rs`,
//!   `Healing::resumed`): before it serves anything it retries the store
//!   at once (a reopen, then a probe commit), and health is SERVING only
//!   once that commit succeeds. A writer that dies at each start still
//!   retries the store at each start, and heals once the cause goes away;
//! - has its queued client steps answered at once that the writer stopped
//!   (UNAVAILABLE; none ran), and calls made while no writer runs are
//!   refused at once (`ClientQueue::refuse_queued`), not held for the
//!   backoff;
//! - is logged as one error line, then at most one a window with the count
//!   held back (`log_throttle`);
//! - is restarted after a wait that doubles from 100 ms to 2 s (the
//!   store's retry policy, `healing::Backoff`), back to 100 ms once an
//!   incarnation ran [`HEALTHY_RUN`], when one info line says the
//!   restarts are over. A restart that itself fails (the writer's start
//!   panicked) waits the next backoff too. The new writer's first commit
//!   is not news at each restart: it says SERVING at debug level.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;
use tracing::{error, info};

use super::group::ClientQueue;
use super::healing::Backoff;
use super::{Writer, WriterContext, WriterMsg};
use crate::log_throttle::Throttle;

/// How long an incarnation must have run for its failure to start the
/// backoff over: a writer that fails once a day is restarted at once (after
/// the first wait), one that fails at each start waits longer each time.
pub(crate) const HEALTHY_RUN: Duration = Duration::from_secs(30);

/// How long a stop waits for the writer's step in progress (and its
/// flight) to end.
pub(super) const WRITER_STOP_WAIT: Duration = Duration::from_secs(10);

/// Restarts the writer when it fails (a panic in a step) and repoints the handle.
pub(super) struct Supervisor;

pub(super) struct SupervisorState {
    ctx: WriterContext,
    /// The handle's queue of client steps: every incarnation serves it.
    clients: Arc<ClientQueue>,
    current: Arc<RwLock<ActorRef<WriterMsg>>>,
    /// When the current incarnation started (None: none runs, a restart
    /// is scheduled).
    started: Option<Instant>,
    /// The wait before the next restart.
    backoff: Backoff,
    /// Failures logged at most once a window, with the count held back.
    failures: Throttle,
    /// Set when the node shuts down, so a stopping writer is not restarted.
    stopping: bool,
}

pub(super) enum SupervisorMsg {
    Stop,
    /// The backoff after a failure is over: start a new writer.
    Restart,
    /// The writer restarted as this actor has run [`HEALTHY_RUN`]: if it
    /// still runs, the restarts are over.
    RanHealthy(ractor::ActorId),
}

impl SupervisorState {
    /// The writer failed (`what` says how): no writer runs until the
    /// backoff's wait is over (see the module's doc).
    fn writer_failed(&mut self, myself: &ActorRef<SupervisorMsg>, what: &str) {
        if let Some(started) = self.started.take() {
            if started.elapsed() >= HEALTHY_RUN {
                self.backoff.reset();
            }
        }
        // No writer: nothing would be served. The next incarnation retries
        // the store before anything else, and says SERVING once it commits.
        self.ctx.committing.send_if_modified(|ok| std::mem::replace(ok, false));
        self.clients.refuse_queued();
        let wait = self.backoff.next_wait();
        if let Some(more) = self.failures.admit() {
            error!(
                region = %self.ctx.region,
                error = %what,
                suppressed = more.count(),
                restart_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "the writer failed: health is NOT_SERVING and writes are refused until a new writer commits; \
                 restarting it with backoff{more}"
            );
        }
        myself.send_after(wait, || SupervisorMsg::Restart);
    }

    async fn restart(&mut self, myself: &ActorRef<SupervisorMsg>) {
        self.ctx.metrics.writer_restarted();
        match Actor::spawn_linked(
            None,
            Writer,
            (self.ctx.clone(), self.clients.clone()),
            myself.get_cell(),
        )
        .await
        {
            Ok((writer, _)) => {
                let id = writer.get_id();
                if let Ok(mut cur) = self.current.write() {
                    *cur = writer;
                }
                self.started = Some(crate::clock::monotonic_now());
                myself.send_after(HEALTHY_RUN, move || SupervisorMsg::RanHealthy(id));
            }
            // Its start panicked (its store retry, say): wait longer.
            Err(e) => self.writer_failed(myself, &e.to_string()),
        }
    }

    /// Whether `id` is the writer that runs now (a supervision event of
    /// an earlier one, or of a start that failed, changes nothing).
    fn is_current(&self, id: ractor::ActorId) -> bool {
        self.started.is_some() && self.current.read().is_ok_and(|w| w.get_id() == id)
    }

    /// A restarted writer ran [`HEALTHY_RUN`]: one line says the restarts
    /// are over (with those not logged), and the next failure waits the
    /// first backoff again.
    fn ran_healthy(&mut self) {
        let held = self.failures.reset();
        self.backoff.reset();
        info!(
            region = %self.ctx.region,
            unlogged_failures = held.count(),
            "the writer restarted {} s ago still runs: restarts are over{held}",
            HEALTHY_RUN.as_secs()
        );
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = (
        WriterContext,
        Arc<ClientQueue>,
        tokio::sync::oneshot::Sender<Arc<RwLock<ActorRef<WriterMsg>>>>,
    );

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        (ctx, clients, ready): Self::Arguments,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let (writer, _) = Actor::spawn_linked(None, Writer, (ctx.clone(), clients.clone()), myself.get_cell()).await?;
        let current = Arc::new(RwLock::new(writer));
        let _ = ready.send(current.clone());
        Ok(SupervisorState {
            ctx,
            clients,
            current,
            started: Some(crate::clock::monotonic_now()),
            backoff: Backoff::default(),
            failures: Throttle::default(),
            stopping: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Stop => {
                state.stopping = true;
                let writer = state.current.read().map(|w| w.clone()).ok();
                // The supervisor ends after its writer: on the writer's own
                // thread, the supervisor's end ends the thread's runtime,
                // which would drop a writer still finishing its step.
                if let Some(w) = writer {
                    let _ = w.stop_and_wait(None, Some(WRITER_STOP_WAIT)).await;
                }
                myself.stop(None);
            }
            SupervisorMsg::Restart if !state.stopping && state.started.is_none() => {
                state.restart(&myself).await;
            }
            SupervisorMsg::Restart => {}
            SupervisorMsg::RanHealthy(id) if !state.stopping && state.is_current(id) => state.ran_healthy(),
            SupervisorMsg::RanHealthy(_) => {}
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        evt: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match evt {
            SupervisionEvent::ActorFailed(cell, err) if !state.stopping && state.is_current(cell.get_id()) => {
                state.writer_failed(&myself, &err.to_string());
            }
            SupervisionEvent::ActorTerminated(cell, _, reason)
                if !state.stopping && state.is_current(cell.get_id()) =>
            {
                let reason = reason.unwrap_or_else(|| "no reason given".to_owned());
                state.writer_failed(&myself, &format!("stopped unexpectedly: {reason}"));
            }
            _ => {}
        }
        Ok(())
    }
}
