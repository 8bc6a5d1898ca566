"""Time the README's test command on a clean clone of HEAD, quiet or beside busy loops, and record how it ran.

    python scripts/time_suite.py             # the figure the README quotes for a quiet machine
    python scripts/time_suite.py --busy 2    # with two busy loops sharing the cores

Prints one line: seconds, the pytest summary, the commit, the date, the cores and the load average before the
start (a figure taken on a machine already busy says nothing about the suite). Runs this interpreter, with the
clone's own mlx_spec first on the path.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=0, help="busy loops to run beside the suite")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="mlx-spec-suite-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=clone, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(clone)})
            seconds = time.perf_counter() - start
        finally:
            for loop in loops:
                loop.kill()
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else f"exit {proc.returncode}"
    for line in proc.stdout.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            print(line)
    if proc.returncode:  # what failed, in pytest's words (the run is gone with its clone)
        print("\n".join([line for line in proc.stdout.splitlines() if line.startswith("E ")][:60]))
    print(f"{seconds:.0f} s ({seconds / 60:.1f} min): {summary}; `python -m pytest -q` on a clean clone of {commit}, "
          f"{datetime.now(timezone.utc):%Y-%m-%d}, {os.cpu_count()} cores, {args.busy} busy loops, load average "
          f"{load:.2f} before the start")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
