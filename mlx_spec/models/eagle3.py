"""EAGLE-3 draft heads (Li et al. 2025), as the EAGLE repository, SpecForge and `speculators` write them (and vLLM's
`llama_eagle3.py` reads them).

The target's hidden states entering some of its layers (by default three: 2, L // 2 and L - 3) are concatenated
(A x target H) and projected by `fc` to H, after one RMSNorm over the whole concatenation (`norm_before_fc`,
weight `input_norm`) or one per layer's state (`fc_norm`, weights `fc_norm.N`) when the config asks. Then
`num_hidden_layers` Llama or Qwen3 decoder layers, the first of which (`midlayer` or `layers.0`) reads 2 H:

    e = input_layernorm(embed(t_{p+1}))        the target's embedding unless the head has its own
    f = hidden_norm(x_p)                       x_p = fc(features_p) for verified positions, else the head's own g
    a = x_p + o_proj(attention(q, k, v from concat[e, f]))   (residual = f with norm_before_residual)
    g = a + mlp(post_attention_layernorm(a))   then through `layers.1 ..`, plain decoder layers
    logits = lm_head(norm(g))                  over `draft_vocab_size` tokens; target id = d + d2t[d]

Drafting further feeds back g, or norm(g) with `norm_output` (EAGLE 3.1). Layers that `layer_types` marks
"sliding_attention" see the last `sliding_window` rows. The EAGLE form keeps the decoder's fields at the top of
config.json (aux layers in `eagle_config.eagle_aux_hidden_state_layer_ids`); `speculators` nests them under
`transformer_layer_config`, keeps the head's own keys at the top and defaults `norm_before_residual` to true
(as vLLM reads it). Nulls mean the default (`target_hidden_size`: the head's H; `draft_vocab_size`: the
target's vocabulary); RoPE comes from `rope_parameters` or `rope_theta` / `rope_scaling`. `read_config`
refuses, in one line, every field that would change the computation and is not read.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from ..seams import compat
from ..seams.errors import SpecError
from .common import (
    load_exactly,
    read_safetensors,
    rope_settings,
    target_rows,
    to_target_vocabulary,
)

HEAD_KEYS = ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "norm_before_fc", "fc_norm",
             "norm_output", "eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state",
             "quantization")  # the keys `speculators` writes beside the decoder's nested fields


def is_eagle3(config: dict) -> bool:
    return (config.get("speculators_model_type") == "eagle3"
            or any("eagle3" in name.lower() for name in config.get("architectures") or []))


def read_config(config: dict, path: Path) -> dict:
    """The head's settings from its config.json in either form; a one-line SpecError for what is not read."""
    if config.get("speculators_model_type") == "eagle3":
        flat = {"norm_before_residual": True, **(config.get("transformer_layer_config") or {}),
                **{key: config[key] for key in HEAD_KEYS if config.get(key) is not None}}
    else:
        flat = {**config, **(config.get("eagle_config") or {})}
    family = flat.get("model_type") or "llama"
    if family not in compat.DECODER_FAMILIES:
        raise SpecError(f"{path}: EAGLE-3 heads with {family!r} decoder layers are not read yet: use a head with "
                        "Llama or Qwen3 layers")
    if flat.get("use_aux_hidden_state") is False:
        raise SpecError(f"{path}: a head that reads only the target's last hidden state (use_aux_hidden_state "
                        "false) is an EAGLE-1/2 head, which mlx-spec does not read: use an EAGLE-3 head")
    if flat.get("norm_before_fc") and flat.get("fc_norm"):
        raise SpecError(f"{path}: the config sets both norm_before_fc and fc_norm, which exclude each other: "
                        "re-download the head")
    if (flat.get("hidden_act") or "silu") != "silu":
        raise SpecError(f"{path}: the head's {flat['hidden_act']!r} activation is not read yet: use a SiLU head")
    if family == "qwen3" and flat.get("attention_bias"):
        raise SpecError(f"{path}: Qwen3 layers with attention biases are not read yet: use a head without them")
    missing = [key for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
               if flat.get(key) is None]
    if missing:
        raise SpecError(f"{path}: the EAGLE-3 head's config.json lacks {', '.join(missing)}: re-download the head")
    layers = flat.get("num_hidden_layers") or 1
    types = flat.get("layer_types") or ["full_attention"] * layers
    window = flat.get("sliding_window")
    if len(types) != layers or set(types) - {"full_attention", "sliding_attention"}:
        raise SpecError(f"{path}: the head's layer_types {types} do not describe its {layers} layer(s) as full or "
                        "sliding attention: re-download the head")
    if "sliding_attention" in types and not window:
        raise SpecError(f"{path}: the head has sliding-window layers but no sliding_window: re-download the head")
    heads, hidden = flat["num_attention_heads"], flat["hidden_size"]
    args = []
    for layer_type in types:
        theta, scaling = rope_settings(flat, path, layer_type)
        args.append(dict(
            hidden_size=hidden, intermediate_size=flat["intermediate_size"], num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=flat.get("num_key_value_heads") or heads,
            head_dim=flat.get("head_dim") or hidden // heads, rms_norm_eps=flat.get("rms_norm_eps") or 1e-6,
            vocab_size=flat["vocab_size"], max_position_embeddings=flat.get("max_position_embeddings") or 4096,
            rope_theta=theta, rope_scaling=scaling, attention_bias=bool(flat.get("attention_bias")),
            mlp_bias=bool(flat.get("mlp_bias")), tie_word_embeddings=False))
    aux = flat.get("eagle_aux_hidden_state_layer_ids")
    return {"family": family, "layer_args": args, "hidden_size": hidden, "eps": args[0]["rms_norm_eps"],
            "vocab_size": flat["vocab_size"], "draft_vocab": flat.get("draft_vocab_size") or flat["vocab_size"],
            "target_hidden": flat.get("target_hidden_size") or hidden, "aux_layers": list(aux) if aux else None,
            "norm_before_residual": bool(flat.get("norm_before_residual")),
            "norm_before_fc": bool(flat.get("norm_before_fc")), "fc_norm": bool(flat.get("fc_norm")),
            "norm_output": bool(flat.get("norm_output")),
            "windows": [window if t == "sliding_attention" else None for t in types],
            "quantization": flat.get("quantization")}


def feature_layers(head: dict, target_layers: int) -> list[int]:
    """The target layers whose inputs the head reads (`head`: `read_config`'s)."""
    return head["aux_layers"] or [2, target_layers // 2, target_layers - 3]


class Eagle3Layer(nn.Module):
    """The head's first decoder layer, over [input_layernorm(embedding); hidden_norm(x)]."""

    def __init__(self, args, norm_before_residual: bool):
        super().__init__()
        h, eps = args.hidden_size, args.rms_norm_eps
        self.norm_before_residual = norm_before_residual
        self.input_layernorm, self.hidden_norm = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=eps)
        self.self_attn = compat.decoder_attention(args, input_dims=2 * h)
        self.mlp = compat.decoder_mlp(args)

    def __call__(self, embeddings: mx.array, x: mx.array, mask, cache) -> mx.array:
        f = self.hidden_norm(x)
        both = mx.concatenate([self.input_layernorm(embeddings), f], axis=-1)
        a = (f if self.norm_before_residual else x) + self.self_attn(both, mask, cache)
        return a + self.mlp(self.post_attention_layernorm(a))


class Eagle3(nn.Module):
    def __init__(self, head: dict, own_embedding: bool):
        """head: `read_config`'s settings."""
        super().__init__()
        h, vocab, self._windows = head["hidden_size"], head["vocab_size"], head["windows"]
        self.windowed = any(self._windows)  # sliding layers: chains only (a tree level's mask has no window)
        width, aux = head["target_hidden"], len(head["aux_layers"] or [0, 0, 0])
        args = [compat.decoder_args(head["family"], a) for a in head["layer_args"]]
        if head["norm_before_fc"]:
            self.input_norm = nn.RMSNorm(aux * width, eps=head["eps"])
        if head["fc_norm"]:
            self.fc_norm = [nn.RMSNorm(width, eps=head["eps"]) for _ in range(aux)]
        self.fc = nn.Linear(aux * width, h, bias=False)
        self.layers = [Eagle3Layer(args[0], head["norm_before_residual"])] + [compat.decoder_block(a)
                                                                                for a in args[1:]]
        self.norm = nn.RMSNorm(h, eps=head["eps"])
        self.norm_output = head["norm_output"]
        self.draft_vocab = head["draft_vocab"]
        self.lm_head = nn.Linear(h, self.draft_vocab, bias=False)
        if own_embedding:
            self.embed_tokens = nn.Embedding(vocab, h)
        self._to_target = mx.arange(vocab)  # target token -> draft row (draft_vocab: a -inf column)

    def make_cache(self) -> list:
        return [KVCache() for _ in self.layers]  # sliding layers too: the mask keeps them to their window

    def map_vocabulary(self, d2t: mx.array) -> None:
        """Target id = draft id + d2t[draft id]; tokens outside the draft vocabulary score -inf."""
        self._to_target = target_rows(d2t, self._to_target.shape[0])

    def project(self, features: mx.array) -> mx.array:
        """fc over the target's concatenated features, normed first as the config asks."""
        if "input_norm" in self:
            features = self.input_norm(features)
        if "fc_norm" in self:
            chunks = mx.split(features, len(self.fc_norm), axis=-1)
            features = mx.concatenate([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks)], axis=-1)
        return self.fc(features)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        """What the head feeds back (1, n, H), for rows pairing embeddings (1, n, H) with target features
        (1, n, A x target H) or with what it fed back before (1, n, H)."""
        x = hidden if hidden.shape[-1] == self.norm.weight.shape[0] else self.project(hidden)
        for i, (layer, layer_cache, window) in enumerate(zip(self.layers, cache, self._windows)):
            mask = create_attention_mask(x, layer_cache, window_size=window)
            x = layer(embeddings, x, mask, layer_cache) if i == 0 else layer(x, mask, layer_cache)
        return self.norm(x) if self.norm_output else x

    def logits(self, g: mx.array) -> mx.array:
        """Scores over the target's vocabulary (n, V) of what the head fed back."""
        scores = self.lm_head(g if self.norm_output else self.norm(g))
        if self.draft_vocab == self._to_target.shape[0]:
            return scores
        return to_target_vocabulary(scores, self._to_target)


def load_eagle3(path: Path, config: dict) -> Eagle3:
    """The head in `path` (`config`: its config.json, either form)."""
    head_config = read_config(config, path)
    weights = read_safetensors(path, "an EAGLE-3 head")
    d2t = weights.pop("d2t", None)
    weights = {k: v for k, v in weights.items() if k != "t2d" and not k.startswith("verifier_")}  # training only
    weights = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in weights.items()}
    try:
        head = Eagle3(head_config, "embed_tokens.weight" in weights)
    except ValueError as e:  # mlx-lm's RoPE refuses a scaling it does not know
        raise SpecError(f"{path}: the head's rotary embedding is not supported ({e}): use a head with a RoPE "
                        "scaling mlx-lm reads") from None
    if quantization := head_config["quantization"]:
        nn.quantize(head, group_size=quantization["group_size"], bits=quantization["bits"])
    load_exactly(head, weights, f"{path}: the weights do not fit the EAGLE-3 head its config.json describes ({{}}): "
                                "re-download the head")
    if head.draft_vocab != head_config["vocab_size"]:
        if d2t is None or d2t.shape != (head.draft_vocab,):
            raise SpecError(f"{path}: a draft vocabulary of {head.draft_vocab} tokens needs a d2t map of that "
                            "length: re-download the head")
        head.map_vocabulary(d2t)
    mx.eval(head.parameters(), head._to_target)
    return head
