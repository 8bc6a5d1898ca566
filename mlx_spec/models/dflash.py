"""Block drafters: DFlash (z-lab, arXiv 2602.06036), DFlash2 (Inco) and DSpark (DeepSpec, arXiv 2607.05147), in the
Hugging Face layouts their publishers write (z-lab's `DFlashDraftModel`; DFlash2 and DSpark: a DFlash backbone
plus a candidate selector and convolutions, or a Markov head) and in vllm-project/speculators' (`speculators_fields`).

One forward drafts a whole block from the target's hidden states:

    c_p = hidden_norm(fc(concat of the OUTPUTS of target layers `target_layer_ids` at position p))   context
    block = [anchor (the last verified token), MASK x (n - 1)] at positions a .. a + n - 1           (embedded
            with the target's embedding), through `num_hidden_layers` Qwen3-style layers (q/k/v/o, per-head
            q_norm / k_norm, SwiGLU MLP, pre-norms) whose attention reads, for every block query, the K/V of all
            context features (cached across rounds, rotated at their own positions) and of the whole block (no
            causal mask inside it); a sliding layer's query sees what lies within its window (see `read_config`),
            causally; then `norm` and the target's own head (or the drafter's `lm_head`).

DFlash drafts from the block's positions 1 .. n - 1. DSpark drafts from positions 0 .. n - 1 when
`sample_from_anchor` (its default) and adds a low-rank Markov bias to each position's logits,
`markov_w2(markov_w1(the token drafted just before))` (the anchor before the first), so its drafts are sampled
left to right; its confidence head, sigmoid(proj([hidden state; markov_w1(token before)])), estimates each
position's acceptance, from which the adaptive policy cuts the block short (`AdaptiveDraftLength.cut`). After each
round only the verified positions' target features become context: the cache never keeps block K/V.

DFlash2 wraps each layer's attention and MLP in grouped dynamic causal convolutions along the block, scales the
block's embeddings (`input_embedding_scale`) and logits (`output_multiplier`), and drafts position i from its
`selector_top_k` highest logits, each scored logit + <predecessor code of the token drafted before, projected
hidden state, successor code> (`candidate_selector.*`), left to right as DSpark.

config.json: the Qwen3 fields (`rope_parameters` or `rope_theta` / `rope_scaling`, nulls allowed), `block_size`,
`num_target_layers`, `dflash_config.{target_layer_ids, mask_token_id}` (DSpark: also `markov_rank`,
`projector_type` "dspark", `sample_from_anchor`, `block_size` counting the drafts only unless
`dspark_bonus_anchor`), optional `layer_types` / `sliding_window` / `dflash_config.causal`. Weights:
`fc.weight`, `hidden_norm.weight`, `layers.N.*`, `norm.weight`, DSpark's `markov_head.markov_w{1,2}.weight` (and
`confidence_head.proj.*` with `enable_confidence_head`), an own `embed_tokens` / `lm_head` when present
(speculators': `lm_head` over `draft_vocab_size` tokens, target id = draft id + `d2t`); a `model.` prefix is
dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from ..seams import compat
from ..seams.caches import rollback
from ..seams.errors import SpecError
from .common import (
    load_exactly,
    read_safetensors,
    rope_settings,
    target_rows,
    to_target_vocabulary,
)

MARKERS = {  # variants recognised by their config, not read yet, and what marks them
    "DFly (per-layer fusion weights)": ("layer_fusion_weights", "hidden_correction"),
}


def block_kind(config: dict) -> str | None:
    """"dflash", "dflash2" or "dspark" when config.json describes a block drafter (None: it does not)."""
    options = config.get("dflash_config") or {}
    names = " ".join([str(config.get("model_type", "")), *(config.get("architectures") or []),
                      str(config.get("speculators_model_type", ""))]).lower()
    if "dspark" in names or options.get("projector_type") == "dspark" or "markov_rank" in options:
        return "dspark"
    if "dflash2" in names or "selector_top_k" in options:
        return "dflash2"
    if "dflash" in names or "pard" in names or "dflash_config" in config:
        return "dflash"
    return None


def speculators_fields(config: dict, kind: str) -> dict:
    """speculators' layout (`transformer_layer_config`, `aux_hidden_state_layer_ids`, `draft_vocab_size`) in
    z-lab's fields. Its layer ids index the target's hidden states as vLLM collects them: id i is the input of layer
    i (Hugging Face's `hidden_states[i]`), where z-lab's id i is the output of layer i (vLLM #40727)."""
    aux = config.get("aux_hidden_state_layer_ids")
    dspark = kind == "dspark"
    return {**(config.get("transformer_layer_config") or {}),
            **{key: config[key] for key in ("block_size", "mask_token_id", "draft_vocab_size", "markov_rank",
                                            "markov_head_type", "sliding_window_non_causal") if key in config},
            "target_layer_ids": aux and [i - 1 for i in aux],
            "sample_from_anchor": config.get("sample_from_anchor", dspark),
            "enable_confidence_head": config.get("enable_confidence_head", dspark),
            "confidence_head_with_markov": config.get("confidence_head_with_markov", True)}


def read_config(config: dict, path: Path) -> dict:
    """The fields the drafter is built from, `dflash_config` unnested; a one-line SpecError for what is not read."""
    options = config.get("dflash_config") or {}
    for variant, keys in MARKERS.items():
        if any(key in options or key in config for key in keys) or variant.split()[0].lower() in str(
                config.get("architectures")).lower():
            raise SpecError(f"{path} is a {variant} drafter, which mlx-spec does not read yet: use a DFlash, "
                            "DFlash2 or DSpark drafter")
    if "pard" in str(config.get("architectures")).lower():
        raise SpecError(f"{path} is in a layout mlx-spec does not read yet (PARD's): use the z-lab or DeepSpec "
                        "Hugging Face release of the drafter")
    kind = block_kind(config)
    speculators = bool(config.get("speculators_model_type"))
    flat = speculators_fields(config, kind) if speculators else {**config, **options}
    if flat.get("mask_token_id") is None:
        raise SpecError(f"{path}: the block drafter's config names no mask token (dflash_config.mask_token_id): "
                        "re-download the drafter")
    if not flat.get("target_layer_ids"):
        raise SpecError(f"{path}: the block drafter's config names no target layers (dflash_config."
                        "target_layer_ids): re-download the drafter")
    if kind == "dspark" and flat.get("markov_head_type", "vanilla") != "vanilla":
        raise SpecError(f"{path}: DSpark's {flat['markov_head_type']!r} Markov head is not read yet: use a drafter "
                        "with the vanilla head")
    if flat.get("attention_sink_bias") or flat.get("projector_type") not in (None, "dflash", "dspark"):
        raise SpecError(f"{path}: attention sinks and the {flat.get('projector_type') or 'sink'} projector are not "
                        "read yet: use a plain DFlash or DSpark drafter")
    if "sliding_attention" in (flat.get("layer_types") or []) and not (flat.get("sliding_window")
                                                                     or flat.get("swa_window_size")):
        raise SpecError(f"{path}: the block drafter's config has sliding-window layers but no sliding_window: "
                        "re-download the drafter")
    theta, rope = rope_settings(flat, path)
    needed = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
              "block_size") + (("selector_rank", "selector_top_k", "conv_kernel_size", "conv_group_size")
                               if kind == "dflash2" else ())
    missing = [key for key in needed if flat.get(key) is None]
    if missing:
        raise SpecError(f"{path}: the block drafter's config.json lacks {', '.join(missing)}: re-download the drafter")
    if speculators:  # block_size counts the block's positions, each one a draft when drafting from the anchor
        from_anchor = bool(flat["sample_from_anchor"])
        drafts = flat["block_size"] - (not from_anchor)
    else:  # DeepSpec's DSpark block_size counts the drafts
        from_anchor = kind == "dspark" and flat.get("sample_from_anchor", True)
        drafts = flat["block_size"] + (kind == "dspark" and not flat.get("dspark_bonus_anchor", False)) - 1
    heads, layers = flat["num_attention_heads"], flat["num_hidden_layers"]
    sliding = [t == "sliding_attention" for t in flat.get("layer_types") or ["full_attention"] * layers]
    window = flat.get("sliding_window") or flat.get("swa_window_size")
    causal = flat.get("causal", flat.get("is_causal"))
    markov_rank = 256 if flat.get("markov_rank") is None else flat["markov_rank"]
    return {
        "kind": kind, "hidden_size": flat["hidden_size"], "intermediate_size": flat["intermediate_size"],
        "layers": flat["num_hidden_layers"], "heads": heads, "kv_heads": flat.get("num_key_value_heads") or heads,
        "head_dim": flat.get("head_dim") or flat["hidden_size"] // heads, "eps": flat.get("rms_norm_eps") or 1e-6,
        "vocab_size": flat["vocab_size"], "rope_theta": theta, "rope_scaling": rope,
        "max_positions": flat.get("max_position_embeddings"), "traditional": not flat.get("rope_is_neox_style", True),
        "drafts": drafts, "mask": flat["mask_token_id"], "target_layer_ids": list(flat["target_layer_ids"]),
        "target_layers": None if speculators else flat.get("num_target_layers") or max(flat["target_layer_ids"]) + 1,
        "draft_vocab": flat.get("draft_vocab_size") or flat["vocab_size"], "sliding": sliding,
        # z-lab (its model.py and vLLM): a sliding layer's query at p sees the keys at p - window + 1 .. p (+
        # window - 1 inside a non-causal block); sliding layers causal unless `dflash_config.causal` / `is_causal`
        # says for all. speculators: the window positions before the anchor, then the block, sliding layers causal
        # unless `sliding_window_non_causal`, full layers never
        "seen": window if speculators else window and window - 1, "window_moves": not speculators,
        "causal": [s and not flat.get("sliding_window_non_causal") if speculators else s if causal is None
                   else bool(causal) for s in sliding],
        "from_anchor": from_anchor, "markov_rank": (markov_rank or None) if kind == "dspark" else None,
        "softcap": flat.get("final_logit_softcapping"), "input_scale": flat.get("input_embedding_scale") or 1.0,
        "output_scale": flat.get("output_multiplier") or 1.0,
        "conv": (flat["conv_kernel_size"], flat["conv_group_size"]) if kind == "dflash2" else None,
        "selector": (flat["selector_rank"], flat["selector_top_k"]) if kind == "dflash2" else None,
        "confidence": (kind == "dspark" and bool(flat.get("enable_confidence_head")),
                       flat.get("confidence_head_with_markov", True)),
    }


class BlockAttention(nn.Module):
    def __init__(self, c: dict, sliding: bool, causal: bool):
        super().__init__()
        h, self.heads, self.kv_heads, d = c["hidden_size"], c["heads"], c["kv_heads"], c["head_dim"]
        self.q_proj, self.o_proj = nn.Linear(h, self.heads * d, bias=False), nn.Linear(self.heads * d, h, bias=False)
        self.k_proj, self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False), nn.Linear(h, self.kv_heads * d,
                                                                                            bias=False)
        self.q_norm, self.k_norm = nn.RMSNorm(d, eps=c["eps"]), nn.RMSNorm(d, eps=c["eps"])
        self.scale, self.causal, self.window_moves = d ** -0.5, causal, c["window_moves"]
        self.seen = c["seen"] if sliding else None  # the context positions a sliding layer sees

    def split(self, x: mx.array, heads: int) -> mx.array:
        return x.reshape(*x.shape[:2], heads, -1).transpose(0, 2, 1, 3)

    def project(self, context: mx.array, rope, start) -> tuple[mx.array, mx.array]:
        """The keys and values (B, KV heads, S, D) of context features (B, S, H) at positions start .. start + S - 1
        (`start`: an int, or (B,), each row's)."""
        keys = rope(self.k_norm(self.split(self.k_proj(context), self.kv_heads)), offset=start)
        return keys, self.split(self.v_proj(context), self.kv_heads)

    def every_block(self, x: mx.array, context: mx.array, rope, anchors: mx.array, mask: mx.array) -> mx.array:
        """Training's attention: x (B, m n, H) holds m blocks of n positions, block j at positions anchors[:, j]
        .. + n - 1; `context` (B, L, H) the context features at positions 0 .. L - 1; mask (B, 1, m n, L + m n)
        what each query sees (`BlockDrafterModel.every_block`)."""
        b, total, _ = x.shape
        m, n = anchors.shape[1], total // anchors.shape[1]

        def at_anchors(projected: mx.array, heads: int) -> mx.array:  # each block rotated from its anchor
            blocks = projected.reshape(b * m, n, heads, -1).transpose(0, 2, 1, 3)
            rotated = rope(blocks, offset=anchors.reshape(-1))
            return rotated.reshape(b, m, heads, n, -1).transpose(0, 2, 1, 3, 4).reshape(b, heads, total, -1)

        queries = at_anchors(self.q_norm(self.q_proj(x).reshape(b, total, self.heads, -1)), self.heads)
        keys = mx.concatenate([rope(self.k_norm(self.split(self.k_proj(context), self.kv_heads))),
                               at_anchors(self.k_norm(self.k_proj(x).reshape(b, total, self.kv_heads, -1)),
                                          self.kv_heads)], axis=2)
        values = mx.concatenate([self.split(self.v_proj(context), self.kv_heads), self.split(self.v_proj(x),
                                                                                           self.kv_heads)], axis=2)
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, total, -1))

    def over_rows(self, x: mx.array, rope, keys: mx.array, values: mx.array, positions: mx.array, at: mx.array,
                  lengths: mx.array) -> mx.array:
        """x (B, n, H): each row's block from its position at[i], its first lengths[i] positions its own (the rest
        padding no query of its own sees), after its context: keys and values (B, KV heads, S, D) at `positions`
        (B, S; -1: a hole); what `__call__` gives each row alone."""
        n = x.shape[1]
        queries = rope(self.q_norm(self.split(self.q_proj(x), self.heads)), offset=at)
        block_keys, block_values = self.project(x, rope, at)
        keys, values = mx.concatenate([keys, block_keys], axis=2), mx.concatenate([values, block_values], axis=2)
        query = at[:, None] + mx.arange(n)[None]  # (B, n)
        key = mx.concatenate([positions, query], axis=1)  # (B, S + n)
        sees = mx.concatenate([positions >= 0, mx.arange(n)[None] < lengths[:, None]], axis=1)[:, None]
        if self.seen is not None:  # the last `seen` context positions, or within the query's moving window
            sees = sees & (key >= (at - self.seen)[:, None])[:, None]
            if self.window_moves:
                sees = sees & (mx.abs(query[:, :, None] - key[:, None]) <= self.seen)
        if self.causal:
            sees = sees & (key[:, None] <= query[:, :, None])
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=sees[:, None])
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1))

    def __call__(self, x: mx.array, rope, cache, at: int) -> mx.array:
        """x (B, n, H): the block, from position `at`, after the context in `cache` (its K/V join the cache: the
        model takes them out again)."""
        b, n, _ = x.shape
        queries = rope(self.q_norm(self.split(self.q_proj(x), self.heads)), offset=at)
        keys = rope(self.k_norm(self.split(self.k_proj(x), self.kv_heads)), offset=at)
        values = self.split(self.v_proj(x), self.kv_heads)
        keys, values = cache.update_and_fetch(keys, values)  # written after the context, not a copy of it
        if self.seen is not None:
            keys, values = keys[:, :, -(self.seen + n):], values[:, :, -(self.seen + n):]
        mask, moving = None, self.seen is not None and self.window_moves
        if self.causal or moving:  # query i sees the keys up to its own, or within its moving window, or both
            key, query = mx.arange(keys.shape[2])[None], mx.arange(n)[:, None] + keys.shape[2] - n
            mask = key <= query if self.causal else mx.full((n, keys.shape[2]), True)
            if moving:
                mask = mask & (mx.abs(query - key) <= self.seen)
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(hidden, intermediate, bias=False), nn.Linear(hidden, intermediate,
                                                                                              bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DynamicConv(nn.Module):
    """DFlash2's grouped dynamic causal convolution along the block: each position mixes itself and the K - 1
    before it, per group of channels, with a base kernel plus one the position's input computes; `prepare` before
    a sublayer, `finish` (with the second kernel computed then) after it."""

    def __init__(self, hidden: int, kernel: int, group: int):
        super().__init__()
        self.kernel, self.group = kernel, group
        self.base_kernel = mx.zeros((2, kernel, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel * (hidden // group), bias=False)

    def mix(self, x: mx.array, dynamic: mx.array, base: mx.array) -> mx.array:
        """x (B, n, H); dynamic (B, n, K, G); base (K, H): sum over offsets o of (base[o] + dynamic[o]) x[t - o]."""
        b, n, h = x.shape
        groups = x.reshape(b, n, h // self.group, self.group)
        out = mx.zeros_like(groups)
        for o in range(self.kernel):
            shifted = mx.pad(groups[:, :n - o], [(0, 0), (o, 0), (0, 0), (0, 0)]) if o else groups
            out = out + (base[o].reshape(h // self.group, self.group) + dynamic[:, :, o, :, None]) * shifted
        return out.reshape(b, n, h)

    def prepare(self, x: mx.array) -> tuple[mx.array, mx.array]:
        dynamic = self.kernel_projection(x).reshape(*x.shape[:2], 2, self.kernel, -1)
        return self.mix(x, dynamic[:, :, 0], self.base_kernel[0]), dynamic[:, :, 1]

    def finish(self, x: mx.array, dynamic: mx.array) -> mx.array:
        return self.mix(x, dynamic, self.base_kernel[1])


class BlockLayer(nn.Module):
    def __init__(self, c: dict, sliding: bool, causal: bool):
        super().__init__()
        self.self_attn, self.mlp = BlockAttention(c, sliding, causal), MLP(c["hidden_size"], c["intermediate_size"])
        self.input_layernorm = nn.RMSNorm(c["hidden_size"], eps=c["eps"])
        self.post_attention_layernorm = nn.RMSNorm(c["hidden_size"], eps=c["eps"])
        if c["conv"]:
            self.attention_conv, self.mlp_conv = (DynamicConv(c["hidden_size"], *c["conv"]) for _ in range(2))

    def __call__(self, x: mx.array, attend: Callable[[BlockAttention, mx.array], mx.array]) -> mx.array:
        """attend(self_attn, y): the attention's output for y over the context as the caller holds it (a cache,
        a batch's rows, training's whole sequence)."""
        if "attention_conv" not in self:
            h = x + attend(self.self_attn, self.input_layernorm(x))
            return h + self.mlp(self.post_attention_layernorm(h))
        mixed, kernel = self.attention_conv.prepare(self.input_layernorm(x))
        h = x + self.attention_conv.finish(attend(self.self_attn, mixed), kernel)
        mixed, kernel = self.mlp_conv.prepare(self.post_attention_layernorm(h))
        return h + self.mlp_conv.finish(self.mlp(mixed), kernel)


class Markov(nn.Module):
    def __init__(self, vocab: int, rank: int, draft_vocab: int):
        super().__init__()
        self.markov_w1, self.markov_w2 = nn.Embedding(vocab, rank), nn.Linear(rank, draft_vocab, bias=False)

    def __call__(self, previous: mx.array) -> mx.array:
        """The bias (n, D: the drafter's vocabulary) on the logits of the positions after the tokens `previous`
        (n,: the target's vocabulary)."""
        return self.markov_w2(self.markov_w1(previous))


class CandidateSelector(nn.Module):
    """DFlash2's draft distribution at a position: over the `top` tokens the block's logits rank highest there,
    their logit plus a low-rank edge score <predecessor code, projected hidden state, successor code>, the
    predecessor being the token drafted before (the anchor before the first)."""

    def __init__(self, vocab: int, hidden: int, rank: int, top: int):
        super().__init__()
        self.top = top
        self.predecessor_codebook, self.successor_codebook = nn.Embedding(vocab, rank), nn.Embedding(vocab, rank)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def candidates(self, logits: mx.array, hidden: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """(candidate ids (n, top), their logits, the projected hidden states (n, rank)) for a block's n positions."""
        ids = mx.argpartition(logits, -self.top, axis=-1)[:, -self.top:]
        return ids, mx.take_along_axis(logits, ids, axis=-1), self.hidden_projection(hidden)

    def __call__(self, previous: mx.array, ids: mx.array, unary: mx.array, projected: mx.array,
                 vocab: int) -> mx.array:
        """Logits (1, V) at one position after the token `previous` (1,): -inf outside its candidates."""
        edges = (self.predecessor_codebook(previous) * projected * self.successor_codebook(ids)).sum(axis=-1)
        logits = mx.full((1, vocab), -mx.inf, dtype=unary.dtype)
        logits[0, ids] = unary + edges
        return logits


class Confidence(nn.Module):
    """DSpark's estimate of each draft position's acceptance from its hidden state (and the Markov code of the
    token drafted before it)."""

    def __init__(self, hidden: int, rank: int, with_markov: bool):
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(hidden + (rank if with_markov else 0), 1)

    def __call__(self, hidden: mx.array, previous_codes: mx.array) -> mx.array:
        features = mx.concatenate([hidden, previous_codes], axis=-1) if self.with_markov else hidden
        return mx.sigmoid(self.proj(features)[..., 0].astype(mx.float32))


class BlockDrafterModel(nn.Module):
    def __init__(self, c: dict, own_embedding: bool, own_head: bool):
        super().__init__()
        self.config, h = c, c["hidden_size"]
        self.fc = nn.Linear(len(c["target_layer_ids"]) * h, h, bias=False)
        self.hidden_norm, self.norm = nn.RMSNorm(h, eps=c["eps"]), nn.RMSNorm(h, eps=c["eps"])
        self.layers = [BlockLayer(c, sliding, causal) for sliding, causal in zip(c["sliding"], c["causal"])]
        self.rope = compat.rope(c["head_dim"], c["rope_theta"], c["traditional"], c["rope_scaling"],
                                c["max_positions"])
        if c["markov_rank"]:
            self.markov_head = Markov(c["vocab_size"], c["markov_rank"], c["draft_vocab"])
        if c["confidence"][0]:
            self.confidence_head = Confidence(h, c["markov_rank"], c["confidence"][1])
        if c["selector"]:
            self.candidate_selector = CandidateSelector(c["vocab_size"], h, *c["selector"])
        if own_embedding:
            self.embed_tokens = nn.Embedding(c["vocab_size"], h)
        if own_head:
            self.lm_head = nn.Linear(h, c["draft_vocab"], bias=False)
        self._to_target = None  # a reduced vocabulary's map (`map_vocabulary`)

    def map_vocabulary(self, d2t: mx.array) -> None:
        """Target id = draft id + d2t[draft id]; tokens outside the draft vocabulary score -inf."""
        self._to_target = target_rows(d2t, self.config["vocab_size"])

    def to_target(self, scores: mx.array) -> mx.array:
        """Scores over the drafter's vocabulary (n, D) as scores over the target's (n, V)."""
        return scores if self._to_target is None else to_target_vocabulary(scores, self._to_target)

    def make_cache(self) -> list:
        """Every layer keeps every context position (a sliding one reads the last of them)."""
        return compat.plain_kv_caches(len(self.layers))

    def context_kv(self, features: mx.array, start) -> list[tuple[mx.array, mx.array]]:
        """Each layer's keys and values (B, KV heads, S, D) of the target's `features` (B, S, F) at positions start
        .. start + S - 1 (`start`: an int, or (B,), each row's)."""
        context = self.hidden_norm(self.fc(features))
        return [layer.self_attn.project(context, self.rope, start) for layer in self.layers]

    def extend(self, features: mx.array, cache: list, start: int) -> None:
        """Append the target's `features` (B, S, F) at positions start .. start + S - 1 to the context."""
        for layer_cache, (keys, values) in zip(cache, self.context_kv(features, start)):
            layer_cache.update_and_fetch(keys, values)

    def __call__(self, block: mx.array, cache: list, at: int) -> mx.array:
        """The final hidden states (B, n, H) of `block` (B, n, H: embedded) at positions at .. at + n - 1, after
        the context in `cache`."""
        for layer, layer_cache in zip(self.layers, cache):
            block = layer(block, lambda attention, x, c=layer_cache: attention(x, self.rope, c, at))
        rollback(cache, block.shape[1], block.shape[1])  # the cache holds context only
        return self.norm(block)

    def over_rows(self, block: mx.array, context: list[tuple[mx.array, mx.array]], positions: mx.array,
                  at: mx.array, lengths: mx.array) -> mx.array:
        """The final hidden states (B, n, H) of each row's block (`block` (B, n, H): embedded; row i's first
        lengths[i] positions, from position at[i]) after its context: each layer's keys and values (B, KV heads,
        S, D) at `positions` (B, S; -1: a hole)."""
        for layer, (keys, values) in zip(self.layers, context):
            block = layer(block, lambda attention, x, k=keys, v=values: attention.over_rows(
                x, self.rope, k, v, positions, at, lengths))
        return self.norm(block)

    def every_block(self, features: mx.array, blocks: mx.array, anchors: mx.array) -> mx.array:
        """Training's forward: the final hidden states (B, m, n, H) of m blocks at once (`blocks` (B, m, n, H),
        embedded), block j at positions anchors[:, j] .. + n - 1 after the context `features`[:, :anchors[:, j]]
        (B, L, F): what `extend` then `__call__` give at each anchor, for drafters of full-attention layers."""
        b, m, n, h = blocks.shape
        context, length = self.hidden_norm(self.fc(features)), features.shape[1]
        sees_context = mx.broadcast_to(mx.arange(length) < anchors[:, :, None, None], (b, m, n, length))
        same_block = mx.broadcast_to(mx.repeat(mx.repeat(mx.eye(m, dtype=mx.bool_), n, 0), n, 1), (b, m * n, m * n))
        mask = mx.concatenate([sees_context.reshape(b, m * n, length), same_block], axis=-1)[:, None]
        x = blocks.reshape(b, m * n, h)
        for layer in self.layers:
            x = layer(x, lambda attention, y: attention.every_block(y, context, self.rope, anchors, mask))
        return self.norm(x).reshape(b, m, n, h)


def quantize(model: BlockDrafterModel, group_size: int, bits: int) -> None:
    """Quantize the drafter's linear maps and embeddings whose width the group size divides (the rest, and the
    norms, stay float), as `convert -q` writes it and loading reads it back."""
    nn.quantize(model, group_size=group_size, bits=bits,
                class_predicate=lambda _, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % group_size == 0)


def load_block_drafter(path: Path, config: dict) -> BlockDrafterModel:
    """The block drafter in `path` (`config`: its config.json)."""
    c = read_config(config, path)
    weights = {k.removeprefix("model."): v for k, v in read_safetensors(path, "a block drafter").items()
               if k != "t2d" and not k.startswith("verifier_")}  # speculators' training-only tensors
    weights = {k + ".weight" if k.endswith("_codebook") else k: v for k, v in weights.items()}  # DFlash2's
    d2t = weights.pop("d2t", None)
    own_head = "lm_head.weight" in weights or c["draft_vocab"] != c["vocab_size"]
    model = BlockDrafterModel(c, "embed_tokens.weight" in weights, own_head)
    if quantization := config.get("quantization"):
        quantize(model, quantization["group_size"], quantization["bits"])
    load_exactly(model, weights, f"{path}: the weights do not fit the {c['kind']} drafter its config.json describes "
                                 "({}): re-download the drafter")
    if c["draft_vocab"] != c["vocab_size"]:
        if d2t is None or d2t.shape != (c["draft_vocab"],):
            raise SpecError(f"{path}: a draft vocabulary of {c['draft_vocab']} tokens needs a d2t map of that length: "
                            "re-download the drafter")
        model.map_vocabulary(d2t)
    return model
