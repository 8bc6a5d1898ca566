"""Scripted batch generation: JSONL requests in, JSONL results out, resumable, nothing torn.

Each input line is an object with an `id` (a text or a number, its own) and either a `prompt` (text, sent
through the chat template unless `"raw": true`) or chat `messages` (a vision-language model's with image parts,
`{"type": "image", "image": a path}`), plus optional `max_tokens`, `stop`, `seed`
and sampling fields (`temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`, `presence_penalty`,
`frequency_penalty`). A line that is not such an object, repeats an id or does not fit the model's context is
skipped, with a message. Each result line holds `id` (as given), `text`, `stop_reason` and the statistics of
that generation. A result is written
in one `write` and flushed to disk before the next item starts; a rerun skips ids already in the output and
first drops a torn last line left by a crash.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator

from ..core.prompts import image_sources, render_prompt
from ..core.sampling import MAX_SEED, SamplingParams
from ..decode.engine import Engine
from ..decode.rounds import Job
from ..seams.errors import SpecError
from ..seams.files import check_writable, read_lines

SAMPLING_FIELDS = {f.name for f in fields(SamplingParams)}
KNOWN_FIELDS = SAMPLING_FIELDS | {"id", "prompt", "messages", "raw", "max_tokens", "stop", "seed", "prediction"}


@dataclass
class Request:
    id: str | int  # as the input line gives it
    line: int
    job: Job  # what the engine decodes (its draft length the engine's: its pin or the batch's policy)


def whole_number(item: dict, key: str, default: int, least: int) -> int:
    value = item.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SpecError(f"\"{key}\" must be a whole number >= {least}, got {value!r}")
    return value


def parse_request(line: str, number: int, engine: Engine, default_max_tokens: int,
                  defaults: SamplingParams = SamplingParams(), default_seed: int = 0) -> Request:
    """One input line -> Request, or SpecError saying what is wrong with it."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 (read_lines keeps them as lone surrogates)
        raise SpecError("not UTF-8 text: save the file as UTF-8") from None
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise SpecError(f"not valid JSON ({e.msg})") from None
    if not isinstance(item, dict) or not isinstance(item.get("id"), (str, int)) or isinstance(item["id"], bool):
        raise SpecError("needs an object with an \"id\" (text or a number)")
    if unknown := sorted(set(item) - KNOWN_FIELDS):
        raise SpecError(f"unknown field(s) {', '.join(unknown)}")
    if ("prompt" in item) == ("messages" in item):
        raise SpecError("needs exactly one of \"prompt\" and \"messages\"")
    if "prompt" in item and not isinstance(item["prompt"], str):
        raise SpecError(f"\"prompt\" must be text, got {type(item['prompt']).__name__}")
    stop = item.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise SpecError("\"stop\" must be a list of strings")
    if not isinstance(item.get("raw", False), bool):
        raise SpecError("\"raw\" must be true or false")
    if not isinstance(item.get("prediction", ""), str):
        raise SpecError(f"\"prediction\" must be text, got {type(item['prediction']).__name__}")
    sampling = {k: v for k, v in item.items() if k in SAMPLING_FIELDS}
    if bad := [k for k, v in sampling.items() if isinstance(v, bool) or not isinstance(v, (int, float))]:
        raise SpecError(f"{', '.join(bad)} must be numbers")
    try:
        params = dataclasses.replace(defaults, **sampling)
    except (TypeError, ValueError) as e:
        raise SpecError(f"bad parameter ({e})") from None
    if (seed := whole_number(item, "seed", default_seed, 0)) >= MAX_SEED:
        raise SpecError(f"\"seed\" must be below 2**64, got {seed}")
    given, images = item.get("prompt", item.get("messages")), None
    if image_sources(given):  # image parts: {"type": "image", "image": a path}, as the Python API takes them
        if item.get("raw"):
            raise SpecError("images need the chat template to place them: drop \"raw\"")
        prompt, _, images = engine.encode_chat(given)
    else:
        prompt = render_prompt(engine.tokenizer, given, raw=item.get("raw", False))
    max_tokens = whole_number(item, "max_tokens", default_max_tokens, 1)
    engine.check_fits(len(prompt), max_tokens)
    return Request(item["id"], number, Job(prompt, params, max_tokens, tuple(stop), seed, images=images,
                                           prediction=engine.encode_prediction(item.get("prediction"))))


def check_paths(input_path: str | Path, output_path: str | Path) -> None:
    """Refuse unusable input or output files before any model is loaded."""
    read_lines(input_path, keep_undecodable=True)
    check_writable(output_path, "-o")
    if Path(output_path).exists() and Path(output_path).samefile(input_path):
        raise SpecError(f"-o {output_path} is the input file: give the results a file of their own")
    finished_ids(Path(output_path), dry_run=True)


def finished_ids(output: Path, dry_run: bool = False, notice=None) -> set[str | int]:
    """Ids already in the output; a torn last line (a crash mid-write) is cut off first, and `notice(why)` told
    (not when `dry_run`)."""
    if not output.exists():
        return set()
    try:
        data = output.read_bytes()
    except OSError as e:
        raise SpecError(f"cannot read -o {output} ({e.strerror}): give a file that can be read and written") from None
    end = data.rfind(b"\n") + 1
    ids = set()
    for number, line in enumerate(data[:end].decode("utf-8", errors="replace").splitlines(), start=1):
        try:
            ids.add(json.loads(line)["id"] if line.strip() else None)
        except (json.JSONDecodeError, TypeError, KeyError):
            raise SpecError(f"{output}:{number} is not a result line of mlx-spec batch: give -o a new file or "
                            "one that an earlier batch run wrote") from None
    if end < len(data) and not dry_run:
        with open(output, "r+b") as f:
            f.truncate(end)
        if notice:
            notice(f"dropped the torn last line of {output} (a run cut short while writing it); its request runs "
                   "again")
    return ids - {None}


def run(engine: Engine, input_path: str | Path, output_path: str | Path, max_tokens: int = 256,
        progress: bool = True, defaults: SamplingParams = SamplingParams(), seed: int = 0,
        batch_size: int | None = None, notice=None) -> Iterator[dict]:
    """Generate every request of `input_path` not yet in `output_path`; yields each result as it is written
    (in the order they finish), and {"error": ..., "line": n} for each bad input line or failed request (which is
    skipped). `defaults`, `seed`: sampling and seed for the requests that set none. `batch_size`: requests decoded
    together; None: the largest that fits in memory, or 1 where this engine cannot batch. `notice(line)` is told
    that, a torn last line dropped from the output, and that nothing is left to do. A batch that cannot start
    fails whole (SpecError)."""
    check_paths(input_path, output_path)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise SpecError(f"--batch-size must be a whole number >= 1, got {batch_size!r}")
    output = Path(output_path)
    done = finished_ids(output, notice=notice)
    todo, lines = [], {}
    for number, line in enumerate(read_lines(input_path, keep_undecodable=True), start=1):
        if not line.strip():
            continue
        try:
            request = parse_request(line, number, engine, max_tokens, defaults, seed)
        except SpecError as e:
            yield {"line": number, "error": str(e)}
            continue
        if request.id in lines:
            yield {"line": number, "error": f"the id {request.id!r} is on line {lines[request.id]} already: give "
                                            "each request its own id"}
            continue
        lines[request.id] = number
        if request.id not in done:
            todo.append(request)
    if not todo:
        if notice and lines:
            notice(f"nothing left to generate: {output} holds a result for every request")
        return
    problem = engine.batch_problem()
    if batch_size is None:
        batch_size = 1 if problem or not todo else min(len(todo), engine.largest_batch(
            max(len(r.job.prompt) + r.job.max_tokens for r in todo)))
        if problem and len(todo) > 1 and notice:
            notice(f"one request at a time: {problem}")
    elif batch_size > 1 and problem:
        raise SpecError(f"--batch-size {batch_size}: {problem}; use --batch-size 1")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), unit="item", desc=f"batch of {batch_size}", dynamic_ncols=True)
    start, tokens = time.perf_counter(), 0
    with open(output, "ab") as out:
        for index, result in engine.generate_many([request.job for request in todo], batch_size):
            request = todo[index]
            record = {"id": request.id, "text": result.text, "stop_reason": result.stop_reason,
                      "stats": result.stats.to_dict()}
            out.write((json.dumps(record) + "\n").encode())  # one write per result: no interleaved halves
            out.flush()
            os.fsync(out.fileno())
            tokens += result.stats.generated_tokens
            if bar:
                bar.update(1)
                speed = tokens / (time.perf_counter() - start)
                bar.set_postfix_str(f"{speed:.0f} tok/s in all, {result.stats.drafter} "
                                    f"acceptance {result.stats.acceptance_rate:.0%}")
            yield record
    if bar:
        bar.close()
