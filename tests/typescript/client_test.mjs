// Calls a running toolmesh with the Node client (clients/typescript), as an agent would.
//
// Usage: node tests/typescript/client_test.mjs HOST:PORT
//
// The router serves tests/mcp/py_server.py as the MCP server `py`, asks for approval of
// `py_add` (a `[policy]` rule named `sums-need-approval`), and has a knowledge collection
// `handbook` with the filter field `lang` (tests/e2e/clients.rs). Exits non-zero on any
// failure.
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { Client, ToolmeshError, status } = require("@toolmesh/client");

const refused = async (promise, code, text) => {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof ToolmeshError, `not a ToolmeshError: ${error}`);
    assert.equal(error.codeName, code, error.message);
    if (text) assert.ok(error.details.includes(text), error.details);
    return error;
  }
  assert.fail(`expected ${code}`);
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const toolmesh = new Client({ target: process.argv[2], timeoutMs: 30_000 });
try {
  for (let i = 0; i < 300; i++) {
    const mcp = await toolmesh.listTools({ sourceKind: "mcp" });
    if (mcp.some((t) => t.name === "py_slow")) break;
    await sleep(100);
  }

  // Listing, calling, errors.
  const tools = await toolmesh.listTools();
  const names = tools.map((t) => t.name);
  for (const name of ["echo", "think", "py_add", "search_handbook"]) assert.ok(names.includes(name), names.join(" "));
  const think = tools.find((t) => t.name === "think");
  assert.deepEqual(JSON.parse(think.inputSchemaJson).required, ["title", "thought"]);
  const echoed = await toolmesh.call("echo", { from: "node", n: 3 }, { callId: "ts-1" });
  assert.equal(echoed.callId, "ts-1");
  assert.deepEqual(echoed.structured, { from: "node", n: 3 });
  const invalid = await refused(toolmesh.call("think", {}), "INVALID_ARGUMENT", "thought");
  assert.equal(invalid.code, status.INVALID_ARGUMENT);
  await refused(toolmesh.call("missing"), "NOT_FOUND");

  // Search, and the meta-tools of an agent whose model sees only those.
  let hits = [];
  for (let i = 0; i < 100 && !hits.some((h) => h.tool.name === "echo"); i++) {
    hits = await toolmesh.searchTools("return my arguments unchanged", { topK: 3 });
    await sleep(50);
  }
  assert.ok(hits.some((h) => h.tool.name === "echo"), hits.map((h) => h.tool.name).join(" "));
  const meta = await toolmesh.listTools({ profile: "default" });
  assert.deepEqual(meta.map((t) => t.name).sort(), ["callTool", "searchTools"]);
  const found = (await toolmesh.call("searchTools", { query: "return my arguments unchanged" })).structured;
  const called = await toolmesh.call("callTool", { name: "echo", arguments: { via: "callTool" }, searchToken: found.searchToken });
  assert.deepEqual(called.structured, { via: "callTool" });

  // Progress, in order, before the result.
  const progress = [];
  let started = "";
  const slow = await toolmesh.streamCall("py_slow", { steps: 3 }, { onProgress: (p) => progress.push(p), onStarted: (id) => (started = id) });
  assert.equal(slow.text, "done after 3 steps");
  assert.equal(started, slow.callId);
  assert.deepEqual(progress.map((p) => [p.progress, p.total, p.message]), [[1, 3, "step 1"], [2, 3, "step 2"], [3, 3, "step 3"]]);

  // A question for the person: answered (asynchronously), or declined without a handler.
  const asked = [];
  const hello = await toolmesh.streamCall("py_ask", {}, {
    onElicitation: async (question) => {
      asked.push(question);
      await sleep(10);
      return { name: "Ada" };
    },
  });
  assert.equal(hello.text, "hello Ada");
  assert.equal(asked[0].message, "What is your name?");
  assert.equal((await toolmesh.streamCall("py_ask", {})).text, "no name (decline)");

  // Approval: bound to the call; yes runs it, no (or no handler) refuses it with the note.
  const requests = [];
  const sum = await toolmesh.streamCall("py_add", { a: 2, b: 3 }, { onApproval: (r) => (requests.push(r), true) });
  assert.equal(sum.text, "5");
  assert.equal(requests[0].tool, "py_add");
  assert.deepEqual(JSON.parse(requests[0].argumentsJson), { a: 2, b: 3 });
  assert.equal(requests[0].rule, "sums-need-approval");
  await refused(toolmesh.streamCall("py_add", { a: 1, b: 1 }, { onApproval: () => ({ approved: false, note: "not today" }) }), "PERMISSION_DENIED", "not today");
  await refused(toolmesh.streamCall("py_add", { a: 1, b: 1 }), "PERMISSION_DENIED", "the client has no approval handler");
  await refused(toolmesh.call("py_add", { a: 1, b: 1 }), "FAILED_PRECONDITION");

  // Aborting cancels the call; a handler that throws ends it with its error.
  const abort = new AbortController();
  await refused(toolmesh.streamCall("py_slow", { steps: 50 }, { signal: abort.signal, onProgress: () => abort.abort() }), "CANCELLED");
  await assert.rejects(toolmesh.streamCall("py_slow", { steps: 50 }, { onProgress: () => { throw new RangeError("stop"); } }), RangeError);

  // Knowledge: ingest, find through the collection's tool, list, delete.
  const answer = await toolmesh.ingest("handbook", [
    { id: "refunds.md", format: "markdown", metadata: { lang: "en" }, text: "# Refunds\n\nA refund reaches the card within five working days." },
    { id: "install.txt", text: "Install the agent with the package manager." },
  ]);
  assert.equal(answer.ingested, "2");
  assert.equal(answer.failed, "0");
  const passages = await toolmesh.call("search_handbook", { query: "how long does a refund take", filter: { lang: "en" } });
  assert.ok(JSON.stringify(passages.structured).includes("five working days"), JSON.stringify(passages.structured));
  const handbook = (await toolmesh.collections()).find((c) => c.name === "handbook");
  assert.equal(handbook.documents, "2");
  const deleted = await toolmesh.deleteDocuments("handbook", ["install.txt", "missing.txt"]);
  assert.deepEqual(deleted.notFound, ["missing.txt"]);
  await refused(toolmesh.ingest("nowhere", [{ id: "a", text: "b" }]), "NOT_FOUND");
  await assert.rejects(toolmesh.ingest("handbook", [{ id: "a", body: "b" }]), /not body/);
  console.log(`node client: ${names.length} tools listed; calls, streams, approvals and knowledge as expected`);
} finally {
  toolmesh.close();
}
