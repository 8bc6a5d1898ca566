"""EAGLE-3 heads: the trained fixture against the published equations, exact drafting in chains and trees, converted
and refused heads (config variants: test_eagle3_configs.py)."""

import json

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, assert_one_line_error, converted_q8, edited_copy, pickled_only, plain_greedy, run_cli
from reference_eagle3 import NumpyEagle3
from safetensors.numpy import load_file

import mlx_spec
from mlx_spec.models.eagle3 import load_eagle3
from mlx_spec.core.sampling import SamplingParams


def test_head_matches_a_numpy_transcription(tiny):
    path = tiny["qwen3-eagle3"]
    config = json.loads((path / "config.json").read_text())
    weights = load_file(str(path / "model.safetensors"))
    embed = load_file(str(tiny["qwen3"] / "model.safetensors"))["model.embed_tokens.weight"].astype(np.float64)
    head = load_eagle3(path, config)
    assert config["draft_vocab_size"] < config["vocab_size"]  # the reduced vocabulary is exercised
    rng = np.random.default_rng(0)
    features = rng.standard_normal((5, 3 * config["hidden_size"]))
    tokens = rng.integers(0, config["vocab_size"], 6)
    rope = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    reference, cache = NumpyEagle3(weights, {**config, "rope": rope}, config), head.make_cache()
    g_ref, logits_ref = reference.step(embed[tokens[:5]], reference.project(features))  # verified rows
    g = head(mx.array(embed[tokens[:5]], mx.float32)[None], mx.array(features, mx.float32)[None], cache)[0]
    np.testing.assert_allclose(np.array(g), g_ref, atol=1e-4)
    np.testing.assert_allclose(np.array(head.logits(g)), logits_ref, atol=1e-4)
    g_ref, logits_ref = reference.step(embed[tokens[5:]], g_ref[-1:])  # a draft step feeds back its own g
    g = head(mx.array(embed[tokens[5:]], mx.float32)[None], g[-1:][None], cache)[0]
    np.testing.assert_allclose(np.array(head.logits(g)), logits_ref, atol=1e-4)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("width", [1, 3])
def test_eagle3_drafts_exactly(tiny, family, width):
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(tiny[f"{family}-eagle3"]), tree_width=width,
                           draft_len=4)
    assert engine.status().drafter == "eagle3"
    ids = engine.encode(PROMPT)
    for params in (SamplingParams(), SamplingParams(repetition_penalty=1.3)):
        result = engine.generate(ids, params, 120)
        assert result.tokens == plain_greedy(tiny[family], ids, 120, params.repetition_penalty)
        stats = result.stats
        assert 0 < stats.accepted < stats.drafted  # drafts accepted, and rollbacks ran
        assert stats.nodes == stats.drafted if width == 1 else stats.nodes > stats.drafted


def test_converted_quantized_head_drafts_exactly(tiny, tmp_path):
    out = tmp_path / "q8"
    assert converted_q8(tiny["qwen3-eagle3"], out)["quantization"] == {"group_size": 32, "bits": 8}
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(out), draft_len=3)
    assert type(engine.drafter.mtp.fc).__name__ == "QuantizedLinear"
    ids = engine.encode(PROMPT)
    result = engine.generate(ids, max_tokens=60)
    assert result.tokens == plain_greedy(tiny["qwen3"], ids, 60)
    assert 0 < result.stats.accepted < result.stats.drafted


def test_eagle3_from_the_command_line(tiny):
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(tiny["qwen3-eagle3"]),
                   "--tree-width", "2", "--prompt", "def main():", "--max-tokens", "24", "--raw")
    assert proc.returncode == 0, proc.stderr
    assert "eagle3: acceptance" in proc.stderr


def test_eagle3_refusals(tiny, tmp_path):
    proc = run_cli("generate", "--model", str(tiny["llama"]), "--draft-model", str(tiny["qwen3-eagle3"]),
                   "--prompt", "hi")  # the llama target has 3 layers: the head reads layer 3's input
    assert_one_line_error(proc, "EAGLE-3 head", "was not trained for", "use the head published for this target")
    pickled = pickled_only(tiny["qwen3-eagle3"], tmp_path / "pickled", "pytorch_model.bin")
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(pickled), "--prompt", "hi")
    assert_one_line_error(proc, "pytorch_model.bin", "model.safetensors")
    no_map = edited_copy(tiny["qwen3-eagle3"], tmp_path / "no-map",
                         lambda weights: {k: v for k, v in weights.items() if k != "d2t"})
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(no_map), "--prompt", "hi")
    assert_one_line_error(proc, "needs a d2t map")
