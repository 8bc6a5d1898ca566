"""`mlx-spec batch`: results per line, bad lines reported, resumable, and a kill loses or duplicates nothing."""

import json
import os
import signal
import subprocess
import sys
import time

from helpers import loaded, plain_greedy
from test_cli import run_cli

from mlx_spec.core.prompts import render_prompt


def write_requests(path, n):
    lines = [json.dumps({"id": f"r{i}", "prompt": f"def f{i}(x):", "max_tokens": 16 + i % 9, "raw": True})
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")


def read_results(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def greedy_text(tiny, prompt: str, max_tokens: int) -> str:
    """mlx-lm's plain greedy decoding of the tiny qwen3 (the reference)."""
    tokenizer = loaded(str(tiny["qwen3"]))[1]
    return tokenizer.decode(plain_greedy(tiny["qwen3"], render_prompt(tokenizer, prompt), max_tokens)).strip()


def test_results_bad_lines_and_resume(tiny, tmp_path):
    requests = tmp_path / "in.jsonl"
    requests.write_text("\n".join([
        json.dumps({"id": "plain", "prompt": "def add(a, b):", "max_tokens": 12}),
        json.dumps({"id": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.8, "seed": 2}),
        "{not json",
        json.dumps({"id": "bad", "prompt": "x", "top_p": 0}),
        json.dumps({"id": "both", "prompt": "x", "messages": []}),
        json.dumps({"id": 7, "prompt": "def g():", "max_tokens": 3}),  # ids keep their JSON type: 7 and "7" differ
        json.dumps({"id": "7", "prompt": "def h():", "max_tokens": 5}),
        json.dumps({"id": 7, "prompt": "def k():", "max_tokens": 3}),
        json.dumps({"id": "long", "prompt": "def add(a, b):", "max_tokens": 4090}),  # the context is 4096
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    model = ["--model", str(tiny["qwen3"]), "--drafter", "ngram", "--max-tokens", "16"]
    proc = run_cli("batch", str(requests), "-o", str(out), *model)
    assert proc.returncode == 1  # some lines were bad; the rest were done
    assert f"{requests}:3: skipped: not valid JSON" in proc.stderr
    assert f"{requests}:4: skipped: top_p" in proc.stderr and f"{requests}:5: skipped: needs exactly one" in proc.stderr
    assert f"{requests}:8: skipped: the id 7 is on line 6 already" in proc.stderr
    assert f"{requests}:9: skipped: the prompt (" in proc.stderr and "the model's context of 4096" in proc.stderr
    assert "4 generated" in proc.stderr and "5 bad line(s) skipped" in proc.stderr
    results = read_results(out)
    assert sorted(map(str, [r["id"] for r in results])) == ["7", "7", "chat", "plain"]
    assert {(type(r["id"]), r["text"].strip()) for r in results if r["id"] in (7, "7")} == {
        (int, greedy_text(tiny, "def g():", 3)), (str, greedy_text(tiny, "def h():", 5))}
    results = [r for r in results if r["id"] not in (7, "7")]
    assert results[0]["stats"]["generated_tokens"] == 12 and results[1]["stats"]["generated_tokens"] == 16
    assert results[0]["stop_reason"] == "max_tokens" and "acceptance_rate" in results[0]["stats"]
    before = out.read_bytes()
    proc = run_cli("batch", str(requests), "-o", str(out), *model)
    assert "0 generated" in proc.stderr and out.read_bytes() == before  # nothing redone, nothing duplicated
    assert "nothing left to generate" in proc.stderr and "0item" not in proc.stderr


def test_kill_and_rerun_equals_an_uninterrupted_run(tiny, tmp_path):
    requests = tmp_path / "in.jsonl"
    write_requests(requests, 40)
    model = ["--model", str(tiny["qwen3"]), "--draft-model", str(tiny["qwen3-draft"]), "--quiet", "--batch-size", "4"]
    whole = tmp_path / "whole.jsonl"
    assert run_cli("batch", str(requests), "-o", str(whole), *model).returncode == 0

    interrupted = tmp_path / "interrupted.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "mlx_spec.cli", "batch", str(requests), "-o", str(interrupted),
                             *model], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not interrupted.exists() or interrupted.read_text().count("\n") < 5):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = interrupted.read_text().count("\n")
    assert 5 <= done_before < 40
    with open(interrupted, "ab") as f:  # as if the crash had come in the middle of a write
        f.write(b'{"id": "r99", "text": "tor')
    proc = run_cli("batch", str(requests), "-o", str(interrupted), *model)
    assert proc.returncode == 0 and "dropped the torn last line" in proc.stderr

    def by_id(path):
        return {r["id"]: (r["text"], r["stop_reason"]) for r in read_results(path)}
    assert len(read_results(interrupted)) == 40 and by_id(interrupted) == by_id(whole)
