"""How many tokens to draft next round.

`FixedDraftLength` is what a user pins. `AdaptiveDraftLength` picks, every round, the length that maximises
the expected tokens per second from what this run has measured: the acceptance at each draft position and
the time of a round, T(k) = T(0) + slope * k. It turns drafting off (k = 0, plain decoding) when no length
beats plain decoding, and probes with a short draft now and then so it turns back on when the text becomes
predictable again. Its `note` says what it decided and why.
"""

from __future__ import annotations


class FixedDraftLength:
    """Always `draft_len` (0 is plain decoding), never more than the tokens still wanted."""

    def __init__(self, draft_len: int):
        self.draft_len = self.pinned = draft_len
        self.note = f"draft length {draft_len} (pinned)" if draft_len else "drafting off"

    def next_draft_len(self, remaining: int) -> int:
        return max(0, min(self.draft_len, remaining - 1))

    def observe(self, draft_len: int, accepted: int, seconds: float) -> None:
        pass


class AdaptiveDraftLength:
    def __init__(self, max_len: int, probe_every: int = 16, decay: float = 0.8, prior_acceptance: float = 0.7):
        self.max_len, self.probe_every, self.decay = max_len, probe_every, decay
        self.acceptance = [prior_acceptance] * max_len  # P(position j accepted | positions < j accepted)
        self.plain_time: float | None = None  # T(0), seconds
        self.slope: float | None = None  # extra seconds per drafted token
        self.rounds = 0
        self.warmed_up = set()  # draft lengths 0 / > 0 seen once: a first round compiles and fills caches
        self.previous_len = None
        self.draft_len = max_len
        self.note = f"adaptive draft length, up to {max_len}"

    def expected_tokens(self, k: int) -> float:
        """Tokens per round with k drafts: 1 + sum over i of the chance that drafts 1..i all pass."""
        total, passed = 1.0, 1.0
        for a in self.acceptance[:k]:
            passed *= a
            total += passed
        return total

    def next_draft_len(self, remaining: int) -> int:
        self.rounds += 1
        if self.plain_time is None or self.rounds % (4 * self.probe_every) == 0:
            k = 0  # measure (and now and then re-measure) the cost of a plain step
        elif self.slope is None:
            k = 1  # measure the cost of drafting with the cheapest draft: where drafting cannot pay, exploring
            # at the longest length cost ~13% of a short generation (two rounds, the first a warm-up)
        else:
            rates = [self.expected_tokens(k) / (self.plain_time + self.slope * k) for k in range(self.max_len + 1)]
            k = max(range(self.max_len + 1), key=rates.__getitem__)
            break_even = self.slope / self.plain_time
            # a cheap probe: has the text become predictable? The rarer, the closer break-even is to "always
            # right" (up to 8x rarer): a probe costs a round, and the cost of drafting does not change with the text
            if k == 0 and self.rounds % round(self.probe_every / max(1 - break_even, 1 / 8)) == 0:
                k = 1
            if k:
                self.note = f"draft length {k}: expected {self.expected_tokens(k):.2f} tokens/round"
            elif break_even > 1:
                self.note = (f"drafting off: one draft costs {break_even:.2f} plain steps here, more than even an "
                             "always-right draft gains")
            else:
                self.note = (f"drafting off: recent first-draft acceptance {self.acceptance[0]:.0%} is below "
                             f"break-even {break_even:.0%}")
        self.draft_len = k
        return max(0, min(k, remaining - 1))

    def observe(self, draft_len: int, accepted: int, seconds: float) -> None:
        """Learn from a finished round: how far its drafts got, and how long it took."""
        d = self.decay
        for j in range(min(draft_len, accepted + 1)):  # positions the verifier actually judged
            self.acceptance[j] = d * self.acceptance[j] + (1 - d) * (j < accepted)
        first_of_kind = (draft_len > 0) not in self.warmed_up
        resumed, self.previous_len = draft_len > 0 and self.previous_len == 0, draft_len
        if first_of_kind or resumed:  # compiling, or a drafter catching up on the rounds it sat out: no cost signal
            self.warmed_up.add(draft_len > 0)
            return
        if draft_len == 0:
            self.plain_time = seconds if self.plain_time is None else d * self.plain_time + (1 - d) * seconds
        elif self.plain_time is not None:
            slope = max(0.0, (seconds - self.plain_time) / draft_len)
            self.slope = slope if self.slope is None else d * self.slope + (1 - d) * slope
