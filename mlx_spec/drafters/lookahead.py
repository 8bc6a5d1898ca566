"""Lookahead decoding (Fu et al., 2024): no draft model and no extra weights.

Every round's target forward also runs a lookahead branch: a window of `window` columns, each a Jacobi-iteration
trajectory of k levels (k: the round's draft length, i.e. n-grams of k + 1 tokens). Column i reads the last
token, then the window's first level up to column i, then its own levels 1..k-1, at positions offset + i + level:
a chain, so the whole branch is a token tree that the engine's tree forward runs as it is. What the target
predicts at the end of each column becomes the window's newest level, and each column's diagonal (the token it
had, then its levels) an n-gram in the pool, which starts with the prompt's own n-grams (the reference
implementation's POOL_FROM_PROMPT) and keeps each round's verified text in front. Up to `ngrams` pool n-grams
that start with the last token are the round's candidates, verified with the rest of the tree; only they can be
accepted, so the output is exactly the target's, the lookahead branch only predicts. The tree never exceeds
MAX_DRAFT_LEN nodes: a long round narrows its window and takes fewer candidates.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core.sampling import SamplingParams
from ..runners.target import MAX_DRAFT_LEN, Step
from ..seams.errors import SpecError
from .protocol import Draft, Drafter, Kind, RowDrafters

PROMPT_NGRAM = 8  # tokens after the first of the prompt's n-grams in the pool (a round uses its draft length)


class LookaheadDrafter(Drafter):
    name = "lookahead"
    trees = True

    def __init__(self, window: int = 4, ngrams: int = 4):
        """window: W, the Jacobi trajectories run each round; ngrams: G, the most candidates verified."""
        self.window, self.ngrams = window, ngrams
        self.shape = f"trees of {window} trajectories and up to {ngrams} pool n-grams"

    def batched(self, target_batch) -> RowDrafters:
        """Drafting for a batch: a window and pool of its own per row, each learning from its row's tree."""
        return RowDrafters(self.name, lambda: LookaheadDrafter(self.window, self.ngrams))

    def begin(self, context: list[int], prompt_step: Step) -> None:
        rng = np.random.default_rng(len(context))  # the first guesses: tokens of the prompt
        self.levels = [rng.choice(context, self.window).tolist()]  # the window, oldest level first
        self.pool: dict[int, list[tuple[int, ...]]] = {}  # first token -> its n-grams' rest, newest first
        for start in range(len(context) - 1):
            self.remember(context[start], context[start + 1:start + 1 + PROMPT_NGRAM])
        self.ends: list[int] = []  # the node at the end of each column of the last round's tree
        self.lookups = self.hits = 0

    def sizes(self, k: int) -> tuple[int, int]:
        """(columns, candidates) for draft length k within MAX_DRAFT_LEN nodes (columns x k - 1 for the window,
        k per candidate): the larger of the two shrinks first, down to one column and no candidates."""
        columns, candidates = self.window, self.ngrams
        while columns * k - 1 + candidates * k > MAX_DRAFT_LEN:
            if candidates >= columns or columns == 1:
                candidates -= 1
            else:
                columns -= 1
        return columns, candidates

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        columns, most = self.sizes(k)
        while len(self.levels) < k:  # a longer round than the last: new levels start as copies
            self.levels.append(list(self.levels[-1]))
        del self.levels[k:]
        found = list(dict.fromkeys(ngram[:k] for ngram in self.pool.get(context[-1], [])))[:most]
        self.lookups += 1
        self.hits += bool(found)
        first = self.levels[0]
        first[0] = context[-1]  # column 0 starts at the last token itself: its n-gram starts there
        branch = [first[1:i + 1] + [level[i] for level in self.levels[1:]] for i in range(columns)]
        draft = Draft.from_paths([list(ngram) for ngram in found] + branch, tree=True)
        self.ends = draft.ends[len(found):]
        candidates = [False] * len(draft.parents)
        for end in draft.ends[:len(found)]:
            for node in draft.ancestors(end):
                candidates[node] = True
        draft.candidates, draft.depth = candidates, k
        return draft

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        """Pool what the round emitted; shift the window by it: first to what the target predicted at the end
        of each column (pooling the trajectories that makes), then, for each accepted draft, by recycling."""
        if not self.ends or step.tree_logits is None:
            return
        self.remember(context[-accepted - 2], context[-accepted - 1:], verified=True)
        rows = mx.array([end + 1 for end in self.ends])
        for c, token in enumerate(mx.argmax(step.tree_logits[rows], axis=-1).tolist()):
            column = [level[c] for level in self.levels]
            column, first = column[1:] + [token], column[0]
            self.remember(first, column)
            for _ in range(accepted):
                column = column[1:] + column[1:2] if len(column) > 1 else column
            for level, value in zip(self.levels, column):
                level[c] = value
        self.ends = []

    def remember(self, first: int, rest: list[int], verified: bool = False) -> None:
        """Pool an n-gram, newest first, at most `ngrams` per first token; a verified one (text the target
        emitted) moves to the front if it is there already."""
        known, ngram = self.pool.setdefault(first, []), tuple(rest)
        if ngram in known:
            if not verified:
                return
            known.remove(ngram)
        known.insert(0, ngram)
        del known[self.ngrams:]

    def report(self) -> str:
        return (f"pool hit rate {self.hits / self.lookups:.0%} ({self.hits}/{self.lookups} rounds), "
                f"{sum(map(len, self.pool.values()))} n-grams" if self.lookups else "")


def build(pairing, runner) -> LookaheadDrafter:
    if problem := runner.tree_problem():
        raise SpecError(f"lookahead decoding verifies a token tree, and {pairing.target.path.name} {problem}: use "
                        "--drafter ngram")
    return LookaheadDrafter()


KINDS = [Kind("lookahead", build=build)]
