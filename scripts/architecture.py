"""Write the wings and modules of docs/architecture.md from the code: each wing's floor and role from `WINGS`
(which tests/test_structure.py holds the imports to), each module's line from the first sentence of its docstring.

    python scripts/architecture.py            # rewrite the tables in docs/architecture.md
    python scripts/architecture.py --check    # exit 1 when they differ from the code
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- wings and modules: written by scripts/architecture.py -->\n"
END = "<!-- end of what scripts/architecture.py writes -->\n"

# mlx_spec's wings, lowest floor first: a module imports only from its own wing and from lower floors (the wings
# of one floor not from each other). tui/ installs as mlx_spec.tui; loading and cli are one module each.
WINGS = [
    [("seams", "what stands on the ground: mlx-lm's internals behind one self-checking seam, rollback per cache "
               "type, memory, distributed ranks, the BLAS choice, files, the one error type")],
    [("core", "the values and rules every path shares: sampling, drafts, verification, events, statistics, "
              "prompts, grammars")],
    [("policy", "how many tokens to draft: one sequence's cost model, a batch's, profiles kept between runs")],
    [("models", "networks mlx-lm lacks or drops: MTP and nextn layers, heads, assistants, block drafters")],
    [("runners", "models with their caches: the target, a batch's ragged caches, the prompt cache")],
    [("drafters", "one module per drafter, their protocol and the table of their kinds")],
    [("decode", "the round loop: one sequence and a batch")],
    [("loading", "names, paths and hub ids to checkpoints; target and drafter loaded and checked")],
    [("serve", "the OpenAI- and Anthropic-compatible server and its client"),
     ("train", "training MTP heads and block drafters"),
     ("commands", "the command line's arguments and its jobs: bench, batch files, convert, GGUF import")],
    [("tui", "the Textual chat")],
    [("cli", "`mlx-spec`: every command, a thin client of the public API")],
]
FLOORS = [tuple(name for name, _ in floor) if len(floor) > 1 else floor[0][0] for floor in WINGS]


def first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    ends = [i for i, c in enumerate(text) if c == "." and text[i + 1:i + 2] in ("", " ")
            and not text[:i].endswith((" al", "e.g", "i.e", " vs"))]
    return text[:ends[0] if ends else len(text)].rstrip(":").replace("|", "/")


def files(name: str) -> list[Path]:
    folder = ROOT / ("tui" if name == "tui" else "mlx_spec")
    if (folder / name).is_dir():
        folder = folder / name
    elif name != "tui":
        return [folder / f"{name}.py"]
    return [p for p in sorted(folder.rglob("*.py")) if p.name != "__init__.py"]


def tables() -> str:
    wings = ["| floor | wing | what it holds |", "|---|---|---|"]
    modules = ["| module | what it is |", "|---|---|"]
    for number, floor in enumerate(WINGS, start=1):
        for name, role in floor:
            where = "tui/" if name == "tui" else f"mlx_spec/{name}" + ("/" if (ROOT / "mlx_spec" / name).is_dir()
                                                                        else ".py")
            wings.append(f"| {number} | `{where}` | {role} |")
            modules += [f"| `{path.relative_to(ROOT)}` | {first_sentence(path)} |" for path in files(name)]
    return BEGIN + "\n".join(wings) + "\n\n" + "\n".join(modules) + "\n" + END


def main() -> int:
    text = PAGE.read_text()
    head, rest = text.split(BEGIN) if BEGIN in text else (text, END)
    new = head + tables() + rest.split(END, 1)[1]
    if "--check" in sys.argv[1:]:
        if new != text:
            print("docs/architecture.md shows other wings or modules than the code has: run python "
                  "scripts/architecture.py")
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
