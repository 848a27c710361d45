"""A minimal MCP server over stdio, in plain JSON-RPC (no SDK, so it starts in tens of
milliseconds): tools/list offers `echo`; it answers initialize, ping and tools/call. It
speaks protocol 2025-06-18 only (or $MINI_PROTOCOL), as an older server would: whatever
version the client asks for, initialize answers with that one.

With $MINI_EXTRA_TOOLS = n it also offers `echo_1` .. `echo_n`, listed in pages of
$MINI_PAGE_SIZE tools (default: all at once) that `nextCursor` links; with
$MINI_STUCK_CURSOR set, the last page hands back the cursor it was asked for.

At start it also launches `sleep 600` as its own child, so that tests can check that the
server's whole process group goes away with it. With $MINI_START_DELAY (seconds) it waits
that long before it reads its first message, as a slow server starts; with $MINI_FAIL set
it exits at once, as a server that cannot start. With $MINI_ENV_TOOL set it also offers
`environment`, which answers the names of the variables of its environment. With
$MINI_EMPTY_DISCOVER set it answers `server/discover` with an empty result, as a server
that does not know the method but answers every request would. With $MINI_FORM_TOOL set it
also offers `form`, which asks the caller (elicitation/create) for a `name` and a
`greeting` whose default is "hello", and answers the content it got back, as JSON.
"""

import json
import subprocess
import os
import sys
import time

PROTOCOL = os.environ.get("MINI_PROTOCOL", "2025-06-18")

if os.environ.get("MINI_FAIL"):
    sys.exit("mini_server: told to fail")
subprocess.Popen(["sleep", "600"])
time.sleep(float(os.environ.get("MINI_START_DELAY", "0")))


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


TOOLS = [{
    "name": name,
    "description": "Echoes its text.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
} for name in ["echo"] + [f"echo_{i}" for i in range(1, int(os.environ.get("MINI_EXTRA_TOOLS", "0")) + 1)]]
if os.environ.get("MINI_ENV_TOOL"):
    TOOLS.append({
        "name": "environment",
        "description": "Names the variables of the server's environment.",
        "inputSchema": {"type": "object"},
    })
if os.environ.get("MINI_FORM_TOOL"):
    TOOLS.append({
        "name": "form",
        "description": "Asks for a name and a greeting; answers what it got.",
        "inputSchema": {"type": "object"},
    })
PAGE_SIZE = int(os.environ.get("MINI_PAGE_SIZE", "0")) or len(TOOLS)


def tools_page(params):
    cursor = (params or {}).get("cursor")
    start = int(cursor) if cursor else 0
    page = {"tools": TOOLS[start:start + PAGE_SIZE]}
    if start + PAGE_SIZE < len(TOOLS):
        page["nextCursor"] = str(start + PAGE_SIZE)
    elif cursor and os.environ.get("MINI_STUCK_CURSOR"):
        page["nextCursor"] = cursor
    return page


def ask_form():
    """Sends elicitation/create and returns the content of the answer, reading the
    client's messages until it comes."""
    send({"jsonrpc": "2.0", "id": "form-1", "method": "elicitation/create", "params": {
        "message": "Who is there?",
        "requestedSchema": {"type": "object", "properties": {
            "name": {"type": "string"},
            "greeting": {"type": "string", "default": "hello"},
        }, "required": ["name"]},
    }})
    for answer in sys.stdin:
        answer = json.loads(answer)
        if answer.get("id") == "form-1" and "method" not in answer:
            return (answer.get("result") or {}).get("content")


for line in sys.stdin:
    message = json.loads(line)
    request_id = message.get("id")
    method = message.get("method")
    if request_id is None or method is None:
        continue
    if method == "initialize":
        result = {
            "protocolVersion": PROTOCOL,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "mini", "version": "1.0.0"},
        }
    elif method == "tools/list":
        result = tools_page(message.get("params"))
    elif method == "tools/call" and message["params"].get("name") == "form":
        result = {"content": [{"type": "text", "text": json.dumps(ask_form(), sort_keys=True)}]}
    elif method == "tools/call" and message["params"].get("name") == "environment":
        result = {"content": [{"type": "text", "text": json.dumps(sorted(os.environ))}]}
    elif method == "tools/call":
        text = (message["params"].get("arguments") or {}).get("text", "")
        result = {"content": [{"type": "text", "text": text}]}
    elif method == "ping":
        result = {}
    elif method == "server/discover" and os.environ.get("MINI_EMPTY_DISCOVER"):
        result = {}
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}})
        continue
    send({"jsonrpc": "2.0", "id": request_id, "result": result})
