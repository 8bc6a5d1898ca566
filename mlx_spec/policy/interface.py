"""The one interface of draft-length policies, whatever their cost model: `FixedDraftLength` (a pin),
`AdaptiveDraftLength` (one sequence's costs, policy/sequence.py) and `BatchDraftLength` (a batch's, by the tokens
its forward runs, policy/batch.py). Every caller asks them the same questions; a policy that has nothing to say
to one answers with the default here."""

from __future__ import annotations


class DraftPolicy:
    note: str = ""  # what it decided last, in a line
    pinned: int | None = None  # the length a user pinned (None: the policy chooses)
    draft_len: int = 0  # its latest choice
    width: int = 1  # the tree width of its latest choice (1: a chain), and the widest it may choose
    widest: int = 1
    cuts: bool = False  # whether it cuts a chain by the drafter's own estimates (`cut`)
    stops: bool = False  # whether it stops chains where their drafter is unsure, as they are drafted (`go_on`)

    def begin(self, depth: int) -> None:
        """A generation (or a batch row decoding alone) starts with a context of `depth` tokens."""

    def resize(self, rows: int) -> None:
        """The next rounds run `rows` rows."""

    def next_draft_len(self, remaining: int, outlook: list[float] | None = None) -> int:
        """The next round's draft length, for `remaining` tokens still wanted; `outlook`: the drafter's estimate
        of each draft of its next chain passing, each given the ones before passed (None: it makes none)."""
        raise NotImplementedError

    def cut(self, confidence: list[float]) -> int:
        """How many drafts of a chain to verify, given the drafter's own estimate of each one passing (asked only
        where it `cuts`: reading the estimates waits for them)."""
        return len(confidence)

    def go_on(self, confidences: list[list[float]]) -> bool:
        """Whether the rows drafting one token at a time each draft one more, given each one's drafter's
        probability of each of its drafts so far (asked only where it `stops`: reading them waits for them)."""
        return True

    def drafts_at(self, rows: int) -> bool:
        """Whether a sequence starting among `rows` rows is worth readying to draft (the drafter's prompt work)."""
        raise NotImplementedError

    def observe(self, draft_len: int, accepted: int, seconds: float | None,
                rows: list[tuple[int, int]] | None = None, asked: int | None = None) -> None:
        """Learn from a finished round of `draft_len` drafts (the longest, which every row paid for), `accepted`
        kept (one row's), in `seconds` (None: the round's time is not its own); `rows`: each row's (drafted,
        accepted); `asked`: the drafts asked for (a drafter may find fewer)."""

    def explain(self) -> list[str]:
        """Why: its note, then what it weighed."""
        return [self.note]

    def profile(self) -> dict | None:
        """What it learnt, for a later policy of the same target and drafter to start from (None: nothing)."""
        return None


def one_more_pays(confidences: list[list[float]], others: int, now: float, more: float) -> bool:
    """Whether the rows drafting (each one's chances of its drafts so far passing: `confidences`) draft one more
    each, in a round that also makes a token for each of `others` rows and costs `now` seconds as it stands and
    `more` with one more draft: while those drafts, were they sure to pass, add tokens at least at the round's rate
    so far, sum(P) / (more - now) >= sum(E) / now (P: a row's chance that its drafts so far all pass; E: its
    expected tokens, 1 + P_1 + ... + P_j)."""
    chances, expected = 0.0, float(others)
    for confidence in confidences:
        passed, tokens = 1.0, 1.0
        for chance in confidence:
            passed *= chance
            tokens += passed
        chances, expected = chances + passed, expected + tokens
    return chances * now >= expected * (more - now)
