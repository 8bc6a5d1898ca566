"""Gemma 4 assistant drafting: the assistant equals its equations (checked against an independent NumPy
transcription from the raw HF tensors), the sparse head, exact shared K/V past the sliding window, lossless
generation, convert round trips and pairing errors."""

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, assert_one_line_error, plain_greedy, run_cli
from mlx_lm.models.cache import KVCache
from mlx_lm.utils import load
from safetensors.numpy import load_file, save_file

import mlx_spec
from mlx_spec.commands.convert import convert
from mlx_spec.seams.errors import SpecError
from mlx_spec.models.gemma4_assistant import load_assistant
from mlx_spec.core.sampling import SamplingParams
from mlx_spec.runners.target import Target

# --- an independent NumPy transcription of the assistant's equations, from the raw HF tensors -------------


def rms_norm(x, weight=None, eps=1e-6):
    x = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return x if weight is None else x * weight  # Gemma 4: plain x_hat * w


def rope(x, position, theta, rotated_fraction=1.0):
    """Rotate-half RoPE over all head dims; 'proportional' RoPE leaves the last (1 - fraction) frequencies at 0."""
    dims = x.shape[-1]
    rotated = int(dims * rotated_fraction)
    freqs = np.zeros(dims // 2)
    freqs[:rotated // 2] = theta ** (-np.arange(0, rotated, 2) / dims)
    cos, sin = np.cos(position * freqs), np.sin(position * freqs)
    x1, x2 = x[..., :dims // 2], x[..., dims // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def assistant_step(w, cfg, embedding, hidden, kv, position):
    """One draft step: (logits (V,), next hidden (H_target,)). kv: layer type -> (keys, values) (n_kv, S, D)."""
    t = cfg["text_config"]
    nq = t["num_attention_heads"]
    x = np.concatenate([embedding, hidden]) @ w["pre_projection.weight"].T
    for i, kind in enumerate(t["layer_types"]):
        p = f"model.layers.{i}."
        rope_cfg = t["rope_parameters"][kind]
        a = rms_norm(x, w[p + "input_layernorm.weight"])
        q = rms_norm((a @ w[p + "self_attn.q_proj.weight"].T).reshape(nq, -1), w[p + "self_attn.q_norm.weight"])
        q = rope(q, position, rope_cfg["rope_theta"], rope_cfg.get("partial_rotary_factor", 1.0))
        keys, values = kv[kind]
        keys, values = np.repeat(keys, nq // keys.shape[0], 0), np.repeat(values, nq // values.shape[0], 0)
        scores = np.einsum("hd,hsd->hs", q, keys)  # attention scale 1.0
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        attn = np.einsum("hs,hsd->hd", probs / probs.sum(-1, keepdims=True), values).reshape(-1)
        x = x + rms_norm(attn @ w[p + "self_attn.o_proj.weight"].T, w[p + "post_attention_layernorm.weight"])
        m = rms_norm(x, w[p + "pre_feedforward_layernorm.weight"])
        mlp = (gelu_tanh(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T
        x = (x + rms_norm(mlp, w[p + "post_feedforward_layernorm.weight"])) * w[p + "layer_scalar"]
    x = rms_norm(x, w["model.norm.weight"])
    embed = w["model.embed_tokens.weight"]
    if cfg["use_ordered_embeddings"]:
        ids = centroid_candidates(w, cfg, x)
        logits = np.full(embed.shape[0], (embed[ids] @ x).min() - 1.0)
        logits[ids] = embed[ids] @ x
    else:
        logits = embed @ x
    return logits, x @ w["post_projection.weight"].T


def centroid_candidates(w, cfg, x):
    top = np.argsort(-(w["masked_embedding.centroids.weight"] @ x))[:cfg["centroid_intermediate_top_k"]]
    return w["masked_embedding.token_ordering"].reshape(cfg["num_centroids"], -1)[top].ravel()


def fresh_target_state(path, tokens):
    """The target's post-norm hidden states and per-layer K/V for `tokens`, from one plain forward with
    unbounded caches (mlx-lm's model, no rotation, no rollback)."""
    model, _ = load(str(path))
    cache = [KVCache() for _ in model.make_cache()]
    hidden = model.language_model.model(mx.array([tokens]), cache=cache)
    return np.array(hidden[0]), [(np.array(c.keys[0, :, :c.offset]), np.array(c.values[0, :, :c.offset]))
                                 for c in cache]


def reference_kv(target_cfg, layer_kv, window):
    """Layer type -> the K/V the assistant attends to: the last non-shared target layer of that type. Sliding
    layers keep what transformers' Gemma4AssistantForCausalLM.create_attention_masks keeps: the key axis is
    flipped (newest first), the single query has index 0, and sliding_window_bidirectional_overlay allows
    abs(q_idx - kv_idx) <= window, so the newest window + 1 positions (returned oldest first)."""
    t = target_cfg["text_config"]
    first_shared = t["num_hidden_layers"] - t["num_kv_shared_layers"]
    kv = {kind: layer_kv[i] for i, kind in enumerate(t["layer_types"][:first_shared])}
    keys, values = kv["sliding_attention"]
    newest_first = np.arange(keys.shape[1])[::-1]
    q_idx, kv_idx = 0, np.arange(keys.shape[1])
    kept = np.sort(newest_first[np.abs(q_idx - kv_idx) <= window])
    kv["sliding_attention"] = (keys[:, kept], values[:, kept])
    return kv


# --- tests -------------------------------------------------------------------------------------------------


def test_tiny_checkpoints_have_the_published_layout(tiny):
    target_cfg = json.loads((tiny["gemma4"] / "config.json").read_text())
    cfg = json.loads((tiny["gemma4-assistant"] / "config.json").read_text())
    assert cfg["model_type"] == "gemma4_assistant" and cfg["backbone_hidden_size"] == 64
    assert cfg["text_config"]["num_kv_shared_layers"] == cfg["text_config"]["num_hidden_layers"] == 4
    assert target_cfg["text_config"]["num_kv_shared_layers"] == 2
    w = load_file(str(tiny["gemma4-assistant"] / "model.safetensors"))
    assert not any("k_proj" in k or "v_proj" in k or "lm_head" in k for k in w)
    ordering = w["masked_embedding.token_ordering"]
    assert ordering.dtype == np.int64 and sorted(ordering) == list(range(len(ordering)))
    assert w["pre_projection.weight"].shape == (32, 128) and w["post_projection.weight"].shape == (64, 32)
    target = load_file(str(tiny["gemma4"] / "model.safetensors"))
    assert "model.language_model.layers.5.self_attn.k_proj.weight" in target  # stored, unused (KV-shared)


@pytest.mark.parametrize("assistant", ["gemma4-assistant", "gemma4-assistant-dense"])
def test_drafts_follow_the_reference_equations(tiny, assistant):
    """Three greedy drafts after a context twice the sliding window, through the real drafter, equal the NumPy
    transcription fed with K/V and hidden states from a fresh unbounded-cache forward of the target."""
    engine = mlx_spec.load(str(tiny["gemma4"]), draft_model=str(tiny[assistant]), draft_len=3)
    context = engine.encode(PROMPT)[:40]
    step = engine.target.prefill(context[:-1])
    engine.drafter.begin(context, step)
    drafted = engine.drafter.propose(context, 3, SamplingParams(), mx.random.key(0)).tokens.tolist()

    cfg = json.loads((tiny[assistant] / "config.json").read_text())
    target_cfg = json.loads((tiny["gemma4"] / "config.json").read_text())
    w = load_file(str(tiny[assistant] / "model.safetensors"))
    target_w = load_file(str(tiny["gemma4"] / "model.safetensors"))
    hidden_states, layer_kv = fresh_target_state(tiny["gemma4"], context[:-1])
    kv = reference_kv(target_cfg, layer_kv, target_cfg["text_config"]["sliding_window"])
    embed, scale = target_w["model.language_model.embed_tokens.weight"], np.sqrt(64.0)
    token, hidden, expected = context[-1], hidden_states[-1], []
    for _ in range(3):
        logits, hidden = assistant_step(w, cfg, embed[token] * scale, hidden, kv, position=len(context) - 1)
        token = int(np.argmax(logits))
        expected.append(token)
    assert drafted == expected

    # the same at temperature 1, numerically: q of each sampled draft against the transcription fed them
    sampled = engine.drafter.propose(context, 3, SamplingParams(temperature=1.0), mx.random.key(1))
    token, hidden = context[-1], hidden_states[-1]
    for step, (drafted_token, q) in enumerate(zip(sampled.tokens.tolist(), np.array(sampled.q))):
        logits, hidden = assistant_step(w, cfg, embed[token] * scale, hidden, kv, position=len(context) - 1)
        log_q = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        np.testing.assert_allclose(np.log(q), log_q, atol=1e-4, err_msg=f"draft step {step}")
        token = drafted_token


def test_assistant_module_matches_the_equations_numerically(tiny):
    cfg = json.loads((tiny["gemma4-assistant"] / "config.json").read_text())
    w = load_file(str(tiny["gemma4-assistant"] / "model.safetensors"))
    w["masked_embedding.token_ordering"] = w["masked_embedding.token_ordering"].astype(np.int64)
    assistant = load_assistant(tiny["gemma4-assistant"])
    rng = np.random.default_rng(0)
    kv = {"sliding_attention": (rng.standard_normal((1, 16, 16)), rng.standard_normal((1, 16, 16))),
          "full_attention": (rng.standard_normal((1, 30, 32)), rng.standard_normal((1, 30, 32)))}
    embedding, hidden = rng.standard_normal(64), rng.standard_normal(64)
    logits, next_hidden = assistant(mx.array(embedding[None, None], dtype=mx.float32),
                                    mx.array(hidden[None, None], dtype=mx.float32),
                                    {k: tuple(mx.array(a[None], dtype=mx.float32) for a in v) for k, v in kv.items()},
                                    position=30)
    ref_logits, ref_hidden = assistant_step(w, cfg, embedding, hidden, kv, position=30)
    np.testing.assert_allclose(np.array(logits[0, 0]), ref_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(next_hidden[0, 0]), ref_hidden, rtol=1e-4, atol=1e-4)


def test_centroid_head_is_the_dense_head_on_its_candidates_and_minimal_elsewhere(tiny):
    assistant = load_assistant(tiny["gemma4-assistant"])
    cfg = json.loads((tiny["gemma4-assistant"] / "config.json").read_text())
    w = load_file(str(tiny["gemma4-assistant"] / "model.safetensors"))
    head, embed = assistant.masked_embedding, assistant.model.embed_tokens
    for seed in range(5):
        x = mx.random.normal((1, 1, 32), key=mx.random.key(seed))
        sparse, dense = np.array(head(x, embed)[0, 0]), np.array(embed.as_linear(x)[0, 0])
        ids = centroid_candidates(w, cfg, np.array(x[0, 0], dtype=np.float64))
        assert len(set(ids)) == cfg["centroid_intermediate_top_k"] * 512 // cfg["num_centroids"]
        np.testing.assert_allclose(sparse[ids], dense[ids], rtol=1e-5, atol=1e-5)
        others = np.setdiff1d(np.arange(512), ids)
        assert np.all(sparse[others] == sparse[ids].min() - 1.0)


def test_shared_kv_is_exact_past_the_window_after_rollbacks(tiny):
    """After a long generation of rejected drafts (rollback every round, the ring wrapped many times), the K/V
    the assistant reads are the last window + 1 positions of a fresh forward (all of them for full layers):
    same positions, same values."""
    engine = mlx_spec.load(str(tiny["gemma4"]), draft_model=str(tiny["gemma4-assistant"]), draft_len=4)
    prompt = engine.encode(PROMPT)[:20]
    result = mlx_spec.generate(engine, prompt, max_tokens=90)
    assert result.stats.drafted > result.stats.accepted  # rollbacks ran
    cached = (prompt + result.tokens)[:engine.target.offset]
    assert len(cached) > 5 * 16
    _, layer_kv = fresh_target_state(tiny["gemma4"], cached)
    target_cfg = json.loads((tiny["gemma4"] / "config.json").read_text())
    expected = reference_kv(target_cfg, layer_kv, 16)
    for kind, (keys, values) in engine.drafter.shared_kv().items():
        assert keys.shape[2] == (16 + 1 if kind == "sliding_attention" else len(cached))
        np.testing.assert_allclose(np.array(keys[0]), expected[kind][0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.array(values[0]), expected[kind][1], rtol=1e-4, atol=1e-4)


def with_centroid_head(dense, dest):
    """A copy of the dense-head assistant `dense` given a sparse centroid head that keeps its choice often: 32
    clusters of tokens with neighbouring embeddings (8 bands along their first principal direction, each cut in
    4 along the second), each centroid its cluster's summed embedding (x scores it by its tokens' summed logits)."""
    shutil.copytree(dense, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "use_ordered_embeddings": True}))
    weights = load_file(str(dest / "model.safetensors"))
    embed = weights["model.embed_tokens.weight"]
    directions = np.linalg.svd(embed - embed.mean(0), full_matrices=False)[0]
    bands = np.argsort(np.argsort(directions[:, 0])) * 8 // len(embed)
    ordering = np.lexsort((directions[:, 1], bands))
    weights["masked_embedding.token_ordering"] = ordering.astype(np.int64)
    weights["masked_embedding.centroids.weight"] = embed[ordering].reshape(config["num_centroids"], -1,
                                                                           embed.shape[1]).sum(1)
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


# the tiny Gemma 4 repeats its last token, which the distilled assistant drafts right: a repetition penalty of 1.5
# makes it change tokens after a while, into a run the assistant drafts worse, so drafts are rejected too
PENALTY = 1.5


@pytest.mark.parametrize("head", ["dense", "centroids"])
@pytest.mark.parametrize("draft_len", [1, 4])
def test_greedy_equals_plain_decoding_far_past_the_window(tiny, tmp_path, head, draft_len):
    assistant = tiny["gemma4-assistant-trained"]
    if head == "centroids":
        assistant = with_centroid_head(assistant, tmp_path / "centroids")
    engine = mlx_spec.load(str(tiny["gemma4"]), draft_model=str(assistant), draft_len=draft_len)
    assert engine.drafter.name == "assistant"
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=120, repetition_penalty=PENALTY)
    assert result.tokens == plain_greedy(tiny["gemma4"], ids, 120, PENALTY)
    assert 0 < result.stats.accepted < result.stats.drafted


def test_a_trained_assistant_is_accepted_and_stays_lossless(tiny):
    """The distilled tiny assistant drafts what the target would say: drafts are accepted at every position
    (the fed-back post_projection state and the hidden of the last accepted position are used), and the output
    is still exactly the target's."""
    engine = mlx_spec.load(str(tiny["gemma4"]), draft_model=str(tiny["gemma4-assistant-trained"]), draft_len=3)
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=120, repetition_penalty=PENALTY)
    assert result.tokens == plain_greedy(tiny["gemma4"], ids, 120, PENALTY)
    assert all(n > 0 for n in result.stats.position_accepted) and result.stats.accepted < result.stats.drafted


def test_convert_round_trip(tiny, tmp_path):
    """Float conversion reproduces the assistant exactly; 8-bit keeps the token ordering integer and the
    centroids float, and drafting with it stays lossless (the distilled assistant with a centroid head)."""
    source = with_centroid_head(tiny["gemma4-assistant-trained"], tmp_path / "centroids")
    float_dir = convert(str(source), str(tmp_path / "float"))
    quant_dir = convert(str(source), str(tmp_path / "q8"), quantize=True, q_bits=8, q_group_size=32)
    original, converted = load_assistant(source), load_assistant(float_dir)
    x, h = mx.random.normal((1, 1, 64), key=mx.random.key(1)), mx.random.normal((1, 1, 64), key=mx.random.key(2))
    kv = {"sliding_attention": (mx.ones((1, 1, 5, 16)), mx.ones((1, 1, 5, 16))),
          "full_attention": (mx.ones((1, 1, 5, 32)), mx.ones((1, 1, 5, 32)))}
    assert mx.array_equal(original(x, h, kv, 5)[0], converted(x, h, kv, 5)[0])
    w = mx.load(str(quant_dir / "model.safetensors"))
    assert w["masked_embedding.token_ordering"].dtype == mx.int32
    assert mx.array_equal(w["masked_embedding.token_ordering"], original.masked_embedding.token_ordering)
    assert w["masked_embedding.centroids.weight"].dtype == mx.float32
    assert "masked_embedding.centroids.scales" not in w and "model.layers.0.mlp.up_proj.scales" in w
    engine = mlx_spec.load(str(tiny["gemma4"]), draft_model=str(quant_dir), draft_len=3)
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=40, repetition_penalty=PENALTY)
    assert result.tokens == plain_greedy(tiny["gemma4"], ids, 40, PENALTY)
    assert 0 < result.stats.accepted < result.stats.drafted


def edited_assistant(tiny, tmp_path, edit):
    path = tmp_path / "edited"
    shutil.copytree(tiny["gemma4-assistant"], path)
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.update(backbone_hidden_size=128), "backbone of hidden size 128"),
    (lambda c: c["text_config"].update(vocab_size=1024), "vocabulary sizes differ"),
    (lambda c: c["text_config"].update(global_head_dim=64), "global_head_dim"),
])
def test_mismatched_pairs_are_refused(tiny, tmp_path, edit, message):
    path = edited_assistant(tiny, tmp_path, edit)
    with pytest.raises(SpecError, match=message):
        mlx_spec.load(str(tiny["gemma4"]), draft_model=str(path))


def test_assistant_of_another_family_is_refused_on_the_command_line(tiny):
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(tiny["gemma4-assistant"]),
                   "--prompt", "x", "--max-tokens", "4")
    assert_one_line_error(proc, "not a Gemma 4 model", "models.toml")


def test_target_reports_post_norm_hidden_for_the_assistant(tiny):
    model, _ = load(str(tiny["gemma4"]))
    target = Target(model, hidden="post")
    ids = list(range(3, 12))
    step = target.forward(ids)
    fresh, _ = fresh_target_state(tiny["gemma4"], ids)
    np.testing.assert_allclose(np.array(step.hidden), fresh, rtol=1e-4, atol=1e-4)
