"""Generates the toolmesh gRPC stubs from proto/ while the package is built.

The protos are read from ``TOOLMESH_PROTO`` or from the repository this directory belongs to
(``../../proto``). The wheel requires a grpcio and a protobuf at least as new as the
grpcio-tools that generated its stubs: generated code refuses older runtimes.
"""

import os
import pathlib
import re
import shutil
import tempfile

from importlib.metadata import version

from grpc_tools import protoc
from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO = pathlib.Path(os.environ.get("TOOLMESH_PROTO", HERE.parent.parent / "proto"))
FILES = ("tools", "worker", "knowledge")


def generate(out: pathlib.Path) -> None:
    sources = [PROTO / "toolmesh" / "v1" / f"{name}.proto" for name in FILES]
    missing = [str(path) for path in sources if not path.is_file()]
    if missing:
        raise SystemExit(
            f"toolmesh: the protos are missing ({', '.join(missing)}); build the package from "
            "a toolmesh checkout (pip install ./clients/python) or set TOOLMESH_PROTO to the "
            "proto/ directory")
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main(["grpc_tools.protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={out}",
                        f"--pyi_out={out}", f"--grpc_python_out={out}", *map(str, sources)])
    if code != 0:
        raise SystemExit(f"toolmesh: generating the stubs from {PROTO} failed ({code})")


def runtime_requirements() -> list:
    """grpcio and protobuf no older than the generated code accepts."""
    with tempfile.TemporaryDirectory() as out:
        generate(pathlib.Path(out))
        text = (pathlib.Path(out) / "toolmesh" / "v1" / "tools_pb2.py").read_text()
    found = re.search(r"Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", text)
    if not found:
        raise SystemExit("toolmesh: the generated stubs do not name their protobuf version")
    major, minor, patch = found.groups()
    return [f"grpcio>={version('grpcio-tools')}",
            f"protobuf>={major}.{minor}.{patch},<{int(major) + 1}"]


class BuildWithStubs(build_py):
    """Copies the package, then writes the stubs into toolmesh/v1 of the build."""

    def run(self):
        super().run()
        with tempfile.TemporaryDirectory() as out:
            generate(pathlib.Path(out))
            target = pathlib.Path(self.build_lib) / "toolmesh" / "v1"
            target.mkdir(parents=True, exist_ok=True)
            for path in (pathlib.Path(out) / "toolmesh" / "v1").iterdir():
                shutil.copy(path, target / path.name)


setup(install_requires=runtime_requirements(), cmdclass={"build_py": BuildWithStubs})
