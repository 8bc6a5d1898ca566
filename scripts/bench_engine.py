"""Engine benchmark: interleaved runs of mlx-spec against mlx-lm on one model, in one process.

    python scripts/bench_engine.py [--hidden 768 --layers 12 --tokens 64 --reps 3]

Prints, with the BLAS in use:
  1. mlx-spec with drafting off vs mlx-lm's plain generate_step (greedy; same tokens required)
  2. mlx-spec draft-model speculation vs mlx-lm's speculative_generate_step, same pair and k, T=0
  3. acceptance at T=1.0 with the draft equal to the target: exact rejection sampling vs sample-and-match
The models are random float32 checkpoints from tests/tiny.py (a layer-skip draft of the target); random
weights say nothing about acceptance on real text, only about engine overhead and the verification rule. Every run's
own tok/s goes out as a raw-timings line (scripts/timings.py), which scripts/record.py keeps apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load as mlx_lm_load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny checkpoint builders
import tiny  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from timings import raw_line  # noqa: E402  (scripts/, this file's folder)

PROMPT = "import os\nimport sys\n\ndef main(argv):\n    for name in argv:\n        print(name)\n"


def timed(fn):
    start = time.perf_counter()
    tokens = fn()
    return tokens, len(tokens) / (time.perf_counter() - start)


def interleave(runs: dict, reps: int) -> dict:
    """Run each contender once per repetition, alternating; return tokens and median tok/s per name, and print
    each run's tok/s (raw timings)."""
    speeds, outputs = {name: [] for name in runs}, {}
    for _ in range(reps):
        for name, fn in runs.items():
            outputs[name], tps = timed(fn)
            speeds[name].append(tps)
    for name, values in speeds.items():
        print(raw_line(name, "tok/s", values))
    return {name: (outputs[name], statistics.median(speeds[name])) for name in runs}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--draft-layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    target_path, draft_path = tiny.build_bench_pair(args.hidden, args.layers, args.draft_layers)
    model, tokenizer = mlx_lm_load(str(target_path))
    draft, _ = mlx_lm_load(str(draft_path))
    params = sum(v.size for _, v in __import__("mlx.utils", fromlist=["tree_flatten"]).tree_flatten(model.parameters()))
    print(f"target: qwen3 d={args.hidden} x{args.layers} ({params / 1e6:.0f}M params, float32), draft: "
          f"{args.draft_layers} layers; BLAS: {linux_blas.describe()}; {args.tokens} tokens, median of {args.reps}")
    ids = tokenizer.encode(PROMPT)
    n = args.tokens

    off = mlx_spec.load(str(target_path), drafter="off")
    spec = mlx_spec.load(str(target_path), draft_model=str(draft_path), draft_len=args.num_draft)
    for engine in (off, spec):
        engine.tokenizer.eos_token_ids = []  # mlx-lm's generate_step never stops at EOS either
    greedy = make_sampler(temp=0.0)
    r = interleave({
        "mlx-lm plain": lambda: [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n,
                                                                   sampler=greedy)],
        "mlx-spec off": lambda: off.generate(ids, max_tokens=n).tokens,
        "mlx-lm speculative": lambda: [int(t) for t, _, _ in speculative_generate_step(
            mx.array(ids), model, draft, num_draft_tokens=args.num_draft, max_tokens=n, sampler=greedy)],
        "mlx-spec draft-model": lambda: spec.generate(ids, max_tokens=n).tokens,
    }, args.reps)
    for name, (tokens, tps) in r.items():
        print(f"  {name:22s} {tps:7.2f} tok/s")
    same_plain = r["mlx-spec off"][0] == r["mlx-lm plain"][0]
    same_spec = r["mlx-spec draft-model"][0] == r["mlx-lm speculative"][0] == r["mlx-lm plain"][0]
    print(f"1. drafting off vs mlx-lm plain:        {r['mlx-spec off'][1] / r['mlx-lm plain'][1]:.3f}x "
          f"(target >= 0.98x), identical tokens: {same_plain}")
    print(f"2. draft-model vs mlx-lm speculative:   "
          f"{r['mlx-spec draft-model'][1] / r['mlx-lm speculative'][1]:.3f}x (target >= 1.0x), identical "
          f"tokens: {same_spec}; vs plain mlx-lm {r['mlx-spec draft-model'][1] / r['mlx-lm plain'][1]:.3f}x")

    k = args.num_draft
    self_spec = mlx_spec.load(str(target_path), draft_model=str(target_path), draft_len=k)
    self_spec.tokenizer.eos_token_ids = []
    ours = [mlx_spec.generate(self_spec, ids, max_tokens=n, temperature=1.0, seed=s).stats for s in range(3)]
    ours_rate = sum(s.accepted for s in ours) / sum(s.drafted for s in ours)
    flags = [bool(f) for s in range(3) for _, _, f in speculative_generate_step(
        mx.array(ids), model, model, num_draft_tokens=k, max_tokens=n, sampler=make_sampler(temp=1.0))]
    rounds = flags.count(False)  # every mlx-lm round ends with one token of the target's own
    print(f"3. acceptance at T=1.0, draft = target, k={k}: mlx-spec {ours_rate:.3f} (target >= 0.99); "
          f"mlx-lm sample-and-match {flags.count(True) / (rounds * k):.3f}")


if __name__ == "__main__":
    main()
