"""Qwen3.5 MTP drafting: lossless, the layer equals its equations, the fed-back hidden is the post-norm one,
and the MTP cache holds rows rebuilt from the target's verified hidden states."""

import json

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, Unreadied, edited_copy, plain_greedy
from safetensors.numpy import load_file

import mlx_spec
from mlx_spec.drafters.qwen_mtp import PROMPT_ROWS
from mlx_spec.loading import DEMO
from mlx_spec.seams.errors import SpecError
from mlx_spec.models.qwen3_5 import lm_head, text_model
from mlx_spec.core.sampling import SamplingParams
from mlx_spec.runners.target import Target

# --- an independent NumPy transcription of the Qwen3.5 MTP equations, from the raw HF tensors --------------


def rms_norm(x, zero_centred_weight, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1.0 + zero_centred_weight)


def rope(x, positions, rotary_dims, base):
    half = rotary_dims // 2
    freqs = base ** (-np.arange(half) * 2.0 / rotary_dims)
    angles = positions[:, None] * freqs[None]
    cos, sin = np.cos(angles), np.sin(angles)
    x1, x2 = x[..., :half], x[..., half:rotary_dims]
    rotated = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    return np.concatenate([rotated, x[..., rotary_dims:]], -1)


def mtp_reference(w, cfg, token_embeddings, hidden):
    """MTP rows for positions 0..L-1 from scratch: fc(concat[norm(e), norm(h)]) -> gated-attention decoder
    layer (causal over these rows) -> mtp.norm. Returns the post-norm outputs (L, H)."""
    nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    p = "mtp.layers.0."
    x = np.concatenate([rms_norm(token_embeddings, w["mtp.pre_fc_norm_embedding.weight"]),
                        rms_norm(hidden, w["mtp.pre_fc_norm_hidden.weight"])], -1) @ w["mtp.fc.weight"].T
    L = x.shape[0]
    a = rms_norm(x, w[p + "input_layernorm.weight"])
    qg = (a @ w[p + "self_attn.q_proj.weight"].T).reshape(L, nq, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(L, nq * hd)
    k = (a @ w[p + "self_attn.k_proj.weight"].T).reshape(L, nkv, hd)
    v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(L, nkv, hd)
    q, k = rms_norm(q, w[p + "self_attn.q_norm.weight"]), rms_norm(k, w[p + "self_attn.k_norm.weight"])
    rot = int(hd * cfg["rope_parameters"]["partial_rotary_factor"])
    positions = np.arange(L, dtype=np.float64)
    q = rope(q.transpose(1, 0, 2), positions, rot, cfg["rope_parameters"]["rope_theta"])
    k = rope(k.transpose(1, 0, 2), positions, rot, cfg["rope_parameters"]["rope_theta"])
    k, v = np.repeat(k, nq // nkv, 0), np.repeat(v.transpose(1, 0, 2), nq // nkv, 0)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + np.triu(np.full((L, L), -np.inf), 1)
    attn = np.exp(scores - scores.max(-1, keepdims=True))
    attn = (attn / attn.sum(-1, keepdims=True)) @ v
    attn = attn.transpose(1, 0, 2).reshape(L, nq * hd) * (1 / (1 + np.exp(-gate)))
    h = x + attn @ w[p + "self_attn.o_proj.weight"].T
    m = rms_norm(h, w[p + "post_attention_layernorm.weight"])
    g, u = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
    out = h + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(out, w["mtp.norm.weight"])


@pytest.fixture
def qwen35(tiny):
    cfg = json.loads((tiny["qwen3_5"] / "config.json").read_text())["text_config"]
    weights = {k: v.astype(np.float64) for k, v in load_file(str(tiny["qwen3_5"] / "model.safetensors")).items()}
    return cfg, weights


def target_hidden(engine, tokens):
    """Post-norm hidden states of the target over `tokens`, from a plain forward without caches."""
    text = text_model(engine.target.model)
    return np.array(text.model(mx.array([tokens]))[0], dtype=np.float64)


@pytest.mark.parametrize("draft_len", [1, 2, 4])
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_mtp_greedy_equals_plain_decoding(tiny, draft_len, penalty):
    """The MTP layer fitted to the target's continuations of PROMPT: drafts both accepted and rejected."""
    path = tiny["qwen3_5-fitted-mtp"]
    engine = mlx_spec.load(str(path), draft_len=draft_len)
    assert engine.drafter.name == "mtp"  # the default for a checkpoint that declares an MTP layer
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=100, repetition_penalty=penalty)
    assert result.tokens == plain_greedy(path, ids, 100, penalty)
    assert result.stats.position_drafted[0] >= result.stats.rounds - 1  # MTP drafted in every round
    assert 0 < result.stats.accepted < result.stats.drafted  # drafts passed, and rollback ran


def test_mtp_layer_matches_its_equations(tiny, qwen35):
    cfg, w = qwen35
    engine = mlx_spec.load(str(tiny["qwen3_5"]))
    tokens = engine.encode(PROMPT)
    hidden = target_hidden(engine, tokens)
    embeddings = w["model.language_model.embed_tokens.weight"][tokens]
    # row p pairs embed(t[p+1]) with h[p]
    expected = mtp_reference(w, cfg, embeddings[1:], hidden[:-1])
    drafter = engine.drafter
    drafter.begin(tokens, Target(engine.target.model, hidden="post").prefill(tokens[:-1]))
    last_row = np.array(drafter.mtp_hidden[0], dtype=np.float64)
    np.testing.assert_allclose(last_row, expected[-1], atol=2e-4)
    expected_logits = expected[-1] @ w["lm_head.weight"].T
    np.testing.assert_allclose(np.array(drafter.next_logits[0]), expected_logits, atol=1e-3)


def test_drafts_feed_back_the_post_norm_output(tiny, qwen35):
    """Draft 2's distribution must come from the MTP layer's post-norm output of draft 1 (recycling the
    pre-norm tensor is a known silent bug: output stays correct, acceptance collapses)."""
    cfg, w = qwen35
    engine = mlx_spec.load(str(tiny["qwen3_5"]))
    tokens = engine.encode(PROMPT)
    drafter = engine.drafter
    drafter.begin(tokens, Target(engine.target.model, hidden="post").prefill(tokens[:-1]))
    draft = drafter.propose(tokens, 2, mlx_spec.SamplingParams(temperature=1.0), mx.random.key(0))
    d1 = draft.tokens[0].item()
    hidden = target_hidden(engine, tokens)
    embed = w["model.language_model.embed_tokens.weight"]
    rows = mtp_reference(w, cfg, embed[tokens[1:] + [d1]], np.concatenate([hidden[:-1], mtp_reference(
        w, cfg, embed[tokens[1:]], hidden[:-1])[-1:]]))
    logits = rows[-1] @ w["lm_head.weight"].T
    expected_q = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    np.testing.assert_allclose(np.array(draft.q[1]), expected_q, atol=1e-4)


def test_mtp_cache_is_rebuilt_from_verified_hidden_states(tiny, qwen35):
    cfg, w = qwen35
    engine = mlx_spec.load(str(tiny["qwen3_5"]), draft_len=3)
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=40, temperature=1.0, seed=2)
    assert result.stats.drafted > result.stats.accepted
    context = ids + result.tokens
    drafter = engine.drafter
    drafter.propose(context, 1, SamplingParams(), mx.random.key(0))  # builds the rows of the verified positions
    first = len(ids) - 1 - PROMPT_ROWS  # the rows start at the prompt's last PROMPT_ROWS positions
    assert first > 0
    end = first + drafter.caches[0].offset  # then one per target position whose successor is known
    assert end == len(context) - 1
    hidden = target_hidden(engine, context[:end + 1])
    expected = mtp_reference(w, cfg, w["model.language_model.embed_tokens.weight"][context[first + 1:end + 1]],
                             hidden[first:end])
    np.testing.assert_allclose(np.array(drafter.mtp_hidden[0]), expected[-1], atol=5e-4)


def test_hidden_tap_is_the_tensor_the_head_scores(tiny):
    engine = mlx_spec.load(str(tiny["qwen3_5"]))
    step = engine.target.forward(engine.encode(PROMPT))
    np.testing.assert_allclose(np.array(lm_head(engine.target.model)(step.hidden)), np.array(step.logits),
                               atol=1e-5)


def test_stripped_checkpoint_is_named_with_the_repair_command(tiny, tmp_path):
    stripped = edited_copy(tiny["qwen3_5"], tmp_path / "stripped",
                           lambda weights: {k: v for k, v in weights.items() if not k.startswith("mtp.")})
    with pytest.raises(SpecError, match="stripped.*mlx-spec convert --add-mtp"):
        mlx_spec.load(str(stripped))
    assert mlx_spec.load(str(stripped), drafter="ngram").drafter.name == "ngram"


@pytest.mark.parametrize("family", ["qwen3_5_moe", "qwen3_next"])
def test_moe_variants_are_lossless_with_mtp_and_with_rollback(tiny, family):
    from helpers import CorruptedOracleDrafter

    from mlx_spec.decode.engine import Engine

    engine = mlx_spec.load(str(tiny[f"{family}-fitted-mtp"]), draft_len=3)
    assert engine.drafter.name == "mtp" and type(engine.drafter.mtp.layers[0].mlp).__name__ == "Qwen3NextSparseMoeBlock"
    ids = engine.encode(PROMPT)
    reference = plain_greedy(tiny[family], ids, 60, 1.3)  # the same target weights
    result = mlx_spec.generate(engine, ids, max_tokens=60, repetition_penalty=1.3)
    assert result.tokens == reference and 0 < result.stats.accepted < result.stats.drafted
    oracle = Engine(Target(engine.target.model), engine.tokenizer,
                    CorruptedOracleDrafter(reference, len(ids), len(engine.tokenizer.get_vocab())), draft_len=5)
    result = mlx_spec.generate(oracle, ids, max_tokens=60, repetition_penalty=1.3)
    assert result.tokens == reference and 0 < result.stats.accepted < result.stats.drafted


@pytest.mark.parametrize("family", ["qwen3_5_moe", "qwen3_next"])
def test_mtp_experts_are_loaded_from_either_layout(tiny, family):
    """Qwen3.5-MoE fuses gate and up ([E, 2I, H], gate first); Qwen3-Next stores each expert apart."""
    weights = load_file(str(tiny[family] / "model.safetensors"))
    switch = mlx_spec.load(str(tiny[family])).drafter.mtp.layers[0].mlp.switch_mlp
    if family == "qwen3_5_moe":
        fused = weights["mtp.layers.0.mlp.experts.gate_up_proj"]
        gate, up = np.split(fused, 2, axis=1)
    else:
        gate = np.stack([weights[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] for e in range(4)])
        up = np.stack([weights[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] for e in range(4)])
    np.testing.assert_array_equal(np.array(switch.gate_proj.weight), gate)
    np.testing.assert_array_equal(np.array(switch.up_proj.weight), up)
    norm = np.array(mlx_spec.load(str(tiny[family])).drafter.mtp.norm.weight)
    np.testing.assert_allclose(norm, weights["mtp.norm.weight"] + 1.0)  # zero-centred: shifted exactly once


def test_pre_norm_tap_is_available_and_differs(tiny):
    """The fitted layer (fitted on the post-norm tap) fed the pre-norm one still drafts right at times."""
    post = mlx_spec.load(str(tiny["qwen3_5"]))
    pre = mlx_spec.load(str(tiny["qwen3_5-fitted-mtp"]), mtp_hidden="pre", draft_len=2)  # the same target
    tokens = post.encode(PROMPT)
    post_step, pre_step = post.target.forward(tokens), pre.target.forward(tokens)
    text = text_model(pre.target.model)
    np.testing.assert_allclose(np.array(text.model.norm(pre_step.hidden)), np.array(post_step.hidden), atol=1e-5)
    result = mlx_spec.generate(pre, tokens, max_tokens=30)
    assert result.tokens == plain_greedy(tiny["qwen3_5"], tokens, 30)
    assert 0 < result.stats.accepted < result.stats.drafted


def test_mtp_failure_messages(tiny, tmp_path):
    from test_cli import assert_one_line_error, run_cli

    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--drafter", "mtp", "--prompt", "hi")
    assert_one_line_error(proc, "declares no MTP layer", "--drafter ngram")
    proc = run_cli("convert", "--add-mtp", "--hf-path", str(tiny["qwen3_5"]), "--mlx-path", str(tiny["qwen3"]))
    assert_one_line_error(proc, "declares no MTP layer")
    proc = run_cli("convert", "--add-mtp", "--hf-path", str(tiny["qwen3_5"]), "--mlx-path", str(tmp_path))
    assert_one_line_error(proc, "not an MLX checkpoint")


@pytest.mark.parametrize("prompt_len, added", [(6, 3), (12, PROMPT_ROWS + 4)])
def test_mtp_rows_after_a_reused_prefix_equal_fresh_ones(tiny, prompt_len, added):
    """A follow-up turn keeps the MTP rows of the cached prefix and rebuilds the last (or, when it adds more
    than PROMPT_ROWS positions, starts over on its last PROMPT_ROWS): the MTP cache and the first draft's logits
    equal those of a fresh engine on the whole prompt."""
    reused, fresh = (mlx_spec.load(str(tiny["qwen3_5"]), drafter="mtp", draft_len=2) for _ in range(2))
    first = reused.encode(PROMPT)[:prompt_len]
    follow_up = first + mlx_spec.generate(reused, first, max_tokens=5).tokens + list(range(5, 5 + added))
    starts = []
    for engine, cached in ((reused, reused.cached_context[:reused.target.offset]), (fresh, [])):
        step = engine.target.prefill(follow_up[:-1], cached)
        engine.drafter.begin(follow_up, step)
        starts.append(step.start)
    assert starts == [len(follow_up) - 1 - added, 0] and reused.target.offset == fresh.target.offset
    rows = fresh.drafter.caches[0].offset
    assert reused.drafter.caches[0].offset == rows == min(len(follow_up) - 1, PROMPT_ROWS)
    np.testing.assert_allclose(np.array(reused.drafter.caches[0].keys[..., :rows, :]),
                               np.array(fresh.drafter.caches[0].keys[..., :rows, :]), atol=1e-4)
    np.testing.assert_allclose(np.array(reused.drafter.next_logits), np.array(fresh.drafter.next_logits), atol=1e-3)


def test_a_sequence_starting_where_drafting_does_not_pay_skips_its_prompt_rows(monkeypatch):
    """Where the policy has measured that drafting does not pay (`drafts_at`), the prefill reads no hidden states
    (the target's last layer is not run in full over the prompt's tail) and the MTP layer builds no prompt rows;
    when drafting turns on it drafts from the positions decoded since, and the output equals plain decoding."""
    engine = mlx_spec.load(str(DEMO / "demo"), drafter="mtp")
    asked, prefill = [], Target.prefill
    monkeypatch.setattr(Target, "prefill", lambda self, tokens, cached=(), hidden=True, **rest:
                        asked.append(hidden) or prefill(self, tokens, cached, hidden, **rest))
    engine.next_policy = Unreadied()
    prompt = engine.encode(PROMPT)
    result = engine.generate(prompt, max_tokens=40)
    assert asked == [False]
    assert result.tokens == engine.with_drafter("off").generate(prompt, max_tokens=40).tokens
    assert result.stats.accepted > 0
