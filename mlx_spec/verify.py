"""Exact verification of a round of drafts (Leviathan et al. 2022, Chen et al. 2023).

Draft token x_j, drawn from q_j, is accepted with probability min(1, p_j(x_j) / q_j(x_j)); the first rejected
position is resampled from norm(max(0, p_j - q_j)); when all drafts pass, a bonus token comes from p_k. The
emitted tokens are then distributed exactly as sampling the target alone. Deterministic drafts have a one-hot
q; greedy parameters make p one-hot, which turns the rule into "accept while the draft is the argmax".
Everything stays on the device: the caller evaluates `accepted` and `next_token` in one sync.

A token tree (`verify_tree`) is walked from the root on the host, trying each node's children in order with the
multi-candidate rule of SpecInfer / SpecTr for one-hot candidates.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .draft import Draft
from .sampling import SamplingParams, distributions, greedy_tokens, probabilities, sample, tree_penalized


def verify_draft(draft: Draft, logits: mx.array, params: SamplingParams, history: list[int],
                 key: mx.array) -> tuple[mx.array, mx.array]:
    """The target's verdict on a round from its logits over [last, *draft]: (accepted count, next token).

    Greedy: accept while each draft is the target's argmax (what exact verification reduces to, computed
    without (k+1) x V one-hot distributions). Otherwise exact rejection sampling."""
    if params.greedy:
        choice = greedy_tokens(logits, params, history, draft.tokens)
        accepted = mx.cumprod((draft.tokens == choice[:-1]).astype(mx.int32)).sum()
        return accepted, choice[accepted]
    p = distributions(logits, params, history, draft.tokens)
    return verify(draft.tokens, draft.q, p, key)


def verify(draft_tokens: mx.array, q: mx.array | None, p: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
    """draft_tokens (k,), q (k, V) or None for one-hot drafts, p (k+1, V) -> (accepted count, next token)."""
    k = draft_tokens.shape[0]
    accept_key, sample_key = mx.random.split(key)
    if k == 0:
        return mx.array(0), sample(p, sample_key)[0]
    rows = mx.arange(k)
    q = q if q is not None else (mx.arange(p.shape[-1])[None] == draft_tokens[:, None]).astype(p.dtype)
    p_draft, q_draft = p[rows, draft_tokens], q[rows, draft_tokens]
    uniform = mx.random.uniform(shape=(k,), key=accept_key)
    passed = uniform * q_draft < p_draft
    accepted = mx.cumprod(passed.astype(mx.int32)).sum()
    residual = mx.maximum(p[:k] - q, 0.0)
    mass = residual.sum(axis=-1, keepdims=True)
    residual = mx.where(mass > 0, residual / mx.maximum(mass, 1e-30), p[:k])
    candidates = sample(mx.concatenate([residual, p[k:]]), sample_key)
    return accepted, candidates[accepted]


def verify_tree(draft: Draft, logits: mx.array, params: SamplingParams, history: list[int],
                key: mx.array) -> tuple[list[int], list[int]]:
    """The target's verdict on a token tree from its logits over [last, *nodes]: (the accepted path as node
    indices, the tokens to emit: the path's and the next one). At each node of the path, with p' = the target's
    distribution there, each child x in turn is accepted with probability p'(x), else removed from p' (zeroed,
    renormalised); when none is accepted, the next token is drawn from p'. The emitted tokens follow the
    target's distribution exactly; greedy parameters make it "follow the child equal to the argmax"."""
    tokens = draft.tokens.tolist()
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(draft.parents):
        if draft.candidates is None or draft.candidates[node]:
            children.setdefault(parent, []).append(node)
    logits = tree_penalized(logits, params, history, draft.prefixes())
    path, node = [], -1
    if params.greedy:
        choice = mx.argmax(logits, axis=-1).tolist()
        while True:
            child = next((c for c in children.get(node, []) if tokens[c] == choice[node + 1]), None)
            if child is None:
                return path, [tokens[n] for n in path] + [choice[node + 1]]
            path.append(node := child)
    p = np.array(probabilities(logits, params), dtype=np.float64)
    rng = np.random.default_rng(mx.random.randint(0, 2**31 - 1, (2,), key=key).tolist())
    while True:
        residual = p[node + 1] / p[node + 1].sum()  # float32 rows sum to 1 only within 1e-7
        for child in children.get(node, []):
            x = tokens[child]
            if rng.random() < residual[x]:
                path.append(node := child)
                break
            residual[x] = 0.0
            residual /= residual.sum()
        else:
            return path, [tokens[n] for n in path] + [int(rng.choice(len(residual), p=residual))]
