//! The gRPC `WorkerService`: one session per connected worker.

use std::{pin::Pin, sync::Arc};

use futures::Stream;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use toolmesh_core::{BackendError, CallEvent, Principal};
use toolmesh_proto::{
    convert,
    v1::{
        self, RouterMessage, WorkerMessage, router_message, worker_call_event, worker_call_result,
        worker_message, worker_service_server::WorkerService,
    },
};
use tracing::{Instrument, debug, warn};

use crate::members::{Link, Members};

/// The fully qualified name of the worker service, for health checking and reflection.
pub const WORKER_SERVICE_NAME: &str = "toolmesh.v1.WorkerService";

/// Where remote workers connect; made by [`RemoteWorkers::service`](crate::RemoteWorkers::service).
#[derive(Debug, Clone)]
pub struct WorkerServiceImpl {
    pub(crate) members: Arc<Members>,
    pub(crate) closing: Closing,
    pub(crate) max_message_bytes: usize,
}

/// What ends every session: the router is shutting down and has no calls left, or the
/// provider stopped.
#[derive(Debug, Clone)]
pub(crate) struct Closing {
    pub(crate) router: CancellationToken,
    pub(crate) provider: CancellationToken,
}

impl Closing {
    fn is_closed(&self) -> bool {
        self.router.is_cancelled() || self.provider.is_cancelled()
    }

    async fn closed(&self) {
        tokio::select! {
            () = self.router.cancelled() => {}
            () = self.provider.cancelled() => {}
        }
    }
}

#[tonic::async_trait]
impl WorkerService for WorkerServiceImpl {
    type ConnectStream = Pin<Box<dyn Stream<Item = Result<RouterMessage, Status>> + Send>>;

    async fn connect(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        if self.closing.is_closed() {
            return Err(Status::unavailable("the router is shutting down"));
        }
        let config = self.members.config();
        if request.extensions().get::<toolmesh_core::NoPrincipal>().is_some() {
            return Err(Status::unauthenticated(format!(
                "a worker needs a credential with the role {:?}",
                config.worker_role
            )));
        }
        if let Some(principal) = request.extensions().get::<Arc<Principal>>()
            && !toolmesh_core::is_open(principal)
            && !principal.has_role(&config.worker_role)
        {
            return Err(Status::permission_denied(format!(
                "principal {:?} may not serve tools: a worker's credential needs the role {:?}",
                principal.name, config.worker_role
            )));
        }
        let principal = request
            .extensions()
            .get::<Arc<Principal>>()
            .filter(|principal| !toolmesh_core::is_open(principal))
            .cloned();
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(config.heartbeat_timeout(), inbound.message()).await;
        let hello = match first {
            Err(_) => {
                return Err(Status::deadline_exceeded("no hello within the heartbeat timeout"));
            }
            Ok(Err(status)) => return Err(status),
            Ok(Ok(None)) => return Err(Status::cancelled("the worker left before its hello")),
            Ok(Ok(Some(WorkerMessage {
                message: Some(worker_message::Message::Hello(hello)),
            }))) => hello,
            Ok(Ok(Some(_))) => {
                return Err(Status::invalid_argument("the first message must be hello"));
            }
        };
        let (outbound, receiver) = tokio::sync::mpsc::unbounded_channel();
        let welcome = v1::WorkerWelcome {
            router_id: self.members.router_id.clone(),
            heartbeat_interval_ms: config.heartbeat_interval_ms.try_into().unwrap_or(u32::MAX),
            heartbeat_timeout_ms: config.heartbeat_timeout_ms.try_into().unwrap_or(u32::MAX),
            max_message_bytes: self.max_message_bytes as u64,
        };
        let link = self.members.join(hello, outbound, welcome, principal).await?;
        let span = tracing::info_span!("worker session", worker = %link.worker, pool = %link.pool);
        tokio::spawn(
            session(self.members.clone(), link, inbound, self.closing.clone()).instrument(span),
        );
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(receiver))))
    }
}

/// Reads the worker's messages and sends heartbeats until the session ends: the worker
/// closed it, its connection broke, it fell silent, or the router is closing.
async fn session(
    members: Arc<Members>,
    link: Arc<Link>,
    mut inbound: Streaming<WorkerMessage>,
    closing: Closing,
) {
    let config = members.config();
    let (interval, silence) = (config.heartbeat_interval(), config.heartbeat_timeout());
    let mut beat = tokio::time::interval_at(Instant::now() + interval, interval);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = Instant::now();
    let ended = loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(message)) => {
                    heard = Instant::now();
                    handle(&members, &link, message);
                }
                Ok(None) => break Status::ok("the worker closed its session"),
                Err(status) => break Status::unavailable(format!("the connection broke: {}", status.message())),
            },
            _ = beat.tick() => {
                if heard.elapsed() > silence {
                    break Status::unavailable(format!(
                        "no heartbeat for {} ms", heard.elapsed().as_millis()
                    ));
                }
                link.send(router_message::Message::Heartbeat(v1::Heartbeat {}));
            }
            () = closing.closed() => break Status::unavailable("the router is shutting down"),
            // Closed by the router (its credential was revoked): the session ends here too.
            () = link.ended.cancelled() => break Status::unauthenticated("the session was ended by the router"),
        }
    };
    members.leave(&link, ended).await;
}

fn handle(members: &Members, link: &Link, message: WorkerMessage) {
    use worker_message::Message;
    match message.message {
        Some(Message::Heartbeat(_)) | None => {}
        Some(Message::Hello(_)) => warn!("a second hello is ignored"),
        Some(Message::Drain(drain)) => {
            debug!(reason = %drain.reason, "worker drains");
            members.drain(link);
        }
        Some(Message::Event(event)) => {
            let converted = match event.event {
                Some(worker_call_event::Event::Progress(p)) => {
                    CallEvent::Progress { progress: p.progress, total: p.total, message: p.message }
                }
                Some(worker_call_event::Event::Partial(part)) => match convert::part(part) {
                    Some(part) => CallEvent::Partial(part),
                    None => return,
                },
                None => return,
            };
            link.event(&event.call_id, converted);
        }
        Some(Message::Result(result)) => {
            let outcome = match result.outcome {
                Some(worker_call_result::Outcome::Response(response)) => {
                    Ok(convert::output(response))
                }
                Some(worker_call_result::Outcome::Error(error)) => Err(BackendError::Remote {
                    code: convert::error_code(error.code),
                    message: format!("{}: {}", link.describe(), error.message),
                }),
                None => Err(BackendError::Internal(format!(
                    "{} answered call {} without a result or an error",
                    link.describe(),
                    result.call_id
                ))),
            };
            if !link.answer(&result.call_id, outcome) {
                debug!(call_id = %result.call_id, "an answer for a call that is over");
            }
        }
    }
}
