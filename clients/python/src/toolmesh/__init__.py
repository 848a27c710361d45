"""toolmesh for Python: a client for agents, and a worker that serves Python tools.

    from toolmesh import Client

    with Client() as toolmesh:  # TOOLMESH_SERVER, TOOLMESH_TOKEN, TOOLMESH_CA_CERT, ...
        tools = toolmesh.list_tools()
        result = toolmesh.call("echo", {"hello": "world"})

A worker serves tools written in Python to toolmesh routers (``toolmesh.worker``):

    from toolmesh import Worker

    worker = Worker(pool="text", capacity=4)

    @worker.tool(description="Counts the words of a text.",
                 parameters={"type": "object", "required": ["text"],
                             "properties": {"text": {"type": "string"}}},
                 read_only=True)
    def word_count(arguments, call):
        return {"words": len(arguments["text"].split())}

    worker.run("127.0.0.1:50051")

The generated gRPC modules are ``toolmesh.v1.tools_pb2`` (and ``_grpc``), ``worker_pb2``
and ``knowledge_pb2``.
"""

from .client import CallResult, Client, ToolmeshError
from .worker import Call, ToolError, Worker

__all__ = ["Call", "CallResult", "Client", "ToolError", "ToolmeshError", "Worker"]
