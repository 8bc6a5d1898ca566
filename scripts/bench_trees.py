"""Chains against token trees at equal node budget: mean accepted length and speed, greedy.

    python scripts/bench_trees.py [--budgets 2,4,6 --widths 2,3 --tokens 48 --reps 2]
    python scripts/bench_trees.py --real [--tokens 32]

Default: the tiny qwen3 test target with EAGLE-3 and Medusa heads trained here and its layer-skip draft model
(tests/tiny.py, tests/tiny_heads.py), generating the texts the heads were trained on. Toy weights: the accepted
lengths mean something, the speeds do not. --real: the Qwen2.5-Coder 1.5B target with its 0.5B sibling as draft
(float32, scripts/real_models.py), on two coding prompts.

For each drafter and node budget n (drafted tokens verified per round): the chain of n drafts and the trees of
width w and depth n / w, pinned, interleaved with plain decoding in one process. Prints tokens per round (mean
accepted length + 1), decode tok/s and the ratio to plain per contender, and checks every output against plain
decoding. The verify cost v(n) of n nodes on this machine: scripts/verify_cost.py. Every run's own tok/s goes out as
a raw-timings line (scripts/timings.py), which scripts/record.py keeps apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import mlx_spec  # first, before mlx: it points MLX at the system OpenBLAS on Linux

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "tests")]
import real_models  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from timings import raw_lines_by_prompt, spread_cell, verdict  # noqa: E402

REAL_PROMPTS = [
    [{"role": "user", "content": "Write a Python function that parses an ISO 8601 date string and returns a "
                                 "datetime, with a docstring."}],
    [{"role": "user", "content": "Complete this code:\ndef binary_search(items, target):\n    lo, hi = 0, "
                                 "len(items) - 1\n"}],
]


def tiny_setup(root: Path) -> tuple[str, dict[str, str], list]:
    """The tiny target, its drafters (name -> draft-model path), and the prompts its heads were trained on."""
    import tiny
    import tiny_heads

    tokenizer = tiny.build_tokenizer(root / "tokenizer")
    target = tiny.build_checkpoint(root / "qwen3", "qwen3", tokenizer, layers=4, seed=0)
    drafters = {"layer-skip draft": tiny.build_layer_skip_draft(root / "draft", target, keep_layers=2),
                "eagle3": tiny_heads.build_eagle3(root / "eagle3", target, tiny.HEAD_TEXTS, feature_layers=[0, 2, 3]),
                "medusa": tiny_heads.build_medusa(root / "medusa", target, tiny.HEAD_TEXTS)}
    return str(target), {name: str(path) for name, path in drafters.items()}, tiny.HEAD_TEXTS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="the real Qwen2.5-Coder pair instead of the tiny heads")
    parser.add_argument("--budgets", default="2,4,6", help="nodes verified per round")
    parser.add_argument("--widths", default="2,3", help="tree widths (depth: budget / width)")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    budgets, widths = ([int(v) for v in text.split(",") if v] for text in (args.budgets, args.widths))
    with tempfile.TemporaryDirectory(prefix="mlx-spec-trees-") as root:
        if args.real:
            target = str(real_models.mlx_dir("qwen2.5-coder-1.5b"))
            drafters = {"0.5B draft": str(real_models.mlx_dir("qwen2.5-coder-0.5b"))}
            prompts = REAL_PROMPTS
            if not all(Path(p).exists() for p in (target, *drafters.values())):
                print("fetch the models first: python scripts/real_models.py qwen2.5-coder-1.5b qwen2.5-coder-0.5b")
                return 2
        else:
            target, drafters, prompts = tiny_setup(Path(root))
        engines = {name: mlx_spec.load(target, draft_model=path, tree_width=max(widths)) for name, path in
                   drafters.items()}
        plain = next(iter(engines.values())).with_drafter("off")
        contenders = {"plain": (plain, 0, 1)}  # name -> (engine, depth, width)
        for name, engine in engines.items():
            for n in budgets:
                for width in [1, *widths]:
                    depth = n // width
                    if n % width == 0 and 0 < depth <= engine.max_draft_len and width <= engine.tree_width:
                        contenders[f"{name}, {n} nodes, " + (f"tree {width}x{depth}" if width > 1 else "chain")] = (
                            engine, depth, width)
        for engine, _, _ in contenders.values():
            engine.tokenizer.eos_token_ids = []  # every contender makes exactly --tokens tokens
        print(f"target {Path(target).name}; drafters {', '.join(drafters)}; BLAS {linux_blas.describe()}; "
              f"{args.tokens} tokens, {len(prompts)} prompts x {args.reps} repetitions, greedy", flush=True)
        speeds, per_round, outputs, by_prompt = {}, {}, {}, {}
        with Neighbours() as neighbours:
            for p, prompt in enumerate(prompts):
                ids = plain.encode(prompt)
                for rep in range(args.reps + (p == 0)):  # the first pass is untimed: first touches of the weights
                    for name, (engine, depth, width) in contenders.items():
                        engine.pin(depth, tree_width=width if depth else None)
                        result = engine.generate(ids, max_tokens=args.tokens)
                        if p == 0 and rep == 0:
                            continue
                        speeds.setdefault(name, []).append(result.stats.decode_tps)
                        by_prompt.setdefault(name, {}).setdefault(p, []).append(result.stats.decode_tps)
                        per_round.setdefault(name, []).append(result.stats.mean_acceptance_length)
                        outputs.setdefault((name, p), result.tokens)
    baseline = statistics.median(speeds["plain"])
    print("| contender | tokens/round | tok/s (median) | vs plain | spread | same tokens as plain |")
    print("|---|---|---|---|---|---|")
    for name, values in speeds.items():
        same = all(outputs[(name, p)] == outputs[("plain", p)] for p in range(len(prompts)))
        print(f"| {name} | {statistics.mean(per_round[name]):.2f} | {statistics.median(values):.1f} | "
              f"{statistics.median(values) / baseline:.2f}x | {spread_cell(by_prompt[name].values())} | {same} |")
    print(verdict(neighbours, by_prompt["plain"].values()))
    print(raw_lines_by_prompt(by_prompt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
