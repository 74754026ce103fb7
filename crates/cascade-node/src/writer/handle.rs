//! The node's handle on its writer: every call queues its step with the
//! writer's client queue (`group.rs`) and waits for the answer, across
//! restarts of the actor by its supervisor.
//!
//! The writer and its supervisor run on a thread of their own
//! ([`WriterThread::Own`], the default): a current-thread runtime on a
//! thread named `writer-<region>`. Why: on the node's runtime the writer
//! shared two workers with gRPC, the API handlers and, in the harness,
//! the clients. P1 flat at 1M (docs/BENCHMARKS.md, "Where the wall of P1
//! at 1M goes") had the writer busy 64 % of the wall while its work was
//! 62 % of the process's CPU: the rest of the process ran on its worker
//! (the replies it woke took that worker's LIFO slot), and a disk engine's
//! commit held a worker or handed it over (`block_in_place`) at every
//! step. On its own thread the writer blocks only itself on an fsync
//! (`off_the_workers` runs in place on a current-thread runtime), and the
//! callers it wakes run on the node's workers.
//!
//! The thread ends with its writer: [`WriterHandle::stop`] stops the
//! supervisor, which stops the writer and waits for it, and then waits for
//! the thread (so a node stopped and opened again in one process, as the
//! tests do, leaves no thread behind). A node dropped without a stop keeps
//! its writer as long as the runtime that opened it runs, as on that
//! runtime itself: a task there holds the thread's lifeline, and when that
//! runtime ends the writer's runtime ends too (its actors are dropped
//! between steps, as a runtime's tasks are).
//!
//! A supervisor that ends without a stop (a panic in its own handler: it
//! has no supervisor above it) leaves no writer and none to restart one.
//! The handle then does what the supervisor would have done for a failed
//! writer, for good: health NOT_SERVING, queued and later calls refused at
//! once, the writer stopped after its step, one error line, and
//! [`WriterHandle::ended_unasked`] resolves, on which the node's server
//! ends (`api/server.rs`): a region's writer steps down so a standby takes
//! over, and a single node's process exits with an error for its own
//! supervisor (systemd, Kubernetes) to restart. Before, health stayed
//! SERVING, every call waited for a writer that was gone, and a region's
//! writer kept renewing its lease, so no standby ever took over.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

/// Outbox rows one compaction batch removes at most (a row holds the
/// events of one commit, `codec/outbox.rs`): one writer message, so a
/// client's write waits behind at most this many removals.
pub(crate) const OUTBOX_COMPACTION_BATCH: usize = 1_000;

use cascade_core::protocol::{self, DeleteOutcome, DeleteRequest, ResourceSpec};
use cascade_core::{CoreError, Ctx, IdSource, Resource, Timestamp};
use ractor::{Actor, ActorRef, RpcReplyPort};

use super::group::{self, Reply};
use super::supervisor::{Supervisor, SupervisorMsg, WRITER_STOP_WAIT};
use super::{WriterContext, WriterMsg, WriterState};
use crate::audit::AuditContext;
use crate::codec::StoreState;
use crate::error::{Fault, WriterUnavailable};

/// Where a node's writer runs (`NodeEnv::writer_thread`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WriterThread {
    /// On a thread of its own, named `writer-<region>` (see the module's
    /// doc for why). The default.
    #[default]
    Own,
    /// On the runtime that opens the node. Only for the turmoil
    /// simulation: its clock is the runtime's (paused, driven by the
    /// simulation) and a seed replays only if every task of a host runs
    /// on that host's runtime.
    CallersRuntime,
}

/// The writer thread's stack: tokio's default for its workers, which is
/// where the writer ran before it had a thread of its own. Reserved, not
/// resident: P3 runs 50 regions, so 50 writer threads, in one process.
const WRITER_STACK_BYTES: usize = 2 * 1024 * 1024;

/// Linux keeps 15 bytes of a thread's name (what `top -H`, `perf` and
/// `/proc/<pid>/task/*/comm` show): `writer-` leaves 8 for the region.
fn thread_name(region: &cascade_core::RegionId) -> String {
    format!("writer-{region}")
}

/// The writer's own thread, until [`WriterHandle::stop`] waits for it.
struct OwnThread {
    thread: std::thread::JoinHandle<()>,
    /// Closed when the thread's runtime (and every task on it) is gone.
    ended: tokio::sync::oneshot::Receiver<()>,
}

/// Whether a stop was asked, and who hears of an end that was not.
#[derive(Clone)]
struct EndWatch {
    /// Set by [`WriterHandle::stop`] before it stops the supervisor.
    stop_asked: Arc<AtomicBool>,
    /// Turns true when the supervisor ended without a stop.
    ended_unasked: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for EndWatch {
    fn default() -> Self {
        Self {
            stop_asked: Arc::default(),
            ended_unasked: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }
}

/// What is left of a node's writer once its supervisor ended (the
/// module's doc says why): nothing to do after a stop; after an end
/// nobody asked for, the node stops saying it serves and stops taking
/// calls, the writer stops after its step, and the node's server is told.
struct Remains {
    region: cascade_core::RegionId,
    committing: Arc<tokio::sync::watch::Sender<bool>>,
    clients: Arc<group::ClientQueue>,
    end: EndWatch,
}

impl Remains {
    fn of(ctx: &WriterContext, clients: &Arc<group::ClientQueue>, end: &EndWatch) -> Self {
        Self {
            region: ctx.region.clone(),
            committing: ctx.committing.clone(),
            clients: clients.clone(),
            end: end.clone(),
        }
    }

    async fn supervisor_ended(self, current: &RwLock<ActorRef<WriterMsg>>) {
        if self.end.stop_asked.load(Ordering::SeqCst) {
            return;
        }
        self.committing.send_if_modified(|ok| std::mem::replace(ok, false));
        self.clients.close();
        let writer = current.read().map(|w| w.clone()).ok();
        if let Some(writer) = writer {
            let _ = writer.stop_and_wait(None, Some(WRITER_STOP_WAIT)).await;
        }
        tracing::error!(
            region = %self.region,
            "the writer's supervisor ended without being asked to: no writer runs and none will be \
             restarted; health is NOT_SERVING, calls are refused, and the node's server stops"
        );
        self.end.ended_unasked.send_replace(true);
    }
}

/// What the writer's thread answers once its supervisor started.
type Started = Result<(ActorRef<SupervisorMsg>, Arc<RwLock<ActorRef<WriterMsg>>>), WriterUnavailable>;

/// The node's way to the writer. Survives writer restarts. Every call
/// answers the step's value, or a [`Fault`]: the protocol refused
/// (`Refused`), or the writer did not answer (`Writer`).
#[derive(Clone)]
pub struct WriterHandle {
    current: Arc<RwLock<ActorRef<WriterMsg>>>,
    supervisor: ActorRef<SupervisorMsg>,
    /// Where calls queue their steps (`writer/group.rs`).
    clients: Arc<group::ClientQueue>,
    /// The writer's thread ([`WriterThread::Own`]; taken by the first stop).
    thread: Arc<Mutex<Option<OwnThread>>>,
    end: EndWatch,
}

/// Starts the supervisor (which starts the writer) on the current runtime.
async fn start_supervisor(
    ctx: WriterContext,
    clients: Arc<group::ClientQueue>,
) -> Result<
    (
        ActorRef<SupervisorMsg>,
        Arc<RwLock<ActorRef<WriterMsg>>>,
        tokio::task::JoinHandle<()>,
    ),
    WriterUnavailable,
> {
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (supervisor, ended) = Actor::spawn(None, Supervisor, (ctx, clients, ready_tx))
        .await
        .map_err(|e| WriterUnavailable(e.to_string()))?;
    let current = ready_rx.await.map_err(|e| WriterUnavailable(e.to_string()))?;
    Ok((supervisor, current, ended))
}

/// The body of the writer's thread: a current-thread runtime that runs the
/// supervisor until it stops, or until the runtime that opened the node
/// ends (`callers_runtime` closes), then drops every task left on it.
fn run_writer_thread(
    ctx: WriterContext,
    clients: Arc<group::ClientQueue>,
    end: EndWatch,
    started: tokio::sync::oneshot::Sender<Started>,
    callers_runtime: tokio::sync::oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = started.send(Err(WriterUnavailable(format!(
                "cannot build the writer's runtime: {e}"
            ))));
            return;
        }
    };
    let remains = Remains::of(&ctx, &clients, &end);
    runtime.block_on(async move {
        let (ended, current) = match start_supervisor(ctx, clients).await {
            Ok((supervisor, current, ended)) => {
                if started.send(Ok((supervisor.clone(), current.clone()))).is_err() {
                    // The open that asked for it was dropped: nobody can stop it.
                    end.stop_asked.store(true, Ordering::SeqCst);
                    supervisor.cast(SupervisorMsg::Stop).ok();
                }
                (ended, current)
            }
            Err(e) => {
                let _ = started.send(Err(e));
                return;
            }
        };
        tokio::select! {
            biased;
            _ = ended => remains.supervisor_ended(&current).await,
            // Nobody is left to tell.
            _ = callers_runtime => {}
        }
    });
    // Dropping the runtime drops what is left on it: the writer's ticker,
    // the supervisor's timers, and after a lifeline's end the actors.
    drop(runtime);
}

impl WriterHandle {
    /// Spawns the supervisor and its writer, on a thread of their own or
    /// on the current runtime (`on`). Actors are unnamed, so several nodes
    /// can run in one process.
    pub async fn spawn(ctx: WriterContext, on: WriterThread) -> Result<Self, WriterUnavailable> {
        let clients = Arc::new(group::ClientQueue::default());
        let end = EndWatch::default();
        if on == WriterThread::CallersRuntime {
            let remains = Remains::of(&ctx, &clients, &end);
            let (supervisor, current, ended) = start_supervisor(ctx, clients.clone()).await?;
            let watched = current.clone();
            tokio::spawn(async move {
                let _ = ended.await;
                remains.supervisor_ended(&watched).await;
            });
            return Ok(Self {
                current,
                supervisor,
                clients,
                thread: Arc::default(),
                end,
            });
        }
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (mut lifeline, callers_runtime) = tokio::sync::oneshot::channel::<()>();
        let (ended_tx, ended) = tokio::sync::oneshot::channel::<()>();
        // The writer's step spans and lines go where the node's do. With a
        // process-wide subscriber (`cascade serve`) that is the thread's own
        // default already. Only a subscriber scoped to the opening thread
        // (a test's `with_default`) is set on the writer's thread too: a
        // scoped default slows every event a little, and one copied before
        // the process's subscriber was installed (the no-op) would hide
        // every line the writer logs from then on.
        let scoped = tracing::dispatcher::get_default(tracing::Dispatch::clone);
        let scoped = (!tracing::dispatcher::has_been_set() && !scoped.is::<tracing::subscriber::NoSubscriber>())
            .then_some(scoped);
        let worker_clients = clients.clone();
        let worker_end = end.clone();
        let thread = std::thread::Builder::new()
            .name(thread_name(&ctx.region))
            .stack_size(WRITER_STACK_BYTES)
            .spawn(move || {
                let _subscriber = scoped.as_ref().map(tracing::dispatcher::set_default);
                run_writer_thread(ctx, worker_clients, worker_end, started_tx, callers_runtime);
                drop(ended_tx);
            })
            .map_err(|e| WriterUnavailable(format!("cannot start the writer's thread: {e}")))?;
        // Held by a task of the runtime that opens the node: dropped with
        // that runtime, which ends the writer's (module doc). The task ends
        // once the writer's thread dropped its end.
        tokio::spawn(async move { lifeline.closed().await });
        let (supervisor, current) = started_rx
            .await
            .map_err(|_| WriterUnavailable("the writer's thread ended before its writer started".into()))??;
        Ok(Self {
            current,
            supervisor,
            clients,
            thread: Arc::new(Mutex::new(Some(OwnThread { thread, ended }))),
            end,
        })
    }

    /// Resolves when the writer's supervisor ended without a
    /// [`Self::stop`] (the module's doc says what was done by then); never
    /// after a stop.
    pub fn ended_unasked(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut ended = self.end.ended_unasked.subscribe();
        async move {
            if ended.wait_for(|ended| *ended).await.is_err() {
                // Every sender gone: the handle and its writer were dropped,
                // so nothing can end unasked any more.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Tests only: ends the supervisor the way a failure of its own would,
    /// not through [`Self::stop`].
    #[doc(hidden)]
    pub fn end_supervisor_unasked(&self) {
        self.supervisor.stop(Some("ended by a test, unasked".into()));
    }

    fn writer(&self) -> Result<ActorRef<WriterMsg>, WriterUnavailable> {
        self.current
            .read()
            .map(|w| w.clone())
            .map_err(|e| WriterUnavailable(e.to_string()))
    }

    pub(super) async fn call<T: Send + 'static>(
        &self,
        build: impl FnOnce(RpcReplyPort<Result<T, CoreError>>) -> WriterMsg,
    ) -> Result<T, Fault> {
        let writer = self.writer()?;
        // The caller's span goes with the message: the step's span is its child.
        let caller = tracing::Span::current();
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.clients
            .push(&writer, WriterMsg::Traced(caller, Box::new(build(reply.into()))))?;
        match answer.await {
            Ok(r) => Ok(r?),
            // The writer dropped the step: it stopped (or failed) first.
            Err(_) => Err(Fault::Writer(WriterUnavailable("no reply (writer stopped)".into()))),
        }
    }

    /// Creates, audited for `audit` when given (one entry per resource);
    /// refused past `answer_by`, the instant a node that forwarded the
    /// create gave up on it (see [`WriterMsg`]).
    pub async fn create(
        &self,
        specs: Vec<ResourceSpec>,
        audit: Option<AuditContext>,
        answer_by: Option<Timestamp>,
    ) -> Result<Vec<Resource>, Fault> {
        self.call(|r| WriterMsg::Create(specs, audit, answer_by, r)).await
    }

    /// Updates, audited for `audit` when given; refused past `answer_by`.
    pub async fn update(
        &self,
        spec: ResourceSpec,
        etag: Option<String>,
        audit: Option<AuditContext>,
        answer_by: Option<Timestamp>,
    ) -> Result<Resource, Fault> {
        self.call(|r| WriterMsg::Update(spec, etag, audit, answer_by, r)).await
    }

    /// Deletes; a deletion that starts is audited for `audit` when given.
    /// Refused past `answer_by`.
    pub async fn delete(
        &self,
        req: DeleteRequest,
        audit: Option<AuditContext>,
        answer_by: Option<Timestamp>,
    ) -> Result<DeleteOutcome, Fault> {
        self.call(|r| WriterMsg::Delete(req, audit, answer_by, r)).await
    }

    /// Runs any protocol step in the writer, committing its writes.
    pub async fn apply<T, F>(&self, step: F) -> Result<T, Fault>
    where
        T: Send + 'static,
        F: FnOnce(&StoreState<'_>, Ctx<'_>, &mut dyn IdSource) -> Result<protocol::Step<T>, CoreError> + Send + 'static,
    {
        self.call(|reply| {
            WriterMsg::Apply(Box::new(
                move |state: &mut WriterState, myself: &ActorRef<WriterMsg>| {
                    let result = state.run(myself, step);
                    Reply::after_flush(reply, result, state.group_committed())
                },
            ))
        })
        .await
    }

    /// [`Self::apply`] for a step whose writes may claim nothing, as
    /// `needs_flush` says of its value: then its commit waits for a later
    /// flush instead of one of its own (`WriterState::commit_as`: only a
    /// step whose loss in a crash is repaired by its peer sending the same
    /// thing again may say so). Its answer comes with its group's (at once
    /// when no step of the group needs a flush): it is for this node, which
    /// must not pass it on to another on its strength.
    pub async fn apply_may_skip_flush<T, F, N>(&self, step: F, needs_flush: N) -> Result<T, Fault>
    where
        T: Send + 'static,
        F: FnOnce(&StoreState<'_>, Ctx<'_>, &mut dyn IdSource) -> Result<protocol::Step<T>, CoreError> + Send + 'static,
        N: FnOnce(&T) -> bool + Send + 'static,
    {
        self.call(|reply| {
            WriterMsg::Apply(Box::new(
                move |state: &mut WriterState, myself: &ActorRef<WriterMsg>| {
                    let result = state.run_step(myself, step, None, |_| Vec::new(), needs_flush);
                    Reply::after_flush(reply, result, state.group_committed())
                },
            ))
        })
        .await
    }

    /// Compacts the outbox below `below` (one batch of at most
    /// [`OUTBOX_COMPACTION_BATCH`] rows; returns the events removed), in
    /// the writer so it is ordered with every other write of the node.
    pub async fn compact_outbox(&self, below: u64) -> Result<usize, Fault> {
        self.call(|reply| {
            WriterMsg::Apply(Box::new(move |state: &mut WriterState, _: &ActorRef<WriterMsg>| {
                // It commits: never on top of a flight.
                let result = state.finish_flight().and_then(|()| {
                    StoreState {
                        store: state.ctx.store.as_ref(),
                    }
                    .compact_outbox(below, OUTBOX_COMPACTION_BATCH)
                    // Unflushed, but read at once by the node's streams
                    // (the floor a watch below it is refused at):
                    // applied for them now (`Store::land`).
                    .and_then(|removed| state.ctx.store.land().map(|()| removed))
                    .map_err(|e| CoreError::Storage(cascade_core::error::StorageError(e.to_string())))
                });
                // Removing acknowledged revisions claims nothing durable.
                Reply::now(reply, result)
            }))
        })
        .await
    }

    /// Stops the writer and its supervisor, waiting for the writer's
    /// current step, and then for the writer's thread to end.
    pub async fn stop(&self) {
        self.end.stop_asked.store(true, Ordering::SeqCst);
        let writer = self.writer().ok();
        let own = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        let _ = self.supervisor.cast(SupervisorMsg::Stop);
        match own {
            Some(OwnThread { thread, ended }) => {
                let name = thread.thread().name().unwrap_or("writer").to_owned();
                // Bounded wait: the writer finishes its step and stops, then
                // the supervisor, then the thread's runtime is dropped.
                match tokio::time::timeout(WRITER_STOP_WAIT + Duration::from_secs(1), ended).await {
                    // Past its runtime's drop: only the thread's return is
                    // left, so this join blocks the worker for microseconds.
                    Ok(_) => {
                        if thread.join().is_err() {
                            tracing::error!(thread = %name, "the writer's thread panicked as it ended");
                        }
                    }
                    // A step that does not end (an engine that hangs):
                    // the thread is left to end with it, not waited for.
                    Err(_) => tracing::warn!(
                        thread = %name,
                        "the writer did not stop in time: its thread is left to end on its own"
                    ),
                }
            }
            None => {
                if let Some(w) = writer {
                    // Bounded wait: the writer finishes its step, then stops.
                    let _ = tokio::time::timeout(WRITER_STOP_WAIT, w.wait(None)).await;
                }
            }
        }
        // Client steps still queued are answered that the writer stopped.
        self.clients.close();
    }
}
