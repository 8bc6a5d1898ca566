"""Write docs/cli.md, the command-line reference, from the argument parser itself, so that the docs and every
command's `--help` say the same flags and defaults.

    python scripts/cli_reference.py            # rewrite docs/cli.md
    python scripts/cli_reference.py --check    # exit 1 when docs/cli.md differs from the parser
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"
sys.path.insert(0, str(ROOT))


def reference() -> str:
    os.environ["COLUMNS"] = "110"  # argparse wraps to the terminal: one width for everyone
    from mlx_spec.commands.arguments import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = ["# Command-line reference\n",
             "Every command's `--help`, as `mlx-spec COMMAND --help` prints it (written from the argument parser "
             "by `python scripts/cli_reference.py`; a test checks that it still matches).\n"]
    for name, sub in commands.choices.items():
        parts.append(f"## mlx-spec {name}\n\n```text\n{sub.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


def main() -> int:
    check = "--check" in sys.argv[1:]
    text = reference()
    if check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print("docs/cli.md differs from the argument parser: run python scripts/cli_reference.py")
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
