"""OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`), what Codex and the OpenAI
Agents SDK speak, over the server's one generation path.

A request is read as the chat request it means (`chat_body`): `instructions` as the system message, `input` text
or items (messages of input_text / output_text parts, `function_call` and `function_call_output` items), function
tools, `tool_choice`, `text.format` (a JSON schema: exact under speculation, as on chat completions),
`max_output_tokens` and the sampling fields. `previous_response_id` puts first the conversation a stored response
ended (not its instructions, as OpenAI does); its tokens are the prompt cache's. The answer comes back as output
items (a message of output_text, function_call items), whole or as the stream of typed events the official client
puts together, with usage (cached tokens, and the speculation figures the chat routes give). Stored responses
(`store`, true unless false) are kept, the newest first, up to `KEPT` of them and `KEPT_CHARS` characters.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict

from ..core.events import Done
from .generator import APIError
from .request_fields import SAMPLING_FIELDS

KEPT, KEPT_CHARS = 256, 64 * 2**20
PASSED = ("model", *SAMPLING_FIELDS, "seed", "drafter", "num_draft")  # the fields chat completions read as they are
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
RENAMED = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}


class Stored:
    """Responses kept for `previous_response_id` and GET: id -> (the response, the conversation it ended as chat
    messages, without instructions), the oldest dropped past `KEPT` or `KEPT_CHARS`."""

    def __init__(self):
        self.responses: OrderedDict[str, tuple[dict, list[dict], int]] = OrderedDict()
        self.chars = 0

    def keep(self, response: dict, conversation: list[dict]) -> None:
        size = len(json.dumps(response)) + len(json.dumps(conversation))
        self.responses[response["id"]] = (response, conversation, size)
        self.chars += size
        while len(self.responses) > KEPT or (self.chars > KEPT_CHARS and len(self.responses) > 1):
            self.chars -= self.responses.popitem(last=False)[1][2]

    def get(self, rid: str, param: str | None = None) -> tuple[dict, list[dict]]:
        if rid not in self.responses:
            raise APIError(400 if param else 404, f"response {rid!r} not found: this server keeps the newest {KEPT} "
                                                  "stored responses; send the whole conversation as 'input'", param,
                           "previous_response_not_found" if param else "not_found")
        return self.responses[rid][:2]

    def delete(self, rid: str) -> None:
        self.get(rid)
        self.chars -= self.responses.pop(rid)[2]


def chat_body(body: dict, stored: Stored) -> tuple[dict, list[dict]]:
    """(the chat request a Responses request means, the conversation it continues plus its input: what a stored
    response's conversation starts with); an APIError naming the field at fault."""
    history = []
    if (previous := body.get("previous_response_id")) is not None:
        if not isinstance(previous, str):
            raise APIError(400, "'previous_response_id' must be a response's id", "previous_response_id")
        history = list(stored.get(previous, "previous_response_id")[1])
    history += input_messages(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise APIError(400, "'instructions' must be text", "instructions")
    chat = {"messages": ([{"role": "system", "content": instructions}] if instructions else []) + history,
            **{k: body[k] for k in PASSED if k in body}}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        chat["tools"] = chat_tools(body["tools"])
    if (choice := body.get("tool_choice")) is not None:
        named = isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str)
        if choice not in ("auto", "none", "required") and not named:
            raise APIError(400, "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                                "\"name\"}", "tool_choice")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}} if named else choice
    if (shape := response_format(body.get("text"))) is not None:
        chat["response_format"] = shape
    return chat, history


def input_messages(given) -> list[dict]:
    """`input` (text, or a list of items) as chat messages: consecutive function_call items join one assistant
    message (the one before them, if it is the assistant's), each output a `tool` message."""
    if isinstance(given, str) and given:
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given or not all(isinstance(item, dict) for item in given):
        raise APIError(400, "'input' must be non-empty text or a non-empty list of items", "input")
    messages = []
    for item in given:
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in ROLES:
                raise APIError(400, f"an input message's role must be one of {', '.join(ROLES)}, got "
                                    f"{item.get('role')!r}", "input")
            messages.append({"role": ROLES[item["role"]], "content": content_of(item.get("content"))})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise APIError(400, "a function_call item needs its 'call_id', 'name' and 'arguments'", "input")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise APIError(400, "a function_call_output item needs the 'call_id' of its call", "input")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text_of(item.get("output"))})
        else:
            raise APIError(400, f"input items of type {kind!r} are not supported: send message, function_call or "
                                "function_call_output items", "input")
    return messages


def content_of(content) -> str | list[dict]:
    """A message's content as a chat's: its text, or (input_image parts among its parts) a list of text and
    image_url parts, in order."""
    if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") == "input_image"
                                                for p in content):
        return text_of(content)
    return [{"type": "image_url", "image_url": {"url": p.get("image_url")}}
            if isinstance(p, dict) and p.get("type") == "input_image" else {"type": "text", "text": text_of([p])}
            for p in content]


def text_of(content) -> str:
    """A message's content or a call's output: text, or a list of input_text / output_text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(part["text"] for part in content)
    kinds = sorted({str(p.get("type")) for p in content if isinstance(p, dict)} - {"input_text", "output_text"}) \
        if isinstance(content, list) else []
    raise APIError(400, "an input message's content must be text or a list of input_text / output_text parts"
                        + (f" (parts of type {', '.join(kinds)} are not supported)" if kinds else ""), "input")


def chat_tools(tools) -> list[dict]:
    """Function tools ({"type": "function", "name", "description", "parameters"}) as chat completions' tools."""
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise APIError(400, "'tools' must be a list of {\"type\": \"function\", \"name\", \"description\", "
                            "\"parameters\"} objects", "tools")
    for tool in tools:
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise APIError(400, f"only function tools are supported: {{\"type\": \"function\", \"name\", "
                                f"\"parameters\"}}, got a tool of type {tool.get('type')!r}", "tools")
    return [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
            for t in tools]


def response_format(text) -> dict | None:
    """`text.format` (text, json_object, or json_schema with its `schema`) as chat completions' response_format."""
    if text is not None and not isinstance(text, dict):
        raise APIError(400, "'text' must be an object: {\"format\": {\"type\": ...}}", "text")
    shape = (text or {}).get("format")
    if shape is None or shape == {"type": "text"}:
        return None
    kind = shape.get("type") if isinstance(shape, dict) else None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and shape.get("schema") is not None:
        return {"type": "json_schema", "json_schema": {"name": shape.get("name"), "schema": shape["schema"]}}
    raise APIError(400, "'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                        "\"json_schema\", \"name\", \"schema\"}", "text.format")


def renamed(e: APIError) -> APIError:
    """An error of the chat request's parsing, naming the Responses field it came from."""
    message = e.message
    for chat, ours in RENAMED.items():
        message = message.replace(f"'{chat}'", f"'{ours}'")
    return APIError(e.status, message, RENAMED.get(e.param, e.param), e.code, e.kind, e.headers)


def shell(body: dict, model: str) -> dict:
    """The response as it starts: in progress, no output yet."""
    return {"id": f"resp_{uuid.uuid4().hex[:24]}", "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "error": None, "incomplete_details": None,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "model": model, "output": [], "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"), "store": body.get("store", True) is not False,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "text": body.get("text") or {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "metadata": body.get("metadata") or {}, "usage": None}


def finished(response: dict, done: Done, output: list[dict], chat_usage: dict) -> dict:
    """The response once its generation is done: completed, or incomplete at max_output_tokens."""
    s = done.stats
    incomplete = done.stop_reason == "max_tokens"
    return {**response, "status": "incomplete" if incomplete else "completed", "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "usage": {"input_tokens": s.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": s.reused_prompt_tokens},
                      "output_tokens": s.generated_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": s.prompt_tokens + s.generated_tokens,
                      **{k: v for k, v in chat_usage.items() if not k.startswith(("prompt", "completion", "total"))}}}


def message_item(text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(call: dict) -> dict:
    """An OpenAI chat tool call as a function_call item."""
    return {"type": "function_call", "id": f"fc_{call['id'].removeprefix('call_')}", "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"}


def output_items(text: str, calls: list[dict]) -> list[dict]:
    return ([message_item(text)] if text or not calls else []) + [call_item(call) for call in calls]


def answered(output: list[dict]) -> dict:
    """The output items as the assistant's chat message (what a later request's conversation holds)."""
    text = "".join(item["content"][0]["text"] for item in output if item["type"] == "message")
    calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                      "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


class EventStream:
    """The Responses stream for one answer: `start()`, then `text()` / `call()` as they come (a message item opens
    on the first text after a call or at the start; each function_call item comes whole), then `end()`, each a
    string of server-sent events numbered in order."""

    def __init__(self, response: dict):
        self.response, self.output, self.message, self.sequence = response, [], None, 0

    def event(self, kind: str, **data) -> str:
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self.sequence - 1, **data})}\n\n"

    def start(self) -> str:
        return self.event("response.created", response=self.response) + self.event("response.in_progress",
                                                                                    response=self.response)

    def text(self, text: str) -> str:
        opened = ""
        if self.message is None:
            self.message = message_item("", "in_progress")
            self.output.append(self.message)
            where = {"item_id": self.message["id"], "output_index": len(self.output) - 1}
            opened = self.event("response.output_item.added", output_index=where["output_index"],
                                item={**self.message, "content": []})
            opened += self.event("response.content_part.added", **where, content_index=0,
                                 part=self.message["content"][0])
        self.message["content"][0]["text"] += text
        return opened + self.event("response.output_text.delta", item_id=self.message["id"],
                                   output_index=len(self.output) - 1, content_index=0, delta=text, logprobs=[])

    def close(self) -> str:
        if self.message is None:
            return ""
        item, self.message = self.message, None
        item["status"], where = "completed", {"item_id": item["id"], "output_index": self.output.index(item)}
        part = item["content"][0]
        return (self.event("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=[])
                + self.event("response.content_part.done", **where, content_index=0, part=part)
                + self.event("response.output_item.done", output_index=where["output_index"], item=item))

    def call(self, call: dict) -> str:
        out, item = self.close(), call_item(call)
        self.output.append(item)
        where = {"item_id": item["id"], "output_index": len(self.output) - 1}
        return (out + self.event("response.output_item.added", output_index=where["output_index"],
                                 item={**item, "arguments": "", "status": "in_progress"})
                + self.event("response.function_call_arguments.delta", **where, delta=item["arguments"])
                + self.event("response.function_call_arguments.done", **where, arguments=item["arguments"])
                + self.event("response.output_item.done", output_index=where["output_index"], item=item))

    def end(self, done: Done, chat_usage: dict) -> tuple[str, dict]:
        """(the closing events, the finished response)."""
        closed = self.close()
        if not self.output:
            closed += self.text("") + self.close()
        response = finished(self.response, done, self.output, chat_usage)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return closed + self.event(kind, response=response), response

    def error(self, e: APIError) -> str:
        return self.event("error", code=e.code, message=e.message, param=e.param)
