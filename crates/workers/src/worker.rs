use std::{any::Any, panic::AssertUnwindSafe, sync::Arc};

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::Value;
use tokio::sync::oneshot;
use toolmesh_core::{BackendError, CallContext, ToolOutput};
use tracing::{Instrument, warn};

use crate::LocalTool;

/// Messages of a [`WorkerActor`].
pub enum WorkerMsg {
    /// Runs one call, replies, then puts the worker back on the idle queue.
    Execute {
        /// The tool to run.
        tool: Arc<dyn LocalTool>,
        /// The call.
        ctx: CallContext,
        /// Validated arguments.
        arguments: Value,
        /// The span the execution runs in.
        span: tracing::Span,
        /// The outcome.
        reply: oneshot::Sender<Result<ToolOutput, BackendError>>,
    },
}

/// Runs local tools, one call at a time. A panicking tool kills the worker (the actor
/// fails on purpose, so its supervisor replaces it with a fresh one).
#[derive(Debug, Clone)]
pub struct WorkerActor {
    pub(crate) idle: async_channel::Sender<ActorRef<WorkerMsg>>,
}

impl Actor for WorkerActor {
    type Msg = WorkerMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        _: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        // The channel has room for every worker, so this cannot be full.
        self.idle.try_send(myself)?;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let WorkerMsg::Execute { tool, ctx, arguments, span, reply } = message;
        let cancel = ctx.cancel.clone();
        let run = async {
            tokio::select! {
                biased;
                () = cancel.cancelled() => Err(BackendError::Cancelled),
                result = tool.call(&ctx, arguments) => result,
            }
        };
        match AssertUnwindSafe(run.instrument(span)).catch_unwind().await {
            Ok(result) => {
                let _ = reply.send(result);
                self.idle.try_send(myself)?;
                Ok(())
            }
            Err(panic) => {
                let reason = panic_message(&*panic);
                warn!(tool = %ctx.tool, call_id = %ctx.call_id, %reason, "tool panicked; restarting its worker");
                let _ = reply.send(Err(BackendError::Crashed {
                    tool: ctx.tool.clone(),
                    call_id: ctx.call_id.clone(),
                    reason: format!("panicked: {reason}"),
                }));
                Err(format!("tool {} panicked during call {}: {reason}", ctx.tool, ctx.call_id)
                    .into())
            }
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "unknown panic payload".to_owned()
    }
}
