"""DeepSeek-V3 and GLM-4.5+ next-token ("nextn") MTP layers, which mlx-lm drops on load and convert.

A checkpoint that declares `num_nextn_predict_layers` stores the layer as `model.layers.{num_hidden_layers}.*`:
`enorm`, `hnorm`, `eh_proj`, one decoder block of the model's own kind (MLA + MoE for DeepSeek, GQA + MoE for
GLM), `shared_head.norm`, and copies of the embedding and output head that, as in vLLM and SGLang, the target's
own stand in for. The equations (vLLM deepseek_mtp.py / glm4_moe_mtp.py, SGLang deepseek_nextn.py):

    x = eh_proj(concat[enorm(embed(next_token)), hnorm(hidden)])   hidden: the target's post-norm state
    x = block(x)                     with its own KV cache; fed back as the next `hidden`
    logits = lm_head(shared_head.norm(x))

Only the first nextn layer drafts (every published checkpoint has one).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import deepseek_v3, glm4_moe
from mlx_lm.models.base import create_attention_mask

from ..seams import compat
from ..seams.errors import SpecError
from .common import load_exactly, load_weights

LAYERS = {"deepseek_v3": (deepseek_v3, deepseek_v3.DeepseekV3DecoderLayer),
          "glm4_moe": (glm4_moe, glm4_moe.DecoderLayer)}  # model_type -> (mlx-lm module, its decoder layer)
OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")  # the layer's tensors besides its block
STORED = "nextn."  # the prefix of the layer's tensors in `mlx-spec convert` output (mtp.safetensors)

compat.drop_nextn_layers()  # before any DeepSeek-V3 checkpoint is loaded: mlx-lm drops depth 61 only


def declared_nextn_layers(config: dict) -> int:
    return config.get("num_nextn_predict_layers", 0) or 0


def is_nextn(config: dict) -> bool:
    return declared_nextn_layers(config) > 0


def check_supported(config: dict, path) -> None:
    if config.get("model_type") not in LAYERS:
        raise SpecError(f"{path} declares {declared_nextn_layers(config)} nextn MTP layer(s), but MTP drafting "
                        f"supports the nextn layers of {', '.join(LAYERS)} only, not {config.get('model_type')!r}: "
                        "use --drafter ngram or --draft-model")


class NextN(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        module, layer = LAYERS[config["model_type"]]
        self.args = module.ModelArgs.from_dict(config)
        h, eps = self.args.hidden_size, self.args.rms_norm_eps
        self.enorm, self.hnorm = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layers = [layer(self.args, layer_idx=self.args.num_hidden_layers)]  # an MoE layer, as stored
        self.shared_norm = nn.RMSNorm(h, eps=eps)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        x = self.eh_proj(mx.concatenate([self.enorm(embeddings), self.hnorm(hidden)], -1))
        return self.layers[0](x, mask=create_attention_mask(x, cache[0], return_array=True), cache=cache[0])


def prefix(config: dict) -> str:
    return f"model.layers.{config['num_hidden_layers']}."


def read_nextn_tensors(files, config: dict) -> tuple[dict, bool]:
    """The first nextn layer's tensors in some safetensors files (lazily), named as NextN's parameters, and
    whether they are Hugging Face originals whose block still needs mlx-lm's conversion (`compat`)."""
    tensors, original = {}, False
    for file in files:
        weights = load_weights(file)
        for key, value in weights.items():
            if key.startswith(STORED):
                tensors[key[len(STORED):]] = value
            elif key.startswith(prefix(config)):
                tensors[key[len(prefix(config)):]] = value
                original = True
    return tensors, original


def build_nextn(config: dict, tensors: dict, original: bool, quantization: dict | None = None) -> NextN:
    """A NextN layer holding `tensors`; an original block goes through mlx-lm's own weight conversion (expert
    stacking, DeepSeek's kv_b_proj split) first."""
    nextn = NextN(config)
    weights = dict(tensors)
    if original:
        block = {k: weights.pop(k) for k in list(weights) if not k.startswith(OWN)}
        weights = {"enorm.weight": weights["enorm.weight"], "hnorm.weight": weights["hnorm.weight"],
                   "eh_proj.weight": weights["eh_proj.weight"],
                   "shared_norm.weight": weights["shared_head.norm.weight"],
                   **{f"layers.0.{k}": v for k, v in compat.convert_layer(LAYERS[config["model_type"]][0],
                                                                            nextn.args, block).items()}}
    if quantization:
        nn.quantize(nextn, group_size=quantization["group_size"], bits=quantization["bits"])
    load_exactly(nextn, weights, "the nextn layer's tensors do not fit this model ({})")
    return nextn


def load_nextn(path: Path, config: dict, files) -> NextN:
    tensors, original = read_nextn_tensors(files, config)
    if not tensors:
        raise SpecError(f"{path} holds no nextn MTP layer ({prefix(config)}*) although its config declares one: "
                        "it was stripped (mlx_lm.convert drops it); add it back with `mlx-spec convert --add-mtp "
                        f"--hf-path ORIGINAL_HF_REPO --mlx-path {path}`")
    return build_nextn(config, tensors, original, config.get("mtp_quantization"))
