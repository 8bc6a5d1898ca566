"""What a generation yields (Token / Text / Round / Done events, and the Result they add up to), as the one-sequence
engine and the batch decoder both produce them and every client reads them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterator

from ..seams.errors import SpecError
from .stats import Stats
from .text_stream import TextStream


@dataclass
class Token:
    id: int
    text: str  # newly printable text (may be empty while a multi-byte character or stop string is pending)
    from_draft: bool
    logprob: float | None = None  # asked for (`logprobs`): log p of this token under the target's own logits
    top_logprobs: list[tuple[int, float]] | None = None  # and its likeliest tokens there, (id, log p) each


@dataclass
class Text:
    """Printable text that comes with no new token: what was held back for a stop string that never came."""

    text: str


@dataclass
class Round:
    draft_len: int  # drafted positions (a tree's depth)
    accepted: int
    nodes: int = 0  # drafted tokens verified (a tree's nodes; a chain's draft_len)


@dataclass
class Done:
    stop_reason: str  # "eos", "max_tokens", "stop_string" or "stopped" (Engine.stop)
    text: str
    tokens: list[int]
    stats: Stats


EVENTS = {"token": Token, "text": Text, "round": Round, "done": Done}


def event_to_dict(event: Token | Text | Round | Done) -> dict:
    """An event as JSON can carry it ({"type": "token", ...}); `event_from_dict` reads it back."""
    return {"type": next(name for name, kind in EVENTS.items() if isinstance(event, kind)), **asdict(event)}


def event_from_dict(data: dict) -> Token | Text | Round | Done:
    fields = {k: v for k, v in data.items() if k != "type"}
    if data["type"] == "done":
        fields["stats"] = Stats(**fields["stats"])
    return EVENTS[data["type"]](**fields)


@dataclass
class Result:
    text: str
    tokens: list[int]
    stop_reason: str
    stats: Stats
    from_draft: list[bool] = field(default_factory=list)
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)  # (log p, top) a token


def emit(new_tokens: list[int], accepted: int, generated: list[int], text: TextStream, eos, max_tokens: int):
    """Add a round's tokens to `generated` up to the first stop: (their Token events, the stop reason or None)."""
    events = []
    for i, token in enumerate(new_tokens):
        generated.append(token)
        if token in eos:
            return events, "eos"
        events.append(Token(token, text.add(token), from_draft=i < accepted))
        if text.stopped_at is not None:
            return events, "stop_string"
        if len(generated) >= max_tokens:
            return events, "max_tokens"
    return events, None


def collect(events: Iterator[Token | Text | Round | Done]) -> Result:
    """A whole generation from its events."""
    from_draft, logprobs = [], []
    for event in events:
        if isinstance(event, Token):
            from_draft.append(event.from_draft)
            if event.logprob is not None:
                logprobs.append((event.logprob, event.top_logprobs))
        elif isinstance(event, Done):
            return Result(event.text, event.tokens, event.stop_reason, event.stats, from_draft, logprobs)
    raise SpecError("the generation ended without its last event")
