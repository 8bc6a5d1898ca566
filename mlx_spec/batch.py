"""Scripted batch generation: JSONL requests in, JSONL results out, resumable, nothing torn.

Each input line is an object with an `id` and either a `prompt` (text, sent through the chat template
unless `"raw": true`) or chat `messages`, plus optional `max_tokens`, `stop`, `seed` and sampling fields
(`temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`, `presence_penalty`, `frequency_penalty`).
Each result line holds `id`, `text`, `stop_reason` and the statistics of that generation. A result is written
in one `write` and flushed to disk before the next item starts; a rerun skips ids already in the output and
first drops a torn last line left by a crash.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator

from .engine import Engine
from .errors import SpecError
from .sampling import SamplingParams

SAMPLING_FIELDS = {f.name for f in fields(SamplingParams)}
KNOWN_FIELDS = SAMPLING_FIELDS | {"id", "prompt", "messages", "raw", "max_tokens", "stop", "seed"}


@dataclass
class Request:
    id: str
    prompt: str | list[int]
    params: SamplingParams
    max_tokens: int
    stop: list[str]
    seed: int


def parse_request(line: str, engine: Engine, default_max_tokens: int) -> Request:
    """One input line -> Request, or SpecError saying what is wrong with it."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise SpecError(f"not valid JSON ({e.msg})") from None
    if not isinstance(item, dict) or "id" not in item:
        raise SpecError("needs an object with an \"id\"")
    if unknown := sorted(set(item) - KNOWN_FIELDS):
        raise SpecError(f"unknown field(s) {', '.join(unknown)}")
    if ("prompt" in item) == ("messages" in item):
        raise SpecError("needs exactly one of \"prompt\" and \"messages\"")
    messages = item.get("messages") or [{"role": "user", "content": item["prompt"]}]
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "content" in m for m in messages):
        raise SpecError("\"messages\" must be a list of {\"role\", \"content\"} objects")
    if "prompt" in item and (item.get("raw") or not engine.tokenizer.has_chat_template):
        prompt = item["prompt"]
    else:
        prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    try:
        params = SamplingParams(**{k: v for k, v in item.items() if k in SAMPLING_FIELDS})
        return Request(str(item["id"]), prompt, params, int(item.get("max_tokens", default_max_tokens)),
                       list(item.get("stop", [])), int(item.get("seed", 0)))
    except (TypeError, ValueError) as e:
        raise SpecError(f"bad parameter ({e})") from None


def finished_ids(output: Path) -> set[str]:
    """Ids already in the output; a torn last line (a crash mid-write) is cut off first."""
    if not output.exists():
        return set()
    data = output.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(output, "r+b") as f:
            f.truncate(end)
    return {json.loads(line)["id"] for line in data[:end].decode().splitlines() if line.strip()}


def run(engine: Engine, input_path: str | Path, output_path: str | Path, max_tokens: int = 256,
        progress: bool = True) -> Iterator[dict]:
    """Generate every request of `input_path` not yet in `output_path`; yields each result as it is written,
    and {"error": ..., "line": n} for each bad input line (which is skipped)."""
    output = Path(output_path)
    done = finished_ids(output)
    lines = Path(input_path).read_text().splitlines()
    todo = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            request = parse_request(line, engine, max_tokens)
        except SpecError as e:
            yield {"line": number, "error": str(e)}
            continue
        if request.id not in done:
            todo.append(request)
            done.add(request.id)  # a repeated id is generated once
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), unit="item", desc="batch", dynamic_ncols=True)
    with open(output, "ab") as out:
        for request in todo:
            result = engine.generate(request.prompt, request.params, request.max_tokens, request.stop, request.seed)
            record = {"id": request.id, "text": result.text, "stop_reason": result.stop_reason,
                      "stats": result.stats.to_dict()}
            out.write((json.dumps(record) + "\n").encode())  # one write per result: no interleaved halves
            out.flush()
            os.fsync(out.fileno())
            if bar:
                bar.update(1)
                bar.set_postfix_str(f"{result.stats.decode_tps:.0f} tok/s, {result.stats.drafter} "
                                    f"acceptance {result.stats.acceptance_rate:.0%}")
            yield record
    if bar:
        bar.close()
