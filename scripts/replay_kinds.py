"""The figures docs/policy.md quotes from the kinds-of-work replays (tests/test_policy_kinds.py, on the traces
scripts/trace_kinds.py recorded): per kind and prompt, the default against plain decoding with and without the
draft model's stops, as the first command after the other kinds and as a first run; over the whole workload,
the default against every pinned length; and how often the draft model's drafts pass at each probability it
gave them.

    python scripts/replay_kinds.py [--trace tests/traces/kinds/draft-1.5b.json]

Replays charge each round the recorded cost of a round of its length: no timing here, the same figures on any
machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_policy_kinds import Pinned, answers, commands, kind_speeds, overall  # noqa: E402

BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 0.97, 1.01)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=ROOT / "tests/traces/kinds/draft-1.5b.json")
    args = parser.parse_args()
    for tokens in (48, 128):
        for disable, name in (((), "with the stops"), (("go_on",), "without the stops")):
            print(f"{tokens} tokens, {name}: each prompt / plain decoding (after the other kinds | first run)")
            for kind, by in kind_speeds(args.trace, tokens, disable).items():
                print(f"  {kind:14s} " + " ".join(f"{x:.2f}" for x in by["after other kinds"]) + " | "
                      + " ".join(f"{x:.2f}" for x in by["first run"]))
        replays = answers(args.trace, tokens)
        plain = overall([r.speed(Pinned(0)) for r in replays])
        pinned = ", ".join(f"k={k} {overall([r.speed(Pinned(k)) for r in replays]) / plain:.2f}x" for k in range(1, 9))
        print(f"  whole workload, pinned: {pinned}")
        for disable, name in (((), "with"), (("go_on",), "without")):
            speeds, _ = commands(replays, commands(replays, None, disable)[1], disable)
            print(f"  whole workload, the default {name} the stops: {overall(speeds) / plain:.2f}x")
    entries = json.loads(args.trace.read_text())["prompts"]
    if "confidence" in entries[0]:
        pairs = [(c, m) for e in entries for c, m in zip(e["confidence"], e["match"])]
        for low, high in zip(BINS, BINS[1:]):
            passed = [m for c, m in pairs if low <= c < high]
            print(f"drafts given probability {low:.2f}-{min(high, 1):.2f}: {len(passed)}, passed "
                  f"{sum(passed) / len(passed):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
