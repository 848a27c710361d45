//! The connections of the front door, bounded.
//!
//! [`Listener`] accepts TCP connections for the server (HTTP/2 for gRPC, and HTTP/1.1 as
//! well where the MCP endpoint is served) and keeps them within bounds:
//!
//! - at most `max_connections` at once. At the cap, the oldest connection that has not yet
//!   sent the HTTP/2 preface makes room for the new one; when every connection is past its
//!   handshake, the new one is closed at once (its client sees `UNAVAILABLE` and may retry);
//! - at most `max_connections_per_peer` from one client address, so that one client cannot
//!   take every slot; one more from that address is closed at once;
//! - a connection that has not finished its TLS handshake (with `[tls]`) and sent the
//!   24-byte HTTP/2 preface (or, where HTTP/1.1 is accepted, the method of its first
//!   request) within `handshake_timeout` is closed, so idle sockets cannot hold slots;
//! - a connection with no call in flight for `idle_timeout` is closed (the calls of a
//!   connection are counted by [`TrackCallsLayer`]). Health watches and reflection streams
//!   are not calls: anyone may open them, and they would otherwise hold a connection
//!   forever. [`TrackCallsLayer`] also bounds health watches per connection and in all;
//! - when `accept` fails for want of descriptors or memory, accepting pauses with backoff
//!   instead of retrying in a busy loop, and the log says so once, and once more when it
//!   recovers.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
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
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tonic::{body::Body, transport::server::Connected};
use toolmesh_identity::CertificateIdentity;
use tracing::{Instrument, debug, info, warn};

use crate::tls::ListenerTls;

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
    /// Connections open at once from one client address.
    pub max_connections_per_peer: usize,
    /// Longest wait for the HTTP/2 preface (or an HTTP/1.1 request's method).
    pub handshake_timeout: Duration,
    /// Take HTTP/1.1 connections beside HTTP/2 ones.
    pub accept_http1: bool,
    /// Longest time a connection stays open without a call in flight; `None`: forever.
    pub idle_timeout: Option<Duration>,
}

impl ConnectionLimits {
    /// The limits of `config`, for a server that takes `max_connections` (the configured
    /// number, or fewer where descriptors are short).
    pub fn new(config: &toolmesh_config::ServerConfig, max_connections: usize) -> Self {
        ConnectionLimits {
            max_connections,
            max_connections_per_peer: config
                .max_connections_per_peer
                .map_or(max_connections / 4, std::num::NonZeroUsize::get)
                .clamp(1, max_connections.max(1)),
            handshake_timeout: config.handshake_timeout,
            idle_timeout: config.idle_timeout,
            accept_http1: false,
        }
    }
}

/// The connection count and the connections still in their handshake.
#[derive(Debug, Default)]
struct Slots {
    open: AtomicUsize,
    /// By accept order, so the first is the oldest.
    handshaking: Mutex<BTreeMap<u64, CancellationToken>>,
    next: AtomicU64,
    peers: Mutex<Peers>,
}

/// The connections open from each client address, and the addresses at their cap whose
/// refusal was logged.
#[derive(Debug, Default)]
struct Peers {
    open: HashMap<IpAddr, usize>,
    at_cap: HashSet<IpAddr>,
}

impl Slots {
    fn handshaking(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, CancellationToken>> {
        self.handshaking.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, Peers> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a connection from `peer`, or returns `false` when `peer` has `cap` open.
    fn admit_peer(&self, peer: IpAddr, cap: usize) -> bool {
        let mut peers = self.peers();
        let open = peers.open.entry(peer).or_insert(0);
        if *open >= cap {
            if peers.at_cap.insert(peer) {
                warn!(
                    %peer,
                    max_connections_per_peer = cap,
                    "connection limit of one client address reached: its new connections are closed"
                );
            }
            return false;
        }
        *open += 1;
        true
    }

    /// Forgets a connection from `peer`.
    fn release_peer(&self, peer: IpAddr) {
        let mut peers = self.peers();
        if let Some(open) = peers.open.get_mut(&peer) {
            *open -= 1;
            if *open == 0 {
                peers.open.remove(&peer);
            }
        }
        if !peers.open.contains_key(&peer) {
            peers.at_cap.remove(&peer);
        }
    }
}

/// Frees a connection's slot, and its address's, when the connection is dropped.
#[derive(Debug)]
struct Slot {
    slots: Arc<Slots>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.open.fetch_sub(1, Ordering::AcqRel);
        self.slots.release_peer(self.peer);
    }
}

/// The incoming connections, for `serve_with_incoming_shutdown`. Dropping it stops the
/// accept loop and closes the listening socket.
#[derive(Debug)]
pub struct Listener {
    ready: mpsc::Receiver<Connection>,
}

impl Listener {
    /// Starts accepting on `listener` within `limits`, with the TLS of `tls` in force
    /// when each connection is accepted.
    pub fn new(listener: TcpListener, limits: ConnectionLimits, tls: ListenerTls) -> Self {
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(accept(listener, limits, tls, tx).instrument(tracing::info_span!("listener")));
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

async fn accept(
    listener: TcpListener,
    limits: ConnectionLimits,
    tls: ListenerTls,
    ready: mpsc::Sender<Connection>,
) {
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
        let address = peer.ip().to_canonical();
        if !slots.admit_peer(address, limits.max_connections_per_peer) {
            drop(stream);
            continue;
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
                    slots.release_peer(address);
                    drop(stream);
                    continue;
                }
            }
        } else if full {
            info!("below the connection limit again");
            full = false;
        }
        slots.open.fetch_add(1, Ordering::AcqRel);
        let slot = Slot { slots: slots.clone(), peer: address };
        let id = slots.next.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        slots.handshaking().insert(id, evicted.clone());
        let (slots, ready) = (slots.clone(), ready.clone());
        let acceptor = tls.acceptor();
        let tls_on = acceptor.is_some();
        tokio::spawn(async move {
            let greeted = tokio::select! {
                () = evicted.cancelled() => Err("closed to make room for a new connection".to_owned()),
                read = tokio::time::timeout(limits.handshake_timeout, handshake(stream, acceptor, limits.accept_http1)) => {
                    read.map_err(|_| format!(
                        "no {}HTTP/2 preface within {:?}",
                        if tls_on { "TLS handshake and " } else { "" },
                        limits.handshake_timeout,
                    ))
                    .and_then(|read| read)
                }
            };
            slots.handshaking().remove(&id);
            match greeted {
                Ok((stream, first)) => {
                    let connection = Connection::new(stream, first, peer, slot, limits.idle_timeout);
                    let _ = ready.send(connection).await;
                }
                Err(reason) => debug!(%peer, %reason, "connection closed before its handshake"),
            }
        }.instrument(tracing::debug_span!("handshake", %peer)));
    }
}

/// The methods an HTTP/1.1 request may start with, followed by a space.
const HTTP1_METHODS: [&[u8]; 7] =
    [b"GET ", b"POST ", b"DELETE ", b"OPTIONS ", b"HEAD ", b"PUT ", b"PATCH "];

/// What a connection's first bytes say.
#[derive(Debug, PartialEq, Eq)]
enum Greeting {
    /// The HTTP/2 preface, whole.
    Http2,
    /// An HTTP/1.1 request's method and the space after it.
    Http1,
    /// Not yet known: more bytes decide.
    Partial,
    /// Neither protocol this server speaks.
    Other,
}

fn greeting(first: &[u8], http1: bool) -> Greeting {
    if PREFACE.starts_with(first) {
        return if first.len() == PREFACE.len() { Greeting::Http2 } else { Greeting::Partial };
    }
    if !http1 {
        return Greeting::Other;
    }
    if HTTP1_METHODS.iter().any(|method| first.starts_with(method)) {
        Greeting::Http1
    } else if HTTP1_METHODS.iter().any(|method| method.starts_with(first)) {
        Greeting::Partial
    } else {
        Greeting::Other
    }
}

/// The first bytes of a connection, read to tell its protocol, handed on to the server.
#[derive(Debug, Clone, Copy)]
struct FirstBytes {
    bytes: [u8; PREFACE.len()],
    len: usize,
}

/// Completes the TLS handshake where `acceptor` is given, then reads the HTTP/2 preface
/// (or, with `http1`, the method of an HTTP/1.1 request); a connection that sends anything
/// else is refused.
async fn handshake(
    stream: TcpStream,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    http1: bool,
) -> Result<(Stream, FirstBytes), String> {
    let mut stream = match acceptor {
        None => Stream::Plain(stream),
        Some(acceptor) => {
            let stream = acceptor
                .accept(stream)
                .await
                .map_err(|error| format!("TLS handshake failed: {error}"))?;
            Stream::Tls(Box::new(stream))
        }
    };
    let mut first = FirstBytes { bytes: [0; PREFACE.len()], len: 0 };
    loop {
        let n = stream.read(&mut first.bytes[first.len..]).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before its first request".into());
        }
        first.len += n;
        match greeting(&first.bytes[..first.len], http1) {
            Greeting::Http2 | Greeting::Http1 => return Ok((stream, first)),
            Greeting::Partial => {}
            Greeting::Other if http1 => return Err("neither HTTP/2 nor HTTP/1.1".into()),
            Greeting::Other => return Err("not an HTTP/2 connection".into()),
        }
    }
}

/// A connection's byte stream: plain TCP, or TLS over it.
#[derive(Debug)]
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(stream) => stream,
            Stream::Tls(stream) => stream.get_ref().0,
        }
    }

    /// The identity of the client certificate the handshake verified.
    fn certificate(&self) -> Option<CertificateIdentity> {
        let Stream::Tls(stream) = self else { return None };
        let leaf = stream.get_ref().1.peer_certificates()?.first()?;
        CertificateIdentity::from_der(leaf)
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(stream) => stream.is_write_vectored(),
            Stream::Tls(stream) => stream.is_write_vectored(),
        }
    }
}

/// The calls in flight on one connection, and when the last one ended.
#[derive(Debug)]
struct Activity {
    in_flight: AtomicUsize,
    /// Health watches open on the connection: not calls.
    watches: AtomicUsize,
    /// Milliseconds since `epoch` at which a call last started or ended.
    last: AtomicU64,
    epoch: Instant,
}

impl Activity {
    fn new() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
            last: AtomicU64::new(0),
            epoch: Instant::now(),
        }
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

/// Takes one unit of `counter` unless it holds `limit` already.
fn take(counter: &AtomicUsize, limit: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
        .is_ok()
}

/// The health watches open on every connection, and their bounds.
#[derive(Debug)]
struct Watches {
    open: AtomicUsize,
    limit: usize,
    per_connection: usize,
}

/// One open health watch; ends when dropped.
#[derive(Debug)]
struct Watching {
    all: Arc<Watches>,
    connection: Option<Arc<Activity>>,
}

impl Watching {
    /// Counts a new watch on `connection`, or says which bound it would pass.
    fn begin(all: &Arc<Watches>, connection: Option<&Arc<Activity>>) -> Result<Self, String> {
        if let Some(activity) = connection
            && !take(&activity.watches, all.per_connection)
        {
            return Err(format!(
                "this connection has {} health watches open, the most server.max_watches_per_connection allows",
                all.per_connection
            ));
        }
        if !take(&all.open, all.limit) {
            if let Some(activity) = connection {
                activity.watches.fetch_sub(1, Ordering::AcqRel);
            }
            return Err(format!(
                "the server has {} health watches open, the most server.max_watches allows",
                all.limit
            ));
        }
        Ok(Watching { all: all.clone(), connection: connection.cloned() })
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.all.open.fetch_sub(1, Ordering::AcqRel);
        if let Some(activity) = &self.connection {
            activity.watches.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// What a request knows of its connection (tonic puts it in the request's extensions).
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// The client's address.
    pub remote: SocketAddr,
    /// The identity of the client certificate of a mutual-TLS connection.
    pub certificate: Option<CertificateIdentity>,
    activity: Arc<Activity>,
}

/// One accepted connection past its handshake: the stream (TLS or not) with its first
/// bytes put back in front, closed once idle.
#[derive(Debug)]
pub struct Connection {
    stream: Stream,
    /// The bytes read to tell the protocol.
    first: FirstBytes,
    /// How many of them were handed to the server.
    replay: usize,
    info: ConnectionInfo,
    idle_timeout: Option<Duration>,
    idle: Option<Pin<Box<Sleep>>>,
    closed: bool,
    _slot: Slot,
}

impl Connection {
    fn new(
        stream: Stream,
        first: FirstBytes,
        remote: SocketAddr,
        slot: Slot,
        idle_timeout: Option<Duration>,
    ) -> Self {
        let _ = stream.tcp().set_nodelay(true);
        let activity = Arc::new(Activity::new());
        activity.touch();
        let certificate = stream.certificate();
        Connection {
            stream,
            first,
            replay: 0,
            info: ConnectionInfo { remote, certificate, activity },
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
        if this.replay < this.first.len {
            let n = (this.first.len - this.replay).min(buf.remaining());
            buf.put_slice(&this.first.bytes[this.replay..this.replay + n]);
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

/// The health service's streaming method: a watch is not a call.
const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";
/// The reflection services' prefix: their streams are not calls either.
const REFLECTION: &str = "/grpc.reflection.";

/// Counts each connection's calls in flight, from the request until its response body
/// ends, so that [`Listener`] closes only connections without calls; health watches and
/// reflection streams are not counted, and health watches are bounded per connection and
/// in all (one more is answered `RESOURCE_EXHAUSTED`).
#[derive(Debug, Clone)]
pub struct TrackCallsLayer {
    watches: Arc<Watches>,
}

impl TrackCallsLayer {
    /// Returns the layer with the watch bounds of `config`.
    pub fn new(config: &toolmesh_config::ServerConfig) -> Self {
        TrackCallsLayer {
            watches: Arc::new(Watches {
                open: AtomicUsize::new(0),
                limit: config.max_watches.get(),
                per_connection: config.max_watches_per_connection.get(),
            }),
        }
    }
}

impl<S> tower::Layer<S> for TrackCallsLayer {
    type Service = TrackCalls<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TrackCalls { inner, watches: self.watches.clone() }
    }
}

/// The service of [`TrackCallsLayer`].
#[derive(Debug, Clone)]
pub struct TrackCalls<S> {
    inner: S,
    watches: Arc<Watches>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a stream holds while it is open, given back when dropped: a call in flight, a
/// watch, or nothing.
#[derive(Debug)]
enum Held {
    Call { _call: CallInFlight },
    Watch { _watch: Watching },
    Nothing,
}

impl<S, B> tower::Service<http::Request<Body>> for TrackCalls<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
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
        let activity = request.extensions().get::<ConnectionInfo>().map(|info| &info.activity);
        let path = request.uri().path();
        let held = if path == HEALTH_WATCH {
            match Watching::begin(&self.watches, activity) {
                Ok(watching) => Held::Watch { _watch: watching },
                Err(reason) => {
                    debug!(%reason, "health watch refused");
                    let refused = tonic::Status::resource_exhausted(reason).into_http();
                    return Box::pin(std::future::ready(Ok(refused)));
                }
            }
        } else if path.starts_with(REFLECTION) {
            Held::Nothing
        } else {
            activity.map_or(Held::Nothing, |activity| Held::Call { _call: activity.begin() })
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                // The stream ends with its response body: what it holds lives in the body's
                // frame mapper and goes when the body does.
                let mut held = held;
                Body::new(http_body_util::BodyExt::map_frame(body, move |frame| {
                    let _open = &mut held;
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
        ConnectionLimits::new(&config.server, config.server.max_connections.get())
    }

    async fn listening(limits: ConnectionLimits) -> (Listener, std::net::SocketAddr) {
        listening_with(limits, ListenerTls::default()).await
    }

    async fn listening_with(
        limits: ConnectionLimits,
        tls: ListenerTls,
    ) -> (Listener, std::net::SocketAddr) {
        let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        (Listener::new(socket, limits, tls), addr)
    }

    /// A CA, a server certificate for 127.0.0.1 and a client certificate for
    /// `agent.example`, as files in `dir`; returns the listener's TLS (mutual) and a
    /// client that trusts the CA and shows its certificate.
    fn pki(dir: &std::path::Path) -> (ListenerTls, tokio_rustls::TlsConnector) {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |name: &str| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(vec![name.to_owned()])
                .unwrap()
                .signed_by(&key, &*ca)
                .unwrap();
            (cert, key)
        };
        let (server, server_key) = leaf("127.0.0.1");
        let (client, client_key) = leaf("agent.example");
        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let config = crate::tls::TlsConfig {
            cert: write("server.pem", server.pem()),
            key: write("server-key.pem", server_key.serialize_pem()),
            client_ca: Some(write("ca.pem", ca.pem())),
            client_auth: crate::tls::ClientAuth::Required,
        };
        let tls = ListenerTls::new(Some(crate::tls::Loaded::read(config).unwrap()));

        use tokio_rustls::rustls;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut client_config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![client.der().clone()],
                rustls_pki_types::PrivateKeyDer::try_from(client_key.serialize_der()).unwrap(),
            )
            .unwrap();
        client_config.alpn_protocols = vec![b"h2".to_vec()];
        (tls, tokio_rustls::TlsConnector::from(std::sync::Arc::new(client_config)))
    }

    #[tokio::test]
    async fn a_tls_connection_is_handed_on_with_its_client_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (tls, connector) = pki(dir.path());
        let (mut listener, addr) = listening_with(shipped(), tls).await;
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut client = connector.connect(name, tcp).await.unwrap();
        assert_eq!(client.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "h2 by ALPN");
        client.write_all(PREFACE).await.unwrap();
        client.write_all(b"frames").await.unwrap();
        client.flush().await.unwrap();

        let mut connection = listener.next().await.unwrap().unwrap();
        let certificate = connection.connect_info().certificate.map(|c| c.name);
        assert_eq!(certificate.as_deref(), Some("agent.example"));
        let mut read = [0; PREFACE.len() + 6];
        connection.read_exact(&mut read).await.unwrap();
        assert_eq!(&read[..PREFACE.len()], PREFACE, "the preface is handed on");
        assert_eq!(&read[PREFACE.len()..], b"frames", "then the client's bytes, decrypted");
    }

    /// On tokio's paused clock: a TCP connection that never starts its TLS handshake is
    /// closed at the shipped handshake timeout, and a plaintext HTTP/2 client is refused.
    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_starts_its_tls_handshake_is_closed_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let (tls, _) = pki(dir.path());
        let limits = shipped();
        let (mut listener, addr) = listening_with(limits, tls).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        let mut byte = [0; 1];
        let read = tokio::time::timeout(limits.handshake_timeout * 2, silent.read(&mut byte))
            .await
            .expect("closed by the server, not left open");
        assert!(matches!(read, Ok(0) | Err(_)), "closed: {read:?}");
        let waited = started.elapsed();
        assert!(waited >= limits.handshake_timeout, "not before the timeout: {waited:?}");

        let mut plaintext = TcpStream::connect(addr).await.unwrap();
        plaintext.write_all(PREFACE).await.unwrap();
        let read = tokio::time::timeout(limits.handshake_timeout * 2, plaintext.read(&mut byte))
            .await
            .expect("answered, not left open");
        assert!(matches!(read, Ok(0) | Err(_)) || byte[0] == 0x15, "a TLS alert or closed");
        let handed_on = tokio::time::timeout(Duration::from_millis(100), listener.next()).await;
        assert!(handed_on.is_err(), "nothing reaches the HTTP/2 server");
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

    /// HTTP/2 and, where the MCP endpoint is served, HTTP/1.1 are told apart by their first
    /// bytes, in however many reads they arrive; anything else is refused.
    #[test]
    fn the_first_bytes_tell_http2_from_http1() {
        assert_eq!(greeting(PREFACE, false), Greeting::Http2);
        assert_eq!(greeting(&PREFACE[..5], true), Greeting::Partial);
        assert_eq!(greeting(b"POST /mcp HTTP/1.1", false), Greeting::Other);
        assert_eq!(greeting(b"POST /mcp HTTP/1.1", true), Greeting::Http1);
        assert_eq!(greeting(b"PO", true), Greeting::Partial);
        assert_eq!(greeting(b"P", true), Greeting::Partial, "PRI, POST, PUT or PATCH");
        assert_eq!(greeting(b"DELETE ", true), Greeting::Http1);
        assert_eq!(greeting(b"\x16\x03\x01", true), Greeting::Other, "TLS to a plaintext port");
        assert_eq!(greeting(b"GETX", true), Greeting::Other);
    }

    /// With HTTP/1.1 accepted, a request's bytes reach the server whole, the first ones
    /// that were read to tell the protocol put back in front.
    #[tokio::test]
    async fn an_http1_request_is_handed_on_whole() {
        let limits = ConnectionLimits { accept_http1: true, ..shipped() };
        let (mut listener, addr) = listening(limits).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        let request = b"POST /mcp HTTP/1.1\r\nhost: localhost\r\n\r\n";
        client.write_all(&request[..2]).await.unwrap();
        client.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        client.write_all(&request[2..]).await.unwrap();
        let mut connection = listener.next().await.unwrap().unwrap();
        let mut read = vec![0; request.len()];
        connection.read_exact(&mut read).await.unwrap();
        assert_eq!(read, request);

        let shipped_only_http2 = shipped();
        assert!(!shipped_only_http2.accept_http1);
        let (mut listener, addr) = listening(shipped_only_http2).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(request).await.unwrap();
        let handed_on = tokio::time::timeout(Duration::from_millis(200), listener.next()).await;
        assert!(handed_on.is_err(), "without the MCP endpoint, HTTP/1.1 is refused");
    }
}
