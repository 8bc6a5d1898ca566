"""Batched speculative decoding: many sequences decode together, rows joining and leaving between rounds.

The rounds are `rounds.RoundLoop`'s over a `RaggedBatch` of the target's (row i feeds `[last, *drafts_i]` or its
tree, padded to the longest), drafted by the drafter's `batched(target_batch)` (one n-gram index per row, or every
row's draft step in one forward of the draft model, MTP layer or head). Here: continuous batching. Finished rows
leave and queued requests join between rounds; a joining prompt is prefilled in a batch of its own (a chunk per
round while others decode; prompts that join while none decodes together, where their padding stays small), then
merged. The draft length is the policy's (`BatchDraftLength`, which learns what a forward of so many tokens costs):
it turns drafting off where the batch makes the forward compute-bound. While one row is left (a lone server
request), rounds are the single-sequence policy's (`AdaptiveDraftLength`, from the engine's profile), as alone.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterable, Iterator

import mlx.core as mx

from ..core.events import Done, Result, collect
from ..policy.batch import BatchDraftLength
from ..policy.sequence import AdaptiveDraftLength, FixedDraftLength
from ..runners.ragged import RaggedBatch, check_batches
from ..runners.ragged_kv import RaggedKVCache
from ..runners.target import PREFILL_CHUNK
from ..runners.vision import prompt_keys
from ..seams.errors import SpecError
from .rounds import Job, RoundLoop, Row

MAX_BATCH = 32  # the default batch size's upper bound
PADDING = 1.25  # prompts prefilled together run at most this many tokens per prompt token (the rest padding)
TOGETHER = 4096  # and at most this many tokens in all (a group's rows x its longest prompt)


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
    if drafter is not None and (drafter.width > 1 or drafter.trees) and (problem := RaggedBatch.tree_problem(model)):
        return f"the model's token trees cannot be verified in batches: it {problem}; use --tree-width 1"
    return None


def largest_batch(model, tokens_per_row: int, available: int, kv_bits: int | None = None,
                  kv_group_size: int = 64) -> int:
    """The most rows (up to MAX_BATCH) whose caches, `tokens_per_row` positions each, fit in half of `available`
    bytes: the KV bytes per column (a sliding window's layers hold fewer, `columns_for`) and the recurrent states'
    bytes per row measured on a one-token forward."""
    probe = RaggedBatch(model, rows=1, kv_bits=kv_bits, kv_group_size=kv_group_size)
    probe.forward(mx.array([[0]], dtype=mx.int32), [1])
    per_row = sum(c.nbytes / probe.capacity * c.columns_for(tokens_per_row) for c in probe.layers
                  if isinstance(c, RaggedKVCache)) + sum(c.nbytes for c in probe.recurrent)
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
        self.drafter = drafter
        self.read_hidden, self.hidden_tail = (read_hidden if drafter else None), hidden_tail
        self.tree_width = drafter.width if drafter else 1
        self.policy = ((policy or BatchDraftLength(max_draft_len, widths=tuple(sorted({1, self.tree_width}))))
                       if draft_len is None and drafter else FixedDraftLength(draft_len if drafter else 0,
                                                                              self.tree_width))
        self.alone = alone if draft_len is None and drafter else None
        self.name = drafter.name if drafter else "off"
        self.prefixes = prefixes
        self.lockstep = None  # distributed.Lockstep: the target is sharded across ranks that decode in step

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
        agree, stops = None, lambda keys: [should_stop(key) for key in keys]
        if self.lockstep:  # every rank takes the leader's jobs and stops, and checks each round's tokens
            take, stops, agree = self.lockstep.in_step(take, stops, lambda job: job.rebuilt(self.tokenizer))
        rows, joining, batch = [], deque(), RaggedBatch(self.model, **self.kv)
        drafters = self.drafters = self.drafter.batched(batch) if self.drafter else None
        alone = self.alone
        self.loop = RoundLoop(batch, self.tokenizer, drafters, self.read_hidden, self.policy,
                              alone and (lambda: alone), self.tree_width)
        self.loop.agree = agree
        while True:
            while len(rows) + len(joining) < batch_size and (item := take()) is not None:
                joining.append(Row(*item, self.tokenizer, self.name))
            stopped = stops([row.key for row in joining]) if joining else []
            for row in [row for row, stop in zip(list(joining), stopped) if stop]:  # between its prefill's chunks
                joining.remove(row)
                row.stop_reason = "stopped"
                yield from ((row.key, event) for event in row.finish())
            if joining:
                self._prefill(batch, drafters, rows, joining)
            if not rows:
                if joining:
                    continue
                if self.lockstep:  # ended as every rank ends it (not after a failed collective: none may follow)
                    self.lockstep.end()
                return
            yield from self.loop.round(rows, ahead=not joining and not self.lockstep)
            running = [row for row in rows if not row.stop_reason]
            for row, stop in zip(running, stops([row.key for row in running]) if running else []):
                row.stop_reason = "stopped" if stop else None
            if any(row.stop_reason for row in rows):
                staying = [i for i, row in enumerate(rows) if not row.stop_reason]
                for i, row in enumerate(rows):
                    if row.stop_reason:
                        self._store(batch, i, row, row.context)
                        yield from ((row.key, event) for event in row.finish())
                self.loop.select(staying)
                rows = [rows[i] for i in staying]

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
                row.ready = self.loop.policy_for(sharing).drafts_at(sharing) if pin is None else pin > 0
                row.read_hidden = self.read_hidden if row.ready else None
                row.prefill = self._cached(row)
                row.absorber = self.drafters.absorber(row.drafter_held) if row.read_hidden else None
        if not rows and not batch.recurrent:
            for group in together([row for row in waiting if row.read_hidden is None and row.prefill is None
                                   and len(row.job.prompt) <= PREFILL_CHUNK and not row.job.images]):
                prefilled = RaggedBatch.prefilled(self.model, [row.job.prompt[:-1] for row in group], **self.kv)
                for i, row in enumerate(group):
                    self._store(prefilled, i, row, row.job.prompt[:-1], prompt=True)
                batch.join(prefilled)
                for row in group:
                    joining.remove(row)
                    self._joined(drafters, rows, row, None)
            waiting = [row for row in joining if not row.prefilled]
        if waiting:
            row = min(waiting, key=left_to_prefill)
            row.prefill = row.prefill or RaggedBatch(self.model, rows=1, **self.kv)
            row.prefilled = row.prefill.extend(row.job.prompt[:-1], row.read_hidden, self.hidden_tail, row.job.images,
                                               row.absorber and row.absorber.absorb)
        unfinished = [left_to_prefill(row) for row in joining if not row.prefilled]
        if self.loop.plan or not (rows or not unfinished or max(unfinished) > PREFILL_CHUNK):
            return
        for row in [row for row in joining if row.prefilled]:
            joining.remove(row)
            self._store(row.prefill, 0, row, row.job.prompt[:-1], prompt=True)
            batch.join(row.prefill)
            self._joined(drafters, rows, row, mx.concatenate(row.prefill.hidden) if row.prefill.hidden else None)
            row.prefill = row.absorber = None

    def _cached(self, row: Row) -> RaggedBatch | None:
        """A one-row batch holding the start of `row`'s prompt that the prompt cache serves (None: none does)."""
        reads = self.read_hidden and row.read_hidden and not self.drafters.resumes  # hidden states it must run
        tail = self.hidden_tail if reads else 0
        found = self.prefixes and self.prefixes.find(prompt_keys(row.job.prompt[:-1], row.job.images), tail)
        if not found:
            return None
        layers, row.stats.reused_prompt_tokens, row.drafter_held = found
        return RaggedBatch.holding(self.model, layers, found[1], **self.kv)

    def _store(self, batch: RaggedBatch, index: int, row: Row, tokens: list[int], prompt: bool = False) -> None:
        """Keep what row `index` of `batch` (`row`) holds (of `tokens`) in the prompt cache; `prompt`: a prompt just
        prefilled, kept where the target's cache cannot be cut back (a point the next turn may reuse), known by its
        keys (`vision.prompt_keys`: an image's tokens by its pixels)."""
        if self.prefixes and tokens and (not prompt or not self.prefixes.target.cuttable):
            held = self.drafters.row_state(index, tokens) if not prompt and self.drafters else None
            keys = prompt_keys(tokens[:int(batch.offsets[index])], row.job.images)
            self.prefixes.store(keys, batch.row_positions(index), held)

    def _joined(self, drafters, rows: list[Row], row: Row, hidden: mx.array | None) -> None:
        """`row`, its prompt now in the batch's cache, joins the rows (and its drafter, with `hidden`, or what its
        `absorber` took of the prompt)."""
        if drafters:
            drafters.join(row.context, hidden, row.ready, row.absorber.hold() if row.absorber else row.drafter_held)
        row.stats.prefill_seconds = time.perf_counter() - row.started
        rows.append(row)
