"""A separate, smaller model of the same vocabulary that drafts autoregressively with its own cache: a chain,
or with `width` > 1 a token tree (`grow_tree`: EAGLE-2's dynamic tree, the draft's own greedy chain kept)."""

from __future__ import annotations

import mlx.core as mx

from ..sampling import SamplingParams
from ..target import Step, Target
from . import Draft, draft_autoregressively, grow_tree


class DraftModelDrafter:
    name = "draft-model"

    def __init__(self, model, vocab_size: int, kv_bits: int | None = None, kv_group_size: int = 64,
                 width: int = 1):
        self.runner = Target(model, kv_bits, kv_group_size)
        self.weights = model
        self.vocab_size = vocab_size  # the target's: padded vocabularies may differ by a few rows
        self.width = width
        self.context: list[int] = []  # the runner's cache holds context[:runner.offset]
        self.tree: Draft | None = None  # the last tree proposed
        self.fed: dict[int, int] = {}  # its nodes that the runner's cache holds -> their place after the context

    def fork(self) -> "DraftModelDrafter":
        """A drafter of its own (cache and all) on the same weights, for another sequence (a batch's row): chains."""
        return DraftModelDrafter(self.weights, self.vocab_size, self.runner.kv_bits, self.runner.kv_group_size)

    @property
    def caches(self) -> list:
        return self.runner.cache

    def _logits(self, tokens, attend=None, positions: list[int] | None = None) -> mx.array:
        logits = self.runner.forward(tokens, attend, positions).logits
        logits = logits if attend is not None else logits[-1:]
        width = logits.shape[-1]
        if width > self.vocab_size:
            return logits[:, : self.vocab_size]
        if width < self.vocab_size:
            return mx.pad(logits, [(0, 0), (0, self.vocab_size - width)], constant_values=-mx.inf)
        return logits

    def begin(self, context: list[int], prompt_step: Step) -> None:
        self.runner.prefill(context[:-1], self.context)  # reuses the prefix it already holds
        self.context, self.proposed_from, self.tree = context, self.runner.offset, None

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        self.proposed_from, self.tree = len(context), None
        if k == 0:
            return Draft.empty()
        first_logits = self._logits(context[self.runner.offset:])
        if self.width == 1:
            return draft_autoregressively(first_logits, self._logits, k, params, context, key)  # the last is not fed
        self.tree = self._expand(first_logits, k, len(context))
        return self.tree

    def _expand(self, logits: mx.array, depth: int, position: int) -> Draft:
        """A tree of `depth` levels; `position`: that of its first level."""
        def score(nodes, tokens, parents, attend, level):
            return self._logits(mx.array([tokens[n] for n in nodes], dtype=mx.int32), attend,
                                [position + level] * len(nodes))
        tree, self.fed = grow_tree(logits, depth, self.width, score)
        return tree

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        if self.tree is None:
            valid = min(self.runner.offset, self.proposed_from + accepted)
            self.runner.rollback(self.runner.offset - valid)
        else:  # keep the accepted path's nodes that the runner has seen
            tokens, node, kept = self.tree.tokens.tolist(), -1, []
            for token in context[len(context) - 1 - accepted:-1]:
                node = next(c for c, p in enumerate(self.tree.parents) if p == node and tokens[c] == token)
                if node in self.fed:
                    kept.append(self.fed[node])
            self.runner.keep(len(self.fed), kept)
        # a round without drafting calls no propose: the runner then holds a prefix of its context as it is
        self.context, self.tree, self.proposed_from = context, None, self.runner.offset
