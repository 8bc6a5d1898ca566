"""The prompt cache across conversations on real weights: time to first token of a returning turn, cached and cold.

    python scripts/bench_prompt_cache.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
                                         [--conversations 2 8] [--tokens 8]

Conversations as an agent holds them: each opens on a file of mlx-spec's own source (about 400 tokens) and a
question, and asks one more question once it has an answer. All first turns run, then every conversation's next
turn, in the same order, so each returning turn finds another conversation in the target's cache. Cold: no prompt
cache (`Engine.cache_prompts(0)`): a returning turn runs its whole prompt again. Cached: a budget of 4 GB. Both
decode one sequence at a time (`Engine.stream`, what the server does with --batch-size 1) and as a batch row
(`Engine.stream_many`, the server's default), interleaved in one process after an untimed warm-up. Prints the
median time to first token of the returning turns, the ratio, the prompt tokens reused, whether the answers
were the same with and without the cache, the stored bytes, and whether the machine was quiet. Float32 weights
from `scripts/real_models.py`. Every run's own time to first token goes out as a raw-timings line
(scripts/timings.py), which scripts/record.py keeps apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.decode.rounds import Job  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from timings import raw_line  # noqa: E402
from mlx_spec.core.events import Done, Token  # noqa: E402

SOURCES = ["decode/engine.py", "seams/caches.py", "runners/target.py", "core/verify.py", "core/sampling.py",
           "policy/sequence.py", "runners/ragged.py", "serve/server.py"]
SOURCE = Path(mlx_spec.__file__).parent
BUDGET = 4_000_000_000


def opening(i: int, chars: int = 1400) -> list[dict]:
    text = (SOURCE / SOURCES[i % len(SOURCES)]).read_text()[:chars]
    return [{"role": "user", "content": f"Here is the start of a file:\n```python\n{text}\n```\nWhat is it for?"}]


def first_token(events) -> tuple[float, list[int], int]:
    """(seconds to the first token, the tokens, prompt tokens reused) of a generation's events."""
    start, ttft = time.perf_counter(), None
    for event in events:
        if isinstance(event, Token) and ttft is None:
            ttft = time.perf_counter() - start
        if isinstance(event, Done):
            return ttft, event.tokens, event.stats.reused_prompt_tokens
    raise RuntimeError("no Done event")


def turn(engine, chat: list[dict], tokens: int, batched: bool) -> tuple[float, list[int], int]:
    if not batched:
        return first_token(engine.stream(chat, max_tokens=tokens))
    prompt, rendered = engine.encode_chat(chat)
    jobs = [("row", Job(prompt, max_tokens=tokens))]
    events = (event for _, event in engine.stream_many(lambda: jobs.pop() if jobs else None, 8))
    result = first_token(events)
    text = engine.tokenizer.decode(result[1])
    engine.remember_chat(rendered, prompt, Done("max_tokens", text, result[1], None))
    return result


def conversations(engine, count: int, tokens: int, batched: bool) -> list[tuple[float, list[int], int]]:
    """Every conversation's first turn, then every one's next; returns the next turns' (TTFT, tokens, reused)."""
    chats = [opening(i) for i in range(count)]
    for chat in chats:
        answer = turn(engine, chat, tokens, batched)[1]
        chat += [{"role": "assistant", "content": engine.tokenizer.decode(answer)},
                 {"role": "user", "content": "Which function in it would you test first, and why?"}]
    return [turn(engine, chat, tokens, batched) for chat in chats]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", choices=sorted(real_models.MODELS))
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="a draft model of the same vocabulary, or "
                                                                        "'none'")
    parser.add_argument("--conversations", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--tokens", type=int, default=8, help="tokens each answer runs to")
    args = parser.parse_args()
    target, draft = real_models.converted("bench_prompt_cache", args.target, args.draft)
    engine = mlx_spec.load(str(target), draft_model=str(draft) if draft else None, draft_len=None)
    print(f"{args.target}{f' + {args.draft} draft model' if draft else ''}, float32, {linux_blas.describe()}; "
          f"conversations of {len(engine.encode(opening(0)))} prompt tokens and up to {args.tokens} answer tokens, "
          f"greedy")
    rows, identical, stored = [], True, 0
    with Neighbours() as neighbours:
        conversations(engine, 1, args.tokens, False)  # untimed warm-up
        for count in args.conversations:
            for batched in (False, True):
                runs = {}
                for mode in ("cold", "cached"):
                    engine.cache_prompts(BUDGET if mode == "cached" else 0)
                    runs[mode] = conversations(engine, count, args.tokens, batched)
                    stored = max(stored, engine.prompt_cache.nbytes if engine.prompt_cache else 0)
                identical &= [r[1] for r in runs["cold"]] == [r[1] for r in runs["cached"]]
                for mode, turns in runs.items():
                    print(raw_line(f"{count} conversations, {'batch row' if batched else 'alone'}, {mode}",
                                   "s to first token", [r[0] for r in turns]), flush=True)
                cold, cached = (statistics.median(r[0] for r in runs[mode]) for mode in ("cold", "cached"))
                reused = statistics.median(r[2] for r in runs["cached"])
                rows.append((count, "batch row" if batched else "alone", cold, cached, reused,
                             statistics.median(r[2] for r in runs["cold"])))
    reliable, note = neighbours.verdict()
    print("| conversations | decoded | returning turn's time to first token, cold | cached | saved | "
          "prompt tokens reused (cached / cold) |")
    print("|---|---|---|---|---|---|")
    for count, path, cold, cached, reused, reused_cold in rows:
        print(f"| {count} | {path} | {cold:.2f} s | {cached:.2f} s | {cold / cached:.1f}x | "
              f"{reused:.0f} / {reused_cold:.0f} |")
    print(f"answers the same with and without the prompt cache: {'yes' if identical else 'NO'}; "
          f"stored at most {stored / 1e6:.0f} MB of the {BUDGET / 1e9:.0f} GB budget")
    print(note)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
