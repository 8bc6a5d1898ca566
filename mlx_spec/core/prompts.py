"""The one place a prompt becomes what the model reads: a text or a chat (a list of {"role", "content"}), with
the tools it may call, through the model's chat template unless `raw` or the model has none."""

from __future__ import annotations

import json
from pathlib import Path

from ..seams.errors import SpecError
from ..seams.files import read_lines
from .sampling import LIMIT as SAMPLING_LIMIT


def check_messages(messages, images: bool = False) -> list[dict]:
    """The messages as chat templates read them: each content one text (a list of OpenAI text parts,
    {"type": "text", "text"}, joined), an assistant's `tool_calls` with their arguments as objects; a SpecError
    for anything else. With `images`, a content holding image parts ({"type": "image", "image": a path, bytes
    or a PIL image}) stays a list of parts, the image parts the template's placeholders."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise SpecError("messages must be a non-empty list of {\"role\", \"content\": text} objects")
    return [checked_message(m, images) for m in messages]


def image_sources(prompt) -> list:
    """The images of a chat's image parts, in order ([] for a text or token ids)."""
    if not isinstance(prompt, list):
        return []
    parts = [part for message in prompt if isinstance(message, dict) and isinstance(message.get("content"), list)
             for part in message["content"] if isinstance(part, dict) and part.get("type") == "image"]
    if any(part.get("image") is None for part in parts):
        raise SpecError("an image part must be {\"type\": \"image\", \"image\": a file's path or its bytes}")
    return [part["image"] for part in parts]


def content_parts(content) -> list[dict]:
    """A content with image parts as a chat template reads it: text parts and image placeholders, in order."""
    if not all(isinstance(part, dict) for part in content):
        content_text(content)  # its error
    parts = [{"type": "image", "image": part.get("image")} if part.get("type") == "image"
             else {"type": "text", "text": part.get("text")} for part in content]
    content_text([part for part in parts if part["type"] == "text"])  # the text parts, checked
    return parts


def checked_message(message: dict, images: bool = False) -> dict:
    content = message.get("content")
    if images and isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image"
                                                    for p in content):
        return {**message, "content": content_parts(content)}
    if not message.get("tool_calls"):
        return {**message, "content": content_text(content)}
    calls = message["tool_calls"]
    if message.get("role") != "assistant" or not isinstance(calls, list):
        raise SpecError("tool_calls must be a list, in an assistant message")
    checked = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise SpecError("each of an assistant's tool_calls must be {\"type\": \"function\", \"function\": "
                            "{\"name\", \"arguments\"}}")
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                raise SpecError(f"the arguments of tool call {function['name']!r} are not JSON: send a JSON "
                                "object (as text or as an object)") from None
        if not isinstance(arguments, dict):
            raise SpecError(f"the arguments of tool call {function['name']!r} must be a JSON object")
        checked.append({**call, "function": {**function, "arguments": arguments}})
    return {**message, "content": "" if content is None else content_text(content), "tool_calls": checked}


def check_tools(tools) -> list[dict]:
    """OpenAI's `tools`: a list of {"type": "function", "function": {"name", "description"?, "parameters"?}}."""
    if not isinstance(tools, list) or not all(
            isinstance(tool, dict) and tool.get("type", "function") == "function"
            and isinstance(tool.get("function"), dict) and isinstance(tool["function"].get("name"), str)
            and isinstance(tool["function"].get("parameters", {}), dict) for tool in tools):
        raise SpecError("tools must be a list of {\"type\": \"function\", \"function\": {\"name\", "
                        "\"description\", \"parameters\": a JSON schema}} objects")
    return [{"type": "function", **tool} for tool in tools]


def content_text(content) -> str:
    """A message's content as text: a text, or the texts of a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        if other := [part.get("type") for part in content if part.get("type") != "text"]:
            raise SpecError(f"content parts of type {other[0]!r} are not supported: this model reads text only "
                            "(images need a vision-language checkpoint); send text parts")
        if all(isinstance(part.get("text"), str) for part in content):
            return "".join(part["text"] for part in content)
    raise SpecError("a message's content must be text or a list of {\"type\": \"text\", \"text\"} parts")


def prompt_text(tokenizer, prompt: str | list[dict], raw: bool = False, tools: list[dict] | None = None,
                images: bool = False) -> tuple[str, bool]:
    """(the text the model reads, whether the chat template made it). Without a template (or with `raw`) a
    text is used as it is and a chat's contents are joined by newlines; `tools` need the template; `images`:
    a chat's image parts become the template's placeholders (see `check_messages`), which need the template."""
    if tools and (raw or not getattr(tokenizer, "has_chat_template", False)):
        raise SpecError("tools need the model's chat template, and this model has none (or the prompt is raw): "
                        "drop 'tools'")
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
        if raw or not getattr(tokenizer, "has_chat_template", False) or not prompt.strip():
            return prompt, False
    else:
        messages = check_messages(prompt, images)
        if images and (raw or not getattr(tokenizer, "has_chat_template", False)):
            raise SpecError("images need the model's chat template to place them, and this model has none (or the "
                            "prompt is raw): use the checkpoint's own tokenizer files")
        if raw or not getattr(tokenizer, "has_chat_template", False):
            return "\n".join(m["content"] for m in messages), False
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             **({"tools": tools} if tools else {})), True
    except Exception as e:  # jinja templates raise their own errors for conversations they do not accept
        raise SpecError(f"the model's chat template rejects this conversation ({e}): fix the messages or pass "
                        "the prompt raw") from None


def render_prompt(tokenizer, prompt: str | list[dict], raw: bool = False,
                  tools: list[dict] | None = None) -> list[int]:
    """The token ids the model reads for `prompt`: a templated text carries its own special tokens, a raw one
    gets the tokenizer's usual ones (e.g. a BOS)."""
    if not isinstance(prompt, (str, list)):
        raise SpecError(f"a prompt must be text or a list of messages, not {type(prompt).__name__}")
    if prompt == "":
        raise SpecError("the prompt is empty: give some text to continue")
    text, templated = prompt_text(tokenizer, prompt, raw, tools)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: undecodable bytes in an argument, or "\ud800" in JSON
        raise SpecError("the prompt is not valid Unicode (undecodable bytes or a lone surrogate): give UTF-8 "
                        "text") from None
    ids = tokenizer.encode(text, add_special_tokens=not templated)
    if not ids:
        raise SpecError("the prompt is empty: give some text to continue")
    return ids


PASSAGE = ("The Gated DeltaNet layer keeps a fixed-size recurrent state instead of a key-value cache. Each new "
           "token decays the state, reads what the state predicts for the token's key, and writes back the "
           "difference between that prediction and the token's value, scaled by a learned step size. Because "
           "the state does not grow, memory stays constant however long the context becomes, which is why "
           "hybrid models interleave three such layers with one full-attention layer.")

# Spec-Bench's spirit: the kinds of work where drafting is known to help, and where it is known not to.
SUITES = {
    "spec": {
        "code": (0.0, ["Write a Python function that parses an ISO 8601 date string and returns a datetime.",
                       "Complete this code:\ndef binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n"]),
        "extraction": (0.0, [f"List every technical term in this passage, one per line:\n{PASSAGE}",
                             "From 'Order #4411 shipped to Ada Lovelace, 12 St James Sq, London, on 2026-03-02' "
                             "extract the order number, name, city and date."]),
        "json": (0.0, ["Return a JSON object with keys name, language, stars and topics describing the "
                       "project mlx-lm.", "Convert to JSON: name Ada, age 36, languages Python and C, city "
                       "London."]),
        "summarisation": (0.0, [f"Summarise in two sentences:\n{PASSAGE}",
                                "Answer from the passage only: why do hybrid models keep memory constant?\n"
                                + PASSAGE]),
        "chat": (0.0, [[{"role": "user", "content": "What is speculative decoding?"},
                        {"role": "assistant", "content": "A way to generate several tokens per forward pass of a "
                                                         "large model, using a cheap drafter."},
                        {"role": "user", "content": "When does it not help?"}]]),
        "math": (0.0, ["A train leaves at 9:40 and arrives at 13:05. How long is the journey? Think step by step.",
                       "Solve for x: 3x + 7 = 2x - 5. Show each step."]),
        "creative": (1.0, ["Write a short poem about a lighthouse keeper who collects lost words.",
                           "Invent a myth that explains why cats sit in boxes."]),
    },
}
SUITES["quick"] = {name: (temp, prompts[:1]) for name, (temp, prompts) in SUITES["spec"].items()}
# The kinds of work a chat sees, three prompts each, written for mlx-spec: open writing, rewriting, translation,
# short factual questions, questions over a given passage, summaries, math word problems, code, multi-turn chat.
WORK = Path(__file__).with_name("work.jsonl")


def load_prompts(suite: str | None, prompts_file: str | None) -> dict:
    """{category: (temperature, [prompt or messages])} from a built-in suite or a JSONL file whose lines hold
    a "prompt" or "messages", an optional "category" and "temperature"."""
    if prompts_file is None and suite == "work":
        prompts_file = str(WORK)
    if prompts_file is None:
        if (suite or "spec") not in SUITES:
            raise SpecError(f"unknown suite {suite!r}: choose one of {', '.join([*SUITES, 'work'])}")
        return SUITES[suite or "spec"]
    categories: dict = {}
    for number, line in enumerate(read_lines(prompts_file, "a JSONL file of prompts"), start=1):
        if not line.strip():
            continue
        where = f"{prompts_file}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
            raise SpecError(f"{where}: needs a JSON object with one of \"prompt\" and \"messages\"")
        prompt = item.get("prompt", item.get("messages"))
        if not (isinstance(prompt, str) and prompt) and not isinstance(prompt, list):
            raise SpecError(f"{where}: \"prompt\" must be non-empty text")
        if isinstance(prompt, list):
            try:
                check_messages(prompt)
            except SpecError as e:
                raise SpecError(f"{where}: {e}") from None
        temperature, category = item.get("temperature", 0.0), item.get("category", "custom")
        if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                or not (temperature == 0 or 1 / SAMPLING_LIMIT <= temperature < 100)):
            raise SpecError(f"{where}: \"temperature\" must be 0 or a number from {1 / SAMPLING_LIMIT:g} to 100, "
                            f"got {temperature!r}")
        if not isinstance(category, str):
            raise SpecError(f"{where}: \"category\" must be text, got {category!r}")
        categories.setdefault(category, (float(temperature), []))[1].append(prompt)
    if not categories:
        raise SpecError(f"{prompts_file} holds no prompts")
    return categories
