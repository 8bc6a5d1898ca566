"""`mlx-spec bench`: does speculation pay on this machine, for this model, on this kind of work?

Plain decoding and each drafter run on the same prompts, interleaved (A, B, C, A, B, C, ...), sharing one copy
of the target's weights. Per category and overall: median decode tokens/s, speedup over plain decoding,
acceptance, mean acceptance length, and a verdict. Beside each speedup, the bound E[N] / (k c + v(k)) from the
run's own acceptance and the round costs `Engine.profile` measured (draft cost c and verify cost v(k), in plain
steps), and the fraction of it achieved: what the rest of the round (sampling, bookkeeping, synchronisation)
costs. Results go to JSON and to an SVG bar chart.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass

import psutil

from ..core.prompts import render_prompt
from ..core.sampling import SamplingParams
from ..core.stats import RoundCosts
from ..decode.engine import Engine


def median_ms(fn, reps: int) -> float:
    """Median wall time of `fn()` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


class Neighbours:
    """How much CPU other processes took while a benchmark ran (context manager), and whether the figures
    can be trusted: on a 2-core machine a busy neighbour moves them by 10% or more."""

    LIMIT = 0.10  # other processes' share of all CPUs, or the spread of repeated plain runs, beyond which we warn

    def __enter__(self) -> "Neighbours":
        self.start = (time.perf_counter(), busy_seconds(), own_seconds())
        return self

    def __exit__(self, *exc) -> None:
        wall, busy, own = (now - then for now, then in zip((time.perf_counter(), busy_seconds(), own_seconds()),
                                                             self.start))
        self.share = max(0.0, busy - own) / (wall * (psutil.cpu_count() or 1)) if wall > 0 else 0.0

    def verdict(self, plain_spread: float | None = None) -> tuple[bool, str]:
        """(reliable, a line saying why); `plain_spread`: (max - min) / median of repeated plain runs."""
        spread = f"; plain runs spread {plain_spread:.0%}" if plain_spread is not None else ""
        cpus = psutil.cpu_count() or 1
        if self.share > self.LIMIT or (plain_spread or 0) > self.LIMIT:
            return False, (f"UNRELIABLE: other processes used {self.share:.0%} of the {cpus} CPUs during the "
                           f"benchmark{spread}: rerun on a quiet machine")
        return True, f"quiet machine: other processes used {self.share:.0%} of the {cpus} CPUs{spread}"


def busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def own_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def spread(values: list[float]) -> float:
    """(max - min) / median: how far repeated measurements of one thing disagree."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else 0.0


def interleaved(engines: dict, prompt, max_tokens: int, reps: int = 3) -> dict:
    """name -> (median decode tok/s, the last run's Stats), running the engines alternately so that drift
    hits every contender alike. Prints to stderr when the machine was too busy for the figures to be trusted
    (the first engine is taken as the baseline whose repeated runs should agree)."""
    speeds, stats = {name: [] for name in engines}, {}
    with Neighbours() as neighbours:
        for _ in range(reps):
            for name, engine in engines.items():
                stats[name] = engine.generate(prompt, max_tokens=max_tokens).stats
                speeds[name].append(stats[name].decode_tps)
    reliable, line = neighbours.verdict(spread(next(iter(speeds.values()))) if reps > 1 else None)
    if not reliable:
        print(line, file=sys.stderr)
    return {name: (statistics.median(speeds[name]), stats[name]) for name in engines}


ENABLE_ABOVE = 1.05  # a drafter must beat plain decoding by this much to be recommended


@dataclass
class Run:
    category: str
    contender: str
    tps: float
    acceptance: float
    mean_acceptance_length: float
    draft_len: float = 0.0  # mean drafts per round (a tree's depth)
    nodes: float = 0.0  # mean drafted tokens verified per round (a tree's nodes)
    by_depth: tuple[float, ...] = ()  # acceptance at each draft position (a tree's depth)


def run_bench(plain: Engine, drafters: list[str], categories: dict, max_tokens: int, reps: int, on_run=None,
              draft_len: int | None = None) -> dict:
    """`plain`: an engine with drafting off; each drafter runs on its weights (`Engine.with_drafter`).
    draft_len: pinned for every drafter; None lets the adaptive policy choose, as users run it."""
    engines = {"plain": plain}
    for name in drafters:
        engines[name] = plain.with_drafter(name)
        engines[name].pin(draft_len)
    first_prompt = next(iter(categories.values()))[1][0]
    costs = {name: engine.profile(render_prompt(plain.tokenizer, first_prompt),
                                  [draft_len] if draft_len else list(range(1, engine.max_draft_len + 1)))
             for name, engine in engines.items() if name != "plain"}
    runs, plain_spreads, differing = [], [], set()
    with Neighbours() as neighbours:
        for category, (temperature, prompts) in categories.items():
            params = SamplingParams(temperature=temperature)
            for prompt in prompts:
                ids = render_prompt(plain.tokenizer, prompt)
                for rep in range(reps):
                    for name, engine in engines.items():  # interleaved: drift hits every contender alike
                        result = engine.generate(ids, params, max_tokens, seed=rep)
                        stats = result.stats
                        if name == "plain":
                            plain_tokens = result.tokens
                        elif temperature == 0 and result.tokens != plain_tokens:
                            differing.add(name)
                        per_round = (lambda n: n / stats.rounds if stats.rounds else 0.0)
                        runs.append(Run(category, name, stats.decode_tps, stats.acceptance_rate,
                                        stats.mean_acceptance_length, per_round(stats.drafted),
                                        per_round(stats.nodes), tuple(stats.per_position_acceptance)))
                        if on_run:
                            on_run(runs[-1])
                if reps > 1:
                    plain_spreads.append(spread([r.tps for r in runs[-reps * len(engines)::len(engines)]]))
    report = summarise(runs, list(engines), costs)
    greedy = sum(reps * len(prompts) for temperature, prompts in categories.values() if temperature == 0)
    report["greedy_identical"] = {"outputs": greedy, "differing": sorted(differing)}
    reliable, note = neighbours.verdict(statistics.median(plain_spreads) if plain_spreads else None)
    report["machine"] = {"reliable": reliable, "note": note, "other_processes_cpu_share": neighbours.share}
    return report


def summarise(runs: list[Run], contenders: list[str], costs: dict[str, RoundCosts] | None = None) -> dict:
    """Per category and overall; `costs` (contender -> RoundCosts) adds each drafter's bound and the fraction
    of it achieved."""
    costs = costs or {}
    report = {"contenders": contenders, "categories": {},
              "round_costs": {name: {"plain_step_ms": 1000 * c.verify[0],
                                     "draft_cost_c": {k: c.draft[k] / k / c.verify[0] for k in c.draft},
                                     "verify_cost_v": {k: c.verify[k] / c.verify[0] for k in c.verify}}
                              for name, c in costs.items()}}
    for category in [*dict.fromkeys(r.category for r in runs), "overall"]:
        rows = {}
        for name in contenders:
            mine = [r for r in runs if r.contender == name and category in (r.category, "overall")]
            rows[name] = {"tps": statistics.median(r.tps for r in mine),
                          "acceptance": statistics.mean(r.acceptance for r in mine),
                          "mean_acceptance_length": statistics.mean(r.mean_acceptance_length for r in mine),
                          "draft_len": statistics.mean(r.draft_len for r in mine),
                          "nodes_per_round": statistics.mean(r.nodes for r in mine),
                          "acceptance_by_depth": mean_by_depth([r.by_depth for r in mine])}
        plain = rows["plain"]["tps"]
        for name, row in rows.items():
            row["speedup"] = row["tps"] / plain if plain else 0.0
            if name in costs:
                row["bound"] = costs[name].bound(row["draft_len"], row["mean_acceptance_length"])
                row["achieved"] = row["speedup"] / row["bound"]
        # a drafter whose drafts are never accepted cannot be faster: such a "win" is timing noise
        useful = [n for n in contenders if n != "plain" and rows[n]["mean_acceptance_length"] > 1.05]
        best = max(useful, key=lambda n: rows[n]["speedup"], default=None)
        verdict = (f"enable {best} ({rows[best]['speedup']:.2f}x)" if best and rows[best]["speedup"] >= ENABLE_ABOVE
                   else "disable: plain decoding is as fast")
        report["categories"][category] = {"results": rows, "verdict": verdict}
    return report


def mean_by_depth(runs: list[tuple[float, ...]]) -> list[float]:
    """The mean acceptance at each depth, over the runs that drafted that deep."""
    deepest = max((len(r) for r in runs), default=0)
    return [statistics.mean(r[d] for r in runs if len(r) > d) for d in range(deepest)]


def table(report: dict) -> str:
    """One line per category and contender; bound = E[N] / (k c + v(k)), achieved = speedup / bound."""
    width = max(len(n) for n in report["contenders"])
    lines = [f"{'category':14s} {'':{width}s}   tok/s  speedup   bound  achieved  acceptance  tokens/round  verdict"]
    for category, entry in report["categories"].items():
        for i, (name, r) in enumerate(entry["results"].items()):
            line = f"{category if i == 0 else '':14s} {name:{width}s} {r['tps']:7.1f}  {r['speedup']:6.2f}x"
            if name != "plain":
                bound = (f"{r['bound']:6.2f}x  {r['achieved']:7.0%}" if "bound" in r else f"{'-':>7s}  {'-':>7s}")
                line += f"  {bound}  {r['acceptance']:10.0%}  {r['mean_acceptance_length']:12.2f}"
            if i == 0:
                line = f"{line:{len(lines[0]) - len('verdict')}s}{entry['verdict']}"
            lines.append(line.rstrip())
    overall = report["categories"].get("overall", {"results": {}})["results"]
    for name, r in overall.items():
        if r.get("nodes_per_round", 0) > r["draft_len"] + 1e-9:  # a tree: more nodes than positions
            depths = " ".join(f"{a:.0%}" for a in r["acceptance_by_depth"])
            lines.append(f"tree, {name}: {r['nodes_per_round']:.1f} nodes verified/round, depth {r['draft_len']:.1f}, "
                         f"accepted path {r['mean_acceptance_length'] - 1:.2f}, acceptance by depth [{depths}]")
    for name, c in report.get("round_costs", {}).items():
        draft = ", ".join(f"{k}: {v:.2f}" for k, v in c["draft_cost_c"].items())
        verify = ", ".join(f"{k}: {v:.2f}" for k, v in c["verify_cost_v"].items() if k)
        lines.append(f"round costs, {name}: plain step {c['plain_step_ms']:.1f} ms; draft cost c per token by k "
                     f"{{{draft}}}; verify cost v(k) {{{verify}}}")
    if report.get("greedy_identical", {}).get("outputs"):
        checked = report["greedy_identical"]
        lines.append(f"greedy outputs DIFFER from plain decoding: {', '.join(checked['differing'])}"
                     if checked["differing"] else
                     f"greedy outputs identical to plain decoding: all {checked['outputs']} of every drafter")
    if "machine" in report:
        lines.append(report["machine"]["note"])
    return "\n".join(lines)


def svg_chart(report: dict) -> str:
    """Grouped bars: speedup over plain decoding per category and contender, a line at 1.0x."""
    names, categories = report["contenders"], list(report["categories"])
    colours = ["#9e9e9e", "#1f77b4", "#2ca02c", "#d62728", "#9467bd"]
    legend = [14 + 7 * len(name) + 16 for name in names]  # swatch, label at ~7 px a character, gap
    width = max(120 * len(categories) + 80, 50 + sum(legend) + 10)
    height, left, bottom, group = 320, 50, 40, 100
    top = max(max(e["results"][n]["speedup"] for n in names) for e in report["categories"].values()) * 1.15 or 1
    scale = (height - bottom - 20) / top
    bar = group / (len(names) + 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11">', f'<text x="{left}" y="14">speedup over plain decoding</text>']
    for i, category in enumerate(categories):
        x0 = left + 20 + i * 120
        for j, name in enumerate(names):
            h = report["categories"][category]["results"][name]["speedup"] * scale
            parts.append(f'<rect x="{x0 + j * bar:.1f}" y="{height - bottom - h:.1f}" width="{bar - 2:.1f}" '
                         f'height="{h:.1f}" fill="{colours[j % len(colours)]}"><title>{name}: '
                         f'{h / scale:.2f}x</title></rect>')
        parts.append(f'<text x="{x0}" y="{height - bottom + 14}">{category}</text>')
    y1 = height - bottom - scale
    parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y1:.1f}" y2="{y1:.1f}" stroke="black" '
                 'stroke-dasharray="4"/>')
    for j, name in enumerate(names):
        x = left + sum(legend[:j])
        parts.append(f'<rect x="{x}" y="{height - 16}" width="10" height="10" fill="{colours[j % len(colours)]}"/>'
                     f'<text x="{x + 14}" y="{height - 7}">{name}</text>')
    return "\n".join(parts + ["</svg>"])
