"""The adaptive draft length for a batch (`BatchDraftLength`): what a round of a batch costs by the tokens its
target forward runs, and what is learnt of the text once for all rows. The policy for one sequence is sequence.py's."""

from __future__ import annotations

from .interface import DraftPolicy, one_more_pays
from .sequence import HORIZON, PRIOR, STALE, Shape, probe_due


class BatchDraftLength(DraftPolicy):
    """The adaptive policy for a batch of `rows` rows (`resize`). A round's time depends on the tokens its target
    forward runs, rows x (1 + k), whatever the split: small forwards are bandwidth-bound (more tokens cost little),
    large ones compute-bound (they cost in proportion), and between the two not always monotone (BLAS blocks some
    sizes better). So seconds are learnt per token count, shared by every batch size as rows come and go,
    interpolated between the counts measured and, beyond them, along the least growth measured between two, drawn
    from the largest count measured or the one before it, whichever makes it least (past a count dearer than the
    next): the optimist's guess (below them, when rows leave, no less than in proportion), one length past the
    counts measured at a time, measured (in two rounds) if it pays and enough rounds remain to repay that
    (HORIZON). What is learnt of the text once for all rows: the share of rows that draft at all (an n-gram drafter
    may find nothing) and the acceptance per draft position of those that do, each verdict counted (a round that
    judged a position once moves it less than one that judged it four times). Each round drafts the k that
    maximises expected tokens per second, E[N](k) / T(rows (1 + k)), measuring T at rows (plain steps) and 2 rows
    (one draft) first, and probing with one draft now and then while it is off. Chains that draft one token at a
    time stop together where their drafters are unsure (`go_on`): a row's drafts cost nothing past the batch's
    longest, so either every row drafts one more or none does. With `widths` (1, W), a drafter of token trees W wide:
    chains or trees, each shape's acceptance per depth learnt apart, a tree's forward costing its nodes (k W at first,
    then as many as its rounds held), so trees win where the forward is bandwidth-bound and a level's W candidates
    pass more often than one; an untried width is weighed as if each of its candidates passed as a chain's draft
    does, independently."""

    stops = True

    def __init__(self, max_len: int, probe_every: int = 16, decay: float = 0.85, prior_acceptance: float = 0.7,
                 widths: tuple[int, ...] = (1,)):
        self.max_len, self.probe_every, self.decay = max_len, probe_every, decay
        self.shapes = {w: Shape(max_len, prior_acceptance, optimistic=False) for w in widths}  # per width, the
        # acceptance of rows that draft (its positions judged by many rows a round)
        self.share = 1.0  # of the rows asked to draft, those that drafted something
        self.judged = {w: [-STALE - 1] * max_len for w in widths}  # the round that last judged each position (none:
        # stale from the start)
        self.verdicts = {w: [PRIOR] * max_len for w in widths}  # the verdicts each position's acceptance stands on,
        # decayed each round
        self.tried = {widths[0]}  # the widths drafted with (the others weighed from the chain's acceptance)
        self.nodes: dict[tuple[int, int], float] = {}  # (depth, width) -> a row's nodes, where more than its depth
        self.width = widths[0]
        self.seconds: dict[int, float] = {}  # tokens in the target's forward -> seconds of the round
        self.seen: set[int] = set()  # token counts run once (a first run compiles: no cost signal)
        self.rows, self.rounds, self.draft_len = 1, 0, 0
        self.stopped = 0  # rounds whose chains stopped where their drafters were unsure (`go_on`)
        self.note = f"adaptive draft length per batch size, up to {max_len}"

    def resize(self, rows: int) -> None:
        self.rows = rows

    def time(self, tokens: int) -> float | None:
        """Seconds of a round whose forward runs `tokens` tokens, from the counts measured (None: none yet)."""
        known = sorted(self.seconds)
        if tokens in self.seconds or not known:
            return self.seconds.get(tokens)
        below, above = [n for n in known if n < tokens], [n for n in known if n > tokens]
        if below and above:
            low, high = below[-1], above[0]
            return self.seconds[low] + (self.seconds[high] - self.seconds[low]) * (tokens - low) / (high - low)
        nearest = above[0] if above else below[-1]
        proportional = self.seconds[nearest] * tokens / nearest
        if len(known) < 2:  # one count measured: assume the forward compute-bound (the cautious guess)
            return proportional
        slope = min(max(0.0, (self.seconds[b] - self.seconds[a]) / (b - a)) for a, b in zip(known, known[1:]))
        if above:  # fewer tokens than measured (rows left): no less than in proportion
            return max(proportional, self.seconds[nearest] - slope * (nearest - tokens))
        return min(self.seconds[n] + slope * (tokens - n) for n in known[-2:])  # past a dear count (BLAS's blocking)

    @property
    def chain(self) -> Shape:
        return self.shapes[min(self.shapes)]

    def expected_tokens(self, k: int, width: int = 1) -> float:
        """Tokens a row gets from a round of k drafts (a tree's k levels): 1, and what drafting rows add, for the
        share that draft."""
        acceptance = None if width in self.tried else self.implied(width, min(self.shapes))
        return 1 + self.share * (self.shapes[width].expected_tokens(k, acceptance) - 1)

    def implied(self, width: int, by: int) -> list[float]:
        """The acceptance per depth of `width` that the one learnt for width `by` implies, each candidate passing as
        a chain's draft does, independently: a level of W passes 1 - (1 - a)^W as often as a chain's draft a."""
        return [1 - (1 - a) ** (width / by) for a in self.shapes[by].acceptance]

    def tokens(self, rows: int, k: int, width: int = 1) -> int:
        """The tokens a round of `rows` rows drafting k (a tree's depth, `width` wide) runs in the target's forward."""
        return rows * (1 + round(self.nodes.get((k, width), k * width)))

    def next_draft_len(self, remaining: int, outlook: list[float] | None = None) -> int:
        self.rounds += 1
        rows, k = self.rows, 0
        plain = self.time(rows)
        if not self.seconds or self.rounds % (4 * self.probe_every) == 0:
            k = 0  # measure plain steps (and now and then again)
        elif len(self.seconds) < 2:
            k = 0 if 2 * rows in self.seconds else 1  # a second token count to draw the line through
        else:
            k, self.width = self.best(rows, remaining)
            break_even = (self.time(2 * rows) - plain) / plain
            if k == 0 and probe_due(self.rounds, self.probe_every, break_even):
                k, self.width = 1, min(self.shapes)  # a cheap probe: has the text become predictable?
            tree = f", trees of width {self.width}" if self.width > 1 else ""
            self.note = (f"draft length {k}{tree} at {rows} rows: expected "
                         f"{self.expected_tokens(k, self.width):.2f} tokens/round" if k else
                         f"drafting off at {rows} rows: a draft costs {break_even:.2f} plain steps, recent "
                         f"first-draft acceptance {self.chain.acceptance[0]:.0%}")
        if not k:
            self.width = min(self.shapes)
        self.draft_len = k
        return max(0, min(k, remaining - 1))

    def best(self, rows: int, remaining: int | None = None) -> tuple[int, int]:
        """The draft length (and width) expected to make the most tokens per second at `rows` rows (two token
        counts measured), over the `remaining` tokens the longest row still wants (None: no end in sight)."""
        self.explore()
        largest, rates = max(self.seconds), {(0, min(self.shapes)): 1 / self.time(rows)}
        for width in self.shapes:
            for k in range(1, self.max_len + 1):
                tokens = self.tokens(rows, k, width)
                past = tokens > largest  # the first length past the counts measured, at the optimist's guess: the
                # others wait for it, and it waits for enough of its rounds left to repay the two that measure it
                # (with 32-token answers at 8 rows, trying two, three and four drafts ate the gain of one)
                if past and remaining is not None and remaining < HORIZON * self.expected_tokens(k, width):
                    break
                rates[k, width] = self.expected_tokens(k, width) / self.time(tokens)
                if past:
                    break
        return max(rates, key=rates.__getitem__)

    def go_on(self, confidences: list[list[float]]) -> bool:
        """Whether the rows drafting (`confidences`: each one's drafter's probability of each of its drafts so far)
        all draft one more: while it pays at the costs learnt for this many rows (`one_more_pays`; the round's
        other rows each count a token)."""
        j = len(confidences[0])
        now, more = self.time(self.rows * (1 + j)), self.time(self.rows * (2 + j))
        if now is None or more is None:
            return True
        go_on = one_more_pays(confidences, self.rows - len(confidences), now, more)
        self.stopped += not go_on
        return go_on

    def explain(self) -> list[str]:
        return [self.note] + [f"  {self.stopped} rounds' chains stopped where their drafters were unsure of their "
                              "next drafts"] * bool(self.stopped)

    def drafts_at(self, rows: int) -> bool:
        """Whether a row joining a batch of `rows` rows is worth readying to draft (the drafter's work on its prompt):
        yes until the costs measured say drafting does not pay at that size; its drafter then starts on the
        positions it decodes, if drafting turns on (probes included)."""
        return len(self.seconds) < 2 or self.best(rows)[0] > 0

    def explore(self) -> None:
        """A position no round judged of late (STALE rounds) is taken to pass as often as the one before it, not
        at its old estimate: else a policy that found one draft paying would never learn whether two do, nor
        again after a few unlucky rounds judged the second. Likewise a width no round drafted of late (4 STALE
        rounds: each retry costs a round or two) is taken to pass as the one drafted implies (`implied`): else a
        few unlucky chains would leave trees for good."""
        latest = max(self.shapes, key=lambda w: self.judged[w][0])
        for w, shape in self.shapes.items():
            if w != latest and w in self.tried and self.rounds - self.judged[w][0] > 4 * STALE:
                shape.acceptance = self.implied(w, latest)
                self.verdicts[w] = [min(v, PRIOR) for v in self.verdicts[w]]
        for w, shape in self.shapes.items():
            for j in range(1, self.max_len):
                if self.rounds - self.judged[w][j] > STALE:
                    shape.acceptance[j] = shape.acceptance[j - 1]
                    self.verdicts[w][j] = min(self.verdicts[w][j], PRIOR)

    def observe(self, draft_len: int, accepted: int, seconds: float | None,
                rows: list[tuple[int, int]] | None = None, asked: int | None = None) -> None:
        """Learn from a finished round: `rows` holds each row's (drafts, accepted); `draft_len` is the longest
        draft, which every row paid for. The share of rows that drafted moves once per round; each position's
        acceptance by the verdicts of the drafting rows that reached it, a token there or not: one that drafted
        fewer (n-gram found no more) gained nothing."""
        d, rows = self.decay, rows or [(draft_len, accepted)]
        w, depth = self.width, max(drafts for drafts, _ in rows)  # a tree's: its levels, `draft_len` its nodes
        if depth and w not in self.tried:  # its first round: from the acceptance it was weighed at
            self.tried.add(w)
            self.shapes[w].acceptance = self.implied(w, min(self.shapes))
        if draft_len > depth:
            old = self.nodes.get((depth, w))
            self.nodes[depth, w] = draft_len if old is None else d * old + (1 - d) * draft_len
        if draft_len:
            self.share = d * self.share + (1 - d) * sum(drafts > 0 for drafts, _ in rows) / len(rows)
        shape = self.shapes[w]
        for j in range(depth):
            judged = [j < kept for drafts, kept in rows if drafts and j <= kept]
            if judged:
                weight = d * self.verdicts[w][j]  # the past's verdicts, decayed
                shape.acceptance[j] = (weight * shape.acceptance[j] + sum(judged)) / (weight + len(judged))
                self.verdicts[w][j], self.judged[w][j] = weight + len(judged), self.rounds
        tokens = len(rows) * (1 + draft_len)
        if tokens not in self.seen:
            self.seen.add(tokens)
            return
        old = self.seconds.get(tokens)
        self.seconds[tokens] = seconds if old is None else d * old + (1 - d) * seconds
