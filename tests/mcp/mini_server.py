"""A minimal MCP server over stdio, in plain JSON-RPC (no SDK, so it starts in tens of
milliseconds): tools/list offers `echo`; it answers initialize, ping and tools/call. It
speaks protocol 2025-06-18 only (or $MINI_PROTOCOL), as an older server would: whatever
version the client asks for, initialize answers with that one.

At start it also launches `sleep 600` as its own child, so that tests can check that the
server's whole process group goes away with it.
"""

import json
import subprocess
import os
import sys

PROTOCOL = os.environ.get("MINI_PROTOCOL", "2025-06-18")

subprocess.Popen(["sleep", "600"])


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


TOOLS = [{
    "name": "echo",
    "description": "Echoes its text.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
}]

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
        result = {"tools": TOOLS}
    elif method == "tools/call":
        text = (message["params"].get("arguments") or {}).get("text", "")
        result = {"content": [{"type": "text", "text": text}]}
    elif method == "ping":
        result = {}
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}})
        continue
    send({"jsonrpc": "2.0", "id": request_id, "result": result})
