"""Calls a running toolmesh from Python with grpcio, the way an agent service would.

Usage: python3 tests/python/client_test.py HOST:PORT
(with `TOOLMESH_TOKEN` set, every call carries it as `authorization: Bearer`)

Generates the stubs from proto/ into a temporary directory (grpcio-tools), then lists the
tools, calls one, checks the error mapping, streams a call, and runs the searchTools /
callTool flow of an agent whose model sees only the meta-tools. Exits non-zero on any
failure.
"""

import collections
import json
import os
import pathlib
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parents[2]


def generate_stubs(out: pathlib.Path) -> None:
    proto_dir = ROOT / "proto"
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main([
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        str(proto_dir / "toolmesh" / "v1" / "tools.proto"),
    ])
    if code != 0:
        raise SystemExit(f"protoc failed with {code}")
    for package in (out / "toolmesh", out / "toolmesh" / "v1"):
        (package / "__init__.py").touch()


class _Details(collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                     "compression")), grpc.ClientCallDetails):
    pass


class Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
             grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer TOKEN` to every call (a router with `[auth]`)."""

    def __init__(self, token: str) -> None:
        self.header = ("authorization", f"Bearer {token}")

    def _details(self, details):
        metadata = list(details.metadata or []) + [self.header]
        return _Details(details.method, details.timeout, metadata, details.credentials,
                        details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


def _read(variable: str):
    path = os.environ.get(variable)
    if not path:
        return None
    with open(path, "rb") as file:
        return file.read()


def connect(addr: str) -> grpc.Channel:
    """A channel to `addr`, with the token of `TOOLMESH_TOKEN` when it is set. With
    `TOOLMESH_CA_CERT` (a router with `[tls]`) the channel is TLS, verified by that CA; with
    `TOOLMESH_CLIENT_CERT` and `TOOLMESH_CLIENT_KEY` too, it is mutual TLS."""
    ca = _read("TOOLMESH_CA_CERT")
    if ca is None:
        channel = grpc.insecure_channel(addr)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=_read("TOOLMESH_CLIENT_KEY"),
            certificate_chain=_read("TOOLMESH_CLIENT_CERT"))
        channel = grpc.secure_channel(addr, credentials)
    token = os.environ.get("TOOLMESH_TOKEN")
    return grpc.intercept_channel(channel, Bearer(token)) if token else channel


def main(addr: str) -> None:
    out = pathlib.Path(tempfile.mkdtemp(prefix="toolmesh-py-"))
    generate_stubs(out)
    sys.path.insert(0, str(out))
    from toolmesh.v1 import tools_pb2, tools_pb2_grpc  # noqa: E402

    with connect(addr) as channel:
        stub = tools_pb2_grpc.ToolServiceStub(channel)

        listing = stub.ListTools(tools_pb2.ListToolsRequest(), timeout=10)
        names = sorted(tool.name for tool in listing.tools)
        assert {"think", "analyze", "echo"} <= set(names), names
        think = next(t for t in listing.tools if t.name == "think")
        assert json.loads(think.input_schema_json)["required"] == ["title", "thought"]
        assert think.toolkit == "reasoning"

        reply = stub.CallTool(
            tools_pb2.CallToolRequest(
                name="echo", arguments_json=json.dumps({"from": "python", "n": 3}), call_id="py-1"
            ),
            timeout=10,
        )
        assert not reply.is_error
        assert reply.call_id == "py-1"
        assert json.loads(reply.structured_json) == {"from": "python", "n": 3}

        try:
            stub.CallTool(tools_pb2.CallToolRequest(name="think", arguments_json="{}"), timeout=10)
            raise AssertionError("invalid arguments were accepted")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.code()
            assert "thought" in error.details(), error.details()

        try:
            stub.CallTool(tools_pb2.CallToolRequest(name="missing"), timeout=10)
            raise AssertionError("an unknown tool was found")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND, error.code()

        start = tools_pb2.CallToolClientMessage(
            start=tools_pb2.CallToolRequest(name="echo", arguments_json='{"streamed": true}')
        )
        messages = list(stub.StreamCallTool(iter([start]), timeout=10))
        assert messages[0].WhichOneof("message") == "started"
        assert messages[-1].WhichOneof("message") == "result"
        assert json.loads(messages[-1].result.structured_json) == {"streamed": True}

        # An agent whose model sees only the meta-tools: hand their schemas to the model,
        # forward its calls.
        meta = stub.ListTools(tools_pb2.ListToolsRequest(profile="default"), timeout=10).tools
        assert sorted(t.name for t in meta) == ["callTool", "searchTools"], [t.name for t in meta]
        search_tools = next(t for t in meta if t.name == "searchTools")
        assert "query" in json.loads(search_tools.input_schema_json)["properties"]

        def meta_call(name, arguments):
            request = tools_pb2.CallToolRequest(
                name=name, arguments_json=json.dumps(arguments), session_id="py-agent",
                profile="default",
            )
            return stub.CallTool(request, timeout=10)

        for _ in range(100):  # the index follows the catalog within moments of a start
            reply = meta_call("searchTools", {"query": "return my arguments unchanged"})
            found = json.loads(reply.structured_json)
            if "echo" in [t["name"] for t in found["tools"]]:
                break
            time.sleep(0.05)
        assert "echo" in [t["name"] for t in found["tools"]], found
        called = meta_call(
            "callTool",
            {"name": "echo", "arguments": {"via": "callTool"}, "searchToken": found["searchToken"]},
        )
        assert json.loads(called.structured_json) == {"via": "callTool"}
        try:
            meta_call("callTool", {"name": "echo", "arguments": {}})
            raise AssertionError("callTool without a search was accepted")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.code()
            assert "searchTools" in error.details(), error.details()

    print(f"python client: {len(names)} tools listed, calls and errors as expected")


if __name__ == "__main__":
    main(sys.argv[1])
