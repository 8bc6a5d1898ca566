"""Exact verification of a round of drafts (Leviathan et al. 2022, Chen et al. 2023).

Draft token x_j, drawn from q_j, is accepted with probability min(1, p_j(x_j) / q_j(x_j)); the first rejected
position is resampled from norm(max(0, p_j - q_j)); when all drafts pass, a bonus token comes from p_k. The
emitted tokens are then distributed exactly as sampling the target alone. Greedy parameters make p one-hot,
which turns the rule into "accept while the draft is the argmax".

The randomness of a sequence's token depends only on its seed and its position (`position_keys`), and the target
draws each position's token y_j ~ p_j by it as plain sampling does. Deterministic drafts (a one-hot q) are
accepted while x_j = y_j, and the first y_j that differs is emitted: the same law as the rule above (x_j passes
with probability p_j(x_j); given it failed, y_j follows p_j without x_j, the residual), and the very tokens plain
sampling with that seed draws, whatever the drafts and draft lengths. Drafts with a dense q keep the rule above.
Everything stays on the device: the caller evaluates `accepted` and `next_token` in one sync.

A token tree (`verify_tree`) is walked from the root on the host by the same draws: at each node, the child equal
to the target's draw is followed (the multi-candidate rule of SpecInfer / SpecTr for one-hot candidates, in law).
"""

from __future__ import annotations

import mlx.core as mx

from .draft import Draft
from .sampling import (
    SamplingParams,
    distributions,
    greedy_tokens,
    probabilities,
    tree_penalized,
)


def position_keys(seed: mx.array, start: int, count: int) -> mx.array:
    """(count, 2): the keys of the tokens at positions start .. start + count - 1 of a sequence sampled from the
    key `seed` (`mx.random.key(seed)`): the position offsets a key derived from it (seeds 2**32 apart differ)."""
    return mx.random.split(seed)[0][None] + mx.array([[start + i, 0] for i in range(count)], dtype=mx.uint32)


def draw(probs: mx.array, keys: mx.array) -> mx.array:
    """One token per row of `probs` (n, V), each by its own key of `keys` (n, 2), on the device."""
    noise = mx.vmap(lambda key: mx.random.gumbel(probs.shape[-1:], key=key))(keys)
    return mx.argmax(mx.log(probs) + noise, axis=-1)


def verify_draft(draft: Draft, logits: mx.array, params: SamplingParams, history: list[int],
                 keys: mx.array) -> tuple[mx.array, mx.array]:
    """The target's verdict on a round from its logits over [last, *draft]: (accepted count, next token).

    Greedy: accept while each draft is the target's argmax (what exact verification reduces to, computed
    without (k+1) x V one-hot distributions). Otherwise `verify`, with the keys of the k + 1 positions."""
    if params.greedy:
        choice = greedy_tokens(logits, params, history, draft.tokens)
        accepted = mx.cumprod((draft.tokens == choice[:-1]).astype(mx.int32)).sum()
        return accepted, choice[accepted]
    p = distributions(logits, params, history, draft.tokens)
    return verify(draft.tokens, draft.q, p, keys)


def verify(draft_tokens: mx.array, q: mx.array | None, p: mx.array, keys: mx.array) -> tuple[mx.array, mx.array]:
    """draft_tokens (k,), q (k, V) or None for one-hot drafts, p (k+1, V), keys (k+1, 2) -> (accepted count,
    next token)."""
    k = draft_tokens.shape[0]
    if q is None:
        drawn = draw(p, keys)  # the target's own token at each position
        accepted = mx.cumprod((draft_tokens == drawn[:k]).astype(mx.int32)).sum()
        return accepted, drawn[accepted]
    accept_keys, residual_keys = mx.vmap(lambda key: mx.random.split(key))(keys[:k]).transpose(1, 0, 2)
    rows = mx.arange(k)
    p_draft, q_draft = p[rows, draft_tokens], q[rows, draft_tokens]
    uniform = mx.vmap(lambda key: mx.random.uniform(key=key))(accept_keys)
    accepted = mx.cumprod((uniform * q_draft < p_draft).astype(mx.int32)).sum()
    residual = mx.maximum(p[:k] - q, 0.0)
    mass = residual.sum(axis=-1, keepdims=True)
    residual = mx.where(mass > 0, residual / mx.maximum(mass, 1e-30), p[:k])
    return accepted, mx.concatenate([draw(residual, residual_keys), draw(p[k:], keys[k:])])[accepted]


def verify_tree(draft: Draft, logits: mx.array, params: SamplingParams, history: list[int],
                keys: mx.array) -> tuple[list[int], list[int]]:
    """The target's verdict on a token tree from its logits over [last, *nodes], with `keys` those of the
    positions from the first to emit to the deepest node's next: (the accepted path as node indices, the tokens
    to emit: the path's and the next one). From the root, the child equal to the target's draw at its parent
    (greedy: the argmax) is followed; the first draw no child equals is emitted. In law this is SpecInfer's rule
    for one-hot candidates (each child in turn accepted with the probability p' gives it, else removed from p')."""
    return walk_tree(draft, tree_draws(draft, logits, params, history, keys).tolist())


def tree_draws(draft: Draft, logits: mx.array, params: SamplingParams, history: list[int],
               keys: mx.array) -> mx.array:
    """The target's draw at the root and at every node of a tree (`verify_tree`'s arguments), lazy."""
    logits = tree_penalized(logits, params, history, draft.prefixes())
    if params.greedy:
        return mx.argmax(logits, axis=-1)
    return draw(probabilities(logits, params), keys[mx.array([0, *draft.depths()])])


def walk_tree(draft: Draft, choice: list[int]) -> tuple[list[int], list[int]]:
    """`verify_tree`'s walk from the root along the children its draws (`tree_draws`, on the host) equal."""
    tokens = draft.tokens.tolist()
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(draft.parents):
        if draft.candidates is None or draft.candidates[node]:
            children.setdefault(parent, []).append(node)
    path, node = [], -1
    while True:
        child = next((c for c in children.get(node, []) if tokens[c] == choice[node + 1]), None)
        if child is None:
            return path, [tokens[n] for n in path] + [choice[node + 1]]
        path.append(node := child)
