"""Qwen3.5 / 3.6 hybrid models: Gated DeltaNet layers that keep the state after every verified position,
and the built-in MTP layer that mlx-lm drops.

mlx-lm's `GatedDeltaNet` returns only the final recurrent state, so a rejected draft could only be undone by
replaying the accepted tokens. `CapturingGatedDeltaNet` is the same layer (same weights, same function:
mlx-lm's own projections and `normalize_qk`, its conv and gated delta recurrence in equivalent forms, equal to
float32 rounding) that, when its cache asks, also keeps the conv inputs and the recurrent state after each
position of a multi-token forward. Rollback then picks the state of the last accepted position (see
`caches.RecurrentCache`). Single-token steps and prefill run mlx-lm's own code unchanged.

The multi-token recurrence is computed in chunked form (`recurrence_with_states`: a few small matmuls instead
of one pass over the state per token; `recurrence_steps` is the step-by-step reference), the same ops on every
device; the state after each position is a lazy expression that MLX only computes for the position kept.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import qwen3_5, qwen3_next
from mlx_lm.models.base import create_attention_mask, gather_last_axis
from mlx_lm.models.gated_delta import compute_g, normalize_qk

from ..seams.caches import RecurrentCache
from ..seams.compat import swap_class
from ..seams.errors import SpecError
from .common import load_exactly, load_weights


@mx.compile
def gated_delta_step(q, k, v, g, beta, state):
    """One step of the gated delta rule, the algebra of mlx-lm's `_gated_delta_step_ops` with its two
    reductions as matrix-vector products (g * (S @ k) == (g * S) @ k): less memory traffic per step."""
    kv_mem = (state @ k[..., None])[..., 0] * g[..., None]
    delta = (v - kv_mem) * beta[..., None]
    state = state * g[..., None, None] + delta[..., None] * k[..., None, :]
    return (state @ q[..., None])[..., 0].astype(q.dtype), state


def recurrence_steps(q, k, v, a, b, A_log, dt_bias, state):
    """mlx-lm's gated delta recurrence (`gated_delta_ops`) step by step, also returning the state after each
    step: the reference for `recurrence_with_states`."""
    beta, g = mx.sigmoid(b), compute_g(A_log, a, dt_bias)
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if state is None:
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    if Hv // Hk > 1:
        q, k = mx.repeat(q, Hv // Hk, -2), mx.repeat(k, Hv // Hk, -2)
    ys, states = [], []
    for t in range(T):
        y, state = gated_delta_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
        ys.append(y)
        states.append(state)
    return mx.stack(ys, axis=1), states


@lru_cache(maxsize=None)
def _masks(T: int):
    """Causal (i <= t) and strict (i < t) masks, and per doubling level s = 1, 2, 4, ... the blocks below the
    diagonal inside each 2s-block: (t, i) with t // 2s == i // 2s and t // s > i // s."""
    t, i = np.arange(T)[:, None], np.arange(T)[None, :]
    sizes = 2 ** np.arange((T - 1).bit_length())
    levels = [mx.array((t // (2 * s) == i // (2 * s)) & (t // s > i // s)) for s in sizes]
    return mx.array(t >= i), mx.array(t > i), levels


@mx.compile
def _chunk(q, k, v, a, b, A_log, dt_bias, state):
    """Outputs Y and what the states are made of (U^T, D, gamma, K) for one chunk; see `recurrence_with_states`."""
    T, Hk, Hv, dtype = q.shape[1], q.shape[2], v.shape[2], q.dtype
    beta = mx.sigmoid(b).astype(mx.float32).swapaxes(1, 2)
    log_g = (-mx.exp(A_log.astype(mx.float32)) * nn.softplus(a + dt_bias)).swapaxes(1, 2)  # log of compute_g
    if Hv // Hk > 1:
        q, k = mx.repeat(q, Hv // Hk, -2), mx.repeat(k, Hv // Hk, -2)
    q, k, v = (x.swapaxes(1, 2).astype(mx.float32) for x in (q, k, v))  # per head: (T, Dk), (T, Dv)
    causal, strict, levels = _masks(T)
    # D[t, i] = exp(sum_{i<j<=t} log g_j): segment sums, not differences of a cumulative sum (no cancellation)
    D = mx.exp(mx.where(causal, mx.cumsum(mx.where(strict, log_g[..., None], 0), axis=-2), -mx.inf))
    gamma = mx.exp(mx.cumsum(log_g, axis=-1))[..., None]
    kq = mx.concatenate([k, q], axis=-2)
    KK, QK = mx.split(kq @ k.swapaxes(-1, -2), 2, axis=-2)
    KS, QS = mx.split((state @ mx.contiguous(kq.swapaxes(-1, -2))).swapaxes(-1, -2), 2, axis=-2)  # S_0 read once
    A = mx.where(strict, beta[..., None] * D * KK, 0)
    X = mx.broadcast_to(mx.eye(T), A.shape)  # (I + A)^-1 by block doubling: X <- X - X E_s X
    for level in levels:
        X = X - X @ (A * level) @ X
    U = X @ (beta[..., None] * (v - gamma * KS))
    y = gamma * QS + (D * QK) @ U
    return y.swapaxes(1, 2).astype(dtype), U.swapaxes(-1, -2), D, gamma, k


def recurrence_with_states(q, k, v, a, b, A_log, dt_bias, state):
    """mlx-lm's gated delta recurrence over T tokens, in chunked (WY) form, with the state after each step.

    Per value head, with S (Dv, Dk), g_t = exp(log g_t), the step (`gated_delta_step`) is
        S_t = g_t S_{t-1} + u_t k_t^T,   u_t = beta_t (v_t - g_t S_{t-1} k_t),   y_t = S_t q_t.
    Unrolled from S_0, with D[t, i] = g_{i+1} ... g_t (1 on the diagonal, 0 above) and gamma_t = g_1 ... g_t:
        S_t = gamma_t S_0 + sum_{i<=t} D[t, i] u_i k_i^T
        u_t + beta_t sum_{i<t} D[t, i] (k_t . k_i) u_i = beta_t (v_t - gamma_t S_0 k_t)    (I + A) U = R
        y_t = gamma_t S_0 q_t + sum_{i<=t} D[t, i] (q_t . k_i) u_i             Y = gamma Q S_0^T + (D * Q K^T) U
    A is strictly lower triangular, so (I + A)^-1 comes from ceil(log2 T) block-doubling steps. S_0 is read once;
    each S_t is a lazy rank-T update of S_0 that MLX computes only if it is used (rollback keeps one)."""
    if state is None:
        B, _, Hv, Dv = v.shape
        state = mx.zeros((B, Hv, Dv, q.shape[-1]), dtype=mx.float32)
    y, Ut, D, gamma, k = _chunk(q, k, v, a, b, A_log, dt_bias, state)
    return y, [mx.addmm(gamma[..., t:t + 1, :] * state, Ut * D[..., t:t + 1, :], k) for t in range(q.shape[1])]


@mx.compile
def depthwise_conv_silu(x, weight):
    """silu(conv1d(x)) of the layer's depthwise causal conv (weight (C, K, 1), no bias, no padding) as K
    shifted multiply-adds in float32: MLX's grouped conv makes one tiny product per channel."""
    K = weight.shape[1]
    T = x.shape[1] - K + 1
    w = weight[..., 0].astype(mx.float32)
    out = x[:, :T].astype(mx.float32) * w[:, 0]
    for j in range(1, K):
        out = out + x[:, j:j + T].astype(mx.float32) * w[:, j]
    return nn.silu(out.astype(x.dtype))


class CapturingGDN:
    """Mixed into mlx-lm's GDN layer classes: same computation, and per-position states while capturing."""

    def __call__(self, inputs: mx.array, mask=None, cache=None) -> mx.array:
        if not (isinstance(cache, RecurrentCache) and cache.capture and inputs.shape[1] > 1 and mask is None):
            return super().__call__(inputs, mask, cache)
        B, S, _ = inputs.shape
        mixed_qkv, z, b, a = self.projections(inputs)
        n_keep = self.conv_kernel_size - 1
        conv_state = cache[0] if cache[0] is not None else mx.zeros((B, n_keep, self.conv_dim), inputs.dtype)
        conv_input = mx.concatenate([conv_state, mixed_qkv], axis=1)
        conv_out = depthwise_conv_silu(conv_input, self.conv1d.weight)
        q, k, v = [
            t.reshape(B, S, h, d)
            for t, h, d in zip(mx.split(conv_out, [self.key_dim, 2 * self.key_dim], -1),
                               [self.num_k_heads, self.num_k_heads, self.num_v_heads],
                               [self.head_k_dim, self.head_k_dim, self.head_v_dim])
        ]
        q, k = normalize_qk(q, k, inv_scale=self.head_k_dim**-0.5, eps=1e-6)
        out, states = recurrence_with_states(q, k, v, a, b, self.A_log, self.dt_bias, cache[1])
        cache.record(conv_input, states)
        out = self.out_proj(self.norm(out, z).reshape(B, S, -1))
        if getattr(self, "sharding_group", None) is not None:  # tensor parallel: each rank holds some heads
            out = mx.distributed.all_sum(out, group=self.sharding_group)
        return out


class CapturingGatedDeltaNet(CapturingGDN, qwen3_5.GatedDeltaNet):
    def projections(self, inputs):
        B, S, _ = inputs.shape
        z = self.in_proj_z(inputs).reshape(B, S, self.num_v_heads, self.head_v_dim)
        return self.in_proj_qkv(inputs), z, self.in_proj_b(inputs), self.in_proj_a(inputs)


class CapturingNextGatedDeltaNet(CapturingGDN, qwen3_next.Qwen3NextGatedDeltaNet):
    def projections(self, inputs):
        B, S, _ = inputs.shape
        q, k, v, z, b, a = self.fix_query_key_value_ordering(self.in_proj_qkvz(inputs), self.in_proj_ba(inputs))
        return mx.concatenate([t.reshape(B, S, -1) for t in (q, k, v)], axis=-1), z, b, a


CAPTURING = {qwen3_5.GatedDeltaNet: CapturingGatedDeltaNet,
             qwen3_next.Qwen3NextGatedDeltaNet: CapturingNextGatedDeltaNet}


def install(model) -> bool:
    """Make every Gated DeltaNet layer of `model` a capturing one (in place); True if there were any."""
    found = False
    for layer in getattr(model, "layers", []):
        for plain, capturing in CAPTURING.items():
            if isinstance(getattr(layer, "linear_attn", None), plain):
                swap_class(layer.linear_attn, capturing)
                found = True
    return found


class MTP(nn.Module):
    """Qwen3.5 / 3.6 multi-token prediction layer (`mtp.*`), the reference equations:

        x = fc(concat[pre_fc_norm_embedding(embed(next_token)), pre_fc_norm_hidden(hidden)])
        x = layers[0](x)        one full-attention decoder layer of the target's kind, with its own KV cache
        h = norm(x)             scored by the target's lm_head and fed back as the next `hidden`
    """

    def __init__(self, config: dict):
        """config: the checkpoint's config.json (Qwen3.5 / 3.6 dense or MoE, or Qwen3-Next)."""
        super().__init__()
        if config["model_type"] == "qwen3_next":
            args, layer = qwen3_next.ModelArgs.from_dict(config), qwen3_next.Qwen3NextDecoderLayer
        else:
            args, layer = qwen3_5.TextModelArgs.from_dict(config.get("text_config", config)), qwen3_5.DecoderLayer
        h = args.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(h, eps=args.rms_norm_eps)
        # layer_idx: a full-attention position, so it is gated attention (with the target's MLP or MoE)
        self.layers = [layer(args, layer_idx=args.full_attention_interval - 1)]
        self.norm = nn.RMSNorm(h, eps=args.rms_norm_eps)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        x = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embeddings), self.pre_fc_norm_hidden(hidden)], -1))
        x = self.layers[0](x, mask=create_attention_mask(x, cache[0]), cache=cache[0])
        return self.norm(x)


def text_model(model):
    """The text model that owns the embedding and head (Qwen3.5's inside its multimodal Model, Qwen3-Next's
    Model itself), or None for other architectures."""
    text = getattr(model, "language_model", model)
    return text if isinstance(text, (qwen3_5.TextModel, qwen3_next.Model)) else None


def declared_mtp_layers(config: dict) -> int:
    return config.get("text_config", config).get("mtp_num_hidden_layers", 0)


def read_mtp_tensors(files) -> tuple[dict, bool]:
    """The `mtp.*` tensors of some safetensors files (lazily), and whether they are zero-centred HF originals
    (anything not written by MLX) whose norms still need the 1 + w shift."""
    tensors, zero_centred = {}, False
    for file in files:
        weights, metadata = load_weights(file, return_metadata=True)
        found = {k: v for k, v in weights.items() if k.startswith("mtp.")}
        if found:
            tensors.update(found)
            zero_centred = zero_centred or metadata.get("format") != "mlx"
    return tensors, zero_centred


def build_mtp(config: dict, tensors: dict, zero_centred: bool, quantization: dict | None = None) -> MTP:
    """An MTP layer holding `tensors` (`mtp.*` names); the norm shift is applied here, exactly once."""
    weights = {}
    for key, value in tensors.items():
        key = key[len("mtp."):]
        if zero_centred and value.ndim == 1 and "norm" in key:  # every RMSNorm, pre_fc_norm_* included
            value = value + 1.0
        weights[key] = value
    mtp = MTP(config)
    if quantization:
        nn.quantize(mtp, group_size=quantization["group_size"], bits=quantization["bits"])
    load_exactly(mtp, split_fused_experts(weights, "layers.0.mlp"),
                 "the mtp.* tensors do not fit this model's MTP layer ({})")
    return mtp


def checkpoint_files(path: Path) -> list[Path]:
    """The weight files of a checkpoint: HF shards, and `mtp.safetensors` from `mlx-spec convert`."""
    return sorted(path.glob("model*.safetensors")) + sorted(path.glob("mtp.safetensors"))


def load_mtp(path: Path, config: dict) -> MTP:
    """The MTP layer of a Qwen3.5 checkpoint directory (Hugging Face original or `mlx-spec convert` output)."""
    tensors, zero_centred = read_mtp_tensors(checkpoint_files(path))
    if not tensors:
        raise SpecError(f"{path} holds no mtp.* tensors although its config declares an MTP layer: it was "
                        f"stripped (mlx_lm.convert drops them); add them back with `mlx-spec convert --add-mtp "
                        f"--hf-path ORIGINAL_HF_REPO --mlx-path {path}`")
    return build_mtp(config, tensors, zero_centred, config.get("mtp_quantization"))


def split_fused_experts(weights: dict, prefix: str) -> dict:
    """Qwen3.5-MoE stores experts fused (`experts.gate_up_proj` [E, 2I, H], gate first); mlx-lm's layer wants
    `switch_mlp.{gate,up,down}_proj`. Qwen3-Next stores `experts.{e}.*` per expert, to be stacked."""
    fused = weights.pop(f"{prefix}.experts.gate_up_proj", None)
    if fused is not None:
        mid = fused.shape[-2] // 2
        weights[f"{prefix}.switch_mlp.gate_proj.weight"] = fused[..., :mid, :]
        weights[f"{prefix}.switch_mlp.up_proj.weight"] = fused[..., mid:, :]
        weights[f"{prefix}.switch_mlp.down_proj.weight"] = weights.pop(f"{prefix}.experts.down_proj")
    expert = 0
    while f"{prefix}.experts.{expert}.up_proj.weight" in weights:
        expert += 1
    for name in ("gate_proj", "up_proj", "down_proj") if expert else ():
        weights[f"{prefix}.switch_mlp.{name}.weight"] = mx.stack(
            [weights.pop(f"{prefix}.experts.{e}.{name}.weight") for e in range(expert)])
    return weights


def lm_head(model):
    """The target's output head (the MTP layer has none of its own)."""
    text = text_model(model)
    if text.args.tie_word_embeddings:
        return text.model.embed_tokens.as_linear
    if (group := getattr(text, "sharding_group", None)) is None:
        return text.lm_head
    return lambda x: gather_last_axis(text.lm_head(x), group)  # tensor parallel: each rank scores a vocab slice
