"""What a batch's sliding-window layers hold on real weights: Gemma 3 270M (window 512), rows of long prompts.

    python scripts/bench_window_memory.py [--before ../before] [--prompt 6000] [--rows 2] [--tokens 32]

Each tree (this checkout; with `--before DIR`, a worktree of an earlier commit, too) runs in a process of its own
(a fresh MLX): `--rows` prompts of `--prompt` tokens each decode `--tokens` tokens together (`generate_many`,
drafting off, greedy). Prints MLX's peak memory over the batch beside what the weights take, the seconds the
batch took, and whether every tree's outputs are the same. Fetch the model first: `python scripts/real_models.py
gemma3-270m`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Line {}: the quick brown fox jumps over the lazy dog while the cat watches from the old stone wall. "


def child(path: str, rows: int, prompt: int, tokens: int) -> dict:
    """Peak memory, weights and seconds of one batch, with the mlx_spec found on the path."""
    import mlx_spec  # first, before mlx: it points MLX at the system OpenBLAS on Linux

    import mlx.core as mx
    from mlx_spec.decode.rounds import Job

    engine = mlx_spec.load(path, drafter="off")
    engine.tokenizer.eos_token_ids = []  # every row makes `tokens` tokens
    weights = mx.get_active_memory()
    prompts = [engine.encode("".join(TEXT.format(f"{row}.{i}") for i in range(prompt // 10)))[:prompt]
               for row in range(rows)]
    mx.reset_peak_memory()
    start = time.perf_counter()
    results = dict(engine.generate_many([Job(ids, max_tokens=tokens) for ids in prompts], rows))
    return {"peak_mib": mx.get_peak_memory() / 2**20, "weights_mib": weights / 2**20,
            "seconds": time.perf_counter() - start, "tokens": [results[i].tokens for i in range(rows)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a worktree of an earlier commit, run beside this one")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=6000, help="tokens of each row's prompt")
    parser.add_argument("--tokens", type=int, default=32, help="tokens each row generates")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    import real_models

    path = real_models.mlx_dir("gemma3-270m")
    if not path.exists():
        print("gemma3-270m is not fetched: python scripts/real_models.py gemma3-270m")
        return 2
    if args.child:
        print(json.dumps(child(str(path), args.rows, args.prompt, args.tokens)))
        return 0
    trees = {"after": ROOT, **({"before": Path(args.before).resolve()} if args.before else {})}
    runs = {}
    for name, tree in trees.items():
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run([sys.executable, __file__, "--child", name, "--rows", str(args.rows), "--prompt",
                              str(args.prompt), "--tokens", str(args.tokens)], env=env, cwd=tree,
                             capture_output=True, text=True, check=True).stdout
        runs[name] = json.loads(out.strip().splitlines()[-1])
    print(f"Gemma 3 270M float32, {args.rows} rows of {args.prompt} prompt tokens + {args.tokens} generated, "
          "drafting off")
    print("| tree | peak MiB | weights MiB | peak - weights MiB | seconds |")
    print("|---|---|---|---|---|")
    for name, run in runs.items():
        print(f"| {name} | {run['peak_mib']:.0f} | {run['weights_mib']:.0f} | "
              f"{run['peak_mib'] - run['weights_mib']:.0f} | {run['seconds']:.1f} |")
    same = all(run["tokens"] == runs["after"]["tokens"] for run in runs.values())
    print(f"outputs the same in every tree: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
