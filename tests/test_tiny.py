"""The tiny checkpoints are real Hugging Face layouts with a real tokenizer."""

import json

import pytest
from safetensors.numpy import load_file

import mlx_spec


def test_qwen3_layout(tiny):
    cfg = json.loads((tiny["qwen3"] / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["tie_word_embeddings"] is True
    names = set(load_file(str(tiny["qwen3"] / "model.safetensors")))
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_norm.weight",
            "model.layers.3.mlp.down_proj.weight"} <= names and "lm_head.weight" not in names
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny["qwen3"] / name).exists()


def test_gemma3_layout(tiny):
    cfg = json.loads((tiny["gemma3"] / "config.json").read_text())
    assert cfg["model_type"] == "gemma3_text" and cfg["sliding_window"] == 16
    assert cfg["layer_types"][:3] == ["sliding_attention", "sliding_attention", "full_attention"]
    weights = load_file(str(tiny["gemma3"] / "model.safetensors"))
    assert "model.layers.0.pre_feedforward_layernorm.weight" in weights
    assert abs(weights["model.layers.0.input_layernorm.weight"].mean()) < 0.2  # zero-centred: effective 1 + w


def test_llama_layout_has_untied_head(tiny):
    assert "lm_head.weight" in load_file(str(tiny["llama"] / "model.safetensors"))


@pytest.mark.parametrize("family", ["qwen3", "llama", "gemma3"])
def test_text_round_trips_through_the_tokenizer(tiny, family):
    engine = mlx_spec.load(str(tiny[family]), drafter="off")
    text = "def add(a, b):\n    return a + b  # ünïcode ✓\n"
    ids = engine.encode(text)
    assert 1 < len(ids) < len(text) and engine.tokenizer.decode(ids) == text
