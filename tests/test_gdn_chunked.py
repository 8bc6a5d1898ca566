"""The chunked Gated DeltaNet recurrence (`recurrence_with_states`) equals the step-by-step one to float32
tolerance, outputs and the state after every position; the capturing layer's conv equals mlx-lm's; greedy MTP
decoding on the hybrids stays lossless."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from helpers import PROMPT, plain_greedy
from mlx_lm.models.gated_delta import normalize_qk

import mlx_spec
from mlx_spec.models.qwen3_5 import depthwise_conv_silu, recurrence_steps, recurrence_with_states


def inputs(T, Hk, Hv, regime, seed=0, D=32, B=2):
    """Realistic scales: q, k through mlx-lm's `normalize_qk`, O(1) values and state. `strong`: log g from
    -1e-4 to -700 (g = 0 in float32) and beta > 0.99; `aligned`: nearly identical keys, beta ~ 1, no decay (the
    triangular system at its least diagonal-dominant)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: mx.array(rng.standard_normal(shape), dtype=mx.float32)  # noqa: E731
    q, k = normal(B, T, Hk, D), normal(B, T, Hk, D)
    a, b, A_log, dt_bias = normal(B, T, Hv), normal(B, T, Hv), normal(Hv), normal(Hv)
    if regime == "strong":
        a, b, A_log = 4 * a, b + 8, A_log + 3
    elif regime == "aligned":
        k = k[:, :1] + 0.02 * k
        a, b = a - 30, b + 8
    q, k = normalize_qk(q, k, inv_scale=D**-0.5, eps=1e-6)
    return q, k, normal(B, T, Hv, D), a, b, A_log, dt_bias, 0.3 * normal(B, Hv, D, D)


def relative_error(ours, reference):
    return float(mx.abs(ours - reference).max() / mx.abs(reference).max())


@pytest.mark.parametrize("regime", ["plain", "strong", "aligned"])
@pytest.mark.parametrize("ratio", [1, 2, 4])
def test_chunked_equals_step_by_step(regime, ratio):
    for T in range(1, 34):
        args = inputs(T, 2, 2 * ratio, regime, seed=T)
        y, states = recurrence_with_states(*args)
        y_ref, states_ref = recurrence_steps(*args)
        assert y.shape == y_ref.shape and y.dtype == y_ref.dtype and len(states) == len(states_ref) == T
        assert relative_error(y, y_ref) < 1e-5, (T, regime)
        for t, (state, reference) in enumerate(zip(states, states_ref)):
            assert state.shape == reference.shape and state.dtype == mx.float32
            assert relative_error(state, reference) < 1e-5, (T, t, regime)


def test_chunked_from_an_empty_state_and_in_bfloat16():
    q, k, v, a, b, A_log, dt_bias, _ = inputs(5, 2, 4, "plain")
    for args in ((q, k, v, a, b, A_log, dt_bias, None),
                 (*(x.astype(mx.bfloat16) for x in (q, k, v, a, b)), A_log, dt_bias, None)):
        (y, states), (y_ref, states_ref) = recurrence_with_states(*args), recurrence_steps(*args)
        assert y.dtype == y_ref.dtype == args[0].dtype
        assert relative_error(y.astype(mx.float32), y_ref.astype(mx.float32)) < 1e-2
        assert relative_error(states[-1], states_ref[-1]) < 1e-5


def test_only_the_kept_state_is_computed():
    """The per-position states are independent lazy expressions: evaluating the outputs computes none of them,
    and evaluating one computes that one (memory grows by one state, not by T)."""
    args = inputs(5, 2, 4, "plain", D=64)
    mx.eval(args)
    y, states = recurrence_with_states(*args)
    size = states[0].nbytes
    before = mx.get_active_memory()
    mx.eval(y)
    after_outputs = mx.get_active_memory()
    mx.eval(states[2])
    assert after_outputs - before < size <= mx.get_active_memory() - after_outputs < 2 * size
    assert relative_error(states[2], recurrence_steps(*args)[1][2]) < 1e-5


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_depthwise_conv_equals_the_layers_conv1d(dtype):
    conv = nn.Conv1d(48, 48, 4, groups=48, bias=False)
    conv.set_dtype(dtype)
    for T in (1, 2, 5, 33):
        x = mx.random.normal((2, 3 + T, 48)).astype(dtype)
        ours, reference = depthwise_conv_silu(x, conv.weight), nn.silu(conv(x))
        assert ours.shape == reference.shape and ours.dtype == reference.dtype
        np.testing.assert_allclose(np.array(ours.astype(mx.float32)), np.array(reference.astype(mx.float32)),
                                   rtol=1e-5, atol=1e-6 if dtype == mx.float32 else 1e-2)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "qwen3_next"])
@pytest.mark.parametrize("draft_len", [1, 4])
def test_greedy_mtp_on_hybrids_equals_plain_decoding(tiny, family, draft_len):
    """MTP layers fitted to the targets' continuations of PROMPT: drafts both accepted and rejected."""
    path = tiny[f"{family}-fitted-mtp"]
    engine = mlx_spec.load(str(path), draft_len=draft_len)
    assert engine.drafter.name == "mtp"
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=60)
    assert result.tokens == plain_greedy(path, ids, 60)
    assert 0 < result.stats.accepted < result.stats.drafted
