"""An example toolmesh worker in Python: two text tools for the pool "python".

    pip install ./clients/python
    python3 services/python-worker/example.py 127.0.0.1:50051

Then, through the router: `toolmesh call word_count '{"text": "one two three"}'`.
"""

import logging
import sys
import time

from toolmesh import ToolError, Worker

worker = Worker(pool="python", capacity=4)


@worker.tool(
    description="Counts the words of a text.",
    parameters={
        "type": "object",
        "required": ["text"],
        "properties": {"text": {"type": "string", "description": "The text to count."}},
    },
    read_only=True,
)
def word_count(arguments, call):
    # call.caller: the principal the router authenticated (None on an open router).
    caller = call.caller.name if call.caller else None
    return {"words": len(arguments["text"].split()), "caller": caller}


@worker.tool(
    description="Upper-cases a text slowly, a line at a time, reporting progress.",
    parameters={
        "type": "object",
        "required": ["text"],
        "properties": {"text": {"type": "string"}},
    },
    idempotent=True,
)
def shout(arguments, call):
    lines = arguments["text"].splitlines() or [""]
    if any(len(line) > 1000 for line in lines):
        raise ToolError("lines of more than 1000 characters are not shouted")
    out = []
    for i, line in enumerate(lines):
        if call.cancelled.is_set():
            break
        out.append(line.upper())
        call.progress(i + 1, len(lines), f"line {i + 1}")
        time.sleep(0.01)
    return "\n".join(out)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    worker.run(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051")
