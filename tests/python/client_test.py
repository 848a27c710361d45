"""Calls a running toolmesh with the Python client (clients/python), as an agent would.

Usage: python3 tests/python/client_test.py HOST:PORT
(credentials from the environment, as for the CLI: TOOLMESH_TOKEN, TOOLMESH_CA_CERT, ...)

Lists the tools, calls one, checks the error mapping, streams a call, and runs the
searchTools / callTool flow of an agent whose model sees only the meta-tools. Exits non-zero
on any failure.
"""

import json
import sys
import time

import grpc

from toolmesh import Client, ToolmeshError


def main(addr: str) -> None:
    with Client(addr, timeout=10) as toolmesh:
        tools = toolmesh.list_tools()
        names = sorted(tool.name for tool in tools)
        assert {"think", "analyze", "echo"} <= set(names), names
        think = next(t for t in tools if t.name == "think")
        assert json.loads(think.input_schema_json)["required"] == ["title", "thought"]
        assert think.toolkit == "reasoning"

        reply = toolmesh.call("echo", {"from": "python", "n": 3}, call_id="py-1")
        assert not reply.is_error
        assert reply.call_id == "py-1"
        assert reply.structured == {"from": "python", "n": 3}

        try:
            toolmesh.call("think", {})
            raise AssertionError("invalid arguments were accepted")
        except ToolmeshError as error:
            assert error.code == grpc.StatusCode.INVALID_ARGUMENT, error.code
            assert "thought" in error.message, error.message

        try:
            toolmesh.call("missing")
            raise AssertionError("an unknown tool was found")
        except ToolmeshError as error:
            assert error.code == grpc.StatusCode.NOT_FOUND, error.code

        started = []
        streamed = toolmesh.stream_call("echo", {"streamed": True}, on_started=started.append)
        assert streamed.structured == {"streamed": True}
        assert started == [streamed.call_id], (started, streamed.call_id)

        # An agent whose model sees only the meta-tools: hand their schemas to the model,
        # forward its calls.
        meta = toolmesh.list_tools(profile="default")
        assert sorted(t.name for t in meta) == ["callTool", "searchTools"], [t.name for t in meta]
        search_tools = next(t for t in meta if t.name == "searchTools")
        assert "query" in json.loads(search_tools.input_schema_json)["properties"]

        for _ in range(100):  # the index follows the catalog within moments of a start
            found = toolmesh.call("searchTools", {"query": "return my arguments unchanged"})
            if "echo" in [t["name"] for t in found.structured["tools"]]:
                break
            time.sleep(0.05)
        found = found.structured
        assert "echo" in [t["name"] for t in found["tools"]], found
        called = toolmesh.call(
            "callTool",
            {"name": "echo", "arguments": {"via": "callTool"}, "searchToken": found["searchToken"]},
        )
        assert called.structured == {"via": "callTool"}
        try:
            toolmesh.call("callTool", {"name": "echo", "arguments": {}})
            raise AssertionError("callTool without a search was accepted")
        except ToolmeshError as error:
            assert error.code == grpc.StatusCode.FAILED_PRECONDITION, error.code
            assert "searchTools" in error.message, error.message

        hits = toolmesh.search_tools("return my arguments unchanged", top_k=3)
        assert "echo" in [hit.tool.name for hit in hits], [hit.tool.name for hit in hits]

    print(f"python client: {len(names)} tools listed, calls and errors as expected")


if __name__ == "__main__":
    main(sys.argv[1])
