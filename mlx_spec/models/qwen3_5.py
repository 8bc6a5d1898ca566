"""Qwen3.5 / 3.6 hybrid models: Gated DeltaNet layers that keep the state after every verified position.

mlx-lm's `GatedDeltaNet` returns only the final recurrent state, so a rejected draft could only be undone by
replaying the accepted tokens. `CapturingGatedDeltaNet` is the same layer (same weights, same computation:
mlx-lm's own projections, conv, `normalize_qk`, `compute_g` and per-step recurrence) that, when its cache asks,
also keeps the conv inputs and the recurrent state after each position of a multi-token forward. Rollback
then picks the state of the last accepted position (see `caches.RecurrentCache`). Single-token steps and
prefill run mlx-lm's own code unchanged.

This is the ops path on every device; on Metal it runs the recurrence step by step instead of mlx-lm's fused
kernel (which returns only the final state), which is exact but slower for verification.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import qwen3_5
from mlx_lm.models.gated_delta import _gated_delta_step_ops, compute_g, normalize_qk

from ..caches import RecurrentCache


def recurrence_with_states(q, k, v, a, b, A_log, dt_bias, state):
    """mlx-lm's gated delta recurrence (`gated_delta_ops`), also returning the state after each step."""
    beta, g = mx.sigmoid(b), compute_g(A_log, a, dt_bias)
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if state is None:
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    if Hv // Hk > 1:
        q, k = mx.repeat(q, Hv // Hk, -2), mx.repeat(k, Hv // Hk, -2)
    ys, states = [], []
    for t in range(T):
        y, state = _gated_delta_step_ops(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
        ys.append(y)
        states.append(state)
    return mx.stack(ys, axis=1), states


class CapturingGatedDeltaNet(qwen3_5.GatedDeltaNet):
    def __call__(self, inputs: mx.array, mask=None, cache=None) -> mx.array:
        if not (isinstance(cache, RecurrentCache) and cache.capture and inputs.shape[1] > 1 and mask is None):
            return super().__call__(inputs, mask, cache)
        B, S, _ = inputs.shape
        qkv = self.in_proj_qkv(inputs)
        z = self.in_proj_z(inputs).reshape(B, S, self.num_v_heads, self.head_v_dim)
        b, a = self.in_proj_b(inputs), self.in_proj_a(inputs)
        n_keep = self.conv_kernel_size - 1
        conv_state = cache[0] if cache[0] is not None else mx.zeros((B, n_keep, self.conv_dim), inputs.dtype)
        conv_input = mx.concatenate([conv_state, qkv], axis=1)
        conv_out = nn.silu(self.conv1d(conv_input))
        q, k, v = [
            t.reshape(B, S, h, d)
            for t, h, d in zip(mx.split(conv_out, [self.key_dim, 2 * self.key_dim], -1),
                               [self.num_k_heads, self.num_k_heads, self.num_v_heads],
                               [self.head_k_dim, self.head_k_dim, self.head_v_dim])
        ]
        q, k = normalize_qk(q, k, inv_scale=self.head_k_dim**-0.5, eps=1e-6)
        out, states = recurrence_with_states(q, k, v, a, b, self.A_log, self.dt_bias, cache[1])
        cache.record(conv_input, states)
        return self.out_proj(self.norm(out, z).reshape(B, S, -1))


def install(model) -> bool:
    """Make every Qwen3.5 GDN layer of `model` a capturing one (in place); True if there were any."""
    found = False
    for layer in getattr(model, "layers", []):
        if isinstance(getattr(layer, "linear_attn", None), qwen3_5.GatedDeltaNet):
            layer.linear_attn.__class__ = CapturingGatedDeltaNet
            found = True
    return found
