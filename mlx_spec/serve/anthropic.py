"""Anthropic's Messages API (`POST /v1/messages`) over the server's one generation path.

A request is read as the OpenAI chat request it means (`openai_body`: system text, text / tool_use / tool_result
content blocks, tools with their `input_schema`, `stop_sequences`, `output_format`), so parsing, the chat
template, tool calls, constrained output and speculation are the OpenAI routes' own; the answer comes back as
content blocks (text, tool_use), whole or as Anthropic's stream of events, with the same usage figures
(drafter, acceptance) beside `input_tokens` / `output_tokens` / `cache_read_input_tokens`. Errors are
Anthropic-shaped: {"type": "error", "error": {"type", "message"}}.
"""

from __future__ import annotations

import json
import uuid

from starlette.responses import JSONResponse

from ..core.events import Done
from .generator import APIError

STOP_REASONS = {"eos": "end_turn", "stop_string": "stop_sequence", "max_tokens": "max_tokens"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
SAMPLING = ("temperature", "top_p", "top_k", "seed", "drafter", "num_draft")  # Anthropic's three, then ours


def error_body(e: APIError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(error_body(e), e.status, headers=e.headers)


def text_of(content, field: str) -> str:
    """A system prompt or tool result: text, or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         and isinstance(b.get("text"), str) for b in content):
        return "".join(b["text"] for b in content)
    raise APIError(400, f"'{field}' must be text or a list of {{\"type\": \"text\", \"text\"}} blocks", field)


def openai_body(body: dict) -> dict:
    """The OpenAI chat request an Anthropic one means; an APIError naming the field at fault."""
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise APIError(400, "'max_tokens' is required: a whole number >= 1", "max_tokens")
    messages = [{"role": "system", "content": text_of(body["system"], "system")}] if body.get("system") else []
    given = body.get("messages")
    if not isinstance(given, list) or not given or not all(isinstance(m, dict) for m in given):
        raise APIError(400, "'messages' must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    for message in given:
        messages += chat_messages(message)
    out = {"messages": messages, "max_tokens": max_tokens, "stop": body.get("stop_sequences"),
           **{k: body[k] for k in ("model", "prediction", *SAMPLING) if k in body}}  # prediction: an extension
    if body.get("tools") is not None:
        tools = body["tools"]
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                  for t in tools):
            raise APIError(400, "'tools' must be a list of {\"name\", \"description\", \"input_schema\"} objects",
                           "tools")
        out["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                          "parameters": t.get("input_schema", {})}} for t in tools]
    if (shape := body.get("output_format")) is not None:  # Anthropic's structured outputs
        out["response_format"] = ({"type": "json_schema", "json_schema": {"schema": shape.get("schema")}}
                                  if isinstance(shape, dict) and shape.get("type") == "json_schema" else shape)
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in ("auto", "none", "any", "tool"):
            raise APIError(400, "'tool_choice' must be {\"type\": \"auto\" | \"none\" | \"any\" | \"tool\"}",
                           "tool_choice")
        out["tool_choice"] = {"auto": "auto", "none": "none", "any": "required"}.get(
            kind, {"type": "function", "function": {"name": choice.get("name")}})
    return out


def chat_messages(message: dict) -> list[dict]:
    """One Anthropic message as chat-template messages: a user's tool results become `tool` messages (first), an
    assistant's tool_use blocks its `tool_calls`."""
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise APIError(400, f"a message's role must be \"user\" or \"assistant\", got {role!r} (the system prompt "
                            "goes in 'system')", "messages")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
        raise APIError(400, "a message's content must be text or a list of content blocks", "messages")
    text, calls, results, parts = [], [], [], []
    for block in blocks:
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
            parts.append(block)
        elif kind == "image" and role == "user":
            parts.append({"type": "image_url", "image_url": {"url": image_url(block.get("source"))}})
        elif kind == "tool_use" and role == "assistant" and isinstance(block.get("name"), str):
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block["name"], "arguments": block.get("input") or {}}})
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                            "content": text_of(block.get("content", ""), "messages")})
        else:
            raise APIError(400, f"content blocks of type {kind!r} are not supported in a {role} message here: send "
                                "text, image (user), tool_use (assistant) or tool_result (user) blocks", "messages")
    content = parts if len(parts) > len(text) else "".join(text)  # image blocks: the parts, in order
    said = [{"role": role, "content": content, **({"tool_calls": calls} if calls else {})}]
    return results + (said if parts or calls or not results else [])


def image_url(source) -> str | None:
    """An image block's source as an OpenAI image URL: base64 data as a data URL, a URL as it is."""
    if isinstance(source, dict) and source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    return source.get("url") if isinstance(source, dict) and source.get("type") == "url" else None


def tool_use(call: dict) -> dict:
    """An OpenAI tool call as a tool_use block."""
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


def stop_of(done: Done, calls: list, tokenizer, stops: list[str]) -> tuple[str, str | None]:
    """(stop_reason, the stop sequence met or None)."""
    if done.stop_reason == "stop_string":
        rest = tokenizer.decode(done.tokens)[len(done.text):]
        return "stop_sequence", next((s for s in stops if rest.startswith(s)), None)
    reason = STOP_REASONS[done.stop_reason]
    return ("tool_use" if calls and reason == "end_turn" else reason), None


def usage(done: Done, openai_usage: dict) -> dict:
    return {"input_tokens": done.stats.prompt_tokens, "output_tokens": done.stats.generated_tokens,
            "cache_read_input_tokens": done.stats.reused_prompt_tokens,
            **{k: v for k, v in openai_usage.items() if not k.startswith(("prompt_tokens", "completion", "total"))},
            **openai_usage.get("completion_tokens_details", {})}  # a prediction's accepted / rejected tokens


def message(done: Done, content: str, calls: list[dict], model: str, stop: tuple, openai_usage: dict) -> dict:
    blocks = ([{"type": "text", "text": content}] if content or not calls else []) + [tool_use(c) for c in calls]
    return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": model,
            "content": blocks, "stop_reason": stop[0], "stop_sequence": stop[1], "usage": usage(done, openai_usage)}


def event(kind: str, **data) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


class EventStream:
    """Anthropic's stream of events for one answer: `start()`, then `text()` / `call()` as they come (a text block
    opens on the first text after a call or at the start, each tool_use block is whole), then `end()`."""

    def __init__(self, model: str, prompt_tokens: int):
        self.model, self.prompt_tokens, self.index, self.open = model, prompt_tokens, 0, False

    def start(self) -> str:
        shell = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": self.model,
                 "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}
        return event("message_start", message=shell) + event("ping")

    def text(self, text: str) -> str:
        opened = "" if self.open else event("content_block_start", index=self.index,
                                            content_block={"type": "text", "text": ""})
        self.open = True
        return opened + event("content_block_delta", index=self.index, delta={"type": "text_delta", "text": text})

    def close(self) -> str:
        if not self.open:
            return ""
        self.open, self.index = False, self.index + 1
        return event("content_block_stop", index=self.index - 1)

    def call(self, call: dict) -> str:
        block = tool_use(call)
        out = self.close() + event("content_block_start", index=self.index, content_block={**block, "input": {}})
        out += event("content_block_delta", index=self.index,
                     delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])})
        self.index += 1
        return out + event("content_block_stop", index=self.index - 1)

    def end(self, done: Done, stop: tuple, openai_usage: dict) -> str:
        return (self.close() + event("message_delta", delta={"stop_reason": stop[0], "stop_sequence": stop[1]},
                                     usage=usage(done, openai_usage)) + event("message_stop"))
