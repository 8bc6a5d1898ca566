"""Lookahead decoding against plain decoding and n-gram drafting on real weights, greedy.

    python scripts/bench_lookahead.py [--models smollm2-135m,qwen2.5-coder-0.5b --tokens 32 --reps 2 --ks 1,2,3,4]

For each model (float32, from scripts/real_models.py): plain decoding, n-gram (adaptive), lookahead pinned at each
n-gram length k and under the adaptive policy, interleaved in one process on three chat prompts (two that write
new code, one that edits code given in the prompt, where copying pays). Prints tokens per round (mean accepted
length + 1), tree nodes verified per round, decode tok/s and the ratio to plain, lookahead's pool hit rate (rounds
whose last token started an n-gram in the pool), whether every output equals plain decoding, and whether the
machine was quiet enough to trust the figures. Every run's own tok/s goes out as a raw-timings line
(scripts/timings.py), which scripts/record.py keeps apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import mlx_spec  # first, before mlx: it points MLX at the system OpenBLAS on Linux

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from timings import raw_lines_by_prompt, spread_cell, verdict  # noqa: E402

EDITED = '''def mean(values):
    total = 0
    for value in values:
        total = total + value
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for value in values:
        total = total + (value - m) ** 2
    return total / len(values)
'''
PROMPTS = [
    [{"role": "user", "content": "Write a Python function that parses an ISO 8601 date string and returns a "
                                 "datetime, with a docstring."}],
    [{"role": "user", "content": "Complete this code:\ndef binary_search(items, target):\n    lo, hi = 0, "
                                 "len(items) - 1\n"}],
    [{"role": "user", "content": f"Rename `values` to `samples` in this code and show all of it:\n{EDITED}"}],
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--ks", default="1,2,3,4", help="pinned lookahead n-gram lengths")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",") if k]
    for model in args.models.split(","):
        path = real_models.mlx_dir(model)
        if not path.exists():
            print(f"fetch the model first: python scripts/real_models.py {model}")
            return 2
        plain = mlx_spec.load(str(path), drafter="off")
        contenders = {"plain": (plain, 0), "ngram (adaptive)": (plain.with_drafter("ngram"), None)}
        lookahead = plain.with_drafter("lookahead")
        contenders.update({f"lookahead k={k}": (lookahead, k) for k in ks})
        contenders["lookahead (adaptive)"] = (plain.with_drafter("lookahead"), None)
        for engine, _ in contenders.values():
            engine.tokenizer.eos_token_ids = []  # every contender makes exactly --tokens tokens
        print(f"\n{model}: BLAS {linux_blas.describe()}; {args.tokens} tokens, {len(PROMPTS)} prompts x "
              f"{args.reps} repetitions, greedy", flush=True)
        speeds, rows = {}, {}
        with Neighbours() as neighbours:
            for p, prompt in enumerate(PROMPTS):
                ids = plain.encode(prompt)
                for rep in range(args.reps + (p == 0)):  # the first pass is untimed: first touches of the weights
                    for name, (engine, k) in contenders.items():
                        engine.pin(k)
                        result = engine.generate(ids, max_tokens=args.tokens)
                        if p == 0 and rep == 0:
                            continue
                        speeds.setdefault(name, {}).setdefault(p, []).append(result.stats.decode_tps)
                        rows.setdefault(name, []).append(result)
        baseline = statistics.median(s for per in speeds["plain"].values() for s in per)
        print("| contender | tokens/round | nodes/round | tok/s (median) | vs plain | spread | pool | same as plain |")
        print("|---|---|---|---|---|---|---|---|")
        for name, results in rows.items():
            tps = statistics.median(s for per in speeds[name].values() for s in per)
            same = all(r.tokens == plain_r.tokens for r, plain_r in zip(results, rows["plain"]))
            hits = [r.stats.drafter_report.split(" (")[0].removeprefix("pool hit rate ") for r in results
                    if r.stats.drafter_report]
            nodes = statistics.mean(r.stats.nodes / r.stats.rounds for r in results)
            print(f"| {name} | {statistics.mean(r.stats.mean_acceptance_length for r in results):.2f} | "
                  f"{nodes:.1f} | {tps:.1f} | {tps / baseline:.2f}x | "
                  f"{spread_cell(speeds[name].values())} | {' '.join(hits) or '-'} | {same} |")
        print(verdict(neighbours, speeds["plain"].values()))
        print(raw_lines_by_prompt(speeds, prefix=f"{model}: "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
