"""Figures with provenance: run a benchmark script and keep what it printed with where it came from.

    python scripts/record.py NAME -- python scripts/bench_real.py --tokens 32 --reps 3

Runs the command (its output shown as it comes), measures how much CPU other processes took meanwhile, and
writes docs/benchmarks/NAME.json: the command, the commit (and whether the code differed from it), the
date, the machine, that load, and every line the command printed (a script's tables are its figures), the lines
that give each run's own timing (`scripts/timings.py`: `raw timings: ...`) kept apart as `raw_timings`. Nothing
is written when the command fails. `python scripts/doc_figures.py` puts the records into README.md and docs/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "benchmarks"
CODE = ("mlx_spec", "tui", "scripts", "pyproject.toml")
sys.path.insert(0, str(ROOT))

from mlx_spec.commands.bench import Neighbours  # noqa: E402
from timings import RAW  # noqa: E402  (scripts/, this file's folder)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def machine() -> dict:
    from importlib.metadata import version

    return {"platform": platform.platform(), "machine": platform.machine(), "cpus": psutil.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "python": platform.python_version(),
            "mlx": version("mlx"), "mlx_lm": version("mlx-lm")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the record's name: docs/benchmarks/NAME.json")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not args.name.replace("-", "").isalnum():
        parser.error("give a name of letters, digits and dashes, then -- and the command")
    lines = []
    started = datetime.datetime.now(datetime.timezone.utc)
    commit = git("rev-parse", "--short", "HEAD")
    changed = bool(git("status", "--porcelain", "--untracked-files=no", "--", *CODE))  # what the figures measure
    with Neighbours() as neighbours:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for raw in proc.stdout:  # a line a progress counter rewrote with carriage returns: what it ended as
            line = raw.decode(errors="replace").rstrip("\n").split("\r")[-1]
            print(line, flush=True)
            lines.append(line)
        proc.wait()
    if proc.returncode:
        print(f"record.py: the command exited with {proc.returncode}; nothing recorded", file=sys.stderr)
        return proc.returncode
    record = {"name": args.name, "command": shlex.join(command), "commit": commit, "uncommitted_changes": changed,
              "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
              "load": {"other_processes_cpu_share": round(neighbours.share, 3),
                       "seconds": round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds())},
              "output": [line for line in lines if not line.startswith(RAW)],
              "raw_timings": [line.removeprefix(RAW) for line in lines if line.startswith(RAW)]}
    RECORDS.mkdir(parents=True, exist_ok=True)
    path = RECORDS / f"{args.name}.json"
    staged = path.with_suffix(".json.partial")
    staged.write_text(json.dumps(record, indent=1) + "\n")
    staged.replace(path)
    print(f"recorded {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
