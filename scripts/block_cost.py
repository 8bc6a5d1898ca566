"""What a block drafter costs beside its target, on a real model from scripts/real_models.py: c(n), one DFlash
draft of n tokens (the round's new context features appended, the block [last, MASK x n] run, its n positions
scored by the target's head) and v(n), the target's forward over n + 1 tokens with the features read, each
relative to one plain decode step; and the bound E[N] / (c(n) + v(n)) a round of n drafts can reach for a few
mean accepted lengths E[N] (tokens per round). Speed does not depend on the weights' values: the drafter is
z-lab's shape for this target (5 layers of the target's width, 5 target layers read, the target's head) with
random weights, since no published block drafter fits this machine.

    python scripts/block_cost.py [--model qwen2.5-coder-0.5b --max-drafts 15 --reps 5 --layers 5]
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
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from mlx_spec.drafters.dflash import BlockDrafter  # noqa: E402
from mlx_spec.models.dflash import BlockDrafterModel, read_config  # noqa: E402
from mlx_spec.core.sampling import SamplingParams  # noqa: E402
from mlx_spec.runners.target import Step, Target  # noqa: E402

ACCEPTED_LENGTHS = (2.0, 4.0, 6.0)  # E[N]: tokens per round, for the bound


def drafter_config(target: dict, layers: int, block: int) -> dict:
    """A DFlash config.json of z-lab's shape for `target`: its width and MLP, `layers` layers, reading the
    outputs of `layers` target layers spread from the second to the third-last."""
    depth = target["num_hidden_layers"]
    ids = [round(1 + i * (depth - 4) / (layers - 1)) for i in range(layers)]
    return {**{k: target[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                      "num_key_value_heads", "vocab_size", "rms_norm_eps")},
            "head_dim": target.get("head_dim") or target["hidden_size"] // target["num_attention_heads"],
            "rope_theta": target.get("rope_theta", 1e6), "num_hidden_layers": layers, "block_size": block,
            "num_target_layers": depth, "dflash_config": {"mask_token_id": 0, "target_layer_ids": ids}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", choices=sorted(real_models.MODELS))
    parser.add_argument("--max-drafts", type=int, default=15)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=5)
    args = parser.parse_args()
    path = real_models.mlx_dir(args.model)
    if not path.exists():
        print(f"fetch the model first: python scripts/real_models.py {args.model}")
        return 2
    engine = mlx_spec.load(str(path), drafter="off")
    target_config = json.loads((path / "config.json").read_text())
    config = read_config(drafter_config(target_config, args.layers, args.max_drafts + 1), path)
    model = BlockDrafterModel(config, False, False)
    mx.eval(model.parameters())
    features = [i + 1 for i in config["target_layer_ids"]]
    target, plain = Target(engine.target.model, hidden=features), Target(engine.target.model)
    prompt = engine.encode("def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n" * 4)
    prompt_step = target.prefill(prompt[:-1])
    plain.prefill(prompt[:-1])
    drafter = BlockDrafter(model, engine.target.model)
    new_context = prompt_step.hidden[-3:]  # a round's new features: its last token and two accepted drafts

    def timed(run, undo) -> float:
        """Median milliseconds of `run()` (evaluated), `undo()` after each, untimed; the first run untimed."""
        times = []
        for _ in range(args.reps + 1):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
            undo()
        return 1000 * statistics.median(times[1:])

    def draft(n: int) -> None:
        drafter.pending = [new_context]
        mx.eval(drafter.propose(prompt, n, SamplingParams(temperature=0.0), mx.random.key(0)).tokens)

    def restart() -> None:
        drafter.begin(prompt, Step(None, prompt_step.hidden[:-3]))
        mx.eval([c.state for c in drafter.caches])

    def undo(runner: Target, n: int):
        return lambda: (runner.rollback(n), mx.eval([c.state for c in runner.cache]))

    restart()
    with Neighbours() as neighbours:
        step = timed(lambda: mx.eval(plain.forward(prompt[-1:]).logits), undo(plain, 1))
        rows = [(n, timed(lambda: mx.eval(target.forward(prompt[-n - 1:]).logits), undo(target, n + 1)) / step,
                 timed(lambda: draft(n), restart) / step) for n in range(1, args.max_drafts + 1)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"python scripts/block_cost.py --model {args.model} --max-drafts {args.max_drafts} --reps {args.reps} "
          f"--layers {args.layers}  (commit {commit}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)")
    print(f"{args.model} float32, BLAS: {linux_blas.describe()}; plain decode step {step:.1f} ms; a {args.layers}-"
          f"layer DFlash drafter reading layers {config['target_layer_ids']}; median of {args.reps}")
    print("| drafts n | v(n) | c(n) | c + v | " + " | ".join(f"bound, E[N]={e:g}" for e in ACCEPTED_LENGTHS) + " |")
    print("|---" * (4 + len(ACCEPTED_LENGTHS)) + "|")
    for n, v, c in rows:
        bounds = " | ".join(f"{min(e, n + 1) / (c + v):.2f}x" for e in ACCEPTED_LENGTHS)
        print(f"| {n} | {v:.2f} | {c:.2f} | {c + v:.2f} | {bounds} |")
    print(neighbours.verdict()[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
