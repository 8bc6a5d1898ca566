"""Published EAGLE-3 heads as their publishers' tools write them (`speculators` >= 0.7 under transformers 5, the
EAGLE repository / SpecForge): every config variant's draft logits against the NumPy transcription of the
published forward (reference_eagle3.py); every variant not read, refused in one line."""

import json
import re

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, assert_one_line_error, plain_greedy, run_cli
from reference_eagle3 import NumpyEagle3
from safetensors.numpy import load_file, save_file

import mlx_spec
from mlx_spec.seams.errors import SpecError
from mlx_spec.models.eagle3 import load_eagle3

HIDDEN, VOCAB, DRAFT_VOCAB = 32, 96, 48
LAYER = {"model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "vocab_size": VOCAB,
         "max_position_embeddings": 2048, "hidden_act": "silu", "tie_word_embeddings": False,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}  # transformers 5 writes RoPE here
HEAD = {"draft_vocab_size": DRAFT_VOCAB, "target_hidden_size": None, "norm_before_residual": False,
        "norm_before_fc": False, "fc_norm": False, "norm_output": False, "eagle_aux_hidden_state_layer_ids": None}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

VARIANTS = {  # (form, changes to the decoder's fields, changes to the head's)
    "speculators, target_hidden_size null, rope_theta in rope_parameters": (
        "speculators", {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
        {"norm_before_residual": True}),
    "llama3 RoPE scaling": ("speculators", {"rope_parameters": LLAMA3}, {}),
    "EAGLE 3.1 norm_output": ("speculators", {}, {"norm_output": True}),
    "fc_norm over four aux layers": ("speculators", {}, {"fc_norm": True,
                                                         "eagle_aux_hidden_state_layer_ids": [0, 1, 2, 3]}),
    "norm_before_fc": ("speculators", {}, {"norm_before_fc": True}),
    "a wider target (target_hidden_size 48)": ("speculators", {}, {"target_hidden_size": 48}),
    "two Qwen3 layers": ("speculators", {"model_type": "qwen3", "num_hidden_layers": 2}, {}),
    "a sliding-window layer": ("speculators", {"layer_types": ["sliding_attention"], "sliding_window": 3}, {}),
    "EAGLE form, rope_scaling, norm_before_fc in eagle_config": (
        "eagle", {"rope_parameters": None, "rope_theta": 500000.0, "rope_scaling": {k: v for k, v in LLAMA3.items()
                                                                                    if k != "rope_theta"}},
        {"norm_before_fc": True}),
}


def random_weights(layer: dict, head: dict, form: str, seed: int) -> dict:
    """Weights of the shapes the config describes, named as the form's tools name them."""
    rng = np.random.default_rng(seed)
    h, d, inner = layer["hidden_size"], layer["head_dim"], layer["intermediate_size"]
    width = head["target_hidden_size"] or h
    aux = len(head["eagle_aux_hidden_state_layer_ids"] or [0, 0, 0])

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(size):
        return (1 + 0.2 * rng.standard_normal(size)).astype(np.float32)

    weights = {"fc.weight": matrix(h, aux * width), "norm.weight": norm(h), "lm_head.weight": matrix(DRAFT_VOCAB, h),
               "embed_tokens.weight": matrix(VOCAB, h)}
    if head["norm_before_fc"]:
        weights["input_norm.weight"] = norm(aux * width)
    if head["fc_norm"]:
        weights.update({f"fc_norm.{i}.weight": norm(width) for i in range(aux)})
    for i in range(layer["num_hidden_layers"]):
        prefix, into = ("midlayer." if form == "eagle" and i == 0 else f"layers.{i}."), (2 * h if i == 0 else h)
        heads, kv_heads = layer["num_attention_heads"], layer["num_key_value_heads"]
        weights.update({prefix + "input_layernorm.weight": norm(h), prefix + "post_attention_layernorm.weight": norm(h),
                        prefix + "self_attn.q_proj.weight": matrix(heads * d, into),
                        prefix + "self_attn.k_proj.weight": matrix(kv_heads * d, into),
                        prefix + "self_attn.v_proj.weight": matrix(kv_heads * d, into),
                        prefix + "self_attn.o_proj.weight": matrix(h, heads * d),
                        prefix + "mlp.gate_proj.weight": matrix(inner, h),
                        prefix + "mlp.up_proj.weight": matrix(inner, h),
                        prefix + "mlp.down_proj.weight": matrix(h, inner)})
        if i == 0:
            weights[prefix + "hidden_norm.weight"] = norm(h)
        if layer["model_type"] == "qwen3":
            weights.update({prefix + "self_attn.q_norm.weight": norm(d), prefix + "self_attn.k_norm.weight": norm(d)})
    kept = np.sort(rng.choice(VOCAB, DRAFT_VOCAB, replace=False))
    weights["d2t"] = (kept - np.arange(DRAFT_VOCAB)).astype(np.int64)
    weights["t2d"] = np.isin(np.arange(VOCAB), kept)
    return weights


def published_config(layer: dict, head: dict, form: str) -> dict:
    """config.json as `speculators` saves it (every field of the head, nulls included; the decoder's nested), or
    as the EAGLE repository writes it (the decoder's fields at the top, the aux layers in eagle_config)."""
    if form == "speculators":
        return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", **head,
                "embed_requires_grad": False, "transformer_layer_config": layer,
                "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                       "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                       "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "x"}}}
    eagle = {k: head[k] for k in ("eagle_aux_hidden_state_layer_ids", "norm_before_fc") if head[k]}
    return {**{k: v for k, v in layer.items() if v is not None}, "architectures": ["LlamaForCausalLMEagle3"],
            "draft_vocab_size": head["draft_vocab_size"], "eagle_config": eagle}


def write_head(path, variant: str, seed: int = 0):
    """A head of `variant` saved in `path`: (its weights, the decoder's fields, the head's)."""
    form, layer_changes, head_changes = VARIANTS[variant]
    layer, head = {**LAYER, **layer_changes}, {**HEAD, **head_changes}
    weights = random_weights(layer, head, form, seed)
    path.mkdir()
    (path / "config.json").write_text(json.dumps(published_config(layer, head, form), indent=2))
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return weights, layer, head


@pytest.mark.parametrize("variant", VARIANTS)
def test_published_variants_draft_the_published_logits(tmp_path, variant):
    weights, layer, head = write_head(tmp_path / "head", variant)
    model = load_eagle3(tmp_path / "head", json.loads((tmp_path / "head" / "config.json").read_text()))
    rope = layer["rope_parameters"] or {**layer["rope_scaling"], "rope_theta": layer["rope_theta"]}
    reference = NumpyEagle3(weights, {**layer, "rope": rope}, {**head, "vocab_size": VOCAB})
    rng = np.random.default_rng(1)
    aux, width = len(head["eagle_aux_hidden_state_layer_ids"] or [0, 0, 0]), head["target_hidden_size"] or HIDDEN
    features, embeddings = rng.standard_normal((7, aux * width)), rng.standard_normal((10, HIDDEN))
    fed_back, logits = reference.step(embeddings[:7], reference.project(features))  # verified rows
    cache = model.make_cache()
    g = model(mx.array(embeddings[:7], mx.float32)[None], mx.array(features, mx.float32)[None], cache)[0]
    np.testing.assert_allclose(np.array(model.logits(g)), logits, atol=2e-4)
    for row in range(7, 10):  # draft steps feed back what the last row returned, one position further each
        fed_back, logits = reference.step(embeddings[row:row + 1], fed_back[-1:])
        g = model(mx.array(embeddings[row:row + 1], mx.float32)[None], g[-1:][None], cache)[0]
        np.testing.assert_allclose(np.array(model.logits(g)), logits, atol=2e-4)


REFUSALS = {  # (what changes in the speculators config, what the one line says)
    "unread decoder family": (lambda c: c["transformer_layer_config"].update(model_type="mistral"),
                              "'mistral' decoder layers are not read yet"),
    "EAGLE-1/2 head": (lambda c: c.update(use_aux_hidden_state=False), "EAGLE-1/2 head"),
    "both fc norms": (lambda c: c.update(norm_before_fc=True, fc_norm=True), "exclude each other"),
    "another activation": (lambda c: c["transformer_layer_config"].update(hidden_act="gelu"),
                           "'gelu' activation is not read yet"),
    "partial RoPE": (lambda c: c["transformer_layer_config"]["rope_parameters"].update(partial_rotary_factor=0.5),
                     "partial rotary embedding"),
    "an unknown RoPE": (lambda c: c["transformer_layer_config"]["rope_parameters"].update(rope_type="sideways"),
                        "rotary embedding is not supported"),
    "sliding without a window": (lambda c: c["transformer_layer_config"].update(layer_types=["sliding_attention"]),
                                 "no sliding_window"),
    "layer types of another depth": (lambda c: c["transformer_layer_config"].update(
        layer_types=["full_attention"] * 2), "do not describe its 1 layer(s)"),
    "no hidden size": (lambda c: c["transformer_layer_config"].pop("hidden_size"), "lacks hidden_size"),
    "the wrong weights for its fc": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 1]),
                                     "do not fit the EAGLE-3 head"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_unread_variants_are_refused_in_one_line(tmp_path, case):
    write_head(tmp_path / "head", "EAGLE 3.1 norm_output")
    edit, words = REFUSALS[case]
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    edit(config)
    with pytest.raises(SpecError, match=re.escape(words)) as refusal:
        load_eagle3(tmp_path / "head", config)
    assert "\n" not in str(refusal.value)


def speculators_copy(tiny, out, **layer_changes):
    """The trained EAGLE-form fixture head as `speculators` saves it: its decoder's fields nested, RoPE in
    rope_parameters, target_hidden_size null, every head key written, layer 0 as layers.0.*."""
    layer = json.loads((tiny["qwen3-eagle3"] / "config.json").read_text())
    aux = layer.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"]
    layer["rope_parameters"] = {"rope_type": "default", "rope_theta": layer.pop("rope_theta")}
    head = {**HEAD, "draft_vocab_size": layer.pop("draft_vocab_size"), "eagle_aux_hidden_state_layer_ids": aux}
    out.mkdir()
    (out / "config.json").write_text(json.dumps(published_config({**layer, **layer_changes}, head, "speculators")))
    weights = load_file(str(tiny["qwen3-eagle3"] / "model.safetensors"))
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in weights.items()}, str(out / "model.safetensors"))
    return out


def test_speculators_form_drafts_as_the_eagle_form(tiny, tmp_path):
    results = []
    for head in (tiny["qwen3-eagle3"], speculators_copy(tiny, tmp_path / "speculators")):
        engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(head), draft_len=3)
        results.append(engine.generate(PROMPT, max_tokens=40))
    assert results[0].tokens == results[1].tokens
    assert results[0].stats.per_position_acceptance == results[1].stats.per_position_acceptance
    assert 0 < results[1].stats.accepted < results[1].stats.drafted


def test_a_sliding_window_head_drafts_chains_exactly(tiny, tmp_path):
    head = speculators_copy(tiny, tmp_path / "sliding", layer_types=["sliding_attention"], sliding_window=16)
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(head), draft_len=3, tree_width=3)
    assert "sliding-window layers, which draft chains only" in engine.status().shape
    ids = engine.encode(PROMPT)
    assert len(ids) + 60 > 2 * 16  # the window binds
    result = engine.generate(ids, max_tokens=60)
    assert result.tokens == plain_greedy(tiny["qwen3"], ids, 60)
    assert 0 < result.stats.accepted < result.stats.drafted


def test_a_refused_head_from_the_command_line(tiny, tmp_path):
    head = speculators_copy(tiny, tmp_path / "gelu", hidden_act="gelu")
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(head), "--prompt", "hi")
    assert_one_line_error(proc, "'gelu' activation is not read yet", "use a SiLU head")


@pytest.mark.parametrize("width", [1, 3])
def test_a_two_layer_qwen3_head_drafts_exactly(tiny, tmp_path, width):
    """The trained head as two Qwen3 layers: q_norm / k_norm added to its first, and a second whose attention and
    MLP outputs are zero (so its drafts stay good enough to be accepted, its computation runs in full)."""
    head = speculators_copy(tiny, tmp_path / "qwen3", model_type="qwen3", num_hidden_layers=2)
    weights, config = load_file(str(head / "model.safetensors")), json.loads((head / "config.json").read_text())
    layer, rng = config["transformer_layer_config"], np.random.default_rng(0)
    d, h, inner = layer["head_dim"], layer["hidden_size"], layer["intermediate_size"]
    for i in (0, 1):
        weights.update({f"layers.{i}.self_attn.q_norm.weight": np.full(d, np.sqrt(d) / 4, np.float32),
                        f"layers.{i}.self_attn.k_norm.weight": np.full(d, np.sqrt(d) / 4, np.float32)})
    shapes = {"input_layernorm": (h,), "post_attention_layernorm": (h,), "self_attn.q_proj": (h, h),
              "self_attn.k_proj": (h // 2, h), "self_attn.v_proj": (h // 2, h), "mlp.gate_proj": (inner, h),
              "mlp.up_proj": (inner, h)}
    weights.update({f"layers.1.{name}.weight": rng.standard_normal(shape).astype(np.float32)
                    for name, shape in shapes.items()})
    weights.update({"layers.1.self_attn.o_proj.weight": np.zeros((h, h), np.float32),
                    "layers.1.mlp.down_proj.weight": np.zeros((h, inner), np.float32)})
    save_file(weights, str(head / "model.safetensors"))
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(head), draft_len=3, tree_width=width)
    ids = engine.encode(PROMPT)
    result = engine.generate(ids, max_tokens=60)
    assert result.tokens == plain_greedy(tiny["qwen3"], ids, 60)
    assert 0 < result.stats.accepted < result.stats.drafted
    assert result.stats.nodes > result.stats.drafted if width > 1 else result.stats.nodes == result.stats.drafted
