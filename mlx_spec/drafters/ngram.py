"""Prompt-lookup / n-gram drafting: continue the text the way it continued the last time the current
suffix appeared in the prompt or the output. Free: no model, no extra memory beyond an index. With `width` > 1,
the continuations after the `width` latest occurrences, merged into a token tree."""

from __future__ import annotations

import mlx.core as mx

from ..sampling import SamplingParams
from ..target import Step
from . import Draft, RowDrafters


class NgramDrafter:
    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, width: int = 1):
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
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end >= n:
                    ends = self.latest.setdefault(tuple(context[end - n:end]), [])
                    ends.insert(0, end)
                    del ends[self.width:]
        self.indexed = max(self.indexed, len(context) - 1)

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        self._index(context)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            ends = self.latest.get(tuple(context[-n:])) if len(context) > n else None
            if ends:
                return Draft.from_paths([context[end:end + k] for end in ends])
        return Draft.empty()

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        pass
