//! Tools defined in configuration, end to end: HTTP tools against an HTTP server the test
//! starts on 127.0.0.1:0, command tools running real scripts.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Json, Router,
    extract::{Query, State},
    http::{HeaderMap, StatusCode},
    routing::{get, post},
};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tonic::Code;
use toolmesh::AppOptions;
use toolmesh_e2e::{BinaryServer, python};
use toolmesh_e2e::{TestServer, eventually, process_alive, serve_http, text, write_script};
use toolmesh_proto::v1::CallToolRequest;

type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

/// An HTTP server on 127.0.0.1:0 that records what it was asked.
async fn http_server() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(
            "/weather",
            get(
                |State(seen): State<Seen>,
                 headers: HeaderMap,
                 Query(q): Query<HashMap<String, String>>| async move {
                    let city = q.get("city").cloned().unwrap_or_default();
                    seen.lock().unwrap().push((city.clone(), headers));
                    Json(json!({"current": {"summary": format!("sunny in {city}"), "temp_c": 22},
                            "items": [{"id": 7}, {"id": 8}]}))
                },
            ),
        )
        .route(
            "/down",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "upstream is down for maintenance") }),
        )
        .route("/big", get(|| async { "x".repeat(64 * 1024) }))
        .route("/text", get(|| async { "plain words" }))
        .route(
            "/tickets",
            post(|Json(body): Json<Value>| async move {
                Json(json!({"ticket": {"id": 42, "body": body}}))
            }),
        )
        .route(
            "/redirect",
            get(|| async { (StatusCode::FOUND, [("location", "http://127.0.0.1:1/")]) }),
        )
        .with_state(seen.clone());
    (format!("http://{}", serve_http(app).await), seen)
}

#[tokio::test]
async fn http_tools_call_a_real_server() {
    let (base, seen) = http_server().await;
    let config = format!(
        r#"
[[tools.http]]
name = "weather"
description = "Weather"
url = "{base}/weather?city={{{{city}}}}"
headers = {{ X-Api-Key = "k-123" }}
extract = "current.summary"
allow_private_network = true
[tools.http.parameters]
type = "object"
required = ["city"]
properties.city = {{ type = "string" }}

[[tools.http]]
name = "weather_raw"
description = "Weather, whole answer"
url = "{base}/weather?city={{{{city}}}}"
allow_private_network = true

[[tools.http]]
name = "first_item"
description = "First item id"
url = "{base}/weather"
extract = "items.0.id"
allow_private_network = true

[[tools.http]]
name = "down"
description = "Always 503"
url = "{base}/down"
allow_private_network = true

[[tools.http]]
name = "big"
description = "Too large"
url = "{base}/big"
max_response_bytes = 1024
allow_private_network = true

[[tools.http]]
name = "text"
description = "Plain text"
url = "{base}/text"
allow_private_network = true

[[tools.http]]
name = "ticket"
description = "Create a ticket"
method = "POST"
url = "{base}/tickets"
body = {{ title = "{{{{title}}}}", priority = "{{{{priority}}}}", source = "toolmesh" }}
extract = "ticket"
allow_private_network = true

[[tools.http]]
name = "guarded"
description = "Loopback without permission"
url = "{base}/weather"

[[tools.http]]
name = "guarded_by_name"
description = "A host name that resolves to loopback, without permission"
url = "http://localhost:9/weather"
"#
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();

    let response = server.call("weather", json!({"city": "São Paulo & co"})).await.unwrap();
    assert!(!response.is_error, "{response:?}");
    assert_eq!(
        text(&response),
        "sunny in São Paulo & co",
        "the argument was URL-encoded and decoded back"
    );
    let (city, headers) = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(city, "São Paulo & co");
    assert_eq!(headers.get("x-api-key").unwrap(), "k-123");

    let raw = server.call("weather_raw", json!({"city": "Oslo"})).await.unwrap();
    let structured: Value = serde_json::from_str(raw.structured_json.as_deref().unwrap()).unwrap();
    assert_eq!(structured["current"]["temp_c"], 22);

    let first = server.call("first_item", json!({})).await.unwrap();
    assert_eq!(first.structured_json.as_deref(), Some("7"));

    let down = server.call("down", json!({})).await.unwrap();
    assert!(down.is_error);
    assert!(
        text(&down).contains("503") && text(&down).contains("upstream is down"),
        "{}",
        text(&down)
    );

    let big = server.call("big", json!({})).await.unwrap();
    assert!(big.is_error && text(&big).contains("max_response_bytes"), "{}", text(&big));

    let plain = server.call("text", json!({})).await.unwrap();
    assert_eq!(text(&plain), "plain words");

    let ticket = server.call("ticket", json!({"title": "Disk full", "priority": 2})).await.unwrap();
    let structured: Value =
        serde_json::from_str(ticket.structured_json.as_deref().unwrap()).unwrap();
    assert_eq!(
        structured,
        json!({"id": 42, "body": {"title": "Disk full", "priority": 2, "source": "toolmesh"}})
    );

    for tool in ["guarded", "guarded_by_name"] {
        let refused = server.call(tool, json!({})).await.unwrap();
        assert!(refused.is_error, "{tool}");
        assert!(text(&refused).contains("refused"), "{tool}: {}", text(&refused));
    }
    assert_eq!(seen.lock().unwrap().len(), 3, "the guarded tools never reached the server");
}

#[tokio::test]
async fn command_tools_run_scripts_without_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let json_tool = write_script(
        dir.path(),
        "json.sh",
        r#"input=$(cat); printf '{"got": %s, "arg1": "%s"}' "$input" "$1""#,
    );
    let text_tool =
        write_script(dir.path(), "text.sh", "cat > /dev/null; echo \"hello from $GREETING\"");
    let failing = write_script(dir.path(), "fail.sh", "echo 'disk quota exceeded' >&2; exit 3");
    let config = format!(
        r#"
[[tools.command]]
name = "json_tool"
description = "Echoes its input as JSON"
command = "{}"
args = ["$(touch /tmp/should-not-exist); {{{{x}}}}"]

[[tools.command]]
name = "text_tool"
description = "Says hello"
command = "{}"
env = {{ GREETING = "a script" }}

[[tools.command]]
name = "failing"
description = "Fails"
command = "{}"
"#,
        json_tool.display(),
        text_tool.display(),
        failing.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();

    let response = server.call("json_tool", json!({"x": "; rm -rf /"})).await.unwrap();
    assert!(!response.is_error, "{}", text(&response));
    let structured: Value =
        serde_json::from_str(response.structured_json.as_deref().unwrap()).unwrap();
    assert_eq!(structured["got"], json!({"x": "; rm -rf /"}), "arguments arrive on stdin");
    assert_eq!(
        structured["arg1"], "$(touch /tmp/should-not-exist); {{x}}",
        "args are passed verbatim"
    );

    let hello = server.call("text_tool", json!({})).await.unwrap();
    assert_eq!(text(&hello), "hello from a script");

    let failed = server.call("failing", json!({})).await.unwrap();
    assert!(failed.is_error);
    assert!(
        text(&failed).contains("exited with 3") && text(&failed).contains("disk quota exceeded"),
        "{}",
        text(&failed)
    );
}

#[tokio::test]
async fn a_timed_out_command_and_its_descendants_are_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let slow = write_script(
        dir.path(),
        "slow.sh",
        &format!("sleep 300 &\necho \"$$ $!\" > {}\nwait", pids.display()),
    );
    let config = format!(
        r#"
[[tools.command]]
name = "slow"
description = "Never finishes in time"
command = "{}"
timeout_ms = 500
"#,
        slow.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let status = server.call("slow", json!({})).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("slow") && status.message().contains("500 ms"),
        "{}",
        status.message()
    );

    let recorded = std::fs::read_to_string(&pids).expect("the script recorded its pids");
    let pids: Vec<i32> = recorded.split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2);
    let gone = eventually(Duration::from_secs(5), || async {
        pids.iter().all(|p| !process_alive(*p)).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the script {} and its child {} are gone", pids[0], pids[1]);
}

/// A slow command tool flooded by 300 callers on the default pool (16 workers, 256 waiting)
/// holds only its share of the pool (the bulkhead): `echo` keeps being served.
#[tokio::test]
async fn a_saturated_tool_cannot_starve_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let slow = write_script(dir.path(), "slow.sh", "cat > /dev/null; sleep 30");
    let config = format!(
        "[[tools.command]]\nname = \"slow\"\ndescription = \"Takes its time\"\ncommand = \"{}\"\n",
        slow.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(server.client().await);
    }
    let callers: Vec<_> = (0..300)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let refused = refused.clone();
            tokio::spawn(async move {
                let request = toolmesh_proto::v1::CallToolRequest {
                    name: "slow".into(),
                    arguments_json: "{}".into(),
                    ..Default::default()
                };
                if let Err(status) = client.call_tool(request).await {
                    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                    assert!(status.message().contains("share of the worker pool"), "{status:?}");
                    refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        })
        .collect();
    // Every caller is either admitted (running or waiting) or refused.
    let settled = eventually(Duration::from_secs(30), || async {
        let admitted = server.app.pool().stats().admitted;
        (admitted + refused.load(std::sync::atomic::Ordering::SeqCst) == 300).then_some(admitted)
    })
    .await;
    assert_eq!(settled, Some(8 + 128), "half of the workers and half of the queue");

    for i in 0..20 {
        let echoed = server.call("echo", json!({"i": i})).await.expect("echo is served");
        assert_eq!(echoed.structured_json.as_deref(), Some(json!({"i": i}).to_string().as_str()));
    }
    for caller in callers {
        caller.abort();
    }
}

/// Two HTTP servers on loopback: what each was asked, by path, with the headers.
async fn recording_server() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let record = |State(seen): State<Seen>, uri: axum::http::Uri, headers: HeaderMap| async move {
        seen.lock().unwrap().push((uri.path().to_owned(), headers));
        format!("you asked for {}", uri.path())
    };
    let app = Router::new().fallback(record).with_state(seen.clone());
    (format!("http://{}", serve_http(app).await), seen)
}

/// A server that redirects: `/same` to its own `/landed`, `/away` to `{to}/landed`.
async fn redirecting_server(to: String) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(
            "/same",
            get(|headers: HeaderMap, State(seen): State<Seen>| async move {
                seen.lock().unwrap().push(("/same".into(), headers));
                (StatusCode::FOUND, [("location", "/landed")])
            }),
        )
        .route(
            "/landed",
            get(|headers: HeaderMap, State(seen): State<Seen>| async move {
                seen.lock().unwrap().push(("/landed".into(), headers));
                "landed"
            }),
        )
        .route(
            "/away",
            get(move || {
                let to = to.clone();
                async move { (StatusCode::FOUND, [("location", format!("{to}/landed"))]) }
            }),
        )
        .with_state(seen.clone());
    (format!("http://{}", serve_http(app).await), seen)
}

/// URL templates keep arguments in their place (no dot segments), configured headers stay
/// with their origin on redirects, and every IANA special-purpose range is refused without
/// `allow_private_network`, the IPv4-compatible IPv6 form included.
#[tokio::test]
async fn http_tools_keep_arguments_headers_and_requests_where_they_belong() {
    let (other, other_seen) = recording_server().await;
    let (base, seen) = redirecting_server(other.clone()).await;
    let (users, users_seen) = recording_server().await;
    let port = other.rsplit(':').next().unwrap();
    let config = format!(
        r#"
[[tools.http]]
name = "user"
description = "One user"
url = "{users}/api/users/{{{{id}}}}"
allow_private_network = true

[[tools.http]]
name = "hop"
description = "Follows a redirect"
url = "{base}/{{{{path}}}}"
headers = {{ X-Api-Key = "secret-key", Authorization = "Bearer secret" }}
allow_private_network = true

[[tools.http]]
name = "documentation"
description = "TEST-NET-1"
url = "http://192.0.2.1/x"
timeout_ms = 2000

[[tools.http]]
name = "compatible"
description = "IPv4-compatible loopback"
url = "http://[::127.0.0.1]:{port}/x"
timeout_ms = 2000

[[tools.http]]
name = "benchmarking"
description = "Benchmarking range"
url = "http://198.18.0.1/x"
timeout_ms = 2000
"#
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();

    // An argument cannot leave its path segment.
    for id in ["..", "."] {
        let status = server.call("user", json!({"id": id})).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{id}: {status:?}");
        assert!(status.message().contains("argument id"), "{}", status.message());
    }
    let fine = server.call("user", json!({"id": "7"})).await.unwrap();
    assert_eq!(text(&fine), "you asked for /api/users/7");
    let asked: Vec<String> = users_seen.lock().unwrap().iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(asked, ["/api/users/7"], "nothing reached /api/");

    // Redirects: the configured headers follow to the same origin, never to another.
    let same = server.call("hop", json!({"path": "same"})).await.unwrap();
    assert_eq!(text(&same), "landed");
    let landed = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(landed.0, "/landed");
    assert_eq!(landed.1.get("x-api-key").unwrap(), "secret-key");
    let away = server.call("hop", json!({"path": "away"})).await.unwrap();
    assert_eq!(text(&away), "you asked for /landed", "{away:?}");
    let (path, headers) = other_seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(path, "/landed");
    for secret in ["x-api-key", "authorization", "cookie"] {
        assert!(headers.get(secret).is_none(), "{secret} crossed origins: {headers:?}");
    }

    for (tool, reason) in [
        ("documentation", "documentation"),
        ("compatible", "reserved"),
        ("benchmarking", "benchmarking"),
    ] {
        let refused = server.call(tool, json!({})).await.unwrap();
        assert!(refused.is_error, "{tool}");
        assert!(
            text(&refused).contains("refused") && text(&refused).contains(reason),
            "{tool}: {}",
            text(&refused)
        );
    }
    assert!(other_seen.lock().unwrap().iter().all(|(p, _)| p == "/landed"), "no /x arrived");
}

/// Returns whether `pid` exists at all (a zombie still does).
fn exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// No descendant outlives its call, even one that left the process group with `setsid`,
/// and a background descendant that keeps stdout open does not hold the result back: on
/// the shipped defaults, the call answers right after the command exits, and every
/// descendant is killed and reaped.
#[tokio::test]
async fn descendants_that_escape_or_hold_the_output_die_with_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let escaped = dir.path().join("escaped");
    let holder = dir.path().join("holder");
    let escape = write_script(
        dir.path(),
        "escape.sh",
        &format!(
            "setsid sleep 300 &\necho $! > {}\necho '{{\"escaped\": true}}'",
            escaped.display()
        ),
    );
    let hold = write_script(
        dir.path(),
        "hold.sh",
        &format!(
            "(sleep 60; echo late) &\necho $! > {}\necho '{{\"early\": true}}'",
            holder.display()
        ),
    );
    let config = format!(
        "[[tools.command]]\nname = \"escape\"\ndescription = \"Leaves a grandchild in a session of its own\"\ncommand = \"{}\"\n\n\
         [[tools.command]]\nname = \"hold\"\ndescription = \"Leaves a grandchild holding stdout\"\ncommand = \"{}\"\n",
        escape.display(),
        hold.display()
    );
    let server = TestServer::start(&config, AppOptions::default()).await.unwrap();

    let response = server.call("escape", json!({})).await.unwrap();
    assert_eq!(response.structured_json.as_deref(), Some(r#"{"escaped":true}"#));
    let pid: i32 = std::fs::read_to_string(&escaped).unwrap().trim().parse().unwrap();
    let gone = eventually(Duration::from_secs(5), || async { (!exists(pid)).then_some(()) }).await;
    assert!(gone.is_some(), "the setsid grandchild {pid} was killed and reaped");

    let response = server.call("hold", json!({})).await.expect("no DEADLINE_EXCEEDED");
    assert_eq!(response.structured_json.as_deref(), Some(r#"{"early":true}"#));
    let pid: i32 = std::fs::read_to_string(&holder).unwrap().trim().parse().unwrap();
    let gone = eventually(Duration::from_secs(5), || async { (!exists(pid)).then_some(()) }).await;
    assert!(gone.is_some(), "the background grandchild {pid} was killed and reaped");
}

/// `proxy.py` on a free port (installed by tests/setup), logging each request it carries.
struct HttpProxy {
    child: tokio::process::Child,
    _dir: tempfile::TempDir,
    url: String,
    log: std::path::PathBuf,
}

impl HttpProxy {
    async fn start() -> Self {
        let python = python();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("access.log");
        let child = toolmesh_e2e::spawn(
            tokio::process::Command::new(python)
                .args(["-m", "proxy", "--hostname", "127.0.0.1", "--port", &port.to_string()])
                .args(["--num-workers", "1", "--num-acceptors", "1", "--log-file"])
                .arg(&log)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                // proxy.py forks its workers: the whole group goes on drop.
                .process_group(0)
                .kill_on_drop(true),
        )
        .expect("proxy.py is installed (tests/setup)");
        eventually(Duration::from_secs(30), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()
        })
        .await
        .expect("the proxy listens");
        HttpProxy { child, _dir: dir, url: format!("http://127.0.0.1:{port}"), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ =
                nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// With `HTTP_PROXY` and friends set, an HTTP tool still goes direct and its guard still
/// refuses loopback; a proxy named in the configuration is used, and the guard checks the
/// destination through it too.
#[tokio::test]
async fn http_tools_ignore_environment_proxies_and_guard_through_a_named_one() {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let app = axum::Router::new().fallback({
        let seen = seen.clone();
        move |uri: axum::http::Uri| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(uri.path().to_owned());
                "reached"
            }
        }
    });
    let target = serve_http(app).await.port();
    let proxy = HttpProxy::start().await;

    let config = format!(
        r#"
[[tools.http]]
name = "direct"
description = "Loopback by name, no permission"
url = "http://localhost:{target}/direct"

[[tools.http]]
name = "named_guarded"
description = "Loopback through the named proxy, no permission"
url = "http://localhost:{target}/named_guarded"
proxy = "{proxy}"

[[tools.http]]
name = "named"
description = "Loopback through the named proxy, allowed"
url = "http://localhost:{target}/named"
proxy = "{proxy}"
allow_private_network = true
"#,
        proxy = proxy.url
    );
    let env = [
        ("HTTP_PROXY", proxy.url.as_str()),
        ("http_proxy", proxy.url.as_str()),
        ("HTTPS_PROXY", proxy.url.as_str()),
        ("ALL_PROXY", proxy.url.as_str()),
    ];
    let server = BinaryServer::with_config(&config, &env).await.unwrap();
    let client = toolmesh::client::connect(&server.addr.to_string(), None).await.unwrap();
    let call = |name: &str| {
        let request = CallToolRequest { name: name.into(), ..Default::default() };
        let mut client = client.clone();
        async move { client.call_tool(request).await.unwrap().into_inner() }
    };
    let text = |response: &toolmesh_proto::v1::CallToolResponse| format!("{:?}", response.content);

    for tool in ["direct", "named_guarded"] {
        let refused = call(tool).await;
        assert!(refused.is_error, "{tool}: {}", text(&refused));
        assert!(text(&refused).contains("refused"), "{tool}: {}", text(&refused));
    }
    let named = call("named").await;
    assert!(!named.is_error, "{}", text(&named));
    assert!(text(&named).contains("reached"));
    assert_eq!(*seen.lock().unwrap(), ["/named"], "only the allowed call reached the target");
    // proxy.py logs a request when its connection closes.
    drop(client);
    drop(server);
    let logged = eventually(Duration::from_secs(5), || async {
        proxy.log().contains(&format!("localhost:{target}/named")).then_some(())
    })
    .await;
    assert!(logged.is_some(), "the named proxy carried the call:\n{}", proxy.log());
    assert!(!proxy.log().contains("/direct"), "the environment proxy was not used");
}
