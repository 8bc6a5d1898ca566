"""Tiny, complete Hugging Face-layout checkpoints for tests and the offline demo.

Each checkpoint is what a user downloads, only small: `config.json`, `model.safetensors` (float32, HF tensor
names), `generation_config.json` and a real byte-level BPE tokenizer trained offline on the interpreter's own
standard-library sources. They load through exactly the code path a real checkpoint takes.

The trained checkpoints built on these (heads, nextn layers, a distilled assistant) and the whole set the tests use
are in `suite.py`.
"""

from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS_MODULES = ["textwrap.py", "string.py", "json/encoder.py", "json/decoder.py", "pprint.py", "colorsys.py"]


def corpus_text() -> str:
    """A few fixed standard-library sources: offline, identical on every machine of one Python version."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return "\n".join((stdlib / name).read_text(encoding="utf-8") for name in CORPUS_MODULES)


def build_tokenizer(out_dir: str | Path, vocab_size: int = 512, special_tokens: list[str] = SPECIAL_TOKENS,
                    texts: list[str] | None = None, chat_template: str = CHAT_TEMPLATE) -> Path:
    """Train a byte-level BPE tokenizer on `texts` (default: `corpus_text()`) and write it in the HF
    `tokenizer.json` layout; the first special token is the end-of-sequence token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts or [corpus_text()], trainer=trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": special_tokens[0],
        "pad_token": special_tokens[0],
        "bos_token": None,
        "add_bos_token": False,
        "model_max_length": 4096,
        "chat_template": chat_template,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": special_tokens[0], "pad_token": special_tokens[0]}, indent=2)
    )
    return out_dir


# --- per-family config and tensor names (the exact HF layout of each family) -----------------------------

def _dense_config(model_type, arch, vocab, hidden, layers, heads, kv_heads, head_dim, inter):
    return {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": 0,
    }


def family_config(family: str, vocab: int, hidden: int, layers: int, sliding_window: int = 16) -> dict:
    heads, kv_heads, head_dim, inter = 4, 2, hidden // 2, hidden * 2
    if family == "qwen3":
        cfg = _dense_config("qwen3", "Qwen3ForCausalLM", vocab, hidden, layers, heads, kv_heads, head_dim, inter)
        cfg["tie_word_embeddings"] = True
    elif family == "llama":
        cfg = _dense_config("llama", "LlamaForCausalLM", vocab, hidden, layers, heads, kv_heads, head_dim, inter)
        cfg.update(tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    elif family == "gemma3":
        cfg = _dense_config("gemma3_text", "Gemma3ForCausalLM", vocab, hidden, layers, heads, kv_heads, head_dim,
                            inter)
        cfg.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=head_dim,
            sliding_window=sliding_window,
            sliding_window_pattern=3,
            layer_types=["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(layers)],
            rope_local_base_freq=10000.0,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            tie_word_embeddings=True,
        )
        del cfg["hidden_act"]
    elif family in QWEN3_5_FAMILIES:
        return qwen3_5_config(family, vocab, hidden, layers)
    else:
        raise ValueError(f"unknown family {family!r}: choose qwen3, llama, gemma3, {', '.join(QWEN3_5_FAMILIES)}")
    return cfg


QWEN3_5_FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
       "decoder_sparse_step": 1, "norm_topk_prob": True}


def qwen3_5_config(family: str, vocab: int, hidden: int, layers: int) -> dict:
    """Hybrid Gated DeltaNet / gated attention models with one MTP layer, as published: Qwen3.5 / 3.6 dense
    (`qwen3_5`) and MoE (`qwen3_5_moe`) nest their text keys in `text_config`; Qwen3-Next is flat."""
    text = {
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "eos_token_id": 0,
    }
    if family == "qwen3_next":
        return {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", **text, **MOE,
                "mlp_only_layers": [], "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                "torch_dtype": "float32"}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [1, 1, 0], "mrope_interleaved": True}
    text["dtype"] = "float32"
    moe = family == "qwen3_5_moe"
    if moe:
        text.update(MOE)
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
        "model_type": family,
        "text_config": {"model_type": f"{family}_text", **text},
        "vision_config": {"model_type": family, "depth": 1, "hidden_size": 32, "out_hidden_size": hidden},
        "tie_word_embeddings": False,
        "eos_token_id": 0,
        "torch_dtype": "float32",
    }


def qwen3_5_shapes(family: str, cfg: dict) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes: the text model (`model.language_model.*` for Qwen3.5, `model.*` for
    Qwen3-Next), `lm_head` and the MTP layer (`mtp.*`); MoE experts fused (Qwen3.5) or per expert (Qwen3-Next)."""
    t = cfg.get("text_config", cfg)
    h, v, hd, nq, nkv = t["hidden_size"], t["vocab_size"], t["head_dim"], t["num_attention_heads"], \
        t["num_key_value_heads"]
    hk, hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv, kernel = t["linear_key_head_dim"], t["linear_value_head_dim"], t["linear_conv_kernel_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    base = "model." if family == "qwen3_next" else "model.language_model."

    def attention(p):
        return {p + "self_attn.q_proj.weight": (2 * nq * hd, h), p + "self_attn.k_proj.weight": (nkv * hd, h),
                p + "self_attn.v_proj.weight": (nkv * hd, h), p + "self_attn.o_proj.weight": (h, nq * hd),
                p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}

    def mlp_and_norms(p):
        shapes = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
        if family == "qwen3_5":
            i = t["intermediate_size"]
            return {**shapes, p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                    p + "mlp.down_proj.weight": (h, i)}
        e, i, si = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
        shapes.update({p + "mlp.gate.weight": (e, h), p + "mlp.shared_expert.gate_proj.weight": (si, h),
                       p + "mlp.shared_expert.up_proj.weight": (si, h),
                       p + "mlp.shared_expert.down_proj.weight": (h, si), p + "mlp.shared_expert_gate.weight": (1, h)})
        if family == "qwen3_5_moe":
            shapes.update({p + "mlp.experts.gate_up_proj": (e, 2 * i, h), p + "mlp.experts.down_proj": (e, h, i)})
        else:
            for x in range(e):
                shapes.update({p + f"mlp.experts.{x}.gate_proj.weight": (i, h),
                               p + f"mlp.experts.{x}.up_proj.weight": (i, h),
                               p + f"mlp.experts.{x}.down_proj.weight": (h, i)})
        return shapes

    def linear_attention(p):
        p += "linear_attn."
        if family == "qwen3_next":
            shapes = {p + "in_proj_qkvz.weight": (conv_dim + hv * dv, h), p + "in_proj_ba.weight": (2 * hv, h)}
        else:
            shapes = {p + "in_proj_qkv.weight": (conv_dim, h), p + "in_proj_z.weight": (hv * dv, h),
                      p + "in_proj_b.weight": (hv, h), p + "in_proj_a.weight": (hv, h)}
        return {**shapes, p + "conv1d.weight": (conv_dim, 1, kernel), p + "dt_bias": (hv,), p + "A_log": (hv,),
                p + "norm.weight": (dv,), p + "out_proj.weight": (h, hv * dv)}

    shapes = {base + "embed_tokens.weight": (v, h), base + "norm.weight": (h,), "lm_head.weight": (v, h)}
    for i, kind in enumerate(t["layer_types"]):
        p = f"{base}layers.{i}."
        shapes.update(mlp_and_norms(p))
        shapes.update(attention(p) if kind == "full_attention" else linear_attention(p))
    shapes.update({"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
                   "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)})
    shapes.update(attention("mtp.layers.0."))
    shapes.update(mlp_and_norms("mtp.layers.0."))
    return shapes


def qwen3_5_weights(shapes: dict, seed: int) -> dict[str, np.ndarray]:
    """Qwen3.5 conventions: decoder, final and MTP RMSNorms are zero-centred (effective 1 + w); the gated
    GDN output norm is not; A_log = log(A) with A in [1, 16]."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("A_log"):
            w = np.log(rng.uniform(1, 16, shape))
        elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            w = 0.1 * rng.standard_normal(shape)
        elif name.endswith("conv1d.weight"):
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
        elif "embed_tokens" in name or "lm_head" in name:
            w = 0.5 * rng.standard_normal(shape)
        else:
            w = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[-1])
        weights[name] = w.astype(np.float32)
    return weights


def family_shapes(family: str, cfg: dict) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for every tensor of the checkpoint."""
    h, v, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    nq, nkv, inter = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (v, h)
    norms = ["input_layernorm", "post_attention_layernorm"]
    if family == "gemma3":
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (nq * hd, h),
            p + "self_attn.k_proj.weight": (nkv * hd, h),
            p + "self_attn.v_proj.weight": (nkv * hd, h),
            p + "self_attn.o_proj.weight": (h, nq * hd),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
        if family in ("qwen3", "gemma3"):
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes.update({p + n + ".weight": (h,) for n in norms})
    return shapes


def random_weights(family: str, shapes: dict, seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights scaled so that logits are well spread (few near ties under greedy decoding)
    and the layers, not the input embedding, dominate the output (random models otherwise echo their input)."""
    rng = np.random.default_rng(seed)
    gemma = family == "gemma3"  # Gemma 3 norms store w with effective weight 1 + w, and scale embeddings
    weights = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            base = 0.0 if gemma else 1.0
            if gemma and ("post_attention" in name or "post_feedforward" in name):
                base = 1.0
            elif gemma and name == "model.norm.weight":
                base = 4.0
            weights[name] = (base + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif "embed_tokens" in name or "lm_head" in name:
            weights[name] = ((0.1 if gemma else 0.5) * rng.standard_normal(shape)).astype(np.float32)
        else:
            weights[name] = (2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return weights


def write_checkpoint(out_dir: Path, cfg: dict, weights: dict[str, np.ndarray], tokenizer_dir: Path) -> Path:
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"]}, indent=2))
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out_dir / name).write_bytes((tokenizer_dir / name).read_bytes())
    return out_dir


def build_checkpoint(
    out_dir: str | Path,
    family: str,
    tokenizer_dir: str | Path,
    *,
    hidden: int = 64,
    layers: int = 4,
    sliding_window: int = 16,
    seed: int = 0,
    overrides: dict | None = None,
) -> Path:
    """A random-weight checkpoint of `family` sharing the tokenizer in `tokenizer_dir`; `overrides` replaces
    text-config keys (head counts and sizes, for benchmark-sized models)."""
    tokenizer_dir = Path(tokenizer_dir)
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]
    cfg = family_config(family, len(vocab), hidden, layers, sliding_window)
    cfg.get("text_config", cfg).update(overrides or {})
    if family in QWEN3_5_FAMILIES:
        weights = qwen3_5_weights(qwen3_5_shapes(family, cfg), seed)
    else:
        weights = random_weights(family, family_shapes(family, cfg), seed)
    return write_checkpoint(Path(out_dir), cfg, weights, tokenizer_dir)


def build_layer_skip_draft(out_dir: str | Path, target_dir: str | Path, keep_layers: int = 1,
                           noise: float = 0.0, seed: int = 1) -> Path:
    """A draft model made of the target's embeddings, head, final norm and first `keep_layers` layers.

    Random models share no knowledge, so a separately drawn draft would be rejected almost always; a
    layer-skip draft agrees with its target often, which exercises both accepted and rejected drafts.
    """
    from safetensors.numpy import load_file

    target_dir = Path(target_dir)
    cfg = json.loads((target_dir / "config.json").read_text())
    rng = np.random.default_rng(seed)
    weights = {}
    for name, w in load_file(str(target_dir / "model.safetensors")).items():
        layer = re.match(r"(?:model|backbone)\.(?:language_model\.)?layers\.(\d+)\.", name)  # Nemotron-H: backbone
        if layer and int(layer.group(1)) >= keep_layers:
            continue
        weights[name] = (w + noise * rng.standard_normal(w.shape) * w.std()).astype(np.float32)
    text = cfg.get("text_config", cfg)
    if text.get("hidden_size_per_layer_input"):  # Gemma 4: a slice of the per-layer embeddings for each layer
        width, first_shared = keep_layers * text["hidden_size_per_layer_input"], \
            text["num_hidden_layers"] - text["num_kv_shared_layers"]
        for name in list(weights):
            if name.endswith("embed_tokens_per_layer.weight"):
                weights[name] = np.ascontiguousarray(weights[name][:, :width])
            elif name.endswith("per_layer_model_projection.weight"):
                weights[name] = np.ascontiguousarray(weights[name][:width])
        text["num_kv_shared_layers"] = max(0, keep_layers - first_shared)
    text["num_hidden_layers"] = keep_layers
    if "hybrid_override_pattern" in text:  # Nemotron-H: one letter a layer
        text["hybrid_override_pattern"] = text["hybrid_override_pattern"][:keep_layers]
    if "layer_types" in text:
        text["layer_types"] = text["layer_types"][:keep_layers]
    return write_checkpoint(Path(out_dir), cfg, weights, target_dir)


def with_context(out_dir: str | Path, source_dir: str | Path, positions: int) -> Path:
    """A copy of the checkpoint in `source_dir` whose config states a context of `positions` (the same weights)."""
    import shutil

    out_dir = Path(shutil.copytree(source_dir, out_dir))
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg.get("text_config", cfg)["max_position_embeddings"] = positions
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    return out_dir


def build_bench_pair(hidden: int, layers: int, draft_layers: int = 2) -> tuple[Path, Path]:
    """A benchmark-sized qwen3 target and its layer-skip draft, in a fresh temporary folder."""
    import atexit
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="mlx-spec-bench-"))
    atexit.register(shutil.rmtree, root, True)  # benchmark-sized weights: gigabytes
    target = build_checkpoint(root / "target", "qwen3", build_tokenizer(root / "tokenizer"), hidden=hidden,
                              layers=layers)
    return target, build_layer_skip_draft(root / "draft", target, keep_layers=draft_layers)


PROMPT = "import os\nimport sys\n\ndef main(argv):\n    for name in argv:\n        print(name)\n"  # the tests'
HEAD_TEXTS = [PROMPT, "def main():", "class Stack(object):"]  # what the test heads are trained on
