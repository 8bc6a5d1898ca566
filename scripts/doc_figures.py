"""Put recorded figures into the docs, so that no speed figure is typed by hand.

    python scripts/doc_figures.py            # rewrite every figures block from its record
    python scripts/doc_figures.py --check    # exit 1, naming each block that differs from its record

A block in README.md or docs/*.md

    <!-- figures: NAME -->            (or `<!-- figures: NAME table -->`: its markdown table and verdict only)
    <!-- /figures -->

is replaced by what docs/benchmarks/NAME.json (written by `scripts/record.py`) holds: the command's output, its
runs' raw timings in a collapsed block (not in a table-only block), a line saying how it was recorded (command,
commit, date, machine, the load of other processes), and the notes added to the record since, each marked so.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "benchmarks"
BLOCK = re.compile(r"(<!-- figures: ([\w-]+)( table)? -->\n)(.*?)(<!-- /figures -->)", re.S)


def provenance(record: dict) -> str:
    m, load = record["machine"], record["load"]
    changes = " plus uncommitted changes to the code" if record["uncommitted_changes"] else ""
    return (f"Recorded with `python scripts/record.py {record['name']} -- {record['command']}` at commit "
            f"{record['commit']}{changes}, {record['date']}, on {m['platform']} ({m['cpus']} CPUs, "
            f"{m['memory_gib']} GiB; MLX {m['mlx']}, mlx-lm {m['mlx_lm']}), other processes using "
            f"{load['other_processes_cpu_share']:.0%} of the CPUs over its {load['seconds']} s.")


def rendered(name: str, table_only: bool) -> str:
    path = RECORDS / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"doc_figures.py: no record {path.relative_to(ROOT)}: record it with scripts/record.py")
    record = json.loads(path.read_text())
    if table_only:  # the table, and the script's verdict on the machine's quiet
        body = "\n".join(line for line in record["output"] if line.startswith("|"))
        verdict = [line for line in record["output"] if line.startswith(("UNRELIABLE", "quiet machine"))]
        body += "".join(f"\n\n{line}" for line in verdict[-1:])
    else:
        body = "```text\n" + "\n".join(record["output"]) + "\n```" + raw_timings(record)
    notes = "".join(f"\n\nNote added to the record after it was made: {note}" for note in record.get("notes", []))
    return f"{body}\n\n{provenance(record)}{notes}\n"


def raw_timings(record: dict) -> str:
    """Each run's own timing as the script printed it, collapsed (records made before they were kept have none)."""
    lines = record.get("raw_timings")
    if not lines:
        return ""
    return ("\n\n<details><summary>Raw timings: every run, in the order it ran</summary>\n\n```text\n"
            + "\n".join(lines) + "\n```\n\n</details>")


def update(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + rendered(m.group(2), bool(m.group(3))) + m.group(5), text)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is out of date")
    args = parser.parse_args()
    stale = []
    for path in documents():
        text = path.read_text()
        new = update(text)
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"figures out of date in {', '.join(map(str, stale))}: run python scripts/doc_figures.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
