// The toolmesh client for Node: list, search and call tools; ingest knowledge.
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";

import type { ProtoGrpcType as ToolsProto } from "./gen/tools";
import type { ProtoGrpcType as KnowledgeProto } from "./gen/knowledge";
import type { ToolServiceClient } from "./gen/toolmesh/v1/ToolService";
import type { KnowledgeServiceClient } from "./gen/toolmesh/v1/KnowledgeService";
import type { Tool__Output as Tool } from "./gen/toolmesh/v1/Tool";
import type { SearchHit__Output as SearchHit } from "./gen/toolmesh/v1/SearchHit";
import type { ListToolsResponse__Output as ListToolsResponse } from "./gen/toolmesh/v1/ListToolsResponse";
import type { SearchToolsResponse__Output as SearchToolsResponse } from "./gen/toolmesh/v1/SearchToolsResponse";
import type { ListCollectionsResponse__Output as ListCollectionsResponse } from "./gen/toolmesh/v1/ListCollectionsResponse";
import type { CallToolRequest } from "./gen/toolmesh/v1/CallToolRequest";
import type { CallToolResponse__Output } from "./gen/toolmesh/v1/CallToolResponse";
import type { CallToolClientMessage } from "./gen/toolmesh/v1/CallToolClientMessage";
import type { CallToolServerMessage__Output } from "./gen/toolmesh/v1/CallToolServerMessage";
import type { ContentPart__Output as ContentPart } from "./gen/toolmesh/v1/ContentPart";
import type { Progress__Output as Progress } from "./gen/toolmesh/v1/Progress";
import type { LogMessage__Output as LogMessage } from "./gen/toolmesh/v1/LogMessage";
import type { ApprovalRequest__Output as ApprovalRequest } from "./gen/toolmesh/v1/ApprovalRequest";
import type { ElicitationRequest__Output as ElicitationRequest } from "./gen/toolmesh/v1/ElicitationRequest";
import type { SamplingRequest__Output as SamplingRequest } from "./gen/toolmesh/v1/SamplingRequest";
import type { ReadResourceResponse__Output as ReadResourceResponse } from "./gen/toolmesh/v1/ReadResourceResponse";
import type { GetPromptResponse__Output as GetPromptResponse } from "./gen/toolmesh/v1/GetPromptResponse";
import type { Document } from "./gen/toolmesh/v1/Document";
import type { IngestRequest } from "./gen/toolmesh/v1/IngestRequest";
import type { IngestResponse__Output as IngestResponse } from "./gen/toolmesh/v1/IngestResponse";
import type { DeleteResponse__Output as DeleteResponse } from "./gen/toolmesh/v1/DeleteResponse";
import type { CollectionInfo__Output as CollectionInfo } from "./gen/toolmesh/v1/CollectionInfo";
import type { SourceKind } from "./gen/toolmesh/v1/SourceKind";

export type {
  ApprovalRequest, CollectionInfo, ContentPart, DeleteResponse, ElicitationRequest, GetPromptResponse,
  IngestResponse, LogMessage, Progress, ReadResourceResponse, SamplingRequest, SearchHit, Tool,
};

/** gRPC status codes, to compare with `ToolmeshError.code`. */
export { status } from "@grpc/grpc-js";

/** The default router address, as for the `toolmesh` CLI. */
export const DEFAULT_SERVER = "127.0.0.1:50051";

const LOADER_OPTIONS: protoLoader.Options = {
  // As the types in gen/ were generated (scripts/build.mjs).
  keepCase: false, longs: String, enums: String, defaults: true, oneofs: true,
  includeDirs: [join(__dirname, "..", "proto")],
};

function loadProtos(): { tools: ToolsProto; knowledge: KnowledgeProto } {
  const load = (file: string) =>
    grpc.loadPackageDefinition(protoLoader.loadSync(file, LOADER_OPTIONS)) as unknown;
  return {
    tools: load("toolmesh/v1/tools.proto") as ToolsProto,
    knowledge: load("toolmesh/v1/knowledge.proto") as KnowledgeProto,
  };
}

/** toolmesh refused or could not finish a request. A tool's own failure is not an error: it
 * is a `CallResult` with `isError`. */
export class ToolmeshError extends Error {
  /** The gRPC status: `grpc.status.NOT_FOUND` for a tool the caller may not see,
   * `INVALID_ARGUMENT` for arguments that fail the schema, `PERMISSION_DENIED` for a refused
   * approval, ... */
  readonly code: grpc.status;
  /** The status's name, for example `NOT_FOUND`. */
  readonly codeName: string;
  /** Why, as toolmesh said it. */
  readonly details: string;

  constructor(code: grpc.status, details: string) {
    const codeName = grpc.status[code] ?? String(code);
    super(`${codeName}: ${details}`);
    this.name = "ToolmeshError";
    this.code = code;
    this.codeName = codeName;
    this.details = details;
  }

  static of(error: unknown): unknown {
    const e = error as Partial<grpc.ServiceError>;
    return typeof e?.code === "number" ? new ToolmeshError(e.code, e.details ?? "") : error;
  }
}

/** What a tool answered. */
export interface CallResult {
  callId: string;
  isError: boolean;
  /** The output parts in order (text, json, media, resourceLink, resource). */
  content: ContentPart[];
  /** The structured result, parsed; undefined when the tool produced none. */
  structured: unknown;
  /** The text parts, joined by newlines. */
  text: string;
}

function result(response: CallToolResponse__Output): CallResult {
  return {
    callId: response.callId,
    isError: response.isError,
    content: response.content,
    structured: response.structuredJson === undefined ? undefined : JSON.parse(response.structuredJson),
    text: response.content.filter((p) => p.part === "text").map((p) => p.text).join("\n"),
  };
}

export interface ClientOptions {
  /** `host:port` of a router; default `TOOLMESH_SERVER`, else 127.0.0.1:50051. */
  target?: string;
  /** An API key or JWT for a router with `[auth]`; default `TOOLMESH_TOKEN`. */
  token?: string;
  /** A CA certificate file: TLS to a router with `[tls]`; default `TOOLMESH_CA_CERT`. */
  caCert?: string;
  /** A client certificate and key file for mutual TLS; default `TOOLMESH_CLIENT_CERT`,
   * `TOOLMESH_CLIENT_KEY`. */
  clientCert?: string;
  clientKey?: string;
  /** Deadline of each request, in milliseconds; default 30 000. */
  timeoutMs?: number;
  /** The agent session of this client's searches and calls (searchTools tokens are bound to
   * it); default: one made up for the client. */
  sessionId?: string;
  /** The routing profile of the meta-tools; default: the router's. */
  profile?: string;
}

export type SourceKindName = "local" | "remote" | "mcp" | "knowledge";

export interface ToolFilter {
  toolkit?: string;
  tags?: string[];
  sourceKind?: SourceKindName;
  sourceName?: string;
  /** What an agent of this routing profile sees (its exposed tools and the meta-tools). */
  profile?: string;
}

export interface CallOptions {
  callId?: string;
  timeoutMs?: number;
}

/** What an approval handler returns: approve or not, optionally with a note for the audit. */
export type Approval = boolean | { approved: boolean; note?: string };
type MaybePromise<T> = T | Promise<T>;

export interface StreamHandlers extends CallOptions {
  onStarted?: (callId: string) => void;
  onProgress?: (progress: Progress) => void;
  onPartial?: (part: ContentPart) => void;
  onLog?: (message: LogMessage) => void;
  /** A policy rule asks a person to approve the call. Without a handler it is not approved. */
  onApproval?: (request: ApprovalRequest) => MaybePromise<Approval>;
  /** The tool asks the person a question: return the answer (an object) to accept, or null
   * to decline. Without a handler every question is declined. */
  onElicitation?: (request: ElicitationRequest) => MaybePromise<Record<string, unknown> | null>;
  /** An MCP server asks the caller's model for a completion (`request.paramsJson`): return
   * MCP's CreateMessageResult, or throw to refuse. Without a handler the server is told the
   * caller does not sample. */
  onSampling?: (request: SamplingRequest) => MaybePromise<Record<string, unknown>>;
  /** Aborting cancels the call; the promise rejects with CANCELLED. */
  signal?: AbortSignal;
}

/** A document to ingest: `format` is `text` (default) or `markdown`. */
export interface DocumentInput {
  id: string;
  text: string;
  format?: "text" | "markdown";
  metadata?: Record<string, unknown>;
}

const SOURCE_KINDS: Record<SourceKindName, SourceKind> = {
  local: "SOURCE_KIND_LOCAL",
  remote: "SOURCE_KIND_REMOTE",
  mcp: "SOURCE_KIND_MCP",
  knowledge: "SOURCE_KIND_KNOWLEDGE",
};

/**
 * A connection to one toolmesh router (or a load balancer in front of several).
 *
 * ```ts
 * const toolmesh = new Client(); // TOOLMESH_SERVER, TOOLMESH_TOKEN, TOOLMESH_CA_CERT, ...
 * const tools = await toolmesh.listTools();
 * const answer = await toolmesh.call("echo", { hello: "world" });
 * toolmesh.close();
 * ```
 *
 * Every method rejects with a `ToolmeshError` when toolmesh refuses the request.
 */
export class Client {
  readonly sessionId: string;
  readonly profile: string;
  private readonly tools: ToolServiceClient;
  private readonly knowledge: KnowledgeServiceClient;
  private readonly token: string;
  private readonly timeoutMs: number;

  constructor(options: ClientOptions = {}) {
    const env = process.env;
    const target = options.target ?? env.TOOLMESH_SERVER ?? DEFAULT_SERVER;
    const caCert = options.caCert ?? env.TOOLMESH_CA_CERT;
    const credentials = caCert
      ? grpc.credentials.createSsl(
          readFileSync(caCert),
          readOptional(options.clientKey ?? env.TOOLMESH_CLIENT_KEY),
          readOptional(options.clientCert ?? env.TOOLMESH_CLIENT_CERT),
        )
      : grpc.credentials.createInsecure();
    const protos = loadProtos();
    this.tools = new protos.tools.toolmesh.v1.ToolService(target, credentials);
    // One channel for both services.
    this.knowledge = new protos.knowledge.toolmesh.v1.KnowledgeService(target, credentials, {
      channelOverride: this.tools.getChannel(),
    });
    this.token = options.token ?? env.TOOLMESH_TOKEN ?? "";
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.sessionId = options.sessionId ?? `ts-${randomUUID()}`;
    this.profile = options.profile ?? "";
  }

  close(): void {
    this.tools.close();
  }

  private metadata(): grpc.Metadata {
    const metadata = new grpc.Metadata();
    if (this.token) metadata.set("authorization", `Bearer ${this.token}`);
    return metadata;
  }

  private deadline(timeoutMs?: number): grpc.CallOptions {
    return { deadline: Date.now() + (timeoutMs ?? this.timeoutMs) };
  }

  private unary<Res>(
    invoke: (metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<Res>) => unknown,
    timeoutMs?: number,
  ): Promise<Res> {
    return new Promise((resolve, reject) => {
      invoke(this.metadata(), this.deadline(timeoutMs), (error, response) =>
        error ? reject(ToolmeshError.of(error)) : resolve(response as Res),
      );
    });
  }

  /** Every tool the caller may see (all pages), by name. */
  async listTools(filter: ToolFilter = {}, timeoutMs?: number): Promise<Tool[]> {
    const tools: Tool[] = [];
    let pageToken = "";
    do {
      const page = await this.unary<ListToolsResponse>((md, o, cb) => this.tools.listTools({
        toolkit: filter.toolkit ?? "",
        tags: filter.tags ?? [],
        sourceKind: filter.sourceKind ? SOURCE_KINDS[filter.sourceKind] : "SOURCE_KIND_UNSPECIFIED",
        sourceName: filter.sourceName ?? "",
        pageSize: 1000,
        pageToken,
        profile: filter.profile ?? this.profile,
      }, md, o, cb), timeoutMs);
      tools.push(...page.tools);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return tools;
  }

  /** The tools that best match `query`, best first, each with its definition and score. */
  async searchTools(query: string, options: ToolFilter & { topK?: number } = {}, timeoutMs?: number): Promise<SearchHit[]> {
    const response = await this.unary<SearchToolsResponse>((md, o, cb) => this.tools.searchTools({
      query,
      topK: options.topK ?? 5,
      toolkit: options.toolkit ?? "",
      tags: options.tags ?? [],
      sourceKind: options.sourceKind ? SOURCE_KINDS[options.sourceKind] : "SOURCE_KIND_UNSPECIFIED",
      sourceName: options.sourceName ?? "",
      sessionId: this.sessionId,
      profile: options.profile ?? this.profile,
    }, md, o, cb), timeoutMs);
    return response.hits;
  }

  /** Calls `name` with `args`. A call that needs a person's approval, or asks a question,
   * needs `streamCall`. */
  async call(name: string, args: Record<string, unknown> = {}, options: CallOptions = {}): Promise<CallResult> {
    const request = this.request(name, args, options);
    const response = await this.unary<CallToolResponse__Output>((md, o, cb) => this.tools.callTool(request, md, o, cb), options.timeoutMs);
    return result(response);
  }

  /**
   * Calls `name` and reports what happens while it runs; resolves with its result. The
   * handlers are called in the order toolmesh sends; an answer a handler returns (or
   * resolves to) goes back on the call's stream. A handler that throws cancels the call,
   * and the promise rejects with its error.
   */
  streamCall(name: string, args: Record<string, unknown> = {}, handlers: StreamHandlers = {}): Promise<CallResult> {
    const request: CallToolRequest = { ...this.request(name, args, handlers), sampling: handlers.onSampling !== undefined };
    const stream = this.tools.streamCallTool(this.metadata(), this.deadline(handlers.timeoutMs));
    return new Promise<CallResult>((resolve, reject) => {
      let settled = false;
      const settle = (fn: () => void) => {
        if (!settled) {
          settled = true;
          handlers.signal?.removeEventListener("abort", abort);
          fn();
        }
      };
      const fail = (error: unknown) => settle(() => {
        stream.cancel();
        reject(error);
      });
      const abort = () => {
        stream.write({ cancel: { reason: "the caller aborted" } });
      };
      if (handlers.signal?.aborted) {
        stream.cancel();
        reject(new ToolmeshError(grpc.status.CANCELLED, "aborted before the call started"));
        return;
      }
      handlers.signal?.addEventListener("abort", abort, { once: true });
      stream.on("data", (message: CallToolServerMessage__Output) => {
        if (message.message === "result") {
          settle(() => {
            stream.end();
            resolve(result(message.result!));
          });
          return;
        }
        Promise.resolve()
          .then(() => this.handle(message, handlers))
          .then((answer) => {
            if (answer && !settled) stream.write(answer);
          })
          .catch(fail);
      });
      stream.on("error", (error) => settle(() => reject(ToolmeshError.of(error))));
      stream.on("end", () =>
        settle(() => reject(new ToolmeshError(grpc.status.UNKNOWN, "the stream ended without a result"))),
      );
      stream.write({ start: request });
    });
  }

  private async handle(message: CallToolServerMessage__Output, h: StreamHandlers): Promise<CallToolClientMessage | undefined> {
    switch (message.message) {
      case "started":
        h.onStarted?.(message.started!.callId);
        return undefined;
      case "progress":
        h.onProgress?.(message.progress!);
        return undefined;
      case "partial":
        h.onPartial?.(message.partial!);
        return undefined;
      case "log":
        h.onLog?.(message.log!);
        return undefined;
      case "approval": {
        const request = message.approval!;
        const verdict: Approval = h.onApproval
          ? await h.onApproval(request)
          : { approved: false, note: "the client has no approval handler" };
        const { approved, note } = typeof verdict === "boolean" ? { approved: verdict, note: "" } : verdict;
        return { approvalAnswer: { approvalId: request.approvalId, approved, note: note ?? "" } };
      }
      case "elicitation": {
        const request = message.elicitation!;
        const content = h.onElicitation ? await h.onElicitation(request) : null;
        return {
          elicitationAnswer: content === null
            ? { elicitationId: request.elicitationId, action: "ELICITATION_ACTION_DECLINE" }
            : { elicitationId: request.elicitationId, action: "ELICITATION_ACTION_ACCEPT", contentJson: JSON.stringify(content) },
        };
      }
      case "sampling": {
        const request = message.sampling!;
        try {
          const answer = await h.onSampling!(request);
          return { samplingAnswer: { samplingId: request.samplingId, resultJson: JSON.stringify(answer) } };
        } catch (error) {
          return { samplingAnswer: { samplingId: request.samplingId, error: String(error) } };
        }
      }
      default:
        return undefined;
    }
  }

  private request(name: string, args: Record<string, unknown>, options: CallOptions): CallToolRequest {
    return {
      name,
      argumentsJson: JSON.stringify(args),
      callId: options.callId ?? "",
      sessionId: this.sessionId,
      profile: this.profile,
    };
  }

  /** Reads a resource of an MCP server, for example one a tool's resourceLink named. */
  async readResource(uri: string, server = "", timeoutMs?: number): Promise<ReadResourceResponse> {
    return this.unary<ReadResourceResponse>((md, o, cb) => this.tools.readResource({ uri, server }, md, o, cb), timeoutMs);
  }

  /** A prompt of an MCP server with its arguments filled in. */
  async getPrompt(name: string, args: Record<string, string> = {}, timeoutMs?: number): Promise<GetPromptResponse> {
    return this.unary<GetPromptResponse>((md, o, cb) => this.tools.getPrompt({ name, arguments: args }, md, o, cb), timeoutMs);
  }

  /**
   * Ingests documents into `collection`, replacing those of the same id, in batches of
   * `batchSize`; resolves with what went in and the failures with why. No deadline unless
   * `timeoutMs` is given: ingesting takes as long as embedding takes.
   */
  ingest(
    collection: string,
    documents: Iterable<DocumentInput> | AsyncIterable<DocumentInput>,
    options: { batchSize?: number; timeoutMs?: number } = {},
  ): Promise<IngestResponse> {
    const batchSize = options.batchSize ?? 32;
    const callOptions: grpc.CallOptions = options.timeoutMs ? this.deadline(options.timeoutMs) : {};
    return new Promise<IngestResponse>((resolve, reject) => {
      let failed: unknown;
      const stream = this.knowledge.ingest(this.metadata(), callOptions, (error, response) =>
        failed !== undefined ? reject(failed) : error ? reject(ToolmeshError.of(error)) : resolve(response!),
      );
      const send = (batch: Document[]) =>
        new Promise<void>((done) => {
          const request: IngestRequest = { collection, documents: batch };
          if (stream.write(request)) done();
          else stream.once("drain", done);
        });
      (async () => {
        let batch: Document[] = [];
        let sent = false;
        for await (const input of documents) {
          batch.push(document(input));
          if (batch.length === batchSize) {
            await send(batch);
            batch = [];
            sent = true;
          }
        }
        if (batch.length > 0 || !sent) await send(batch);
        stream.end();
      })().catch((error) => {
        failed = error;
        stream.cancel();
      });
    });
  }

  /** Deletes documents by id, with all their chunks. */
  async deleteDocuments(collection: string, ids: string[], timeoutMs?: number): Promise<DeleteResponse> {
    return this.unary<DeleteResponse>((md, o, cb) => this.knowledge.delete({ collection, documentIds: ids }, md, o, cb), timeoutMs);
  }

  /** The knowledge collections, with their document and chunk counts. */
  async collections(timeoutMs?: number): Promise<CollectionInfo[]> {
    const response = await this.unary<ListCollectionsResponse>((md, o, cb) => this.knowledge.listCollections({}, md, o, cb), timeoutMs);
    return response.collections;
  }
}

function readOptional(path: string | undefined): Buffer | null {
  return path ? readFileSync(path) : null;
}

function document(input: DocumentInput): Document {
  const unknown = Object.keys(input).filter((k) => !["id", "text", "format", "metadata"].includes(k));
  if (unknown.length > 0) throw new TypeError(`a document has id, text, format and metadata, not ${unknown.join(", ")}`);
  const format = input.format ?? "text";
  if (format !== "text" && format !== "markdown") throw new TypeError(`a document's format is text or markdown, not ${format}`);
  return {
    id: input.id,
    text: input.text,
    format: format === "markdown" ? "DOCUMENT_FORMAT_MARKDOWN" : "DOCUMENT_FORMAT_TEXT",
    metadataJson: input.metadata === undefined ? "" : JSON.stringify(input.metadata),
  };
}
