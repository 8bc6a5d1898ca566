"""What a batch's block drafts cost: every row's block in one drafter forward (`BlockRows`, the batch's drafter)
against one forward a row (`RowDrafters` of lone drafters, as batches drafted before), on a real target from
scripts/real_models.py. A round per row: the round's new context features (its last token and two accepted drafts)
appended, then a block of n drafts, greedy. Rows have prompts of different lengths. The drafter is z-lab's shape
for this target (scripts/block_cost.py: 5 layers of its width, its head) with random weights, since no published
block drafter fits this machine; cost does not depend on the weights' values. Each repetition times both ways in
turn for each batch size, so the ratio is of neighbouring runs.

    python scripts/block_batch.py [--model qwen2.5-coder-0.5b --sizes 1,4,8 --drafts 4 --reps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from block_cost import drafter_config  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from mlx_spec.core.prompts import PASSAGE  # noqa: E402
from mlx_spec.core.sampling import SamplingParams  # noqa: E402
from mlx_spec.drafters.dflash import BlockDrafter, BlockRows  # noqa: E402
from mlx_spec.drafters.protocol import RowDrafters  # noqa: E402
from mlx_spec.models.dflash import BlockDrafterModel, read_config  # noqa: E402
from mlx_spec.runners.target import Target  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", choices=sorted(real_models.MODELS))
    parser.add_argument("--sizes", default="1,4,8", help="batch sizes, comma-separated")
    parser.add_argument("--drafts", type=int, default=4, help="drafts a block")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=5)
    args = parser.parse_args()
    [path] = real_models.converted("block_batch.py", args.model)
    sizes = [int(size) for size in args.sizes.split(",")]
    engine = mlx_spec.load(str(path), drafter="off")
    config = read_config(drafter_config(json.loads((path / "config.json").read_text()), args.layers,
                                        args.drafts + 1), path)
    model = BlockDrafterModel(config, False, False)
    mx.eval(model.parameters())
    lone = BlockDrafter(model, engine.target.model)
    prompts = [engine.encode(PASSAGE * 2)[:40 + 12 * i] for i in range(max(sizes))]
    features = []  # each prompt's target features, from a prefill of its own
    for prompt in prompts:
        target = Target(engine.target.model, hidden=[i + 1 for i in config["target_layer_ids"]])
        features.append(target.prefill(prompt[:-1]).hidden)
    mx.eval(features)
    greedy = SamplingParams(temperature=0.0)

    def batch(rows, size: int):
        """`rows` (a BatchDrafter) with `size` rows joined; a round appends 3 positions and drafts a block."""
        for prompt, hidden in zip(prompts[:size], features[:size]):
            rows.join(prompt, hidden[:-3])
        new = mx.stack([hidden[-3:] for hidden in features[:size]])

        def round_() -> None:
            rows.accept(prompts[:size], [2] * size, new)
            mx.eval([d.tokens for d in rows.propose(prompts[:size], [args.drafts] * size, [greedy] * size,
                                                     [mx.random.key(0)] * size)])
        return round_

    ways = {"row by row": lambda size: batch(RowDrafters(lone.name, lambda: BlockDrafter(model, lone.target_model)),
                                             size),
            "one forward": lambda size: batch(BlockRows(lone), size)}
    times = {(way, size): [] for way in ways for size in sizes}
    with Neighbours() as neighbours:
        for _ in range(args.reps):
            for size in sizes:
                for way, make in ways.items():
                    round_ = make(size)
                    round_()  # untimed: the first round builds its graph
                    start = time.perf_counter()
                    for _ in range(3):
                        round_()
                    times[way, size].append((time.perf_counter() - start) / 3 * 1000)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"python scripts/block_batch.py --model {args.model} --sizes {args.sizes} --drafts {args.drafts} --reps "
          f"{args.reps} --layers {args.layers}  (commit {commit}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)")
    print(f"{args.model} float32, BLAS: {linux_blas.describe()}; a {args.layers}-layer DFlash drafter, blocks of "
          f"{args.drafts} drafts; ms per round (3 new positions a row, then a block), median of {args.reps}")
    print("| rows | row by row | one forward | one forward / row by row |")
    print("|---|---|---|---|")
    for size in sizes:
        each, one = (statistics.median(times[way, size]) for way in ways)
        ratios = [b / a for a, b in zip(times["row by row", size], times["one forward", size])]
        print(f"| {size} | {each:.1f} | {one:.1f} | {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) |")
    print(neighbours.verdict()[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
