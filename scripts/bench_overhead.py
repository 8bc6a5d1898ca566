"""Per-round host overhead: milliseconds a decoding round costs on a model whose forward costs almost nothing.

    python scripts/bench_overhead.py [--before ../before] [--tokens 128] [--reps 5]

The model is the demo's draft model (Qwen3 layout, 2 layers of width 128, the shipped tokenizer), so what a
round costs is the engine's own work: building graphs, sampling and verification, bookkeeping, the host
synchronisation. Contenders: mlx-lm's plain `generate_step` (a round is a token) and `speculative_generate_step`
with the same model as its draft (k = 4), and mlx-spec with drafting off, with that draft model pinned at k = 4,
with n-gram pinned at k = 4 on a prompt it can copy, and the demo's MTP layer (Qwen 3.5 layout, Gated DeltaNet)
pinned at k = 2; and drafting off and the draft model at k = 4 as the lone row of a batch (`stream_many`, a
server's lone request: the batch's ragged cache with one row). With `--before DIR` (a worktree of an earlier commit), each repetition runs the code in this
checkout and the one in DIR, in turn, each in a process of its own (a fresh MLX), and the table compares them;
mlx-lm runs in both, a control for how much the machine drifted. Greedy; every run's own figure goes out as a
raw-timings line (scripts/timings.py), which scripts/record.py keeps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Repeat this list twice: apples, pears, plums, figs, dates, limes, kiwis, grapes."


def child(tokens: int) -> dict[str, float]:
    """ms per round of each contender, in this process, with the mlx_spec found on the path."""
    import mlx_spec  # first, before mlx: it points MLX at the system OpenBLAS on Linux

    import mlx.core as mx
    from mlx_lm.generate import generate_step, speculative_generate_step
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import load as mlx_lm_load

    demo = Path(mlx_spec.__file__).parent / "demo"
    small, hybrid = str(demo / "demo-draft"), str(demo / "demo")
    model, tokenizer = mlx_lm_load(small)
    greedy = make_sampler(temp=0.0)
    ids = mlx_spec.render_prompt(tokenizer, PROMPT)

    def mlx_lm_plain() -> float:
        start = time.perf_counter()
        for _ in generate_step(mx.array(ids), model, max_tokens=tokens, sampler=greedy):
            pass
        return (time.perf_counter() - start) * 1000 / tokens

    def mlx_lm_spec() -> float:
        start, rounds = time.perf_counter(), 0
        for _, _, from_draft in speculative_generate_step(mx.array(ids), model, model, num_draft_tokens=4,
                                                          max_tokens=tokens, sampler=greedy):
            rounds += not from_draft
        return (time.perf_counter() - start) * 1000 / rounds

    engines = {"mlx-spec off": mlx_spec.load(small, drafter="off"),
               "mlx-spec draft model k=4": mlx_spec.load(small, draft_model=small, draft_len=4),
               "mlx-spec ngram k=4": mlx_spec.load(small, drafter="ngram", draft_len=4),
               "mlx-spec mtp k=2 (hybrid)": mlx_spec.load(hybrid, drafter="mtp", draft_len=2)}
    runs = {"mlx-lm plain": mlx_lm_plain, "mlx-lm speculative k=4": mlx_lm_spec}
    for name, engine in engines.items():
        engine.tokenizer.eos_token_ids = []  # every run makes `tokens` tokens, as mlx-lm's do

        def run(engine=engine) -> float:
            stats = mlx_spec.generate(engine, ids, max_tokens=tokens).stats
            return stats.decode_seconds * 1000 / stats.rounds
        runs[name] = run
    for name, key, draft_len in (("off", "mlx-spec off", 0), ("draft model k=4", "mlx-spec draft model k=4", 4)):
        def lone_row(engine=engines[key], draft_len=draft_len) -> float:
            job = [(0, mlx_spec.Job(ids, max_tokens=tokens, draft_len=draft_len))]
            done = [event for _, event in engine.stream_many(lambda: job.pop() if job else None, 2)][-1]
            return done.stats.decode_seconds * 1000 / done.stats.rounds
        runs[f"mlx-spec {name}, a batch's lone row"] = lone_row
    for fn in runs.values():
        fn()  # compiled and warm
    return {name: fn() for name, fn in runs.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a worktree of an earlier commit, run in turn with this one")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.tokens)))
        return 0
    sys.path.insert(0, str(ROOT))
    from mlx_spec.commands.bench import Neighbours
    from timings import raw_line

    trees = {"after": ROOT, **({"before": Path(args.before).resolve()} if args.before else {})}
    runs: dict[str, dict[str, list[float]]] = {tree: {} for tree in trees}
    with Neighbours() as neighbours:
        for _ in range(args.reps):
            for tree, folder in trees.items():
                env = {**os.environ, "PYTHONPATH": str(folder)}
                out = subprocess.run([sys.executable, __file__, "--child", "--tokens", str(args.tokens)], cwd=folder,
                                     env=env, capture_output=True, text=True, check=True).stdout
                for name, ms in json.loads(out.splitlines()[-1]).items():
                    runs[tree].setdefault(name, []).append(ms)
    for tree, by_name in runs.items():
        for name, values in by_name.items():
            print(raw_line(f"{tree}, {name}", "ms/round", values))
    head = "| contender | " + " | ".join(f"{tree} ms/round" for tree in trees) + (" | after / before |" if
                                                                                   args.before else " |")
    commits = {tree: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=folder, capture_output=True,
                                    text=True).stdout.strip() for tree, folder in trees.items()}
    print(", ".join(f"{tree}: commit {commit}" for tree, commit in commits.items())
          + f"; {args.tokens} tokens, median of {args.reps} runs, each in a fresh process\n")
    print(head)
    print("|---" * (len(trees) + 1 + bool(args.before)) + "|")
    for name in runs["after"]:
        medians = [statistics.median(runs[tree][name]) for tree in trees]
        ratio = f" | {medians[0] / medians[1]:.2f}" if args.before else ""
        print(f"| {name} | " + " | ".join(f"{m:.2f}" for m in medians) + ratio + " |")
    print(f"\n{neighbours.verdict()[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
