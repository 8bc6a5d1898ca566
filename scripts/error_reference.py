"""Write the list of every one-line error in docs/troubleshooting.md from the code itself (each `raise SpecError`
message, `{...}` standing for what it names at run time), grouped by the part of mlx-spec that says it.

    python scripts/error_reference.py            # rewrite the list in docs/troubleshooting.md
    python scripts/error_reference.py --check    # exit 1 when the list differs from the code
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
MARK = "<!-- every error: written by scripts/error_reference.py -->\n"


def template(node: ast.expr) -> str | None:
    """A message's text with `{...}` for each value filled in at run time (None: not a literal message)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{...}" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left), template(node.right)
        return None if left is None or right is None else left + right
    return None


def messages(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and getattr(node.exc.func, "id", "")
                == "SpecError" and node.exc.args and (text := template(node.exc.args[0])) is not None):
            found.append((node.lineno, " ".join(text.split())))
    return [text for _, text in sorted(found)]


def listing() -> str:
    parts = []
    for path in sorted((ROOT / "mlx_spec").rglob("*.py")) + sorted((ROOT / "tui").rglob("*.py")):
        found = list(dict.fromkeys(messages(path)))
        if found:
            parts.append(f"### {path.relative_to(ROOT)}\n\n" + "\n".join(f"- {m.replace('|', '/')}" for m in found))
    return MARK + "\n\n".join(parts) + "\n"


def main() -> int:
    text = PAGE.read_text()
    head = text.split(MARK)[0] if MARK in text else text
    new = head + listing()
    if "--check" in sys.argv[1:]:
        if new != text:
            print("docs/troubleshooting.md lists other errors than the code raises: run python "
                  "scripts/error_reference.py")
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
