"""Medusa heads: the published checkpoint layout, the heads' equations, exact drafting in chains and trees."""

import json

import numpy as np
import pytest
from helpers import PROMPT, assert_one_line_error, edited_copy, pickled_only, plain_greedy, run_cli
from safetensors.numpy import load_file

import mlx.core as mx
import mlx_spec
from mlx_spec.models.medusa import WEIGHTS, load_medusa
from mlx_spec.core.sampling import SamplingParams


def test_heads_match_a_numpy_transcription(tiny):
    path = tiny["qwen3-medusa"]
    config = json.loads((path / "config.json").read_text())
    heads, layers = config["medusa_num_heads"], config["medusa_num_layers"]
    model = load_medusa(path, config)
    weights = load_file(str(path / WEIGHTS))
    hidden = np.random.default_rng(0).standard_normal((1, weights["0.0.linear.weight"].shape[1])).astype(np.float32)
    expected = []
    for i in range(heads):  # x + SiLU(W x + b) per block, then the head's own vocabulary projection
        x = hidden
        for j in range(layers):
            z = x @ weights[f"{i}.{j}.linear.weight"].T + weights[f"{i}.{j}.linear.bias"]
            x = x + z / (1 + np.exp(-z))
        expected.append(x @ weights[f"{i}.{layers}.weight"].T)
    np.testing.assert_allclose(np.array(model(mx.array(hidden), heads)), np.concatenate(expected), atol=1e-4)


@pytest.mark.parametrize("width", [1, 3])
def test_medusa_drafts_exactly(tiny, width):
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-medusa"]), tree_width=width,
                           draft_len=3)
    assert engine.status().drafter == "medusa"
    ids = engine.encode(PROMPT)
    for params in (SamplingParams(), SamplingParams(repetition_penalty=1.3)):
        result = engine.generate(ids, params, 120)
        assert result.tokens == plain_greedy(tiny["qwen3"], ids, 120, params.repetition_penalty)
        stats = result.stats
        assert stats.nodes == width * stats.drafted
        if params.has_penalties:  # another continuation than the one the heads learnt: rejections
            assert 0 < stats.accepted < stats.drafted
        else:  # the heads learnt the target's own continuation of this prompt
            assert stats.mean_acceptance_length > 2.5


def test_medusa_from_the_command_line(tiny):
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(tiny["qwen3-medusa"]),
                   "--prompt", "def main():", "--max-tokens", "24", "--raw")
    assert proc.returncode == 0, proc.stderr
    assert "medusa: acceptance" in proc.stderr


def test_medusa_refusals(tiny, tmp_path):
    proc = run_cli("generate", "--model", str(tiny["other-vocab"]), "--draft-model", str(tiny["qwen3-medusa"]),
                   "--prompt", "hi")
    assert_one_line_error(proc, "Medusa heads", "were trained for", "use heads trained for this target")
    pickled = pickled_only(tiny["qwen3-medusa"], tmp_path / "pickled", "medusa_lm_head.pt")
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(pickled), "--prompt", "hi")
    assert_one_line_error(proc, "medusa_lm_head.pt", "safetensors")

    def rename(weights):  # another project's naming
        weights["lm_heads.0.weight"] = weights.pop("0.1.weight")
        return weights
    other = edited_copy(tiny["qwen3-medusa"], tmp_path / "other-layout", rename, WEIGHTS)
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(other), "--prompt", "hi")
    assert_one_line_error(proc, "unexpected tensor 'lm_heads.0.weight'", "FasterDecoding/Medusa layout")


def test_null_fields_mean_the_defaults_or_are_refused(tiny, tmp_path):
    config = json.loads((tiny["qwen3-medusa"] / "config.json").read_text())
    assert config["medusa_num_layers"] == 1  # the reference's default, which a null block count means
    nulled = edited_copy(tiny["qwen3-medusa"], tmp_path / "null-layers", lambda weights: weights, WEIGHTS)
    (nulled / "config.json").write_text(json.dumps({**config, "medusa_num_layers": None}))
    results = [mlx_spec.load(str(tiny["qwen3"]), draft_model=str(head), draft_len=3).generate(PROMPT, max_tokens=30)
               for head in (tiny["qwen3-medusa"], nulled)]
    assert results[0].tokens == results[1].tokens and results[0].stats.accepted == results[1].stats.accepted
    (nulled / "config.json").write_text(json.dumps({**config, "medusa_num_heads": None}))
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(nulled), "--prompt", "hi")
    assert_one_line_error(proc, "medusa_num_heads None", "re-download the heads")
