"""Exact rejection sampling: whatever q is, the emitted token is distributed as p."""

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from mlx_spec.core.sampling import SamplingParams, distributions
from mlx_spec.core.verify import position_keys, verify

V = 8
N = 6000


def normalise(x):
    x = np.asarray(x, dtype=np.float32)
    return x / x.sum()


def run_many(p_first, q_first, draft_tokens_sampler, n=N, k=1, seed=0):
    """Emit the first token of a round n times; return its histogram and the acceptance count."""
    rng = np.random.default_rng(seed)
    p = mx.array(np.stack([p_first] + [normalise(rng.random(V)) for _ in range(k)]))
    q = None if q_first is None else mx.array(np.stack([q_first] * k))
    keys = mx.random.split(mx.random.key(seed), n)  # a sequence's seed per round
    counts, accepted_total = np.zeros(V), 0
    for i in range(n):
        draft = draft_tokens_sampler(rng)
        accepted, next_token = verify(mx.array(draft, dtype=mx.int32), q, p, position_keys(keys[i], 0, k + 1))
        accepted = accepted.item()
        first = draft[0] if accepted > 0 else next_token.item()
        counts[first] += 1
        accepted_total += accepted > 0
    return counts, accepted_total / n


def assert_distributed_as(counts, p):
    support = p > 0
    assert counts[~support].sum() == 0, "emitted a token the target gives probability 0"
    mass = p[support].astype(np.float64)
    expected = mass / mass.sum() * counts.sum()
    assert chisquare(counts[support], expected).pvalue > 1e-3


CASES = {
    "dense p and q": (normalise([5, 1, 1, 3, 2, 8, 1, 4]), normalise([1, 6, 2, 2, 5, 1, 3, 1])),
    "p truncated by top-k, q dense": (normalise([5, 0, 0, 3, 0, 8, 0, 0]), normalise([1, 6, 2, 2, 5, 1, 3, 1])),
    "q truncated by top-p, p dense": (normalise([5, 1, 1, 3, 2, 8, 1, 4]), normalise([0, 6, 0, 2, 5, 0, 0, 0])),
    "disjoint supports": (normalise([5, 0, 0, 3, 0, 0, 0, 0]), normalise([0, 6, 2, 0, 5, 0, 0, 0])),
    "q equals p": (normalise([5, 1, 1, 3, 2, 8, 1, 4]), normalise([5, 1, 1, 3, 2, 8, 1, 4])),
}


@pytest.mark.parametrize("case", CASES)
def test_stochastic_draft_output_follows_p(case):
    p, q = CASES[case]
    counts, acceptance = run_many(p, q, lambda rng: [rng.choice(V, p=q)], k=1)
    assert_distributed_as(counts, p)
    assert acceptance == pytest.approx(np.minimum(p, q).sum(), abs=0.03)  # beta = sum min(p, q)


@pytest.mark.parametrize("token", [5, 1, 6])  # likely, unlikely, impossible under p
def test_deterministic_draft_output_follows_p(token):
    p = normalise([5, 1, 1, 3, 2, 8, 0, 4])
    counts, acceptance = run_many(p, None, lambda rng: [token], k=3)
    assert_distributed_as(counts, p)
    assert acceptance == pytest.approx(p[token], abs=0.03)  # one-hot q: accept with probability p(x)


def test_bonus_token_comes_from_the_last_position():
    p = np.stack([np.eye(V)[2], np.eye(V)[3], normalise([1, 2, 3, 4, 0, 0, 0, 0])])
    counts = np.zeros(V)
    for i in range(3000):
        accepted, nxt = verify(mx.array([2, 3], dtype=mx.int32), None, mx.array(p), position_keys(mx.random.key(i), 0, 3))
        assert accepted.item() == 2
        counts[nxt.item()] += 1
    assert_distributed_as(counts, p[2])


def test_greedy_accepts_exactly_the_argmax_prefix():
    logits = mx.array(np.random.default_rng(0).standard_normal((4, 50)).astype(np.float32))
    p = distributions(logits, SamplingParams(temperature=0), [])
    best = mx.argmax(logits, axis=-1).tolist()
    draft = [best[0], best[1], (best[2] + 1) % 50]
    accepted, nxt = verify(mx.array(draft, dtype=mx.int32), None, p, position_keys(mx.random.key(0), 0, 4))
    assert (accepted.item(), nxt.item()) == (2, best[2])


def test_same_seed_same_result():
    p = mx.array(np.stack([normalise(np.arange(1, V + 1))] * 3))
    q = mx.array(np.stack([normalise(np.arange(V, 0, -1))] * 2))
    runs = {tuple(x.item() for x in verify(mx.array([0, 1], dtype=mx.int32), q, p, position_keys(mx.random.key(7), 0, 3)))
            for _ in range(5)}
    assert len(runs) == 1
