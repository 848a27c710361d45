"""The Python client's streaming calls and knowledge ingest against a running toolmesh.

Usage: python3 tests/python/stream_test.py HOST:PORT

The router serves tests/mcp/py_server.py as the MCP server `py`, asks for approval of
`py_add` (a `[policy]` rule named `sums-need-approval`), and has a knowledge collection
`handbook` with the filter field `lang` (tests/e2e/clients.rs). Exits non-zero on any
failure.
"""

import json
import sys
import time

import grpc

from toolmesh import Client, ToolmeshError


def main(addr: str) -> None:
    with Client(addr, timeout=30) as toolmesh:
        for _ in range(300):  # the MCP server's tools join the catalog once it is up
            if "py_slow" in [tool.name for tool in toolmesh.list_tools(source_kind="mcp")]:
                break
            time.sleep(0.1)

        # Progress, in order, before the result.
        progress = []
        result = toolmesh.stream_call("py_slow", {"steps": 3}, on_progress=progress.append)
        assert result.text == "done after 3 steps", result
        assert [(p.progress, p.total, p.message) for p in progress] == [
            (1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")], progress

        # A question for the person: answered, declined (the default without a handler).
        asked = []

        def answer(question):
            asked.append(question)
            return {"name": "Ada"}

        result = toolmesh.stream_call("py_ask", {}, on_elicitation=answer)
        assert result.text == "hello Ada", result
        assert asked[0].message == "What is your name?", asked
        assert "name" in json.loads(asked[0].requested_schema_json)["properties"]
        result = toolmesh.stream_call("py_ask", {})
        assert result.text == "no name (decline)", result

        # Approval: the request names the tool, arguments and rule; yes runs the call, no
        # (or no handler) refuses it with the note.
        requests = []

        def approve(request):
            requests.append(request)
            return True

        result = toolmesh.stream_call("py_add", {"a": 2, "b": 3}, on_approval=approve)
        assert result.text == "5", result
        assert requests[0].tool == "py_add", requests
        assert json.loads(requests[0].arguments_json) == {"a": 2, "b": 3}
        assert requests[0].rule == "sums-need-approval"
        assert requests[0].reason == "sums matter"
        for handler, note in ((lambda _: (False, "not today"), "not today"),
                              (None, "the client has no approval handler")):
            try:
                toolmesh.stream_call("py_add", {"a": 1, "b": 1}, on_approval=handler)
                raise AssertionError("a refused call ran")
            except ToolmeshError as error:
                assert error.code == grpc.StatusCode.PERMISSION_DENIED, error
                assert note in error.message, error.message
        try:
            toolmesh.call("py_add", {"a": 1, "b": 1})
            raise AssertionError("a unary call skipped the approval")
        except ToolmeshError as error:
            assert error.code == grpc.StatusCode.FAILED_PRECONDITION, error

        # A handler that raises ends the call and its exception reaches the caller.
        class Stop(Exception):
            pass

        def stop(_):
            raise Stop()

        try:
            toolmesh.stream_call("py_slow", {"steps": 50}, on_progress=stop)
            raise AssertionError("the handler's exception was lost")
        except Stop:
            pass

        # Knowledge: ingest, find through the collection's tool, list, delete.
        answer = toolmesh.ingest("handbook", [
            {"id": "refunds.md", "format": "markdown", "metadata": {"lang": "en"},
             "text": "# Refunds\n\nA refund reaches the card within five working days."},
            {"id": "install.txt", "text": "Install the agent with the package manager."},
        ])
        assert (answer.ingested, answer.failed) == (2, 0), answer
        assert answer.chunks >= 2, answer
        found = toolmesh.call("search_handbook", {"query": "how long does a refund take",
                                                  "filter": {"lang": "en"}})
        assert not found.is_error, found
        assert "five working days" in json.dumps(found.structured), found.structured
        [handbook] = [c for c in toolmesh.collections() if c.name == "handbook"]
        assert handbook.documents == 2, handbook
        bad = toolmesh.ingest("handbook", [{"id": "", "text": "no id"}])
        assert bad.failed == 1 and bad.results[0].error, bad
        deleted = toolmesh.delete_documents("handbook", ["install.txt", "missing.txt"])
        assert list(deleted.not_found) == ["missing.txt"], deleted
        try:
            toolmesh.ingest("nowhere", [{"id": "a", "text": "b"}])
            raise AssertionError("an unknown collection took documents")
        except ToolmeshError as error:
            assert error.code == grpc.StatusCode.NOT_FOUND, error
        try:
            toolmesh.ingest("handbook", [{"id": "a", "body": "b"}])
            raise AssertionError("a document with an unknown field was sent")
        except ValueError as error:
            assert "body" in str(error), error

    print("python client: progress, elicitation, approvals and knowledge as expected")


if __name__ == "__main__":
    main(sys.argv[1])
