"""A separate, smaller model of the same vocabulary that drafts autoregressively with its own cache."""

from __future__ import annotations

import mlx.core as mx

from ..sampling import SamplingParams
from ..target import Step, Target
from . import Draft, draft_autoregressively


class DraftModelDrafter:
    name = "draft-model"

    def __init__(self, model, vocab_size: int, kv_bits: int | None = None, kv_group_size: int = 64):
        self.runner = Target(model, kv_bits, kv_group_size)
        self.weights = model
        self.vocab_size = vocab_size  # the target's: padded vocabularies may differ by a few rows
        self.context: list[int] = []  # the runner's cache holds context[:runner.offset]

    @property
    def caches(self) -> list:
        return self.runner.cache

    def _logits(self, tokens) -> mx.array:
        logits = self.runner.forward(tokens).logits[-1:]
        width = logits.shape[-1]
        if width > self.vocab_size:
            return logits[:, : self.vocab_size]
        if width < self.vocab_size:
            return mx.pad(logits, [(0, 0), (0, self.vocab_size - width)], constant_values=-mx.inf)
        return logits

    def begin(self, context: list[int], prompt_step: Step) -> None:
        self.runner.prefill(context[:-1], self.context)  # reuses the prefix it already holds
        self.context, self.proposed_from = context, self.runner.offset

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        self.proposed_from = len(context)
        if k == 0:
            return Draft.empty()
        first_logits = self._logits(context[self.runner.offset:])
        return draft_autoregressively(first_logits, self._logits, k, params, context, key)  # the last is not fed

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        valid = min(self.runner.offset, self.proposed_from + accepted)
        self.runner.rollback(self.runner.offset - valid)
        self.context = context
