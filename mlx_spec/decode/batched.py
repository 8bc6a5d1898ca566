"""Batched speculative decoding: many sequences decode together, each keeping its own accepted count.

Every round, each row drafts for itself (the drafter's `batched(target_batch)`: one n-gram index per row, or
every row's draft step in one forward of the draft model, MTP layer or head, the drafters that read the target's
hidden states getting them from the decoder; its own length, 0 allowed; a token tree, by a drafter of the row's
own), the target verifies all rows in one forward over a `RaggedBatch` (row i feeds `[last, *drafts_i]` or its
tree, padded to the longest), each row's verdict comes from the same rule as alone (`verify_draft` or
`verify_tree`, its own seed's keys, its grammar, its log-probabilities), and each row keeps its own accepted
positions (a tree's path). Finished rows leave and queued requests join between rounds (continuous batching); a
joining prompt is prefilled in a batch of its own (a chunk per round while others decode; prompts that join while
none decodes together, where their padding stays small), then merged. One host synchronisation per round. The
draft length is the policy's (`BatchDraftLength`, which learns what a forward of so many tokens costs): it turns
drafting off where the batch makes the forward compute-bound. While one row is
left (a lone server request), rounds are the single-sequence policy's (`AdaptiveDraftLength`, from the engine's
profile), as alone: at its context depth's costs, with the drafter's outlook (n-gram) and its chains cut by their
confidence (DSpark).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import mlx.core as mx

from ..core.draft import Draft
from ..core.events import Done, Result, Round, Text, collect, emit
from ..core.sampling import SamplingParams, token_logprobs
from ..core.stats import Stats
from ..core.text_stream import TextStream
from ..core.verify import position_keys, tree_draws, verify_draft, walk_tree
from ..policy.batch import BatchDraftLength
from ..policy.sequence import UNTIMED_ROUNDS, AdaptiveDraftLength, FixedDraftLength
from ..runners.ragged import RaggedBatch, RaggedKVCache, check_batches
from ..runners.target import PREFILL_CHUNK
from ..seams.errors import SpecError

MAX_BATCH = 32  # the default batch size's upper bound
PADDING = 1.25  # prompts prefilled together run at most this many tokens per prompt token (the rest padding)
TOGETHER = 4096  # and at most this many tokens in all (a group's rows x its longest prompt)


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


class Row:
    """One sequence of the batch: its tokens, text, keys and statistics; `key` names it to the caller."""

    def __init__(self, key, job: Job, tokenizer, drafter_name: str):
        if not job.prompt:
            raise SpecError("the prompt is empty: give some text to continue")
        self.key, self.job = key, job
        self.context, self.generated = list(job.prompt), []
        self.text, self.seed = TextStream(tokenizer, list(job.stop)), mx.random.key(job.seed)
        self.random = self.seed  # what its drafts' keys are split off
        self.stats = Stats(drafter=drafter_name, prompt_tokens=len(job.prompt))
        self.stop_reason: str | None = None
        self.prefill: RaggedBatch | None = None  # its prompt's cache while it is prefilled, before it joins
        self.prefilled = False  # whether `prefill` holds the whole prompt
        self.ready = True  # whether its drafter works on its prompt (else it starts on what the row decodes)
        self.read_hidden = None  # what reads the hidden states its prompt's prefill keeps (None: none kept)
        self.drafter_held = None  # what its drafter held of the cached sequence its prompt starts from
        self.policy = None  # what chose its last round's draft length
        self.started = time.perf_counter()

    def finish(self) -> list:
        """The events that end this row: the text held back for a stop string that never came, and Done."""
        tail = self.text.finish()
        self.stats.decode_seconds = time.perf_counter() - self.started - self.stats.prefill_seconds
        self.stats.generated_tokens = len(self.generated)
        self.stats.record_memory()
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


def left_to_prefill(row: Row) -> int:
    return len(row.job.prompt) - 1 - (int(row.prefill.offsets[0]) if row.prefill else 0)


def together(rows: list[Row]) -> list[list[Row]]:
    """The rows whose prompts to prefill together (each padded to the group's longest), longest first: on a CPU,
    four of 87-117 tokens took 7-16% less time together (padding adding 16% to their tokens) than one by one."""
    groups: list[list[Row]] = []
    for row in sorted(rows, key=lambda row: -len(row.job.prompt)):
        group, length = groups[-1] if groups else [], len(row.job.prompt)
        padded = (len(group) + 1) * len(group[0].job.prompt) if group else length
        if group and padded <= TOGETHER and padded <= PADDING * (sum(len(r.job.prompt) for r in group) + length):
            group.append(row)
        else:
            groups.append([row])
    return groups


def batch_problem(model, drafter=None) -> str | None:
    """Why this model and drafter decode one sequence at a time (None: they can be batched)."""
    if problem := RaggedBatch.problem(model):
        return f"batched decoding is not available for this model ({problem})"
    if drafter is not None and drafter.batched is None:
        return (f"the {drafter.name} drafter does not draft in batches yet (n-gram, draft models, MTP layers and "
                "heads, EAGLE-3 and Medusa heads, Gemma 4 assistants and block drafters do)")
    if drafter is not None and drafter.width > 1 and (problem := RaggedBatch.tree_problem(model)):
        return f"the model's token trees cannot be verified in batches: it {problem}; use --tree-width 1"
    if drafter is not None and (problem := drafter.batch_problem()):
        return f"the {drafter.name} drafter cannot draft in batches: {problem}"
    return None


def largest_batch(model, tokens_per_row: int, available: int, kv_bits: int | None = None,
                  kv_group_size: int = 64) -> int:
    """The most rows (up to MAX_BATCH) whose caches, `tokens_per_row` positions each, fit in half of `available`
    bytes: the KV bytes per position and the recurrent states' bytes per row measured on a one-token forward."""
    probe = RaggedBatch(model, rows=1, kv_bits=kv_bits, kv_group_size=kv_group_size)
    probe.forward(mx.array([[0]], dtype=mx.int32), [1])
    per_position = sum(c.nbytes for c in probe.caches if isinstance(c, RaggedKVCache)) / probe.capacity
    per_row = per_position * tokens_per_row + sum(c.nbytes for c in probe.recurrent)
    return int(max(1, min(MAX_BATCH, available // 2 // max(1, per_row))))


class BatchedDecoder:
    def __init__(self, model, tokenizer, drafter=None, draft_len: int | None = None, max_draft_len: int = 4,
                 read_hidden=None, kv_bits: int | None = None, kv_group_size: int = 64,
                 hidden_tail: int | None = None, prefixes=None, policy: BatchDraftLength | None = None,
                 alone: AdaptiveDraftLength | None = None):
        """drafter: one whose `batched(target_batch)` drafts for a batch (given the target's RaggedBatch; None:
        plain batched decoding); draft_len: pinned, or None for the adaptive policy per batch size; read_hidden:
        the target's hidden states after a forward (`target.hidden_reader`), for drafters that read them, over
        each prompt's last `hidden_tail` positions (None: all); kv_bits: the target's keys and values quantized;
        prefixes: the prompt cache (`prompt_cache.RowPrefixes`), which serves rows their prompts' cached prefixes
        and keeps what they hold when they finish (None: none); policy: the adaptive policy of an earlier batch of
        the same engine, to go on from (None: a new one); alone: the adaptive policy for rounds with one row
        (None: the batch's)."""
        if problem := batch_problem(model, drafter):
            raise SpecError(f"{problem}: use a batch size of 1")
        check_batches()
        drafter = drafter if draft_len != 0 else None
        self.model, self.tokenizer = model, tokenizer
        self.kv = {"kv_bits": kv_bits, "kv_group_size": kv_group_size}
        self.make_drafters = drafter.batched if drafter else None
        self.read_hidden, self.hidden_tail = (read_hidden if drafter else None), hidden_tail
        self.policy = ((policy or BatchDraftLength(max_draft_len)) if draft_len is None and drafter
                       else FixedDraftLength(draft_len if drafter else 0))
        self.alone = alone if draft_len is None and drafter else None
        self.lone, self.rounds_alone = None, 0  # the row decoding alone (None: none), its rounds alone
        self.name = drafter.name if drafter else "off"
        self.prefixes = prefixes

    def run(self, jobs: Iterable[Job], batch_size: int) -> Iterator[tuple[int, Result]]:
        """Decode every job, at most `batch_size` at a time; yields (its index in `jobs`, its Result) as each
        finishes."""
        queue, events = deque(enumerate(jobs)), {}
        for index, event in self.stream(lambda: queue.popleft() if queue else None, batch_size):
            events.setdefault(index, []).append(event)
            if isinstance(event, Done):
                yield index, collect(iter(events.pop(index)))

    def stream(self, take: Callable[[], tuple | None], batch_size: int,
               should_stop: Callable[[object], bool] = lambda key: False) -> Iterator[tuple[object, object]]:
        """Decode the jobs `take()` hands over ((key, Job), or None when none waits: asked whenever the batch has
        room), at most `batch_size` at a time, until none is left; yields (key, event): each row's Round, Token,
        Text and Done events as the engine's `stream` does. `should_stop(key)` ends a row after this round with
        stop reason "stopped". The batch's rows are `rows`, in order."""
        rows, joining, batch = [], deque(), RaggedBatch(self.model, **self.kv)
        drafters = self.drafters = self.make_drafters(batch) if self.make_drafters else None
        self.plan = None  # the next round's, made during the last one (a plain step may already be running)
        while True:
            while len(rows) + len(joining) < batch_size and (item := take()) is not None:
                joining.append(Row(*item, self.tokenizer, self.name))
            for row in [row for row in joining if should_stop(row.key)]:  # between its prefill's chunks
                joining.remove(row)
                row.stop_reason = "stopped"
                yield from ((row.key, event) for event in row.finish())
            if joining:
                self._prefill(batch, drafters, rows, joining)
            if not rows:
                if joining:
                    continue
                return
            yield from self._round(batch, drafters, rows, ahead=not joining)
            for row in rows:
                if not row.stop_reason and should_stop(row.key):
                    row.stop_reason = "stopped"
            if any(row.stop_reason for row in rows):
                staying = [i for i, row in enumerate(rows) if not row.stop_reason]
                for i, row in enumerate(rows):
                    if row.stop_reason:
                        self._store(batch, i, row.context)
                        yield from ((row.key, event) for event in row.finish())
                batch.select(staying)
                if drafters:
                    drafters.select(staying)
                rows = [rows[i] for i in staying]
                self.plan = self.plan.select(staying) if self.plan and staying else None

    def _prefill(self, batch: RaggedBatch, drafters, rows: list[Row], joining: deque) -> None:
        """Run one chunk of the joining prompt with the least left to prefill (while no row decodes, short prompts
        whose drafters read no hidden states first run together, `together`), and move the prefilled prompts
        into the batch: at once while rows decode; while none does, together with the other joining prompts,
        unless one of those has more than a chunk left (a long prompt does not hold up a short one). The caller
        takes new requests and drops stopped ones between calls."""
        waiting = [row for row in joining if not row.prefilled]
        for row in waiting if not rows else sorted(waiting, key=left_to_prefill)[:1]:
            if row.prefill is None:  # its drafter's work on its prompt (the hidden states it reads, a draft
                pin = row.job.draft_len  # model's prefill), unless drafting does not pay here
                sharing = len(rows) + len(joining)
                row.ready = self._policy(sharing).drafts_at(sharing) if pin is None else pin > 0
                row.read_hidden = self.read_hidden if row.ready else None
                row.prefill = self._cached(row)
        if not rows and not batch.recurrent:
            for group in together([row for row in waiting if row.read_hidden is None and row.prefill is None
                                   and len(row.job.prompt) <= PREFILL_CHUNK]):
                prefilled = RaggedBatch.prefilled(self.model, [row.job.prompt[:-1] for row in group], **self.kv)
                for i, row in enumerate(group):
                    self._store(prefilled, i, row.job.prompt[:-1], prompt=True)
                batch.join(prefilled)
                for row in group:
                    joining.remove(row)
                    self._joined(drafters, rows, row, None)
            waiting = [row for row in joining if not row.prefilled]
        if waiting:
            row = min(waiting, key=left_to_prefill)
            row.prefill = row.prefill or RaggedBatch(self.model, rows=1, **self.kv)
            row.prefilled = row.prefill.extend(row.job.prompt[:-1], row.read_hidden, self.hidden_tail)
        unfinished = [left_to_prefill(row) for row in joining if not row.prefilled]
        if self.plan or not (rows or not unfinished or max(unfinished) > PREFILL_CHUNK):
            return
        for row in [row for row in joining if row.prefilled]:
            joining.remove(row)
            self._store(row.prefill, 0, row.job.prompt[:-1], prompt=True)
            batch.join(row.prefill)
            self._joined(drafters, rows, row, mx.concatenate(row.prefill.hidden) if row.prefill.hidden else None)
            row.prefill = None

    def _cached(self, row: Row) -> RaggedBatch | None:
        """A one-row batch holding the start of `row`'s prompt that the prompt cache serves (None: none does)."""
        tail = (self.hidden_tail if row.read_hidden else 0) if self.read_hidden else 0
        found = self.prefixes and self.prefixes.find(row.job.prompt[:-1], tail)
        if not found:
            return None
        layers, row.stats.reused_prompt_tokens, row.drafter_held = found
        return RaggedBatch.holding(self.model, layers, found[1], **self.kv)

    def _store(self, batch: RaggedBatch, index: int, tokens: list[int], prompt: bool = False) -> None:
        """Keep what row `index` of `batch` holds (of `tokens`) in the prompt cache; `prompt`: a prompt just
        prefilled, kept where the target's cache cannot be cut back (a point the next turn may reuse)."""
        if self.prefixes and tokens and (not prompt or not self.prefixes.target.cuttable):
            held = self.drafters.row_state(index, tokens) if not prompt and self.drafters else None
            self.prefixes.store(tokens[:int(batch.offsets[index])], batch.row_positions(index), held)

    def _joined(self, drafters, rows: list[Row], row: Row, hidden: mx.array | None) -> None:
        """`row`, its prompt now in the batch's cache, joins the rows (and its drafter, with `hidden`)."""
        if drafters:
            drafters.join(row.context, hidden, row.ready, row.drafter_held)
        row.stats.prefill_seconds = time.perf_counter() - row.started
        rows.append(row)

    def _policy(self, rows: int):
        """The draft-length policy for a round of `rows` rows."""
        return self.alone if self.alone and rows == 1 else self.policy

    def _plan(self, rows: list[Row], emitting: int = 0) -> "Plan":
        """A round's draft length per row (the policy's, or the row's own pin) and keys, each row's as alone;
        `emitting`: tokens the rows still emit before it (a plan made one round ahead)."""
        policy = self._policy(len(rows))
        if policy is self.alone and self.lone is not rows[0]:  # a row now alone: as alone, it begins (its costs
            self.lone, self.rounds_alone = rows[0], 0  # are its context depth's) and its first rounds are not timed
            policy.begin(len(rows[0].context))
        remaining = [row.job.max_tokens - len(row.generated) - emitting for row in rows]
        policy.resize(len(rows))
        longest = policy.next_draft_len(max(remaining), self.drafters.outlook if self.drafters else None)
        plan = Plan([], [], [], policy=policy)
        for row, left in zip(rows, remaining):
            row.random, draft_key = mx.random.split(row.random)
            wanted = longest if row.job.draft_len is None else row.job.draft_len
            plan.lengths.append(max(0, min(wanted, left - 1)))
            plan.draft_keys.append(draft_key)
            plan.verify_keys.append(position_keys(row.seed, len(row.context) + emitting, plan.lengths[-1] + 1))
        return plan

    def _plain_step(self, batch: RaggedBatch, rows: list[Row], plan: "Plan", last: mx.array) -> None:
        """Start `plan`'s round, a plain step for every row (lazy, evaluation under way): the target's forward over
        `last` (B, 1), each row's next token by its own rule and key."""
        logits = batch.forward(last, [1] * len(rows))
        hidden = self.read_hidden() if self.read_hidden else None
        plan.step = (mx.stack([verify_draft(Draft.empty(), logits[i], row.job.params, row.context, key)[1]
                               for i, (row, key) in enumerate(zip(rows, plan.verify_keys))]), hidden)
        mx.async_eval(plan.step[0])

    def _round(self, batch: RaggedBatch, drafters, rows: list[Row], ahead: bool) -> list[tuple[object, object]]:
        """Draft for every row, verify all rows in one forward, keep each row's accepted drafts; returns the
        rows' (key, Round / Token) events. A plain round (no row drafts), with `ahead` (no prompt waiting to
        join), makes the next round's plan before its tokens reach the host and, when that one is plain too, starts
        it meanwhile (penalties, counted on the host, run one round at a time)."""
        start, plan, self.plan = time.perf_counter(), self.plan or self._plan(rows), None
        if any(plan.lengths) or any(row.job.params.has_penalties or row.job.grammar or row.job.logprobs is not None
                                    for row in rows):
            return self._speculate(batch, drafters, rows, plan, start)
        started_ahead = plan.step is not None
        if not started_ahead:
            self._plain_step(batch, rows, plan, mx.array([row.context[-1:] for row in rows], dtype=mx.int32))
        tokens, hidden = plan.step
        if ahead and max(row.job.max_tokens - len(row.generated) for row in rows) > 1:  # a pending plan holds joins
            self.plan = self._plan(rows, emitting=1)
            if not any(self.plan.lengths):
                self._plain_step(batch, rows, self.plan, tokens[:, None])
        starts_next = self.plan is not None and self.plan.step is not None
        events = self._emit(rows, [Round(0, 0)] * len(rows), [[token] for token in tokens.tolist()])
        if drafters:
            drafters.accept([row.context for row in rows], [0] * len(rows), hidden)
        # A run of plain steps is timed by its middle rounds (and a lone one): while its first round runs, the next
        # one's step can run too (a CPU evaluates them in turn), and its last round can find its step done.
        self._observe(plan, 0, [0] * len(rows), time.perf_counter() - start if started_ahead == starts_next else None)
        return events

    def _speculate(self, batch: RaggedBatch, drafters, rows: list[Row], plan: "Plan",
                   start: float) -> list[tuple[object, object]]:
        """A round with drafts (or penalties, grammars, log-probabilities): draft, verify every row's chain or
        token tree in one forward, keep what each accepts."""
        drafts = (drafters.propose([row.context for row in rows], plan.lengths, [row.job.params for row in rows],
                                   plan.draft_keys) if drafters else [Draft.empty() for _ in rows])
        if plan.policy.cuts:  # a lone row's chain shortened by the drafter's own estimates, as alone
            drafts = [d if d.confidence is None or row.job.draft_len is not None else
                      d.first(plan.policy.cut(d.confidence.tolist())) for row, d in zip(rows, drafts)]
        drafts = [d.first(row.job.grammar.valid_prefix(d.tokens.tolist()))
                  if row.job.grammar and d.q is None and d.parents is None else d
                  for row, d in zip(rows, drafts)]  # one-hot drafts a grammar rejects can only be rejected
        width = 1 + max(d.tokens.shape[0] for d in drafts)
        inputs = mx.stack([mx.concatenate([mx.array(row.context[-1:], dtype=mx.int32), d.tokens,
                                           mx.zeros((width - 1 - d.tokens.shape[0],), dtype=mx.int32)])
                           for row, d in zip(rows, drafts)])
        trees = [None if d.parents is None else (d.attention(), [0, *d.depths()]) for d in drafts]
        batch.mark()
        logits = batch.forward(inputs, [1 + d.tokens.shape[0] for d in drafts], trees if any(trees) else None)
        hidden = self.read_hidden() if self.read_hidden else None
        verdicts = [verify_draft(d, masked(row, logits[i, :1 + d.tokens.shape[0]], d), row.job.params, row.context,
                                 keys[:1 + d.tokens.shape[0]]) if d.parents is None else
                    tree_draws(d, masked(row, logits[i, :1 + d.tokens.shape[0]], d), row.job.params, row.context, keys)
                    for i, (row, d, keys) in enumerate(zip(rows, drafts, plan.verify_keys))]
        mx.eval([d.tokens for d in drafts], verdicts)  # the round's only host synchronisation
        return self._keep(batch, drafters, rows, plan, drafts, logits, hidden, verdicts, start)

    def _keep(self, batch: RaggedBatch, drafters, rows: list[Row], plan: "Plan", drafts: list[Draft],
              logits: mx.array, hidden: mx.array | None, verdicts: list, start: float) -> list[tuple[object, object]]:
        """What each row keeps of its verified chain ((accepted, next), evaluated) or tree (its draws, evaluated):
        the batch's cache and the drafters keep it, the rows emit it."""
        rounds, new_tokens, kept = [], [], []
        for d, verdict in zip(drafts, verdicts):
            n = d.tokens.shape[0]
            if d.parents is None:
                accepted = verdict[0].item()
                rounds.append(Round(n, accepted, n))
                new_tokens.append(d.tokens[:accepted].tolist() + [verdict[1].item()])
                kept.append(accepted + 1)
            else:
                path, tokens = walk_tree(d, verdict.tolist())
                rounds.append(Round(max(d.depths()) if d.depth is None else d.depth, len(path), n))
                new_tokens.append(tokens)
                kept.append([0, *(node + 1 for node in path)])
        batch.keep(kept)
        width = logits.shape[1]
        if hidden is not None and any(d.parents is not None for d in drafts):  # a tree row's states at its kept
            index = [keep if isinstance(keep, list) else list(range(keep)) for keep in kept]  # inputs, in order
            index = mx.array([i + [0] * (width - len(i)) for i in index])
            hidden = mx.take_along_axis(hidden, index[..., None], axis=1)
        logprobs = [None if row.job.logprobs is None else  # the rows that scored the emitted tokens
                    token_logprobs(logits[i][mx.array(keep) if isinstance(keep, list) else mx.arange(keep)], tokens,
                                   row.job.logprobs)
                    for i, (row, keep, tokens) in enumerate(zip(rows, kept, new_tokens))]
        events = self._emit(rows, rounds, new_tokens, logprobs)
        accepted = [verdict.accepted for verdict in rounds]
        if drafters:
            drafters.accept([row.context for row in rows], accepted, hidden)
        self._observe(plan, width - 1, accepted, time.perf_counter() - start, [v.draft_len for v in rounds])
        return events

    def _observe(self, plan: "Plan", longest: int, accepted: list[int], seconds: float | None,
                 drafted: list[int] | None = None) -> None:
        """The round `plan` planned, to the policy that planned it: `longest` drafts (every row paid for them),
        each row's `drafted` and `accepted` ones, in `seconds` (None: the round's time is not its own)."""
        drafted = drafted or [0] * len(accepted)
        if plan.policy is not self.alone:
            self.lone = None
            if seconds is not None:
                plan.policy.observe(longest, 0, seconds, rows=list(zip(drafted, accepted)))
            return
        self.rounds_alone += 1  # as alone, a lone row's first rounds straddle the prefill and the rows that left
        plan.policy.observe(longest, accepted[0], seconds if self.rounds_alone > UNTIMED_ROUNDS else None,
                            asked=plan.lengths[0])

    def _emit(self, rows: list[Row], verdicts: list[Round], new_tokens: list[list[int]],
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
            row.policy = self._policy(len(rows)) if row.job.draft_len is None or not self.make_drafters else \
                FixedDraftLength(row.job.draft_len)
            row.stats.policy = row.policy.note
        return events


@dataclass
class Plan:
    """A round's draft length per row and keys, and, once its plain step runs, that step's (tokens, hidden)."""

    lengths: list[int]
    draft_keys: list[mx.array]
    verify_keys: list[mx.array]
    step: tuple[mx.array, mx.array | None] | None = None
    policy: object = None  # the policy that planned it, which learns from it

    def select(self, rows: list[int]) -> "Plan":
        """The plan of the rows at `rows` (indices), those that stay."""
        index = mx.array(rows, dtype=mx.int32)
        step = self.step and (self.step[0][index], None if self.step[1] is None else self.step[1][index])
        return Plan(*([part[i] for i in rows] for part in (self.lengths, self.draft_keys, self.verify_keys)), step,
                    self.policy)
