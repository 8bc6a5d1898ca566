"""EAGLE-3 heads: the published checkpoint layout, the head's equations, exact drafting in chains and trees."""

import json

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, assert_one_line_error, converted_q8, edited_copy, pickled_only, plain_greedy, run_cli
from safetensors.numpy import load_file

import mlx_spec
from mlx_spec.models.eagle3 import load_eagle3
from mlx_spec.sampling import SamplingParams


def rms_norm(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rotate(x, positions, theta):
    """Rotary embedding of x (n, heads, d) at `positions`, halves rotated (the Llama / HF convention)."""
    half = x.shape[-1] // 2
    angles = positions[:, None] * theta ** (-np.arange(half) * 2 / x.shape[-1])
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    return np.concatenate([x[..., :half] * cos - x[..., half:] * sin, x[..., :half] * sin + x[..., half:] * cos], -1)


class NumpyEagle3:
    """The published equations, written out: one decoder layer over [norm(embedding), norm(x)]."""

    def __init__(self, weights, config):
        self.w, self.c = {k.replace("layers.0.", "midlayer."): v.astype(np.float64) for k, v in weights.items()}, config
        self.keys, self.values, self.position = [], [], 0

    def step(self, embeddings, x):
        w, c = self.w, self.c
        heads, kv_heads, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        f = rms_norm(x, w["midlayer.hidden_norm.weight"])
        both = np.concatenate([rms_norm(embeddings, w["midlayer.input_layernorm.weight"]), f], -1)
        n = both.shape[0]
        positions = np.arange(self.position, self.position + n)
        self.position += n
        q = rotate((both @ w["midlayer.self_attn.q_proj.weight"].T).reshape(n, heads, d), positions, c["rope_theta"])
        self.keys.append(rotate((both @ w["midlayer.self_attn.k_proj.weight"].T).reshape(n, kv_heads, d), positions,
                                c["rope_theta"]))
        self.values.append((both @ w["midlayer.self_attn.v_proj.weight"].T).reshape(n, kv_heads, d))
        keys, values = np.concatenate(self.keys), np.concatenate(self.values)
        out = np.zeros((n, heads, d))
        for h in range(heads):
            scores = q[:, h] @ keys[:, h * kv_heads // heads].T / np.sqrt(d)
            scores[np.arange(len(keys))[None] > positions[:, None]] = -np.inf  # causal
            p = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ values[:, h * kv_heads // heads]
        a = x + out.reshape(n, -1) @ w["midlayer.self_attn.o_proj.weight"].T
        m = rms_norm(a, w["midlayer.post_attention_layernorm.weight"])
        gate, up = m @ w["midlayer.mlp.gate_proj.weight"].T, m @ w["midlayer.mlp.up_proj.weight"].T
        g = a + (gate / (1 + np.exp(-gate)) * up) @ w["midlayer.mlp.down_proj.weight"].T
        draft_scores = rms_norm(g, w["norm.weight"]) @ w["lm_head.weight"].T
        logits = np.full((n, c["vocab_size"]), -np.inf)
        logits[:, np.arange(c["draft_vocab_size"]) + self.w["d2t"].astype(int)] = draft_scores
        return g, logits


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
    reference, cache = NumpyEagle3(weights, config), head.make_cache()
    x = features @ reference.w["fc.weight"].T
    g_ref, logits_ref = reference.step(embed[tokens[:5]], x)  # verified rows: fc over the target's features
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


def test_speculators_layout_drafts_the_same(tiny, tmp_path):
    """Red Hat's `speculators` heads: the Llama fields nested under transformer_layer_config, layers.0.*."""
    config = json.loads((tiny["qwen3-eagle3"] / "config.json").read_text())
    nested = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
              "draft_vocab_size": config.pop("draft_vocab_size"), "norm_before_residual": False,
              "eagle_aux_hidden_state_layer_ids": config.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"],
              "transformer_layer_config": config}
    (tmp_path / "config.json").write_text(json.dumps(nested))
    weights = load_file(str(tiny["qwen3-eagle3"] / "model.safetensors"))
    mx.save_safetensors(str(tmp_path / "model.safetensors"),
                        {k.replace("midlayer.", "layers.0."): mx.array(v) for k, v in weights.items()})
    results = []
    for head in (tiny["qwen3-eagle3"], tmp_path):
        engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(head), draft_len=3)
        results.append(engine.generate(PROMPT, max_tokens=40))
    assert results[0].tokens == results[1].tokens
    assert results[0].stats.per_position_acceptance == results[1].stats.per_position_acceptance


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
