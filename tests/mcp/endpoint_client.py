"""An MCP client of toolmesh's MCP endpoint, written with the Python `mcp` SDK, driven by the
end-to-end tests.

    endpoint_client.py URL REVISION PLAN

REVISION is the protocol revision to speak: `2025-11-25` (an initialize handshake and a
session) or `2026-07-28` (server/discover, no session). PLAN is a JSON list of steps, run in
order in one connection; the script prints one JSON list with each step's result:

- {"op": "list"}: every page of tools/list -> {"tools": [names], "pages": n}
- {"op": "call", "name": N, "arguments": {...}, "progress": bool}
  -> {"content": [...], "structured": ..., "is_error": bool, "progress": [[p, total], ...]}
- {"op": "call_error", "name": N, "arguments": {...}}: a call expected to fail with a
  JSON-RPC error -> {"code": c, "message": m}
- {"op": "cancel", "name": N, "arguments": {...}, "after_s": s}: starts the call and
  cancels it after s seconds -> {"cancelled": true}
- {"op": "search_call", "query": Q, "name": N, "arguments": {...}}: searchTools, then
  callTool of N with the search's token -> {"found": [names], "called": <as call>}
- {"op": "await_list_changed", "timeout_s": s}: waits for notifications/tools/list_changed
  -> {"changed": bool}
- {"op": "subscribe", "uri": U} / {"op": "unsubscribe", "uri": U}: resources/subscribe
  and resources/unsubscribe -> {}
- {"op": "await_updated", "timeout_s": s}: waits for notifications/resources/updated
  -> {"updated": [uris heard so far]}
- {"op": "sleep", "s": s}

Elicitations (asked during a call, or in an input round on 2026-07-28, which the script
answers and sends the call again; `rounds` counts them) are answered with $ELICIT_ACCEPT
(JSON content) when set, else declined.
A token in $TOOLMESH_TOKEN is sent as `Authorization: Bearer`. When the client fails, the
HTTP statuses it was answered with go to stderr (the SDK's error does not name them).
"""

import json
import os
import sys

import anyio
import httpx2
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def content_of(result):
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]


async def elicit(context, params):
    accept = os.environ.get("ELICIT_ACCEPT")
    if accept is None:
        return types.ElicitResult(action="decline")
    return types.ElicitResult(action="accept", content=json.loads(accept))


# Input rounds (2026-07-28) the last call took.
ROUNDS = [0]


async def call_answering(session, name, arguments, **options):
    """Calls `name`; an input round (2026-07-28) is answered as a question during the call
    would be (elicitations only), and the call sent again with the answers and the state."""
    ROUNDS[0] = 0
    result = await session.call_tool(name, arguments, allow_input_required=True, **options)
    while isinstance(result, types.InputRequiredResult):
        ROUNDS[0] += 1
        responses = {}
        for key, request in (result.input_requests or {}).items():
            if request.method != "elicitation/create":
                raise RuntimeError(f"cannot answer {request.method}")
            responses[key] = await elicit(None, request.params)
        result = await session.call_tool(
            name, arguments, allow_input_required=True, input_responses=responses,
            request_state=result.request_state, **options)
    return result


LIST_CHANGED = []
UPDATED = []
STATUSES = []


async def record_status(response):
    STATUSES.append(response.status_code)


async def on_message(message):
    if isinstance(message, types.ToolListChangedNotification):
        LIST_CHANGED[0].set()
    if isinstance(message, types.ResourceUpdatedNotification):
        UPDATED[1].append(str(message.params.uri))
        UPDATED[0].set()


async def run(url, revision, plan):
    LIST_CHANGED.append(anyio.Event())
    UPDATED.extend([anyio.Event(), []])
    headers = {}
    if os.environ.get("TOOLMESH_TOKEN"):
        headers["Authorization"] = "Bearer " + os.environ["TOOLMESH_TOKEN"]
    out = []
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60),
                                  event_hooks={"response": [record_status]}) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1], elicitation_callback=elicit,
                                     message_handler=on_message) as session:
                if revision == "2026-07-28":
                    found = await session.discover()
                    out.append({"op": "discover", "versions": list(found.supported_versions)})
                else:
                    init = await session.initialize()
                    out.append({"op": "initialize", "version": init.protocol_version,
                                "server": init.server_info.name})
                for step in plan:
                    out.append(await run_step(session, step))
    print(json.dumps(out))


async def run_step(session, step):
    op = step["op"]
    if op == "list":
        names, cursor, pages = [], None, 0
        while True:
            page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
            pages += 1
            names += [tool.name for tool in page.tools]
            cursor = page.next_cursor
            if not cursor:
                return {"tools": names, "pages": pages}
    if op == "call":
        progress = []

        async def on_progress(done, total, message):
            progress.append([done, total])

        result = await call_answering(
            session, step["name"], step.get("arguments", {}),
            progress_callback=on_progress if step.get("progress") else None,
        )
        return {"content": content_of(result), "structured": result.structured_content,
                "is_error": bool(result.is_error), "progress": progress,
                "rounds": ROUNDS[0]}
    if op == "call_error":
        try:
            await session.call_tool(step["name"], step.get("arguments", {}))
        except MCPError as error:
            return {"code": error.error.code, "message": error.error.message}
        return {"code": None, "message": "the call succeeded"}
    if op == "search_call":
        found = await session.call_tool("searchTools", {"query": step["query"]})
        hits = found.structured_content or json.loads(found.content[0].text)
        called = await session.call_tool("callTool", {
            "name": step["name"], "arguments": step.get("arguments", {}),
            "searchToken": hits["searchToken"]})
        return {"found": [tool["name"] for tool in hits["tools"]],
                "called": {"content": content_of(called), "structured": called.structured_content,
                           "is_error": bool(called.is_error)}}
    if op == "cancel":
        with anyio.move_on_after(step["after_s"]):
            await session.call_tool(step["name"], step.get("arguments", {}))
        return {"cancelled": True}
    if op == "await_list_changed":
        with anyio.move_on_after(step["timeout_s"]):
            await LIST_CHANGED[0].wait()
        return {"changed": LIST_CHANGED[0].is_set()}
    if op == "resources":
        listed = await session.list_resources()
        templates = await session.list_resource_templates()
        read = await session.read_resource(step["uri"])
        return {"resources": [[r.uri, r.name] for r in listed.resources],
                "templates": [t.uri_template for t in templates.resource_templates],
                "read": [getattr(c, "text", None) for c in read.contents]}
    if op == "prompt":
        listed = await session.list_prompts()
        got = await session.get_prompt(step["name"], step.get("arguments", {}))
        return {"prompts": [p.name for p in listed.prompts],
                "messages": [[m.role, m.content.text] for m in got.messages]}
    if op == "subscribe":
        await session.subscribe_resource(step["uri"])
        return {}
    if op == "unsubscribe":
        await session.unsubscribe_resource(step["uri"])
        return {}
    if op == "await_updated":
        with anyio.move_on_after(step["timeout_s"]):
            await UPDATED[0].wait()
        return {"updated": UPDATED[1]}
    if op == "sleep":
        await anyio.sleep(step["s"])
        return {}
    raise SystemExit(f"unknown step {op}")


if __name__ == "__main__":
    try:
        anyio.run(run, sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
    except BaseException:
        print(f"HTTP statuses: {STATUSES}", file=sys.stderr)
        raise
