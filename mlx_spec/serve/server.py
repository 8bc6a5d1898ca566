"""`mlx-spec serve`: an OpenAI-compatible HTTP server (Starlette on uvicorn) over one loaded engine.

`POST /v1/chat/completions` and `/v1/completions` (streamed as server-sent events or not), Anthropic's
`POST /v1/messages` (anthropic.py), OpenAI's Responses API (`POST /v1/responses`, `GET` / `DELETE
/v1/responses/{id}`: responses.py), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus' text format,
metrics.py). A chat's `tools` go through the model's chat
template and the calls in its answer come back as `tool_calls` (tool_calls.py; tool_use blocks on /v1/messages).
Requests queue (bounded: 503 with Retry-After when full) and run on the generation thread (generator.py), which
owns every MLX array: concurrent requests decode together in one batch (up to the batch size), the others one at
a time, where a request that extends the previous conversation reuses the prompt cache.
A client that goes away stops its generation at the next round. `usage` carries the speculation figures under
llama.cpp's names (`draft_n`, `draft_n_accepted`) besides the acceptance rate and mean acceptance length.
Errors are OpenAI-shaped ({"error": {"message", "type", "param", "code"}}) with their HTTP status (Anthropic-shaped
on /v1/messages).

mlx-spec's own routes serve `mlx-spec chat --server` (mlx_spec.serve.client): `GET /mlx-spec/v1/status` (a drafter's
status, the server's default sampling and memory), `POST /mlx-spec/v1/generate` (the engine's own events, rounds
included, as server-sent events) and `POST /mlx-spec/v1/jobs/{id}` (pin the draft length or stop a generation
from its next round).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
import uuid
from dataclasses import asdict

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..core.events import Done, Text, Token, event_to_dict
from ..core.grammar import ll_tokenizer
from ..core.sampling import SamplingParams
from ..decode.engine import Engine
from ..seams import memory
from ..seams.errors import SpecError
from . import anthropic, responses
from .generator import APIError, Generator, Job
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .request_fields import FINISH_REASONS, parse_draft_len, parse_job, usage
from .tool_calls import split_calls, tool_calls_of


class Counted:
    """ASGI middleware: every HTTP response counted by its route and status (`Metrics.request`)."""

    def __init__(self, app, server: Server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counted(message):
            if message["type"] == "http.response.start":  # the router has put the matched route in the scope
                route = scope.get("route")
                self.server.generator.metrics.request(getattr(route, "path", "other"), message["status"])
            await send(message)
        await self.app(scope, receive, counted)


class Server:
    def __init__(self, engine: Engine, model_id: str, defaults: SamplingParams, max_tokens: int = 512,
                 max_queue: int = 16, timeout: float = 600.0, api_key: str | None = None,
                 num_draft: int | None = None, batch_size: int = 1):
        self.model_id, self.defaults, self.max_tokens = model_id, defaults, max_tokens
        self.timeout, self.api_key, self.num_draft = timeout, api_key, num_draft
        self.generator = Generator(engine, max_queue, batch_size)
        self.stored = responses.Stored()
        self.app = Starlette(routes=[
            Route("/health", self.health), Route("/v1/models", self.models),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/v1/responses/{id}", self.stored_response, methods=["GET", "DELETE"]),
            Route("/mlx-spec/v1/status", self.status), Route("/mlx-spec/v1/generate", self.generate, methods=["POST"]),
            Route("/mlx-spec/v1/jobs/{id}", self.control, methods=["POST"]), Route("/metrics", self.metrics),
        ], exception_handlers={APIError: lambda request, e: e.response(), HTTPException: self.http_error,
                               Exception: self.internal_error}, middleware=[Middleware(Counted, self)])

    async def http_error(self, request, e: HTTPException):
        return APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", code=None).response()

    async def internal_error(self, request, e: Exception):
        traceback.print_exception(e, file=sys.stderr)
        return APIError(500, "internal error: see the server's log", kind="server_error").response()

    def authorize(self, request: Request) -> None:
        if self.api_key and (request.headers.get("authorization") != f"Bearer {self.api_key}"
                             and request.headers.get("x-api-key") != self.api_key):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')",
                           code="invalid_api_key")

    async def metrics(self, request: Request):
        """Prometheus' text format (metrics.py)."""
        self.authorize(request)
        return Response(self.generator.metrics.exposition(), media_type=METRICS_TYPE)

    async def health(self, request: Request):
        return JSONResponse({"status": "ok", "model": self.model_id, "waiting": self.generator.jobs.qsize(),
                             "context_length": self.generator.default.context_length, "max_tokens": self.max_tokens})

    async def models(self, request: Request):
        """The model, with its context (prompt and max_tokens together) under vLLM's name, `max_model_len`."""
        self.authorize(request)
        return JSONResponse({"object": "list", "data": [{"id": self.model_id, "object": "model", "created": 0,
                                                         "owned_by": "mlx-spec",
                                                         "max_model_len": self.generator.default.context_length}]})

    async def chat_completions(self, request: Request):
        return await self.complete(request, chat=True)

    async def completions(self, request: Request):
        return await self.complete(request, chat=False)

    async def body(self, request: Request) -> dict:
        self.authorize(request)
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        return body

    async def status(self, request: Request):
        """A drafter's status (built on first use, on the same weights), the default sampling and memory."""
        self.authorize(request)
        drafter = request.query_params.get("drafter")
        if drafter is not None and drafter not in self.generator.default.status().drafters:
            raise APIError(400, f"'drafter' must be one of {', '.join(self.generator.default.status().drafters)}, "
                                f"got {drafter!r}", "drafter")

        def describe() -> dict:
            engine = self.generator.engine_for(drafter)
            return {"model": self.model_id, **asdict(engine.status()), "draft_len": self.num_draft,
                    "tree_width": engine.tree_width, "sampling": asdict(self.defaults),
                    "max_tokens": self.max_tokens, "memory": asdict(memory.report(engine))}
        return JSONResponse(await self.generator.call(describe))

    async def generate(self, request: Request):
        """The engine's events as server-sent events: {"type": "start", "id"}, then token / text / round ones
        (events.event_to_dict), then "done" with the server's memory report, or {"type": "error", "error"}."""
        body = await self.body(request)
        chat = "messages" in body
        job = parse_job(body, chat, self, native=True)
        job.loop = asyncio.get_running_loop()
        self.generator.submit(job)
        return StreamingResponse(self.events(job), media_type="text/event-stream")

    async def events(self, job: Job):
        report = None
        try:
            yield f"data: {json.dumps({'type': 'start', 'id': job.id})}\n\n"
            while True:
                event = await job.events.get()
                if isinstance(event, memory.MemoryReport):
                    report = asdict(event)
                    continue
                if isinstance(event, Done) and event.stop_reason == "stopped" and not job.stop_requested:
                    event = self.stopped(job)
                if isinstance(event, APIError):
                    yield f"data: {json.dumps({'type': 'error', **event.body()})}\n\n"
                    break
                payload = event_to_dict(event)
                if isinstance(event, Done):
                    yield f"data: {json.dumps({**payload, 'memory': report})}\n\n"
                    break
                yield f"data: {json.dumps(payload)}\n\n"
        finally:
            job.cancelled = True

    async def control(self, request: Request):
        body = await self.body(request)
        if bad := set(body) - {"draft_len", "stop"}:
            raise APIError(400, f"unknown field {sorted(bad)[0]!r}: send 'draft_len' (a number or null) or "
                                "'stop': true", sorted(bad)[0])
        if "stop" in body and body["stop"] is not True:
            raise APIError(400, "'stop' must be true", "stop")
        draft_len = parse_draft_len(body, "draft_len") if "draft_len" in body else ...
        self.generator.control(request.path_params["id"], draft_len, body.get("stop", False))
        return JSONResponse({"id": request.path_params["id"]})

    async def complete(self, request: Request, chat: bool):
        body = await self.body(request)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise APIError(400, "'stream' must be true or false", "stream")
        options = body.get("stream_options") or {}
        job = parse_job(body, chat, self)
        job.loop = asyncio.get_running_loop()
        self.generator.submit(job)
        kind = "chat.completion" if chat else "text_completion"
        meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                "model": self.model_id}
        if stream:
            return StreamingResponse(self.chunks(job, chat, meta, options.get("include_usage", False)),
                                     media_type="text/event-stream")
        answer = await self.answer(job, request)
        return JSONResponse(self.final(*answer, chat, kind, meta, job)) if answer else JSONResponse({}, 499)

    async def answer(self, job: Job, request: Request) -> tuple[Done, str, list[Token]] | None:
        """(Done, the whole text, its Token events) of a job not streamed; None when the client went away."""
        text, tokens = [], []
        try:
            while True:
                try:
                    event = await asyncio.wait_for(job.events.get(), 0.5)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return None
                    continue
                if isinstance(event, APIError):
                    raise event
                if isinstance(event, (Token, Text)):
                    text.append(event.text)
                    tokens += [event] if isinstance(event, Token) else []
                elif isinstance(event, Done):
                    if event.stop_reason == "stopped":
                        raise self.stopped(job)
                    return event, "".join(text), tokens
        finally:
            job.cancelled = True  # nothing more will be read (a no-op once the job is done)

    def final(self, done: Done, text: str, tokens: list[Token], chat: bool, kind: str, meta: dict, job: Job) -> dict:
        finish, message = FINISH_REASONS[done.stop_reason], None
        if chat and job.tools:
            text, made = split_calls(self.tool_calls(job), text)
            message = {"role": "assistant", "content": text or None, "tool_calls": made} if made else None
            finish = "tool_calls" if made and finish == "stop" else finish
        choice = ({"index": 0, "message": message or {"role": "assistant", "content": text}} if chat else
                  {"index": 0, "text": text})
        choice.update({"logprobs": self.logprobs_of(tokens, chat) if job.logprobs is not None else None,
                       "finish_reason": finish})
        return {**meta, "object": kind, "choices": [choice], "usage": usage(done)}

    def logprobs_of(self, tokens: list[Token], chat: bool) -> dict:
        """OpenAI's `logprobs` of these tokens: a chat's {"content": [{"token", "logprob", "bytes",
        "top_logprobs"}]}, a completion's lists (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)."""
        raw = ll_tokenizer(self.generator.default.tokenizer).decode_bytes

        def one(token: int, logprob: float) -> dict:
            data = raw([token])
            return {"token": data.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(data)}
        if chat:
            return {"content": [{**one(t.id, t.logprob), "top_logprobs": [one(*best) for best in t.top_logprobs]}
                                for t in tokens]}
        texts = [one(t.id, 0.0)["token"] for t in tokens]
        return {"tokens": texts, "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [{one(*best)["token"]: best[1] for best in t.top_logprobs} for t in tokens],
                "text_offset": [sum(map(len, texts[:i])) for i in range(len(texts))]}

    async def messages(self, request: Request):
        """Anthropic's Messages API (anthropic.py) on the chat route's parsing and generation."""
        try:
            body = await self.body(request)
            if not isinstance(body.get("stream", False), bool):
                raise APIError(400, "'stream' must be true or false", "stream")
            job = parse_job(anthropic.openai_body(body), True, self)
            job.loop = asyncio.get_running_loop()
            self.generator.submit(job)
            if body.get("stream"):
                return StreamingResponse(self.anthropic_events(job), media_type="text/event-stream")
            if (answer := await self.answer(job, request)) is None:
                return JSONResponse({}, 499)
        except APIError as e:
            return anthropic.error_response(e)
        done, text, _ = answer
        content, calls = split_calls(self.tool_calls(job), text) if job.tools else (text, [])
        stop = anthropic.stop_of(done, calls, self.generator.default.tokenizer, job.stop)
        return JSONResponse(anthropic.message(done, content, calls, self.model_id, stop, usage(done)))

    async def anthropic_events(self, job: Job):
        stream, made = anthropic.EventStream(self.model_id, job.prompt_tokens), []
        try:
            yield stream.start()
            async for pieces, end in self.pieces(job):
                if isinstance(end, APIError):
                    yield anthropic.event("error", error=anthropic.error_body(end)["error"])
                    break
                made.extend(p for p in pieces if isinstance(p, dict))
                yield shown(stream, pieces)
                if end is not None:
                    stop = anthropic.stop_of(end, made, self.generator.default.tokenizer, job.stop)
                    yield stream.end(end, stop, usage(end))
        finally:
            job.cancelled = True

    async def pieces(self, job: Job):
        """A job's answer as the streams of /v1/messages and /v1/responses show it: (its text pieces and whole
        tool calls, in order; None) as they come, then (the pieces its end releases; its Done, or the APIError
        it ended with)."""
        calls = self.tool_calls(job)
        while True:
            event = await job.events.get()
            if isinstance(event, Done) and event.stop_reason == "stopped":
                event = self.stopped(job)
            if isinstance(event, APIError):
                yield [], event
                return
            if isinstance(event, (Token, Text)) and event.text:
                yield (calls.feed(event.text) if calls else [event.text]), None
            elif isinstance(event, Done):
                yield (calls.close() if calls else []), event
                return

    async def responses(self, request: Request):
        """OpenAI's Responses API (responses.py) on the chat route's parsing and generation."""
        body = await self.body(request)
        if not isinstance(body.get("stream", False), bool):
            raise APIError(400, "'stream' must be true or false", "stream")
        chat, conversation = responses.chat_body(body, self.stored)
        try:
            job = parse_job(chat, True, self)
        except APIError as e:
            raise responses.renamed(e) from None
        job.loop = asyncio.get_running_loop()
        self.generator.submit(job)
        started = responses.shell(body, self.model_id)
        if body.get("stream"):
            return StreamingResponse(self.response_events(job, started, conversation), media_type="text/event-stream")
        if (answer := await self.answer(job, request)) is None:
            return JSONResponse({}, 499)
        done, text, _ = answer
        content, calls = split_calls(self.tool_calls(job), text) if job.tools else (text, [])
        return JSONResponse(self.keep(responses.finished(started, done, responses.output_items(content, calls),
                                                         usage(done)), conversation))

    def keep(self, response: dict, conversation: list[dict]) -> dict:
        """Store a finished response (unless asked not to) with the conversation it ends."""
        if response["store"]:
            self.stored.keep(response, [*conversation, responses.answered(response["output"])])
        return response

    async def stored_response(self, request: Request):
        self.authorize(request)
        rid = request.path_params["id"]
        if request.method == "DELETE":
            self.stored.delete(rid)
            return JSONResponse({"id": rid, "object": "response", "deleted": True})
        return JSONResponse(self.stored.get(rid)[0])

    async def response_events(self, job: Job, started: dict, conversation: list[dict]):
        stream = responses.EventStream(started)
        try:
            yield stream.start()
            async for pieces, end in self.pieces(job):
                if isinstance(end, APIError):
                    yield stream.error(end)
                    break
                yield shown(stream, pieces)
                if end is not None:
                    events, response = stream.end(end, usage(end))
                    self.keep(response, conversation)
                    yield events
        finally:
            job.cancelled = True

    def tool_calls(self, job: Job):
        """A stream that finds the calls of the job's tools in its text (None: the job has no tools)."""
        return tool_calls_of(self.generator.default.tokenizer, job.tools) if job.tools else None

    def stopped(self, job: Job) -> APIError:
        if self.generator.closing:
            return APIError(503, "the server is shutting down", kind="server_error", code="shutting_down")
        return APIError(504, f"the request ran past the server's --timeout of {self.timeout:g} s",
                        kind="server_error", code="timeout")

    async def chunks(self, job: Job, chat: bool, meta: dict, include_usage: bool):
        """Server-sent chunks: content deltas (text), each tool call whole in one delta as its end marker comes."""
        kind = "chat.completion.chunk" if chat else "text_completion"
        calls, made, scored = self.tool_calls(job) if chat else None, [], []  # scored: tokens not yet reported

        def chunk(delta: dict, finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": delta.get("content", "")}
            choice.update({"logprobs": self.logprobs_of(scored, chat) if scored else None, "finish_reason": finish})
            scored.clear()
            return f"data: {json.dumps({**meta, 'object': kind, 'choices': [choice]})}\n\n"

        def deltas(pieces: list) -> list[str]:
            for piece in pieces:
                if isinstance(piece, dict):
                    made.append(piece)
            return [chunk({"content": piece} if isinstance(piece, str) else
                          {"tool_calls": [{"index": made.index(piece), **piece}]}) for piece in pieces]

        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            while True:
                event = await job.events.get()
                if isinstance(event, APIError):
                    yield f"data: {json.dumps(event.body())}\n\n"
                    break
                if isinstance(event, Token) and event.logprob is not None:
                    scored.append(event)
                if isinstance(event, (Token, Text)) and event.text:
                    for line in deltas(calls.feed(event.text) if calls else [event.text]):
                        yield line
                elif isinstance(event, Done):
                    if event.stop_reason == "stopped":
                        yield f"data: {json.dumps(self.stopped(job).body())}\n\n"
                        break
                    for line in deltas(calls.close() if calls else []):
                        yield line
                    finish = FINISH_REASONS[event.stop_reason]
                    yield chunk({}, "tool_calls" if made and finish == "stop" else finish)
                    if include_usage:
                        yield f"data: {json.dumps({**meta, 'object': kind, 'choices': [], 'usage': usage(event)})}\n\n"
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled = True  # a client that went away stops its generation at the next round


def shown(stream, pieces: list) -> str:
    """Text pieces and tool calls as the events of `stream` (anthropic.EventStream, responses.EventStream)."""
    return "".join(stream.call(p) if isinstance(p, dict) else stream.text(p) for p in pieces)


def check_port(host: str, port: int) -> None:
    """A SpecError unless this process can listen on host:port now (as uvicorn will, with SO_REUSEADDR)."""
    import socket

    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as e:
        raise SpecError(f"cannot listen on {host}:{port} ({e.strerror or e}): choose another --port or --host, or "
                        "stop what uses it") from None


def serve(server: Server, host: str, port: int) -> None:
    """Run until Ctrl+C or SIGTERM; requests in flight then end with an error. After SIGTERM this returns (exit
    status 0); after Ctrl+C uvicorn raises it again (KeyboardInterrupt: status 130, as every command)."""
    import signal

    import uvicorn

    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # what uvicorn raises again once it has stopped

    class Uvicorn(uvicorn.Server):
        def handle_exit(self, sig, frame):
            server.generator.shutdown()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(server.app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=10)
    print(f"mlx-spec: serving {server.model_id} at http://{host}:{port}/v1 (Ctrl+C stops)", file=sys.stderr,
          flush=True)
    Uvicorn(config).run()
