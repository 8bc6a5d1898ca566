"""Prompt-lookup / n-gram drafting: continue the text the way it continued the last time the current
suffix appeared in the prompt or the output. Free: no model, no extra memory beyond an index. A chain continues
from the latest occurrence of the longest suffix found, down to the last token alone, and where that copy runs
out before k tokens (it reached the end), from the latest occurrence of its own new suffix. With `width` > 1,
the continuations after the `width` latest occurrences of the longest suffix of `min_ngram` tokens or more,
merged into a token tree. In a batch each row drafts as it would alone.

A chain's drafts come with the drafter's estimate of each one's acceptance (`Draft.confidence`, each given the
drafts before it passed), and after every round it says what it expects of its next chain (`outlook`), so the
adaptive policy drafts long into a copy and not at all where only a token or two match: the estimate is the rate
at which drafts of the same match length (the suffix matched so far, the drafts before counted in) turned out to
be what the text became. Every position's chain is judged against the text, drafted or not: a one-hot draft is
accepted with the target's probability of its token, the chance that the target emits that token, so the rate is
the acceptance at every temperature, and it keeps learning while drafting is off."""

from __future__ import annotations

import mlx.core as mx

from ..core.sampling import SamplingParams
from ..runners.target import Step
from .protocol import Draft, Drafter, Kind, RowDrafters

MATCH_CLASSES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # a draft's class: the longest of these its match reaches
PRIOR = (0.3, 2.0)  # each class's acceptance before any verdict, and the verdicts it counts for
DECAY = 0.97  # the weight of a class's past verdicts at each new one
OUTLOOK = 16  # the drafts `outlook` looks ahead


def match_class(match: int) -> int:
    return sum(match >= bound for bound in MATCH_CLASSES) - 1


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, width: int = 1):
        """min_ngram: the shortest suffix a tree is drafted from (a chain goes down to one token: on a CPU a draft
        costs a tenth of a step, so even the last token's continuation pays, where it does)."""
        self.max_ngram, self.min_ngram, self.width = max_ngram, min_ngram, width
        self.rates = [[PRIOR[0] * PRIOR[1], PRIOR[1]] for _ in MATCH_CLASSES]  # passed, judged; decayed
        self.outlook: list[float] = []

    def batched(self, target_batch) -> RowDrafters:
        """Drafting for a batch: an n-gram index of its own per row, chains, what each row learns of its drafts'
        acceptance learnt into this drafter's estimates (which the next request, alone or in a batch, starts from:
        a fresh prior each request drafted a server's copies short)."""
        def row() -> NgramDrafter:
            drafter = NgramDrafter(self.max_ngram, self.min_ngram, self.width)
            drafter.rates = self.rates
            return drafter
        return RowDrafters(self.name, row)

    def begin(self, context: list[int], prompt_step: Step) -> None:
        self.latest: dict[tuple[int, ...], list[int]] = {}  # n-gram -> ends of its latest occurrences, newest first
        self.indexed = 0  # n-grams ending at or before this position are in `latest`
        self.pending: dict[int, tuple] = {}  # position -> a chain from there, its classes, how many judged
        self.look(context)

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
        looked = self.pending.get(len(context))  # the chain `look` drafted from here: its first k are the same
        drafted, classes = (looked[0][:k], looked[1][:k]) if looked and k <= OUTLOOK else self.chain(context, k)
        return Draft(mx.array(drafted, dtype=mx.int32), confidence=mx.array([self.rate(c) for c in classes]))

    def chain(self, context: list[int], k: int) -> tuple[list[int], list[int]]:
        """Up to k drafts continuing `context` and each one's match class (kept to be judged against the text)."""
        drafted, classes = [], []
        while len(drafted) < k and (ends := self._ends((context[-self.max_ngram:] + drafted), 1)):
            copy = context[ends[0]:ends[0] + k - len(drafted)]
            match = self._match(context + drafted, ends[0])
            classes += [match_class(match + d) for d in range(len(copy))]
            drafted += copy
        self.pending.setdefault(len(context), (drafted, classes, 0))  # a longer look from here is kept
        return drafted, classes

    def _match(self, text: list[int], end: int) -> int:
        """How many tokens before `end` equal the last ones of `text` (up to the longest class)."""
        match = 0
        while match < min(end, MATCH_CLASSES[-1]) and text[end - 1 - match] == text[-1 - match]:
            match += 1
        return match

    def rate(self, match_class: int) -> float:
        passed, judged = self.rates[match_class]
        return passed / judged

    def estimates(self) -> list[list[float]]:
        """What it learnt of its drafts' acceptance by match length, which a later run starts from (`start_from`;
        the engine keeps it in the policy's profile): a fresh prior made a command's first copies short."""
        return [[round(passed, 4), round(judged, 4)] for passed, judged in self.rates]

    def start_from(self, estimates) -> None:
        """Start from `estimates()` of an earlier run (one damaged, or of another version, is ignored)."""
        try:
            rates = [[float(passed), float(judged)] for passed, judged in estimates]
        except (TypeError, ValueError):
            return
        if len(rates) == len(MATCH_CLASSES) and all(0 <= passed <= judged and judged > 0 for passed, judged in rates):
            self.rates[:] = rates  # in place: a batch's rows share them

    def look(self, context: list[int]) -> None:
        """Judge the chains drafted (or looked at) so far against what `context` became; then look ahead: the
        estimated acceptance of each draft of the next chain, each given the ones before passed (`outlook`)."""
        for start, (drafted, classes, judged) in list(self.pending.items()):
            passed = True
            while passed and judged < len(drafted) and start + judged < len(context):
                passed = context[start + judged] == drafted[judged]
                rate = self.rates[classes[judged]]
                rate[0], rate[1], judged = DECAY * rate[0] + passed, DECAY * rate[1] + 1, judged + 1
            if passed and judged < len(drafted):
                self.pending[start] = drafted, classes, judged  # drafts the text has not reached yet
            else:
                del self.pending[start]
        self._index(context)
        self.outlook = [self.rate(c) for c in self.chain(context, OUTLOOK)[1]]

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        self.look(context)


KINDS = [Kind("ngram", build=lambda pairing, runner: NgramDrafter())]
