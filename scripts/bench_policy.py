"""Adaptive draft length against plain decoding and against every fixed length, interleaved, one process.

    python scripts/bench_policy.py [--hidden 768 --layers 12 --tokens 96 --reps 3]

Two workloads on a random float32 qwen3 target (85M at the defaults, OpenBLAS on Linux):
  "drafts cannot help": a 2-layer layer-skip draft model that random weights make almost always wrong;
     goal: adaptive >= 0.97x plain decoding.
  "drafts help": a free scripted drafter that proposes the target's true greedy continuation, each position
     independently corrupted with probability 0.2 (an n-gram-like drafter with 80% acceptance); goal: adaptive
     within 5% of the best fixed length chosen in hindsight.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny checkpoint builders
import tiny  # noqa: E402
from mlx_spec import linux_blas  # noqa: E402
from mlx_spec.bench import interleaved  # noqa: E402
from mlx_spec.drafters import Draft  # noqa: E402
from mlx_spec.engine import Engine  # noqa: E402
from mlx_spec.target import Target  # noqa: E402

PROMPT = "import os\nimport sys\n\ndef main(argv):\n    for name in argv:\n        print(name)\n"


class ScriptedDrafter:
    """Knows the greedy continuation; each proposed position is wrong with probability `miss`. Free to run."""

    name = "scripted"

    def __init__(self, reference: list[int], prompt_len: int, miss: float, vocab: int):
        self.reference, self.prompt_len, self.miss, self.vocab = reference, prompt_len, miss, vocab

    def begin(self, context, prompt_step):
        self.rng = random.Random(0)

    def propose(self, context, k, params, key):
        done = len(context) - self.prompt_len
        tokens = [t if self.rng.random() > self.miss else (t + 1) % self.vocab
                  for t in self.reference[done:done + k]]
        return Draft(mx.array(tokens, dtype=mx.int32)) if tokens else Draft.empty()

    def accept(self, context, accepted, step):
        pass


def tokens_per_second(engines: dict, ids: list[int], n: int, reps: int) -> dict:
    return {name: tps for name, (tps, _) in interleaved(engines, ids, n, reps).items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    target_path, draft_path = tiny.build_bench_pair(args.hidden, args.layers, 2)
    plain = mlx_spec.load(str(target_path), drafter="off")
    plain.tokenizer.eos_token_ids = []
    ids = plain.encode(PROMPT)
    print(f"target: qwen3 d={args.hidden} x{args.layers} float32; BLAS: {linux_blas.describe()}; "
          f"{args.tokens} tokens, median of {args.reps}, interleaved")

    adaptive = mlx_spec.load(str(target_path), draft_model=str(draft_path))
    adaptive.tokenizer.eos_token_ids = []
    speeds = tokens_per_second({"plain": plain, "adaptive": adaptive}, ids, args.tokens, args.reps)
    print(f"drafts cannot help (layer-skip draft): adaptive {speeds['adaptive']:.2f} vs plain {speeds['plain']:.2f} "
          f"tok/s = {speeds['adaptive'] / speeds['plain']:.3f}x (goal >= 0.97x); {adaptive.status().policy}")

    reference = plain.generate(ids, max_tokens=args.tokens + 8).tokens
    vocab = len(plain.tokenizer.get_vocab())
    model = plain.target.model

    def scripted(draft_len, max_draft_len=6):
        return Engine(Target(model), plain.tokenizer, ScriptedDrafter(reference, len(ids), 0.2, vocab), draft_len,
                      max_draft_len)
    engines = {"plain": plain, "adaptive": scripted(None), **{f"k={k}": scripted(k) for k in range(1, 7)}}
    speeds = tokens_per_second(engines, ids, args.tokens, args.reps)
    best = max((name for name in speeds if name.startswith("k=")), key=speeds.get)
    print("drafts help (scripted, 80% per-position acceptance): " + ", ".join(
        f"{name} {tps / speeds['plain']:.2f}x" for name, tps in speeds.items()))
    print(f"  adaptive / best fixed ({best}) = {speeds['adaptive'] / speeds[best]:.3f} (goal >= 0.95); "
          f"{engines['adaptive'].status().policy}")


if __name__ == "__main__":
    main()
