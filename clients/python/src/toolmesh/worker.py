"""The worker: one session with a router, calls on a thread pool, heartbeats, drain."""

import json
import logging
import os
import queue
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from ._channel import bearer, channel
from .v1 import tools_pb2, worker_pb2, worker_pb2_grpc

log = logging.getLogger("toolmesh.worker")

# gRPC status code numbers a worker reports (google.rpc.Code).
INVALID_ARGUMENT, DEADLINE_EXCEEDED, CANCELLED, INTERNAL, NOT_FOUND = 3, 4, 1, 13, 5
RESOURCE_EXHAUSTED = 8


class ToolError(Exception):
    """A failure of the tool itself: the model sees the message (``is_error``)."""


class Call:
    """One call as a tool function sees it."""

    def __init__(self, call_id, deadline, send, depth=0, caller=None):
        self.id = call_id
        self.deadline = deadline
        self.depth = depth
        # Who is calling, as the router authenticated it (``name``, ``kind``, ``roles``,
        # ``attributes``; never a credential); None when the router does not authenticate.
        self.caller = caller
        self.cancelled = threading.Event()
        self._send = send

    def nesting(self):
        """The gRPC metadata to send with calls this tool makes back into toolmesh: the
        depth of those calls and this call's id. toolmesh refuses calls nested deeper than
        its ``server.max_call_depth``, so a tool that calls tools cannot recurse forever."""
        return [("x-toolmesh-call-depth", str(self.depth + 1)),
                ("x-toolmesh-parent-call-id", self.id)]

    def remaining(self):
        """Seconds left before the call's deadline."""
        return max(0.0, self.deadline - time.monotonic())

    def progress(self, progress, total=None, message=""):
        """Reports progress to the caller (``StreamCallTool`` shows it)."""
        event = worker_pb2.WorkerCallEvent(
            call_id=self.id,
            progress=tools_pb2.Progress(progress=progress, total=total, message=message),
        )
        self._send(worker_pb2.WorkerMessage(event=event))


class Worker:
    """Serves the tools registered with ``tool`` to the routers of ``run``."""

    def __init__(self, pool="default", capacity=4, worker_id=None, token=None):
        """``token`` (default: the ``TOOLMESH_TOKEN`` environment variable) is the API key or
        JWT sent as ``authorization: Bearer`` to a router that requires credentials; its
        principal needs the router's worker role (``[remote] worker_role``)."""
        self.pool = pool
        self._metadata = bearer(token)
        self.capacity = capacity
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-py"
        self._tools = {}
        self._draining = threading.Event()
        # The router's word that no call follows the drain.
        self._acknowledged = False

    def tool(self, description, parameters=None, name=None, read_only=None, idempotent=None,
             destructive=None):
        """Registers a function as a tool. ``read_only`` or ``idempotent`` lets the router
        repeat a call on another worker when this one dies mid-call."""

        def register(function):
            definition = tools_pb2.Tool(
                name=name or function.__name__,
                description=description,
                input_schema_json=json.dumps(parameters or {"type": "object"}),
                annotations=tools_pb2.ToolAnnotations(
                    read_only=read_only, idempotent=idempotent, destructive=destructive),
            )
            self._tools[definition.name] = (definition, function)
            return function

        return register

    def drain(self, *_):
        """Stops taking calls; ``run`` returns once the calls in flight are answered."""
        self._draining.set()

    def run(self, router, reconnect=True):
        """Holds a session with ``router`` (``host:port``) until drained; reconnects with
        backoff when the session breaks. SIGTERM and SIGINT drain."""
        signal.signal(signal.SIGTERM, self.drain)
        signal.signal(signal.SIGINT, self.drain)
        backoff = 0.1
        while not self._draining.is_set():
            started = time.monotonic()
            try:
                self._session(router)
                return
            except Exception as error:  # noqa: BLE001 - any failure ends the session
                if not reconnect or self._draining.is_set():
                    raise
                log.warning("session with %s ended (%s); reconnecting", router, error)
            if time.monotonic() - started > 30:
                backoff = 0.1
            self._draining.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def _session(self, router):
        outbound = queue.Queue()
        send = outbound.put
        done = object()

        def requests():
            while True:
                message = outbound.get()
                if message is done:
                    return
                yield message

        hello = worker_pb2.WorkerHello(
            worker_id=self.worker_id, pool=self.pool, capacity=self.capacity,
            tools=[definition for definition, _ in self._tools.values()])
        send(worker_pb2.WorkerMessage(hello=hello))
        calls = {}
        lock = threading.Lock()
        with channel(router) as connection, \
                ThreadPoolExecutor(max_workers=self.capacity) as pool:
            stub = worker_pb2_grpc.WorkerServiceStub(connection)
            responses = stub.Connect(requests(), metadata=self._metadata)
            first = next(responses)
            if first.WhichOneof("message") != "welcome":
                raise RuntimeError("the router did not welcome the worker")
            interval = first.welcome.heartbeat_interval_ms / 1000
            self._max_message = first.welcome.max_message_bytes
            log.info("connected to %s (%s)", router, first.welcome.router_id)
            print(f"toolmesh python worker {self.worker_id} connected", flush=True)
            stop = threading.Event()

            def beat():
                # Heartbeats every interval; the drain message as soon as it is asked for.
                next_beat = time.monotonic() + interval
                drained_sent = False
                while not stop.is_set():
                    wait = max(0.0, next_beat - time.monotonic())
                    (stop if drained_sent else self._draining).wait(wait)
                    if stop.is_set():
                        return
                    if self._draining.is_set() and not drained_sent:
                        send(worker_pb2.WorkerMessage(
                            drain=worker_pb2.WorkerDrain(reason="the worker was told to stop")))
                        drained_sent = True
                    if time.monotonic() >= next_beat:
                        send(worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()))
                        next_beat += interval

            beats = threading.Thread(target=beat, daemon=True)
            beats.start()
            self._acknowledged = False

            def finished(call_id):
                with lock:
                    calls.pop(call_id, None)
                    if self._acknowledged and not calls:
                        send(done)

            try:
                self._serve(responses, calls, lock, pool, send, finished, done)
            except grpc.RpcError:
                # A drained session may end with the router's status rather than cleanly.
                if not self._acknowledged:
                    raise
            finally:
                stop.set()
                with lock:
                    for call in calls.values():
                        call.cancelled.set()
            if not self._acknowledged:
                raise RuntimeError("the router ended the session")

    def _serve(self, responses, calls, lock, pool, send, finished, done):
        """Handles the router's messages until the session ends."""
        for message in responses:
            kind = message.WhichOneof("message")
            if kind == "call":
                call = Call(message.call.call_id,
                            time.monotonic() + message.call.timeout_ms / 1000, send,
                            depth=message.call.depth,
                            caller=message.call.caller
                            if message.call.HasField("caller") else None)
                with lock:
                    calls[call.id] = call
                future = pool.submit(self._execute, message.call, call, send)
                future.add_done_callback(lambda _, i=call.id: finished(i))
            elif kind == "cancel":
                with lock:
                    call = calls.get(message.cancel.call_id)
                if call:
                    call.cancelled.set()
            elif kind == "drain_ack":
                with lock:
                    self._acknowledged = True
                    if not calls:
                        send(done)

    def _execute(self, request, call, send):
        outcome = self._run(request, call)
        if isinstance(outcome, worker_pb2.WorkerCallError):
            result = worker_pb2.WorkerCallResult(call_id=request.call_id, error=outcome)
        else:
            result = worker_pb2.WorkerCallResult(call_id=request.call_id, response=outcome)
        message = worker_pb2.WorkerMessage(result=result)
        # A message larger than the router reads would end the session and every call on
        # it: only this call fails.
        limit = getattr(self, "_max_message", 0)
        if limit and message.ByteSize() + 5 > limit:
            error = worker_pb2.WorkerCallError(
                code=RESOURCE_EXHAUSTED,
                message=f"the result of {message.ByteSize()} bytes is larger than the router "
                        f"accepts ({limit} bytes, its server.max_message_bytes)")
            message = worker_pb2.WorkerMessage(
                result=worker_pb2.WorkerCallResult(call_id=request.call_id, error=error))
        send(message)

    def _run(self, request, call):
        entry = self._tools.get(request.tool)
        if entry is None:
            return worker_pb2.WorkerCallError(code=NOT_FOUND, message=f"no tool {request.tool}")
        try:
            arguments = json.loads(request.arguments_json or "{}")
        except ValueError as error:
            return worker_pb2.WorkerCallError(code=INVALID_ARGUMENT, message=str(error))
        try:
            value = entry[1](arguments, call)
        except ToolError as error:
            return tools_pb2.CallToolResponse(
                call_id=request.call_id, is_error=True,
                content=[tools_pb2.ContentPart(text=str(error))])
        except Exception as error:  # noqa: BLE001 - reported to the caller as INTERNAL
            log.exception("tool %s failed", request.tool)
            return worker_pb2.WorkerCallError(code=INTERNAL, message=f"{type(error).__name__}: {error}")
        if call.cancelled.is_set():
            return worker_pb2.WorkerCallError(code=CANCELLED, message="cancelled")
        if isinstance(value, str):
            return tools_pb2.CallToolResponse(
                call_id=request.call_id, content=[tools_pb2.ContentPart(text=value)])
        text = json.dumps(value)
        return tools_pb2.CallToolResponse(
            call_id=request.call_id, structured_json=text,
            content=[tools_pb2.ContentPart(json=text)])
