"""How many tokens to draft next round.

`FixedDraftLength` is what a user pins. `AdaptiveDraftLength` picks, every round, the length (and, for a
drafter that can draft trees, whether to draft a chain or a tree) that maximises the expected tokens per second
from what has been measured, per shape: the acceptance at each draft position and a round's time at each draft
length, T(k) / T(0), both in plain steps so that a machine that slows down or speeds up as a whole (other work on
its cores) does not move break-even while drafting is off. Round times are a curve, not a line (BLAS blocking
makes them non-monotone on a CPU; memory bandwidth makes them flat on a GPU): each length measured keeps its own
running mean; a length not measured is guessed between its measured neighbours, or past the longest measured at
the least growth per draft measured (the optimist's guess, tried one length at a time while enough tokens remain
to repay it), or before any second length from a line, fixed + slope k (fixed: what a drafting round costs
whatever its length, such as a block drafter's one forward). A draft position no round judged of late is taken to
pass as often as the one before it, so longer drafts are tried again. It turns drafting off (k = 0) when no length
beats plain decoding, and probes with a short draft now and then so it turns back on when the text becomes
predictable again or drafts turn out cheaper than measured (a probe is two rounds: the first, resuming, says
nothing of the cost; the second's counts for half). What it learnt (`profile`) can start the next generation's
policy, so a run starts at the length that paid last time. Its `note` says what it decided, `explain` why. A
drafter that estimates each draft's acceptance (DSpark's confidence head) has its chain cut to the most profitable
length under the same costs (`cut`); one that says before a round what it expects of its next chain (n-gram's
`outlook`) has that expectation weighed instead of the acceptance by position, and probes only to re-time the cost.
One that drafts a token at a time with its own probability of each (a draft model, an MTP layer, a Gemma 4
assistant) stops its chain where one more draft would not pay at those chances (`go_on`), so a length chosen on
predictable text costs little where the text is not.
"""

from __future__ import annotations

from .interface import DraftPolicy, one_more_pays

PROBE_WEIGHT = 0.5  # a draft's cost measured by a probe, against the estimate from before drafting stopped
STALE = 16  # rounds after which a batch's draft position no round judged is taken to pass as the one before
STALE_ALONE = 8  # the same for one sequence, whose generations are often a few dozen rounds
PRIOR = 2.0  # the verdicts a prior acceptance counts for
HORIZON = 8  # rounds of a length not yet measured that must remain for a batch to try it
PROFILE_WEIGHT = 3  # the measurements a cost from a profile counts for against this run's
LONG_RUN = 8  # the verdicts a profile's long-run acceptance counts for against this run's, in what it keeps
CALIBRATION = 3  # timed drafting rounds that, from a profile, set this run's plain step (no cost learnt from them)
HORIZON_ALONE = 2  # rounds of a length not yet measured that must remain for one sequence to try it
CLOSE = 0.05  # a length next to the best, expected within this share of its speed, is timed again now and then
LONG_AGO = 1 << 30  # rounds
UNTIMED_ROUNDS = 3  # a generation's first rounds, whose times the policy does not learn from (around its prefill)


def probe_due(rounds: int, probe_every: int, break_even: float) -> bool:
    """Whether round `rounds` probes with one draft while drafting is off: every `probe_every` rounds, the rarer
    the closer break-even (the first-draft acceptance at which one draft pays) is to "always right", up to 8x
    rarer. One round past each multiple: the multiples of 4 x probe_every re-measure plain steps instead."""
    return rounds % round(probe_every / max(1 - break_even, 1 / 8)) == 1


class FixedDraftLength(DraftPolicy):
    """Always `draft_len` (0 is plain decoding), never more than the tokens still wanted; trees of `width`."""

    def __init__(self, draft_len: int, width: int = 1):
        self.draft_len = self.pinned = draft_len
        self.width = self.widest = width
        shape = f", trees of width {width}" if width > 1 and draft_len else ""
        self.note = f"draft length {draft_len} (pinned){shape}" if draft_len else "drafting off"

    def next_draft_len(self, remaining: int, outlook: list[float] | None = None) -> int:
        return max(0, min(self.draft_len, remaining - 1))

    def drafts_at(self, rows: int) -> bool:
        return self.draft_len > 0


class Shape:
    """What the policy has learnt of drafting with one width (1: chains)."""

    def __init__(self, max_len: int, prior_acceptance: float, optimistic: bool = True):
        self.optimistic = optimistic  # weigh positions past the first at one standard error above their estimate
        self.acceptance = [prior_acceptance] * max_len  # P(position j accepted | positions < j accepted)
        self.judged = [-STALE_ALONE - 1] * max_len  # the round that last judged each position (none: stale already)
        self.verdicts = [PRIOR] * max_len  # the verdicts each position's acceptance stands on, decayed each time
        self.totals = [[prior_acceptance * PRIOR, PRIOR] for _ in range(max_len)]  # passed, judged: the long run
        self.costs: dict[int, float] = {}  # draft length -> a round's time in plain steps, running mean
        self.counts: dict[int, float] = {}  # draft length -> the measurements its mean stands on
        self.timed: dict[int, int] = {}  # draft length -> the round that last timed it
        self.slope: float | None = None  # the line's cost per drafted position, in plain steps (None: none timed)
        self.fixed = 0.0  # the line's cost of a drafting round whatever its length (a block drafter's one forward)
        self.moments: tuple[float, ...] | None = None  # running means of k, k^2, r, k r; r = T(k) / T(0) - 1

    def expected_tokens(self, k: int, acceptance: list[float] | None = None) -> float:
        """Tokens per round with k drafts: 1 + sum over i of the chance that drafts 1..i all pass (by the
        acceptance by position learnt, or `acceptance`, the drafter's outlook). Learnt, a position past the first
        counts (`optimistic`) at one standard error above its estimate, sqrt(a (1 - a) / n), n the verdicts on it
        so far: it is judged only in rounds that draft that far, so one rejection there shortens the drafts that
        would judge it again (the 1.5B's 0.5B draft model, whose drafts pass ~97% of the time: one rejection put a
        position at 44%, and the default drafted 5 or 6 where 8 paid: measured, 0.92 -> 1.01 of the best pinned
        length, a first run 0.78 -> 0.87; replayed on that run's trace 0.94 -> 0.99). The first position is judged
        in every drafting round."""
        if acceptance is None:
            acceptance = [a + (j > 0 and self.optimistic) * (a * (1 - a) / self.totals[j][1]) ** 0.5
                          for j, a in enumerate(self.acceptance)]
        total, passed = 1.0, 1.0
        for a in acceptance[:k]:
            passed *= min(1.0, a)
            total += passed
        return total

    def cost(self, k: int) -> float:
        """T(k) / T(0): a round of k drafts in plain steps, measured or guessed (see the module's docstring). A
        length's measurements count against the line as many times as they are (one outlier does not condemn a
        length that would never be tried again)."""
        if k == 0:
            return 1.0
        line = 1 + self.fixed + self.slope * k
        if k in self.costs:
            return (self.counts[k] * self.costs[k] + line) / (self.counts[k] + 1)
        known = sorted(self.costs)
        below, above = [n for n in known if n < k], [n for n in known if n > k]
        if below and above:
            low, high = below[-1], above[0]
            return self.cost(low) + (self.cost(high) - self.cost(low)) * (k - low) / (high - low)
        if above:
            return min(line, self.cost(above[0]))
        growth = [max(0.0, (self.cost(b) - self.cost(a)) / (b - a)) for a, b in zip(known, known[1:])]
        return self.cost(below[-1]) + (min(growth) if growth else self.slope) * (k - below[-1])

    def learn(self, k: int, r: float, weight: float) -> None:
        """A round of k drafts took 1 + r plain steps; `weight`: its share in the running means (more while a length
        has few measurements). The line is fitted as fixed + slope k (least squares, neither negative) while the
        lengths timed lie far enough apart; else the fixed share stays as last fitted (0 before) and the slope
        takes the rest."""
        self.counts[k] = self.counts.get(k, 0) + 1
        self.costs[k] = self.costs.get(k, 0.0) + max(weight, 1 / self.counts[k]) * (1 + r - self.costs.get(k, 0.0))
        observed = (k, k * k, r, k * r)
        self.moments = observed if self.moments is None else tuple(
            (1 - weight) * m + weight * o for m, o in zip(self.moments, observed))
        mean_k, mean_kk, mean_r, mean_kr = self.moments
        spread = mean_kk - mean_k * mean_k
        if spread <= SPREAD:  # one length of late: the fixed share as last fitted (none before), the rest per draft
            self.slope = max(0.0, (mean_r - self.fixed) / mean_k)
            return
        slope = (mean_kr - mean_k * mean_r) / spread
        if slope < 0:
            self.fixed, self.slope = max(0.0, mean_r), 0.0
        elif mean_r - slope * mean_k < 0:
            self.fixed, self.slope = 0.0, max(0.0, mean_kr / mean_kk)
        else:
            self.fixed, self.slope = mean_r - slope * mean_k, slope

    def explore(self, rounds: int) -> None:
        """A position no round judged of late (STALE_ALONE rounds) past one judged of late is taken to pass as
        often as the one before it: else a policy that found short drafts paying would never learn whether longer
        ones do (a shape not drafted of late keeps its estimates: it lost to another)."""
        for j in range(1, len(self.acceptance)):
            if (rounds - self.judged[j] > STALE_ALONE >= rounds - self.judged[j - 1]
                    and self.acceptance[j] < self.acceptance[j - 1]):
                self.acceptance[j], self.verdicts[j] = self.acceptance[j - 1], min(self.verdicts[j], PRIOR)

    def judge(self, j: int, passed: bool, decay: float) -> None:
        """A verdict on draft position j: the past's verdicts count for `decay` each (the prior's too)."""
        weight = decay * self.verdicts[j]
        self.acceptance[j] = (weight * self.acceptance[j] + passed) / (weight + 1)
        self.verdicts[j] = weight + 1
        self.totals[j][0] += passed
        self.totals[j][1] += 1

    def saved(self) -> dict:
        """What a profile keeps: the long-run acceptance (not the last rounds': the next text may differ), costs."""
        return {"acceptance": [round(passed / judged, 4) for passed, judged in self.totals], **self.saved_costs()}

    def saved_costs(self) -> dict:
        return {"fixed": self.fixed, "slope": self.slope,
                "costs": {str(k): round(c, 4) for k, c in sorted(self.costs.items())}}

    def resume(self, saved: dict) -> None:
        """Start from what a profile saved (`saved`)."""
        learnt = [float(a) for a in saved["acceptance"]][: len(self.acceptance)]
        self.acceptance[: len(learnt)] = learnt
        self.verdicts = [PRIOR] * len(self.acceptance)
        self.totals[: len(learnt)] = [[a * LONG_RUN, LONG_RUN] for a in learnt]
        self.resume_costs(saved)

    def resume_costs(self, saved: dict | None) -> None:
        """Start from the costs `saved_costs` gave, each counting for PROFILE_WEIGHT measurements (None: none)."""
        self.costs, self.counts, self.timed, self.moments, self.fixed, self.slope = {}, {}, {}, None, 0.0, None
        if saved:
            self.fixed, self.slope = float(saved["fixed"]), saved["slope"] and float(saved["slope"])
            self.costs = {int(k): float(c) for k, c in saved["costs"].items() if 0 < int(k) <= len(self.acceptance)}
            self.counts = dict.fromkeys(self.costs, PROFILE_WEIGHT)
            if self.slope is None and self.costs:
                self.slope = 0.0


SPREAD = 0.2  # the variance of the draft lengths timed (squared drafts) past which a round's fixed cost is fitted


def depth_band(depth: int) -> int:
    """The band of context depths (tokens) whose round costs are learnt together: 0 under 1K, then one per
    doubling (1: 1K to 2K, 2: to 4K, 3: to 8K, ...)."""
    return max(0, depth.bit_length() - 10)


def band_range(band: int) -> str:
    return "under 1K tokens" if band == 0 else f"of {2 ** (band - 1)}K-{2 ** band}K tokens"


class AdaptiveDraftLength(DraftPolicy):
    cuts = stops = True

    def __init__(self, max_len: int, probe_every: int = 16, decay: float = 0.9, prior_acceptance: float = 0.7,
                 widths: tuple[int, ...] = (1,), profile: dict | None = None):
        """widths: the draft shapes to choose from (1: a chain; W > 1: trees of width W). decay: the weight of
        the past in each running estimate. At 0.8, three rejections in a row (common at 40% acceptance) turned
        drafting off until the next probe: at 42% first-draft acceptance and drafts costing 0.2 of a plain step,
        where one draft a round pays (1.42 / 1.2), it drafted in 48% of rounds, against 71% at 0.9
        (test_policy's test_noisy_acceptance_keeps_drafting). profile: what an earlier policy of the same target,
        drafter and shapes learnt (`profile()`), to start from."""
        self.max_len, self.probe_every, self.decay = max_len, probe_every, decay
        self.shapes = {w: Shape(max_len, prior_acceptance) for w in widths}
        self.plain_time: float | None = None  # T(0), seconds
        self.rounds = 0
        self.warmed_up = set()  # widths seen once (0: plain steps): a first round compiles and fills caches
        self.previous_len = None
        self.uncosted = False  # the last round drafted but its time said nothing of a draft's cost
        self.spread_tries = 0  # rounds drafted at a second length to fit a round's fixed cost
        self.calibration: list[float] | None = None  # from a profile: plain steps inferred from the first rounds
        self.outlook: list[float] | None = None  # the drafter's, at the last round decided (None: it has none)
        self.drafted_at = -LONG_AGO  # the last round that drafted
        self.stopped = 0  # chains stopped where the drafter was unsure (`go_on`)
        self.draft_len, self.width, self.widest = max_len, widths[0], widths[-1]
        self.note = f"adaptive draft length, up to {max_len}" + (f", chains or trees of width {widths[-1]}"
                                                                  if len(widths) > 1 else "")
        self.band = 0  # of the context's depth (`depth_band`), whose costs `shapes` and `plain_time` hold
        self.bands: dict[str, dict] = {}  # the costs learnt at other bands (`costs_at_band`)
        try:
            if profile and set(profile["shapes"]) == {str(w) for w in widths}:
                for w, shape in self.shapes.items():
                    shape.resume(profile["shapes"][str(w)])
                self.plain_time, self.calibration = float(profile["plain_time"]), []
                self.band, self.bands = int(profile.get("band", 0)), dict(profile.get("bands", {}))
        except (AttributeError, KeyError, TypeError, ValueError):  # a damaged profile, or another version's
            self.shapes = {w: Shape(max_len, prior_acceptance) for w in widths}
            self.band, self.bands = 0, {}

    def measured(self) -> bool:
        """Whether the costs of a plain step and of drafting with every shape are measured at this band."""
        return self.plain_time is not None and all(shape.slope is not None for shape in self.shapes.values())

    def profile(self) -> dict | None:
        """What this policy learnt, to start a later one from (None: no band's costs measured yet)."""
        bands = {**self.bands, **({str(self.band): self.costs_at_band()} if self.measured() else {})}
        if not bands:
            return None
        band = str(self.band) if self.measured() else next(iter(bands))
        costs = bands.pop(band)
        return {"plain_time": costs["plain_time"], "band": int(band), "bands": bands,
                "shapes": {str(w): {**s.saved(), **costs["shapes"][str(w)]} for w, s in self.shapes.items()}}

    def costs_at_band(self) -> dict:
        return {"plain_time": self.plain_time, "shapes": {str(w): s.saved_costs() for w, s in self.shapes.items()}}

    def begin(self, depth: int) -> None:
        """A generation's context is `depth` tokens. A round's cost grows with depth, and on a CPU a draft's
        steeply (the 0.5B with n-gram: one draft 0.12 of a plain step at 55 tokens, 0.47 at 8K), so costs are
        learnt per band of depths: entering another band resumes what was learnt there (this run's plain step
        calibrated again) or measures afresh; what was learnt of acceptance holds."""
        band = depth_band(depth)
        if band == self.band:
            return
        if self.measured():
            self.bands[str(self.band)] = self.costs_at_band()
        self.band, costs = band, self.bands.pop(str(band), None)
        self.plain_time, self.calibration, self.spread_tries = None, None, 0
        try:
            for w, shape in self.shapes.items():
                shape.resume_costs(costs and costs["shapes"][str(w)])
            self.plain_time, self.calibration = (float(costs["plain_time"]), []) if costs else (None, None)
        except (AttributeError, KeyError, TypeError, ValueError):  # a damaged profile's: measured afresh
            for shape in self.shapes.values():
                shape.resume_costs(None)

    def expected_tokens(self, k: int, width: int = 1) -> float:
        return self.shapes[width].expected_tokens(k, self.outlook if width == min(self.shapes) else None)

    def next_draft_len(self, remaining: int, outlook: list[float] | None = None) -> int:
        """outlook: the drafter's estimate of each draft's acceptance in its next chain, each given the ones
        before passed (None: it makes none)."""
        self.rounds += 1
        self.outlook = outlook
        unmeasured = [w for w, shape in self.shapes.items() if shape.slope is None]
        chain = self.shapes[min(self.shapes)]
        if self.plain_time is None or self.rounds % (4 * self.probe_every) == 0:
            k = 0  # measure (and now and then re-measure) the cost of a plain step
        elif outlook == []:  # asking would cost a round that does not run one ahead, for no draft
            k, self.note = 0, "drafting off: the drafter has nothing to draft here"
        elif unmeasured:
            k, self.width = 1, unmeasured[0]  # measure the cost of drafting with the cheapest draft: where
            # drafting cannot pay, exploring at the longest length cost ~13% of a short generation
        elif self.max_len >= 3 and self.spread_tries < 2 and set(chain.costs) == {1}:
            # once, a longer chain: what a round costs whatever its length (a block drafter's forward, a verify's
            # fixed share) shows only beside another length
            k, self.width, self.spread_tries = max(2, self.max_len // 2), min(self.shapes), self.spread_tries + 1
        else:
            rates = self.rates(remaining)
            if self.calibration is not None:  # from a profile that drafts: its first rounds draft whatever one
                rates = {key: rate for key, rate in rates.items() if key[0]} or rates  # rejection says
            k, self.width = max(rates, key=rates.__getitem__)
            # a close runner-up next to it, not timed of late, is timed again: round times are noisy, and a length
            # never timed again once it looked dearer than it is would never be chosen again
            shape, rate = self.shapes[self.width], rates[k, self.width]
            for near in (k - 1, k + 1) if k and self.calibration is None else ():
                if (near and rates.get((near, self.width), 0) >= (1 - CLOSE) * rate
                        and self.rounds - shape.timed.get(near, -STALE_ALONE - 1) > STALE_ALONE):
                    k = near
                    break
            break_even = chain.cost(1) - 1
            # a cheap probe: has the text become predictable? The rarer, the closer break-even is to "always
            # right" (up to 8x rarer): a probe costs two rounds, and the cost of drafting does not change with the
            # text. Or the probe's second round: the first resumed drafting (no cost signal), and a cost once
            # overestimated would otherwise keep drafting off for good
            if k == 0 and (self.uncosted or (probe_due(self.rounds, self.probe_every, break_even) if outlook is None
                                             else self.cost_probe_due(outlook))):
                k, self.width = 1, min(self.shapes)
            if k:
                tree = f", trees of width {self.width}" if self.width > 1 else ""
                self.note = f"draft length {k}{tree}: expected {self.expected_tokens(k, self.width):.2f} tokens/round"
            elif break_even > 1:
                self.note = (f"drafting off: one draft costs {break_even:.2f} plain steps here, more than even an "
                             "always-right draft gains")
            elif outlook is not None:
                self.note = (f"drafting off: the drafter expects its next first draft to pass {outlook[0]:.0%} of the "
                             f"time, below break-even {break_even:.0%}")
            else:
                self.note = (f"drafting off: recent first-draft acceptance {chain.acceptance[0]:.0%} is below "
                             f"break-even {break_even:.0%}")
        self.draft_len = k
        return max(0, min(k, remaining - 1))

    def cost_probe_due(self, outlook: list[float]) -> bool:
        """With the drafter's outlook (learnt from the text whether drafted or not) a probe re-times only what
        drafting costs: past the untimed rounds, `probe_every` rounds after the last that drafted, where the chain
        would pay were drafting half as dear as measured (an n-gram profile kept one slow round's 2.7 plain steps
        for a draft and drafted nothing for good). At most two rounds in `probe_every`, where a copy is expected."""
        if self.rounds <= UNTIMED_ROUNDS or self.rounds - self.drafted_at <= self.probe_every:
            return False
        chain = self.shapes[min(self.shapes)]
        return any(chain.expected_tokens(k, outlook) > 1 + (chain.cost(k) - 1) / 2
                   for k in range(1, min(len(outlook), self.max_len) + 1))

    def rates(self, remaining: int | None = None) -> dict[tuple[int, int], float]:
        """Expected tokens per plain step's time of each (draft length, width) worth weighing: those measured or
        between two measured, and the first past the longest measured while `remaining` tokens (None: no end in
        sight) repay trying it (HORIZON_ALONE rounds of it)."""
        rates = {}
        for w, shape in self.shapes.items():
            shape.explore(self.rounds)
            longest = max(shape.costs, default=0)
            for k in range(self.max_len + 1):
                expected = self.expected_tokens(k, w)
                if k > longest and remaining is not None and remaining < HORIZON_ALONE * expected:
                    break
                rates[(k, w)] = expected / shape.cost(k)
                if k > longest:
                    break
        return rates

    def best(self, remaining: int | None = None) -> tuple[int, int]:
        """The (draft length, width) expected to make the most tokens per second (every shape's cost measured)."""
        rates = self.rates(remaining)
        return max(rates, key=rates.__getitem__)

    def explain(self) -> list[str]:
        """Why it drafts what it drafts: the decision, each length's expected speed against plain decoding (a
        length not yet measured marked "guessed"), the acceptance per draft position and the round costs."""
        lines = [self.note]
        if not self.measured():
            return lines + ["still measuring: a plain step, then a draft"]
        for w, shape in self.shapes.items():
            kind = f"trees of width {w}" if w > 1 else "chains"
            lines.append(f"{kind}: " + ", ".join(
                f"k={k} {rate:.2f}x" + ("" if k in shape.costs else " (guessed)")
                for (k, width), rate in self.rates().items() if width == w and k))
            lines.append(f"  acceptance by position {' '.join(f'{a:.0%}' for a in shape.acceptance)}; a round costs "
                         + ", ".join(f"k={k} {c:.2f}" for k, c in sorted(shape.costs.items()))
                         + f" plain steps ({self.plain_time * 1000:.0f} ms) at contexts {band_range(self.band)}")
            if self.stopped and w == min(self.shapes):
                lines.append(f"  {self.stopped} chains stopped where the drafter was unsure of its next draft")
            if self.outlook is not None and w == min(self.shapes):
                lines.append("  the drafter expects of its next chain, by position: "
                             + (" ".join(f"{a:.0%}" for a in self.outlook[: self.max_len]) or "no draft"))
        return lines

    def cut(self, confidence: list[float]) -> int:
        """How many of a chain's drafts to verify, given the drafter's estimate of each one's acceptance: the
        number (at least one) with the most expected tokens per round time under this run's costs."""
        chain = self.shapes[min(self.shapes)]
        if chain.slope is None or not confidence:
            return len(confidence)
        rates, expected, passed = {}, 1.0, 1.0
        for k, chance in enumerate(confidence, 1):
            passed *= chance
            expected += passed
            rates[k] = expected / chain.cost(k)
        return max(rates, key=rates.__getitem__)

    def go_on(self, confidences: list[list[float]]) -> bool:
        """Whether the chain (`confidences`: its one row's, a draft model's probability of each of its drafts)
        drafts one more: while it pays under this run's costs (`one_more_pays`)."""
        chain = self.shapes[min(self.shapes)]
        if chain.slope is None:
            return True
        j = len(confidences[0])
        go_on = one_more_pays(confidences, 0, chain.cost(j), chain.cost(j + 1))
        self.stopped += not go_on
        return go_on

    def drafts_at(self, rows: int = 1) -> bool:
        """Whether the next sequence is worth readying to draft (its drafter's work on the prompt): yes until the
        costs measured say that no draft pays at the acceptance seen; its drafter then starts on the positions it
        decodes, if drafting turns on (probes included)."""
        return not self.measured() or self.best()[0] > 0

    def observe(self, draft_len: int, accepted: int, seconds: float | None,
                rows: list[tuple[int, int]] | None = None, asked: int | None = None) -> None:
        """Learn from a finished round: how far its drafts got, and how long it took (None: not known); `asked`:
        the drafts it asked for, if the drafter had fewer. One that asked and got none (n-gram found nothing) says
        nothing of a draft's cost nor of a plain step's (it does not run one ahead as plain steps do)."""
        if draft_len == 0 and asked:
            self.uncosted = False  # a probe that found nothing to draft: the next is a probe's first round again
            return
        d, shape = self.decay, self.shapes[self.width]
        for j in range(min(draft_len, accepted + 1)):  # positions the verifier actually judged
            shape.judge(j, j < accepted, d)
            shape.judged[j] = self.rounds
        kind = self.width if draft_len else 0
        first_of_kind = kind not in self.warmed_up
        self.drafted_at = self.rounds if draft_len else self.drafted_at
        resumed, self.previous_len = draft_len > 0 and self.previous_len == 0, draft_len
        # fresh: the round after one that resumed drafting (a probe's second), the first cost since drafting paused
        fresh, self.uncosted = self.uncosted, resumed
        if first_of_kind or resumed:  # compiling, or a drafter catching up on the rounds it sat out: no cost signal
            self.warmed_up.add(kind)
            return
        if seconds is None:
            return
        if draft_len == 0:
            first = self.plain_time is None or self.calibration is not None
            self.plain_time = seconds if first else d * self.plain_time + (1 - d) * seconds
            self.calibration = None
        elif self.plain_time is not None:
            r = seconds / self.plain_time - 1
            if self.calibration is not None:  # the profile's round costs hold; this machine's speed now may not
                self.calibration.append(seconds / shape.cost(draft_len))  # (other load, a longer context)
                self.plain_time = sum(self.calibration) / len(self.calibration)
                if len(self.calibration) == CALIBRATION:
                    self.calibration = None
                return
            shape.learn(draft_len, r, PROBE_WEIGHT if fresh else 1 - d)
            shape.timed[draft_len] = self.rounds
