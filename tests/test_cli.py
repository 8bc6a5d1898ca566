"""The real `mlx-spec` command in a subprocess: output, statistics and one-line errors."""

import json
import shutil
import subprocess
import sys

import pytest
from helpers import PROMPT, assert_one_line_error, plain_greedy, run_cli

import mlx_spec


def test_generate_json_is_the_target_greedy_output(tiny):
    proc = run_cli("generate", "--model", str(tiny["gemma3"]), "--draft-model", str(tiny["gemma3-draft"]),
                   "--prompt", PROMPT, "--raw", "--max-tokens", "50", "--repetition-penalty", "1.3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    engine = mlx_spec.load(str(tiny["gemma3"]), drafter="off")
    assert out["tokens"] == plain_greedy(tiny["gemma3"], engine.encode(PROMPT), 50, 1.3)
    assert out["text"] == engine.tokenizer.decode(out["tokens"])
    assert out["stats"]["drafter"] == "draft-model" and out["stats"]["drafted"] > 0
    assert 0 <= out["stats"]["acceptance_rate"] <= 1 and out["stop_reason"] == "max_tokens"


def test_generate_streams_text_and_a_summary(tiny):
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--drafter", "ngram", "--prompt", PROMPT,
                   "--max-tokens", "30", "--temp", "0.8", "--top-p", "0.9", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="ngram")
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    expected = mlx_spec.generate(engine, prompt, max_tokens=30, temperature=0.8, top_p=0.9, seed=3)
    assert proc.stdout == expected.text + "\n"
    summary = proc.stderr.strip().splitlines()[-1]
    assert summary.startswith("[max_tokens] 30 tokens") and "ngram: acceptance" in summary and "tok/s" in summary


def test_stop_string_ends_generation(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="ngram")
    full = mlx_spec.generate(engine, PROMPT, max_tokens=40).text
    stop = full[10:13]
    result = mlx_spec.generate(engine, PROMPT, max_tokens=40, stop=[stop])
    assert result.stop_reason == "stop_string" and result.text == full[: full.index(stop)]
    streamed = "".join(e.text for e in mlx_spec.stream(engine, PROMPT, max_tokens=40, stop=[stop])
                       if isinstance(e, mlx_spec.Token))
    assert streamed == result.text


def test_eos_ends_generation(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="ngram")
    tokens = mlx_spec.generate(engine, PROMPT, max_tokens=20).tokens
    engine.tokenizer.eos_token_ids = [tokens[7]]  # the 8th generated token now ends the sequence
    result = mlx_spec.generate(engine, PROMPT, max_tokens=20)
    assert result.stop_reason == "eos" and result.tokens == tokens[: tokens.index(tokens[7]) + 1]


@pytest.fixture
def corrupt_model(tiny, tmp_path):
    path = shutil.copytree(tiny["qwen3"], tmp_path / "corrupt")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(b"\x13\x00garbage" + data[200:5000])
    return path


@pytest.mark.parametrize("case", ["missing", "not-a-model", "corrupt", "other-vocab", "temp", "top-p",
                                  "empty-prompt", "unknown-name", "num-draft", "max-tokens", "hub-offline",
                                  "off-and-num-draft", "ngram-and-draft-model", "tree-width", "empty-stop"])
def test_bad_input_is_a_one_line_error(tiny, tmp_path, corrupt_model, case):
    model = ["--model", str(tiny["qwen3"])]
    args, fragments = {
        "missing": (["--model", str(tmp_path / "nope")], ["unknown model"]),
        "not-a-model": (["--model", str(tmp_path)], ["no config.json"]),
        "corrupt": (["--model", str(corrupt_model)], ["corrupt", "re-download"]),
        "other-vocab": (model + ["--draft-model", str(tiny["other-vocab"])], ["vocabulary", "same model family"]),
        "temp": (model + ["--temp", "-1"], ["temperature"]),
        "top-p": (model + ["--top-p", "0"], ["top_p"]),
        "empty-prompt": (model, ["prompt is empty"]),
        "unknown-name": (["--model", "no-such-model"], ["unknown model", "models.toml"]),
        "num-draft": (model + ["--num-draft", "99"], ["draft length"]),
        "max-tokens": (model + ["--max-tokens", "0"], ["max_tokens"]),
        "hub-offline": (["--model", "no-such-org/no-such-model"], ["could not fetch", "local directory"]),
        "off-and-num-draft": (model + ["--drafter", "off", "--num-draft", "3"], ["--drafter off drafts nothing"]),
        "ngram-and-draft-model": (model + ["--drafter", "ngram", "--draft-model", str(tiny["qwen3-draft"])],
                                  ["--draft-model is the draft-model drafter's, not --drafter ngram's"]),
        "tree-width": (model + ["--tree-width", "99"], ["tree width must be from 1 (a chain) to 8"]),
        "empty-stop": (model + ["--stop", ""], ["stop strings must be non-empty"]),
    }[case]
    prompt = "" if case == "empty-prompt" else "hello"
    proc = run_cli("generate", *args, "--prompt", prompt, env={"HF_HUB_OFFLINE": "1"})
    assert_one_line_error(proc, *fragments)
    if case in ("num-draft", "off-and-num-draft", "ngram-and-draft-model", "tree-width"):
        assert "drafter:" not in proc.stderr  # refused before the model loaded


def test_help_loads_neither_mlx_nor_mlx_lm():
    """Help and argument errors come at once: building the parser imports no MLX, mlx-lm or transformers."""
    for args in (["--help"], ["generate", "--help"], ["serve", "--port"]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "mlx_spec.cli", *args], capture_output=True,
                              text=True, timeout=300)
        imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
        assert "mlx_spec.cli" in imported or "argparse" in imported, proc.stderr[-2000:]
        assert not {"mlx.core", "mlx_lm", "transformers"} & imported, proc.stderr[-2000:]


def test_not_enough_memory_for_the_draft_is_refused(tiny, monkeypatch):
    import psutil

    from mlx_spec.seams.errors import SpecError

    target_bytes = (tiny["qwen3"] / "model.safetensors").stat().st_size
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=target_bytes + 1))
    with pytest.raises(SpecError, match="not enough memory for the draft model.*--drafter ngram"):
        mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]))
    assert mlx_spec.load(str(tiny["qwen3"]), drafter="ngram").drafter.name == "ngram"  # the target alone fits
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=target_bytes - 1))
    with pytest.raises(SpecError, match="not enough memory for the target model"):
        mlx_spec.load(str(tiny["qwen3"]), drafter="off")


def test_chat_without_a_terminal_is_refused_before_loading(tiny):
    proc = subprocess.run([sys.executable, "-m", "mlx_spec.cli", "chat", "--model", str(tiny["qwen3"])],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert_one_line_error(proc, "chat needs a terminal")
    assert "drafter:" not in proc.stderr and "\x1b[" not in proc.stdout
