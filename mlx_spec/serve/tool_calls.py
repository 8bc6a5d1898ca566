"""Tool calls in a model's output, in OpenAI's shape, as the text streams.

Each model family writes its calls its own way (Qwen's `<tool_call>{"name", "arguments"}</tool_call>`, Qwen3.5's
`<function=...>` XML, Gemma 4's `<|tool_call>call:...`, ...); mlx-lm keeps one parser a family and picks it from
the chat template (compat.tool_call_format); Llama 3.x's bare `{"name", "parameters"}` answers, which mlx-lm
does not read, are read here (`parse_llama3`). `ToolCallStream` splits the text between the family's markers from
the content around it and parses each call as soon as its end marker arrives.
"""

from __future__ import annotations

import json
import uuid

from ..seams.compat import tool_call_format
from ..seams.errors import SpecError


def tool_calls_of(tokenizer, tools: list[dict]):
    """A stream that finds the calls of `tools` in this model's output (`ToolCallStream`, or `JSONAnswerStream`
    for Llama 3.x); a SpecError when the model's chat template has no tool calling."""
    start, end, parse, kind = call_format(tokenizer)
    return JSONAnswerStream(parse, tools) if kind == "llama3_json" else ToolCallStream(start, end, parse, tools)


def is_llama3_json(template) -> bool:
    """Whether a chat template is Llama 3.1 / 3.2 / 3.3's with JSON tool calls (`{"name", "parameters"}`, tool
    results in `ipython` turns), which mlx-lm has no parser for."""
    return isinstance(template, str) and all(mark in template for mark in (
        "<|start_header_id|>", "ipython", '"parameters"'))


def parse_llama3(text: str, tools=None):
    """Llama 3.x calls: `{"name", "parameters"}` objects (after an optional <|python_tag|>), one or several
    separated by ';' or blanks; a ValueError for anything else."""
    text, decoder, calls = text.strip().removeprefix("<|python_tag|>").strip(), json.JSONDecoder(), []
    at = 0
    while at < len(text):
        call, at = decoder.raw_decode(text, at)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ValueError(f"not a tool call: {call!r}")
        calls.append({"name": call["name"], "arguments": call.get("parameters", call.get("arguments", {}))})
        while at < len(text) and text[at] in "; \n\t":
            at += 1
    if not calls:
        raise ValueError("no tool call")
    return calls[0] if len(calls) == 1 else calls


def call_format(tokenizer) -> tuple:
    found = tool_call_format(tokenizer)
    if found is None and is_llama3_json(getattr(tokenizer, "chat_template", None)):
        return None, None, parse_llama3, "llama3_json"
    if found is None:
        raise SpecError("this model's chat template has no tool calling: drop 'tools', or serve a model whose "
                        "template has (Qwen 2.5 / 3 / 3.5, Gemma 4, Mistral, GLM, ...)")
    return found


def forced_calls(tokenizer, tools: list[dict], name: str | None = None) -> str:
    """A Lark grammar (llguidance's, `%json` for the JSON parts) of answers that are nothing but calls of `tools`
    (of the one named `name`), in the model family's format: what `tool_choice` "required" or a named function
    asks for. Written for the `<tool_call>{"name", "arguments"}</tool_call>` JSON format (Qwen 2.5 / 3 and
    others mlx-lm reads with json_tools); a SpecError for other formats and unknown names."""
    start, end, _, kind = call_format(tokenizer)
    if kind != "json_tools":
        raise SpecError(f"forcing a tool call is supported for the <tool_call> JSON format (Qwen 2.5 / 3), not this "
                        f"model's {kind} format: send tool_choice \"auto\"")
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise SpecError(f"tool_choice names {name!r}, which is not among the tools: name one of "
                        f"{', '.join(t['function']['name'] for t in tools)}")
    schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                          "arguments": f.get("parameters") or {"type": "object"}},
                         "required": ["name", "arguments"], "additionalProperties": False} for f in chosen],
              "x-guidance": {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}}
    vocab = tokenizer.get_vocab()
    marker = {m: m if m in vocab else json.dumps(m) for m in (start, end)}  # a token of its own, or text
    return (f'start: call ("\\n" call)*\ncall: {marker[start]} "\\n" body "\\n" {marker[end]}\n'
            f"body: %json {json.dumps(schema)}")


class ToolCallStream:
    """`feed(text)` -> what can be shown now: content texts and OpenAI tool calls ({"id", "type": "function",
    "function": {"name", "arguments": JSON text}}), in order; `close()` -> the rest. Text that may begin a start
    marker waits for the next piece; a call that does not parse stays in the content, markers and all, and so
    does one left open at the end that does not parse. Blank text next to a call is dropped. A family without an
    end marker (Mistral's `[TOOL_CALLS]`) calls to the end of the answer."""

    def __init__(self, start: str, end: str, parse, tools: list[dict]):
        self.start, self.end, self.parse, self.tools = start, end, parse, tools
        self.pending, self.inside, self.blank, self.before = "", False, "", ""
        self.after_call = False

    def feed(self, text: str) -> list[str | dict]:
        self.pending += text
        out = []
        while True:
            if self.inside:
                at = self.pending.find(self.end) if self.end else -1  # no end marker (Mistral): calls to the end
                if at < 0:
                    return out
                out += self.called(self.pending[:at])
                self.pending, self.inside = self.pending[at + len(self.end):], False
                continue
            at = self.pending.find(self.start)
            if at >= 0:
                self.content(out, self.pending[:at])
                self.before, self.blank = self.blank, ""  # dropped if what follows is a call
                self.pending, self.inside = self.pending[at + len(self.start):], True
                continue
            keep = next((k for k in range(min(len(self.start) - 1, len(self.pending)), 0, -1)
                         if self.start.startswith(self.pending[-k:])), 0)
            self.content(out, self.pending[:len(self.pending) - keep])
            self.pending = self.pending[len(self.pending) - keep:]
            return out

    def close(self) -> list[str | dict]:
        out = []
        if self.inside:
            out += self.called(self.pending, ended=False)
        else:
            self.content(out, self.pending)
        if self.blank and not self.after_call:  # the end of content, not the blank after a call
            out.append(self.blank)
        self.pending, self.inside, self.blank = "", False, ""
        return out

    def content(self, out: list, text: str) -> None:
        """Blank text waits until something else follows it (blank before or after a call is dropped), so that
        the content is the same however the text was cut."""
        text = self.blank + text
        shown = text.rstrip()
        self.blank = text[len(shown):]
        if shown:
            out.append(shown.lstrip() if self.after_call else shown)
            self.after_call = False

    def called(self, text: str, ended: bool = True) -> list[str | dict]:
        try:
            parsed = self.parse(text, self.tools)
            parsed = parsed if isinstance(parsed, list) else [parsed]
            calls = [openai_call(call) for call in parsed]
        except (ValueError, KeyError, TypeError, AttributeError):  # not a call after all: keep the text
            return [self.before + self.start + text + (self.end if ended else "")]
        self.after_call = True
        return calls


class JSONAnswerStream:
    """`ToolCallStream` for families whose calls are the whole answer, without markers (Llama 3.x): an answer that
    begins with `{` (after blanks and an optional <|python_tag|>) is held to the end and parsed then (kept as the
    content when it does not parse); any other answer streams as content, as it comes."""

    TAG = "<|python_tag|>"

    def __init__(self, parse, tools: list[dict]):
        self.parse, self.tools, self.held, self.mode = parse, tools, "", None  # mode: None, "call" or "content"

    def feed(self, text: str) -> list[str | dict]:
        if self.mode == "content":
            return [text] if text else []
        self.held += text
        head = self.held.lstrip()
        if self.mode == "call" or not head or (self.TAG.startswith(head) and head != self.TAG):
            return []  # a call, or not known yet
        if head.removeprefix(self.TAG).lstrip().startswith("{"):
            self.mode = "call"
            return []
        if not head.removeprefix(self.TAG).strip():
            return []
        self.mode, out, self.held = "content", [self.held], ""
        return out

    def close(self) -> list[str | dict]:
        held, self.held = self.held, ""
        if self.mode == "call":
            try:
                parsed = self.parse(held, self.tools)
                return [openai_call(call) for call in (parsed if isinstance(parsed, list) else [parsed])]
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
        return [held] if held else []


def openai_call(call: dict) -> dict:
    name, arguments = call["name"], call.get("arguments", {})
    if not isinstance(name, str) or not isinstance(arguments, (dict, str)):
        raise ValueError(f"not a tool call: {call!r}")
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments if isinstance(arguments, str)
                         else json.dumps(arguments, ensure_ascii=False)}}


def split_calls(stream: ToolCallStream, text: str) -> tuple[str, list[dict]]:
    """A whole answer's (content, OpenAI tool calls)."""
    pieces = stream.feed(text) + stream.close()
    return "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, dict)]
