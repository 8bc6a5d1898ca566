"""The round, written once for one row or many: plan -> propose -> one target forward -> verify -> keep -> emit.

Every row drafts for itself (its drafter's chain or token tree, its own length, 0 allowed), the target verifies
all rows in one forward over a runner (`RaggedBatch` for a batch: row i feeds `[last, *drafts_i]` or its tree,
padded to the longest; `OneRow` for a lone sequence: the target's own cache, no padding, no mask), each row's
verdict comes from the same rule (`verify_draft`, or `tree_draws` + `walk_tree`, its own seed's keys, its grammar,
penalties and log-probabilities), and each row keeps its own accepted positions. One host synchronisation per
round. A plain round (no row drafts) plans the next one before its tokens reach the host and, when that one is
plain too, starts its step meanwhile, as mlx-lm's generate_step does.

The draft length is a policy's: with one row, the single-sequence policy (`AdaptiveDraftLength` or a pin: at the
context depth's costs, with the drafter's outlook and its chains cut by their confidence, its first rounds
untimed); with several, the batch's (`BatchDraftLength`, the rows' chains stopped together where their drafter
is unsure); a row's own pinned length first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import mlx.core as mx

from ..core.draft import Draft
from ..core.events import Done, Round, Text, emit
from ..core.grammar import FORCED_MOST, Grammar
from ..core.prediction import Prediction
from ..core.sampling import SamplingParams, token_logprobs
from ..core.stats import Stats
from ..core.text_stream import TextStream
from ..core.verify import position_keys, tree_draws, verify_draft, walk_tree
from ..policy.interface import DraftPolicy
from ..policy.sequence import UNTIMED_ROUNDS, FixedDraftLength
from ..runners.vision import Images
from ..seams.errors import SpecError


@dataclass
class Job:
    prompt: list[int]  # token ids
    params: SamplingParams = SamplingParams()
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int = 0
    draft_len: int | None = None  # this row's own pinned draft length (0: none); None: the batch's policy
    grammar: object = None  # grammar.Grammar: what this row's output must match (None: anything)
    logprobs: int | None = None  # each Token's log-probability and this many likeliest tokens' (None: none)
    prediction: list[int] | None = None  # its predicted output (Predicted Outputs), which it drafts from
    images: Images | None = None  # its prompt's images (runners/vision.py; None: text only)

    def portable(self) -> Job:
        """This job as it crosses to other ranks (`distributed.Lockstep`): its grammar as its source."""
        return replace(self, grammar=self.grammar.source) if self.grammar else self

    def rebuilt(self, tokenizer) -> Job:
        """A job that crossed (`portable`), its grammar built again over `tokenizer`."""
        return replace(self, grammar=Grammar(tokenizer, *self.grammar)) if self.grammar else self


class Row:
    """One sequence: its tokens, text, keys and statistics; `key` names it to the caller."""

    def __init__(self, key, job: Job, tokenizer, drafter_name: str):
        if not job.prompt:
            raise SpecError("the prompt is empty: give some text to continue")
        self.key, self.job = key, job
        self.context, self.generated = list(job.prompt), []
        self.text, self.seed = TextStream(tokenizer, list(job.stop)), mx.random.key(job.seed)
        self.random = self.seed  # what its drafts' keys are split off
        self.stats = Stats(drafter=drafter_name, prompt_tokens=len(job.prompt),
                           image_tokens=job.images.features.shape[0] if job.images else 0)
        self.stop_reason: str | None = None
        self.prediction = Prediction(job.prediction, len(job.prompt)) if job.prediction else None
        self.forced = [0, 0]  # drafts of the text its grammar forces: drafted, accepted
        self.prefill = None  # a batch row's prompt's cache (a RaggedBatch) while it is prefilled, before it joins
        self.prefilled = False  # whether `prefill` holds the whole prompt
        self.ready = True  # whether its drafter works on its prompt (else it starts on what the row decodes)
        self.read_hidden = None  # what reads the hidden states its prompt's prefill keeps (None: none kept)
        self.drafter_held = None  # what its drafter held of the cached sequence its prompt starts from
        self.absorber = None  # its drafter taking its prompt's features as they run (`BatchDrafter.absorber`)
        self.policy = None  # what chose its last round's draft length
        self.started = time.perf_counter()

    def finish(self) -> list:
        """The events that end this row: the text held back for a stop string that never came, and Done."""
        tail = self.text.finish()
        self.stats.decode_seconds = time.perf_counter() - self.started - self.stats.prefill_seconds
        self.stats.generated_tokens = len(self.generated)
        self.stats.record_memory()
        if self.prediction:
            self.stats.prediction = (self.prediction.accepted, self.prediction.rejected)
        if self.forced[0]:
            self.stats.forced = tuple(self.forced)
        if self.policy is not None:
            self.stats.policy_reasons = self.policy.explain()[1:]
        return [Text(tail)] * bool(tail) + [Done(self.stop_reason, self.text.text, self.generated, self.stats)]


def masked(row: Row, logits: mx.array, draft: Draft) -> mx.array:
    """A row's verified logits, masked at each position by its grammar's state along the drafts before it (a
    tree's: along each node's ancestors)."""
    if row.job.grammar is None:
        return logits
    if draft.parents is None:
        return row.job.grammar.masked(logits, draft.tokens.tolist())
    return row.job.grammar.masked_tree(logits, draft.prefixes())


@dataclass
class Plan:
    """A round's draft length per row and keys, and, once its plain step runs, that step's (tokens, hidden)."""

    lengths: list[int]
    draft_keys: list[mx.array]
    verify_keys: list[mx.array]
    step: tuple[mx.array, mx.array | None] | None = None
    policy: DraftPolicy | None = None  # the policy that planned it, which learns from it
    alone: bool = False  # planned by the single-sequence policy (one row)
    predicted: list[bool] | None = None  # per row: its length is its prediction's (None: no row's is)

    def select(self, rows: list[int]) -> "Plan":
        """The plan of the rows at `rows` (indices), those that stay."""
        index = mx.array(rows, dtype=mx.int32)
        step = self.step and (self.step[0][index], None if self.step[1] is None else self.step[1][index])
        return Plan(*([part[i] for i in rows] for part in (self.lengths, self.draft_keys, self.verify_keys)), step,
                    self.policy, self.alone, self.predicted and [self.predicted[i] for i in rows])


def stop_rule(policy: DraftPolicy, chosen: list[bool]) -> Callable[[list[list[float] | None]], bool] | None:
    """The rule that stops a round's chains where their drafter is unsure (`BatchDrafter.stop_by`; None: none
    stop): `policy`'s, over the rows whose length it `chose`; while a row with a length of its own (a pin) drafts,
    every row drafts on: their drafts cost nothing while its own go on."""
    if not policy.stops or not any(chosen):
        return None
    return lambda confidences: any(c is not None and not mine for c, mine in zip(confidences, chosen)) or \
        policy.go_on([c for c, mine in zip(confidences, chosen) if c is not None and mine])


class RoundLoop:
    """Rounds over rows on one runner: `RaggedBatch` or `OneRow`, each with `forward(tokens (B, n), lengths,
    trees)` -> logits (B, n, V), `mark()` before a round's forward and `keep(kept)` after it."""

    def __init__(self, runner, tokenizer, drafters=None, read_hidden: Callable[[], mx.array] | None = None,
                 policy: DraftPolicy | None = None, alone: Callable[[], DraftPolicy] | None = None,
                 tree_width: int = 1):
        """drafters: a `BatchDrafter` for the runner's rows (None: plain decoding); read_hidden: the target's hidden
        states (B, n, H) after a forward, for drafters that read them; policy: the draft-length policy of rounds of
        several rows; alone: the one of rounds with one row, asked each round (a pin may replace it; None:
        `policy`); tree_width: the drafter's widest trees, which the single-sequence policy may narrow."""
        self.runner, self.tokenizer, self.drafters = runner, tokenizer, drafters
        self.read_hidden = read_hidden if drafters else None
        self.policy, self.alone, self.tree_width = policy, alone, tree_width
        self.plan: Plan | None = None  # the next round's, made during the last one (its plain step may run)
        self.lone, self.rounds_alone = None, 0  # the row decoding alone (None: none), its rounds alone
        self.agree: Callable[[list[list[int]], float | None], float | None] | None = None  # (each row's new
        # tokens, the round's seconds) -> the seconds to learn from: where ranks agree on rank 0's (and a stop)
        self.parts: dict | None = None  # a dict: each speculative round's draft and verify seconds, apart

    def policy_for(self, rows: int) -> DraftPolicy:
        """The draft-length policy for a round of `rows` rows."""
        return self.alone() if self.alone and rows == 1 else self.policy

    def select(self, rows: list[int]) -> None:
        """Keep only the rows at `rows` (indices), in that order: the runner's, the drafters' and the plan's."""
        self.runner.select(rows)
        if self.drafters:
            self.drafters.select(rows)
        self.plan = self.plan.select(rows) if self.plan and rows else None

    def make_plan(self, rows: list, emitting: int = 0, lengths: list[int] | None = None) -> Plan:
        """A round's draft length per row (the policy's, or the row's own pin; `lengths`: these) and keys, each
        row's as alone; `emitting`: tokens the rows still emit before it (a plan made one round ahead)."""
        policy, alone = self.policy_for(len(rows)), bool(self.alone) and len(rows) == 1
        if alone and self.lone is not rows[0]:  # a row now alone: as alone, it begins (its costs are its context
            self.lone, self.rounds_alone = rows[0], 0  # depth's) and its first rounds are not timed
            policy.begin(len(rows[0].context))
        remaining = [row.job.max_tokens - len(row.generated) - emitting for row in rows]
        if lengths is None:
            policy.resize(len(rows))
            longest = policy.next_draft_len(max(remaining), self.drafters.outlook if self.drafters else None)
            lengths = [longest if row.job.draft_len is None else row.job.draft_len for row in rows]
        planned = [row.prediction.planned(row.context) if row.prediction else 0 for row in rows]
        lengths = [own or k for own, k in zip(planned, lengths)]  # a row on its prediction drafts from it
        if self.drafters and self.tree_width > 1:  # trees as wide as the policy says, unless a row has its own pin
            pinned = any(row.job.draft_len is not None for row in rows)
            self.drafters.set_width(self.tree_width if pinned else policy.width)
        plan = Plan([], [], [], policy=policy, alone=alone, predicted=[own > 0 for own in planned] if any(planned)
                    else None)
        for row, left, wanted in zip(rows, remaining, lengths):
            row.random, draft_key = mx.random.split(row.random)
            plan.lengths.append(max(0, min(wanted, left - 1)))
            plan.draft_keys.append(draft_key)
            plan.verify_keys.append(position_keys(row.seed, len(row.context) + emitting, plan.lengths[-1] + 1))
        return plan

    def plain_step(self, rows: list, plan: Plan, last: mx.array) -> None:
        """Start `plan`'s round, a plain step for every row (lazy, evaluation under way): the target's forward over
        `last` (B, 1), each row's next token by its own rule and key."""
        logits = self.runner.forward(last, [1] * len(rows))
        hidden = self.read_hidden() if self.read_hidden else None
        plan.step = (mx.stack([verify_draft(Draft.empty(), logits[i], row.job.params, row.context, key)[1]
                               for i, (row, key) in enumerate(zip(rows, plan.verify_keys))]), hidden)
        mx.async_eval(plan.step[0])

    def round(self, rows: list, ahead: bool) -> list[tuple[object, object]]:
        """Draft for every row, verify all rows in one forward, keep each row's accepted drafts; returns the
        rows' (key, Round / Token) events. A plain round (no row drafts), with `ahead` (no prompt waiting to
        join, no ranks to agree with first), makes the next round's plan before its tokens reach the host and,
        when that one is plain too, starts it meanwhile (penalties, grammars and log-probabilities, read on the
        host, run one round at a time)."""
        start, plan, self.plan = time.perf_counter(), self.plan or self.make_plan(rows), None
        if any(plan.lengths) or any(row.job.params.has_penalties or row.job.grammar or row.job.logprobs is not None
                                    for row in rows):
            return self.speculate(rows, plan, start)
        started_ahead = plan.step is not None
        if not started_ahead:
            self.plain_step(rows, plan, mx.array([row.context[-1:] for row in rows], dtype=mx.int32))
        tokens, hidden = plan.step
        if ahead and max(row.job.max_tokens - len(row.generated) for row in rows) > 1:  # a pending plan holds joins
            self.plan = self.make_plan(rows, emitting=1)
            if not any(self.plan.lengths):
                self.plain_step(rows, self.plan, tokens[:, None])
        starts_next = self.plan is not None and self.plan.step is not None
        new_tokens = [[token] for token in tokens.tolist()]
        events = self.emit(rows, [Round(0, 0)] * len(rows), new_tokens)
        if self.drafters:
            self.drafters.accept([row.context for row in rows], [0] * len(rows), hidden)
        # A run of plain steps is timed by its middle rounds (and a lone one): while its first round runs, the next
        # one's step can run too (a CPU evaluates them in turn), and its last round can find its step done.
        seconds = time.perf_counter() - start if started_ahead == starts_next else None
        self.observe(plan, 0, [Round(0, 0)] * len(rows), seconds, new_tokens)
        return events

    def speculate(self, rows: list, plan: Plan, start: float) -> list[tuple[object, object]]:
        """A round with drafts (or penalties, grammars, log-probabilities): draft, verify every row's chain or
        token tree in one forward, keep what each accepts."""
        drafts, forced = self.force(rows, self.propose(rows, plan))
        if any(forced):  # the keys of the positions past the planned ones (each position's, as planned)
            plan.verify_keys = [position_keys(row.seed, len(row.context), d.tokens.shape[0] + 1) if f else keys
                                for row, d, f, keys in zip(rows, drafts, forced, plan.verify_keys)]
        if self.parts is not None:
            mx.eval([d.tokens for d in drafts])
            self.parts["draft"], start = time.perf_counter() - start, time.perf_counter()
        width = 1 + max(d.tokens.shape[0] for d in drafts)
        inputs = mx.stack([mx.concatenate([mx.array(row.context[-1:], dtype=mx.int32), d.tokens,
                                           mx.zeros((width - 1 - d.tokens.shape[0],), dtype=mx.int32)])
                           for row, d in zip(rows, drafts)])
        trees = [None if d.parents is None else (d.attention(), [0, *d.depths()]) for d in drafts]
        self.runner.mark()
        logits = self.runner.forward(inputs, [1 + d.tokens.shape[0] for d in drafts], trees if any(trees) else None)
        hidden = self.read_hidden() if self.read_hidden else None
        if self.parts is not None:
            mx.eval(logits)
            self.parts["verify"] = time.perf_counter() - start
        verdicts = [verify_draft(d, masked(row, logits[i, :1 + d.tokens.shape[0]], d), row.job.params, row.context,
                                 keys[:1 + d.tokens.shape[0]]) if d.parents is None else
                    tree_draws(d, masked(row, logits[i, :1 + d.tokens.shape[0]], d), row.job.params, row.context, keys)
                    for i, (row, d, keys) in enumerate(zip(rows, drafts, plan.verify_keys))]
        mx.eval([d.tokens for d in drafts], verdicts)  # the round's only host synchronisation
        return self.keep(rows, plan, drafts, forced, logits, hidden, verdicts, start)

    def propose(self, rows: list, plan: Plan) -> list[Draft]:
        """Every row's draft for `plan`: its prediction's, or its drafter's, stopped or cut where the drafter is
        unsure (by its policy); then cut where its grammar rejects a one-hot draft anyway."""
        predicted = plan.predicted or [False] * len(rows)
        drafts = [Draft.empty() for _ in rows]
        if self.drafters:
            self.drafters.constrain([row.job.grammar for row in rows])  # chains that follow the grammar
            self.drafters.stop_by(stop_rule(plan.policy, [row.job.draft_len is None and not own
                                                         for row, own in zip(rows, predicted)]))
            drafts = self.drafters.propose([row.context for row in rows], [0 if own else k for k, own in zip(
                plan.lengths, predicted)], [row.job.params for row in rows], plan.draft_keys)
        if plan.policy.cuts:  # a chain shortened by the drafter's own estimates
            drafts = [d if d.confidence is None or row.job.draft_len is not None else
                      d.first(plan.policy.cut(d.confidence.tolist())) for row, d in zip(rows, drafts)]
        drafts = [Draft(mx.array(row.prediction.draft(row.context, k), dtype=mx.int32)) if own else d
                  for row, d, k, own in zip(rows, drafts, plan.lengths, predicted)]
        return [d.first(row.job.grammar.valid_prefix(d.tokens.tolist()))
                if row.job.grammar and d.q is None and d.parents is None else d
                for row, d in zip(rows, drafts)]  # one-hot drafts a grammar rejects can only be rejected

    def force(self, rows: list, drafts: list[Draft]) -> tuple[list[Draft], list[int]]:
        """Every chain under a grammar, while drafting, with the tokens of the text the grammar forces after it
        appended (`Grammar.forced`); how many each row got."""
        lengths = [0] * len(rows)
        if not self.drafters:
            return drafts, lengths
        for i, (row, d) in enumerate(zip(rows, drafts)):
            if row.job.grammar is not None and d.parents is None:
                room = row.job.max_tokens - len(row.generated) - 1 - d.tokens.shape[0]
                tokens = row.job.grammar.forced(d.tokens.tolist(), min(room, FORCED_MOST))
                drafts[i], lengths[i] = d.then(tokens), len(tokens)
        return drafts, lengths

    def keep(self, rows: list, plan: Plan, drafts: list[Draft], forced: list[int], logits: mx.array,
             hidden: mx.array | None, verdicts: list, start: float) -> list[tuple[object, object]]:
        """What each row keeps of its verified chain ((accepted, next), evaluated; its last `forced` drafts
        the grammar's) or tree (its draws, evaluated): the runner's cache and the drafters keep it, the rows emit
        it."""
        rounds, new_tokens, kept, drafters_rounds = [], [], [], []
        for row, d, verdict, own, f in zip(rows, drafts, verdicts, plan.predicted or [False] * len(rows), forced):
            n = d.tokens.shape[0]
            if d.parents is None:
                accepted = verdict[0].item()
                if own and n > f:
                    row.prediction.verdict(n - f, min(accepted, n - f))
                if f:
                    row.forced[0] += f
                    row.forced[1] += max(0, accepted - (n - f))
                rounds.append(Round(n, accepted, n))
                drafters_rounds.append(Round(n - f, min(accepted, n - f), n - f))
                new_tokens.append(d.tokens[:accepted].tolist() + [verdict[1].item()])
                kept.append(accepted + 1)
            else:
                path, tokens = walk_tree(d, verdict.tolist())
                rounds.append(Round(max(d.depths()) if d.depth is None else d.depth, len(path), n))
                drafters_rounds.append(rounds[-1])
                new_tokens.append(tokens)
                kept.append([0, *(node + 1 for node in path)])
        self.runner.keep(kept)
        width = logits.shape[1]
        trees = any(d.parents is not None for d in drafts)
        if hidden is not None and trees:  # a tree row's states at its kept inputs, in order
            index = [keep if isinstance(keep, list) else list(range(keep)) for keep in kept]
            index = mx.array([i + [0] * (width - len(i)) for i in index])
            hidden = mx.take_along_axis(hidden, index[..., None], axis=1)
        logprobs = [None if row.job.logprobs is None else  # the rows that scored the emitted tokens
                    token_logprobs(logits[i][mx.array(keep) if isinstance(keep, list) else mx.arange(keep)], tokens,
                                   row.job.logprobs)
                    for i, (row, keep, tokens) in enumerate(zip(rows, kept, new_tokens))]
        events = self.emit(rows, rounds, new_tokens, logprobs)
        if self.drafters:
            self.drafters.accept([row.context for row in rows], [verdict.accepted for verdict in rounds], hidden,
                                 tree_logits=[logits[i] if d.parents is not None else None
                                              for i, d in enumerate(drafts)] if trees else None)
        self.observe(plan, width - 1, drafters_rounds, time.perf_counter() - start, new_tokens)
        return events

    def observe(self, plan: Plan, longest: int, rounds: list[Round], seconds: float | None,
                new_tokens: list[list[int]]) -> None:
        """The round `plan` planned, to the policy that planned it: `longest` drafts (every row paid for them),
        each row's verdict, in `seconds` (None: the round's time is not its own), its tokens `new_tokens`."""
        if self.agree:
            seconds = self.agree(new_tokens, seconds)
        if plan.predicted:  # drafts from predictions say nothing of the drafter's
            return
        if not plan.alone:
            self.lone = None
            if seconds is not None:
                plan.policy.observe(longest, 0, seconds, rows=[(v.draft_len, v.accepted) for v in rounds])
            return
        self.rounds_alone += 1  # as alone, a lone row's first rounds straddle the prefill and the rows that left
        plan.policy.observe(rounds[0].draft_len, rounds[0].accepted,
                            seconds if self.rounds_alone > UNTIMED_ROUNDS else None, asked=plan.lengths[0])

    def emit(self, rows: list, verdicts: list[Round], new_tokens: list[list[int]],
             logprobs: list | None = None) -> list[tuple[object, object]]:
        """Each row's round (its verdict, and the tokens it emits: accepted drafts and the target's next) into its
        context, statistics and events (with each token's (log p, likeliest) from `logprobs`, a row's or None)."""
        events = []
        for row, verdict, emitted, scored in zip(rows, verdicts, new_tokens, logprobs or [None] * len(rows)):
            row.context += emitted
            row.stats.record_round(verdict)
            row.stats.batch_size = max(row.stats.batch_size, len(rows))
            if row.job.grammar is not None:
                row.job.grammar.advance(emitted)
            tokens, row.stop_reason = emit(emitted, verdict.accepted, row.generated, row.text,
                                           self.tokenizer.eos_token_ids, row.job.max_tokens)
            for token, (logprob, top) in zip(tokens, scored or []):
                token.logprob, token.top_logprobs = logprob, top
            events += [(row.key, event) for event in [verdict, *tokens]]
            row.policy = self.policy_for(len(rows)) if row.job.draft_len is None or not self.drafters else \
                FixedDraftLength(row.job.draft_len)
            row.stats.policy = row.policy.note
        return events
