//! The `toolmesh` command line: serve, tools list, call, config check and defaults,
//! signals, reflection clients (grpcurl, grpcio).

use nix::sys::signal::Signal;
use serde_json::json;
use std::{path::Path, time::Duration};
use toolmesh_e2e::cli::{bench, grpcurl, run, stderr, stdout, tool_names};
use toolmesh_e2e::{BinaryServer, eventually, py_server, python, toolmesh_bin, write_script};
use toolmesh_proto::v1::CallToolRequest;

#[tokio::test]
async fn cli_lists_and_calls_the_embedded_default() {
    let server = BinaryServer::start(&[], &[]).await.unwrap();
    let addr = server.addr.to_string();

    let list = run(&["tools", "list", "--server", &addr]).await;
    assert!(list.status.success(), "{}", stderr(&list));
    let out = stdout(&list);
    for expected in
        ["think", "analyze", "echo", "reasoning", "searchTools", "callTool", "5 tools, 1 toolkits"]
    {
        assert!(out.contains(expected), "{expected} missing from:\n{out}");
    }

    // Into a pipe whose reader has gone (`toolmesh tools list | head -0`): it ends quietly.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let closed = std::process::Command::new(toolmesh_bin())
        .args(["tools", "list", "--server", &addr])
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(closed.status.code(), Some(0), "{}", stderr(&closed));
    assert!(!stderr(&closed).contains("panicked"), "{}", stderr(&closed));

    let echo = run(&["call", "echo", r#"{"x": 1}"#, "--server", &addr]).await;
    assert!(echo.status.success(), "{}", stderr(&echo));
    let value: serde_json::Value = serde_json::from_str(&stdout(&echo)).unwrap();
    assert_eq!(value, json!({"x": 1}));

    let invalid = run(&["call", "think", "{}", "--server", &addr]).await;
    assert_eq!(invalid.status.code(), Some(2));
    assert!(
        stderr(&invalid).contains("InvalidArgument") && stderr(&invalid).contains("thought"),
        "{}",
        stderr(&invalid)
    );

    let missing = run(&["call", "nope", "--server", &addr]).await;
    assert_eq!(missing.status.code(), Some(2));
    assert!(stderr(&missing).contains("NotFound"), "{}", stderr(&missing));

    for args in
        [&["--help"][..], &["serve", "--help"], &["call", "--help"], &["tools", "list", "--help"]]
    {
        let help = run(args).await;
        assert!(help.status.success() && stdout(&help).contains("Usage"), "{args:?}");
    }
    let help = bench(&["--help"]).await;
    assert!(help.status.success() && stdout(&help).contains("--search"), "toolmesh-bench --help");
}

#[tokio::test]
async fn a_bad_config_exits_with_one_line_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[workers]\nsize = 0\n").unwrap();
    let output = run(&["serve", "--config", bad.to_str().unwrap()]).await;
    assert!(!output.status.success());
    let err = stderr(&output);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("bad.toml") && err.contains("workers.size"), "{err}");

    std::fs::write(&bad, "[[tools.command]]\nname = \"x\"\ndescription = \"d\"\ncommand = \"/bin/true\"\ntimeout = 5\n").unwrap();
    let output = run(&["config", "check", bad.to_str().unwrap()]).await;
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("tools.command[0]") && stderr(&output).contains("timeout"),
        "{}",
        stderr(&output)
    );

    let defaults = run(&["config", "defaults"]).await;
    assert!(stdout(&defaults).contains("[server]"));
    // Into a pipe whose reader has gone (`toolmesh config defaults | head -0`): it ends
    // quietly, without a panic.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let closed = std::process::Command::new(toolmesh_bin())
        .args(["config", "defaults"])
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(closed.status.code(), Some(0), "{}", stderr(&closed));
    assert!(!stderr(&closed).contains("panicked"), "{}", stderr(&closed));
    // The shipped example passes as shipped; the secret it reads is named when it is not
    // set where the file is checked.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/toolmesh.toml");
    let check = |token: Option<&str>| {
        let mut command = tokio::process::Command::new(toolmesh_bin());
        command.args(["config", "check", example.to_str().unwrap()]);
        command.env_remove("WEATHER_API_TOKEN");
        if let Some(token) = token {
            command.env("WEATHER_API_TOKEN", token);
        }
        command.output()
    };
    let output = check(None).await.unwrap();
    assert!(output.status.success(), "the example config is valid: {}", stderr(&output));
    assert!(
        stderr(&output).contains("not set here") && stderr(&output).contains("WEATHER_API_TOKEN")
    );
    let output = check(Some("token")).await.unwrap();
    assert!(output.status.success(), "the example config is valid: {}", stderr(&output));
    assert!(!stderr(&output).contains("not set here"), "{}", stderr(&output));
}

/// Every complete TOML example of the README and `docs/` passes `toolmesh config check`
/// as it is written (a worker's file as a worker reads it); a fragment, one that names
/// files or secrets a reader provides, says so in the paragraph before it.
#[tokio::test]
async fn every_complete_toml_example_in_the_docs_passes_config_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
    files.extend(
        std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "md")),
    );
    let dir = tempfile::tempdir().unwrap();
    let example = dir.path().join("example.toml");
    let mut checked = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("```toml\n") {
            let paragraph = rest[..start].trim_end().rsplit("\n\n").next().unwrap_or_default();
            let body = &rest[start + "```toml\n".len()..];
            let end = body.find("```").expect("a closed block");
            let block = &body[..end];
            rest = &body[end + 3..];
            if paragraph.contains("(A fragment") {
                continue;
            }
            std::fs::write(&example, block).unwrap();
            let output = run(&["config", "check", example.to_str().unwrap()]).await;
            assert!(
                output.status.success(),
                "an example in {}:\n{block}\n{}",
                file.display(),
                stderr(&output)
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} examples found");
}

/// Three mistakes that used to load and then fail quietly at run time: a condition that
/// reads a field the principal does not have (it hid every tool), a log filter that reads
/// as a target (it silenced every log), and a URL placeholder that names no parameter.
#[tokio::test]
async fn config_check_refuses_what_could_never_work_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("toolmesh.toml");
    let tool = "[[tools.http]]\nname = \"weather\"\ndescription = \"d\"\n\
                url = \"https://weather.invalid/v1?q={{city}}\"\n\
                [tools.http.parameters]\ntype = \"object\"\n\
                properties = { city = { type = \"string\" } }\n";
    let policy = "[policy]\ndefault = \"deny\"\n[[policy.rules]]\nname = \"admins\"\n\
                  effect = \"allow\"\nwhen = '\"admin\" in principal.roles'\n";
    for (config, key, says) in [
        (
            format!("{tool}{}", policy.replace("principal.roles", "principal.role")),
            "policy.rules[0].when",
            "`principal.role` is not a field",
        ),
        (format!("[telemetry]\nlog = \"inof\"\n{tool}"), "telemetry.log", "`inof`"),
        (tool.replace("{{city}}", "{{citty}}"), "tools.http[0].url", "{{citty}}"),
    ] {
        std::fs::write(&file, &config).unwrap();
        let output = run(&["config", "check", file.to_str().unwrap()]).await;
        assert!(!output.status.success(), "refused: {config}");
        let err = stderr(&output);
        assert!(err.contains(key) && err.contains(says), "{key}: {err}");
    }
    std::fs::write(&file, format!("{tool}{policy}")).unwrap();
    let output = run(&["config", "check", file.to_str().unwrap()]).await;
    assert!(output.status.success(), "{}", stderr(&output));
}

#[tokio::test]
async fn sigterm_lets_calls_in_flight_finish() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let slow = write_script(
        dir.path(),
        "slow.sh",
        &format!("touch {}\nsleep 1\necho finished", marker.display()),
    );
    let config = dir.path().join("toolmesh.toml");
    std::fs::write(
        &config,
        format!("[[tools.command]]\nname = \"slow\"\ndescription = \"takes a second\"\ncommand = \"{}\"\n", slow.display()),
    )
    .unwrap();
    let mut server =
        BinaryServer::start(&["--config", config.to_str().unwrap()], &[]).await.unwrap();
    let addr = server.addr.to_string();

    let call = tokio::spawn({
        let addr = addr.clone();
        async move {
            let mut client = toolmesh::client::connect(&addr, None).await.unwrap();
            client.call_tool(CallToolRequest { name: "slow".into(), ..Default::default() }).await
        }
    });
    eventually(Duration::from_secs(10), || async { marker.exists().then_some(()) })
        .await
        .expect("the call started");
    server.signal(Signal::SIGTERM);

    let response = call.await.unwrap().expect("the call in flight completes").into_inner();
    assert!(!response.is_error);
    assert_eq!(toolmesh::client::render_part(&response.content[0].part), "finished");
    let status =
        tokio::time::timeout(Duration::from_secs(10), server.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "exit status {status:?}; logs:\n{}", server.logs());
    assert!(server.logs().contains("SIGTERM received"));
    assert!(
        toolmesh::client::connect(&addr, None).await.is_err(),
        "no longer accepting connections"
    );
}

#[tokio::test]
async fn sighup_and_file_changes_reload_tool_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmesh.toml");
    let hello = write_script(dir.path(), "hello.sh", "echo hello");
    let base = "[server]\nreload_poll_ms = 100\n";
    std::fs::write(&config, base).unwrap();
    let server = BinaryServer::start(&["--config", config.to_str().unwrap()], &[]).await.unwrap();
    let addr = server.addr.to_string();
    assert!(!tool_names(&addr).await.contains(&"hello".to_owned()));

    let with_tool = format!(
        "{base}[[tools.command]]\nname = \"hello\"\ndescription = \"greets\"\ncommand = \"{}\"\n",
        hello.display()
    );
    std::fs::write(&config, &with_tool).unwrap();
    server.signal(Signal::SIGHUP);
    eventually(Duration::from_secs(10), || async {
        tool_names(&addr).await.contains(&"hello".to_owned()).then_some(())
    })
    .await
    .expect("the tool appears after the reload");
    let hello = run(&["call", "hello", "--server", &addr]).await;
    assert_eq!(stdout(&hello).trim(), "hello");

    // Without a signal: the file is watched.
    std::fs::write(&config, format!("{base}# the tool is gone\n")).unwrap();
    eventually(Duration::from_secs(10), || async {
        (!tool_names(&addr).await.contains(&"hello".to_owned())).then_some(())
    })
    .await
    .expect("the tool disappears after the file changed");

    // A broken file keeps the previous tools and says why.
    std::fs::write(&config, &with_tool).unwrap();
    eventually(Duration::from_secs(10), || async {
        tool_names(&addr).await.contains(&"hello".to_owned()).then_some(())
    })
    .await
    .expect("reloaded again");
    std::fs::write(&config, "[server\nbroken").unwrap();
    server.signal(Signal::SIGHUP);
    eventually(Duration::from_secs(10), || async {
        server.logs().contains("reload failed").then_some(())
    })
    .await
    .expect("the failed reload is logged");
    assert!(tool_names(&addr).await.contains(&"hello".to_owned()));
    assert!(tool_names(&addr).await.contains(&"echo".to_owned()));

    // Settings other than tool definitions need a restart, and the log says so.
    std::fs::write(&config, format!("{with_tool}[workers]\nsize = 3\n")).unwrap();
    server.signal(Signal::SIGHUP);
    eventually(Duration::from_secs(10), || async {
        server.logs().contains("take effect on restart").then_some(())
    })
    .await
    .expect("the pending restart is logged");
}

#[tokio::test]
async fn grpcurl_finds_the_api_by_reflection_and_checks_health() {
    let server = BinaryServer::start(&[], &[]).await.unwrap();
    let addr = server.addr.to_string();
    let grpcurl = |args: Vec<String>| async move {
        tokio::process::Command::new(grpcurl())
            .args(&args)
            .output()
            .await
            .expect("grpcurl is installed (tests/setup installs it from PyPI)")
    };

    let list = grpcurl(vec!["-plaintext".into(), addr.clone(), "list".into()]).await;
    assert!(list.status.success(), "{}", stderr(&list));
    for service in ["toolmesh.v1.ToolService", "grpc.health.v1.Health"] {
        assert!(stdout(&list).contains(service), "{service} in:\n{}", stdout(&list));
    }

    let describe = grpcurl(vec![
        "-plaintext".into(),
        addr.clone(),
        "describe".into(),
        "toolmesh.v1.CallToolRequest".into(),
    ])
    .await;
    assert!(stdout(&describe).contains("arguments_json"), "{}", stdout(&describe));

    let call = grpcurl(vec![
        "-plaintext".into(),
        "-d".into(),
        r#"{"name": "echo", "arguments_json": "{\"via\": \"grpcurl\"}"}"#.into(),
        addr.clone(),
        "toolmesh.v1.ToolService/CallTool".into(),
    ])
    .await;
    assert!(call.status.success(), "{}", stderr(&call));
    assert!(stdout(&call).contains("grpcurl"), "{}", stdout(&call));

    for service in ["", "toolmesh.v1.ToolService"] {
        let health = grpcurl(vec![
            "-plaintext".into(),
            "-d".into(),
            format!(r#"{{"service": "{service}"}}"#),
            addr.clone(),
            "grpc.health.v1.Health/Check".into(),
        ])
        .await;
        assert!(
            stdout(&health).contains("SERVING"),
            "{service:?}: {} {}",
            stdout(&health),
            stderr(&health)
        );
    }
}

#[tokio::test]
async fn a_python_grpcio_client_lists_and_calls_tools() {
    let server = BinaryServer::start(&[], &[]).await.unwrap();
    let output = toolmesh_e2e::python_client(&server.addr.to_string(), &[]).await;
    assert!(
        output.status.success(),
        "the Python client failed (tests/setup installs grpcio and grpcio-tools):\n{}\n{}",
        stdout(&output),
        stderr(&output)
    );
    assert!(stdout(&output).contains("calls and errors as expected"));
}

#[tokio::test]
async fn tools_list_shows_the_upstream_name_of_renamed_tools() {
    let server = BinaryServer::with_config(
        &format!(
            "[[mcp.servers]]\nname = \"py\"\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"{}\"]\n",
            python(),
            py_server()
        ),
        &[],
    )
    .await
    .unwrap();
    let addr = server.addr.to_string();
    eventually(Duration::from_secs(30), || async {
        tool_names(&addr).await.iter().any(|n| n == "py_add").then_some(())
    })
    .await
    .expect("the Python server's tools are published");

    let list = run(&["tools", "list", "--server", &addr]).await;
    assert!(list.status.success(), "{}", stderr(&list));
    let out = stdout(&list);
    assert!(out.lines().next().unwrap().contains("UPSTREAM"), "{out}");
    let add = out.lines().find(|l| l.starts_with("py_add ")).expect("py_add is listed");
    assert!(add.split_whitespace().any(|w| w == "add"), "{add}");
    let long = "summarise_the_quarterly_revenue_report_for_every_region_and_product_line";
    assert!(out.lines().any(|l| l.starts_with("py_summarise") && l.contains(long)), "{out}");

    let json = run(&["tools", "list", "--server", &addr, "--json"]).await;
    let listed: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let add = listed["tools"].as_array().unwrap().iter().find(|t| t["name"] == "py_add").unwrap();
    assert_eq!(add["upstream_name"], "add");
    let echo = listed["tools"].as_array().unwrap().iter().find(|t| t["name"] == "echo").unwrap();
    assert!(echo["upstream_name"].is_null(), "a local tool is not renamed");
}
