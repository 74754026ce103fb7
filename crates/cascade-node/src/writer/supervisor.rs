//! The writer's supervisor: restarts a writer that fails and repoints
//! the handle the node uses.

use std::sync::{Arc, RwLock};

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tracing::{error, warn};

use super::group::ClientQueue;
use super::{Writer, WriterContext, WriterMsg};

/// Restarts the writer when it fails (a panic in a step) and repoints the handle.
pub(super) struct Supervisor;

pub(super) struct SupervisorState {
    ctx: WriterContext,
    /// The handle's queue of client steps: every incarnation serves it.
    clients: Arc<ClientQueue>,
    current: Arc<RwLock<ActorRef<WriterMsg>>>,
    /// Set when the node shuts down, so a stopping writer is not restarted.
    stopping: bool,
}

pub(super) enum SupervisorMsg {
    Stop,
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
                if let Some(w) = writer {
                    w.stop(None);
                }
                myself.stop(None);
            }
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
            SupervisionEvent::ActorFailed(_, err) if !state.stopping => {
                error!(region = %state.ctx.region, error = %err, "writer failed; restarting it");
                let (writer, _) = Actor::spawn_linked(
                    None,
                    Writer,
                    (state.ctx.clone(), state.clients.clone()),
                    myself.get_cell(),
                )
                .await?;
                if let Ok(mut cur) = state.current.write() {
                    *cur = writer;
                }
            }
            SupervisionEvent::ActorTerminated(_, _, _) if !state.stopping => {
                warn!(region = %state.ctx.region, "writer stopped unexpectedly; restarting it");
                let (writer, _) = Actor::spawn_linked(
                    None,
                    Writer,
                    (state.ctx.clone(), state.clients.clone()),
                    myself.get_cell(),
                )
                .await?;
                if let Ok(mut cur) = state.current.write() {
                    *cur = writer;
                }
            }
            _ => {}
        }
        Ok(())
    }
}
