//! The connections of the gRPC front door, bounded.
//!
//! [`Listener`] accepts TCP connections for tonic and keeps them within bounds:
//!
//! - at most `max_connections` at once. At the cap, the oldest connection that has not yet
//!   sent the HTTP/2 preface makes room for the new one; when every connection is past its
//!   handshake, the new one is closed at once (its client sees `UNAVAILABLE` and may retry);
//! - a connection that has not sent the 24-byte HTTP/2 preface within `handshake_timeout`
//!   is closed, so idle sockets cannot hold slots;
//! - a connection with no call in flight for `idle_timeout` is closed (the calls of a
//!   connection are counted by [`TrackCallsLayer`]);
//! - when `accept` fails for want of descriptors or memory, accepting pauses with backoff
//!   instead of retrying in a busy loop, and the log says so once, and once more when it
//!   recovers.

use std::{
    collections::BTreeMap,
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    time::{Instant, Sleep},
};
use tokio_util::sync::CancellationToken;
use tonic::{body::Body, transport::server::Connected};
use tracing::{Instrument, debug, info, warn};

/// The client's first bytes on an HTTP/2 connection (RFC 9113, section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// First pause after `accept` ran out of descriptors; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// Longest pause between attempts to accept while out of descriptors.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How [`Listener`] bounds its connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Longest wait for the HTTP/2 preface.
    pub handshake_timeout: Duration,
    /// Longest time a connection stays open without a call in flight; `None`: forever.
    pub idle_timeout: Option<Duration>,
}

/// The connection count and the connections still in their handshake.
#[derive(Debug, Default)]
struct Slots {
    open: AtomicUsize,
    /// By accept order, so the first is the oldest.
    handshaking: Mutex<BTreeMap<u64, CancellationToken>>,
    next: AtomicU64,
}

impl Slots {
    fn handshaking(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, CancellationToken>> {
        self.handshaking.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Frees a connection's slot when the connection is dropped.
#[derive(Debug)]
struct Slot(Arc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The incoming connections, for `serve_with_incoming_shutdown`. Dropping it stops the
/// accept loop and closes the listening socket.
#[derive(Debug)]
pub struct Listener {
    ready: mpsc::Receiver<Connection>,
}

impl Listener {
    /// Starts accepting on `listener` within `limits`.
    pub fn new(listener: TcpListener, limits: ConnectionLimits) -> Self {
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(accept(listener, limits, tx).instrument(tracing::info_span!("listener")));
        Listener { ready }
    }
}

impl futures::Stream for Listener {
    type Item = io::Result<Connection>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.ready.poll_recv(cx).map(|next| next.map(Ok))
    }
}

/// Errors of `accept` that mean the process or the system is out of a resource: retrying
/// at once cannot succeed.
fn out_of_resources(error: &io::Error) -> bool {
    use nix::libc::{EMFILE, ENFILE, ENOBUFS, ENOMEM};
    matches!(error.raw_os_error(), Some(code) if [EMFILE, ENFILE, ENOBUFS, ENOMEM].contains(&code))
}

async fn accept(listener: TcpListener, limits: ConnectionLimits, ready: mpsc::Sender<Connection>) {
    let slots = Arc::new(Slots::default());
    let mut backoff = FIRST_BACKOFF;
    let mut starved = false;
    let mut full = false;
    loop {
        let accepted = tokio::select! {
            () = ready.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) if out_of_resources(&error) => {
                if !starved {
                    warn!(%error, "cannot accept connections: out of resources; pausing and retrying with backoff");
                    starved = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
            Err(error) => {
                debug!(%error, "accept failed");
                continue;
            }
        };
        if starved {
            info!("accepting connections again");
            starved = false;
            backoff = FIRST_BACKOFF;
        }
        if slots.open.load(Ordering::Acquire) >= limits.max_connections {
            if !full {
                warn!(
                    max_connections = limits.max_connections,
                    "connection limit reached: connections still in their handshake are closed \
                     to make room, and new ones are refused while there are none"
                );
                full = true;
            }
            // Make room by closing the oldest connection that has not even said hello.
            let oldest = slots.handshaking().pop_first();
            match oldest {
                Some((_, token)) => token.cancel(),
                None => {
                    drop(stream);
                    continue;
                }
            }
        } else if full {
            info!("below the connection limit again");
            full = false;
        }
        slots.open.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(slots.clone());
        let id = slots.next.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        slots.handshaking().insert(id, evicted.clone());
        let (slots, ready) = (slots.clone(), ready.clone());
        tokio::spawn(async move {
            let greeted = tokio::select! {
                () = evicted.cancelled() => Err("closed to make room for a new connection".to_owned()),
                read = tokio::time::timeout(limits.handshake_timeout, read_preface(stream)) => {
                    read.map_err(|_| format!("no HTTP/2 preface within {:?}", limits.handshake_timeout))
                        .and_then(|read| read.map_err(|e| e.to_string()))
                }
            };
            slots.handshaking().remove(&id);
            match greeted {
                Ok(stream) => {
                    let connection = Connection::new(stream, peer, slot, limits.idle_timeout);
                    let _ = ready.send(connection).await;
                }
                Err(reason) => debug!(%peer, %reason, "connection closed before its handshake"),
            }
        }.instrument(tracing::debug_span!("handshake", %peer)));
    }
}

/// Reads the HTTP/2 preface; a connection that sends anything else is refused.
async fn read_preface(mut stream: TcpStream) -> io::Result<TcpStream> {
    let mut preface = [0; PREFACE.len()];
    stream.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not an HTTP/2 connection"));
    }
    Ok(stream)
}

/// The calls in flight on one connection, and when the last one ended.
#[derive(Debug)]
struct Activity {
    in_flight: AtomicUsize,
    /// Milliseconds since `epoch` at which a call last started or ended.
    last: AtomicU64,
    epoch: Instant,
}

impl Activity {
    fn new() -> Self {
        Activity { in_flight: AtomicUsize::new(0), last: AtomicU64::new(0), epoch: Instant::now() }
    }

    fn touch(&self) {
        self.last.store(self.epoch.elapsed().as_millis() as u64, Ordering::Release);
    }

    /// Returns when the connection became idle, or `None` while a call is in flight.
    fn idle_since(&self) -> Option<Instant> {
        (self.in_flight.load(Ordering::Acquire) == 0)
            .then(|| self.epoch + Duration::from_millis(self.last.load(Ordering::Acquire)))
    }

    fn begin(self: &Arc<Self>) -> CallInFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.touch();
        CallInFlight(self.clone())
    }
}

/// One call on a connection; ends when dropped.
#[derive(Debug)]
struct CallInFlight(Arc<Activity>);

impl Drop for CallInFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a request knows of its connection (tonic puts it in the request's extensions).
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// The client's address.
    pub remote: SocketAddr,
    activity: Arc<Activity>,
}

/// One accepted connection past its handshake: the TCP stream with the preface put back in
/// front, closed once idle.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    /// Bytes of the preface not yet handed to the HTTP/2 server.
    replay: usize,
    info: ConnectionInfo,
    idle_timeout: Option<Duration>,
    idle: Option<Pin<Box<Sleep>>>,
    closed: bool,
    _slot: Slot,
}

impl Connection {
    fn new(
        stream: TcpStream,
        remote: SocketAddr,
        slot: Slot,
        idle_timeout: Option<Duration>,
    ) -> Self {
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        activity.touch();
        Connection {
            stream,
            replay: 0,
            info: ConnectionInfo { remote, activity },
            idle_timeout,
            idle: idle_timeout.map(|t| Box::pin(tokio::time::sleep(t))),
            closed: false,
            _slot: slot,
        }
    }

    /// Returns whether the idle timeout has passed with no call in flight; otherwise makes
    /// sure the timer wakes the connection when it might.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let (Some(timeout), Some(timer)) = (self.idle_timeout, self.idle.as_mut()) else {
            return false;
        };
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            match self.info.activity.idle_since() {
                Some(since) if since + timeout <= Instant::now() => return true,
                Some(since) => timer.as_mut().reset(since + timeout),
                None => timer.as_mut().reset(Instant::now() + timeout),
            }
        }
    }
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replay < PREFACE.len() {
            let n = (PREFACE.len() - this.replay).min(buf.remaining());
            buf.put_slice(&PREFACE[this.replay..this.replay + n]);
            this.replay += n;
            return Poll::Ready(Ok(()));
        }
        if this.closed || this.idle_expired(cx) {
            if !this.closed {
                debug!(peer = %this.info.remote, "closing a connection without calls for its idle timeout");
                this.closed = true;
            }
            // End of stream: the HTTP/2 server closes the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Counts each connection's calls in flight, from the request until its response body
/// ends, so that [`Listener`] closes only connections without calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackCallsLayer;

impl<S> tower::Layer<S> for TrackCallsLayer {
    type Service = TrackCalls<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TrackCalls { inner }
    }
}

/// The service of [`TrackCallsLayer`].
#[derive(Debug, Clone)]
pub struct TrackCalls<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<Body>> for TrackCalls<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let call = request.extensions().get::<ConnectionInfo>().map(|info| info.activity.begin());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                // The call ends with its response body: the guard lives in the body's
                // frame mapper and goes when the body does.
                let mut call = call;
                Body::new(http_body_util::BodyExt::map_frame(body, move |frame| {
                    let _in_flight = &mut call;
                    frame
                }))
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

    use futures::StreamExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// The shipped limits, from the compiled-in defaults.
    fn shipped() -> ConnectionLimits {
        let config = toolmesh_config::load_str(None, &Default::default()).unwrap();
        ConnectionLimits {
            max_connections: config.server.max_connections.get(),
            handshake_timeout: config.server.handshake_timeout,
            idle_timeout: config.server.idle_timeout,
        }
    }

    async fn listening(limits: ConnectionLimits) -> (Listener, std::net::SocketAddr) {
        let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        (Listener::new(socket, limits), addr)
    }

    /// On tokio's paused clock: the shipped 10 s pass at once, and exactly.
    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_says_hello_is_closed_at_the_handshake_timeout() {
        let limits = shipped();
        let (_listener, addr) = listening(limits).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        let mut byte = [0; 1];
        let read = tokio::time::timeout(limits.handshake_timeout * 2, client.read(&mut byte))
            .await
            .expect("closed by the server, not left open");
        assert!(matches!(read, Ok(0) | Err(_)), "closed: {read:?}");
        let waited = started.elapsed();
        assert!(waited >= limits.handshake_timeout, "not before the timeout: {waited:?}");
        assert!(waited < limits.handshake_timeout + Duration::from_secs(1), "{waited:?}");
    }

    /// On tokio's paused clock: the shipped idle timeout (minutes) passes at once.
    #[tokio::test(start_paused = true)]
    async fn a_connection_without_calls_ends_at_the_idle_timeout() {
        let limits = shipped();
        let idle = limits.idle_timeout.expect("an idle timeout is shipped");
        let (mut listener, addr) = listening(limits).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(PREFACE).await.unwrap();
        let mut connection = listener.next().await.unwrap().unwrap();
        // The preface is handed on to the HTTP/2 server first.
        let mut preface = [0; PREFACE.len()];
        connection.read_exact(&mut preface).await.unwrap();
        assert_eq!(&preface, PREFACE);

        let started = Instant::now();
        let mut buffer = [0; 64];
        let read = tokio::time::timeout(idle * 2, connection.read(&mut buffer))
            .await
            .expect("ended, not left open")
            .unwrap();
        assert_eq!(read, 0, "the server side sees its end");
        let waited = started.elapsed();
        assert!(waited >= idle && waited < idle + Duration::from_secs(1), "{waited:?} of {idle:?}");
    }
}
