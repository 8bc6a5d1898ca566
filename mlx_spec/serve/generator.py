"""The server's generation thread: it owns every MLX array, runs the jobs the event loop hands it (a bounded
queue), and sends each job's events back to the event loop. Jobs for the same drafter are decoded together, up
to `batch_size`, joining and leaving as they come and finish (`Engine.stream_many`, the one decoder: a batch size
of 1 decodes them one after another), in arrival order.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field

from starlette.responses import JSONResponse

from ..core.events import Done, Round
from ..core.sampling import SamplingParams
from ..decode.engine import Engine
from ..decode.rounds import Job as BatchJob
from ..seams import memory
from ..seams.errors import SpecError
from .metrics import Metrics


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), self.status, headers=self.headers)


@dataclass
class Job:
    """One request's generation: built on the event loop, run on the generation thread."""

    prompt: list[int] | list[dict]  # token ids, or a chat (the engine keeps the tokens of the one before)
    params: SamplingParams
    max_tokens: int
    stop: list[str]
    seed: int
    drafter: str | None
    draft_len: int | None  # pinned drafts per round, None: the adaptive policy
    deadline: float
    native: bool = False  # mlx-spec's own stream: rounds too, and a memory report before the end
    tools: list[dict] | None = None  # what a chat may call (the chat template shows them to the model)
    prompt_tokens: int = 0  # as the request's prompt was rendered when it came (before any prefill)
    grammar: object = None  # grammar.Grammar: what the output must match
    logprobs: int | None = None  # report log-probabilities, and this many likeliest tokens
    prediction: str | None = None  # the output predicted (Predicted Outputs), drafted from
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    loop: asyncio.AbstractEventLoop = None
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False  # the client went away
    stop_requested: bool = False  # the client asked to stop: it ends as "stopped", with its statistics
    row: BatchJob | None = None  # what the engine decodes, once it has taken it (its pin may change meanwhile)
    arrived: float = field(default_factory=time.monotonic)
    answered: bool = False  # its first token came

    def send(self, event) -> None:
        """From the generation thread: an engine event, or an APIError that ends the job."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass
class Call:
    """Something other than a generation that must run on the generation thread (it touches MLX arrays)."""

    run: callable
    loop: asyncio.AbstractEventLoop
    result: asyncio.Future
    id: str = ""
    cancelled: bool = False

    def send(self, outcome) -> None:
        """From the generation thread: the value, or an APIError."""
        done = self.result.set_exception if isinstance(outcome, APIError) else self.result.set_result
        self.loop.call_soon_threadsafe(done, outcome)


class Generator:
    """The one thread that runs the engine: jobs in arrival order from a bounded queue."""

    def __init__(self, engine: Engine, max_queue: int, batch_size: int = 1):
        """batch_size: jobs decoded together at most (1: one at a time)."""
        self.engines = {engine.status().drafter: engine}  # drafter name -> engine on the same weights
        self.default, self.batch_size = engine, batch_size
        self.jobs: queue.Queue = queue.Queue(maxsize=max_queue)
        self.deferred: deque = deque()  # taken from `jobs` while a batch ran, but not for that batch
        self.live: dict[str, Job] = {}  # id -> a job waiting or running
        self.closing = False
        self.running: dict = {}  # the jobs decoding now, by key
        self.metrics = Metrics(self)
        self.thread = threading.Thread(target=self.run, name="mlx-spec generation", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        if self.closing:
            raise APIError(503, "the server is shutting down", kind="server_error", code="shutting_down")
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise APIError(503, f"the server is busy ({self.jobs.maxsize} requests waiting): retry later",
                           kind="server_error", code="queue_full", headers={"Retry-After": "5"}) from None
        if job.id:
            self.live[job.id] = job

    async def call(self, run: callable):
        """run() on the generation thread, in turn with the jobs; its value, or its APIError raised here."""
        call = Call(run, asyncio.get_running_loop(), asyncio.get_running_loop().create_future())
        self.submit(call)
        return await call.result

    def control(self, job_id: str, draft_len=..., stop: bool = False) -> None:
        """Pin a job's draft length (from its next round, or from its start) or ask it to stop."""
        job = self.live.get(job_id)
        if job is None:
            raise APIError(404, f"no generation {job_id!r} is waiting or running here", "id", "job_not_found")
        if draft_len is not ...:
            job.draft_len = draft_len
            if job.row:  # from its next round
                job.row.draft_len = draft_len
        job.stop_requested |= stop

    def engine_for(self, drafter: str | None) -> Engine:
        name = drafter or self.default.status().drafter
        if name not in self.engines:
            self.engines[name] = self.default.with_drafter(name)
        return self.engines[name]

    def run(self) -> None:
        while True:
            job = self.deferred.popleft() if self.deferred else self.jobs.get()
            if job is None:
                return
            if self.closing or job.cancelled:
                job.send(APIError(503, "the server is shutting down", kind="server_error", code="shutting_down"))
                self.live.pop(job.id, None)
                continue
            try:
                if isinstance(job, Call):
                    job.send(job.run())
                else:
                    self.generate(job)
            except SpecError as e:
                job.send(APIError(400, str(e)))
            except Exception:
                traceback.print_exc(file=sys.stderr)
                job.send(APIError(500, "internal error: see the server's log", kind="server_error"))
            finally:
                self.live.pop(job.id, None)

    def generate(self, first: Job) -> None:
        """`first` and the jobs that arrive for the same engine while it runs, decoded together (in one batch of
        at most `batch_size`: `Engine.stream_many`). Calls that arrive meanwhile run between rounds; other jobs
        wait in `deferred`, and once one waits no more join. A drafter that fails to load says so when its job
        comes first (its own 400), not in the middle of a batch it would end for everyone."""
        engine, jobs, waiting = self.engine_for(first.drafter), self.running, [first]
        chats, prompts = {}, {}  # each job's chat as rendered (None: not a chat) and its prompt's tokens

        def take():
            while True:
                if waiting:
                    job = waiting.pop()
                elif self.deferred:
                    return None
                else:
                    try:
                        job = self.jobs.get_nowait()
                    except queue.Empty:
                        return None
                if job is None or (isinstance(job, Job) and not self.serves(job, engine)):
                    self.deferred.append(job)
                    return None
                if self.closing or job.cancelled:
                    job.send(APIError(503, "the server is shutting down", kind="server_error", code="shutting_down"))
                    self.live.pop(job.id, None)
                    continue
                if isinstance(job, Call):
                    job.send(job.run())
                    continue
                try:
                    jobs[job.id] = job
                    prompt, chats[job.id], images = engine.encode_chat(job.prompt, job.tools)
                    row = BatchJob(prompt, job.params, job.max_tokens, tuple(job.stop), job.seed, None, job.grammar,
                                   job.logprobs, engine.encode_prediction(job.prediction), images)
                    engine.check_job(row)
                    prompts[job.id], job.row = prompt, row
                    job.row.draft_len = job.draft_len  # read after `row` is set: a pin meanwhile is not lost
                    return job.id, job.row
                except SpecError as e:
                    job.send(APIError(400, str(e)))
                    del jobs[job.id]
                    self.live.pop(job.id, None)

        def should_stop(key) -> bool:
            job = jobs[key]
            return job.cancelled or job.stop_requested or self.closing or time.monotonic() > job.deadline

        try:
            for key, event in engine.stream_many(take, self.batch_size, should_stop):
                self.metrics.observe(jobs[key], event)
                if isinstance(event, Done) and jobs[key].native:
                    jobs[key].send(memory.report(engine))
                if jobs[key].native or not isinstance(event, Round):
                    jobs[key].send(event)
                if isinstance(event, Done):
                    engine.remember_chat(chats.pop(key), prompts.pop(key), event)
                    self.live.pop(jobs.pop(key).id, None)
        except Exception as e:
            if not isinstance(e, SpecError):
                traceback.print_exc(file=sys.stderr)
            for job in jobs.values():
                job.send(APIError(400, str(e)) if isinstance(e, SpecError) else
                         APIError(500, "internal error: see the server's log", kind="server_error"))
                self.live.pop(job.id, None)
        finally:
            jobs.clear()

    def serves(self, job: Job, engine: Engine) -> bool:
        """Whether `job` runs on `engine` (False too where its drafter fails to load)."""
        try:
            return self.engine_for(job.drafter) is engine
        except SpecError:
            return False

    def shutdown(self) -> None:
        """Fail the waiting jobs, stop the running one at its next round, end the thread."""
        self.closing = True  # the running jobs stop at their next round
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.send(APIError(503, "the server is shutting down", kind="server_error", code="shutting_down"))
        self.jobs.put_nowait(None)
