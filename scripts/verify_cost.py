"""The verify-cost curve v(n): one target forward over n + 1 tokens (a chain, or a token tree of n nodes: the
mask aside they cost the same) relative to one decode step, on a real model from scripts/real_models.py.

    python scripts/verify_cost.py [--model qwen2.5-coder-1.5b --max-nodes 16 --reps 5] [--rows B]

`--rows B`: the forwards of a batch (`RaggedBatch`) of B copies of the prompt, each row n + 1 tokens, against a
batched step of one token a row: the verify cost of batched speculation. `--model demo`: the built-in demo.

A tree of n nodes pays when its expected accepted length beats the best chain's at the chain's cost, so where
v(n) stays flat (bandwidth-bound decoding: a Mac's GPU) wide trees are nearly free, and where it climbs (a CPU)
they are not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from mlx_spec.runners.ragged import RaggedBatch  # noqa: E402
from mlx_spec.runners.target import Target  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", choices=sorted(real_models.MODELS) + ["demo"])
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1, help="batch rows, each running n + 1 tokens a forward")
    args = parser.parse_args()
    path = None if args.model == "demo" else real_models.mlx_dir(args.model)
    if path is not None and not path.exists():
        print(f"fetch the model first: python scripts/real_models.py {args.model}")
        return 2
    engine = mlx_spec.load(str(path) if path else None, drafter="off")
    prompt = engine.encode("def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n" * 4)
    if args.rows == 1:
        target = Target(engine.target.model)
        target.prefill(prompt)
    else:
        batch = RaggedBatch(engine.target.model)
        for _ in range(args.rows):
            batch.join(RaggedBatch.prefilled(engine.target.model, [prompt]))

    def forward(n: int) -> None:
        """A forward over n tokens (each row's, in a batch), evaluated."""
        if args.rows == 1:
            mx.eval(target.forward(prompt[-n:]).logits)
        else:
            batch.mark()
            mx.eval(batch.forward(mx.array([prompt[-n:]] * args.rows), [n] * args.rows))

    def remove(n: int) -> None:
        """The n tokens taken out of the cache again (untimed, and evaluated before the next forward)."""
        if args.rows == 1:
            target.rollback(n)
            mx.eval([c.state for c in target.cache])
        else:
            batch.keep([0] * args.rows)
            mx.eval([c.state for c in batch.caches])

    def forward_ms(n: int) -> float:
        """Median wall time of a forward over n tokens, in milliseconds."""
        times = []
        for _ in range(args.reps + 1):  # the first: untimed
            start = time.perf_counter()
            forward(n)
            times.append(time.perf_counter() - start)
            remove(n)
        return 1000 * statistics.median(times[1:])

    print(f"{args.model}, {args.rows} row(s), BLAS: {linux_blas.describe()}; median of {args.reps} forwards each")
    with Neighbours() as neighbours:
        step = forward_ms(1)
        rows = [(n, forward_ms(n + 1)) for n in range(1, args.max_nodes + 1)]
    print(f"decode step: {step:.1f} ms")
    print("| draft nodes n | forward over n + 1 tokens (ms) | v(n) |")
    print("|---|---|---|")
    for n, ms in rows:
        print(f"| {n} | {ms:.1f} | {ms / step:.2f} |")
    print(neighbours.verdict()[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
