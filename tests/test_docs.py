"""The docs cannot rot unseen: every relative link in README.md and docs/ resolves, every `mlx-spec ...` command
they show parses with the current argument parser (a dry parse: a flag that no longer exists fails), the command
reference says what each `--help` says, the error list is the code's, and the figures are their records'."""

import re
import shlex
from pathlib import Path

import pytest

from mlx_spec.commands.arguments import build_parser

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


def subcommands():
    import argparse

    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize("command", list(subcommands()))
def test_the_cli_reference_says_what_help_says(command):
    """docs/cli.md (written by scripts/cli_reference.py) shows every flag of every command with the help text and
    default its --help gives (compared word by word, so argparse's wrapping across Python versions does not
    matter)."""
    section = (ROOT / "docs" / "cli.md").read_text().split(f"## mlx-spec {command}\n")[1].split("\n## ")[0]
    words = " ".join(section.split())
    sub = subcommands()[command]
    for action in sub._actions:
        for flag in action.option_strings:
            assert flag in words, f"{command} {flag}: missing from docs/cli.md (run python scripts/cli_reference.py)"
        if action.help:
            text = " ".join((action.help % {"default": action.default, "prog": sub.prog}).split())
            assert text in words, f"{command} {action.option_strings}: docs/cli.md says another help or default"


@pytest.mark.parametrize("script", ["error_reference.py", "doc_figures.py", "architecture.py"])
def test_generated_pages_match_what_they_are_written_from(script):
    """docs/troubleshooting.md lists every one-line error the code raises; every figures block in README.md and
    docs/ holds what its record in docs/benchmarks/ says (no speed figure typed by hand); docs/architecture.md
    shows the wings and modules the code has."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_figures_block_names_a_record_with_its_provenance():
    import json

    names = re.findall(r"<!-- figures: ([\w-]+)", " ".join(page.read_text() for page in PAGES))
    assert names
    for name in names:
        record = json.loads((ROOT / "docs" / "benchmarks" / f"{name}.json").read_text())
        assert record["command"].startswith("python scripts/") and record["output"]
        assert {"commit", "date", "machine", "load"} <= set(record)
