"""Tiny Gemma 4 E2B/E4B-shaped targets (sliding and full layers, per-layer inputs, KV-shared layers) and their
"assistant" drafters in the Hugging Face layout (random, or distilled on the target's own choices)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tiny import write_checkpoint
from tiny_heads import fit


def gemma4_config(vocab: int, hidden: int = 64, layers: int = 6, shared: int = 2, sliding_window: int = 16) -> dict:
    """A Gemma 4 E2B/E4B-shaped target (`Gemma4ForConditionalGeneration`): sliding and full layers with their
    own head sizes and RoPE, per-layer input embeddings, and the last `shared` layers KV-shared."""
    pattern = ["sliding_attention", "sliding_attention", "full_attention"]
    text = {
        "model_type": "gemma4_text",
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "global_head_dim": 32,
        "num_kv_shared_layers": shared,
        "hidden_size_per_layer_input": 16,
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "sliding_window": sliding_window,
        "layer_types": (pattern * layers)[:layers],
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "use_double_wide_mlp": True,
        "attention_k_eq_v": False,
        "enable_moe_block": False,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 0,
    }
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 32},
        "vocab_size": vocab,  # mlx-lm reads the vocabulary here (its default is the real 262144)
        "tie_word_embeddings": True,
        "eos_token_id": 0,
        "torch_dtype": "float32",
    }


def gemma4_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """HF names (`model.language_model.*`) and shapes; KV-shared layers still store k/v projections (the
    loader drops them) and get the double-wide MLP."""
    t = cfg["text_config"]
    h, v, n, hp = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"], t["hidden_size_per_layer_input"]
    nq, nkv, first_shared = t["num_attention_heads"], t["num_key_value_heads"], n - t["num_kv_shared_layers"]
    base = "model.language_model."
    shapes = {base + "embed_tokens.weight": (v, h), base + "norm.weight": (h,),
              base + "embed_tokens_per_layer.weight": (t["vocab_size_per_layer_input"], n * hp),
              base + "per_layer_model_projection.weight": (n * hp, h), base + "per_layer_projection_norm.weight": (hp,)}
    for i, kind in enumerate(t["layer_types"]):
        p = f"{base}layers.{i}."
        hd = t["global_head_dim"] if kind == "full_attention" else t["head_dim"]
        inter = t["intermediate_size"] * (2 if t["use_double_wide_mlp"] and i >= first_shared else 1)
        shapes.update({
            p + "self_attn.q_proj.weight": (nq * hd, h), p + "self_attn.k_proj.weight": (nkv * hd, h),
            p + "self_attn.v_proj.weight": (nkv * hd, h), p + "self_attn.o_proj.weight": (h, nq * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "per_layer_input_gate.weight": (hp, h), p + "per_layer_projection.weight": (h, hp),
            p + "post_per_layer_input_norm.weight": (h,), p + "layer_scalar": (1,),
        })
        shapes.update({p + f"{norm}.weight": (h,) for norm in GEMMA4_NORMS})
    return shapes


GEMMA4_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm")


def gemma4_weights(shapes: dict, seed: int) -> dict[str, np.ndarray]:
    """Gemma 4 conventions: plain RMSNorm weights (effective w, around 1), `layer_scalar` per layer."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("token_ordering"):
            continue  # written by the assistant builder (integers)
        if len(shape) == 1:
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif "embed" in name or "centroids" in name:
            w = 0.5 * rng.standard_normal(shape)
        else:
            w = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[-1])
        weights[name] = w.astype(np.float32)
    return weights


def gemma4_assistant_config(target_cfg: dict, hidden: int = 32, ordered: bool = True, num_centroids: int = 32,
                            top_k: int = 4) -> dict:
    """The assistant of a `gemma4_config` target, as Google ships them (`Gemma4AssistantForCausalLM`): 4
    query-only layers (3 sliding, 1 full) with the target's head sizes, and the sparse centroid head when
    `ordered` (E2B / E4B) or the dense tied head (26B / 31B)."""
    t = target_cfg["text_config"]
    text = {key: t[key] for key in ("num_key_value_heads", "head_dim", "global_head_dim", "sliding_window",
                                    "rope_parameters", "hidden_activation", "rms_norm_eps", "vocab_size",
                                    "max_position_embeddings", "attention_k_eq_v")}
    text.update({
        "model_type": "gemma4_text", "hidden_size": hidden, "intermediate_size": hidden * 2, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_kv_shared_layers": 4, "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0, "enable_moe_block": False, "use_double_wide_mlp": False,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "final_logit_softcapping": None,
        "tie_word_embeddings": True,
    })
    return {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
            "backbone_hidden_size": t["hidden_size"], "use_ordered_embeddings": ordered,
            "num_centroids": num_centroids, "centroid_intermediate_top_k": top_k, "tie_word_embeddings": True,
            "text_config": text, "eos_token_id": 0, "torch_dtype": "float32"}


def gemma4_assistant_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """The assistant's HF tensors: no k/v projections (its layers read the target's K/V), no lm_head (tied)."""
    t = cfg["text_config"]
    h, hb, v, nq, inter = t["hidden_size"], cfg["backbone_hidden_size"], t["vocab_size"], \
        t["num_attention_heads"], t["intermediate_size"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,),
              "pre_projection.weight": (h, 2 * hb), "post_projection.weight": (hb, h)}
    if cfg["use_ordered_embeddings"]:
        shapes.update({"masked_embedding.centroids.weight": (cfg["num_centroids"], h),
                       "masked_embedding.token_ordering": (v,)})
    for i, kind in enumerate(t["layer_types"]):
        p = f"model.layers.{i}."
        hd = t["global_head_dim"] if kind == "full_attention" else t["head_dim"]
        shapes.update({p + "self_attn.q_proj.weight": (nq * hd, h), p + "self_attn.o_proj.weight": (h, nq * hd),
                       p + "self_attn.q_norm.weight": (hd,), p + "mlp.gate_proj.weight": (inter, h),
                       p + "mlp.up_proj.weight": (inter, h), p + "mlp.down_proj.weight": (h, inter),
                       p + "layer_scalar": (1,)})
        shapes.update({p + f"{norm}.weight": (h,) for norm in GEMMA4_NORMS})
    return shapes


def build_gemma4_target(out_dir: str | Path, tokenizer_dir: str | Path, sliding_window: int = 16,
                        seed: int = 11, hidden: int = 64, layers: int = 6, overrides: dict | None = None) -> Path:
    """A tiny random Gemma 4 target (E2B-like: sliding and full layers, per-layer inputs, KV-shared layers);
    `overrides` replaces text-config keys (head sizes, for benchmark-sized models)."""
    tokenizer_dir = Path(tokenizer_dir)
    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    cfg = gemma4_config(vocab, hidden=hidden, layers=layers, sliding_window=sliding_window)
    cfg["text_config"].update(overrides or {})
    return write_checkpoint(Path(out_dir), cfg, gemma4_weights(gemma4_shapes(cfg), seed), tokenizer_dir)


def build_gemma4_assistant(out_dir: str | Path, target_dir: str | Path, ordered: bool = True,
                           seed: int = 12, hidden: int = 32) -> Path:
    """A random assistant for a `build_gemma4_target` target; the token ordering is a random permutation."""
    target_dir = Path(target_dir)
    cfg = gemma4_assistant_config(json.loads((target_dir / "config.json").read_text()), hidden, ordered)
    weights = gemma4_weights(gemma4_assistant_shapes(cfg), seed)
    if ordered:
        vocab = cfg["text_config"]["vocab_size"]
        weights["masked_embedding.token_ordering"] = np.random.default_rng(seed).permutation(vocab).astype(np.int64)
    return write_checkpoint(Path(out_dir), cfg, weights, target_dir)


def distill_gemma4_assistant(out_dir: str | Path, assistant_dir: str | Path, target_dir: str | Path,
                             steps: int = 150, seed: int = 0) -> Path:
    """A copy of a dense-head assistant trained (first draft step only) to predict its target's greedy choice
    after random token sequences, so that tests and benchmarks see accepted drafts. The batched training
    forward uses the drafting convention: row r reads K/V of positions <= r (the last `sliding_window` of them
    for sliding layers) with its query at position r + 1."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models.cache import KVCache
    from mlx_lm.utils import load_model

    from mlx_spec.drafters.gemma4_assistant import shared_kv_sources
    from mlx_spec.models.gemma4_assistant import load_assistant

    mx.random.seed(seed)
    target, _ = load_model(Path(target_dir))
    assistant = load_assistant(Path(assistant_dir))
    text = target.language_model.model
    batch, length = 32, 96
    tokens = mx.random.randint(1, text.vocab_size, (batch, length))
    cache = [KVCache() for _ in target.make_cache()]
    hidden = text(tokens, cache=cache)
    labels = text.embed_tokens.as_linear(hidden).argmax(-1)[:, 1:]  # the target's greedy choice after row r + 1
    shared_kv = {kind: (cache[i].keys[..., :length, :], cache[i].values[..., :length, :])
                 for kind, i in shared_kv_sources(target).items()}
    rows, keys = mx.arange(length - 1)[:, None], mx.arange(length)[None]
    masks = {"full_attention": keys <= rows, "sliding_attention": (keys <= rows) & (keys > rows - text.window_size)}
    inputs = text.embed_tokens(tokens[:, 1:]) * text.embed_scale
    mx.eval(inputs, hidden, shared_kv, labels)

    def loss(model):
        logits, _ = model(inputs, hidden[:, :-1], shared_kv, 1, masks)
        return nn.losses.cross_entropy(logits, labels).mean()

    fit(assistant, loss, steps, 3e-3)
    out_dir, assistant_dir = Path(out_dir), Path(assistant_dir)
    weights = {k: np.array(v) for k, v in tree_flatten(assistant.parameters())}
    return write_checkpoint(out_dir, json.loads((assistant_dir / "config.json").read_text()), weights,
                            Path(target_dir))
