"""Coding prompts made from Python source, for `mlx-spec train-mtp --prompts` (the target's own answers to them
are the training text closest to what drafting meets in a chat about code).

Each documented function becomes "Write a Python function `name(args)` that: <its docstring's first line>",
a fixed sample of them (--count, --seed) in JSONL:

    python scripts/code_prompts.py /usr/lib/python3.11 --count 400 > prompts.jsonl
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
from pathlib import Path


def prompts(folder: Path) -> list[str]:
    found = []
    for file in sorted(folder.rglob("*.py")):
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                summary = (ast.get_docstring(node) or "").strip().split("\n")[0].strip()
                if len(summary.split()) >= 4:
                    args = ", ".join(a.arg for a in node.args.args if a.arg != "self")
                    found.append(f"Write a Python function `{node.name}({args})` that: {summary}")
    return sorted(set(found))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="Python source to draw documented functions from")
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.count < 1:
        sys.exit(f"code_prompts: --count must be >= 1, got {args.count}")
    if not args.folder.is_dir():
        sys.exit(f"code_prompts: {args.folder} is not a folder: give one holding Python source")
    found = prompts(args.folder)
    for prompt in random.Random(args.seed).sample(found, min(args.count, len(found))):
        print(json.dumps({"prompt": prompt, "category": "code"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
