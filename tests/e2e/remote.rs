//! Remote workers end to end: real `toolmesh serve` and `toolmesh worker` processes on
//! loopback, with command tools that record each execution.

use std::{collections::BTreeMap, path::Path, time::Duration};

use nix::sys::signal::Signal;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use toolmesh_e2e::cli::tool_names;
use toolmesh_e2e::otlp::{Receiver, attr};
use toolmesh_e2e::{BinaryServer, BinaryWorker, eventually, write_script};
use toolmesh_proto::v1::CallToolRequest;

/// The router's environment: lexical search (no model to load).
const ROUTER_ENV: &[(&str, &str)] = &[("TOOLMESH__SEARCH__EMBEDDINGS", "false")];

/// A worker configuration named `name` with two tools that append `<tool> <name> <n>` to
/// `ledger` when they start, sleep `sleep` seconds, append `... done`, then print
/// `<name> <n>`: `record`,
/// annotated idempotent, and `charge`, which has a side effect (no annotations).
fn worker_toml(dir: &Path, name: &str, ledger: &Path, sleep: f64, extra: &str) -> String {
    let script = write_script(
        dir,
        &format!("{name}.sh"),
        &format!(
            "n=$(cat | sed 's/[^0-9]//g')\necho \"$1 {name} $n\" >> {ledger}\nsleep {sleep}\n\
             echo \"$1 {name} $n done\" >> {ledger}\necho \"{name} $n\"",
            ledger = ledger.display()
        ),
    );
    let tool = |tool: &str, annotations: &str| {
        format!(
            "[[tools.command]]\nname = \"{tool}\"\ndescription = \"records call n\"\n\
             command = \"{}\"\nargs = [\"{tool}\"]\n{annotations}\n\
             [tools.command.parameters]\ntype = \"object\"\nproperties.n = {{ type = \"integer\" }}\n",
            script.display()
        )
    };
    format!(
        "[worker]\ncapacity = 2\nid = \"{name}\"\n{extra}\n{}{}",
        tool("record", "annotations = { idempotent = true }"),
        tool("charge", "")
    )
}

/// Executions in `ledger`: (tool, n) → the workers that ran it.
fn executions(ledger: &Path) -> BTreeMap<(String, u64), Vec<String>> {
    let mut runs: BTreeMap<(String, u64), Vec<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(ledger).unwrap_or_default().lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        // A process whose worker died before handing it the arguments has no n.
        if let [tool, worker, n] = parts[..]
            && let Ok(n) = n.parse()
        {
            runs.entry((tool.to_owned(), n)).or_default().push(worker.to_owned());
        }
    }
    runs
}

async fn call(
    addr: &str,
    tool: &str,
    n: u64,
    timeout: Duration,
) -> Result<toolmesh_proto::v1::CallToolResponse, tonic::Status> {
    call_as(addr, tool, n, "", timeout).await
}

/// [`call`] with the caller's own `call_id`.
async fn call_as(
    addr: &str,
    tool: &str,
    n: u64,
    call_id: &str,
    timeout: Duration,
) -> Result<toolmesh_proto::v1::CallToolResponse, tonic::Status> {
    let mut client = toolmesh::client::connect(addr, None).await.unwrap();
    let mut request = tonic::Request::new(CallToolRequest {
        name: tool.into(),
        arguments_json: format!("{{\"n\": {n}}}"),
        call_id: call_id.into(),
        ..Default::default()
    });
    request.set_timeout(timeout);
    client.call_tool(request).await.map(tonic::Response::into_inner)
}

/// The gRPC health of `service` at `addr`.
async fn health(addr: &str, service: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect()
        .await
        .ok()?;
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest { service: service.into() };
    client.check(request).await.ok().map(|r| r.into_inner().status())
}

async fn wait_for_tool(addr: &str, tool: &str) {
    eventually(Duration::from_secs(20), || async {
        tool_names(addr).await.iter().any(|t| t == tool).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("tool {tool} never appeared"));
}

/// A worker of one slot whose tools take `sleep` seconds, and a call of `tool` (n = 1,
/// deadline `deadline_ms`) running in that slot.
async fn one_busy_slot(
    addr: &str,
    dir: &Path,
    ledger: &Path,
    sleep: f64,
    tool: &'static str,
    deadline_ms: u64,
) -> (
    BinaryWorker,
    tokio::task::JoinHandle<Result<toolmesh_proto::v1::CallToolResponse, tonic::Status>>,
) {
    let toml = worker_toml(dir, "w1", ledger, sleep, "").replace("capacity = 2", "capacity = 1");
    let worker = BinaryWorker::start(addr, &toml, &[]).unwrap();
    worker.joined(1).await.unwrap();
    wait_for_tool(addr, "charge").await;
    let busy = tokio::spawn({
        let addr = addr.to_owned();
        async move { call(&addr, tool, 1, Duration::from_millis(deadline_ms)).await }
    });
    eventually(Duration::from_secs(5), || async { (!executions(ledger).is_empty()).then_some(()) })
        .await
        .expect("the first call started");
    (worker, busy)
}

#[tokio::test]
async fn calls_spread_over_workers_and_a_killed_worker_loses_no_call_and_repeats_no_side_effect() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let router = BinaryServer::start(&[], ROUTER_ENV).await.unwrap();
    let addr = router.addr.to_string();
    let names = ["w1", "w2", "w3"];
    let workers: Vec<BinaryWorker> = names
        .iter()
        .map(|name| {
            BinaryWorker::start(&addr, &worker_toml(dir.path(), name, &ledger, 0.6, ""), &[])
                .unwrap()
        })
        .collect();
    for worker in &workers {
        worker.joined(1).await.unwrap();
    }
    wait_for_tool(&addr, "record").await;

    // Twelve calls, as many as the workers' six slots twice over, half of them idempotent.
    let deadline = Duration::from_secs(20);
    let calls: Vec<_> = (0..12u64)
        .map(|n| {
            let addr = addr.clone();
            let tool = if n % 2 == 0 { "record" } else { "charge" };
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let outcome = call(&addr, tool, n, deadline).await;
                (tool, n, outcome, started.elapsed())
            })
        })
        .collect();
    // Once every worker runs calls, the one running a side-effecting call dies (which
    // worker that is depends on the order the calls arrive in).
    let victim = eventually(Duration::from_secs(10), || async {
        let runs = executions(&ledger);
        let running: std::collections::BTreeSet<&String> = runs.values().flatten().collect();
        let text = std::fs::read_to_string(&ledger).unwrap_or_default();
        let charging = runs.iter().find_map(|((tool, n), on)| {
            (tool == "charge" && !text.contains(&format!("charge {} {n} done", on[0])))
                .then(|| on[0].clone())
        });
        charging.filter(|_| running.len() == 3)
    })
    .await
    .expect("calls spread over all three workers, one of them running a side effect");
    let index = names.iter().position(|name| *name == victim).expect("a worker's name");
    workers[index].signal(Signal::SIGKILL);

    let mut unknown = std::collections::BTreeSet::new();
    for task in calls {
        let (tool, n, outcome, took) = task.await.unwrap();
        assert!(took < deadline, "call {n} took {took:?}, past its deadline");
        match (tool, outcome) {
            (_, Ok(response)) => assert!(!response.is_error, "call {n}: {response:?}"),
            ("charge", Err(status)) => {
                assert_eq!(status.code(), Code::Unavailable, "call {n}: {status:?}");
                assert!(status.message().contains("outcome of call"), "{}", status.message());
                assert!(
                    status.message().contains(&victim),
                    "names the worker: {}",
                    status.message()
                );
                unknown.insert(n);
            }
            (_, Err(status)) => panic!("idempotent call {n} failed: {status:?}"),
        }
    }
    let runs = executions(&ledger);
    let ledger_text = std::fs::read_to_string(&ledger).unwrap();
    let only_on = |on: &[String], worker: &str| on.len() == 1 && on[0] == worker;
    for ((tool, n), on) in &runs {
        match tool.as_str() {
            // A side effect runs at most once; one cut off on the victim has an unknown
            // outcome.
            "charge" => {
                assert_eq!(on.len(), 1, "side-effecting call {n} ran {} times: {on:?}", on.len());
                assert_eq!(only_on(on, &victim), unknown.contains(n), "call {n}: {runs:?}");
            }
            // An idempotent call cut off on the victim ran again elsewhere, and succeeded.
            _ if on[0] == victim && !ledger_text.contains(&format!("record {victim} {n} done")) => {
                assert!(on.len() == 2 && on[1] != victim, "call {n} was not repeated: {on:?}")
            }
            // One that finished on the victim may have been repeated if it died before
            // answering.
            _ if on[0] == victim => assert!(on.len() <= 2, "call {n}: {on:?}"),
            _ => assert_eq!(on.len(), 1, "call {n}: {on:?}"),
        }
    }
    assert!(!unknown.is_empty(), "{victim} was running a side-effecting call: {runs:?}");
    // The router saw the worker go.
    let logs = router.logs();
    assert!(logs.contains("worker left") && logs.contains(&victim), "{logs}");
}

#[tokio::test]
async fn a_worker_joining_under_load_takes_calls_and_a_draining_worker_finishes_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let router = BinaryServer::start(&[], ROUTER_ENV).await.unwrap();
    let addr = router.addr.to_string();
    let mut first =
        BinaryWorker::start(&addr, &worker_toml(dir.path(), "w1", &ledger, 0.5, ""), &[]).unwrap();
    first.joined(1).await.unwrap();
    wait_for_tool(&addr, "charge").await;

    // Eight calls of half a second on two slots: they queue for the first worker.
    let calls: Vec<_> = (0..8u64)
        .map(|n| {
            let addr = addr.clone();
            tokio::spawn(async move { call(&addr, "charge", n, Duration::from_secs(20)).await })
        })
        .collect();
    eventually(Duration::from_secs(5), || async {
        (!executions(&ledger).is_empty()).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the first calls did not start:\n{}", first.logs()));
    let second =
        BinaryWorker::start(&addr, &worker_toml(dir.path(), "w2", &ledger, 0.5, ""), &[]).unwrap();
    second.joined(1).await.unwrap();
    // The first worker is told to stop while it runs calls: it finishes them.
    eventually(Duration::from_secs(5), || async {
        executions(&ledger).values().any(|on| on[0] == "w2").then_some(())
    })
    .await
    .expect("the worker that joined took calls");
    first.signal(Signal::SIGTERM);
    for call in calls {
        let response = call.await.unwrap().unwrap_or_else(|status| {
            panic!(
                "every call succeeds: {status:?}\nrouter:\n{}\nw1:\n{}\nw2:\n{}",
                router.logs(),
                first.logs(),
                second.logs()
            )
        });
        assert!(!response.is_error);
    }
    let status =
        tokio::time::timeout(Duration::from_secs(15), first.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "the drained worker exits 0; logs:\n{}", first.logs());
    let runs = executions(&ledger);
    assert!(runs.values().all(|on| on.len() == 1), "each call ran once: {runs:?}");
    let by_second = runs.values().filter(|on| on[0] == "w2").count();
    assert!(by_second >= 2, "the joining worker took calls: {runs:?}");
    assert!(router.logs().contains("worker draining"), "{}", router.logs());
    // The tool stays: the second worker serves it.
    let response = call(&addr, "charge", 100, Duration::from_secs(10)).await.unwrap();
    assert_eq!(toolmesh_e2e::text(&response).trim(), "w2 100");
}

#[tokio::test]
async fn workers_of_one_tool_must_agree_and_a_tool_goes_with_its_last_worker() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let router = BinaryServer::start(&[], ROUTER_ENV).await.unwrap();
    let addr = router.addr.to_string();
    let first =
        BinaryWorker::start(&addr, &worker_toml(dir.path(), "w1", &ledger, 0.0, ""), &[]).unwrap();
    first.joined(1).await.unwrap();
    assert_eq!(health(&addr, "toolmesh.remote.default").await, Some(ServingStatus::Serving));
    // Same tool names, another description of `record`.
    let other = worker_toml(dir.path(), "w2", &ledger, 0.0, "").replacen(
        "records call n",
        "records call n differently",
        1,
    );
    let second = BinaryWorker::start(&addr, &other, &[]).unwrap();
    let refused = eventually(Duration::from_secs(10), || async {
        second.logs().lines().find(|l| l.contains("refused")).map(str::to_owned)
    })
    .await
    .unwrap_or_else(|| panic!("the second worker is not refused:\n{}", second.logs()));
    assert!(
        refused.contains("tool record") && refused.contains("w1") && refused.contains("w2"),
        "{refused}"
    );
    // A name a router's own tool holds is refused the same way.
    let echo = worker_toml(dir.path(), "w3", &ledger, 0.0, "")
        .replace("name = \"record\"", "name = \"echo\"");
    let third = BinaryWorker::start(&addr, &echo, &[]).unwrap();
    let refused = eventually(Duration::from_secs(10), || async {
        third.logs().lines().find(|l| l.contains("refused")).map(str::to_owned)
    })
    .await
    .unwrap_or_else(|| panic!("the third worker is not refused:\n{}", third.logs()));
    assert!(refused.contains("tool echo") && refused.contains("local:builtin"), "{refused}");

    // The refused worker keeps trying: once the first is gone, its definition is the one.
    drop(first);
    let description = || async {
        let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
        let (tools, _) = toolmesh::client::list_all(&mut client).await.unwrap();
        tools.into_iter().find(|t| t.name == "record").map(|t| t.description)
    };
    eventually(Duration::from_secs(30), || async {
        (description().await.as_deref() == Some("records call n differently")).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the second worker did not take over:\n{}", second.logs()));
    drop(second);
    eventually(Duration::from_secs(15), || async { description().await.is_none().then_some(()) })
        .await
        .expect("the tool went with its last worker");
    // The pool is down while no worker of it is connected.
    eventually(Duration::from_secs(5), || async {
        let status = health(&addr, "toolmesh.remote.default").await;
        (status == Some(ServingStatus::NotServing)).then_some(())
    })
    .await
    .expect("the pool's health says it has no worker");
    drop(third);
}

/// Two callers choose the same `call_id` for calls in flight at once: each gets its own
/// answer, and each runs once, though the tool is idempotent and may be repeated.
#[tokio::test]
async fn two_calls_with_the_same_caller_chosen_id_each_run_once_and_answer() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let router = BinaryServer::start(&[], ROUTER_ENV).await.unwrap();
    let addr = router.addr.to_string();
    let worker =
        BinaryWorker::start(&addr, &worker_toml(dir.path(), "w1", &ledger, 1.0, ""), &[]).unwrap();
    worker.joined(1).await.unwrap();
    wait_for_tool(&addr, "record").await;
    let same_id = |n: u64| {
        let addr = addr.clone();
        async move { call_as(&addr, "record", n, "order-42", Duration::from_secs(20)).await }
    };
    let first = tokio::spawn(same_id(1));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = same_id(2).await;
    let first = first.await.unwrap();
    for (n, answer) in [(1, first), (2, second)] {
        let answer = answer.unwrap_or_else(|status| panic!("call {n}: {status:?}"));
        assert_eq!(toolmesh_e2e::text(&answer).trim(), format!("w1 {n}"), "call {n}");
    }
    let runs = executions(&ledger);
    assert_eq!(runs.get(&("record".into(), 1)).map(Vec::len), Some(1), "{runs:?}");
    assert_eq!(runs.get(&("record".into(), 2)).map(Vec::len), Some(1), "{runs:?}");
}

#[tokio::test]
async fn a_call_waits_for_a_free_slot_until_its_deadline_and_cancellation_reaches_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    // Shipped defaults: schedule-to-start of ten seconds, longer than these deadlines.
    let router = BinaryServer::start(&[], ROUTER_ENV).await.unwrap();
    let addr = router.addr.to_string();
    let (_worker, busy) = one_busy_slot(&addr, dir.path(), &ledger, 3.0, "charge", 1500).await;
    // No free slot, and the caller's deadline comes before schedule-to-start.
    let waiting = call(&addr, "charge", 2, Duration::from_millis(500)).await.unwrap_err();
    assert_eq!(waiting.code(), Code::DeadlineExceeded, "{waiting:?}");
    assert!(!executions(&ledger).contains_key(&("charge".into(), 2)), "never started");
    // The running call's deadline passes: the worker stops its process, and its slot frees.
    let status = busy.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let freed = call(&addr, "record", 3, Duration::from_millis(800)).await.unwrap_err();
    assert_eq!(freed.code(), Code::DeadlineExceeded, "{freed:?}");
    let runs = executions(&ledger);
    assert!(runs.contains_key(&("record".into(), 3)), "the slot was given back at once: {runs:?}");
    // The first call's process was stopped: it never got to finish its sleep.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let ledger = std::fs::read_to_string(&ledger).unwrap();
    assert!(!ledger.contains("charge w1 1 done"), "the cancelled call ran on:\n{ledger}");
}

#[tokio::test]
async fn schedule_to_start_gives_resource_exhausted_and_a_silent_worker_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let config = dir.path().join("router.toml");
    std::fs::write(
        &config,
        "[remote]\nschedule_to_start_ms = 300\nheartbeat_interval_ms = 200\nheartbeat_timeout_ms = 800\n",
    )
    .unwrap();
    let router =
        BinaryServer::start(&["--config", config.to_str().unwrap()], ROUTER_ENV).await.unwrap();
    let addr = router.addr.to_string();
    let (worker, busy) = one_busy_slot(&addr, dir.path(), &ledger, 2.0, "record", 10_000).await;
    let status = call(&addr, "charge", 2, Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("schedule-to-start"), "{}", status.message());

    // A frozen worker keeps its connection but sends no heartbeat: it is gone after the
    // heartbeat timeout, and its idempotent call fails over to nobody (no other worker).
    worker.signal(Signal::SIGSTOP);
    let started = std::time::Instant::now();
    let status = busy.await.unwrap().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "dropped after {:?}", started.elapsed());
    assert!(matches!(status.code(), Code::Unavailable | Code::ResourceExhausted), "{status:?}");
    assert!(router.logs().contains("no heartbeat"), "{}", router.logs());
    worker.signal(Signal::SIGCONT);
}

#[tokio::test]
async fn the_python_example_worker_serves_its_tools_through_the_router() {
    use tokio::io::AsyncBufReadExt as _;
    let router = BinaryServer::start(&[], ROUTER_ENV).await.unwrap();
    let addr = router.addr.to_string();
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../services/python-worker/example.py");
    let mut worker = toolmesh_e2e::spawn(
        tokio::process::Command::new(toolmesh_e2e::python())
            .arg(&example)
            .arg(&addr)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true),
    )
    .unwrap();
    let mut lines = tokio::io::BufReader::new(worker.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    assert!(
        matches!(&line, Ok(Ok(Some(l))) if l.contains("connected")),
        "the Python worker did not connect (tests/setup installs grpcio-tools): {line:?}"
    );
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let response = client
        .call_tool(CallToolRequest {
            name: "word_count".into(),
            arguments_json: r#"{"text": "one two three"}"#.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!response.is_error, "{response:?}");
    let structured: serde_json::Value =
        serde_json::from_str(response.structured_json.as_deref().unwrap()).unwrap();
    // An open router tells the worker of no caller.
    assert_eq!(structured, serde_json::json!({"words": 3, "caller": null}));
    // Listed as a remote tool of its pool, with the annotations it declared.
    let (tools, _) = toolmesh::client::list_all(&mut client).await.unwrap();
    let tool = tools.iter().find(|t| t.name == "word_count").unwrap();
    let source = tool.source.as_ref().unwrap();
    assert_eq!(source.kind(), toolmesh_proto::v1::SourceKind::Remote);
    assert_eq!(source.name, "python");
    assert!(source.available, "{source:?}");
    assert_eq!(tool.annotations.as_ref().unwrap().read_only, Some(true));
    // The router validates arguments before the worker sees them.
    let status = client
        .call_tool(CallToolRequest {
            name: "word_count".into(),
            arguments_json: r#"{"text": 3}"#.into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // A failure of the tool itself is a result the model reads.
    let response = client
        .call_tool(CallToolRequest {
            name: "shout".into(),
            arguments_json: serde_json::json!({"text": "x".repeat(1001)}).to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(response.is_error && toolmesh_e2e::text(&response).contains("not shouted"));
    // SIGTERM drains it; it leaves, and its tools with it.
    let pid = nix::unistd::Pid::from_raw(worker.id().unwrap() as i32);
    nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
    let status =
        tokio::time::timeout(Duration::from_secs(10), worker.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");
    eventually(Duration::from_secs(10), || async {
        (!tool_names(&addr).await.iter().any(|t| t == "word_count")).then_some(())
    })
    .await
    .expect("the tools went with the worker");
}

#[tokio::test]
async fn the_remote_bench_runs_worker_pools_and_reports_scaling() {
    // This checks that the benchmark works and reports; it asserts no speed.
    let output = tokio::process::Command::new(toolmesh_e2e::toolmesh_bench_bin())
        .args(["--remote", "--json", "--duration", "0.6", "--warmup", "0.1", "--rounds", "1"])
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let pools = report["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 3, "{report}");
    for pool in pools {
        assert_eq!(pool[1]["errors"], 0, "{report}");
        assert!(pool[1]["throughput"].as_f64().unwrap() > 0.0, "{report}");
    }
    assert!(report["scaling_4"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["remote"]["p50_ms"].as_f64().unwrap() > 0.0, "{report}");
}

#[tokio::test]
async fn the_workers_execution_span_is_a_child_of_the_routers_dispatch_span() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let (receiver, otlp) = Receiver::start().await;
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()), ROUTER_ENV[0]];
    let mut router = BinaryServer::start(&[], &env).await.unwrap();
    let addr = router.addr.to_string();
    let mut worker = BinaryWorker::start_with_env(
        &addr,
        &worker_toml(dir.path(), "w1", &ledger, 0.0, ""),
        &[],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()), ("OTEL_SERVICE_NAME", "worker-e2e")],
    )
    .unwrap();
    worker.joined(1).await.unwrap();
    wait_for_tool(&addr, "record").await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let mut request = tonic::Request::new(CallToolRequest {
        name: "record".into(),
        arguments_json: r#"{"n": 7}"#.into(),
        call_id: "traced-remote".into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01").parse().unwrap());
    client.call_tool(request).await.unwrap();
    // Stopping flushes each process's exporter: the worker first, then the router.
    worker.signal(Signal::SIGTERM);
    tokio::time::timeout(Duration::from_secs(15), worker.child.wait()).await.unwrap().unwrap();
    let spans = receiver.spans_after_stop(&mut router, "toolmesh.dispatch").await;
    let find = |name: &str, service: &str| {
        spans
            .iter()
            .find(|(s, span)| {
                span.name == name
                    && s.contains(service)
                    && hex_of(&span.trace_id) == trace_id
                    && (name == "toolmesh.dispatch"
                        || attr(span, "gen_ai.tool.call.id").as_deref() == Some("traced-remote"))
            })
            .map(|(_, span)| span.clone())
            .unwrap_or_else(|| {
                let names: Vec<_> = spans.iter().map(|(s, span)| (s, &span.name)).collect();
                panic!("no {name} span of {service} in the trace: {names:?}")
            })
    };
    let dispatch = find("toolmesh.dispatch", "toolmesh");
    let execute = find("toolmesh.remote.execute", "worker-e2e");
    assert_eq!(execute.parent_span_id, dispatch.span_id, "the worker's span is under dispatch");
    let local = find("toolmesh.worker.execute", "worker-e2e");
    assert_eq!(local.parent_span_id, execute.span_id, "the worker's pool runs it under that");
    assert_eq!(attr(&dispatch, "toolmesh.call.attempt").as_deref(), Some("1"));
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn two_routers_share_the_workers_and_accept_each_others_searches() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let mut env = vec![ROUTER_ENV[0], ("TOOLMESH__ROUTING__TOKEN_KEY", "a key both routers share")];
    // With a Qdrant server at hand, the routers share its tool index too (the test of that
    // sharing itself is in knowledge.rs); without one, each has its embedded store.
    let qdrant = std::env::var("QDRANT_URL").ok().filter(|url| !url.is_empty());
    if let Some(url) = &qdrant {
        env.extend([("TOOLMESH__VECTOR__BACKEND", "qdrant"), ("TOOLMESH__VECTOR__URL", url)]);
    }
    let first = BinaryServer::start(&[], &env).await.unwrap();
    let second = BinaryServer::start(&[], &env).await.unwrap();
    let (a, b) = (first.addr.to_string(), second.addr.to_string());
    let workers: Vec<BinaryWorker> = ["w1", "w2"]
        .iter()
        .map(|name| {
            let toml = worker_toml(dir.path(), name, &ledger, 0.0, "");
            BinaryWorker::start(&a, &toml, &["--router", &b]).unwrap()
        })
        .collect();
    for worker in &workers {
        worker.joined(2).await.unwrap();
    }
    wait_for_tool(&a, "record").await;
    wait_for_tool(&b, "record").await;

    // searchTools on the first router; callTool with its token on the second.
    let meta = |addr: String, tool: &'static str, arguments: serde_json::Value| async move {
        let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
        client
            .call_tool(CallToolRequest {
                name: tool.into(),
                arguments_json: arguments.to_string(),
                session_id: "s1".into(),
                ..Default::default()
            })
            .await
            .map(tonic::Response::into_inner)
    };
    let token = eventually(Duration::from_secs(10), || async {
        let found = meta(a.clone(), "searchTools", serde_json::json!({"query": "records call n"}))
            .await
            .unwrap();
        let result: serde_json::Value =
            serde_json::from_str(found.structured_json.as_deref()?).unwrap();
        let names: Vec<&str> =
            result["tools"].as_array()?.iter().filter_map(|t| t["name"].as_str()).collect();
        names.contains(&"record").then(|| result["searchToken"].as_str().unwrap().to_owned())
    })
    .await
    .expect("the first router's search finds the workers' tool");
    for n in 0..6u64 {
        let arguments =
            serde_json::json!({"name": "record", "arguments": {"n": n}, "searchToken": token});
        let response = meta(b.clone(), "callTool", arguments).await.unwrap();
        assert!(!response.is_error, "{response:?}");
    }
    // Calls from both routers reach both workers.
    for n in 10..16u64 {
        let addr = if n % 2 == 0 { &a } else { &b };
        call(addr, "record", n, Duration::from_secs(10)).await.unwrap();
    }
    let runs = executions(&ledger);
    let workers_used: std::collections::BTreeSet<&String> = runs.values().flatten().collect();
    assert_eq!(workers_used.len(), 2, "both workers served calls: {runs:?}");
    assert_eq!(runs.len(), 12, "every call ran once: {runs:?}");
}

/// The router's resident memory, in MiB.
fn rss_mib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
}

/// A worker that speaks the protocol itself sends 1 MiB partial outputs for a
/// `StreamCallTool` caller that never reads them. Keeping to the window the router gives,
/// it is held back after a few; ignoring it, its call is failed and stopped. The router's
/// memory stays flat either way.
#[tokio::test]
async fn partial_outputs_for_a_reader_that_stopped_are_held_back_at_the_worker() {
    use toolmesh_proto::v1::{
        self as v1, call_tool_client_message, router_message, worker_message,
        worker_service_client::WorkerServiceClient,
    };
    let router = BinaryServer::start(&[], ROUTER_ENV).await.unwrap();
    let addr = router.addr.to_string();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (to_router, outbound) = tokio::sync::mpsc::unbounded_channel();
    let send = |message| to_router.send(v1::WorkerMessage { message: Some(message) }).unwrap();
    send(worker_message::Message::Hello(v1::WorkerHello {
        worker_id: "flooder".into(),
        pool: String::new(),
        capacity: 1,
        tools: vec![v1::Tool {
            name: "flood".into(),
            description: "sends partial outputs".into(),
            input_schema_json: r#"{"type":"object"}"#.into(),
            ..Default::default()
        }],
    }));
    let mut inbound = WorkerServiceClient::new(channel)
        .connect(tokio_stream::wrappers::UnboundedReceiverStream::new(outbound))
        .await
        .unwrap()
        .into_inner();
    let mut next = async || -> Option<router_message::Message> {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(4), inbound.message()).await;
            match message.ok()?.unwrap()?.message? {
                router_message::Message::Heartbeat(_) => {
                    send(worker_message::Message::Heartbeat(v1::Heartbeat {}))
                }
                message => return Some(message),
            }
        }
    };
    let Some(router_message::Message::Welcome(welcome)) = next().await else {
        panic!("no welcome")
    };
    assert_eq!(welcome.max_message_bytes, 4 << 20, "the shipped server.max_message_bytes");
    wait_for_tool(&addr, "flood").await;

    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let (caller, requests) = tokio::sync::mpsc::channel(1);
    let start = CallToolRequest { name: "flood".into(), ..Default::default() };
    let start = call_tool_client_message::Message::Start(start);
    caller.send(v1::CallToolClientMessage { message: Some(start) }).await.unwrap();
    // Never read from here on.
    let _unread = client
        .stream_call_tool(tokio_stream::wrappers::ReceiverStream::new(requests))
        .await
        .unwrap();
    let Some(router_message::Message::Call(call)) = next().await else { panic!("no call") };
    assert!(call.partial_window > 0, "the router gives a window: {call:?}");
    let before = rss_mib(router.pid());
    let partial = |call_id: &str| {
        worker_message::Message::Event(v1::WorkerCallEvent {
            call_id: call_id.to_owned(),
            event: Some(v1::worker_call_event::Event::Partial(v1::ContentPart {
                part: Some(v1::content_part::Part::Text("x".repeat(1 << 20))),
            })),
        })
    };

    // Within the window: it sends while it has credit, for four seconds.
    let (mut credit, mut sent) = (call.partial_window, 0);
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    while sent < 300 && tokio::time::Instant::now() < until {
        if credit > 0 {
            send(partial(&call.call_id));
            (credit, sent) = (credit - 1, sent + 1);
            continue;
        }
        match next().await {
            Some(router_message::Message::Credit(more)) => {
                assert_eq!(more.call_id, call.call_id);
                credit += more.partials;
            }
            Some(other) => panic!("unexpected {other:?}"),
            None => {}
        }
    }
    assert!(sent < 64, "held back after a few partials, not {sent} of 300");
    let held = rss_mib(router.pid());
    assert!(held < before + 128, "the router grew from {before} MiB to {held} MiB");

    // Beyond it: the call is failed and stopped on the worker.
    for _ in 0..3 * call.partial_window {
        send(partial(&call.call_id));
    }
    let stopped = loop {
        match next().await {
            Some(router_message::Message::Cancel(cancel)) => break cancel,
            Some(router_message::Message::Credit(_)) => {}
            other => panic!("expected the call to be stopped, got {other:?}"),
        }
    };
    assert_eq!(stopped.call_id, call.call_id);
    assert!(stopped.reason.contains("window"), "{}", stopped.reason);
    let after = rss_mib(router.pid());
    assert!(after < before + 128, "the router grew from {before} MiB to {after} MiB");
}

/// A result larger than the router reads fails its own call; the other call in flight on
/// the same worker is answered, and the worker stays.
#[tokio::test]
async fn an_oversized_worker_result_fails_only_its_own_call() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let router = BinaryServer::start(&[], ROUTER_ENV).await.unwrap();
    let addr = router.addr.to_string();
    let big = write_script(dir.path(), "big.sh", "head -c 5000000 /dev/zero | tr '\\0' a");
    let toml = format!(
        "{}[[tools.command]]\nname = \"big\"\ndescription = \"prints 5 MB\"\ncommand = \"{}\"\nmax_output_bytes = 6000000\n",
        worker_toml(dir.path(), "w1", &ledger, 1.5, ""),
        big.display()
    );
    let worker = BinaryWorker::start(&addr, &toml, &[]).unwrap();
    worker.joined(1).await.unwrap();
    wait_for_tool(&addr, "big").await;
    let other = tokio::spawn({
        let addr = addr.clone();
        async move { call(&addr, "charge", 1, Duration::from_secs(20)).await }
    });
    eventually(Duration::from_secs(5), || async {
        (!executions(&ledger).is_empty()).then_some(())
    })
    .await
    .expect("the other call started");
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let refused = client
        .call_tool(CallToolRequest { name: "big".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("max_message_bytes"), "{}", refused.message());
    let answered = other.await.unwrap().expect("the other call is answered");
    assert_eq!(toolmesh_e2e::text(&answered).trim(), "w1 1");
    assert_eq!(executions(&ledger)[&("charge".into(), 1)], ["w1"], "it ran once");
    assert!(call(&addr, "record", 2, Duration::from_secs(20)).await.is_ok(), "the worker stayed");
}

/// A worker that speaks the protocol itself, announcing `tools`: its session, or why the
/// router refused it.
async fn raw_worker(
    addr: &str,
    id: &str,
    tools: Vec<toolmesh_proto::v1::Tool>,
) -> Result<
    (
        tokio::sync::mpsc::UnboundedSender<toolmesh_proto::v1::WorkerMessage>,
        tonic::Streaming<toolmesh_proto::v1::RouterMessage>,
    ),
    tonic::Status,
> {
    use toolmesh_proto::v1::{
        self as v1, worker_message, worker_service_client::WorkerServiceClient,
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (to_router, outbound) = tokio::sync::mpsc::unbounded_channel();
    let hello = v1::WorkerHello { worker_id: id.into(), pool: String::new(), capacity: 1, tools };
    to_router
        .send(v1::WorkerMessage { message: Some(worker_message::Message::Hello(hello)) })
        .unwrap();
    let mut inbound = WorkerServiceClient::new(channel)
        .connect(tokio_stream::wrappers::UnboundedReceiverStream::new(outbound))
        .await?
        .into_inner();
    // The welcome, or the refusal.
    inbound.message().await?.ok_or_else(|| tonic::Status::unknown("no welcome"))?;
    Ok((to_router, inbound))
}

/// A tool whose input schema carries `bytes` of description.
fn heavy_tool(name: &str, bytes: usize) -> toolmesh_proto::v1::Tool {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"sku": {"type": "string", "description": "s".repeat(bytes)}}
    });
    toolmesh_proto::v1::Tool {
        name: name.into(),
        description: "Looks up an inventory item by its SKU.".into(),
        input_schema_json: schema.to_string(),
        ..Default::default()
    }
}

/// A definition is bounded (256 KiB): a worker announcing a 3.7 MB schema is refused,
/// naming the tool and the bound. Definitions within it are listed and searched in answers
/// bounded by bytes as well as by count, so that no client on gRPC's default 4 MiB limit
/// fails discovery.
#[tokio::test]
async fn tool_definitions_and_discovery_answers_are_bounded_in_bytes() {
    use toolmesh_proto::v1::{ListToolsRequest, SearchToolsRequest};
    let router = BinaryServer::start(&[], ROUTER_ENV).await.unwrap();
    let addr = router.addr.to_string();
    let refused = raw_worker(&addr, "huge", vec![heavy_tool("huge_lookup", 3_700_000)])
        .await
        .expect_err("a 3.7 MB definition is refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("huge_lookup") && refused.message().contains("262144"),
        "{}",
        refused.message()
    );
    // Three workers with six tools of 200 KB each: 3.6 MB of definitions.
    let mut sessions = Vec::new();
    for w in 0..3 {
        let tools = (0..6).map(|t| heavy_tool(&format!("inventory_{w}_{t}"), 200_000)).collect();
        sessions.push(raw_worker(&addr, &format!("w{w}"), tools).await.unwrap());
    }
    wait_for_tool(&addr, "inventory_2_5").await;
    let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
    let (mut pages, mut listed, mut token) = (0, 0, String::new());
    loop {
        let request = ListToolsRequest { page_token: token.clone(), ..Default::default() };
        let page = client.list_tools(request).await.unwrap().into_inner();
        assert!(prost::Message::encoded_len(&page) <= 2 << 20, "page {pages} too large");
        listed += page.tools.iter().filter(|t| t.name.starts_with("inventory_")).count();
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(listed, 18, "every tool is listed, over {pages} pages");
    assert!(pages >= 2, "the definitions do not fit in one page");
    let search = || SearchToolsRequest {
        query: "inventory item SKU".into(),
        top_k: 18,
        ..Default::default()
    };
    let found = eventually(Duration::from_secs(20), || {
        let mut client = client.clone();
        async move {
            let found = client.search_tools(search()).await.unwrap().into_inner();
            (found.hits.len() + found.hits_cut as usize == 18).then_some(found)
        }
    })
    .await
    .expect("the tools are indexed");
    assert!(found.hits_cut > 0 && !found.hits.is_empty(), "cut by bytes: {}", found.hits_cut);
    assert!(prost::Message::encoded_len(&found) <= 2 << 20);
    let meta = client
        .call_tool(CallToolRequest {
            name: "searchTools".into(),
            arguments_json: r#"{"query": "inventory item SKU", "topK": 18}"#.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(prost::Message::encoded_len(&meta) <= 4 << 20, "searchTools stays readable");
    assert!(toolmesh_e2e::text(&meta).contains("toolsLeftOut"), "the cut is said");
    drop(sessions);
}

/// A worker's liveness does not hang on its routers: without a router it is not ready
/// (the overall health NOT_SERVING) but alive (`liveness` SERVING), so that a router
/// outage restarts no worker; with one it is ready.
#[tokio::test]
async fn a_worker_stays_alive_while_its_router_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let router = BinaryServer::start(&[], ROUTER_ENV).await.unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let health_addr = format!("127.0.0.1:{port}");
    let toml = worker_toml(dir.path(), "w1", &ledger, 0.0, "");
    let worker =
        BinaryWorker::start(&router.addr.to_string(), &toml, &["--health-listen", &health_addr])
            .unwrap();
    worker.joined(1).await.unwrap();
    let status = |service: &'static str| {
        let addr = health_addr.clone();
        async move { health(&addr, service).await }
    };
    eventually(Duration::from_secs(10), || async {
        (status("").await == Some(ServingStatus::Serving)).then_some(())
    })
    .await
    .expect("the worker is ready while it has a router");
    assert_eq!(status("liveness").await, Some(ServingStatus::Serving));

    drop(router);
    eventually(Duration::from_secs(20), || async {
        (status("").await == Some(ServingStatus::NotServing)).then_some(())
    })
    .await
    .expect("the worker is not ready without a router");
    assert_eq!(status("liveness").await, Some(ServingStatus::Serving), "alive all the same");
}
