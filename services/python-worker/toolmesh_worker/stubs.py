"""Generates the toolmesh gRPC stubs from proto/ (grpcio-tools) and imports them."""

import importlib
import os
import pathlib
import sys
import tempfile

from grpc_tools import protoc

# The repository's proto/ directory; TOOLMESH_PROTO points elsewhere.
PROTO = pathlib.Path(os.environ.get("TOOLMESH_PROTO", pathlib.Path(__file__).resolve().parents[3] / "proto"))


def load():
    """Returns the modules (tools_pb2, worker_pb2, worker_pb2_grpc)."""
    out = pathlib.Path(tempfile.mkdtemp(prefix="toolmesh-stubs-"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    files = [str(PROTO / "toolmesh" / "v1" / f"{name}.proto") for name in ("tools", "worker")]
    code = protoc.main(["grpc_tools.protoc", f"-I{PROTO}", f"-I{include}",
                        f"--python_out={out}", f"--grpc_python_out={out}", *files])
    if code != 0:
        raise RuntimeError(f"generating the stubs from {PROTO} failed ({code})")
    for package in (out / "toolmesh", out / "toolmesh" / "v1"):
        (package / "__init__.py").touch()
    sys.path.insert(0, str(out))
    return tuple(importlib.import_module(f"toolmesh.v1.{name}")
                 for name in ("tools_pb2", "worker_pb2", "worker_pb2_grpc"))
