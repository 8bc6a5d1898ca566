"""`mlx-spec bench`: interleaved plain vs drafters per category, a verdict each, JSON and an SVG chart."""

import json
import xml.etree.ElementTree as ET

import pytest
from helpers import PROMPT, plain_greedy
from test_cli import assert_one_line_error, run_cli

import mlx_spec
from mlx_spec.commands.bench import Run, summarise
from mlx_spec.core.prompts import SUITES
from mlx_spec.core.stats import RoundCosts


def test_bench_runs_and_reports(tiny, tmp_path):
    report_path, plot = tmp_path / "report.json", tmp_path / "chart.svg"
    proc = run_cli("bench", "--model", str(tiny["qwen3_5"]), "--suite", "quick", "--max-tokens", "8",
                   "--json", str(report_path), "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["contenders"] == ["plain", "mtp", "ngram"]  # every drafter the model has
    assert set(report["categories"]) == {"code", "extraction", "json", "summarisation", "chat", "math",
                                         "creative", "overall"}
    for entry in report["categories"].values():
        assert entry["results"]["plain"]["speedup"] == 1.0 and entry["verdict"]
        assert all(r["tps"] > 0 for r in entry["results"].values())
        for name in ("mtp", "ngram"):
            r = entry["results"][name]
            assert r["bound"] > 0 and r["achieved"] == r["speedup"] / r["bound"]
    assert set(report["round_costs"]) == {"mtp", "ngram"}
    assert report["round_costs"]["mtp"]["plain_step_ms"] > 0
    assert "overall" in proc.stdout and "verdict" in proc.stdout and "bound" in proc.stdout
    assert "round costs, mtp: plain step" in proc.stdout
    greedy = sum(len(prompts) for temperature, prompts in SUITES["quick"].values() if temperature == 0)
    assert greedy and report["greedy_identical"] == {"outputs": greedy, "differing": []}  # --reps 1
    assert f"greedy outputs identical to plain decoding: all {greedy} of every drafter" in proc.stdout
    svg = ET.parse(plot).getroot()
    assert len([e for e in svg.iter() if e.tag.endswith("rect")]) >= 8 * 3


def test_the_work_suite_reports_each_kind_of_work(tiny, tmp_path):
    """`--suite work`: nine kinds of chat work, three prompts each, every one through the model's chat template, a
    row per kind."""
    report_path = tmp_path / "report.json"
    proc = run_cli("bench", "--model", str(tiny["qwen3"]), "--suite", "work", "--drafters", "ngram",
                   "--max-tokens", "4", "--json", str(report_path))
    assert proc.returncode == 0, proc.stderr
    kinds = {"writing", "rewriting", "translation", "short QA", "passage QA", "summarization", "math", "code", "chat"}
    report = json.loads(report_path.read_text())
    assert set(report["categories"]) == kinds | {"overall"}
    assert report["greedy_identical"] == {"outputs": 27, "differing": []}
    assert all(f"{kind:14s} plain" in proc.stdout for kind in kinds)


def test_bench_reports_trees(tiny, tmp_path):
    """A tree's nodes per round, its accepted path and its acceptance at each depth."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPT, "category": "code"}) + "\n")
    report_path = tmp_path / "report.json"
    proc = run_cli("bench", "--model", str(tiny["qwen3"]), "--draft-model", str(tiny["qwen3-eagle3"]), "--drafters",
                   "draft-model", "--tree-width", "3", "--num-draft", "3", "--prompts", str(prompts),
                   "--max-tokens", "24", "--reps", "1", "--json", str(report_path))
    assert proc.returncode == 0, proc.stderr
    row = json.loads(report_path.read_text())["categories"]["overall"]["results"]["draft-model"]
    assert row["draft_len"] <= 3 < row["nodes_per_round"] <= 9  # depth 3, at most 3 nodes a level
    assert len(row["acceptance_by_depth"]) == 3 and row["acceptance_by_depth"][0] > 0
    assert row["acceptance_by_depth"] == sorted(row["acceptance_by_depth"], reverse=True)
    assert f"tree, draft-model: {row['nodes_per_round']:.1f} nodes verified/round" in proc.stdout


def test_verdicts_follow_measured_speedup_and_acceptance():
    runs = [Run("code", "plain", 10.0, 0, 1), Run("code", "ngram", 14.0, 0.8, 3.0),
            Run("chat", "plain", 10.0, 0, 1), Run("chat", "ngram", 10.2, 0.3, 1.4),
            Run("noise", "plain", 10.0, 0, 1), Run("noise", "ngram", 13.0, 0.0, 1.0)]
    report = summarise(runs, ["plain", "ngram"])
    verdicts = {c: e["verdict"] for c, e in report["categories"].items()}
    assert verdicts["code"] == "enable ngram (1.40x)"
    assert verdicts["chat"].startswith("disable") and verdicts["noise"].startswith("disable")


def test_bad_prompts_file_is_refused(tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fine", "category": "a"}\n{"no": "prompt"}\n')
    proc = run_cli("bench", "--model", str(tiny["qwen3"]), "--prompts", str(prompts))
    assert_one_line_error(proc, "p.jsonl:2")


def test_chart_legend_fits_the_canvas():
    from mlx_spec.commands.bench import svg_chart

    contenders = ["plain", "mtp", "draft-model", "ngram"]
    report = summarise([Run("code", n, 10.0 + i, 0.5, 1.5) for i, n in enumerate(contenders)], contenders)
    svg = ET.fromstring(svg_chart(report))
    width = float(svg.get("width"))
    labels = {e.text: float(e.get("x")) for e in svg.iter() if e.tag.endswith("text") and e.text in contenders}
    assert set(labels) == set(contenders)
    assert all(x + 7 * len(name) <= width for name, x in labels.items())  # ~7 px a character at 11 px


@pytest.mark.parametrize("family, drafter", [("qwen3", "draft-model"), ("qwen3_5", "mtp"), ("gemma3", "ngram")])
def test_profile_times_round_parts_and_leaves_the_engine_exact(tiny, family, drafter):
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(tiny[f"{family}-draft"]), drafter=drafter)
    costs = engine.profile(PROMPT, [1, 3], rounds=2)
    assert 0 in costs.verify and set(costs.draft) == set(costs.verify) - {0}
    if drafter != "ngram":  # n-gram drafts only what it finds, and is timed at that length
        assert set(costs.verify) == {0, 1, 3}
    assert all(s > 0 for s in [*costs.verify.values(), *costs.draft.values()])
    # the profiled rounds were real rounds: the engine's caches still describe its context exactly
    ids = engine.encode(PROMPT)
    assert engine.generate(ids, max_tokens=40).tokens == plain_greedy(tiny[family], ids, 40)


def test_bound_is_tokens_per_round_over_round_cost_in_plain_steps():
    costs = RoundCosts(verify={0: 0.10, 2: 0.12, 4: 0.14}, draft={2: 0.02, 4: 0.04})
    assert costs.relative(0) == 1.0
    assert costs.relative(2) == pytest.approx(1.4)  # 2 c + v(2) = 2 * 0.1 + 1.2
    assert costs.relative(3) == pytest.approx(1.6)  # halfway between k = 2 and k = 4
    assert costs.bound(4, 3.6) == pytest.approx(3.6 / 1.8)
    report = summarise([Run("code", "plain", 10.0, 0, 1), Run("code", "ngram", 15.0, 0.6, 2.8, draft_len=4)],
                       ["plain", "ngram"], {"ngram": costs})
    row = report["categories"]["code"]["results"]["ngram"]
    assert row["bound"] == pytest.approx(2.8 / 1.8) and row["achieved"] == pytest.approx(1.5 / (2.8 / 1.8))
    assert report["round_costs"]["ngram"]["verify_cost_v"][4] == pytest.approx(1.4)
