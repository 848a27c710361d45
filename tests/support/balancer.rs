//! A load balancer without affinity, for the tests of sessions across router replicas: each
//! HTTP request goes to the next of its backends in turn, whatever session it belongs to.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use axum::{
    body::Body,
    extract::{Request, State},
    http::{StatusCode, header},
    response::Response,
};

/// A round-robin HTTP/1.1 balancer on loopback; stops when dropped.
pub struct RoundRobin {
    /// Where it listens.
    pub addr: SocketAddr,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

struct Inner {
    backends: Vec<SocketAddr>,
    next: AtomicUsize,
    served: Vec<AtomicUsize>,
    client: reqwest::Client,
}

impl RoundRobin {
    /// Starts a balancer over `backends`.
    pub async fn start(backends: Vec<SocketAddr>) -> anyhow::Result<Self> {
        let inner = Arc::new(Inner {
            served: backends.iter().map(|_| AtomicUsize::new(0)).collect(),
            backends,
            next: AtomicUsize::new(0),
            client: reqwest::Client::builder().http1_only().build()?,
        });
        let app = axum::Router::new().fallback(forward).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(RoundRobin { addr, inner, task })
    }

    /// How many requests each backend was sent, in the order given.
    pub fn served(&self) -> Vec<usize> {
        self.inner.served.iter().map(|n| n.load(Ordering::SeqCst)).collect()
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends `request` to the next backend and streams its answer back (an event stream too).
async fn forward(State(inner): State<Arc<Inner>>, request: Request) -> Response {
    let turn = inner.next.fetch_add(1, Ordering::SeqCst) % inner.backends.len();
    inner.served[turn].fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("http://{}{path}", inner.backends[turn]);
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return status(StatusCode::BAD_REQUEST);
    };
    let mut outbound = inner.client.request(parts.method, url).body(body);
    for (name, value) in &parts.headers {
        if name != header::HOST && name != header::CONTENT_LENGTH && name != header::CONNECTION {
            outbound = outbound.header(name, value);
        }
    }
    let Ok(answer) = outbound.send().await else { return status(StatusCode::BAD_GATEWAY) };
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if name != header::CONTENT_LENGTH
            && name != header::TRANSFER_ENCODING
            && name != header::CONNECTION
        {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap_or_else(|_| status(StatusCode::BAD_GATEWAY))
}

fn status(code: StatusCode) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = code;
    response
}
