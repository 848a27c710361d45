"""An MCP server carrying the fixtures the MCP conformance suite's server scenarios call
(tools, resources, prompts, completion, logging, subscriptions), written with the Python
SDK. Run directly it answers the scenarios itself; behind toolmesh it is the upstream
server whose answers toolmesh must pass on unchanged.

    python3 conformance_server.py PORT    # streamable HTTP at http://127.0.0.1:PORT/mcp
"""

import asyncio
import base64
import itertools
import json
import sys
from typing import Annotated, Any, Literal

from mcp import types
from mcp.shared.exceptions import MCPError
from mcp.server.elicitation import AcceptedElicitation
from mcp.server.mcpserver import (
    Context, Elicit, ElicitationResult, MCPServer, Resolve, Sample,
)
from mcp.server.mcpserver.prompts.base import Prompt, UserMessage
from pydantic import BaseModel, Field, WithJsonSchema
from mcp_types import (
    AudioContent,
    EmbeddedResource,
    ImageContent,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    InputRequiredResult,
    TextContent,
    TextResourceContents,
)

# A 1x1 red PNG and a 44-byte silent WAV.
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
    "0000000c4944415408d763f8cfc0000003010100c9fe92ef0000000049454e44ae426082"
)).decode()
WAV = base64.b64encode(
    b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (8000).to_bytes(4, "little")
    + (8000).to_bytes(4, "little") + (1).to_bytes(2, "little") + (8).to_bytes(2, "little")
    + b"data" + (0).to_bytes(4, "little")
).decode()

server = MCPServer("toolmesh-conformance-fixtures")


@server.tool(description="Returns a simple text.")
def test_simple_text() -> list[TextContent]:
    return [TextContent(type="text", text="This is a simple text response for testing.")]


@server.tool(description="Returns an image.")
def test_image_content() -> list[ImageContent]:
    return [ImageContent(type="image", data=PNG, mimeType="image/png")]


@server.tool(description="Returns audio.")
def test_audio_content() -> list[AudioContent]:
    return [AudioContent(type="audio", data=WAV, mimeType="audio/wav")]


def embedded(uri: str, text: str) -> EmbeddedResource:
    contents = TextResourceContents(uri=uri, mimeType="text/plain", text=text)
    return EmbeddedResource(type="resource", resource=contents)


@server.tool(description="Returns an embedded resource.")
def test_embedded_resource() -> list[EmbeddedResource]:
    return [embedded("test://embedded-resource", "This is an embedded resource content.")]


@server.tool(description="Returns text, an image and a resource.")
def test_multiple_content_types() -> list[Any]:
    return [
        TextContent(type="text", text="Multiple content types test:"),
        ImageContent(type="image", data=PNG, mimeType="image/png"),
        EmbeddedResource(type="resource", resource=TextResourceContents(
            uri="test://mixed-content-resource", mimeType="application/json",
            text=json.dumps({"test": "data", "value": 123}))),
    ]


@server.tool(description="Logs three messages while it runs.")
async def test_tool_with_logging(ctx: Context) -> str:
    await ctx.info("Tool execution started")
    await asyncio.sleep(0.05)
    await ctx.info("Tool processing data")
    await asyncio.sleep(0.05)
    await ctx.info("Tool execution completed")
    return "Tool with logging executed successfully"


@server.tool(description="Reports progress three times.")
async def test_tool_with_progress(ctx: Context) -> str:
    for done in (0, 50, 100):
        await ctx.report_progress(done, 100, f"Completed step {done // 50 + 1} of 3")
        await asyncio.sleep(0.05)
    return "Tool with progress executed successfully"


@server.tool(description="Always fails.")
def test_error_handling() -> str:
    raise ValueError("This tool intentionally returns an error for testing")


def ask_model(prompt: str) -> Sample:
    message = types.SamplingMessage(role="user", content=TextContent(type="text", text=prompt))
    return Sample([message], max_tokens=100)


@server.tool(description="Asks the client's model.")
async def test_sampling(
    prompt: str, answer: Annotated[types.CreateMessageResult, Resolve(ask_model)]
) -> str:
    content = answer.content
    text = content.text if isinstance(content, TextContent) else json.dumps(content.model_dump())
    return f"LLM response: {text}"


# The questions (and the sampling above) are asked through resolvers, so that they are an
# input round on 2026-07-28 (where a server has no back-channel during a request) and
# elicitation/create (sampling/createMessage) before.


def outcome(answer: ElicitationResult[Any]) -> str:
    content = answer.data.model_dump() if isinstance(answer, AcceptedElicitation) else None
    return f"action={answer.action}, content={json.dumps(content)}"


class Contact(BaseModel):
    username: str = Field(description="User's response")
    email: str = Field(description="User's email address")


def ask_contact(message: str) -> Elicit[Contact]:
    return Elicit(message, Contact)


@server.tool(description="Asks the user.")
async def test_elicitation(
    message: str, answer: Annotated[ElicitationResult[Contact], Resolve(ask_contact)]
) -> str:
    return f"User response: {outcome(answer)}"


class Defaults(BaseModel):
    name: str = Field("John Doe", description="User name")
    age: int = Field(30, description="User age")
    score: float = Field(95.5, description="User score")
    status: Literal["active", "inactive", "pending"] = Field("active", description="User status")
    verified: bool = Field(True, description="Verification status")


def ask_defaults() -> Elicit[Defaults]:
    return Elicit("Please review and update the form fields with defaults", Defaults)


@server.tool(description="Asks the user, with a default for each field.")
async def test_elicitation_sep1034_defaults(
    answer: Annotated[ElicitationResult[Defaults], Resolve(ask_defaults)],
) -> str:
    return f"Elicitation completed: {outcome(answer)}"


def titled(titles: list[str]) -> list[dict[str, str]]:
    return [{"const": f"value{i}", "title": t} for i, t in enumerate(titles, 1)]


class Enums(BaseModel):
    untitledSingle: Annotated[str | None, WithJsonSchema({
        "type": "string", "description": "Select one option",
        "enum": ["option1", "option2", "option3"]})] = None
    titledSingle: Annotated[str | None, WithJsonSchema({
        "type": "string", "description": "Select one option with titles",
        "oneOf": titled(["First Option", "Second Option", "Third Option"])})] = None
    legacyEnum: Annotated[str | None, WithJsonSchema({
        "type": "string", "description": "Select one option (legacy)",
        "enum": ["opt1", "opt2", "opt3"],
        "enumNames": ["Option One", "Option Two", "Option Three"]})] = None
    untitledMulti: Annotated[list[str] | None, WithJsonSchema({
        "type": "array", "description": "Select multiple options",
        "items": {"type": "string", "enum": ["option1", "option2", "option3"]}})] = None
    titledMulti: Annotated[list[str] | None, WithJsonSchema({
        "type": "array", "description": "Select multiple options with titles",
        "items": {"anyOf": titled(["First Choice", "Second Choice", "Third Choice"])}})] = None


def ask_enums() -> Elicit[Enums]:
    return Elicit("Please select options from the enum fields", Enums)


@server.tool(description="Asks the user to choose, in every enum form.")
async def test_elicitation_sep1330_enums(
    answer: Annotated[ElicitationResult[Enums], Resolve(ask_enums)],
) -> str:
    return f"Elicitation completed: {outcome(answer)}"


# The input rounds of 2026-07-28 as a server writes them by hand (SEP-2322): a tool (or
# prompt) answers with an InputRequiredResult until its client's next request carries the
# answers (and the state, which the SDK seals and checks).


def input_required(requests: dict[str, Any], state: str | None = None) -> InputRequiredResult:
    wire: dict[str, Any] = {"resultType": "input_required", "inputRequests": requests}
    if state is not None:
        wire["requestState"] = state
    return InputRequiredResult.model_validate(wire)


def elicit(message: str, field: str, kind: str = "string") -> dict[str, Any]:
    return {"method": "elicitation/create", "params": {
        "message": message,
        "requestedSchema": {"type": "object", "properties": {field: {"type": kind}},
                            "required": [field]}}}


def sample(text: str, max_tokens: int) -> dict[str, Any]:
    return {"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
        "maxTokens": max_tokens}}


ROOTS = {"method": "roots/list", "params": {}}


def answers(ctx: Context) -> dict[str, dict[str, Any]]:
    """The client's answers by key, as JSON."""
    return {key: value.model_dump(by_alias=True, exclude_none=True)
            for key, value in (ctx.input_responses or {}).items()}


def accepted(answer: dict[str, Any] | None, field: str) -> Any:
    if answer and answer.get("action") == "accept":
        return (answer.get("content") or {}).get(field)
    return None


def sampled_text(answer: dict[str, Any] | None) -> str | None:
    content = (answer or {}).get("content")
    return content.get("text") if isinstance(content, dict) else None


@server.tool(description="Asks the user's name in an input round.")
async def test_input_required_result_elicitation(ctx: Context) -> str | InputRequiredResult:
    name = accepted(answers(ctx).get("user_name"), "name")
    if name is None:
        return input_required({"user_name": elicit("What is your name?", "name")})
    return f"Hello, {name}!"


@server.tool(description="Asks the client's model in an input round.")
async def test_input_required_result_sampling(ctx: Context) -> str | InputRequiredResult:
    text = sampled_text(answers(ctx).get("capital_question"))
    if text is None:
        return input_required(
            {"capital_question": sample("What is the capital of France?", 100)})
    return f"The model said: {text}"


@server.tool(description="Asks for the client's roots in an input round.")
async def test_input_required_result_list_roots(ctx: Context) -> str | InputRequiredResult:
    roots = answers(ctx).get("client_roots", {}).get("roots")
    if roots is None:
        return input_required({"client_roots": ROOTS})
    return "Roots: " + ", ".join(root["uri"] for root in roots)


@server.tool(description="Asks for a confirmation, keeping state between the rounds.")
async def test_input_required_result_request_state(ctx: Context) -> str | InputRequiredResult:
    ok = accepted(answers(ctx).get("confirm"), "ok")
    if ok is None or ctx.request_state != "awaiting-confirmation":
        return input_required({"confirm": elicit("Please confirm", "ok", "boolean")},
                              "awaiting-confirmation")
    return f"state-ok: confirmed={ok}"


@server.tool(description="Asks for a name, a greeting and the roots in one round.")
async def test_input_required_result_multiple_inputs(ctx: Context) -> str | InputRequiredResult:
    given = answers(ctx)
    if not {"user_name", "greeting", "client_roots"} <= given.keys():
        return input_required({
            "user_name": elicit("What is your name?", "name"),
            "greeting": sample("Generate a greeting", 50),
            "client_roots": ROOTS,
        }, "awaiting-all")
    name = accepted(given["user_name"], "name")
    return f"{sampled_text(given['greeting'])} {name}, with {len(given['client_roots']['roots'])} roots"


@server.tool(description="Asks two questions, one round after the other.")
async def test_input_required_result_multi_round(ctx: Context) -> str | InputRequiredResult:
    given, state = answers(ctx), ctx.request_state or ""
    if state.startswith("round-2:"):
        color = accepted(given.get("step2"), "color")
        if color is not None:
            return f"{state.removeprefix('round-2:')} likes {color}"
        name = state.removeprefix("round-2:")
    else:
        name = accepted(given.get("step1"), "name")
        if name is None:
            return input_required(
                {"step1": elicit("Step 1: What is your name?", "name")}, "round-1")
    return input_required(
        {"step2": elicit("Step 2: What is your favorite color?", "color")}, f"round-2:{name}")


@server.tool(description="Asks for a confirmation with state the SDK seals.")
async def test_input_required_result_tampered_state(ctx: Context) -> str | InputRequiredResult:
    ok = accepted(answers(ctx).get("confirm"), "ok")
    if ok is None or ctx.request_state != "sealed":
        return input_required({"confirm": elicit("Please confirm", "ok", "boolean")}, "sealed")
    return "state verified"


@server.tool(description="Asks only for what the client declared it can answer.")
async def test_input_required_result_capabilities(ctx: Context) -> str | InputRequiredResult:
    given = answers(ctx)
    if given:
        return "answered: " + ", ".join(sorted(given))
    capabilities = ctx.client_capabilities
    requests: dict[str, Any] = {}
    if capabilities is not None and capabilities.sampling is not None:
        requests["question"] = sample("What is the capital of France?", 100)
    if capabilities is not None and capabilities.elicitation is not None:
        requests["user_name"] = elicit("What is your name?", "name")
    if capabilities is not None and capabilities.roots is not None:
        requests["client_roots"] = ROOTS
    if not requests:
        return "the client can answer nothing"
    return input_required(requests)


@server.tool(description="Needs a client that samples; refuses any other (-32021).")
async def test_missing_capability(ctx: Context) -> str:
    capabilities = ctx.client_capabilities
    if capabilities is None or capabilities.sampling is None:
        raise MCPError(code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                       message="This tool needs a client that samples",
                       data={"requiredCapabilities": {"sampling": {}}})
    return "the client samples"


# Hooks of the stateless scenario (2026-07-28).


server.add_tool(test_input_required_result_elicitation, name="test_streaming_elicitation",
                description="Asks the user during the call: an input round on 2026-07-28.")


@server.tool(description="Logs a message, which only a client that asked for logs hears.")
async def test_logging_tool(ctx: Context) -> str:
    await ctx.info("a log message")
    return "logged"


ADDED = itertools.count(1)


def added_tool() -> str:
    return "added"


def added_prompt() -> str:
    return "An added prompt."


@server.tool(description="Adds a tool and announces the change.")
async def test_trigger_tool_change(ctx: Context) -> str:
    server.add_tool(added_tool, name=f"test_added_tool_{next(ADDED)}",
                    description="A tool added while the server runs.")
    await ctx.session.send_tool_list_changed()
    await ctx.notify_tools_changed()
    return "tools changed"


@server.tool(description="Adds a prompt and announces the change.")
async def test_trigger_prompt_change(ctx: Context) -> str:
    server.add_prompt(Prompt.from_function(added_prompt, name=f"test_added_prompt_{next(ADDED)}",
                                           description="A prompt added while the server runs."))
    await ctx.session.send_prompt_list_changed()
    await ctx.notify_prompts_changed()
    return "prompts changed"


@server.prompt(description="A prompt that asks for context in an input round.")
async def test_input_required_result_prompt(ctx: Context) -> list[UserMessage] | InputRequiredResult:
    context = accepted(answers(ctx).get("user_context"), "context")
    if context is None:
        return input_required(
            {"user_context": elicit("What context should the prompt use?", "context")})
    return [UserMessage(content=f"Use this context: {context}")]


@server.resource("test://static-text", name="static-text", mime_type="text/plain",
                 description="A static text resource.")
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource("test://static-binary", name="static-binary", mime_type="image/png",
                 description="A static binary resource.")
def static_binary() -> bytes:
    return base64.b64decode(PNG)


@server.resource("test://watched-resource", name="watched-resource", mime_type="text/plain",
                 description="A resource to subscribe to.")
def watched() -> str:
    return "Watched resource content."


@server.resource("test://template/{id}/data", name="template", mime_type="application/json",
                 description="A resource template with an id.")
def template(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"},
                      separators=(",", ":"))


@server.prompt(description="A simple prompt without arguments.")
def test_simple_prompt() -> str:
    return "This is a simple prompt for testing."


@server.prompt(description="A prompt with two arguments.")
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@server.prompt(description="A prompt that embeds a resource.")
def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
    return [
        UserMessage(content=embedded(resourceUri, "Embedded resource content for testing.")),
        UserMessage(content="Please process the embedded resource above."),
    ]


@server.prompt(description="A prompt with an image.")
def test_prompt_with_image() -> list[UserMessage]:
    return [
        UserMessage(content=ImageContent(type="image", data=PNG, mimeType="image/png")),
        UserMessage(content="Please analyze the image above."),
    ]


@server.completion()
async def complete(ref, argument, context) -> types.Completion:
    values = [v for v in ("paris", "park", "party") if v.startswith(argument.value)]
    return types.Completion(values=values, total=len(values), hasMore=False)


async def set_level(ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


async def subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


async def unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


lowlevel = server._lowlevel_server
lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)

if __name__ == "__main__":
    server.run("streamable-http", port=int(sys.argv[1]))
