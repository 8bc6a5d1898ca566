"""Prompt-lookup / n-gram drafting: continue the text the way it continued the last time the current
suffix appeared in the prompt or the output. Free: no model, no extra memory beyond an index. With `width` > 1,
the continuations after the `width` latest occurrences, merged into a token tree. In a batch, a row whose
suffix was not found takes its last token's latest continuation instead (`NgramRows`)."""

from __future__ import annotations

import mlx.core as mx

from ..sampling import SamplingParams
from ..target import Step
from . import Draft, RowDrafters


class NgramDrafter:
    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, width: int = 1, shortest: int | None = None):
        """shortest: the shortest n-grams indexed, for `lookup` (None: min_ngram, the shortest `propose` uses)."""
        self.max_ngram, self.min_ngram, self.width = max_ngram, min_ngram, width
        self.shortest = min_ngram if shortest is None else shortest

    def batched(self, target_batch) -> "NgramRows":
        """Drafting for a batch: an n-gram index of its own per row, chains."""
        return NgramRows(self.name, lambda: NgramDrafter(self.max_ngram, self.min_ngram, shortest=1))

    def begin(self, context: list[int], prompt_step: Step) -> None:
        self.latest: dict[tuple[int, ...], list[int]] = {}  # n-gram -> ends of its latest occurrences, newest first
        self.indexed = 0  # n-grams ending at or before this position are in `latest`

    def _index(self, context: list[int]) -> None:
        # Index every n-gram ending before the current end, so a lookup of the suffix finds an earlier copy.
        for end in range(self.indexed + 1, len(context)):
            for n in range(self.shortest, self.max_ngram + 1):
                if end >= n:
                    ends = self.latest.setdefault(tuple(context[end - n:end]), [])
                    ends.insert(0, end)
                    del ends[self.width:]
        self.indexed = max(self.indexed, len(context) - 1)

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        return self.lookup(context, k, self.min_ngram)

    def lookup(self, context: list[int], k: int, shortest: int) -> Draft:
        """Up to k tokens after the latest occurrences of the longest suffix found, of `shortest` tokens or more
        (at least `self.shortest`)."""
        self._index(context)
        for n in range(self.max_ngram, max(shortest, self.shortest) - 1, -1):
            ends = self.latest.get(tuple(context[-n:])) if len(context) > n else None
            if ends:
                return Draft.from_paths([context[end:end + k] for end in ends])
        return Draft.empty()

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        pass


class NgramRows(RowDrafters):
    """n-gram drafting for a batch. The target's forward gives every row as many inputs as the longest draft, so a
    row whose suffix was not found would run padding there: it drafts its last token's latest continuation
    instead, no longer than the longest draft (a free guess, verified as any draft is). Greedy rows only: a
    sampled row drafts as it would alone, so that its seed gives the same tokens whatever the batch."""

    def propose(self, contexts: list[list[int]], lengths: list[int], params: list[SamplingParams],
                keys: list[mx.array]) -> list[Draft]:
        drafts = super().propose(contexts, lengths, params, keys)
        width = max(d.tokens.shape[0] for d in drafts)
        return [drafter.lookup(context, min(k, width), 1) if width and not d.tokens.shape[0] and p.greedy else d
                for drafter, context, k, p, d in zip(self.rows, contexts, lengths, params, drafts)]
