"""Before and after: a benchmark script run in this checkout and an earlier one in turn, each figure's ratio.

    python scripts/bench_versus.py --before ../before --rounds 2 -- bench_real.py --tokens 40 --reps 1 --ks 4

Each round runs scripts/<script> of this checkout with its mlx_spec, then the one of the checkout at --before with
its own (which of the two goes first alternates by round), each in a fresh process; the script must exist in both
(its imports may differ, its measurements should not). The raw-timings lines the runs print (scripts/timings.py) are gathered per
checkout; the table gives each figure's median over every run of it, after / before, and each side's spread (max -
min over median). mlx-lm's contenders run on both sides: a control for how much the machine drifted meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def raw_runs(output: str) -> dict[str, tuple[str, list[float]]]:
    """name -> (unit, runs) from a benchmark's raw-timings lines."""
    from timings import RAW

    found = {}
    for line in output.splitlines():
        if line.startswith(RAW):
            name, _, rest = line[len(RAW):].rpartition(": ")
            unit, *values = rest.split()
            found[name] = (unit, [float(v) for v in values])
    return found


def commit(folder: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=folder, capture_output=True,
                          text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a worktree of an earlier commit")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS]: a script in scripts/")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not (ROOT / "scripts" / command[0]).exists():
        parser.error("give a script of scripts/ after --, e.g. -- bench_real.py --tokens 40")
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT))
    from timings import raw_line

    from mlx_spec.commands.bench import Neighbours, spread

    sides = {"after": ROOT, "before": Path(args.before).resolve()}
    runs: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    units: dict[str, str] = {}
    with Neighbours() as neighbours:
        for r in range(args.rounds):
            for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                out = subprocess.run([sys.executable, str(sides[side] / "scripts" / command[0]), *command[1:]],
                                     cwd=sides[side], env={**os.environ, "PYTHONPATH": str(sides[side])},
                                     capture_output=True, text=True)
                if out.returncode:
                    print(out.stdout[-2000:], out.stderr[-2000:], sep="\n")
                    return out.returncode
                for name, (unit, values) in raw_runs(out.stdout).items():
                    units[name] = unit
                    runs[side].setdefault(name, []).extend(values)
    print(f"after: commit {commit(sides['after'])}, before: commit {commit(sides['before'])}; "
          f"scripts/{' '.join(command)}, {args.rounds} rounds, each side in a fresh process\n")
    print("| figure | unit | after | before | after / before | spread after | spread before |")
    print("|---|---|---|---|---|---|---|")
    for name in runs["after"]:
        if name not in runs["before"]:
            continue
        after, before = (statistics.median(runs[side][name]) for side in sides)
        print(f"| {name} | {units[name]} | {after:.4g} | {before:.4g} | {after / before:.2f} | "
              f"{spread(runs['after'][name]):.0%} | {spread(runs['before'][name]):.0%} |")
    for side in sides:
        for name, values in runs[side].items():
            print(raw_line(f"{side}, {name}", units[name], values))
    print(f"\n{neighbours.verdict()[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
