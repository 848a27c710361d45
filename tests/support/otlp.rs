//! An OTLP trace receiver on loopback, and readers of the spans it received.

#![allow(clippy::unwrap_used)] // Test helpers: a failed unwrap is a failed test.

use crate::{BinaryServer, eventually};
use nix::sys::signal::Signal;
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value,
    trace::v1::Span,
};
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

/// An OTLP/gRPC trace receiver that keeps every span it is sent.
#[derive(Clone, Default)]
pub struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

impl Receiver {
    /// Starts a receiver on 127.0.0.1:0; returns it and its endpoint URL.
    pub async fn start() -> (Self, String) {
        let receiver = Receiver::default();
        let endpoint = serve_on_loopback(TraceServiceServer::new(receiver.clone())).await;
        (receiver, endpoint)
    }

    /// Stops `server` (shutdown flushes its exporter) and returns the spans received once
    /// one named `name` is among them.
    pub async fn spans_after_stop(
        &self,
        server: &mut BinaryServer,
        name: &str,
    ) -> Vec<(String, Span)> {
        server.signal(Signal::SIGTERM);
        tokio::time::timeout(Duration::from_secs(15), server.child.wait()).await.unwrap().unwrap();
        eventually(Duration::from_secs(10), || async {
            let spans = self.spans.lock().unwrap().clone();
            spans.iter().any(|(_, s)| s.name == name).then_some(spans)
        })
        .await
        .unwrap_or_else(|| panic!("a {name} span arrives at the receiver"))
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// Serves one gRPC service on 127.0.0.1:0 for the rest of the test; returns its URL.
pub async fn serve_on_loopback<S>(service: S) -> String
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    endpoint
}

/// `bytes` in lowercase hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of the attribute `key` of `span`, as a string.
pub fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            other => Some(format!("{other:?}")),
        }
    })
}

/// An integer attribute of `span`.
pub fn int_attr(span: &Span, key: &str) -> Option<i64> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::IntValue(v) => Some(*v),
            _ => None,
        }
    })
}
