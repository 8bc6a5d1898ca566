"""Sampling parameters -> processed probability distributions, the same code for draft and target.

Exact rejection sampling needs the distributions themselves, not a sampler closure: `distributions` turns
raw logits for consecutive positions into the processed p (or q) at each of them.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields

import mlx.core as mx

from ..seams.errors import SpecError

MAX_SEED = 2**64  # mx.random.key takes an unsigned 64-bit seed
LIMIT = 1e6  # sampling runs in float32: values past it (or below 1 / LIMIT) overflow into NaN distributions


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. `temperature == 0` is greedy decoding."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_window: int = 64

    def __post_init__(self):
        for f in fields(self):  # plain Python numbers: mx would wrap a large int to int32 or fail on a huger one
            value, whole = getattr(self, f.name), f.type == "int"
            if isinstance(value, bool) or not isinstance(value, numbers.Integral if whole else numbers.Real):
                raise SpecError(f"{f.name} must be a {'whole ' if whole else ''}number, got {value!r}")
            try:
                object.__setattr__(self, f.name, int(value) if whole else float(value))
            except OverflowError:
                raise SpecError(f"{f.name} is far out of range (a number of {len(str(value))} digits)") from None
        checks = [
            (self.temperature == 0 or 1 / LIMIT <= self.temperature <= LIMIT,
             f"temperature must be 0 (greedy) or between {1 / LIMIT:g} and {LIMIT:g}"),
            (self.top_k >= 0, "top_k must be >= 0 (0 disables it)"),
            (1 / LIMIT <= self.top_p <= 1.0, f"top_p must be in [{1 / LIMIT:g}, 1] (1 disables it)"),
            (0.0 <= self.min_p < 1.0, "min_p must be in [0, 1) (0 disables it)"),
            (1 / LIMIT <= self.repetition_penalty <= LIMIT,
             f"repetition_penalty must be between {1 / LIMIT:g} and {LIMIT:g} (1 disables it)"),
            (abs(self.presence_penalty) <= LIMIT, f"presence_penalty must be between {-LIMIT:g} and {LIMIT:g}"),
            (abs(self.frequency_penalty) <= LIMIT, f"frequency_penalty must be between {-LIMIT:g} and {LIMIT:g}"),
            (self.penalty_window >= 1, "penalty_window must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise SpecError(f"{message}, got {getattr(self, message.split()[0])!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def penalty_counts(history: list[int], drafts: mx.array | None, positions: int, window: int, vocab: int,
                   start: int = 0):
    """Token counts seen by each of `positions` consecutive positions: counts[j] covers the last `window`
    tokens of history + drafts[:start + j] (drafts may be lazy device arrays)."""
    rows = []
    for j in range(start, start + positions):
        n_hist = max(0, window - j)
        past = mx.array(history[-n_hist:] if n_hist else [], dtype=mx.int32)
        if j and drafts is not None:
            past = mx.concatenate([past, drafts[max(0, j - window):j].astype(mx.int32)])
        rows.append(token_counts(past, vocab))
    return mx.stack(rows)


def token_counts(past: mx.array, vocab: int) -> mx.array:
    """(vocab,) float32: how often each token occurs in `past`."""
    return mx.zeros((vocab,), mx.float32).at[past].add(1.0) if past.size else mx.zeros((vocab,))


def apply_penalties(logits: mx.array, counts: mx.array, params: SamplingParams) -> mx.array:
    seen = counts > 0
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        logits = mx.where(seen, mx.where(logits < 0, logits * r, logits / r), logits)
    if params.presence_penalty:
        logits = logits - params.presence_penalty * seen
    if params.frequency_penalty:
        logits = logits - params.frequency_penalty * counts
    return logits


def penalized(logits: mx.array, params: SamplingParams, history: list[int], drafts: mx.array | None = None,
              start: int = 0) -> mx.array:
    """float32 logits after the repetition / presence / frequency penalties (rows as in `distributions`)."""
    logits = logits.astype(mx.float32)
    if not params.has_penalties:
        return logits
    n, vocab = logits.shape
    return apply_penalties(logits, penalty_counts(history, drafts, n, params.penalty_window, vocab, start), params)


def greedy_tokens(logits: mx.array, params: SamplingParams, history: list[int], drafts: mx.array | None = None,
                  start: int = 0) -> mx.array:
    """The argmax token of each row after penalties: temperature-0 decoding without building distributions."""
    return mx.argmax(penalized(logits, params, history, drafts, start), axis=-1).astype(mx.int32)


def tree_penalized(logits: mx.array, params: SamplingParams, history: list[int],
                   prefixes: list[list[int]]) -> mx.array:
    """`penalized` for the nodes of a tree: row i scores the token after history + prefixes[i]."""
    logits = logits.astype(mx.float32)
    if not params.has_penalties:
        return logits
    window, vocab = params.penalty_window, logits.shape[-1]
    rows = []
    for prefix in prefixes:
        past = mx.array((history[-window:] + prefix)[-window:], dtype=mx.int32)
        rows.append(token_counts(past, vocab))
    return apply_penalties(logits, mx.stack(rows), params)


def distributions(logits: mx.array, params: SamplingParams, history: list[int],
                  drafts: mx.array | None = None, start: int = 0) -> mx.array:
    """Processed next-token distributions for consecutive positions.

    logits: (n, V) raw logits; row j scores the token after history + drafts[:start + j].
    Returns (n, V) float32 probabilities. Greedy parameters give one-hot argmax rows.
    """
    return probabilities(penalized(logits, params, history, drafts, start), params)


def probabilities(logits: mx.array, params: SamplingParams) -> mx.array:
    """Penalized float32 logits (n, V) -> distributions after temperature, top-k, top-p and min-p (one-hot
    argmax rows when greedy)."""
    vocab = logits.shape[-1]
    if params.greedy:
        return (mx.arange(vocab)[None] == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32)
    probs = mx.softmax(logits / params.temperature, axis=-1)
    if 0 < params.top_k < vocab:
        kth = mx.sort(probs, axis=-1)[:, vocab - params.top_k][:, None]
        probs = mx.where(probs >= kth, probs, 0.0)
    if params.top_p < 1.0:
        # keep the smallest set of most likely tokens whose mass reaches top_p
        sorted_probs = mx.sort(probs, axis=-1)[:, ::-1]
        mass_before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs
        kept = mass_before < params.top_p * probs.sum(axis=-1, keepdims=True)
        threshold = mx.min(mx.where(kept, sorted_probs, mx.inf), axis=-1, keepdims=True)
        probs = mx.where(probs >= threshold, probs, 0.0)
    if params.min_p > 0:
        probs = mx.where(probs >= params.min_p * probs.max(axis=-1, keepdims=True), probs, 0.0)
    return probs / probs.sum(axis=-1, keepdims=True)


def sample(probs: mx.array, key: mx.array) -> mx.array:
    """One token per row of `probs` (n, V), on the device (no host sync)."""
    return mx.random.categorical(mx.log(probs), axis=-1, key=key)


def token_logprobs(logits: mx.array, tokens: list[int], top: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """For each row of raw logits (n, V) and the token emitted there: (its log-probability under the row's
    softmax, the `top` likeliest (token, log-probability))."""
    logprobs = logits.astype(mx.float32)
    logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logprobs, mx.array(tokens)[:, None], axis=-1)[:, 0].tolist()
    if not top:
        return [(value, []) for value in chosen]
    best = mx.argsort(-logprobs, axis=-1)[:, :top]
    values = mx.take_along_axis(logprobs, best, axis=-1)
    return [(value, list(zip(ids, lps))) for value, ids, lps in zip(chosen, best.tolist(), values.tolist())]
