"""Batched speculative decoding: many sequences decode together, each keeping its own accepted count.

Every round, each row drafts for itself (its own drafter: `Drafter.fork`; its own length, 0 allowed), the target
verifies all rows in one forward over a `RaggedBatch` (row i feeds `[last, *drafts_i]`, padded to the longest),
each row's verdict comes from the same rule as alone (`verify_draft`, its own seed's keys), and each row keeps its
own accepted positions. Finished rows leave and queued requests join between rounds (continuous batching); a
joining prompt is prefilled in a batch of its own, then merged. One host synchronisation per round.
The draft length is the policy's, per batch size (`PerBatchSize`): it turns drafting off where a B-row forward no
longer costs about what one row's does.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator

import mlx.core as mx

from .draft import Draft
from .engine import Result, Round, TextStream, emit
from .errors import SpecError
from .policy import FixedDraftLength, PerBatchSize
from .ragged import RaggedBatch
from .sampling import SamplingParams
from .stats import Stats
from .target import PREFILL_CHUNK, Step
from .verify import verify_draft

MAX_BATCH = 32  # the default batch size's upper bound


@dataclass
class Job:
    prompt: list[int]  # token ids
    params: SamplingParams = SamplingParams()
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int = 0


class Row:
    """One sequence of the batch: its tokens, text, keys, drafter and statistics."""

    def __init__(self, index: int, job: Job, drafter, tokenizer, drafter_name: str):
        self.index, self.job, self.drafter = index, job, drafter
        self.context, self.generated = list(job.prompt), []
        self.text, self.key = TextStream(tokenizer, list(job.stop)), mx.random.key(job.seed)
        self.stats = Stats(drafter=drafter_name, prompt_tokens=len(job.prompt))
        self.from_draft: list[bool] = []
        self.stop_reason: str | None = None
        self.started = time.perf_counter()

    def result(self) -> Result:
        self.text.finish()
        self.stats.decode_seconds = time.perf_counter() - self.started - self.stats.prefill_seconds
        self.stats.generated_tokens = len(self.generated)
        self.stats.record_memory()
        return Result(self.text.text, self.generated, self.stop_reason, self.stats, self.from_draft)


def batch_problem(model, drafter=None, kv_bits: int | None = None) -> str | None:
    """Why this model and drafter decode one sequence at a time (None: they can be batched)."""
    if problem := RaggedBatch.problem(model):
        return f"batched decoding is not available for this model ({problem})"
    if kv_bits:
        return "a quantized KV cache (--kv-bits) is not batched yet"
    if drafter is not None and not hasattr(drafter, "fork"):
        return f"the {drafter.name} drafter does not draft in batches yet (ngram, draft-model and off do)"
    return None


def largest_batch(model, tokens_per_row: int, available: int) -> int:
    """The most rows (up to MAX_BATCH) whose caches, `tokens_per_row` positions each, fit in half of `available`
    bytes: the KV bytes per position measured on a one-token forward."""
    probe = RaggedBatch(model, rows=1)
    probe.forward(mx.array([[0]], dtype=mx.int32), [1])
    per_position = sum(c.nbytes for c in probe.caches) / probe.capacity
    return int(max(1, min(MAX_BATCH, available // 2 // max(1, per_position * tokens_per_row))))


class BatchedDecoder:
    def __init__(self, model, tokenizer, drafter=None, draft_len: int | None = None, max_draft_len: int = 4):
        """drafter: a template whose `fork()` gives each row its own (None: plain batched decoding);
        draft_len: pinned, or None for the adaptive policy per batch size."""
        if problem := batch_problem(model, drafter):
            raise SpecError(f"{problem}: use a batch size of 1")
        self.model, self.tokenizer, self.drafter = model, tokenizer, drafter if draft_len != 0 else None
        self.policy = (PerBatchSize(max_draft_len) if draft_len is None and self.drafter
                       else FixedDraftLength(draft_len if self.drafter else 0))
        self.name = self.drafter.name if self.drafter else "off"

    def run(self, jobs: Iterable[Job], batch_size: int) -> Iterator[tuple[int, Result]]:
        """Decode every job, at most `batch_size` at a time; yields (its index in `jobs`, its Result) as each
        finishes. The batch's rows are `rows`, in order."""
        queue, rows, batch = deque(enumerate(jobs)), [], RaggedBatch(self.model)
        while queue or rows:
            while queue and len(rows) < batch_size:
                rows.append(self._join(batch, *queue.popleft()))
            self._round(batch, rows)
            if any(row.stop_reason for row in rows):
                staying = [i for i, row in enumerate(rows) if not row.stop_reason]
                for row in rows:
                    if row.stop_reason:
                        yield row.index, row.result()
                batch.select(staying)
                rows = [rows[i] for i in staying]

    def _join(self, batch: RaggedBatch, index: int, job: Job) -> Row:
        """A queued job's prompt, prefilled in a batch of its own and merged into `batch`."""
        if not job.prompt:
            raise SpecError("the prompt is empty: give some text to continue")
        row = Row(index, job, self.drafter.fork() if self.drafter else None, self.tokenizer, self.name)
        alone, prompt = RaggedBatch(self.model, rows=1), job.prompt[:-1]
        for start in range(0, len(prompt), PREFILL_CHUNK):
            chunk = prompt[start:start + PREFILL_CHUNK]
            alone.forward(mx.array([chunk], dtype=mx.int32), [len(chunk)])
            mx.eval([c.state for c in alone.caches])
        if row.drafter:
            row.drafter.begin(row.context, Step(None))
        batch.join(alone)
        row.stats.prefill_seconds = time.perf_counter() - row.started
        return row

    def _round(self, batch: RaggedBatch, rows: list[Row]) -> None:
        """Draft for every row, verify all rows in one forward, keep each row's accepted drafts."""
        if isinstance(self.policy, PerBatchSize):
            self.policy.resize(len(rows))
        longest = self.policy.next_draft_len(max(row.job.max_tokens - len(row.generated) for row in rows))
        start, drafts, keys = time.perf_counter(), [], []
        for row in rows:
            row.key, round_key = mx.random.split(row.key)
            draft_key, verify_key = mx.random.split(round_key)
            k = min(longest, row.job.max_tokens - len(row.generated) - 1)
            drafts.append(row.drafter.propose(row.context, k, row.job.params, draft_key) if k > 0 else Draft.empty())
            keys.append(verify_key)
        width = 1 + max(d.tokens.shape[0] for d in drafts)
        inputs = mx.stack([mx.concatenate([mx.array(row.context[-1:], dtype=mx.int32), d.tokens,
                                           mx.zeros((width - 1 - d.tokens.shape[0],), dtype=mx.int32)])
                           for row, d in zip(rows, drafts)])
        logits = batch.forward(inputs, [1 + d.tokens.shape[0] for d in drafts])
        verdicts = [verify_draft(d, logits[i, :1 + d.tokens.shape[0]], row.job.params, row.context, key)
                    for i, (row, d, key) in enumerate(zip(rows, drafts, keys))]
        mx.eval([d.tokens for d in drafts], verdicts)  # the round's only host synchronisation
        accepted = [a.item() for a, _ in verdicts]
        batch.keep([a + 1 for a in accepted])
        for row, d, a, (_, next_token) in zip(rows, drafts, accepted, verdicts):
            new_tokens = d.tokens[:a].tolist() + [next_token.item()]
            verdict = Round(d.tokens.shape[0], a, d.tokens.shape[0])
            row.context += new_tokens
            row.stats.record_round(verdict)
            if row.drafter:
                row.drafter.accept(row.context, a, Step(None))
            tokens, row.stop_reason = emit(new_tokens, a, row.generated, row.text, self.tokenizer.eos_token_ids,
                                           row.job.max_tokens)
            row.from_draft += [t.from_draft for t in tokens]
        self.policy.observe(width - 1, 0, time.perf_counter() - start,
                            rows=[(d.tokens.shape[0], a) for d, a in zip(drafts, accepted)])
        for row in rows:
            row.stats.policy = self.policy.note
