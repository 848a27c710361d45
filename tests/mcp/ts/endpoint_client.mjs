// An MCP client of toolmesh's MCP endpoint, written with the TypeScript SDK
// (@modelcontextprotocol/sdk), driven by the end-to-end tests as endpoint_client.py is:
//
//     node endpoint_client.mjs URL PLAN
//
// The SDK opens a session with protocol 2025-11-25 (an initialize handshake). PLAN is a
// JSON list of steps, run in order in one session; the script prints one JSON list with
// each step's result, the first being the handshake's:
//
// - {"op": "list"}: every page of tools/list -> {"tools": [names], "pages": n}
// - {"op": "call", "name": N, "arguments": {...}, "progress": bool}
//   -> {"content": [...], "structured": ..., "is_error": bool, "progress": [[p, total], ...]}
// - {"op": "call_error", "name": N, "arguments": {...}}: a call expected to fail with a
//   JSON-RPC error -> {"code": c, "message": m}
// - {"op": "search_call", "query": Q, "name": N, "arguments": {...}}: searchTools, then
//   callTool of N with the search's token -> {"found": [names], "called": <as call>}
// - {"op": "cancel", "name": N, "arguments": {...}, "after_s": s}: starts the call and
//   aborts it after s seconds (the SDK sends notifications/cancelled) -> {"cancelled": true}
// - {"op": "await_list_changed", "timeout_s": s} -> {"changed": bool}
// - {"op": "sleep", "s": s}
//
// Elicitations are answered with $ELICIT_ACCEPT (JSON content) when set, else declined.
// A token in $TOOLMESH_TOKEN is sent as `Authorization: Bearer`.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  ElicitRequestSchema,
  ToolListChangedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

const [url, planText] = process.argv.slice(2);
const plan = JSON.parse(planText);
const headers = {};
if (process.env.TOOLMESH_TOKEN) {
  headers.Authorization = `Bearer ${process.env.TOOLMESH_TOKEN}`;
}

const client = new Client(
  { name: "toolmesh-e2e-ts", version: "1.0.0" },
  { capabilities: { elicitation: { form: {} } } },
);
client.setRequestHandler(ElicitRequestSchema, async () => {
  const accept = process.env.ELICIT_ACCEPT;
  return accept ? { action: "accept", content: JSON.parse(accept) } : { action: "decline" };
});
let listChanged = false;
let onListChanged = () => {};
client.setNotificationHandler(ToolListChangedNotificationSchema, async () => {
  listChanged = true;
  onListChanged();
});

const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
await client.connect(transport);
const out = [
  {
    op: "initialize",
    version: transport.protocolVersion ?? null,
    server: client.getServerVersion()?.name ?? null,
  },
];

const sleep = (s) => new Promise((resolve) => setTimeout(resolve, s * 1000));

async function runStep(step) {
  switch (step.op) {
    case "list": {
      const names = [];
      let cursor;
      let pages = 0;
      do {
        const page = await client.listTools(cursor ? { cursor } : undefined);
        pages += 1;
        names.push(...page.tools.map((tool) => tool.name));
        cursor = page.nextCursor;
      } while (cursor);
      return { tools: names, pages };
    }
    case "call": {
      const progress = [];
      const options = step.progress
        ? { onprogress: (p) => progress.push([p.progress, p.total ?? null]) }
        : undefined;
      const result = await client.callTool(
        { name: step.name, arguments: step.arguments ?? {} },
        undefined,
        options,
      );
      return {
        content: result.content,
        structured: result.structuredContent ?? null,
        is_error: Boolean(result.isError),
        progress,
      };
    }
    case "search_call": {
      const found = await client.callTool({ name: "searchTools", arguments: { query: step.query } });
      const hits = found.structuredContent ?? JSON.parse(found.content[0].text);
      const called = await client.callTool({
        name: "callTool",
        arguments: { name: step.name, arguments: step.arguments ?? {}, searchToken: hits.searchToken },
      });
      return {
        found: hits.tools.map((tool) => tool.name),
        called: {
          content: called.content,
          structured: called.structuredContent ?? null,
          is_error: Boolean(called.isError),
        },
      };
    }
    case "resources": {
      const listed = await client.listResources();
      const templates = await client.listResourceTemplates();
      const read = await client.readResource({ uri: step.uri });
      return {
        resources: listed.resources.map((r) => [r.uri, r.name]),
        templates: templates.resourceTemplates.map((t) => t.uriTemplate),
        read: read.contents.map((c) => c.text ?? null),
      };
    }
    case "prompt": {
      const listed = await client.listPrompts();
      const got = await client.getPrompt({ name: step.name, arguments: step.arguments ?? {} });
      return {
        prompts: listed.prompts.map((p) => p.name),
        messages: got.messages.map((m) => [m.role, m.content.text]),
      };
    }
    case "call_error": {
      try {
        await client.callTool({ name: step.name, arguments: step.arguments ?? {} });
        return { code: null, message: "the call succeeded" };
      } catch (error) {
        return { code: error.code ?? null, message: String(error.message) };
      }
    }
    case "cancel": {
      const controller = new AbortController();
      const call = client
        .callTool({ name: step.name, arguments: step.arguments ?? {} }, undefined, {
          signal: controller.signal,
        })
        .catch(() => {});
      await sleep(step.after_s);
      controller.abort("the test gave up");
      await call;
      return { cancelled: true };
    }
    case "await_list_changed": {
      if (!listChanged) {
        await Promise.race([
          new Promise((resolve) => {
            onListChanged = resolve;
          }),
          sleep(step.timeout_s),
        ]);
      }
      return { changed: listChanged };
    }
    case "sleep":
      await sleep(step.s);
      return {};
    default:
      throw new Error(`unknown step ${step.op}`);
  }
}

for (const step of plan) {
  out.push(await runStep(step));
}
await transport.terminateSession().catch(() => {});
await client.close();
console.log(JSON.stringify(out));
