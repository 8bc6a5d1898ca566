"""A request's predicted output (OpenAI's Predicted Outputs: a file to re-emit with an edit, a document to revise)
as the source of its drafts. The output is followed along the prediction: while each new token is the one the
prediction has next, the next round drafts the prediction's following tokens; where the output departs from it
(the edit), the prediction is found again at the latest occurrence of the output's longest suffix (of
`MIN_MATCH` to `MAX_MATCH` tokens) after the point last followed, else anywhere, as llama.cpp's lookup decoding
and vLLM's n-gram proposer re-align. Drafts are single tokens (one-hot), so verification is exact at every
temperature. The length drafted starts at `FIRST`, doubles after a round that accepted all of it (up to `LONGEST`)
and halves after one that did not (down to `SHORTEST`): a copy is verified in long rounds, an edit costs one
round's extra width.
"""

from __future__ import annotations

FIRST, SHORTEST, LONGEST = 16, 4, 32
MIN_MATCH, MAX_MATCH = 3, 8


class Prediction:
    def __init__(self, tokens: list[int], start: int):
        """tokens: the predicted output; start: where the output begins in the row's context (its prompt's length)."""
        self.tokens, self.start = list(tokens), start
        self.at: int | None = 0  # the index of the prediction's token the output has next (None: lost)
        self.followed = start  # the context positions followed so far
        self.last = 0  # the prediction's index after the last token followed along it
        self.length = FIRST
        self.accepted = 0  # its tokens accepted as drafts
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> ends of its occurrences, in order
        for n in range(MIN_MATCH, MAX_MATCH + 1):
            for end in range(n, len(self.tokens) + 1):
                self.ends.setdefault(tuple(self.tokens[end - n:end]), []).append(end)

    def follow(self, context: list[int]) -> None:
        """Follow the output (`context` past `start`) along the prediction, re-aligning where it departed."""
        for token in context[self.followed:]:
            if self.at is not None and self.at < len(self.tokens) and self.tokens[self.at] == token:
                self.at += 1
                self.last = self.at
            else:
                self.at = None
        self.followed = len(context)
        if self.at is None:
            self.at = self._find(context[self.start:])

    def _find(self, output: list[int]) -> int | None:
        """Where the output's longest suffix found in the prediction ends: its first occurrence after the point
        last followed, else its last before it (None: no suffix of `MIN_MATCH` tokens or more is found)."""
        for n in range(min(MAX_MATCH, len(output)), MIN_MATCH - 1, -1):
            if ends := self.ends.get(tuple(output[-n:])):
                return next((end for end in ends if end > self.last), ends[-1])
        return None

    def planned(self, context: list[int]) -> int:
        """How many of its tokens the next round drafts (0: none, the output is not on the prediction)."""
        self.follow(context)
        return 0 if self.at is None else min(self.length, len(self.tokens) - self.at)

    def draft(self, context: list[int], k: int) -> list[int]:
        """Up to k of its tokens continuing `context`."""
        self.follow(context)
        return [] if self.at is None else self.tokens[self.at:self.at + k]

    def verdict(self, drafted: int, accepted: int) -> None:
        """A round drafted `drafted` of its tokens and kept `accepted`."""
        self.accepted += accepted
        self.length = min(LONGEST, 2 * self.length) if accepted == drafted else max(SHORTEST, self.length // 2)

    @property
    def rejected(self) -> int:
        """Its tokens that did not become output as accepted drafts (OpenAI's `rejected_prediction_tokens`)."""
        return len(self.tokens) - self.accepted
