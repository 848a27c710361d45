//! The server's edges: reflection, hostile and oversized requests, connection and
//! stream limits, health watches, idle connections.

use prost::Message as _;
use serde_json::json;
use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};
use tonic::Code;
use tonic_types::StatusExt;
use toolmesh_e2e::BinaryServer;
use toolmesh_e2e::calls::{call, request, server};
use toolmesh_e2e::cli::cpu_time;
use toolmesh_e2e::{TestServer, eventually, text, tools::BlockingProbe};
use toolmesh_proto::v1::{
    CallToolClientMessage, CallToolRequest, ListToolsRequest, call_tool_client_message,
};

#[tokio::test]
async fn reflection_v1_lists_the_services_and_serves_their_descriptors() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("toolmesh.v1.ToolService".into()),
    ]
    .map(|m| ServerReflectionRequest { host: String::new(), message_request: Some(m) });
    let mut responses =
        client.server_reflection_info(futures::stream::iter(requests)).await.unwrap().into_inner();

    let Some(MessageResponse::ListServicesResponse(list)) =
        responses.message().await.unwrap().unwrap().message_response
    else {
        panic!("a service list")
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for expected in
        ["toolmesh.v1.ToolService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"]
    {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        responses.message().await.unwrap().unwrap().message_response
    else {
        panic!("a file descriptor")
    };
    let file =
        prost_types::FileDescriptorProto::decode(&files.file_descriptor_proto[0][..]).unwrap();
    assert_eq!(file.package(), "toolmesh.v1");
    assert!(file.service.iter().any(|s| s.name() == "ToolService"));
}

/// Sends raw bytes as the request message of `method`, for requests no proper client sends.
async fn raw_call(server: &TestServer, method: &'static str, message: Vec<u8>) -> tonic::Status {
    #[derive(Clone, Default)]
    struct RawCodec;
    struct RawEncoder;
    struct RawDecoder;
    impl tonic::codec::Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = RawEncoder;
        type Decoder = RawDecoder;
        fn encoder(&mut self) -> RawEncoder {
            RawEncoder
        }
        fn decoder(&mut self) -> RawDecoder {
            RawDecoder
        }
    }
    impl tonic::codec::Encoder for RawEncoder {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(
            &mut self,
            item: Vec<u8>,
            buf: &mut tonic::codec::EncodeBuf<'_>,
        ) -> Result<(), tonic::Status> {
            bytes::BufMut::put_slice(buf, &item);
            Ok(())
        }
    }
    impl tonic::codec::Decoder for RawDecoder {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn decode(
            &mut self,
            buf: &mut tonic::codec::DecodeBuf<'_>,
        ) -> Result<Option<Vec<u8>>, tonic::Status> {
            Ok(Some(bytes::Buf::copy_to_bytes(buf, bytes::Buf::remaining(buf)).to_vec()))
        }
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(method);
    grpc.unary(tonic::Request::new(message), path, RawCodec).await.unwrap_err()
}

/// Hostile input gets the right status and is never echoed whole: malformed protobuf is
/// INVALID_ARGUMENT (not INTERNAL), an oversize message RESOURCE_EXHAUSTED (not
/// OUT_OF_RANGE), and huge names and values come back cut.
#[tokio::test]
async fn hostile_requests_get_short_messages_and_the_right_codes() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let mut client = server.client().await;

    let huge = "n".repeat(3 << 20);
    let unknown = call(&mut client, &huge, json!({})).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().len() < 300, "{} bytes", unknown.message().len());
    assert!(unknown.message().contains(&format!("{} bytes", huge.len())), "{}", unknown.message());
    let mut in_profile = request("echo", json!({}));
    in_profile.profile = huge.clone();
    let profile = client.call_tool(in_profile).await.unwrap_err();
    assert_eq!(profile.code(), Code::InvalidArgument);
    assert!(profile.message().len() < 400, "{} bytes", profile.message().len());

    // A value that fails the schema is quoted in the violation, but only its start.
    let invalid =
        call(&mut client, "think", json!({"title": [huge], "thought": "x"})).await.unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert!(invalid.message().len() < 2000, "{} bytes", invalid.message().len());
    let details = invalid.get_details_bad_request().unwrap();
    assert_eq!(details.field_violations[0].field, "/title");
    assert!(details.field_violations[0].description.len() < 400);

    for method in ["/toolmesh.v1.ToolService/CallTool", "/toolmesh.v1.ToolService/SearchTools"] {
        let malformed = raw_call(&server, method, vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).await;
        assert_eq!(malformed.code(), Code::InvalidArgument, "{method}: {malformed:?}");
        let oversize = raw_call(&server, method, vec![0; 5 << 20]).await;
        assert_eq!(oversize.code(), Code::ResourceExhausted, "{method}: {oversize:?}");
        assert!(oversize.message().contains("4194304"), "{}", oversize.message());
    }

    // The same limit holds for the messages of a stream.
    let start = request("echo", json!({"blob": "b".repeat(5 << 20)}));
    let outbound = futures::stream::iter([CallToolClientMessage {
        message: Some(call_tool_client_message::Message::Start(start)),
    }]);
    let streamed = async {
        let mut stream = client.stream_call_tool(outbound).await?.into_inner();
        while stream.message().await?.is_some() {}
        Ok::<_, tonic::Status>(())
    };
    let status = streamed.await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // The server is unharmed.
    call(&mut client, "echo", json!({"ok": true})).await.unwrap();
}

/// Opens a raw HTTP/2 connection: the preface and an empty SETTINGS frame.
async fn raw_http2(server: &TestServer) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut socket = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    socket.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    socket.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    socket
}

/// Reads HTTP/2 frames until the server closes the connection; returns them as
/// (type, payload).
async fn frames_until_closed(socket: &mut tokio::net::TcpStream) -> Vec<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut frames = Vec::new();
    let mut header = [0u8; 9];
    while socket.read_exact(&mut header).await.is_ok() {
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0; len];
        if socket.read_exact(&mut payload).await.is_err() {
            break;
        }
        frames.push((header[3], payload));
    }
    frames
}

/// The server announces the shipped per-connection stream limit, and a connection with no
/// call for `idle_timeout_ms` is closed, while one with a call in flight is not.
#[tokio::test]
async fn connections_announce_a_stream_limit_and_idle_ones_are_closed() {
    let probe = Arc::new(BlockingProbe::default());
    let defaults = server("", &probe).await;
    let mut socket = raw_http2(&defaults).await;
    let mut header = [0u8; 9];
    tokio::io::AsyncReadExt::read_exact(&mut socket, &mut header).await.unwrap();
    assert_eq!(header[3], 4, "the server's first frame is SETTINGS");
    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let mut settings = vec![0; len];
    tokio::io::AsyncReadExt::read_exact(&mut socket, &mut settings).await.unwrap();
    let announced: Vec<(u16, u32)> = settings
        .chunks_exact(6)
        .map(|s| (u16::from_be_bytes([s[0], s[1]]), u32::from_be_bytes([s[2], s[3], s[4], s[5]])))
        .collect();
    assert!(announced.contains(&(3, 256)), "SETTINGS_MAX_CONCURRENT_STREAMS: {announced:?}");

    let probe = Arc::new(BlockingProbe::default());
    let short = server("[server]\nidle_timeout_ms = 300\n", &probe).await;
    let mut idle = raw_http2(&short).await;
    tokio::time::timeout(Duration::from_secs(10), frames_until_closed(&mut idle))
        .await
        .expect("an idle connection is closed");

    // A call that outlasts the idle timeout keeps its connection.
    let mut client = short.client().await;
    let call = tokio::spawn(async move { client.call_tool(request("block", json!({}))).await });
    eventually(Duration::from_secs(5), || async {
        (probe.started.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    probe.gate.add_permits(1);
    let response = call.await.unwrap().expect("the call in flight was not cut off");
    assert_eq!(text(&response.into_inner()), "released");
}

/// A plain channel (one HTTP/2 connection) to `server`.
async fn channel(server: &TestServer) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Opens a health watch of the overall entry on `channel`.
async fn watch(
    channel: tonic::transport::Channel,
) -> Result<tonic::Streaming<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
    health.watch(request).await.map(tonic::Response::into_inner)
}

/// On the shipped defaults: one connection holds at most `max_watches_per_connection`
/// health watches and the server `max_watches`; one more is refused with
/// RESOURCE_EXHAUSTED naming the bound, a watch that ends frees its place, and callers get
/// through while every watch slot is taken.
#[tokio::test]
async fn health_watches_are_bounded_per_connection_and_in_all() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("", &probe).await;
    let shipped = TestServer::config("").unwrap().server;
    let (per_connection, limit) =
        (shipped.max_watches_per_connection.get(), shipped.max_watches.get());
    let mut channels = Vec::new();
    let mut watches = Vec::new();
    for _ in 0..limit / per_connection {
        let channel = channel(&server).await;
        for _ in 0..per_connection {
            let mut stream = watch(channel.clone()).await.expect("a watch within the bounds");
            let first = stream.message().await.unwrap().expect("the current status");
            assert_eq!(first.status(), tonic_health::ServingStatus::Serving.into());
            watches.push(stream);
        }
        channels.push(channel);
    }
    let one_more = watch(channels[0].clone()).await.expect_err("past the connection's bound");
    assert_eq!(one_more.code(), Code::ResourceExhausted, "{one_more:?}");
    assert!(one_more.message().contains("server.max_watches_per_connection"), "{one_more:?}");
    let fresh = channel(&server).await;
    let one_more = watch(fresh.clone()).await.expect_err("past the server's bound");
    assert_eq!(one_more.code(), Code::ResourceExhausted, "{one_more:?}");
    assert!(one_more.message().contains("server.max_watches "), "{one_more:?}");

    let mut client = server.client().await;
    client.list_tools(ListToolsRequest::default()).await.expect("a caller gets through");

    // A watch that ends gives its place back.
    drop(watches.pop());
    let again = eventually(Duration::from_secs(5), || {
        let fresh = fresh.clone();
        async move { watch(fresh).await.ok() }
    })
    .await;
    assert!(again.is_some(), "an ended watch frees its place");
}

/// A connection whose only streams are health watches is idle: it is closed at the idle
/// timeout, its watch with it (the shipped timeout is minutes; here it is 300 ms).
#[tokio::test]
async fn a_connection_with_only_health_watches_is_closed_when_idle() {
    let probe = Arc::new(BlockingProbe::default());
    let server = server("[server]\nidle_timeout_ms = 300\n", &probe).await;
    let mut stream = watch(channel(&server).await).await.unwrap();
    stream.message().await.unwrap().expect("the current status");
    let next = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the watch ends with its connection");
    assert!(matches!(next, Err(_) | Ok(None)), "{next:?}");
}

/// With `max_connections = 64` (a quarter of it per client address, by default), 70
/// connections from one address hold 16 slots; the rest are closed at once, and a client
/// from another address gets through.
#[tokio::test]
async fn one_client_address_cannot_take_every_connection() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let probe = Arc::new(BlockingProbe::default());
    let server = server("[server]\nmax_connections = 64\n", &probe).await;
    let mut sockets = Vec::new();
    for _ in 0..70 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut stream = socket.connect(server.addr).await.unwrap();
        // A refused connection may be closed before the preface is written.
        let _ = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        sockets.push(stream);
    }
    // A held connection gets the server's SETTINGS and stays open; a refused one is
    // closed without a byte.
    let held = futures::future::join_all(sockets.iter_mut().map(|socket| async move {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), socket.read(&mut byte)).await;
        matches!(read, Ok(Ok(1)))
    }))
    .await;
    assert_eq!(held.iter().filter(|held| **held).count(), 16, "{held:?}");

    let mut client = server.client().await;
    client.list_tools(ListToolsRequest::default()).await.expect("another address gets through");
}

/// 1,100 connections that never send the HTTP/2 preface, from five addresses, against a
/// toolmesh allowed 1,024 descriptors, on the shipped defaults: callers still get through at once, the accept
/// loop does not spin, the log says so once, and the idle sockets are closed after the
/// handshake timeout.
#[tokio::test]
async fn idle_connections_cannot_lock_out_callers() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    use tokio::io::AsyncReadExt;
    // This test holds 1,100 sockets of its own.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < 4096 {
        setrlimit(Resource::RLIMIT_NOFILE, hard.min(8192).max(soft), hard).unwrap();
    }
    let server = BinaryServer::start_under(&["prlimit", "--nofile=1024:1024", "--"], &[], &[])
        .await
        .unwrap();
    // From five addresses, each under its quarter of the connections (224 of 896).
    let mut idle = Vec::new();
    for i in 0..1100 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("127.0.0.{}:0", 2 + i % 5).parse().unwrap()).unwrap();
        idle.push(socket.connect(server.addr).await.unwrap());
    }

    let before = cpu_time(server.pid());
    let started = std::time::Instant::now();
    let mut client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let mut request = tonic::Request::new(CallToolRequest {
        name: "echo".into(),
        arguments_json: json!({"through": true}).to_string(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(5));
    let answer = client.call_tool(request).await.expect("a caller gets through");
    assert!(answer.into_inner().structured_json.unwrap().contains("through"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let busy = cpu_time(server.pid()) - before;
    let elapsed = started.elapsed();
    assert!(busy < elapsed / 4, "the server used {busy:?} of CPU in {elapsed:?} while idle");
    let logs = server.logs();
    assert_eq!(logs.matches("connection limit reached").count(), 1, "{logs}");
    assert!(logs.contains("max_connections=896"), "1,024 descriptors less 128: {logs}");

    // Every idle socket is closed by the server, at the latest after the 10 s handshake
    // timeout.
    let closed = idle.iter_mut().map(|socket| async move {
        let mut byte = [0u8; 1];
        matches!(socket.read(&mut byte).await, Ok(0) | Err(_))
    });
    let all = tokio::time::timeout(Duration::from_secs(20), futures::future::join_all(closed))
        .await
        .expect("the server closed the idle sockets");
    assert!(all.into_iter().all(|closed| closed));
    // And it still serves.
    client.call_tool(CallToolRequest { name: "echo".into(), ..Default::default() }).await.unwrap();
}
