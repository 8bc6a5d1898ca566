"""Suffix decoding on agent-like work, on real weights: plain decoding, n-gram and suffix drafting (both under the
adaptive policy), interleaved request by request in one process, greedy, every output checked against plain.

    python scripts/bench_suffix.py [--model qwen2.5-coder-1.5b --tool-calls 10 --edits 5 --controls 3 --tokens 64]

The workloads come from the model's own outputs, no data set needed:
  tool calls  a tool-calling loop: each request asks for one call of a fixed JSON schema (weather, stocks, ...)
  edits       repeated edits: "rewrite this function with one change", each round fed the previous answer
  control     plain code prompts, nothing repeated
The suffix drafter keeps one index over all of them, in order (as `serve` does); n-gram sees each request alone.
Prints, per workload, decode tok/s and the ratio to plain for each, suffix over n-gram, acceptance, and the
suffix drafter's own cost per round (lookup and update, microseconds) against a plain decode step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx_spec  # first, before mlx: it points MLX at the system OpenBLAS on Linux

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from mlx_spec.drafters.suffix import BUDGET, SuffixIndex  # noqa: E402
from mlx_spec.core.sampling import SamplingParams  # noqa: E402

TOOL = ("You can call one tool, `lookup`, by answering with JSON only, exactly of this form: "
        '{"tool": "lookup", "arguments": {"kind": "<weather|stock|flight|train|hotel>", "query": "<text>", '
        '"date": "<YYYY-MM-DD>", "limit": <number>}}')
ASKS = ["the weather in Paris tomorrow", "the Apple stock price today", "flights from Oslo to Rome on 2026-03-02",
        "trains from Berlin to Munich next Monday", "a hotel in Kyoto for 2026-05-10", "the weather in Lima today",
        "the Nvidia stock price on 2026-01-15", "flights from Lisbon to Madrid tomorrow", "three hotels in Seoul",
        "trains from Milan to Turin on 2026-04-01", "the weather in Cairo on 2026-07-04", "the Tesla stock today"]
FUNCTION = '''def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    averages = []
    for i in range(len(values) - window + 1):
        chunk = values[i:i + window]
        averages.append(sum(chunk) / window)
    return averages
'''
CHANGES = ["rename `values` to `series`", "raise ValueError when window is not positive", "add type hints",
           "use a running sum instead of slicing", "return a tuple instead of a list", "add a doctest example"]
CONTROLS = ["Write a Python function that checks whether a string is a palindrome.",
            "Write a Python class for a bounded FIFO queue with push and pop.",
            "Write a Python function that merges two sorted lists.",
            "Write a Python function that counts word frequencies in a text file."]


def rate(engine, messages, tokens: int) -> tuple[list[int], float, float]:
    """Tokens, decode tok/s (first token to last) and acceptance of one greedy generation."""
    result = engine.generate(messages, SamplingParams(), tokens)
    return result.tokens, result.stats.decode_tps, result.stats.acceptance_rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", choices=sorted(real_models.MODELS))
    parser.add_argument("--tool-calls", type=int, default=10)
    parser.add_argument("--edits", type=int, default=5)
    parser.add_argument("--controls", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    path = real_models.mlx_dir(args.model)
    if not path.exists():
        print(f"fetch the model first: python scripts/real_models.py {args.model}")
        return 2
    plain = mlx_spec.load(str(path), drafter="off")
    engines = {"plain": plain, "ngram": plain.with_drafter("ngram"), "suffix": plain.with_drafter("suffix")}
    print(f"target {path.name}, float32, BLAS: {linux_blas.describe()}; greedy, up to {args.tokens} tokens a request",
          flush=True)
    rows, cost = [], []
    with Neighbours() as neighbours:
        engines["plain"].generate("warm up", SamplingParams(), 4)
        workloads = {"tool calls": [[{"role": "system", "content": TOOL}, {"role": "user", "content": f"Find {a}."}]
                                    for a in ASKS[:args.tool_calls]],
                     "edits": CHANGES[:args.edits], "control": CONTROLS[:args.controls]}
        for workload, requests in workloads.items():
            speeds, acceptance, same, previous = {n: [] for n in engines}, {n: [] for n in engines}, True, FUNCTION
            for request in requests:
                if workload == "edits":  # each round rewrites the previous round's answer
                    request = [{"role": "user", "content": f"Rewrite this function with one change: {request}. "
                                                           f"Answer with the code only.\n\n{previous}"}]
                elif workload == "control":
                    request = [{"role": "user", "content": request}]
                outputs = {}
                for name, engine in engines.items():
                    outputs[name], tps, accepted = rate(engine, request, args.tokens)
                    speeds[name].append(tps)
                    acceptance[name].append(accepted)
                same &= outputs["ngram"] == outputs["plain"] == outputs["suffix"]
                previous = plain.tokenizer.decode(outputs["plain"])
            base = statistics.mean(speeds["plain"])
            rows.append((workload, len(requests), {n: statistics.mean(v) for n, v in speeds.items()}, base,
                         {n: statistics.mean(v) for n, v in acceptance.items()}, same))
        drafter, context = engines["suffix"].drafter, engines["suffix"].encode(workloads["tool calls"][0])
        for _ in range(200):  # its own cost per round: a lookup and an update of one token
            start = time.perf_counter()
            drafter.propose(context, 8, SamplingParams(), mx.random.key(0))
            context = context + [context[-7]]
            drafter.accept(context, 0, None)
            cost.append(time.perf_counter() - start)
        step = 1 / statistics.median(r[3] for r in rows)
    print("| workload | requests | plain tok/s | n-gram | suffix | suffix / n-gram | acceptance n-gram, suffix | "
          "same tokens as plain |")
    print("|---|---|---|---|---|---|---|---|")
    for workload, count, speed, base, accepted, same in rows:
        print(f"| {workload} | {count} | {base:.2f} | {speed['ngram'] / base:.2f}x | {speed['suffix'] / base:.2f}x | "
              f"{speed['suffix'] / speed['ngram']:.2f}x | {accepted['ngram']:.2f}, {accepted['suffix']:.2f} | {same} |")
    per_round = statistics.median(cost)
    print(f"suffix drafter's lookup + update: {per_round * 1e6:.0f} us a round, {per_round / step:.2%} of a plain "
          f"decode step ({step * 1e3:.0f} ms); its index: {drafter.report()}")
    print(f"an index at its budget of {BUDGET} tokens (random ones, of the target's vocabulary: every n-gram "
          f"new) holds {index_memory(len(plain.tokenizer.get_vocab())) / 2**20:.0f} MiB of Python objects")
    print(neighbours.verdict()[1])
    return 0


def index_memory(vocab: int) -> int:
    """Bytes an index full to its budget allocates (tracemalloc), of sequences of 2,048 random tokens."""
    import random
    import tracemalloc

    rng = random.Random(0)
    tracemalloc.start()
    index = SuffixIndex()
    for _ in range(BUDGET // 2048):
        index.add([rng.randrange(vocab) for _ in range(2048)])
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return size


if __name__ == "__main__":
    sys.exit(main())
