"""The next-token ("nextn") MTP layers that checkpoints declaring `num_nextn_predict_layers` carry and mlx-lm drops
on load and convert, one layer for every family, the differences as data (`FAMILIES`).

Every family's layer (vLLM's `*_mtp.py`, SGLang's `*_nextn.py`) is, with `hidden` the target's post-norm state at
position p and `token` the one at p + 1:

    x = proj(concat[embed_norm(embed(token)), hidden_norm(hidden)])     (MiMo: [hidden_norm(hidden), embed_norm(..)])
    y = block(x)                     one decoder layer of the family's own kind, with its own KV cache
    logits = lm_head(out_norm(y))    the target's head (copies some checkpoints store are the same; Step 3.5: its own)

and the state fed back for the next draft is y (DeepSeek-V3 / GLM: `feeds_normed` False) or out_norm(y) (the
families whose equations are Qwen3.5's). `hidden` is the target's state after its final norm, but for MiMo, whose
layer Xiaomi's own vLLM code feeds the state before it (`reads`). Only the first layer drafts where a checkpoint
has several. K-EXAONE stores its layer as Qwen3.5 does (`mtp.*`, the block under `mtp.layers.0.`) but declares it
as `num_nextn_predict_layers`, with plain norms: it is read here. ERNIE 4.5 stores its layer beside the target's
tensors (`model.mtp_*.0`) with no output norm of its own: its drafts are scored through the target's final norm, as
Baidu's training code and transformers do (vLLM and SGLang score the block's output unnormed). MiMo-V2-Flash's
block attends within a sliding window, with its own cache of that window; its layer reads the target's state
before the final norm, as Xiaomi's SGLang code hands it (vLLM hands it the state after). Step 3.5 Flash's layers
(three; the first drafts every depth, as vLLM's recipe runs it) score with their own head, through zero-centred
norms, over the target's pre-norm state, their block a sliding-window one. LongCat-Flash's layer (`model.mtp.*`)
embeds the drafted token with its own embedding, its block one MLA sublayer of LongCat's kind and a dense MLP. Ling
2.5 and 3.0 (both declared `bailing_hybrid`; mlx-lm runs 3.0 as `bailing_moe_v3`, the key here) store Qwen3.5's
equations under DeepSeek's names, an MLA + MoE block over targets whose linear attention layers replay to roll back.
Nemotron-H's layer (Nemotron 3 Super, Ultra) is a chain of sublayers of the target's own kinds, attention then
experts as `mtp_hybrid_override_pattern` says, its output norm on the last (`layers.{last}.final_layernorm`). Kimi
K3 declares its layer in its `text_config` and stores it under `language_model.`: DeepSeek's equations over the
target's state before its final norm (after the output's attention-residual mix), its block Kimi's MLA + MoE layer
with the attention residuals off.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import (
    bailing_hybrid,
    bailing_moe_v3,
    deepseek_v3,
    deepseek_v32,
    ernie4_5_moe,
    exaone_moe,
    glm4_moe,
    glm4_moe_lite,
    glm_moe_dsa,
    kimi_k3,
    longcat_flash,
    mimo,
    mimo_v2_flash,
    nemotron_h,
    step3p5,
)
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import CacheList, KVCache, RotatingKVCache

from ..seams import compat, layout
from ..seams.errors import SpecError
from .common import load_exactly, load_weights


@dataclass(frozen=True)
class Family:
    """How one family stores and computes its layer: mlx-lm's module for it (whose decoder layer is the block and
    whose `Model.sanitize` converts the block's tensors), the block (`block(args)`), the names of the embedding
    norm, hidden norm, projection and output norm under `prefix` ({n}: the target's num_hidden_layers), where the
    block's own tensors are under it, the copies of the target's tensors stored there (ignored), the projection's
    input order, the state fed back, the target's state read, the block's tensors whose published names differ from
    mlx-lm's (`renames`), the name of the norms' epsilon in mlx-lm's ModelArgs, the block's attention window
    (`window(args)`; None: full attention), the name of the layer's own output head (None: the target's), whether
    its norms are stored zero-centred (x * (1 + w)), whether its attention is DeepSeek's sparse one, whose cache
    holds the indexer's keys beside its own (`indexed`), its own embedding, the config its block is built from
    (`block_config`: the target's, or changed where the block is not of its kind) and where its tensors go through
    `Model.sanitize` (`sanitized_as`), and the module's classes that read the block's arguments (`arguments`) and
    convert its tensors (`sanitizer`; Kimi K3: its text model's). A name's `{last}` is the index of the layer's last
    sublayer (Nemotron-H: one sublayer per letter of `mtp_hybrid_override_pattern`). A config nested under
    `text_config` is read there."""

    module: object
    block: Callable[[object], nn.Module]
    names: tuple[str, str, str, str] = ("enorm", "hnorm", "eh_proj", "shared_head.norm")
    prefix: str = "model.layers.{n}."
    block_prefix: str = ""  # "": the block's tensors sit beside the layer's own
    copies: tuple[str, ...] = ("shared_head.head.", "embed_tokens.")
    hidden_first: bool = False
    feeds_normed: bool = False
    reads: str = "post"  # the target's state it reads: after its final norm, or before ("pre")
    renames: tuple[tuple[str, str], ...] = ()  # (published, mlx-lm's) prefixes of the block's tensors
    eps: str = "rms_norm_eps"
    window: Callable[[object], int | None] = lambda args: None
    head: str | None = None
    zero_centred: bool = False
    indexed: bool = False
    embedding: str | None = None  # the name of the layer's own token embedding (None: the target's)
    block_config: Callable[[dict], dict] = lambda config: config  # what the block's arguments are read from
    sanitized_as: str = "model.layers.0."  # where the block's tensors go through mlx-lm's Model.sanitize
    arguments: str = "ModelArgs"
    sanitizer: str = "Model"


class LongcatBlock(nn.Module):
    """LongCat-Flash's MTP block: one MLA attention sublayer of its kind (mlx-lm's, the q and kv latents scaled as
    configured), then a dense MLP, each pre-normed with a residual (vLLM's DeepseekV2DecoderLayer without experts)."""

    def __init__(self, args):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.self_attn = [longcat_flash.LongcatFlashMLA(args)]  # as a target layer's first sublayer is held
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.mlp = longcat_flash.LongcatFlashMLP(args)

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        h = x + self.self_attn[0](self.input_layernorm(x), mask=mask, cache=cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class NemotronBlock(nn.Module):
    """Nemotron-H's MTP block: a sublayer of the target's kind for each letter of its pattern (attention "*",
    experts "E", MLP "-"), each adding its mixer's output over its own norm, as vLLM's sublayers add up their
    residuals; the attention sublayer keeps the cache."""

    def __init__(self, args):
        super().__init__()
        pattern = "".join(args.hybrid_override_pattern or "")
        if set(pattern) - {"*", "E", "-"} or pattern.count("*") != 1:
            raise SpecError(f"a Nemotron-H MTP layer of the pattern {pattern!r} (mtp_hybrid_override_pattern): MTP "
                            "drafting supports one attention sublayer beside MLP and expert ones: use --drafter ngram")
        self.layers = [nemotron_h.NemotronHBlock(args, kind) for kind in pattern]

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        for layer in self.layers:
            x = layer(x, mask=mask, cache=cache if layer.block_type == "*" else None)
        return x


class KimiBlock(kimi_k3.KimiK3DecoderLayer):
    """Kimi K3's MTP block: its decoder layer at the layer's index (MLA + MoE) built without attention residuals,
    as vLLM builds it, returning its output alone."""

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        return super().__call__(x, mask=mask, cache=cache)[0]


FAMILIES = {
    "deepseek_v3": Family(deepseek_v3, lambda args: deepseek_v3.DeepseekV3DecoderLayer(
        args, layer_idx=args.num_hidden_layers)),  # an MoE layer, as stored
    "deepseek_v32": Family(deepseek_v32, lambda args: deepseek_v32.DeepseekV32DecoderLayer(  # DeepSeek's sparse
        args, layer_idx=args.num_hidden_layers), indexed=True),  # attention (DSA): an indexer picks the keys
    "glm_moe_dsa": Family(glm_moe_dsa, lambda args: deepseek_v32.DeepseekV32DecoderLayer(  # GLM-5: DeepSeek-V3.2's
        args, layer_idx=args.num_hidden_layers), indexed=True),  # layers
    "glm4_moe": Family(glm4_moe, lambda args: glm4_moe.DecoderLayer(args, layer_idx=args.num_hidden_layers)),
    "glm4_moe_lite": Family(glm4_moe_lite, lambda args: glm4_moe_lite.Glm4MoeLiteDecoderLayer(
        args, layer_idx=args.num_hidden_layers)),  # GLM-4.7-Flash: DeepSeek's MLA with GLM's MoE
    "mimo": Family(mimo, mimo.TransformerBlock,  # MiMo-7B: Qwen2's block, Qwen3.5's equations
                   ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm"), "model.mtp_layers.0.",
                   copies=(), hidden_first=True, feeds_normed=True, reads="pre"),
    "exaone_moe": Family(exaone_moe, lambda args: exaone_moe.DecoderLayer(replace(  # K-EXAONE: a dense block with
        args, layer_types=[*args.layer_types, "full_attention"], is_moe_layer=[*args.is_moe_layer, False]),  # global
        layer_idx=args.num_hidden_layers), ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc", "norm"), "mtp.",
        block_prefix="layers.0.", copies=(), feeds_normed=True),  # attention, Qwen3.5's names and equations
    "ernie4_5_moe": Family(ernie4_5_moe, lambda args: ernie4_5_moe.Ernie4_5_DecoderLayer(args, layer_idx=0),  # dense
        ("mtp_emb_norm.0", "mtp_hidden_norm.0", "mtp_linear_proj.0", "norm"), "model.", block_prefix="mtp_block.0.",
        copies=()),  # ERNIE 4.5 MoE: the layer's tensors beside the target's, its output norm the target's own
    "mimo_v2_flash": Family(mimo_v2_flash, lambda args: mimo_v2_flash.DecoderLayer(  # MiMo-V2-Flash: a dense
        args, is_moe=False, is_sliding_window=True), ("enorm", "hnorm", "eh_proj", "final_layernorm"),  # block
        "model.mtp.layers.0.", copies=(), feeds_normed=True, reads="pre",  # with sliding-window attention and
        renames=(("pre_mlp_layernorm.", "post_attention_layernorm."),), eps="layernorm_epsilon",  # sinks
        window=lambda args: args.sliding_window_size),
    "step3p5": Family(step3p5, lambda args: step3p5.Step3p5DecoderLayer(args, layer_idx=args.num_hidden_layers),
        ("enorm", "hnorm", "eh_proj", "transformer.shared_head.norm"), copies=(), reads="pre",  # Step 3.5 Flash:
        window=lambda args: args.sliding_window if args.layer_types[args.num_hidden_layers] == "sliding_attention"
        else None, head="transformer.shared_head.output", zero_centred=True),  # the first of its three layers
    "longcat_flash": Family(longcat_flash, LongcatBlock, ("layers.0.enorm.m", "layers.0.hnorm.m", "layers.0.eh_proj",
        "norm"), "model.mtp.", block_prefix="layers.0.", copies=(), feeds_normed=True, embedding="embed_tokens",
        renames=(("transformer_layer.mlp.", "mlp."), ("self_attn.", "self_attn.0."))),  # LongCat-Flash: Qwen3.5's
        # equations, its own embedding, an MLA + dense block
    "bailing_hybrid": Family(bailing_hybrid, lambda args: bailing_hybrid.DecoderLayer(  # Ling / Ring 2.5: an MLA
        args, layer_idx=args.num_hidden_layers), ("enorm", "hnorm", "eh_proj", "final_layernorm"),  # + MoE block,
        feeds_normed=True, renames=(("mlp.gate.e_score_correction_bias", "mlp.gate.expert_bias"),)),  # Qwen3.5's
    "bailing_moe_v3": Family(bailing_moe_v3, lambda args: bailing_moe_v3.BailingDecoderLayer(  # equations; Ling 3.0
        args, args.num_hidden_layers), ("enorm", "hnorm", "eh_proj", "final_layernorm"), feeds_normed=True,  # the
        renames=(("mlp.gate.e_score_correction_bias", "mlp.gate.expert_bias"),),  # same, its own MLA and MoE
        block_config=lambda config: {**config, "first_k_dense_replace": 0}),  # (mlx-lm's layer 0 has no experts)
    "nemotron_h": Family(nemotron_h, lambda args: NemotronBlock(args), ("layers.0.enorm", "layers.0.hnorm",  # Super,
        "layers.0.eh_proj", "layers.{last}.final_layernorm"), "mtp.", copies=(), feeds_normed=True,  # Ultra:
        eps="layer_norm_epsilon", sanitized_as="backbone.",  # sublayers in a pattern, each one of the target's
        block_config=lambda config: {**config, "hybrid_override_pattern": config.get("mtp_hybrid_override_pattern")}),
    "kimi_k3": Family(kimi_k3, lambda args: KimiBlock(args, args.num_hidden_layers),  # Kimi K3: DeepSeek's
        prefix="language_model.model.layers.{n}.", reads="pre", arguments="TextArgs",  # equations in its text model
        sanitizer="LanguageModel", block_config=lambda config: {**config, "attn_res_block_size": None}),
}
STORED = "nextn."  # the prefix of the layer's tensors in `mlx-spec convert` output (mtp.safetensors)

compat.drop_nextn_layers()  # before any DeepSeek-V3 checkpoint is loaded: mlx-lm drops depth 61 only


def text_config(config: dict) -> dict:
    """The language model's part of a checkpoint's config (Kimi K3 nests it under `text_config`)."""
    return config.get("text_config", config)


def declared_nextn_layers(config: dict) -> int:
    return text_config(config).get("num_nextn_predict_layers", 0) or 0


def is_nextn(config: dict) -> bool:
    return declared_nextn_layers(config) > 0


def family_of(config: dict) -> str:
    """The FAMILIES key of a checkpoint: the mlx-lm module that runs it (a `model_type`, or one mlx-lm maps it to)."""
    return layout.model_module(config)


def check_supported(config: dict, path) -> None:
    if family_of(config) not in FAMILIES:
        raise SpecError(f"{path} declares {declared_nextn_layers(config)} nextn MTP layer(s), but MTP drafting "
                        f"supports the nextn layers of {', '.join(FAMILIES)} only, not {family_of(config)!r}: "
                        "use --drafter ngram or --draft-model")


class NextN(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.family = FAMILIES[family_of(config)]
        arguments = getattr(self.family.module, self.family.arguments)
        self.args = arguments.from_dict(self.family.block_config(text_config(config)))
        h, eps = self.args.hidden_size, getattr(self.args, self.family.eps)
        self.window = self.family.window(self.args)
        self.enorm, self.hnorm = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layers = [self.family.block(self.args)]
        self.shared_norm = nn.RMSNorm(h, eps=eps)
        if self.family.head:
            self.head = nn.Linear(h, self.args.vocab_size, bias=False)
        if self.family.embedding:
            self.embed = nn.Embedding(self.args.vocab_size, h)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        """The state fed back for the next draft."""
        parts = [self.enorm(embeddings), self.hnorm(hidden)]
        x = self.eh_proj(mx.concatenate(parts[::-1] if self.family.hidden_first else parts, -1))
        attention = cache[0][0] if self.family.indexed else cache[0]
        mask = create_attention_mask(x, attention, window_size=self.window, return_array=True)
        y = self.layers[0](x, mask=mask, cache=cache[0])
        return self.shared_norm(y) if self.family.feeds_normed else y

    def make_cache(self) -> list:
        if self.family.indexed:
            return [CacheList(KVCache(), KVCache())]
        return [RotatingKVCache(max_size=self.window) if self.window else KVCache()]

    def head_input(self, state: mx.array) -> mx.array:
        """What the target's head scores for a state `__call__` gave: its output norm."""
        return state if self.family.feeds_normed else self.shared_norm(state)


def target_state(config: dict) -> str:
    """The target's state the layer of `config`'s family reads ("post" for a family not in the table)."""
    return FAMILIES[family_of(config)].reads if family_of(config) in FAMILIES else "post"


def prefix(config: dict) -> str:
    return FAMILIES[family_of(config)].prefix.format(n=text_config(config).get("num_hidden_layers"))


def own_names(config: dict) -> tuple[str, ...]:
    """The names of the layer's embedding norm, hidden norm, projection and output norm under its prefix."""
    last = len(config.get("mtp_hybrid_override_pattern") or "x") - 1
    return tuple(name.format(last=last) for name in FAMILIES[family_of(config)].names)


def layer_name(config: dict, key: str) -> str | None:
    """A published tensor's name under the layer's prefix, or None when it is not one of the layer's."""
    family, where = FAMILIES[family_of(config)], prefix(config)
    if not key.startswith(where):
        return None
    name = key[len(where):]
    own = (*own_names(config), *([family.embedding] if family.embedding else []))
    return name if name.startswith((family.block_prefix, *(f"{theirs}." for theirs in own))) else None


def ours(config: dict) -> dict[str, str]:
    """The layer's own tensors' names as published -> as NextN's parameters."""
    family = FAMILIES[family_of(config)]
    names = {**dict(zip(own_names(config), ("enorm", "hnorm", "eh_proj", "shared_norm"))),
             **({family.head: "head"} if family.head else {}), **({family.embedding: "embed"} if family.embedding
                                                                   else {})}
    return {f"{theirs}.weight": f"{mine}.weight" for theirs, mine in names.items()}


def read_nextn_tensors(files, config: dict) -> tuple[dict, bool]:
    """The first nextn layer's tensors in some safetensors files (lazily): as `mlx-spec convert` stored them (as
    NextN's parameters) where it did, else as published under the layer's prefix; and whether they are Hugging Face
    originals, whose block still needs mlx-lm's conversion (`compat`)."""
    stored, published = {}, {}
    for file in files:
        for key, value in load_weights(file).items():
            if key.startswith(STORED):
                stored[key[len(STORED):]] = value
            elif (name := layer_name(config, key)) is not None:
                published[name] = value
    if f"{own_names(config)[2]}.weight" not in published:
        published = {}  # without its projection (ERNIE's output norm alone is the target's own)
    return (stored, False) if stored else (published, bool(published))


def build_nextn(config: dict, tensors: dict, original: bool, quantization: dict | None = None) -> NextN:
    """A NextN layer holding `tensors`; an original block goes through mlx-lm's own weight conversion (expert
    stacking, DeepSeek's kv_b_proj split) first."""
    nextn = NextN(config)
    family, weights = nextn.family, dict(tensors)
    if original:
        own, inner = ours(config), family.block_prefix
        block = {renamed(k[len(inner):], family.renames): v for k, v in weights.items()
                 if k not in own and k.startswith(inner) and not k.startswith(family.copies)}
        converted = compat.convert_layer(getattr(family.module, family.sanitizer).sanitize, nextn.args,
                                         nextn.layers[0], block, family.sanitized_as)
        weights = {**{mine: weights[theirs] for theirs, mine in own.items() if theirs in weights},
                   **{f"layers.0.{k}": v for k, v in converted.items()}}
        if family.zero_centred:  # mlx-lm's norms multiply by w: its sanitize adds the 1 to a target's, not here
            weights = {k: v + 1 if k.endswith("norm.weight") else v for k, v in weights.items()}
    if quantization:
        nn.quantize(nextn, group_size=quantization["group_size"], bits=quantization["bits"])
    load_exactly(nextn, weights, "the nextn layer's tensors do not fit this model ({})")
    return nextn


def renamed(name: str, renames: tuple[tuple[str, str], ...]) -> str:
    for published, theirs in renames:
        if name.startswith(published):
            return theirs + name[len(published):]
    return name


def load_nextn(path: Path, config: dict, files) -> NextN:
    tensors, original = read_nextn_tensors(files, config)
    if not tensors:
        raise SpecError(f"{path} holds no nextn MTP layer ({prefix(config)}*) although its config declares one: "
                        "it was stripped (mlx_lm.convert drops it); add it back with `mlx-spec convert --add-mtp "
                        f"--hf-path ORIGINAL_HF_REPO --mlx-path {path}`")
    return build_nextn(config, tensors, original, config.get("mtp_quantization"))
