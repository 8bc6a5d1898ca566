"""Rollback leaves every cache type exactly as if the rolled-back positions had never been processed."""

import random

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, RotatingKVCache
from mlx_lm.utils import load

from mlx_spec.seams.caches import rollback
from mlx_spec.seams.compat import write_index
from mlx_spec.seams.errors import SpecError
from mlx_spec.runners.target import MAX_DRAFT_LEN, Target


@pytest.mark.parametrize("family,kv_bits", [("gemma3", None), ("qwen3", None), ("llama", 8), ("qwen3_5", None),
                                           ("nemotron_h", None)])  # Mamba 2 layers: replayed for a rollback
def test_random_forward_and_rollback_match_a_fresh_forward(tiny, family, kv_bits):
    """Forwards of one block of tokens (as a verify runs) or of single tokens one after another (as a draft model
    drafts: all of them after the first 20), each followed by a rollback of any number of its positions but the
    first; on the sliding-window model, rollbacks of several positions across the ring buffer's wrap."""
    model, _ = load(str(tiny[family]))
    target = Target(model, kv_bits=kv_bits, kv_group_size=32)
    # the verify pass computes Gated DeltaNet states in chunked form (Mamba 2's over several positions too), mlx-lm
    # step by step: equal to float32 rounding, which the states carried from round to round accumulate to ~1e-5
    atol = 1e-3 if family in ("qwen3_5", "nemotron_h") else 2e-4
    rng = random.Random(0)
    context = [rng.randrange(300) for _ in range(5)]
    target.prefill(context)
    wrapped = across_the_wrap = 0
    for i in range(60):
        one_by_one = i >= 20 or rng.random() < 0.5
        tokens = [rng.randrange(300) for _ in range(rng.choice([4, 6] if i >= 20 else [1, 2, 4, 6]))]
        if one_by_one:
            logits = mx.concatenate([target.forward([token]).logits for token in tokens])
        else:
            logits = target.forward(tokens).logits
        undo = rng.randrange(len(tokens))
        # a ring buffer that wrapped within these tokens: roll back past its first slot
        since_wrap = [write_index(c) for c in target.cache if isinstance(c, RotatingKVCache)
                      and c.keys.shape[2] == c.max_size and c.offset > c.max_size and write_index(c) < len(tokens) - 1]
        if since_wrap:
            undo = rng.randrange(max(since_wrap) + 1, len(tokens))
            across_the_wrap += 1
        target.rollback(undo)
        context += tokens[: len(tokens) - undo]
        fresh_target = Target(model, kv_bits=kv_bits, kv_group_size=32)
        fresh = fresh_target.forward(context).logits[-(len(tokens) - undo):]
        np.testing.assert_allclose(np.array(logits[: len(tokens) - undo]), np.array(fresh), atol=atol)
        probe = rng.randrange(300)
        after_rollback = target.forward([probe]).logits
        np.testing.assert_allclose(np.array(after_rollback), np.array(fresh_target.forward([probe]).logits),
                                   atol=atol)
        target.rollback(1)
        assert target.offset == len(context)
        wrapped += any(isinstance(c, RotatingKVCache) and c.offset > c.max_size for c in target.cache)
    assert bool(wrapped) == (family == "gemma3")  # the sliding window was passed many times over
    assert across_the_wrap >= (2 if family == "gemma3" else 0)


def test_sliding_window_cache_keeps_its_window(tiny):
    model, _ = load(str(tiny["gemma3"]))
    window = model.args.sliding_window
    sizes = {c.max_size for c in Target(model).cache if isinstance(c, RotatingKVCache)}
    assert sizes == {window + MAX_DRAFT_LEN + 1}


def test_rollback_beyond_the_slack_is_an_error(tiny):
    model, _ = load(str(tiny["gemma3"]))
    target = Target(model)
    target.prefill(list(range(100)))
    with pytest.raises(SpecError, match="cannot roll back"):
        target.rollback(MAX_DRAFT_LEN + 2)


def test_untrimmable_cache_is_an_error_not_a_no_op():
    cache = [ArraysCache(size=2)]
    cache[0][0] = mx.zeros((1, 3, 8))
    with pytest.raises(SpecError, match="ArraysCache"):
        rollback(cache, 1, slack=4)


@pytest.mark.parametrize("family", ["gemma3", "llama", "qwen3_5"])
def test_draft_model_cache_holds_exactly_the_accepted_context(tiny, family):
    """After many rounds with rejections, the draft model's cache equals a fresh prefill of what it claims."""
    from helpers import PROMPT

    import mlx_spec

    engine = mlx_spec.load(str(tiny[family]), draft_model=str(tiny[f"{family}-draft"]), draft_len=4)
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=120, temperature=1.0, seed=1)
    drafter = engine.drafter
    assert 0 < result.stats.accepted < result.stats.drafted
    context = (ids + result.tokens)[: drafter.runner.offset]
    assert drafter.context[: drafter.runner.offset] == context and drafter.runner.offset > 100
    fresh = Target(drafter.runner.model)
    probe = [7]
    np.testing.assert_allclose(np.array(drafter.runner.forward(probe).logits),
                               np.array(fresh.forward(context + probe).logits[-1:]), atol=2e-4)


def test_gated_delta_step_matches_mlx_lm_reference():
    from mlx_lm.models.gated_delta import _gated_delta_step_ops

    from mlx_spec.models.qwen3_5 import gated_delta_step

    mx.random.seed(0)
    q, k = mx.random.normal((1, 4, 16)), mx.random.normal((1, 4, 16))
    v, state = mx.random.normal((1, 4, 8)), mx.random.normal((1, 4, 8, 16))
    g, beta = mx.random.uniform(shape=(1, 4)), mx.random.uniform(shape=(1, 4))
    for ours, reference in zip(gated_delta_step(q, k, v, g, beta, state),
                               _gated_delta_step_ops(q, k, v, g, beta, state)):
        np.testing.assert_allclose(np.array(ours), np.array(reference), atol=1e-5)
