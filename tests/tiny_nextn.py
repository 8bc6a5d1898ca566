"""Tiny checkpoints in the Hugging Face layout of each nextn family (DeepSeek-V3: MLA + MoE; DeepSeek-V3.2 and
GLM-5: MLA with a sparse attention's indexer + MoE; GLM-4.5: GQA + MoE; GLM-4.7-Flash: MLA + GLM's MoE; MiMo-7B;
K-EXAONE; ERNIE 4.5 MoE; MiMo-V2-Flash; Step 3.5 Flash; LongCat-Flash: two MLA sublayers a layer, zero-computation
experts; Ling 2.5 / 3.0: gated linear / delta attention layers between MLA ones; Nemotron-H: Mamba 2, attention, MLP
and expert layers, its MTP layer an attention and an expert sublayer), each with its MTP layer under the names its
publisher uses (DeepSeek's and GLM's as
`model.layers.{num_hidden_layers}.*`, copies of the embedding and output head included)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
from tiny import write_checkpoint
from tiny_nextn_configs import config
from tiny_recurrent import nemotron_h_shapes

from mlx_spec.models.nextn import FAMILIES, family_of, own_names, prefix, text_config

NEXTN_FAMILIES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa", "glm4_moe", "glm4_moe_lite", "mimo", "exaone_moe",
                  "ernie4_5_moe", "mimo_v2_flash", "step3p5", "longcat_flash", "bailing_hybrid", "bailing_moe_v3",
                  "nemotron_h", "kimi_k3")
MLA = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa", "glm4_moe_lite", "longcat_flash")  # compressed keys and values
# the target's token embedding, where not model.embed_tokens
EMBEDDING = {"bailing_hybrid": "model.word_embeddings.weight", "bailing_moe_v3": "model.word_embeddings.weight",
             "nemotron_h": "backbone.embeddings.weight", "kimi_k3": "language_model.model.embed_tokens.weight"}
HEAD = {"kimi_k3": "language_model.lm_head.weight"}  # the target's output head, where not lm_head
def is_moe(cfg: dict, i: int) -> bool:
    """Whether layer i (the MTP block: i = num_hidden_layers) is a mixture of experts (Nemotron-H's pattern says
    which of its layers are: `layer_shapes` reads it)."""
    if "hybrid_override_pattern" in cfg:
        return False
    if "moe_layers_enum" in cfg:
        return str(i) in cfg["moe_layers_enum"].split(",")
    if "moe_layer_freq" in cfg and isinstance(cfg["moe_layer_freq"], list):
        return i < len(cfg["moe_layer_freq"]) and cfg["moe_layer_freq"][i] == 1
    if "is_moe_layer" in cfg:
        return i < len(cfg["is_moe_layer"]) and cfg["is_moe_layer"][i]
    if cfg["model_type"] == "longcat_flash":  # every layer has experts beside its MLPs; its MTP block none
        return i < cfg["num_layers"]
    if cfg["model_type"] == "ernie4_5_moe":  # its MTP block is dense
        return cfg["moe_layer_start_index"] <= i < cfg["num_hidden_layers"]
    return "n_routed_experts" in cfg and i >= cfg["first_k_dense_replace"]


def swiglu(name: str, h: int, inter: int) -> dict[str, tuple[int, ...]]:
    """A gated MLP's (or one expert's) projections under `name`."""
    return {f"{name}.gate_proj.weight": (inter, h), f"{name}.up_proj.weight": (inter, h),
            f"{name}.down_proj.weight": (h, inter)}


def depth(cfg: dict) -> int:
    """The target's layers (LongCat calls them `num_layers`)."""
    text = text_config(cfg)
    return text.get("num_hidden_layers", text.get("num_layers"))


def kv_b_proj(cfg: dict) -> tuple[int, int]:
    """The shape of an MLA layer's key and value up-projection as published whole (mlx-lm splits it per head)."""
    return cfg["num_attention_heads"] * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]


def layer_shapes(cfg: dict, p: str, moe: bool) -> dict[str, tuple[int, ...]]:
    """One decoder layer's tensors under the prefix `p`."""
    if cfg["model_type"] == "longcat_flash":
        return longcat_layer_shapes(cfg, p)
    if cfg["model_type"] == "bailing_hybrid":
        return bailing_layer_shapes(cfg, p)
    if cfg["model_type"] == "kimi_k3":
        return kimi_layer_shapes(cfg, p)
    if cfg["model_type"] == "nemotron_h":  # its MTP layer: a sublayer per letter of its own pattern
        sublayers = nemotron_h_shapes({**cfg, "hybrid_override_pattern": cfg["mtp_hybrid_override_pattern"]})
        return {p + k[len("backbone."):]: v for k, v in sublayers.items() if k.startswith("backbone.layers.")}
    if cfg["model_type"] == "exaone_moe":
        return exaone_layer_shapes(cfg, p, moe)
    if cfg["model_type"] == "ernie4_5_moe":
        return ernie_layer_shapes(cfg, p, moe)
    if cfg["model_type"] == "mimo_v2_flash":
        return mimo_v2_layer_shapes(cfg, p, moe)
    if cfg["model_type"] == "step3p5":
        return step3p5_layer_shapes(cfg, p, moe)
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    shapes = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    if cfg["model_type"] in MLA:
        q_head = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        shapes.update({p + "self_attn.q_a_proj.weight": (cfg["q_lora_rank"], h),
                       p + "self_attn.q_a_layernorm.weight": (cfg["q_lora_rank"],),
                       p + "self_attn.q_b_proj.weight": (heads * q_head, cfg["q_lora_rank"]),
                       p + "self_attn.kv_a_proj_with_mqa.weight": (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h),
                       p + "self_attn.kv_a_layernorm.weight": (cfg["kv_lora_rank"],),
                       p + "self_attn.kv_b_proj.weight": kv_b_proj(cfg),
                       p + "self_attn.o_proj.weight": (h, heads * cfg["v_head_dim"])})
        if "index_topk" in cfg:  # the sparse attention's indexer (DeepSeek-V3.2 / GLM-5 names)
            index_heads, index_dim = cfg["index_n_heads"], cfg["index_head_dim"]
            shapes.update({p + "self_attn.indexer.wq_b.weight": (index_heads * index_dim, cfg["q_lora_rank"]),
                           p + "self_attn.indexer.wk.weight": (index_dim, h),
                           p + "self_attn.indexer.k_norm.weight": (index_dim,),
                           p + "self_attn.indexer.k_norm.bias": (index_dim,),
                           p + "self_attn.indexer.weights_proj.weight": (index_heads, h)})
    else:
        hd, kv = cfg["head_dim"], cfg["num_key_value_heads"]
        shapes.update({p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.q_proj.bias": (heads * hd,),
                       p + "self_attn.k_proj.weight": (kv * hd, h), p + "self_attn.k_proj.bias": (kv * hd,),
                       p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.v_proj.bias": (kv * hd,),
                       p + "self_attn.o_proj.weight": (h, heads * hd)})
        if cfg.get("use_qk_norm"):
            shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    if moe:
        inter, shared = cfg["moe_intermediate_size"], cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
        shapes.update({p + "mlp.gate.weight": (cfg["n_routed_experts"], h),
                       p + "mlp.gate.e_score_correction_bias": (cfg["n_routed_experts"],)})
        for e in range(cfg["n_routed_experts"]):
            shapes.update(swiglu(p + f"mlp.experts.{e}", h, inter))
        shapes.update(swiglu(p + "mlp.shared_experts", h, shared))
    else:
        shapes.update(swiglu(p + "mlp", h, cfg["intermediate_size"]))
    return shapes


def longcat_layer_shapes(cfg: dict, p: str) -> dict[str, tuple[int, ...]]:
    """LongCat-Flash's layer: two MLA sublayers (`self_attn.{i}`, their norms `input_layernorm.{i}` ...), two dense
    MLPs (`mlps.{i}`) and experts beside them (a router of the real and the identity experts); its MTP block one MLA
    sublayer and a dense MLP (`transformer_layer.mlp`), as vLLM's longcat_flash_mtp.py maps them."""
    mla = layer_shapes({**cfg, "model_type": "deepseek_v3", "intermediate_size": 1}, "", False)
    h, mla = cfg["hidden_size"], {k: v for k, v in mla.items() if k.startswith("self_attn.")}
    if not p.startswith("model.layers."):
        return {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                **{p + k: v for k, v in mla.items()}, **swiglu(p + "transformer_layer.mlp", h, cfg["ffn_hidden_size"])}
    shapes = {p + "mlp.router.classifier.weight": (cfg["n_routed_experts"] + cfg["zero_expert_num"], h),
              p + "mlp.router.e_score_correction_bias": (cfg["n_routed_experts"] + cfg["zero_expert_num"],)}
    for i in range(2):
        shapes.update({p + f"input_layernorm.{i}.weight": (h,), p + f"post_attention_layernorm.{i}.weight": (h,),
                       **{p + k.replace("self_attn.", f"self_attn.{i}.", 1): v for k, v in mla.items()},
                       **swiglu(p + f"mlps.{i}", h, cfg["ffn_hidden_size"])})
    for e in range(cfg["n_routed_experts"]):
        shapes.update(swiglu(p + f"mlp.experts.{e}", h, cfg["expert_ffn_hidden_size"]))
    return shapes


def bailing_layer_shapes(cfg: dict, p: str) -> dict[str, tuple[int, ...]]:
    """Ling's layer as inclusionAI publishes it: mlx-lm's layer (at its index: gated linear or delta attention, or
    MLA; dense or experts), each expert on its own, the MLA's key and value projection whole (`kv_b_proj`), the
    delta attention's convolutions (C, 1, K); Ling 2.5's router weight as `gate.weight`."""
    from mlx.utils import tree_flatten

    from mlx_spec.seams.layout import model_module

    module = importlib.import_module(f"mlx_lm.models.{model_module(cfg)}")
    args, index = module.ModelArgs.from_dict(cfg), int(p.rsplit(".", 2)[-2])
    layer = (getattr(module, "DecoderLayer", None) or module.BailingDecoderLayer)(args, index)
    shapes = {}
    for name, value in tree_flatten(layer.parameters()):
        if ".switch_mlp." in name:
            for e in range(value.shape[0]):
                shapes[p + name.replace(".switch_mlp.", f".experts.{e}.")] = value.shape[1:]
        elif name.endswith("unembed_out.weight"):
            continue
        elif name.endswith("embed_q.weight"):
            shapes[p + "attention.kv_b_proj.weight"] = kv_b_proj(cfg)
        elif name.endswith("conv1d.weight"):
            shapes[p + name] = (value.shape[0], 1, value.shape[1])
        else:
            shapes[p + name.replace("gate.gate_proj.", "gate.")] = value.shape
    return shapes


def kimi_layer_shapes(cfg: dict, p: str) -> dict[str, tuple[int, ...]]:
    """Kimi K3's layer as Moonshot publishes it: mlx-lm's layer at its index (delta attention or MLA; dense or
    latent experts; the MTP block past the last without attention residuals), each expert on its own as w1 / w2 /
    w3 under `block_sparse_moe`, the delta attention's q, k, v and their convolutions (C, 1, K) apart, its decay
    (1, 1, H, 1), the MLA's key and value projection whole, the residuals' projections and norms as two tensors."""
    from dataclasses import replace

    from mlx.utils import tree_flatten
    from mlx_lm.models import kimi_k3

    text, index = text_config(cfg), int(p.rsplit(".", 2)[-2])
    args = kimi_k3.TextArgs.from_dict(text)
    layer = kimi_k3.KimiK3DecoderLayer(args if index < depth(cfg) else replace(args, attn_res_block_size=None), index)
    shapes = {}
    for name, value in tree_flatten(layer.parameters()):
        moe = name.startswith("mlp.") and isinstance(layer.mlp, kimi_k3.KimiK3SparseMoE)
        stored = p + ("block_sparse_moe." + name[len("mlp."):] if moe else name)
        if ".switch_mlp." in name:
            w = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}[name.split(".")[2]]
            for e in range(value.shape[0]):
                shapes[f"{p}block_sparse_moe.experts.{e}.{w}.weight"] = value.shape[1:]
        elif name == "mlp.e_score_correction_bias":
            shapes[p + "block_sparse_moe.gate.e_score_correction_bias"] = value.shape
        elif name.endswith("unembed_out.weight"):
            continue
        elif name.endswith("embed_q.weight"):
            shapes[p + "self_attn.kv_b_proj.weight"] = kv_b_proj(text)
        elif name.endswith("qkv_proj.weight"):
            shapes.update({f"{p}self_attn.{x}_proj.weight": (value.shape[0] // 3, value.shape[1]) for x in "qkv"})
        elif name.endswith("qkv_conv.conv.weight"):
            shapes.update({f"{p}self_attn.{x}_conv1d.weight": (value.shape[0] // 3, 1, value.shape[1]) for x in "qkv"})
        elif name.endswith("A_log"):
            shapes[stored] = (1, 1, value.shape[0], 1)
        elif name.endswith(("_res_proj.weight", "_res_norm.weight")):
            res, part = name.rsplit("_", 1)
            shapes[f"{p}{res}.{part.split('.')[0]}_weight"] = value.shape
        else:
            shapes[stored] = value.shape
    return shapes


def exaone_layer_shapes(cfg: dict, p: str, moe: bool) -> dict[str, tuple[int, ...]]:
    """K-EXAONE's layer: no attention biases, q / k norms, the router's correction bias beside its gate."""
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
              p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
              p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
              p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    if not moe:
        return {**shapes, **swiglu(p + "mlp", h, cfg["intermediate_size"])}
    inter, experts, shared = cfg["moe_intermediate_size"], cfg["num_experts"], cfg["moe_intermediate_size"]
    shapes.update({p + "mlp.gate.weight": (experts, h), p + "mlp.e_score_correction_bias": (experts,),
                   **swiglu(p + "mlp.shared_experts", h, shared)})
    for e in range(experts):
        shapes.update(swiglu(p + f"mlp.experts.{e}", h, inter))
    return shapes


def ernie_layer_shapes(cfg: dict, p: str, moe: bool) -> dict[str, tuple[int, ...]]:
    """ERNIE 4.5's layer: no biases, a softmax router with its correction bias under `moe_statics` (which mlx-lm
    drops), the shared experts one wide expert."""
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // heads
    shapes = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
              p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
              p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd)}
    if not moe:
        return {**shapes, **swiglu(p + "mlp", h, cfg["intermediate_size"])}
    inter, experts = cfg["moe_intermediate_size"], cfg["moe_num_experts"]
    shared = inter * cfg["moe_num_shared_experts"]
    shapes.update({p + "mlp.gate.weight": (experts, h), p + "mlp.moe_statics.e_score_correction_bias": (1, experts),
                   **swiglu(p + "mlp.shared_experts", h, shared)})
    for e in range(experts):
        shapes.update(swiglu(p + f"mlp.experts.{e}", h, inter))
    return shapes


def mimo_v2_layer_shapes(cfg: dict, p: str, moe: bool) -> dict[str, tuple[int, ...]]:
    """MiMo-V2-Flash's layer: no biases; a sliding-window layer (the MTP block's kind) has its own head counts and
    dimensions and an attention sink per head; the MTP block names its second norm `pre_mlp_layernorm`; routed
    experts only."""
    h, i = cfg["hidden_size"], int(p.rsplit(".", 2)[-2]) if p.startswith("model.layers.") else None
    sliding = i is None or cfg["hybrid_layer_pattern"][i] == 1
    heads, kv, hd, vd = (cfg[f"{'swa_' if sliding else ''}{key}"]
                         for key in ("num_attention_heads", "num_key_value_heads", "head_dim", "v_head_dim"))
    second = "pre_mlp_layernorm" if i is None else "post_attention_layernorm"
    shapes = {p + "input_layernorm.weight": (h,), p + f"{second}.weight": (h,),
              p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
              p + "self_attn.v_proj.weight": (kv * vd, h), p + "self_attn.o_proj.weight": (h, heads * vd)}
    if sliding:
        shapes[p + "self_attn.attention_sink_bias"] = (heads,)
    if not moe:
        return {**shapes, **swiglu(p + "mlp", h, cfg["intermediate_size"])}
    inter, experts = cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    shapes.update({p + "mlp.gate.weight": (experts, h), p + "mlp.gate.e_score_correction_bias": (experts,)})
    for e in range(experts):
        shapes.update(swiglu(p + f"mlp.experts.{e}", h, inter))
    return shapes


def step3p5_layer_shapes(cfg: dict, p: str, moe: bool) -> dict[str, tuple[int, ...]]:
    """Step 3.5's layer: q / k norms and a gate per head; a sliding-window layer has its own head counts; its
    experts stored stacked, beside a shared expert."""
    h, hd, kv = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_groups"]
    sliding = cfg["layer_types"][int(p.rsplit(".", 2)[-2])] == "sliding_attention"
    heads = cfg["attention_other_setting" if sliding else "num_attention_heads"]
    heads = heads["num_attention_heads"] if sliding else heads
    shapes = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
              p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
              p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
              p + "self_attn.g_proj.weight": (heads, h), p + "self_attn.q_norm.weight": (hd,),
              p + "self_attn.k_norm.weight": (hd,)}
    if not moe:
        return {**shapes, **swiglu(p + "mlp", h, cfg["intermediate_size"])}
    experts, inter, shared = cfg["moe_num_experts"], cfg["moe_intermediate_size"], cfg["share_expert_dim"]
    return {**shapes, p + "moe.gate.weight": (experts, h), p + "moe.router_bias": (experts,),
            p + "moe.gate_proj.weight": (experts, inter, h), p + "moe.up_proj.weight": (experts, inter, h),
            p + "moe.down_proj.weight": (experts, h, inter), **swiglu(p + "share_expert", h, shared)}


def target_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """The target's own tensors."""
    if cfg["model_type"] == "nemotron_h":
        return nemotron_h_shapes(cfg)
    h, v = text_config(cfg)["hidden_size"], text_config(cfg)["vocab_size"]
    model = "language_model.model." if cfg["model_type"] == "kimi_k3" else "model."
    shapes = {EMBEDDING.get(family_of(cfg), "model.embed_tokens.weight"): (v, h), f"{model}norm.weight": (h,),
              HEAD.get(family_of(cfg), "lm_head.weight"): (v, h)}
    if cfg["model_type"] == "kimi_k3":  # the output's attention residual
        shapes.update({f"{model}output_attn_res.proj_weight": (1, h), f"{model}output_attn_res.norm_weight": (h,)})
    for i in range(depth(cfg)):
        shapes.update(layer_shapes(cfg, f"{model}layers.{i}.", moe=is_moe(cfg, i)))
    return shapes


def random_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """Norms near 1 (near 0 where stored zero-centred), biases and the router's correction bias small, matrices
    scaled by their fan-in, the output heads and embedding by 0.5; Mamba 2's decay rates spread, as it starts."""
    rng = np.random.default_rng(seed)
    h, v, n = text_config(cfg)["hidden_size"], text_config(cfg)["vocab_size"], depth(cfg)
    embed = EMBEDDING.get(family_of(cfg), "model.embed_tokens.weight")
    lm_head = HEAD.get(family_of(cfg), "lm_head.weight")
    family, p = FAMILIES[family_of(cfg)], prefix(cfg)
    shapes = target_shapes(cfg)
    shapes.update(layer_shapes(cfg, p + family.block_prefix, moe=is_moe(cfg, n)))
    embedding, hidden, proj, out = own_names(cfg)
    shapes.update({f"{p}{embedding}.weight": (h,), f"{p}{hidden}.weight": (h,), f"{p}{proj}.weight": (h, 2 * h),
                   f"{p}{out}.weight": (h,), **({f"{p}{family.head}.weight": (v, h)} if family.head else {}),
                   **({f"{p}{family.embedding}.weight": (v, h)} if family.embedding else {})})
    weights, mamba = {}, cfg["model_type"] == "nemotron_h"
    for name, shape in shapes.items():
        if mamba and name.endswith("A_log"):  # decay rates A = -exp(A_log) spread over 1..heads, as Mamba 2 starts
            weights[name] = (np.log(np.arange(1, shape[0] + 1)) + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif cfg["model_type"] == "kimi_k3" and name.endswith("A_log"):  # its decay drawn in [1, 16], as it starts
            weights[name] = np.log(rng.uniform(1, 16, shape)).astype(np.float32)
        elif mamba and name.endswith((".D", "dt_bias")):  # its skip and step bias near 1
            weights[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith(("norm.weight", "norm_weight")):
            weights[name] = (float(not family.zero_centred) + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif len(shape) == 1:
            weights[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name in (embed, lm_head, f"{p}{family.head}.weight",
                      f"{p}{family.embedding}.weight"):
            weights[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        else:
            weights[name] = (2.0 * rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    if family.copies:  # DeepSeek and GLM store copies of the embedding and head
        weights[p + "embed_tokens.weight"] = weights[embed]
        weights[p + "shared_head.head.weight"] = weights[lm_head]
    return weights


# Nemotron-H drawn from seed 0 ends its greedy answer to tiny.PROMPT within the tests' 160 tokens, from seed 1 it
# never writes again what it wrote (n-gram drafts of its own text all fail)
SEEDS = {"nemotron_h": 2}


def build_nextn_checkpoint(out_dir: str | Path, family: str, tokenizer_dir: str | Path) -> Path:
    tokenizer_dir = Path(tokenizer_dir)
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]
    cfg = config(family, len(vocab))
    return write_checkpoint(Path(out_dir), cfg, random_weights(cfg, SEEDS.get(family, 0)), tokenizer_dir)


TRAINED = "nextn.safetensors"  # the trained tensors alone, which `with_trained_nextn` writes into a checkpoint


def train_nextn(out_dir: str | Path, checkpoint: Path, texts: list[str], steps: int = 150, seed: int = 0) -> Path:
    """Train the nextn layer's own tensors (its norms, eh_proj and any head of its own; the decoder block stays as
    drawn, and so does the target's final norm where the layer scores through it) on the target's greedy
    continuations of `texts`, and write them (HF names) to `out_dir`/TRAINED: row p pairs embed(t_{p+1}) with the
    target's state at p (post-norm, or pre-norm where the family reads that) and learns the target's choice after
    p + 1, so that drafting those texts gets drafts accepted."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.utils import load_model, load_tokenizer
    from safetensors.numpy import save_file
    from tiny_heads import fit, greedy_continuations

    from mlx_spec.models.nextn import load_nextn, ours
    from mlx_spec.seams import layout

    mx.random.seed(seed)
    target, cfg = load_model(checkpoint)
    nextn = load_nextn(checkpoint, cfg, [checkpoint / "model.safetensors"])
    nextn.layers[0].freeze()
    family, p = FAMILIES[family_of(cfg)], prefix(cfg)
    embed = nextn.embed if family.embedding else layout.input_embedding(target)
    if family.embedding:  # its own embedding stays as drawn
        nextn.embed.freeze()
    own = {theirs: mine for theirs, mine in ours(cfg).items()
           if p + theirs != "model.norm.weight" and mine != "embed.weight"}
    if "shared_norm.weight" not in own.values():  # ERNIE's output norm is the target's final norm: left as it is
        nextn.shared_norm.freeze()
    rows = []
    for sequence in greedy_continuations(target, load_tokenizer(checkpoint), texts, tokens=120):
        hidden = language(target)(mx.array(sequence)[None])[0]
        labels = mx.argmax(layout.output_head(target)(hidden), -1)
        read = target_states(target, sequence) if family.reads == "pre" else hidden
        rows.append((embed(mx.array(sequence[1:])), read[:-1], labels[1:]))
    mx.eval(rows)

    def loss(nextn):
        total, head = 0.0, nextn.head if family.head else layout.output_head(target)
        for embeddings, hidden, labels in rows:
            out = nextn(embeddings[None], hidden[None], nextn.make_cache())[0]
            total = total + nn.losses.cross_entropy(head(nextn.head_input(out)), labels).mean()
        return total / len(rows)

    def published(name: str, value) -> np.ndarray:  # a zero-centred family stores its norms less their 1
        return np.array(value - 1 if family.zero_centred and name.endswith("norm.weight") else value)

    fit(nextn, loss, steps, 1e-2)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({p + theirs: published(theirs, getattr(nextn, mine.removesuffix(".weight")).weight)
               for theirs, mine in own.items()},
              str(out_dir / TRAINED), metadata={"format": "pt"})
    return out_dir


def language(target):
    """The target's model without its head (Nemotron-H's `backbone`): post-norm states."""
    return getattr(target, "model", None) or target.backbone


def target_states(target, sequence: list[int]):
    """The target's states over `sequence` before its final norm: its own forward (sliding windows included) with
    the norm left out."""
    import mlx.core as mx
    import mlx.nn as nn

    language, norm = target.model, target.model.norm
    language.norm = nn.Identity()
    try:
        return language(mx.array(sequence)[None])[0]
    finally:
        language.norm = norm


def with_trained_nextn(checkpoint: Path, trained_dir: Path) -> Path:
    """`checkpoint` with the nextn tensors `train_nextn` wrote to `trained_dir` in place of its drawn ones."""
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(checkpoint / "model.safetensors"))
    weights.update(load_file(str(trained_dir / TRAINED)))
    save_file(weights, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    return checkpoint
