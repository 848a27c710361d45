"""The toolmesh client: list, search and call tools; ingest knowledge."""

import json
import queue
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Union

import grpc

from ._channel import bearer, channel
from .v1 import knowledge_pb2, knowledge_pb2_grpc, tools_pb2, tools_pb2_grpc

JsonObject = Dict[str, Any]

_SOURCE_KINDS = {
    None: tools_pb2.SOURCE_KIND_UNSPECIFIED,
    "local": tools_pb2.SOURCE_KIND_LOCAL,
    "remote": tools_pb2.SOURCE_KIND_REMOTE,
    "mcp": tools_pb2.SOURCE_KIND_MCP,
    "knowledge": tools_pb2.SOURCE_KIND_KNOWLEDGE,
}
_FORMATS = {"text": knowledge_pb2.DOCUMENT_FORMAT_TEXT,
            "markdown": knowledge_pb2.DOCUMENT_FORMAT_MARKDOWN}


class ToolmeshError(Exception):
    """toolmesh refused or could not finish a request.

    ``code`` is the gRPC status (``grpc.StatusCode.NOT_FOUND`` for a tool the caller may not
    see, ``INVALID_ARGUMENT`` for arguments that fail the schema, ``PERMISSION_DENIED`` for a
    refused approval, ...); ``message`` says why. A tool's own failure is not an error: it is
    a ``CallResult`` with ``is_error``."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def of(cls, error: grpc.RpcError) -> "ToolmeshError":
        return cls(error.code(), error.details() or "")


@dataclass
class CallResult:
    """What a tool answered."""

    call_id: str
    is_error: bool
    # The output parts in order (``toolmesh.v1.ContentPart``: text, json, media,
    # resource_link, resource).
    content: List[tools_pb2.ContentPart] = field(default_factory=list)
    # The structured result, parsed; None when the tool produced none.
    structured: Any = None

    @property
    def text(self) -> str:
        """The text parts, joined by newlines."""
        return "\n".join(part.text for part in self.content if part.WhichOneof("part") == "text")

    @classmethod
    def of(cls, response: tools_pb2.CallToolResponse) -> "CallResult":
        structured = (json.loads(response.structured_json)
                      if response.HasField("structured_json") else None)
        return cls(call_id=response.call_id, is_error=response.is_error,
                   content=list(response.content), structured=structured)


# What an approval handler returns: approve or not, or that and a note for the audit log.
Approval = Union[bool, "tuple[bool, str]"]


class Client:
    """A connection to one toolmesh router (or a load balancer in front of several).

    Credentials come from the arguments or, as for the ``toolmesh`` CLI, the environment:
    ``TOOLMESH_SERVER`` (default ``127.0.0.1:50051``), ``TOOLMESH_TOKEN`` (an API key or
    JWT), ``TOOLMESH_CA_CERT`` (TLS), ``TOOLMESH_CLIENT_CERT`` and ``TOOLMESH_CLIENT_KEY``
    (mutual TLS).

        with Client() as toolmesh:
            for tool in toolmesh.list_tools():
                print(tool.name)
            print(toolmesh.call("echo", {"hello": "world"}).structured)

    Every method takes ``timeout`` in seconds (default: the client's, 30 s) and raises
    ``ToolmeshError`` when toolmesh refuses the request. The client is safe to share between
    threads."""

    def __init__(self, target: Optional[str] = None, *, token: Optional[str] = None,
                 ca_cert: Optional[str] = None, client_cert: Optional[str] = None,
                 client_key: Optional[str] = None, timeout: float = 30.0,
                 session_id: Optional[str] = None, profile: str = ""):
        """``session_id`` names the agent session of this client's searches and calls
        (searchTools tokens are bound to it; default: one made up for the client);
        ``profile`` is the routing profile of the meta-tools (default: the router's)."""
        self._channel = channel(target, ca_cert=ca_cert, client_cert=client_cert,
                                client_key=client_key)
        self._metadata = bearer(token)
        self._tools = tools_pb2_grpc.ToolServiceStub(self._channel)
        self._knowledge = knowledge_pb2_grpc.KnowledgeServiceStub(self._channel)
        self.timeout = timeout
        self.session_id = session_id or f"py-{uuid.uuid4()}"
        self.profile = profile

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def _unary(self, method, request, timeout):
        try:
            return method(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise ToolmeshError.of(error) from None

    # Tools.

    def list_tools(self, *, toolkit: str = "", tags: Sequence[str] = (),
                   source_kind: Optional[str] = None, source_name: str = "",
                   profile: Optional[str] = None,
                   timeout: Optional[float] = None) -> List[tools_pb2.Tool]:
        """Every tool the caller may see (all pages), by name. ``source_kind`` is ``local``,
        ``remote``, ``mcp`` or ``knowledge``; ``profile`` lists what an agent of that routing
        profile sees (its exposed tools and the meta-tools searchTools and callTool)."""
        tools, token = [], ""
        while True:
            page = self._unary(self._tools.ListTools, tools_pb2.ListToolsRequest(
                toolkit=toolkit, tags=list(tags), source_kind=_SOURCE_KINDS[source_kind],
                source_name=source_name, page_size=1000, page_token=token,
                profile=self.profile if profile is None else profile), timeout)
            tools.extend(page.tools)
            token = page.next_page_token
            if not token:
                return tools

    def search_tools(self, query: str, *, top_k: int = 5, toolkit: str = "",
                     tags: Sequence[str] = (), source_kind: Optional[str] = None,
                     source_name: str = "", profile: Optional[str] = None,
                     timeout: Optional[float] = None) -> List[tools_pb2.SearchHit]:
        """The tools that best match ``query`` (natural language), best first, each with its
        full definition (``hit.tool``) and score (``hit.score``)."""
        response = self._unary(self._tools.SearchTools, tools_pb2.SearchToolsRequest(
            query=query, top_k=top_k, toolkit=toolkit, tags=list(tags),
            source_kind=_SOURCE_KINDS[source_kind], source_name=source_name,
            session_id=self.session_id,
            profile=self.profile if profile is None else profile), timeout)
        return list(response.hits)

    def call(self, name: str, arguments: Optional[JsonObject] = None, *,
             call_id: str = "", timeout: Optional[float] = None) -> CallResult:
        """Calls ``name`` with ``arguments`` and returns its result. A call that needs a
        person's approval, or asks a question, needs ``stream_call``."""
        response = self._unary(self._tools.CallTool, self._request(name, arguments, call_id),
                               timeout)
        return CallResult.of(response)

    def stream_call(
        self, name: str, arguments: Optional[JsonObject] = None, *,
        on_progress: Optional[Callable[[tools_pb2.Progress], None]] = None,
        on_partial: Optional[Callable[[tools_pb2.ContentPart], None]] = None,
        on_log: Optional[Callable[[tools_pb2.LogMessage], None]] = None,
        on_approval: Optional[Callable[[tools_pb2.ApprovalRequest], Approval]] = None,
        on_elicitation: Optional[Callable[[tools_pb2.ElicitationRequest],
                                          Optional[JsonObject]]] = None,
        on_sampling: Optional[Callable[[tools_pb2.SamplingRequest], JsonObject]] = None,
        on_started: Optional[Callable[[str], None]] = None,
        call_id: str = "", timeout: Optional[float] = None,
    ) -> CallResult:
        """Calls ``name`` and reports what happens while it runs, then returns its result.

        The handlers run on the calling thread, in the order toolmesh sends:

        - ``on_progress(progress)``, ``on_partial(part)``, ``on_log(message)``: reports.
        - ``on_approval(request)``: a policy rule asks a person to approve the call (the tool,
          its arguments, the rule and why); return True or False, or ``(bool, note)``.
          Without a handler the call is not approved.
        - ``on_elicitation(request)``: the tool asks the person a question
          (``request.message``, the answer's schema in ``request.requested_schema_json``);
          return the answer (a dict) to accept, or None to decline. Without a handler every
          question is declined.
        - ``on_sampling(request)``: an MCP server asks the caller's model for a completion
          (``request.params_json``); return MCP's CreateMessageResult as a dict, or raise to
          refuse. Without a handler the server is told the caller does not sample.
        - ``on_started(call_id)``: the call is running.

        A handler that raises ends the call: toolmesh cancels it, and the exception
        propagates."""
        outbound: "queue.Queue[Optional[tools_pb2.CallToolClientMessage]]" = queue.Queue()
        request = self._request(name, arguments, call_id)
        request.sampling = on_sampling is not None
        outbound.put(tools_pb2.CallToolClientMessage(start=request))

        def messages() -> Iterator[tools_pb2.CallToolClientMessage]:
            while True:
                message = outbound.get()
                if message is None:
                    return
                yield message

        stream = self._tools.StreamCallTool(messages(), timeout=timeout or self.timeout,
                                            metadata=self._metadata)
        try:
            for message in stream:
                kind = message.WhichOneof("message")
                if kind == "result":
                    return CallResult.of(message.result)
                answer = self._handle(kind, getattr(message, kind), on_progress, on_partial,
                                      on_log, on_approval, on_elicitation, on_sampling,
                                      on_started)
                if answer is not None:
                    outbound.put(answer)
            raise ToolmeshError(grpc.StatusCode.UNKNOWN, "the stream ended without a result")
        except grpc.RpcError as error:
            raise ToolmeshError.of(error) from None
        except BaseException:
            stream.cancel()
            raise
        finally:
            outbound.put(None)

    @staticmethod
    def _handle(kind, message, on_progress, on_partial, on_log, on_approval, on_elicitation,
                on_sampling, on_started) -> Optional[tools_pb2.CallToolClientMessage]:
        if kind == "started":
            if on_started:
                on_started(message.call_id)
        elif kind == "progress":
            if on_progress:
                on_progress(message)
        elif kind == "partial":
            if on_partial:
                on_partial(message)
        elif kind == "log":
            if on_log:
                on_log(message)
        elif kind == "approval":
            verdict = on_approval(message) if on_approval else (
                False, "the client has no approval handler")
            approved, note = verdict if isinstance(verdict, tuple) else (verdict, "")
            return tools_pb2.CallToolClientMessage(approval_answer=tools_pb2.ApprovalAnswer(
                approval_id=message.approval_id, approved=bool(approved), note=note))
        elif kind == "elicitation":
            content = on_elicitation(message) if on_elicitation else None
            answer = tools_pb2.ElicitationAnswer(elicitation_id=message.elicitation_id)
            if content is None:
                answer.action = tools_pb2.ELICITATION_ACTION_DECLINE
            else:
                answer.action = tools_pb2.ELICITATION_ACTION_ACCEPT
                answer.content_json = json.dumps(content)
            return tools_pb2.CallToolClientMessage(elicitation_answer=answer)
        elif kind == "sampling":
            answer = tools_pb2.SamplingAnswer(sampling_id=message.sampling_id)
            try:
                answer.result_json = json.dumps(on_sampling(message))
            except Exception as error:  # noqa: BLE001 - the server is told why
                answer.error = f"{type(error).__name__}: {error}"
            return tools_pb2.CallToolClientMessage(sampling_answer=answer)
        return None

    def _request(self, name: str, arguments: Optional[JsonObject],
                 call_id: str) -> tools_pb2.CallToolRequest:
        return tools_pb2.CallToolRequest(
            name=name, arguments_json=json.dumps(arguments or {}), call_id=call_id,
            session_id=self.session_id, profile=self.profile)

    # Resources and prompts of the MCP servers.

    def read_resource(self, uri: str, *, server: str = "",
                      timeout: Optional[float] = None) -> tools_pb2.ReadResourceResponse:
        """Reads a resource, for example one a tool's ``resource_link`` named."""
        return self._unary(self._tools.ReadResource,
                           tools_pb2.ReadResourceRequest(uri=uri, server=server), timeout)

    def get_prompt(self, name: str, arguments: Optional[Dict[str, str]] = None, *,
                   timeout: Optional[float] = None) -> tools_pb2.GetPromptResponse:
        """A prompt of an MCP server with its arguments filled in."""
        return self._unary(self._tools.GetPrompt,
                           tools_pb2.GetPromptRequest(name=name, arguments=arguments or {}),
                           timeout)

    # Knowledge.

    def ingest(self, collection: str, documents: Iterable[Union[JsonObject,
                                                                knowledge_pb2.Document]], *,
               batch_size: int = 32,
               timeout: Optional[float] = None) -> knowledge_pb2.IngestResponse:
        """Ingests documents into ``collection``, replacing those of the same id. A document
        is a ``toolmesh.v1.Document`` or a dict: ``id``, ``text``, optional ``format``
        (``text`` or ``markdown``) and ``metadata`` (a dict). Documents go in batches of
        ``batch_size``; the answer counts what went in and lists the failures with why.
        Default ``timeout``: none (ingesting takes as long as embedding takes)."""

        # gRPC reads the batches on its own thread and reports a failure there as UNKNOWN:
        # a bad document is raised here instead, as what it is.
        failed: List[BaseException] = []

        def batches() -> Iterator[knowledge_pb2.IngestRequest]:
            batch: List[knowledge_pb2.Document] = []
            first = True
            for document in documents:
                try:
                    batch.append(_document(document))
                except BaseException as error:
                    failed.append(error)
                    raise
                if len(batch) == batch_size:
                    yield knowledge_pb2.IngestRequest(collection=collection, documents=batch)
                    batch, first = [], False
            if batch or first:
                yield knowledge_pb2.IngestRequest(collection=collection, documents=batch)

        try:
            return self._knowledge.Ingest(batches(), timeout=timeout,
                                          metadata=self._metadata)
        except grpc.RpcError as error:
            if failed:
                raise failed[0] from None
            raise ToolmeshError.of(error) from None

    def delete_documents(self, collection: str, ids: Sequence[str], *,
                         timeout: Optional[float] = None) -> knowledge_pb2.DeleteResponse:
        """Deletes documents by id, with all their chunks."""
        return self._unary(self._knowledge.Delete, knowledge_pb2.DeleteRequest(
            collection=collection, document_ids=list(ids)), timeout)

    def collections(self, *, timeout: Optional[float] = None) -> List[knowledge_pb2.CollectionInfo]:
        """The knowledge collections, with their document and chunk counts."""
        return list(self._unary(self._knowledge.ListCollections,
                                knowledge_pb2.ListCollectionsRequest(), timeout).collections)


def _document(document: Union[JsonObject, knowledge_pb2.Document]) -> knowledge_pb2.Document:
    if isinstance(document, knowledge_pb2.Document):
        return document
    unknown = set(document) - {"id", "text", "format", "metadata"}
    if unknown:
        raise ValueError(f"a document has id, text, format and metadata, not {sorted(unknown)}")
    fmt = document.get("format", "text")
    if fmt not in _FORMATS:
        raise ValueError(f"a document's format is text or markdown, not {fmt!r}")
    return knowledge_pb2.Document(
        id=document["id"], text=document["text"], format=_FORMATS[fmt],
        metadata_json=json.dumps(document["metadata"]) if "metadata" in document else "")
