"""`mlx-spec bench`: interleaved plain vs drafters per category, a verdict each, JSON and an SVG chart."""

import json
import xml.etree.ElementTree as ET

from test_cli import assert_one_line_error, run_cli

from mlx_spec.bench import Run, summarise


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
    assert "overall" in proc.stdout and "verdict" in proc.stdout
    svg = ET.parse(plot).getroot()
    assert len([e for e in svg.iter() if e.tag.endswith("rect")]) >= 8 * 3


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
    from mlx_spec.bench import svg_chart

    contenders = ["plain", "mtp", "draft-model", "ngram"]
    report = summarise([Run("code", n, 10.0 + i, 0.5, 1.5) for i, n in enumerate(contenders)], contenders)
    svg = ET.fromstring(svg_chart(report))
    width = float(svg.get("width"))
    labels = {e.text: float(e.get("x")) for e in svg.iter() if e.tag.endswith("text") and e.text in contenders}
    assert set(labels) == set(contenders)
    assert all(x + 7 * len(name) <= width for name, x in labels.items())  # ~7 px a character at 11 px
