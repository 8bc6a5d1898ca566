"""Prompt-lookup / n-gram drafting: continue the text the way it continued the last time the current
suffix appeared in the prompt or the output. Free: no model, no extra memory beyond an index. A chain continues
from the latest occurrence of the longest suffix found, down to the last token alone, and where that copy runs
out before k tokens (it reached the end), from the latest occurrence of its own new suffix. With `width` > 1,
the continuations after the `width` latest occurrences of the longest suffix of `min_ngram` tokens or more,
merged into a token tree. In a batch each row drafts as it would alone."""

from __future__ import annotations

import mlx.core as mx

from ..sampling import SamplingParams
from ..target import Step
from . import Draft, RowDrafters


class NgramDrafter:
    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, width: int = 1):
        """min_ngram: the shortest suffix a tree is drafted from (a chain goes down to one token: on a CPU a draft
        costs a tenth of a step, so even the last token's continuation pays)."""
        self.max_ngram, self.min_ngram, self.width = max_ngram, min_ngram, width

    def batched(self, target_batch) -> RowDrafters:
        """Drafting for a batch: an n-gram index of its own per row, chains."""
        return RowDrafters(self.name, lambda: NgramDrafter(self.max_ngram, self.min_ngram))

    def begin(self, context: list[int], prompt_step: Step) -> None:
        self.latest: dict[tuple[int, ...], list[int]] = {}  # n-gram -> ends of its latest occurrences, newest first
        self.indexed = 0  # n-grams ending at or before this position are in `latest`

    def _index(self, context: list[int]) -> None:
        # Index every n-gram ending before the current end, so a lookup of the suffix finds an earlier copy.
        for end in range(self.indexed + 1, len(context)):
            for n in range(1, self.max_ngram + 1):
                if end >= n:
                    ends = self.latest.setdefault(tuple(context[end - n:end]), [])
                    ends.insert(0, end)
                    del ends[self.width:]
        self.indexed = max(self.indexed, len(context) - 1)

    def _ends(self, tail: list[int], shortest: int) -> list[int]:
        """Ends of the latest occurrences of the longest suffix of `tail` indexed, of `shortest` tokens or more."""
        return next((ends for n in range(min(len(tail), self.max_ngram), shortest - 1, -1)
                     if (ends := self.latest.get(tuple(tail[-n:])))), [])

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        """Up to k tokens: a chain as far as the index allows, or a tree of the `width` latest continuations."""
        self._index(context)
        if self.width > 1:
            return Draft.from_paths([context[end:end + k] for end in self._ends(context, self.min_ngram)])
        drafted: list[int] = []
        while len(drafted) < k and (ends := self._ends((context[-self.max_ngram:] + drafted), 1)):
            drafted += context[ends[0]:ends[0] + k - len(drafted)]
        return Draft(mx.array(drafted, dtype=mx.int32))

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        pass
