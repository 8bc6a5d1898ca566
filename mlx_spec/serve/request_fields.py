"""A request body -> the Job the generation thread runs: OpenAI's fields (messages or prompt, sampling, stop,
max_tokens, seed, tools, response_format) and mlx-spec's (`drafter`, `num_draft`, the native stream's
`draft_len`), each checked with an APIError that names the field at fault; and the `usage` a Done reports."""

from __future__ import annotations

import base64
import binascii
import time
import urllib.parse
from dataclasses import replace

from ..core.events import Done
from ..core.grammar import Grammar
from ..core.prompts import (
    check_messages,
    check_tools,
    image_sources,
    prompt_text,
    render_prompt,
)
from ..core.sampling import MAX_SEED
from ..decode.engine import check_draft_len
from ..seams.errors import SpecError
from .generator import APIError, Job
from .tool_calls import forced_calls, tool_calls_of

FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_tokens": "length"}
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "penalty_window")  # OpenAI's two, then mlx-spec's own


def whole(body: dict, key: str, least: int, default=None, most: int | None = None):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < least or (most is not None and value > most):
        bound = f"from {least} to {most}" if most is not None else f">= {least}"
        raise APIError(400, f"'{key}' must be a whole number {bound}, got {value!r}", key)
    return value


def parse_draft_len(body: dict, key: str) -> int | None:
    draft_len = whole(body, key, 0)
    try:
        check_draft_len(draft_len)
    except SpecError as e:
        raise APIError(400, str(e), key) from None
    return draft_len


def parse_job(body: dict, chat: bool, server, native: bool = False) -> Job:
    """A request body -> Job for `server` (server.Server), or APIError naming the field at fault. OpenAI's fields
    and mlx-spec's (`drafter`, `num_draft`); the native stream's `draft_len` may also be null: the adaptive
    policy."""
    if server.model_id != body.get("model", server.model_id):
        raise APIError(404, f"model {body.get('model')!r} not found: this server serves {server.model_id!r} "
                            "(GET /v1/models)", "model", "model_not_found")
    if whole(body, "n", 1, 1) != 1:
        raise APIError(400, "'n' must be 1: one choice per request", "n")
    tokenizer = server.generator.default.tokenizer
    tools, forced = parse_tools(body, chat, tokenizer)
    if chat:
        vision = server.generator.default.vision is not None
        messages = with_images(body.get("messages")) if vision else body.get("messages")
        try:
            prompt = check_messages(messages, images=vision)
            if image_sources(prompt):  # the images' tokens are counted when the model's processor expands them
                ids = tokenizer.encode(prompt_text(tokenizer, prompt, tools=tools, images=True)[0],
                                       add_special_tokens=False)
            else:  # a conversation the chat template rejects: a 400 now
                ids = render_prompt(tokenizer, prompt, tools=tools)
        except SpecError as e:
            raise APIError(400, f"'messages': {e}", "messages") from None
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        vocab = len(tokenizer.get_vocab())
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                       and 0 <= t < vocab for t in prompt):
            pass  # token ids
        elif not isinstance(prompt, str) or not prompt:
            raise APIError(400, f"'prompt' must be non-empty text, a list of one text, or token ids (0 to {vocab - 1})",
                           "prompt")
        prompt = ids = render_prompt(tokenizer, prompt, raw=True) if isinstance(prompt, str) else prompt
    logprobs = parse_logprobs(body, chat)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise APIError(400, "'stop' must be a text or a list of up to 4 texts", "stop")
    sampling = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    for key, value in sampling.items():  # each on its own, so that an error names its field
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise APIError(400, f"'{key}' must be a number", key)
        try:
            replace(server.defaults, **{key: value})
        except SpecError as e:
            raise APIError(400, str(e), key) from None
    params = replace(server.defaults, **sampling)
    drafter = body.get("drafter")
    if drafter is not None and drafter not in server.generator.default.status().drafters:
        raise APIError(400, f"'drafter' must be one of {', '.join(server.generator.default.status().drafters)}, "
                            f"got {drafter!r}", "drafter")
    if native and "draft_len" in body:
        draft_len = parse_draft_len(body, "draft_len")
    elif (draft_len := parse_draft_len(body, "num_draft")) is None:
        draft_len = server.num_draft
    max_tokens = whole(body, "max_completion_tokens", 1, whole(body, "max_tokens", 1, server.max_tokens))
    seed = whole(body, "seed", 0, 0, MAX_SEED - 1)
    try:
        server.generator.default.check_fits(len(ids), max_tokens)
    except SpecError as e:
        raise APIError(400, str(e), "messages" if chat else "prompt", "context_length_exceeded") from None
    grammar = parse_response_format(body, tokenizer)
    if forced and grammar:
        raise APIError(400, "send either a 'tool_choice' that forces a call or a 'response_format', not both",
                       "tool_choice")
    return Job(prompt, params, max_tokens, stop, seed, drafter, draft_len, time.monotonic() + server.timeout, native,
               tools, len(ids), grammar or forced, logprobs, parse_prediction(body))


def with_images(messages):
    """OpenAI's image parts ({"type": "image_url", "image_url": {"url"}}) as the engine reads them: a data URL's
    bytes, a file URL's path; an APIError for a remote URL (the server fetches nothing) or a malformed one."""
    if not isinstance(messages, list):
        return messages
    return [{**m, "content": [image_part(p) if isinstance(p, dict) and p.get("type") == "image_url" else p
                              for p in m["content"]]}
            if isinstance(m, dict) and isinstance(m.get("content"), list) else m for m in messages]


def image_part(part: dict) -> dict:
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
        try:
            return {"type": "image", "image": base64.b64decode(url.split(";base64,", 1)[1], validate=True)}
        except binascii.Error:
            pass
    elif isinstance(url, str) and url.startswith("file://"):
        return {"type": "image", "image": urllib.parse.unquote(urllib.parse.urlparse(url).path)}
    elif isinstance(url, str) and url.startswith(("http://", "https://")):
        raise APIError(400, "remote image URLs are not fetched (this server makes no requests): send the image as "
                            "a data URL (data:image/png;base64,...)", "messages")
    raise APIError(400, "an image_url must be a data URL (data:image/png;base64,...) or a file URL "
                        "(file:///path/to/image.png)", "messages")


def parse_prediction(body: dict) -> str | None:
    """OpenAI's Predicted Outputs: `prediction` {"type": "content", "content": a text or a list of text parts}
    -> the predicted text (None: none)."""
    given = body.get("prediction")
    if given is None:
        return None
    content = given.get("content") if isinstance(given, dict) and given.get("type") == "content" else None
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise APIError(400, "'prediction' must be {\"type\": \"content\", \"content\": a text or a list of "
                            "{\"type\": \"text\", \"text\"} parts}", "prediction")
    return content or None


def parse_logprobs(body: dict, chat: bool) -> int | None:
    """How many likeliest tokens to report beside each token's log-probability (None: no log-probabilities):
    a chat's `logprobs` (true / false) and `top_logprobs` (0 to 20), a completion's `logprobs` (0 to 5)."""
    if not chat:
        return whole(body, "logprobs", 0, None, 5)
    wanted = body.get("logprobs")
    if wanted not in (None, True, False):
        raise APIError(400, f"'logprobs' must be true or false, got {wanted!r}", "logprobs")
    top = whole(body, "top_logprobs", 0, None, 20)
    if top is not None and not wanted:
        raise APIError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if wanted else None


def parse_response_format(body: dict, tokenizer) -> Grammar | None:
    """OpenAI's `response_format` (`text`, `json_object`, `json_schema` with its `json_schema.schema`) and
    mlx-spec's `regex` / `lark` ({"type": "regex", "regex": "..."}) -> the grammar the output must match."""
    given = body.get("response_format")
    if given is None or given == {"type": "text"}:
        return None
    kind = given.get("type") if isinstance(given, dict) else None
    if kind not in ("json_object", "json_schema", "regex", "lark"):
        raise APIError(400, "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\" | "
                            "\"regex\" | \"lark\"} with its value", "response_format")
    spec = given.get("json_schema")
    value = (spec.get("schema") if isinstance(spec, dict) else None) if kind == "json_schema" else given.get(kind)
    if kind == "json_schema" and value is None:
        raise APIError(400, "'response_format': json_schema needs {\"json_schema\": {\"name\", \"schema\"}}",
                       "response_format")
    try:
        return Grammar(tokenizer, kind, value)
    except SpecError as e:
        raise APIError(400, f"'response_format': {e}", "response_format") from None


def parse_tools(body: dict, chat: bool, tokenizer) -> tuple[list[dict] | None, Grammar | None]:
    """OpenAI's `tools` and `tool_choice` -> (the tools the chat template shows the model, None: none; the
    grammar that forces calls when `tool_choice` is "required" or names a function)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    named = isinstance(choice, dict) and choice.get("type", "function") == "function" and isinstance(
        choice.get("function"), dict) and isinstance(choice["function"].get("name"), str)
    if choice not in (None, "auto", "none", "required") and not named:
        raise APIError(400, f"'tool_choice' must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", "
                            f"\"function\": {{\"name\"}}}}, got {choice!r}", "tool_choice")
    if choice == "none" or not tools:
        return None, None
    if not chat:
        raise APIError(400, "'tools' need a chat: send them to /v1/chat/completions", "tools")
    try:
        tools = check_tools(tools)
        tool_calls_of(tokenizer, tools)
    except SpecError as e:
        raise APIError(400, f"'tools': {e}", "tools") from None
    if choice != "required" and not named:
        return tools, None
    try:
        return tools, Grammar(tokenizer, "lark", forced_calls(tokenizer, tools, choice["function"]["name"]
                                                              if named else None), "the tools' parameters")
    except SpecError as e:
        raise APIError(400, f"'tool_choice': {e}", "tool_choice") from None


def usage(done: Done) -> dict:
    s = done.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated_tokens,
            "total_tokens": s.prompt_tokens + s.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": s.reused_prompt_tokens}, "drafter": s.drafter,
            "draft_n": s.drafted, "draft_n_accepted": s.accepted, "acceptance_rate": s.acceptance_rate,
            "mean_acceptance_length": s.mean_acceptance_length, "decode_tps": s.decode_tps,
            "batch_size": s.batch_size,
            **({"completion_tokens_details": {"accepted_prediction_tokens": s.prediction[0],
                                              "rejected_prediction_tokens": s.prediction[1]}} if s.prediction else {})}
