"""The client side of the MCP conformance suite, played by toolmesh's MCP client.

    conformance_client.py SERVER_URL

The suite (`conformance client --command "python3 conformance_client.py"`) starts a scenario
server and runs this script with its URL; $MCP_CONFORMANCE_SCENARIO names the scenario and
$MCP_CONFORMANCE_CONTEXT may say which calls to make. The script starts `toolmesh serve`
($TOOLMESH_BIN) with that server as its one MCP server (names unprefixed), waits until
toolmesh is connected to it, and then does what the scenario asks of a client through
toolmesh's own MCP endpoint with the Python SDK: so every request the scenario server sees
comes from toolmesh's MCP client, and every answer it wants (an elicitation form, a retried
input round, a header) is toolmesh's. Exits non-zero when toolmesh does not connect or a
call fails.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import anyio
import httpx2
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

SCENARIO = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
CONTEXT = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")

# The form each scenario's elicitations are accepted with. SEP-1034: the defaults scenario
# gets nothing filled in; toolmesh completes the form with the schema's defaults.
FORMS = {
    "elicitation-sep1034-client-defaults": {},
    "sep-2322-client-request-state": {"confirmed": True},
}


async def elicit(context, params):
    form = FORMS.get(SCENARIO)
    if form is None:
        return types.ElicitResult(action="decline")
    return types.ElicitResult(action="accept", content=form)


# The names of the scenario server's tools in toolmesh's catalog.
UPSTREAM = set()

SAMPLES = {"string": "conformance", "integer": 1, "number": 1.5, "boolean": True}


def sample_arguments(schema):
    """A value for each required property of `schema`, by its type."""
    properties = schema.get("properties", {})
    return {name: SAMPLES.get(properties.get(name, {}).get("type"), "conformance")
            for name in schema.get("required", [])}


async def listed_tools(session):
    tools, cursor = [], None
    while True:
        page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


async def play(session):
    """What the scenario asks of a client once connected (listing is always part of it)."""
    tools = await listed_tools(session)
    calls = CONTEXT.get("toolCalls")
    if calls is not None:
        for call in calls:
            await session.call_tool(call["name"], call.get("arguments", {}))
    elif SCENARIO == "tools_call":
        await session.call_tool("add_numbers", {"a": 5, "b": 3})
    elif SCENARIO == "elicitation-sep1034-client-defaults":
        await session.call_tool("test_client_elicitation_defaults", {})
    elif SCENARIO == "sse-retry":
        # The server closes the call's stream after a priming event; toolmesh's client
        # resumes it with a GET carrying Last-Event-ID after the retry delay.
        await session.call_tool("test_reconnection", {})
    elif SCENARIO == "sep-2322-client-request-state":
        for name in ("test_mrtr_echo_state", "test_mrtr_no_state", "test_mrtr_unrelated",
                     "test_mrtr_no_result_type"):
            await session.call_tool(name, {})
    elif SCENARIO == "json-schema-2020-12-preservation":
        focal = next(tool for tool in tools if tool.name == "json_schema_2020_12_tool")
        await session.call_tool("json_schema_echo", {"schema": focal.input_schema})
    elif SCENARIO in ("http-standard-headers", "http-invalid-tool-headers"):
        # Every tool toolmesh offers of the server's is called: one toolmesh excluded never
        # reaches it.
        for tool in tools:
            if tool.name in UPSTREAM:
                await session.call_tool(tool.name, sample_arguments(tool.input_schema))
        if SCENARIO == "http-standard-headers":
            resources = (await session.list_resources()).resources
            if resources:
                await session.read_resource(resources[0].uri)
            prompts = (await session.list_prompts()).prompts
            if prompts:
                await session.get_prompt(prompts[0].name, {})


async def through(endpoint):
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http:
        async with streamable_http_client(endpoint, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1], elicitation_callback=elicit) as session:
                await session.initialize()
                await play(session)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_connected(toolmesh, address, server, timeout_s=90):
    """Until toolmesh's health service says its MCP server is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"toolmesh exited with {server.returncode}")
        asked = subprocess.run(
            [toolmesh, "health", "--server", address, "--service", "toolmesh.mcp.conformance",
             "--timeout-ms", "1000"],
            stdin=subprocess.DEVNULL, capture_output=True)
        if asked.returncode == 0:
            return
        time.sleep(0.2)
    raise SystemExit("toolmesh did not connect to the scenario server")


def upstream_tools(toolmesh, address):
    listed = subprocess.run([toolmesh, "tools", "list", "--server", address, "--json"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True)
    return {tool["name"] for tool in json.loads(listed.stdout)["tools"]
            if "conformance" in tool["source"]}


def main(url):
    toolmesh = os.environ.get("TOOLMESH_BIN", "toolmesh")
    address = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory() as scratch:
        config = pathlib.Path(scratch, "toolmesh.toml")
        config.write_text(
            "[[mcp.servers]]\n"
            'name = "conformance"\n'
            'transport = "streamable-http"\n'
            f"url = {json.dumps(url)}\n"
            'prefix = "none"\n'
        )
        log_path = pathlib.Path(scratch, "toolmesh.log")
        failed = True
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                [toolmesh, "serve", "--config", str(config), "--listen", address,
                 "--data-dir", str(pathlib.Path(scratch, "data"))],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_connected(toolmesh, address, server)
                UPSTREAM.update(upstream_tools(toolmesh, address))
                anyio.run(through, f"http://{address}/mcp")
                failed = False
            finally:
                server.terminate()
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                if failed:
                    sys.stderr.write(log_path.read_text())


if __name__ == "__main__":
    main(sys.argv[-1])
