"""The shipped demo model (mlx_spec/demo, made by scripts/train_demo.py): its files, its MTP layer, lossless
generation with every drafter, drafts that are right well above chance, and the offline default commands."""

import json

import mlx.core as mx
import pytest
from helpers import plain_greedy, run_cli

import mlx_spec
from mlx_spec.loading import DEMO

CODE = "import os\n\n\ndef list_python_files(root):\n    \"\"\"Return the .py files under root.\"\"\"\n"


def test_shipped_files_are_complete_and_small():
    target, draft = DEMO / "demo", DEMO / "demo-draft"
    for path in (target, draft):
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (path / name).is_file(), f"{path / name} missing"
    config = json.loads((target / "config.json").read_text())
    assert config["model_type"] == "qwen3_5" and config["text_config"]["mtp_num_hidden_layers"] == 1
    assert {"linear_attention", "full_attention"} == set(config["text_config"]["layer_types"])
    mtp = mx.load(str(target / "mtp.safetensors"))
    assert all(name.startswith("mtp.") for name in mtp) and "mtp.fc.weight" in mtp
    assert "mtp.layers.0.self_attn.q_proj.scales" in mtp  # quantized with the model
    assert sum(f.stat().st_size for f in DEMO.rglob("*") if f.is_file()) < 12 * 2**20
    assert (DEMO / "report.md").read_text().startswith("# mlx-spec demo model")


def test_the_mtp_layer_agrees_with_the_target_far_above_chance_on_held_out_code():
    """One MTP draft a round on the held-out prompts the demo ships: the share of drafts equal to the target's
    own next token, measured here (not read from report.json), is far above chance (1 / vocabulary)."""
    engine = mlx_spec.load(drafter="mtp", draft_len=1)
    prompts = [json.loads(line)["prompt"] for line in (DEMO / "prompts.jsonl").read_text().splitlines()[:3]]
    drafted = accepted = 0
    for prompt in prompts:
        stats = mlx_spec.generate(engine, engine.encode(prompt), max_tokens=32).stats
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted >= 60 and accepted / drafted > 20 / len(engine.tokenizer.get_vocab())


@pytest.mark.parametrize("drafter", ["mtp", "draft-model", "ngram"])
def test_every_drafter_is_lossless_on_the_demo(drafter):
    engine = mlx_spec.load(drafter=drafter, draft_len=3)
    ids = engine.encode(CODE)
    result = mlx_spec.generate(engine, ids, max_tokens=48)
    assert result.tokens == plain_greedy(DEMO / "demo", ids, 48)
    if drafter != "ngram":  # a trained drafter is right often on code it has not seen
        assert result.stats.acceptance_rate > 0.3, result.stats.summary()


def test_demo_writes_python():
    result = mlx_spec.generate(mlx_spec.load(), CODE, max_tokens=64)
    assert result.stats.drafter == "mtp"  # the default drafter of a checkpoint with an MTP layer
    assert python_headers(CODE + result.text) >= 1, result.text


def python_headers(program: str) -> int:
    """How many lines of `program` are whole Python compound-statement headers (`def f(x):`, `for a in b:`, ...
    as `ast` parses them); raises if Python's tokenizer finds it malformed before its end (an unclosed string or
    bracket at the end is only where the text was cut)."""
    import ast
    import io
    import tokenize

    try:
        for _ in tokenize.generate_tokens(io.StringIO(program).readline):
            pass
    except tokenize.TokenError:
        pass
    headers = 0
    for line in program.splitlines():
        if line.strip().endswith(":"):
            try:
                ast.parse(line.strip() + " pass")
                headers += 1
            except SyntaxError:
                pass
    return headers - sum(line.strip().endswith(":") for line in CODE.splitlines())  # the prompt's own


def test_the_demo_note_is_printed_once_per_machine(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path)}
    runs = [run_cli("generate", "--prompt", "def f", "--max-tokens", "2", *extra, env=env)
            for extra in ([], [], ["--verbose"])]
    assert all(proc.returncode == 0 for proc in runs), runs[-1].stderr
    whole = "mlx_spec/demo/report.md"
    assert whole in runs[0].stderr and whole in runs[2].stderr
    assert whole not in runs[1].stderr and "using the built-in demo model (--model" in runs[1].stderr


def test_default_commands_run_offline_and_say_so():
    proc = run_cli("generate", "--prompt", "def add(a, b):", "--max-tokens", "16", env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "built-in demo" in proc.stderr and "--model" in proc.stderr and "drafter: mtp" in proc.stderr
    assert proc.stdout.strip()
