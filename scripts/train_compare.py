"""Drafters trained here, compared on real weights: an MTP head and a block drafter, the same data and budget.

    python scripts/train_compare.py [--model smollm2-135m] [--hours 0.5] [--kinds mtp,dspark] [--work DIR]

Training prompts: `scripts/code_prompts.py` over the running Python's standard library (--count, seed 1); the
target answers them once (greedy, through its chat template) and every kind trains on those answers only, with
`mlx-spec train-drafter --kind K --max-hours H` (the budget counts training, not the answers, which the kinds
share). Each kind's held-out reports (acceptance per draft position on held-out answers) are printed as they
come. Then one `mlx-spec bench` runs plain decoding and every trained drafter under the adaptive policy,
interleaved in one process, on --bench-prompts code prompts from another code base (NumPy's sources, never
trained on), every output checked identical to plain decoding, and a table sums it up.
Float32 weights from `scripts/real_models.py`; measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import code_prompts  # noqa: E402
import real_models  # noqa: E402

CLI = [sys.executable, "-m", "mlx_spec.cli"]
CHECKPOINT = {"mtp": "train-mtp", "dflash": "train-drafter", "dspark": "train-drafter"}


def write_prompts(path: Path, folder: Path, count: int, seed: int) -> None:
    found = code_prompts.prompts(folder)
    chosen = random.Random(seed).sample(found, min(count, len(found)))
    path.write_text("".join(json.dumps({"prompt": p, "category": "code"}) + "\n" for p in chosen))


def run(command: list[str]) -> None:
    """Run a command, echoing its output as it comes; exits when it fails."""
    print("$", " ".join(command[2:] if command[:2] == CLI[:2] else command), flush=True)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
        for line in process.stdout:  # bytes: a progress counter's carriage returns pass through as they are
            print(line.decode(errors="replace"), end="", flush=True)
    if process.returncode:
        sys.exit(f"train_compare: {command[3] if command[:2] == CLI[:2] else command[0]} failed "
                 f"(exit {process.returncode})")


def train(kind: str, model: Path, prompts: Path, out: Path, hours: float, answers: Path) -> dict:
    """Train one kind afresh, the target's answers kept in `answers` (a hard link into the run's checkpoint
    folder, so that they outlive it and the next kind reuses them); what the drafter's config says of its training."""
    checkpoint = out.parent / f".{out.name}.{CHECKPOINT[kind]}-checkpoint"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)
    checkpoint.mkdir(parents=True)
    answers.touch()
    os.link(answers, checkpoint / "answers.jsonl")
    run([*CLI, "train-drafter", "--kind", kind, "--model", str(model), "--prompts", str(prompts),
                 "--out", str(out), "--max-hours", str(hours), "--steps", "100000", "--vocab-top", "16384",
                 "--eval-every", "100", "--quiet"])
    return json.loads((out / "config.json").read_text())["training"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m",
                        help=f"one of {', '.join(real_models.MODELS)} (or a model directory)")
    parser.add_argument("--hours", type=float, default=0.5, help="training budget of each kind")
    parser.add_argument("--kinds", default="mtp,dspark")
    parser.add_argument("--prompts", type=int, default=200, help="training prompts (the target answers each)")
    parser.add_argument("--bench-prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("build/train-compare"),
                        help="where prompts, answers and drafters go (a run's drafters are replaced)")
    args = parser.parse_args()
    model = Path(args.model) if Path(args.model).is_dir() else real_models.mlx_dir(args.model)
    if not model.exists():
        sys.exit(f"train_compare: {model} is missing: run `python scripts/real_models.py {args.model}` first")
    kinds = args.kinds.split(",")
    if not kinds or set(kinds) - set(CHECKPOINT) or len(set(kinds)) != len(kinds):
        sys.exit(f"train_compare: --kinds takes distinct kinds of {', '.join(CHECKPOINT)}, got {args.kinds!r}")
    work = args.work / model.name
    work.mkdir(parents=True, exist_ok=True)
    prompts, bench_prompts = work / "prompts.jsonl", work / "bench-prompts.jsonl"
    write_prompts(prompts, Path(sysconfig.get_paths()["stdlib"]), args.prompts, seed=1)
    write_prompts(bench_prompts, Path(numpy.__file__).parent, args.bench_prompts, seed=3)

    trained = {kind: train(kind, model, prompts, work / kind, args.hours, work / "answers.jsonl") for kind in kinds}

    drafters, paths = [], []
    for kind in kinds:
        drafters.append("mtp" if kind == "mtp" else "draft-model")
        paths += ["--mtp-path" if kind == "mtp" else "--draft-model", str(work / kind)]
    if drafters.count("draft-model") > 1:
        sys.exit("train_compare: bench compares one block drafter at a time: give one of dflash, dspark")
    report = work / "bench.json"
    run([*CLI, "bench", "--model", str(model), *paths, "--drafters", ",".join(drafters), "--prompts",
         str(bench_prompts), "--max-tokens", str(args.max_tokens), "--reps", str(args.reps), "--json", str(report)])
    overall = json.loads(report.read_text())["categories"]["overall"]["results"]
    print(f"\n{args.model}, {args.hours:g} h of training each on the answers to {args.prompts} prompts; bench: "
          f"{args.bench_prompts} unseen prompts x {args.max_tokens} tokens x {args.reps} reps, adaptive policy\n")
    print("| drafter | steps | held-out acceptance by draft position | held-out drafts accepted a round | "
          "bench speedup | bench acceptance | tokens a round |")
    print("|---|---|---|---|---|---|---|")
    for kind, drafter in zip(kinds, drafters):
        t, r = trained[kind], overall[drafter]
        by_position = t["held_out_acceptance_per_position"]["answers"]
        accepted = sum(math.prod(by_position[:j + 1]) for j in range(len(by_position)))
        print(f"| {kind} | {t['steps']} | {' '.join(f'{a:.0%}' for a in by_position)} | {accepted:.2f} | "
              f"{r['speedup']:.2f}x | {r['acceptance']:.0%} | {r['mean_acceptance_length']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
