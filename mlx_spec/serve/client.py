"""An engine that runs on a `mlx-spec serve` server: what `mlx-spec chat --server URL` talks to.

`RemoteEngine` answers what a client asks of an `Engine` (`stream`, `generate`, `status`, `pin`, `stop`,
`with_drafter`) over the server's mlx-spec routes (server.py). Events arrive as the server's engine makes them,
rounds included. As on an Engine, `pin` and `stop` may be called from any thread and reach the generation running
on the server from its next round.
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import httpx

from ..core.events import Done, Result, Round, Text, Token, collect, event_from_dict
from ..core.sampling import SamplingParams
from ..decode.engine import EngineStatus, check_draft_len, draft_policy
from ..seams.errors import SpecError
from ..seams.memory import MemoryReport

STATUS_SECONDS = 600.0  # the status runs on the generation thread, after the generations already waiting there
CONTROL_SECONDS = 10.0


def image_url(part: dict) -> dict:
    """An image part ({"type": "image", "image": a path or bytes}) as OpenAI's, a data URL; other parts as they
    are."""
    if not isinstance(part, dict) or part.get("type") != "image":
        return part
    image = part.get("image")
    try:
        data = image if isinstance(image, bytes) else Path(image).expanduser().read_bytes()
    except (OSError, TypeError) as e:
        raise SpecError(f"cannot read the image {image!r} ({getattr(e, 'strerror', None) or e}): give an image "
                        "file's path") from None
    return {"type": "image_url", "image_url": {"url": "data:image;base64," + base64.b64encode(data).decode()}}


class RemoteEngine:
    def __init__(self, url: str, api_key: str | None = None, drafter: str | None = None):
        """Connects at once: a server that cannot be reached, or refuses the key, is a SpecError here."""
        self.url, self.api_key = url.rstrip("/"), api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, headers=self.headers, timeout=httpx.Timeout(30.0, read=None))
        info = self.call("GET", "/mlx-spec/v1/status", params={"drafter": drafter} if drafter else None,
                         timeout=STATUS_SECONDS)
        self.model, self.drafter, self.drafters = info["model"], info["drafter"], info["drafters"]
        self.max_draft_len, self.tree_width, self.shape = info["max_draft_len"], info["tree_width"], info["shape"]
        self.sampling, self.max_tokens = SamplingParams(**info["sampling"]), info["max_tokens"]
        self.memory_report = MemoryReport(**info["memory"])
        self.lock = threading.Lock()  # guards the job id and the controls that wait for it
        self.job_id: str | None = None  # the server's id of the generation running
        self.pending: dict = {}  # controls asked before the server named the generation
        self.pin(info["draft_len"])

    def call(self, method: str, path: str, timeout: float, **kwargs) -> dict:
        try:
            response = self.http.request(method, path, timeout=timeout, **kwargs)
        except httpx.TransportError as e:
            raise self.unreachable(e) from None
        if response.status_code != 200:
            raise self.refusal(response)
        return response.json()

    def unreachable(self, e: httpx.TransportError) -> SpecError:
        return SpecError(f"cannot reach an mlx-spec server at {self.url} ({e or type(e).__name__}): start one with "
                         "`mlx-spec serve` or check the address")

    def refusal(self, response: httpx.Response) -> SpecError:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {response.status_code}"
        if response.status_code == 401:
            return SpecError(f"the server at {self.url} refused the API key ({message}): pass --api-key or set "
                             "MLX_SPEC_API_KEY")
        if response.status_code == 404 and "/mlx-spec/" in str(response.url) and "job" not in message:
            return SpecError(f"{self.url} is not an mlx-spec server ({message}): give the address of "
                             "`mlx-spec serve`")
        return SpecError(f"the server at {self.url}: {message}")

    def status(self) -> EngineStatus:
        return EngineStatus(self.drafter, self.note, self.pinned, self.max_draft_len, self.drafters, self.shape,
                            reasons=[self.note, *self.reasons])

    def memory(self) -> MemoryReport:
        """The server's memory, as of its last answer."""
        return self.memory_report

    def pin(self, draft_len: int | None) -> None:
        """Fix the draft length (0: off) or None for the adaptive policy, from the next round of the running
        generation and for the next ones."""
        check_draft_len(draft_len)
        self.draft_len = draft_len
        policy = draft_policy(draft_len if self.drafter != "off" else 0, self.max_draft_len, self.tree_width)
        self.note, self.pinned, self.reasons = policy.note, policy.pinned, []
        self.control(draft_len=draft_len)

    def stop(self) -> None:
        """End the running generation after its current round, with stop reason "stopped"."""
        self.control(stop=True)

    def control(self, **change) -> None:
        with self.lock:
            if self.job_id is None:
                self.pending.update(change)
                return
            job_id = self.job_id
        self.send_control(job_id, change)

    def send_control(self, job_id: str, change: dict) -> None:
        try:  # a client of its own: this may run on any thread while the stream reads on another
            httpx.post(f"{self.url}/mlx-spec/v1/jobs/{job_id}", json=change, headers=self.headers,
                       timeout=CONTROL_SECONDS)
        except httpx.TransportError:
            pass  # the stream reports a lost server; a 404 means the generation has just ended: nothing to change

    def with_drafter(self, drafter: str) -> "RemoteEngine":
        """The same server's model drafting with `drafter` ("off": none)."""
        if drafter not in self.drafters:
            raise SpecError(f"drafter {drafter!r} is not available here: choose one of {', '.join(self.drafters)}")
        return RemoteEngine(self.url, self.api_key, drafter)

    def stream(self, prompt: str | list[int] | list[dict], params: SamplingParams = SamplingParams(),
               max_tokens: int = 256, stop: list[str] = (), seed: int = 0) -> Iterator[Token | Text | Round | Done]:
        """As Engine.stream: a text as it is, token ids, or a chat through the server model's chat template (its
        image parts sent as data URLs)."""
        chat = isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt) and [
            {**m, "content": [image_url(p) for p in m["content"]]} if isinstance(m.get("content"), list) else m
            for m in prompt]
        with self.lock:
            self.job_id, self.pending = None, {}  # a stop asked before this stream began is not for it
        body = {"messages" if chat else "prompt": prompt, **asdict(params), "max_tokens": max_tokens,
                "stop": list(stop), "seed": seed, "drafter": self.drafter, "draft_len": self.draft_len}
        try:
            with self.http.stream("POST", "/mlx-spec/v1/generate", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise self.refusal(response)
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = json.loads(line[len("data: "):])
                    if data["type"] == "start":
                        self.started(data["id"])
                    elif data["type"] == "error":
                        raise SpecError(f"the server at {self.url}: {data['error']['message']}")
                    elif data["type"] == "done":
                        if report := data.pop("memory", None):
                            self.memory_report = MemoryReport(**report)
                        done = event_from_dict(data)
                        if self.draft_len is None:
                            self.note, self.reasons = done.stats.policy, done.stats.policy_reasons  # its last decision
                        yield done
                        return
                    else:
                        yield event_from_dict(data)
        except httpx.ConnectError as e:
            raise self.unreachable(e) from None
        except httpx.TransportError as e:
            raise SpecError(f"lost the server at {self.url} ({e or type(e).__name__})") from None
        finally:
            with self.lock:
                self.job_id = None
        raise SpecError(f"the server at {self.url} ended the answer without its last event")

    def started(self, job_id: str) -> None:
        with self.lock:
            self.job_id, pending, self.pending = job_id, self.pending, {}
        if pending:
            self.send_control(job_id, pending)

    def generate(self, prompt: str | list[int] | list[dict], params: SamplingParams = SamplingParams(),
                 max_tokens: int = 256, stop: list[str] = (), seed: int = 0) -> Result:
        return collect(self.stream(prompt, params, max_tokens, stop, seed))
