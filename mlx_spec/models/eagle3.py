"""EAGLE-3 draft heads (Li et al. 2025), in the layout of the EAGLE repository and SpecForge (read by vLLM's
`llama_eagle3.py` and SGLang alike).

The target's hidden states entering three of its layers (low, mid, high: by default 2, L // 2 and L - 3) are
concatenated (3 H) and projected by `fc` to H. One Llama decoder layer, `midlayer`, whose attention reads 2 H:

    e = input_layernorm(embed(t_{p+1}))        the target's embedding unless the head has its own
    f = hidden_norm(x_p)                       x_p = fc(features_p) for verified positions, else the head's own g
    a = x_p + o_proj(attention(q, k, v from concat[e, f]))   (residual = f with norm_before_residual)
    g = a + mlp(post_attention_layernorm(a))   fed back as x_{p+1} when drafting further
    logits = lm_head(norm(g))                  over `draft_vocab_size` tokens; target id = d + d2t[d]

A checkpoint directory holds `config.json` (`architectures` naming Eagle3, the Llama attention fields,
`draft_vocab_size`, optionally `eagle_config.eagle_aux_hidden_state_layer_ids` and `target_hidden_size`) and
`model.safetensors` with `fc.weight`, `midlayer.*` (or `layers.0.*`), `norm.weight`, `lm_head.weight`, `d2t`,
`t2d` and optionally `embed_tokens.weight`. The `speculators` format (Red Hat's heads) nests the Llama fields
under `transformer_layer_config`, keeps the other keys at the top and defaults `norm_before_residual` to true.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

from .. import compat
from ..errors import SpecError
from . import load_exactly, read_safetensors, to_target_vocabulary


def is_eagle3(config: dict) -> bool:
    return (config.get("speculators_model_type") == "eagle3"
            or any("eagle3" in name.lower() for name in config.get("architectures") or []))


def flat_config(config: dict) -> dict:
    """The EAGLE-repository form of a head's config (the speculators form unnested)."""
    if config.get("speculators_model_type") != "eagle3":
        return config
    flat = {**config.get("transformer_layer_config", {}), "norm_before_residual": True}
    flat.update({k: v for k, v in config.items() if k in ("draft_vocab_size", "target_hidden_size",
                                                          "norm_before_residual", "norm_before_fc", "quantization")})
    if ids := config.get("eagle_aux_hidden_state_layer_ids"):
        flat["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    return flat


def trained_for(config: dict) -> tuple[int, int]:
    """(hidden size, vocabulary) of the target the head was trained on."""
    flat = flat_config(config)
    return flat.get("target_hidden_size", flat["hidden_size"]), flat["vocab_size"]


def feature_layers(config: dict, target_layers: int) -> list[int]:
    """The target layers whose inputs the head reads (low, mid, high)."""
    ids = (flat_config(config).get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if ids else [2, target_layers // 2, target_layers - 3]


class Eagle3Layer(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        args = compat.llama_args(config)
        h, eps = args.hidden_size, args.rms_norm_eps
        self.norm_before_residual = config.get("norm_before_residual", False)
        self.input_layernorm, self.hidden_norm = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=eps)
        self.self_attn = compat.llama_attention(args, input_dims=2 * h)
        self.mlp = compat.llama_mlp(args)

    def __call__(self, embeddings: mx.array, x: mx.array, cache) -> mx.array:
        f = self.hidden_norm(x)
        both = mx.concatenate([self.input_layernorm(embeddings), f], axis=-1)
        a = (f if self.norm_before_residual else x) + self.self_attn(both, create_attention_mask(both, cache), cache)
        return a + self.mlp(self.post_attention_layernorm(a))


class Eagle3(nn.Module):
    def __init__(self, config: dict, own_embedding: bool):
        """config: the EAGLE-repository form (`flat_config`)."""
        super().__init__()
        h, (target_hidden, vocab) = config["hidden_size"], trained_for(config)
        self.fc = nn.Linear(3 * target_hidden, h, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = nn.RMSNorm(h, eps=config["rms_norm_eps"])
        self.draft_vocab = config.get("draft_vocab_size") or vocab
        self.lm_head = nn.Linear(h, self.draft_vocab, bias=False)
        if own_embedding:
            self.embed_tokens = nn.Embedding(vocab, h)
        self._to_target = mx.arange(vocab)  # target token -> draft row (draft_vocab: a -inf column)

    def make_cache(self) -> list:
        return compat.plain_kv_caches(1)

    def map_vocabulary(self, d2t: mx.array) -> None:
        """Target id = draft id + d2t[draft id]; tokens outside the draft vocabulary score -inf."""
        vocab = self._to_target.shape[0]
        targets = mx.arange(self.draft_vocab) + d2t.astype(mx.int32)
        index = mx.full((vocab,), self.draft_vocab, dtype=mx.int32)
        index[targets] = mx.arange(self.draft_vocab, dtype=mx.int32)
        self._to_target = index

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        """g (1, n, H) for rows pairing embeddings (1, n, H) with target features (1, n, 3 H) or the head's own
        previous g (1, n, H)."""
        x = self.fc(hidden) if hidden.shape[-1] != self.fc.weight.shape[0] else hidden
        return self.midlayer(embeddings, x, cache[0])

    def logits(self, g: mx.array) -> mx.array:
        """Scores over the target's vocabulary (n, V)."""
        scores = self.lm_head(self.norm(g))
        if self.draft_vocab == self._to_target.shape[0]:
            return scores
        return to_target_vocabulary(scores, self._to_target)


def load_eagle3(path: Path, config: dict) -> Eagle3:
    """The head in `path` (`config`: its config.json, either form)."""
    config = flat_config(config)
    if config.get("norm_before_fc"):
        raise SpecError(f"{path}: heads with norm_before_fc are not supported yet: use a head without it")
    weights = read_safetensors(path, "an EAGLE-3 head")
    d2t = weights.pop("d2t", None)
    weights.pop("t2d", None)
    weights = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in weights.items()}
    head = Eagle3(config, "embed_tokens.weight" in weights)
    if quantization := config.get("quantization"):
        nn.quantize(head, group_size=quantization["group_size"], bits=quantization["bits"])
    load_exactly(head, weights, f"{path}: the weights do not fit the EAGLE-3 head its config.json describes ({{}}): "
                                "re-download the head")
    if head.draft_vocab != trained_for(config)[1]:
        if d2t is None or d2t.shape != (head.draft_vocab,):
            raise SpecError(f"{path}: a draft vocabulary of {head.draft_vocab} tokens needs a d2t map of that "
                            "length: re-download the head")
        head.map_vocabulary(d2t)
    mx.eval(head.parameters(), head._to_target)
    return head
