"""Gemma 4 "assistant" drafters (`model_type: gemma4_assistant`), which mlx-lm cannot load.

A small Gemma 4 text stack whose every layer is KV-shared: it has queries only and attends to the target's
cached K/V (the last non-KV-shared target layer of each type, sliding and full), with attention scale 1.0
(mlx-lm's own Gemma 4 `DecoderLayer` with `shared_kv`, reused as is). Which K/V it is given is the caller's
choice: the drafter passes all positions for full layers and the last `sliding_window + 1` for sliding ones,
what the reference's bidirectional sliding mask `abs(q - kv) <= sliding_window` leaves visible. One draft step:

    x = pre_projection(concat[target_embed(token) * sqrt(H_target), h])   h: target post-norm hidden, then
    x = norm(layers(x, query position constant for the round))               the previous step's post_projection
    logits = masked_embedding(x) if use_ordered_embeddings else x @ embed_tokens.T
    h = post_projection(x)

`masked_embedding` is the sparse head of the E2B / E4B assistants: it scores `num_centroids` clusters, keeps
the top `centroid_intermediate_top_k`, and scores only the tokens of those clusters (`token_ordering`); every
other token gets one less than the lowest candidate score, as the reference does.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gemma4_text

from ..seams.compat import gemma4_layer
from ..seams.errors import SpecError
from .common import load_exactly, load_weights

MODEL_TYPE = "gemma4_assistant"


def is_assistant(config: dict) -> bool:
    return config.get("model_type") == MODEL_TYPE


class MaskedEmbedding(nn.Module):
    """Sparse output head: exact logits on the tokens of the best clusters, the minimum minus one elsewhere."""

    def __init__(self, hidden: int, vocab: int, num_centroids: int, top_k: int):
        super().__init__()
        if vocab % num_centroids:
            raise SpecError(f"vocabulary {vocab} is not a multiple of num_centroids {num_centroids}")
        self.centroids = nn.Linear(hidden, num_centroids, bias=False)
        self.token_ordering = mx.zeros((vocab,), dtype=mx.int32)
        self.num_centroids, self.top_k = num_centroids, top_k

    def candidates(self, x: mx.array) -> mx.array:
        """(..., top_k * V / num_centroids) token ids of the clusters that score highest for x."""
        scores = self.centroids(x)
        top = mx.argpartition(-scores, self.top_k - 1, axis=-1)[..., :self.top_k]
        return self.token_ordering.reshape(self.num_centroids, -1)[top].flatten(-2)

    def __call__(self, x: mx.array, embed_tokens) -> mx.array:
        ids = self.candidates(x)
        selected = (embed_tokens(ids) @ x[..., None])[..., 0]
        floor = (selected.min(axis=-1, keepdims=True) - 1.0).astype(x.dtype)  # each row's own
        logits = mx.broadcast_to(floor, (*x.shape[:-1], self.token_ordering.shape[0]))
        return mx.put_along_axis(logits, ids, selected.astype(x.dtype), axis=-1)


class AssistantBody(nn.Module):
    def __init__(self, args: gemma4_text.ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)  # the tied output head
        self.layers = [gemma4_text.DecoderLayer(args, layer_idx=i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Gemma4Assistant(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        text = dict(config["text_config"])
        text["num_kv_shared_layers"] = text["num_hidden_layers"]  # every layer reads the target's K/V
        self.args = gemma4_text.ModelArgs.from_dict(text)
        self.config = config
        self.backbone_hidden_size = config["backbone_hidden_size"]
        hidden = self.args.hidden_size
        self.model = AssistantBody(self.args)
        self.pre_projection = nn.Linear(2 * self.backbone_hidden_size, hidden, bias=False)
        self.post_projection = nn.Linear(hidden, self.backbone_hidden_size, bias=False)
        if config.get("use_ordered_embeddings"):
            self.masked_embedding = MaskedEmbedding(hidden, self.args.vocab_size, config["num_centroids"],
                                                    config["centroid_intermediate_top_k"])

    @property
    def layer_types(self) -> list[str]:
        return [layer.layer_type for layer in self.model.layers]

    def __call__(self, token_embedding: mx.array, hidden: mx.array, shared_kv: dict, position: int,
                 masks: dict | None = None):
        """A draft step for (B, L, H_target) inputs: (logits (B, L, V), the next `hidden` (B, L, H_target)).
        shared_kv: layer type -> (keys, values) of the target; without `masks` (layer type -> mask) every query
        sees all of them. The queries sit at positions `position`, `position + 1`, ..."""
        x = self.pre_projection(mx.concatenate([token_embedding, hidden], axis=-1))
        for layer in self.model.layers:
            mask = masks and masks[layer.layer_type]
            x = gemma4_layer(layer, x, mask, shared_kv[layer.layer_type], position)
        x = self.model.norm(x)
        if "masked_embedding" in self:
            logits = self.masked_embedding(x, self.model.embed_tokens)
        else:
            logits = self.model.embed_tokens.as_linear(x)
        return logits, self.post_projection(x)


def quantize(assistant: Gemma4Assistant, group_size: int, bits: int) -> None:
    """Quantize everything that can be, except the centroids: they choose the candidate set, kept exact."""
    nn.quantize(assistant, group_size=group_size, bits=bits,
                class_predicate=lambda path, module: hasattr(module, "to_quantized") and "centroids" not in path
                and module.weight.shape[-1] % group_size == 0)


def load_assistant(path: Path) -> Gemma4Assistant:
    """An assistant from a Hugging Face checkpoint or an `mlx-spec convert` output (possibly quantized)."""
    config = json.loads((path / "config.json").read_text())
    weights = {}
    for file in sorted(path.glob("model*.safetensors")):
        weights.update(load_weights(file))
    if "masked_embedding.token_ordering" in weights:  # int64 on the hub: ids, never cast
        weights["masked_embedding.token_ordering"] = weights["masked_embedding.token_ordering"].astype(mx.int32)
    if not config.get("use_ordered_embeddings"):  # 26B / 31B configs may still name centroids they lack
        weights = {k: v for k, v in weights.items() if not k.startswith("masked_embedding.")}
    assistant = Gemma4Assistant(config)
    if quantization := config.get("quantization"):
        quantize(assistant, quantization["group_size"], quantization["bits"])
    load_exactly(assistant, weights, f"the weights in {path} do not fit a Gemma 4 assistant ({{}}): re-download or "
                                     "re-convert it")
    return assistant
