"""MTP heads that `mlx-spec train-mtp` trains for targets that ship none (Llama, Qwen2 / 2.5, Qwen3, Mistral,
SmolLM...), in the shape of Qwen3.5's and DeepSeek's built-in layers:

    x = eh_proj(concat[enorm(embed(next_token)), hnorm(hidden)])    hidden: the target's post-norm state
    x = layers[0](x)       one decoder layer of the target's own kind (trained from a copy of its last layer),
                           with its own KV cache; fed back as the next `hidden`
    logits = lm_head(norm(x))    over the `vocab_top` tokens the training text used most (`ids`, ascending),
                                 -inf for the rest of the target's vocabulary: never proposed, verification exact

A head lives in a directory: `config.json` (architectures ["MTPHead"], the target's model_type, hidden size,
vocabulary and depth, and how it was trained) and `model.safetensors` (its parameters and `ids`). It drafts with
`--mtp-path DIR` (the mtp drafter); the target's embedding is shared, not stored.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

from ..seams.errors import SpecError
from .common import float_copy, load_exactly, load_weights, to_target_vocabulary

ARCHITECTURE = "MTPHead"
KINDS = ("llama", "mistral", "qwen2", "qwen3")  # dense targets whose layers are called (x, mask, cache)


def is_mtp_head(config: dict) -> bool:
    return ARCHITECTURE in (config.get("architectures") or [])


def check_trainable(config: dict, where) -> None:
    if config.get("model_type") not in KINDS:
        raise SpecError(f"{where} is {config.get('model_type')!r}: train-mtp trains heads for dense "
                        f"{', '.join(KINDS)} targets (Qwen 3.5 / 3.6, DeepSeek and GLM ship their own MTP layer)")


class MTPHead(nn.Module):
    def __init__(self, target, ids: mx.array, eps: float):
        """target: the mlx-lm model the head serves (its last layer, made float if quantized, gives the head's layer
        its kind and start); ids: the target token of each output row, ascending."""
        super().__init__()
        h = target.model.norm.weight.shape[0]  # the embedding's may be packed by quantization
        self.enorm, self.hnorm, self.norm = (nn.RMSNorm(h, eps=eps) for _ in range(3))
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layers = [float_copy(target.model.layers[-1])]
        self.lm_head = nn.Linear(h, ids.shape[0], bias=False)
        vocab = target.model.embed_tokens.weight.shape[0]
        index = mx.full((vocab,), ids.shape[0], dtype=mx.int32)  # target token -> output row (the last: -inf)
        index[ids] = mx.arange(ids.shape[0], dtype=mx.int32)
        self._ids, self._index = ids, index

    @property
    def ids(self) -> mx.array:
        return self._ids

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list | None = None) -> mx.array:
        x = self.eh_proj(mx.concatenate([self.enorm(embeddings), self.hnorm(hidden)], -1))
        layer_cache = cache[0] if cache else None
        return self.layers[0](x, mask=create_attention_mask(x, layer_cache), cache=layer_cache)

    def reduced_logits(self, x: mx.array) -> mx.array:
        """Scores over the head's own rows (n, len(ids))."""
        return self.lm_head(self.norm(x))

    def logits(self, x: mx.array) -> mx.array:
        """Scores over the target's vocabulary (n, V), -inf outside `ids`."""
        return to_target_vocabulary(self.reduced_logits(x), self._index)


def head_config(target_config: dict, vocab_top: int, record: dict) -> dict:
    keys = ("model_type", "hidden_size", "vocab_size", "num_hidden_layers")
    return {"architectures": [ARCHITECTURE], **{f"target_{k}": target_config.get(k) for k in keys},
            "vocab_top": vocab_top, "rms_norm_eps": target_config.get("rms_norm_eps", 1e-6), "training": record}


def save_head(head: MTPHead, config: dict, out: Path) -> None:
    from mlx.utils import tree_flatten

    out.mkdir(parents=True, exist_ok=True)
    weights = {**dict(tree_flatten(head.parameters())), "ids": head.ids}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))


def load_head(path: Path, config: dict, target, target_config: dict) -> MTPHead:
    """A trained head, checked against the target it is asked to serve."""
    for key in ("model_type", "hidden_size", "vocab_size", "num_hidden_layers"):
        if config.get(f"target_{key}") != target_config.get(key):
            raise SpecError(f"the MTP head in {path} was trained for a target with {key} "
                            f"{config.get(f'target_{key}')!r}, this one has {target_config.get(key)!r}: train one for "
                            "this model with `mlx-spec train-mtp`")
    weights = dict(load_weights(path / "model.safetensors"))
    head = MTPHead(target, weights.pop("ids").astype(mx.int32), config["rms_norm_eps"])
    load_exactly(head, weights, f"the MTP head in {path} does not fit its config ({{}}): train it again")
    return head
