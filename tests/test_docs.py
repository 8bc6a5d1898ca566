"""The docs cannot rot unseen: every relative link in README.md and docs/ resolves, and every `mlx-spec ...`
command they show parses with the current argument parser (a dry parse: a flag that no longer exists fails)."""

import re
import shlex
from pathlib import Path

import pytest

from mlx_spec.arguments import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_OPERATORS = {"|", "||", "&&", ";", "<", ">", "2>", ">>", "&"}


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```(?:sh|bash|shell|console)\n(.*?)^```", text, flags=re.M | re.S)


def commands(page: Path) -> list[tuple[str, list[str]]]:
    """(the line as shown, its arguments after `mlx-spec`) for every mlx-spec command in the page's shell blocks,
    continuation lines joined, cut at the first shell operator or comment, optional parts ([--flag X]) included."""
    found = []
    for block in shell_blocks(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            for start, word in enumerate(words):
                if word == "mlx-spec":
                    rest = words[start + 1:]
                    end = next((i for i, w in enumerate(rest) if w in SHELL_OPERATORS), len(rest))
                    optional = [w.lstrip("[").rstrip("]") if re.match(r"\[--|.*\]$", w) else w for w in rest[:end]]
                    found.append((line.strip(), optional))  # optional parts shown [--flag VALUE] parse too
                    break
    return found


CASES = [(page, line, args) for page in PAGES for line, args in commands(page)]


def test_the_pages_show_commands():
    assert len(CASES) > 20  # the extraction works: the README alone shows dozens


@pytest.mark.parametrize("page,line,args", CASES, ids=[f"{p.name}:{line[:60]}" for p, line, _ in CASES])
def test_every_command_shown_parses(page, line, args, capsys):
    try:
        build_parser().parse_args(args)
    except SystemExit as e:
        if e.code:  # --help exits 0
            pytest.fail(f"{page.name}: `{line}` does not parse: {capsys.readouterr().err.strip().splitlines()[-1]}")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    broken = [link for link in links if not re.match(r"[a-z]+:|#", link)
              and not (page.parent / link.split("#")[0]).exists()]
    assert not broken, broken
