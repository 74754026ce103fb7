//! The node's handle on its writer: every call queues its step with the
//! writer's client queue (`group.rs`) and waits for the answer, across
//! restarts of the actor by its supervisor.

use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Outbox rows one compaction batch removes at most (a row holds the
/// events of one commit, `codec/outbox.rs`): one writer message, so a
/// client's write waits behind at most this many removals.
pub(crate) const OUTBOX_COMPACTION_BATCH: usize = 1_000;

use cascade_core::protocol::{self, DeleteOutcome, DeleteRequest, ResourceSpec};
use cascade_core::{CoreError, Ctx, IdSource, Resource, Timestamp};
use ractor::{Actor, ActorRef, RpcReplyPort};

use super::group::{self, Reply};
use super::supervisor::{Supervisor, SupervisorMsg};
use super::{WriterContext, WriterMsg, WriterState};
use crate::audit::AuditContext;
use crate::codec::StoreState;
use crate::error::{Fault, WriterUnavailable};

/// The node's way to the writer. Survives writer restarts. Every call
/// answers the step's value, or a [`Fault`]: the protocol refused
/// (`Refused`), or the writer did not answer (`Writer`).
#[derive(Clone)]
pub struct WriterHandle {
    current: Arc<RwLock<ActorRef<WriterMsg>>>,
    supervisor: ActorRef<SupervisorMsg>,
    /// Where calls queue their steps (`writer/group.rs`).
    clients: Arc<group::ClientQueue>,
}

impl WriterHandle {
    /// Spawns the supervisor and its writer. Actors are unnamed, so several
    /// nodes can run in one process.
    pub async fn spawn(ctx: WriterContext) -> Result<Self, WriterUnavailable> {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let clients = Arc::new(group::ClientQueue::default());
        let (supervisor, _) = Actor::spawn(None, Supervisor, (ctx, clients.clone(), ready_tx))
            .await
            .map_err(|e| WriterUnavailable(e.to_string()))?;
        let current = ready_rx.await.map_err(|e| WriterUnavailable(e.to_string()))?;
        Ok(Self {
            current,
            supervisor,
            clients,
        })
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
                    .map_err(|e| CoreError::Storage(cascade_core::error::StorageError(e.to_string())))
                });
                // Removing acknowledged revisions claims nothing durable.
                Reply::now(reply, result)
            }))
        })
        .await
    }

    /// Stops the writer and its supervisor, waiting for the writer's current step.
    pub async fn stop(&self) {
        let writer = self.writer().ok();
        let _ = self.supervisor.cast(SupervisorMsg::Stop);
        if let Some(w) = writer {
            // Bounded wait: the writer finishes its step, then stops.
            let _ = tokio::time::timeout(Duration::from_secs(10), w.wait(None)).await;
        }
        // Client steps still queued are answered that the writer stopped.
        self.clients.close();
    }
}
