"""The engine: a target, its tokenizer and drafter, and what a client asks of them.

A generation encodes its prompt (a chat through the chat template, a returning chat as it ran), prefills it on the
target (a prefix the prompt cache holds is reused), then runs `rounds.RoundLoop` with one row over the target's
own cache (`OneRow`): the round written once for a lone sequence and a batch. `generate_many` / `stream_many`
decode many rows together (`batched.BatchedDecoder`), on the same round.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import mlx.core as mx

from ..core.events import Done, Result, Round, Text, Token, collect
from ..core.grammar import Grammar
from ..core.prompts import image_sources, prompt_text, render_prompt
from ..core.sampling import SamplingParams
from ..core.stats import RoundCosts
from ..drafters.protocol import Drafter, OneDrafter, shape
from ..policy.sequence import AdaptiveDraftLength, FixedDraftLength
from ..runners.prompt_cache import PromptCache, RowPrefixes
from ..runners.target import MAX_DRAFT_LEN, Interrupted, OneRow, Target
from ..runners.vision import READS_SAID, Images, prompt_keys
from ..seams.errors import SpecError
from .batched import BatchedDecoder, batch_problem, largest_batch
from .rounds import Job, RoundLoop, Row

CHATS = 64  # chats whose tokens an engine keeps, to encode the next turn of each exactly as it ran


@dataclass
class EngineStatus:
    """What an engine is set to do, for clients to show."""

    drafter: str  # the drafter's name, or "off"
    policy: str  # the draft-length policy and its last decision
    draft_len: int | None  # pinned drafts per round (0: drafting off), None while adaptive
    max_draft_len: int
    drafters: list[str]  # what `with_drafter` accepts for this target, "off" included
    shape: str = "chain"  # what the drafter proposes: "chain", "tree of width W", or a chain and why no tree
    next_draft_len: int | None = None  # what the next round is set to draft (the adaptive policy's latest
    # choice; 0: drafting off), None where unknown
    reasons: list[str] = field(default_factory=list)  # why: each length's expected speed, acceptance, costs
    notice: str | None = None  # what to tell of the drafter chosen by default (an MTP layer claimed, not read)


def check_draft_len(n: int | None) -> None:
    if n is not None and not (isinstance(n, int) and 0 <= n <= MAX_DRAFT_LEN):
        raise SpecError(f"draft length must be between 0 and {MAX_DRAFT_LEN}, got {n}")


def draft_policy(draft_len: int | None, max_draft_len: int, tree_width: int = 1, profile: dict | None = None):
    """What `Engine.pin(draft_len)` sets: a pinned length (0: off), or None: the adaptive policy, which also
    tries chains when the drafter drafts trees, starting from `profile` (what an earlier one learnt)."""
    if draft_len is None:
        return AdaptiveDraftLength(max_draft_len, widths=tuple(sorted({1, tree_width})), profile=profile)
    return FixedDraftLength(draft_len, tree_width)


class Engine:
    """A target model, its tokenizer and an optional drafter. `stream` yields Token / Text / Round / Done events.

    `pin` and `stop` may be called from any thread: the generating thread picks them up at the next round (a
    pin at the next round it decides on: a plain round decides the one after it before it ends)."""

    def __init__(self, target: Target, tokenizer, drafter: Drafter | None = None, draft_len: int | None = 4,
                 max_draft_len: int = 4, sibling=None, drafters: list[str] = ("off",),
                 context_length: int | None = None, profiles=None, vision=None):
        """draft_len: drafts per round, pinned; None lets the adaptive policy choose 0..max_draft_len.
        sibling(drafter_name) -> Engine builds `with_drafter`'s engines on the same weights; `drafters` names
        the choices it accepts. context_length: the positions the model was trained for (None: unknown), which a
        prompt and its max_tokens must fit (`check_fits`). profiles: where the adaptive policy's profile is kept
        between runs (`profiles.Profiles`; None: in this engine only). vision: the checkpoint's image side
        (`runners.vision.Vision`; None: it reads text only)."""
        check_draft_len(max_draft_len)
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.context_length, self.vision = context_length, vision
        self.max_draft_len, self.sibling, self.drafters = max_draft_len, sibling, list(drafters)
        self.tree_width = drafter.width if drafter else 1  # > 1: trees, a round's width the policy's (or chains)
        self.cached_context: list[int] = []  # the last sequence; the target's cache holds its first `offset`
        self.cached_images: Images | None = None  # the images of its prompt
        self.conversations: list[tuple[str, list[int]]] = []  # the last chats answered, as text and as tokens
        self.prompt_cache: PromptCache | None = None  # sequences kept besides the live one (None: none)
        self.stop_requested = False
        self.profiles = profiles
        self.learnt = profiles.read() if profiles else None  # what the adaptive policy learnt, to start the next
        if isinstance(self.learnt, dict) and drafter:  # and the drafter of its drafts
            drafter.start_from(self.learnt.get("drafter"))
        self.batch_policy = None  # the adaptive policy of the last batch (`_decoder`), which the next goes on with
        self.pin(draft_len)
        self.policy = self.next_policy
        self.lockstep = None  # distributed.Lockstep: this engine's target is sharded across ranks kept in step
        self.notice: str | None = None  # what to tell of its drafter, chosen by default (EngineStatus.notice)

    def pin(self, draft_len: int | None, tree_width: int | None = None) -> None:
        """Fix the draft length (0 turns drafting off), or None to let the adaptive policy choose, from the next
        round decided on; tree_width: at most the drafter's loaded width (1: chains; None: that width)."""
        check_draft_len(draft_len)
        width = self.tree_width if tree_width is None else tree_width
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= self.tree_width:
            raise SpecError(f"tree width must be from 1 to {self.tree_width} (the width this engine's drafter was "
                            f"loaded with, --tree-width), got {tree_width!r}")
        self.next_policy = draft_policy(draft_len if self.drafter else 0, self.max_draft_len, width, self.learnt)

    def policy_now(self):
        """The draft-length policy for the next round, now `policy`: the latest `pin`, or on distributed ranks the
        one they all agreed on (`Lockstep.agree` hands a pin on at the end of the round it came in)."""
        self.policy = self.lockstep.policy if self.lockstep else self.next_policy
        return self.policy

    def stop(self) -> None:
        """End the running generation after the current round (or prefill chunk), with stop reason "stopped" and
        its statistics (on distributed ranks after the next round: the ranks agree on it first, as on a `pin`)."""
        self.stop_requested = True

    def check_job(self, job: Job) -> None:
        """A SpecError unless this engine can decode `job`: it fits (`check_fits`), and its settings are served
        here."""
        self.check_fits(len(job.prompt), job.max_tokens)

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """A SpecError unless a prompt of `prompt_tokens` and `max_tokens` more fit the model's context."""
        if self.context_length and prompt_tokens + max_tokens > self.context_length:
            raise SpecError(f"the prompt ({prompt_tokens} tokens) and max_tokens ({max_tokens}) need "
                            f"{prompt_tokens + max_tokens} positions, more than the model's context of "
                            f"{self.context_length}: shorten the prompt or lower max_tokens")

    def status(self) -> EngineStatus:
        policy = self.next_policy
        return EngineStatus(self.drafter.name if self.drafter else "off", policy.note,
                            policy.pinned, self.max_draft_len, self.drafters,
                            shape(self.drafter, self.tree_width),
                            policy.draft_len if self.drafter else 0, policy.explain(), self.notice)

    def cache_prompts(self, budget: int) -> None:
        """Keep the sequences generations ran, besides the last, in at most `budget` bytes (0: none), so that a
        prompt extending any of them runs only its new tokens (prompt_cache.py); engines made by `with_drafter`
        afterwards share them."""
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise SpecError(f"the prompt cache's budget must be a whole number of bytes >= 0, got {budget!r}")
        self.prompt_cache = PromptCache(budget) if budget else None

    def with_drafter(self, drafter: str) -> "Engine":
        """Another engine on the same target weights (loaded once), drafting with `drafter` ("off": none)."""
        if self.sibling is None:
            raise SpecError("this engine was built without a loader: make it with mlx_spec.load to switch drafters")
        if drafter not in self.drafters:
            raise SpecError(f"drafter {drafter!r} is not available here: choose one of {', '.join(self.drafters)}")
        engine = self.sibling(drafter)
        engine.prompt_cache = self.prompt_cache  # the same weights: the same sequences serve both
        return engine

    def encode(self, prompt: str | list[int] | list[dict]) -> list[int]:
        """Token ids: a text as it is (no chat template), ids unchanged, a chat through the chat template."""
        return self.encode_chat(prompt)[0]

    def encode_prediction(self, prediction: str | list[int] | None) -> list[int] | None:
        """A predicted output's token ids: a text tokenized as output continues (no special tokens); None, or
        an empty one: none."""
        if isinstance(prediction, str):
            return self.tokenizer.encode(prediction, add_special_tokens=False) or None
        vocab = len(self.tokenizer.get_vocab()) if prediction else 0
        if prediction and not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                  for t in prediction):
            raise SpecError(f"a prediction must be a text or a list of token ids from 0 to {vocab - 1}")
        return list(prediction) if prediction else None

    def encode_chat(self, prompt: str | list[int] | list[dict],
                    tools: list[dict] | None = None) -> tuple[list[int], str | None, Images | None]:
        """(token ids, the rendered chat or None, its images or None); a chat is rendered with the `tools` it may
        call. A chat that extends one of the last CHATS this engine answered keeps that one's tokens exactly as
        they were prefilled and generated (text re-encoded may split differently), so the cache serves all of
        them. A chat with image parts is rendered with their placeholders, which the model's processor expands."""
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            if not prompt:
                raise SpecError("the prompt is empty: give some text to continue")
            return list(prompt), None, None
        if isinstance(prompt, list):
            sources = image_sources(prompt)
            if sources and self.vision is None:
                raise SpecError(f"this model reads text only: images need a vision-language checkpoint ({READS_SAID} "
                                "with its vision tower); send text parts")
            rendered, templated = prompt_text(self.tokenizer, prompt, tools=tools, images=bool(sources))
            said, ids = max(((said, ids) for said, ids in self.conversations if rendered.startswith(said)),
                            key=lambda chat: len(chat[0]), default=("", []))
            rest = self.tokenizer.encode(rendered[len(said):], add_special_tokens=False) if ids else []
            if sources:
                tokens, images = self.vision.prompt(rendered, sources)
                if ids and (ids + rest).count(images.token) == images.features.shape[0]:  # the same images'
                    return ids + rest, rendered, images.over(ids + rest)  # tokens: the turns before, as they ran
                return tokens, rendered, images
            if templated and ids:
                return ids + rest, rendered, None
            return render_prompt(self.tokenizer, prompt, tools=tools), rendered if templated else None, None
        return render_prompt(self.tokenizer, prompt, raw=True, tools=tools), None, None

    def stream(self, prompt: str | list[int] | list[dict], params: SamplingParams = SamplingParams(),
               max_tokens: int = 256, stop: list[str] = (), seed: int = 0,
               should_stop: Callable[[], bool] = lambda: False, tools: list[dict] | None = None,
               grammar: Grammar | None = None, logprobs: int | None = None,
               prediction: str | list[int] | None = None) -> Iterator[Token | Text | Round | Done]:
        """The generation's events, ending with Done. `should_stop()` is asked between prefill chunks and after
        each round: true ends it there ("stopped"), as `stop` does. `tools`: what a chat may call (the chat
        template shows them to the model); `grammar`: what the output must match (grammar.py), verified
        exactly under speculation; `logprobs` (a number of likeliest tokens, 0 for none): each Token carries its
        log-probability under the target's raw logits, and theirs; `prediction`: the output expected, or most of
        it (a text or token ids: Predicted Outputs, core/prediction.py), drafted from while the output follows it."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise SpecError(f"max_tokens must be >= 1 (a whole number), got {max_tokens!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise SpecError(f"seed must be a whole number from 0 to 2**64 - 1, got {seed!r}")
        if not all(isinstance(text, str) and text for text in stop):
            raise SpecError(f"stop strings must be non-empty text, got {list(stop)!r}")
        context, chat, images = self.encode_chat(prompt, tools)
        yield from self.decode(Job(context, params, max_tokens, tuple(stop), seed, grammar=grammar,
                                   logprobs=logprobs, prediction=self.encode_prediction(prediction), images=images),
                               should_stop, chat)

    def decode(self, job: Job, should_stop: Callable[[], bool] = lambda: False,
               chat: str | None = None) -> Iterator[Token | Text | Round | Done]:
        """`stream`'s events for a job of token ids (`chat`: the chat it renders, to `remember_chat`): its own
        `draft_len` where pinned (which may change while it runs), else this engine's policy."""
        context, pins = job.prompt, job
        self.check_job(job)
        if self.lockstep:  # the other ranks run this generation too, by the engine's pin (`one_at_a_time` set it
            job = replace(job, draft_len=None)  # from the job's), which they agree on
            self.lockstep.begin(self, job)
        self.stop_requested = False
        self.policy = self.policy_now()
        self.policy.begin(len(context))  # round costs depend on the context's depth
        row = Row(None, job, self.tokenizer, self.drafter.name if self.drafter else "off")
        mx.reset_peak_memory()
        cached, self.cached_context = self.cached_context, []  # unknown while the prefill runs
        held_images, self.cached_images = self.cached_images, job.images
        cached, keys = prompt_keys(cached, held_images), prompt_keys(context[:-1], job.images)
        if self.prompt_cache is not None:
            cached = self.prompt_cache.switch(self.target, self.drafter, cached, keys)
        try:
            prompt_step = self.target.prefill(context[:-1], cached, hidden=self.policy.drafts_at(1),
                                              interrupted=lambda: not self.lockstep and (self.stop_requested
                                                                                         or should_stop()),
                                              absorb=self.drafter.absorb if self.drafter else None,
                                              images=job.images, keys=keys)
        except Interrupted:
            row.stats.prefill_seconds = time.perf_counter() - row.started
            yield Done("stopped", "", [], row.stats)
            return
        self.cached_context = row.context  # extended in place as it decodes, so it always describes the cache
        row.stats.reused_prompt_tokens = prompt_step.start
        if self.drafter:
            self.drafter.begin(context, prompt_step)
        if self.prompt_cache is not None and not self.target.cuttable:  # for the next turn
            self.prompt_cache.store(self.prompt_cache.take(self.target, self.drafter, keys), False)
        row.stats.prefill_seconds = time.perf_counter() - row.started
        loop, stopping = self.round_loop(), False

        def agree(new_tokens: list[list[int]], seconds: float | None) -> float | None:
            nonlocal stopping  # every rank checks the tokens agree, and takes rank 0's time, stop and pin
            stopping = self.stop_requested or should_stop()
            if self.lockstep and pins.draft_len is not None and pins.draft_len != self.next_policy.pinned:
                self.pin(pins.draft_len)  # handed on to the other ranks now
            if self.lockstep:
                seconds, stopping = self.lockstep.agree(self, new_tokens[0], seconds, stopping)
            return seconds

        loop.agree = agree
        try:
            while row.stop_reason is None:
                yield from (event for _, event in loop.round([row], ahead=self.lockstep is None))
                if row.stop_reason is None and stopping:
                    row.stop_reason = "stopped"
        except Exception:
            self.cached_context = []  # the cache may hold a half-finished round: never reuse it
            raise
        finally:
            if loop.plan and loop.plan.step:  # the step after the last token ran for nothing
                self.target.rollback(1)
        self.keep_profile(self.policy)
        row.stats.drafter_report = self.drafter.report() if self.drafter else ""
        *tail, done = row.finish()
        yield from tail
        self.remember_chat(chat, context, done)
        if self.lockstep:
            self.lockstep.end()
        yield done

    def keep_profile(self, policy) -> None:
        """What `policy` (None: nothing) and the drafter learnt, for the next generation (and on disk, `profiles`)."""
        if learnt := policy and policy.profile():
            learnt["drafter"] = self.drafter.estimates() if self.drafter else None
            self.learnt = learnt
            if self.profiles:
                self.profiles.write(learnt)

    def remember_chat(self, chat: str | None, prompt: list[int], done: Done) -> None:
        """Keep the tokens a chat (`chat`: as rendered, None: not a chat) and its answer ran as, so that its next
        turn is encoded as they were (`encode_chat`); for clients that decode chats in batches."""
        if chat is not None and done.stop_reason != "stop_string":  # tokens past a stop string are not in the text
            tokens = done.tokens[: len(done.tokens) - (done.stop_reason == "eos")]
            said = (chat + done.text, list(prompt) + tokens)
            self.conversations = [c for c in self.conversations if c[0] != said[0]][-CHATS + 1:] + [said]

    def round_loop(self) -> RoundLoop:
        """The round loop of a generation of one row on this engine's target, drafter and policy (`policy_now`)."""
        return RoundLoop(OneRow(self.target), self.tokenizer, self.drafter and OneDrafter(self.drafter),
                         self.target.read_hidden, alone=self.policy_now, tree_width=self.tree_width)

    def profile(self, prompt: str | list[int] | list[dict], draft_lens: list[int], rounds: int = 3,
                params: SamplingParams = SamplingParams()) -> RoundCosts:
        """Time a round's parts on real rounds continuing `prompt`: for plain steps and each draft length, the
        median of `rounds` rounds after an untimed one. A drafter that finds fewer drafts (n-gram) is timed at
        the length it drafted."""
        context = self.encode(prompt)
        self.cached_context, self.cached_images = [], None
        prompt_step = self.target.prefill(context[:-1], absorb=self.drafter.absorb if self.drafter else None)
        if self.drafter:
            self.drafter.begin(context, prompt_step)
        row, loop, timed = Row(None, Job(context, params, 2**31), self.tokenizer, ""), self.round_loop(), {}
        loop.parts = {}
        for k in dict.fromkeys([0, *(draft_lens if self.drafter else [])]):
            pinned = FixedDraftLength(k, self.next_policy.widest)  # the shape asked for, whatever a generation left
            loop.alone = lambda pinned=pinned: pinned
            for r in range(rounds + 1):
                verdict = loop.speculate([row], loop.make_plan([row], lengths=[k]), time.perf_counter())[0][1]
                if r:
                    timed.setdefault(verdict.draft_len, []).append(dict(loop.parts))
        self.cached_context = row.context
        return RoundCosts({k: statistics.median(s["verify"] for s in runs) for k, runs in timed.items()},
                          {k: statistics.median(s["draft"] for s in runs) for k, runs in timed.items() if k})

    def generate(self, prompt: str | list[int] | list[dict], params: SamplingParams = SamplingParams(),
                 max_tokens: int = 256, stop: list[str] = (), seed: int = 0, tools: list[dict] | None = None,
                 grammar: Grammar | None = None, logprobs: int | None = None,
                 prediction: str | list[int] | None = None) -> Result:
        return collect(self.stream(prompt, params, max_tokens, stop, seed, tools=tools, grammar=grammar,
                                   logprobs=logprobs, prediction=prediction))

    def batch_problem(self) -> str | None:
        """Why `generate_many` can only decode one sequence at a time here (None: it batches)."""
        return batch_problem(self.target.model, self.drafter)

    def largest_batch(self, tokens_per_row: int) -> int:
        """The largest batch whose caches (`tokens_per_row` positions a row) fit in half the memory available."""
        import psutil

        return largest_batch(self.target.model, tokens_per_row, psutil.virtual_memory().available,
                             self.target.kv_bits, self.target.kv_group_size)

    def generate_many(self, jobs, batch_size: int) -> Iterator[tuple[int, Result]]:
        """Decode `jobs` (`rounds.Job`s: token ids and their settings), `batch_size` at a time in one batch
        (`batched.BatchedDecoder`; 1: one after another, as `decode` does); yields (the job's index, its Result) as
        each finishes. Drafting as this engine's: its drafter (drafting for the batch: `batched(target_batch)`),
        its pinned length or the adaptive policy (`policy.batch.BatchDraftLength`); a job's own `draft_len` first."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise SpecError(f"batch size must be a whole number >= 1, got {batch_size!r}")
        if batch_size == 1:
            jobs, events = iter(enumerate(jobs)), []
            for index, event in self.one_at_a_time(lambda: next(jobs, None), lambda index: False, adaptive=False):
                events.append(event)
                if isinstance(event, Done):
                    yield index, collect(iter(events))
                    events = []
            return
        fitting = (self.check_job(job) or job for job in jobs)
        decoder = self._decoder(self.next_policy.pinned, batch_size)
        try:
            yield from decoder.run(fitting, batch_size)
        finally:
            self.keep_profile(decoder.alone)

    def stream_many(self, take, batch_size: int, should_stop=lambda key: False) -> Iterator[tuple[object, object]]:
        """Decode the `rounds.Job`s that `take()` hands over as (key, Job) (None: none waiting; asked whenever
        the batch has room) in one batch of at most `batch_size`, until none is left; yields (key, event) with
        each job's Round / Token / Text / Done events as `stream` gives them. `should_stop(key)` ends a job after
        the current round or prefill chunk ("stopped"). For servers: jobs join while others run (check each with
        `check_fits` first); a job drafts its own pinned `draft_len` (which may change while it runs), or what the
        adaptive policy chooses (this engine's pin is for its `stream`s). Batch size 1: one job after another."""
        if batch_size == 1:
            yield from self.one_at_a_time(take, should_stop, adaptive=True)
            return
        decoder = self._decoder(None, batch_size)
        try:
            yield from decoder.stream(take, batch_size, should_stop)
        finally:
            self.keep_profile(decoder.alone)

    def follow_batch(self, batch_size: int, draft_len: int | None) -> None:
        """A follower rank's part of the leader's batch (`distributed.Lockstep.follow`): the same rounds, its
        jobs and stops the leader's."""
        decoder = self._decoder(draft_len, batch_size)
        try:
            for _ in decoder.stream(lambda: None, batch_size):
                pass
        finally:
            self.keep_profile(decoder.alone)

    def one_at_a_time(self, take, should_stop, adaptive: bool) -> Iterator[tuple[object, object]]:
        """`stream_many`'s (key, event)s, each job decoded alone as `decode` does: its own pinned draft length,
        else the adaptive policy (`adaptive`) or this engine's pin."""
        engine_policy = self.next_policy
        while (item := take()) is not None:
            key, job = item
            if adaptive or job.draft_len is not None:
                self.pin(job.draft_len)
            try:
                yield from ((key, event) for event in self.decode(job, lambda key=key: should_stop(key)))
            finally:
                self.next_policy = engine_policy

    def _decoder(self, draft_len: int | None, batch_size: int):
        """A batch's decoder; an adaptive one goes on with what the last batch's policy learnt (a server decodes
        each burst of requests, a lone one too, as a batch of its own), and decides rounds with one row as
        `stream` does, from the profile (`keep_profile` keeps what they learnt). On distributed ranks the leader
        announces it (`Lockstep.begin_batch`)."""
        if problem := self.batch_problem():
            raise SpecError(f"{problem}: use a batch size of 1")
        decoder = BatchedDecoder(self.target.model, self.tokenizer, self.drafter, draft_len, self.max_draft_len,
                                 self.target.read_hidden, self.target.kv_bits, self.target.kv_group_size,
                                 self.target.hidden_tail, self.prompt_cache and RowPrefixes(
                                     self.prompt_cache, self.target, prompt_keys(self.cached_context,
                                                                                 self.cached_images), self.drafter),
                                 self.batch_policy if draft_len is None else None,
                                 draft_policy(None, self.max_draft_len, 1, self.learnt) if self.drafter else None)
        if self.lockstep:
            decoder.lockstep = self.lockstep
            self.lockstep.begin_batch(self, decoder, batch_size, draft_len)
        if draft_len is None:
            self.batch_policy = decoder.policy
        return decoder
