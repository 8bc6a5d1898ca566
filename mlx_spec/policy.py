"""How many tokens to draft next round.

`FixedDraftLength` is what a user pins. `AdaptiveDraftLength` picks, every round, the length (and, for a
drafter that can draft trees, whether to draft a chain or a tree) that maximises the expected tokens per second
from what this run has measured, per shape: the acceptance at each draft position and the time of a round,
T(k) = T(0) + slope * k. It turns drafting off (k = 0, plain decoding) when no length
beats plain decoding, and probes with a short draft now and then so it turns back on when the text becomes
predictable again. Its `note` says what it decided and why.
"""

from __future__ import annotations


class FixedDraftLength:
    """Always `draft_len` (0 is plain decoding), never more than the tokens still wanted; trees of `width`."""

    def __init__(self, draft_len: int, width: int = 1):
        self.draft_len = self.pinned = draft_len
        self.width = self.widest = width
        shape = f", trees of width {width}" if width > 1 and draft_len else ""
        self.note = f"draft length {draft_len} (pinned){shape}" if draft_len else "drafting off"

    def next_draft_len(self, remaining: int) -> int:
        return max(0, min(self.draft_len, remaining - 1))

    def observe(self, draft_len: int, accepted: int, seconds: float,
                rows: list[tuple[int, int]] | None = None) -> None:
        pass


class Shape:
    """What the policy has learnt of drafting with one width (1: chains)."""

    def __init__(self, max_len: int, prior_acceptance: float):
        self.acceptance = [prior_acceptance] * max_len  # P(position j accepted | positions < j accepted)
        self.slope: float | None = None  # extra seconds per drafted position

    def expected_tokens(self, k: int) -> float:
        """Tokens per round with k drafts: 1 + sum over i of the chance that drafts 1..i all pass."""
        total, passed = 1.0, 1.0
        for a in self.acceptance[:k]:
            passed *= a
            total += passed
        return total


class AdaptiveDraftLength:
    def __init__(self, max_len: int, probe_every: int = 16, decay: float = 0.8, prior_acceptance: float = 0.7,
                 widths: tuple[int, ...] = (1,)):
        """widths: the draft shapes to choose from (1: a chain; W > 1: trees of width W)."""
        self.max_len, self.probe_every, self.decay = max_len, probe_every, decay
        self.shapes = {w: Shape(max_len, prior_acceptance) for w in widths}
        self.plain_time: float | None = None  # T(0), seconds
        self.rounds = 0
        self.warmed_up = set()  # widths seen once (0: plain steps): a first round compiles and fills caches
        self.previous_len = None
        self.draft_len, self.width, self.widest = max_len, widths[0], widths[-1]
        self.note = f"adaptive draft length, up to {max_len}" + (f", chains or trees of width {widths[-1]}"
                                                                  if len(widths) > 1 else "")

    def expected_tokens(self, k: int, width: int = 1) -> float:
        return self.shapes[width].expected_tokens(k)

    def next_draft_len(self, remaining: int) -> int:
        self.rounds += 1
        unmeasured = [w for w, shape in self.shapes.items() if shape.slope is None]
        if self.plain_time is None or self.rounds % (4 * self.probe_every) == 0:
            k = 0  # measure (and now and then re-measure) the cost of a plain step
        elif unmeasured:
            k, self.width = 1, unmeasured[0]  # measure the cost of drafting with the cheapest draft: where
            # drafting cannot pay, exploring at the longest length cost ~13% of a short generation
        else:
            rates = {(k, w): shape.expected_tokens(k) / (self.plain_time + shape.slope * k)
                     for w, shape in self.shapes.items() for k in range(self.max_len + 1)}
            k, self.width = max(rates, key=rates.__getitem__)
            chain = self.shapes[min(self.shapes)]
            break_even = chain.slope / self.plain_time
            # a cheap probe: has the text become predictable? The rarer, the closer break-even is to "always
            # right" (up to 8x rarer): a probe costs a round, and the cost of drafting does not change with the text
            if k == 0 and self.rounds % round(self.probe_every / max(1 - break_even, 1 / 8)) == 0:
                k, self.width = 1, min(self.shapes)
            if k:
                tree = f", trees of width {self.width}" if self.width > 1 else ""
                self.note = f"draft length {k}{tree}: expected {self.expected_tokens(k, self.width):.2f} tokens/round"
            elif break_even > 1:
                self.note = (f"drafting off: one draft costs {break_even:.2f} plain steps here, more than even an "
                             "always-right draft gains")
            else:
                self.note = (f"drafting off: recent first-draft acceptance {chain.acceptance[0]:.0%} is below "
                             f"break-even {break_even:.0%}")
        self.draft_len = k
        return max(0, min(k, remaining - 1))

    def observe(self, draft_len: int, accepted: int, seconds: float,
                rows: list[tuple[int, int]] | None = None) -> None:
        """Learn from a finished round: how far its drafts got, and how long it took. A batch's round gives
        `rows`: each row's (drafts, accepted); `draft_len` is then the longest draft."""
        d, shape = self.decay, self.shapes[self.width]
        for drafted, kept in rows or [(draft_len, accepted)]:
            for j in range(min(drafted, kept + 1)):  # positions the verifier actually judged
                shape.acceptance[j] = d * shape.acceptance[j] + (1 - d) * (j < kept)
        kind = self.width if draft_len else 0
        first_of_kind = kind not in self.warmed_up
        resumed, self.previous_len = draft_len > 0 and self.previous_len == 0, draft_len
        if first_of_kind or resumed:  # compiling, or a drafter catching up on the rounds it sat out: no cost signal
            self.warmed_up.add(kind)
            return
        if draft_len == 0:
            self.plain_time = seconds if self.plain_time is None else d * self.plain_time + (1 - d) * seconds
        elif self.plain_time is not None:
            slope = max(0.0, (seconds - self.plain_time) / draft_len)
            shape.slope = slope if shape.slope is None else d * shape.slope + (1 - d) * slope


class PerBatchSize:
    """The adaptive policy for a batch: a forward over B rows costs more as B grows (at some B it stops being
    bandwidth-bound and drafting stops paying), so the cost of a round is learnt per batch size, by one
    AdaptiveDraftLength each; the acceptance, a property of the text, is learnt once for all of them."""

    def __init__(self, max_len: int):
        self.max_len, self.by_size = max_len, {}
        self.current = AdaptiveDraftLength(max_len)

    def resize(self, size: int) -> None:
        """The batch now has `size` rows."""
        if size not in self.by_size:
            policy = AdaptiveDraftLength(self.max_len)
            policy.shapes[1].acceptance = self.current.shapes[1].acceptance  # one list, shared
            self.by_size[size] = policy
        self.current = self.by_size[size]

    @property
    def note(self) -> str:
        return self.current.note

    def next_draft_len(self, remaining: int) -> int:
        return self.current.next_draft_len(remaining)

    def observe(self, draft_len: int, accepted: int, seconds: float,
                rows: list[tuple[int, int]] | None = None) -> None:
        self.current.observe(draft_len, accepted, seconds, rows)
