"""A toolmesh worker in Python: serve tools written in Python to toolmesh routers.

A worker connects *out* to a router over ``toolmesh.v1.WorkerService/Connect``, announces
its tools (full definitions) and how many calls it runs at once, then takes calls on the
same stream. Heartbeats go both ways. On SIGTERM (``Worker.drain``) it tells the router,
which sends it nothing new once it acknowledges, finishes its calls, and leaves.

    from toolmesh_worker import Worker

    worker = Worker(pool="text", capacity=4)

    @worker.tool(
        description="Counts the words of a text.",
        parameters={"type": "object", "required": ["text"],
                    "properties": {"text": {"type": "string"}}},
        read_only=True,
    )
    def word_count(arguments, call):
        return {"words": len(arguments["text"].split())}

    worker.run("127.0.0.1:50051")

A tool function gets the arguments (a dict, already valid against its schema) and a
``Call`` (id, deadline, a ``cancelled`` event, ``progress(...)``); it returns a dict (the
structured result, also sent as JSON text), a string (text), or raises ``ToolError`` for a
failure the model should see (``is_error``). Any other exception is reported as INTERNAL.

The gRPC stubs are generated from ``proto/`` with grpcio-tools when the package is
imported (see ``stubs.py``); a packaged worker would generate them at build time instead.
"""

from .worker import Call, ToolError, Worker

__all__ = ["Call", "ToolError", "Worker"]
