"""Each run's own timing beside a benchmark's summary, and what a summary of runs can say.

A benchmark prints `raw_line(...)` for every contender (its runs in the order they ran); scripts/record.py keeps
those lines apart, as the record's raw timings, so that a median and a spread can be checked against the runs
they came from. A spread needs two runs of one thing: from one run, `spread_cell` and `verdict` say so instead
of showing 0%.
"""

from __future__ import annotations

from collections.abc import Iterable

from mlx_spec.commands.bench import spread

RAW = "raw timings: "  # the start of a line that scripts/record.py keeps as a raw timing


def raw_line(name: str, unit: str, runs: Iterable[float]) -> str:
    """One contender's runs in the order they ran, e.g. `raw timings: plain, prompt 1: tok/s 2.31 2.25 2.4`."""
    return f"{RAW}{name}: {unit} " + " ".join(f"{value:.4g}" for value in runs)


def raw_lines_by_prompt(runs: dict[str, dict[int, list[float]]], unit: str = "tok/s", prefix: str = "") -> str:
    """`raw_line` for every contender's runs on every prompt (contender -> prompt index -> runs), one per line."""
    return "\n".join(raw_line(f"{prefix}{name}, prompt {p + 1}", unit, values)
                     for name, by_prompt in runs.items() for p, values in by_prompt.items())


def repeated(runs_by_case: Iterable[list[float]]) -> list[list[float]]:
    """The cases (a prompt, a batch size) that ran more than once: only they have a spread."""
    return [runs for runs in runs_by_case if len(runs) > 1]


def spread_cell(runs_by_case: Iterable[list[float]]) -> str:
    """A table's spread: the worst case's (max - min) / median, or `one run` when no case was repeated."""
    runs = repeated(runs_by_case)
    return f"{max(spread(r) for r in runs):.0%}" if runs else "one run"


def verdict(neighbours, plain_runs_by_case: Iterable[list[float]]) -> str:
    """Whether the machine was quiet enough to trust the figures (`mlx_spec.commands.bench.Neighbours.verdict`), judged
    on the plain runs' worst spread too where a case was repeated; else saying that one repetition has none."""
    runs = repeated(plain_runs_by_case)
    if runs:
        return neighbours.verdict(max(spread(r) for r in runs))[1]
    return f"{neighbours.verdict()[1]}; one repetition: no spread"
