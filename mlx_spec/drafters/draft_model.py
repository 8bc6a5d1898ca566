"""A separate, smaller model of the same vocabulary that drafts autoregressively with its own cache."""

from __future__ import annotations

import mlx.core as mx

from ..sampling import SamplingParams, distributions, greedy_tokens, sample
from ..target import Step, Target
from . import Draft


class DraftModelDrafter:
    name = "draft-model"

    def __init__(self, model, vocab_size: int, kv_bits: int | None = None, kv_group_size: int = 64):
        self.runner = Target(model, kv_bits, kv_group_size)
        self.vocab_size = vocab_size  # the target's: padded vocabularies may differ by a few rows

    def _logits(self, tokens) -> mx.array:
        logits = self.runner.forward(tokens).logits[-1:]
        width = logits.shape[-1]
        if width > self.vocab_size:
            return logits[:, : self.vocab_size]
        if width < self.vocab_size:
            return mx.pad(logits, [(0, 0), (0, self.vocab_size - width)], constant_values=-mx.inf)
        return logits

    def begin(self, context: list[int]) -> None:
        self.runner.reset()
        self.runner.prefill(context[:-1])
        self.cached = len(context) - 1  # context[:cached] is in the draft cache
        self.proposed_from = self.cached

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        self.proposed_from = len(context)
        if k == 0:
            return Draft.empty()
        logits = self._logits(context[self.cached:])
        tokens, dists = [], []
        for i, step_key in enumerate(mx.random.split(key, k)):
            drafted = mx.concatenate(tokens) if tokens else None
            if params.greedy:  # deterministic draft: q is one-hot, so none is kept
                tokens.append(greedy_tokens(logits, params, context, drafted, start=i))
            else:
                dists.append(distributions(logits, params, context, drafted, start=i))
                tokens.append(sample(dists[-1], step_key))
            mx.async_eval(tokens[-1])  # start computing while the next step's graph is built
            if i < k - 1:
                logits = self._logits(tokens[-1])
        self.cached = len(context) + k - 1  # the last draft was never fed
        return Draft(mx.concatenate(tokens).astype(mx.int32), mx.concatenate(dists) if dists else None)

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        valid = min(self.cached, self.proposed_from + accepted)
        self.runner.rollback(self.cached - valid)
        self.cached = valid
