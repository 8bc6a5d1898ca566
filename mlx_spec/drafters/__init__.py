"""The drafter protocol. Each drafter lives in its own module and registers nothing elsewhere."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from ..sampling import SamplingParams
from ..target import Step


@dataclass
class Draft:
    """Proposed continuation: `tokens` (k,) and the distributions `q` (k, V) they were drawn from
    (None for deterministic drafters, whose q is one-hot)."""

    tokens: mx.array
    q: mx.array | None = None

    @classmethod
    def empty(cls) -> "Draft":
        return cls(mx.zeros((0,), dtype=mx.int32))


class Drafter(Protocol):
    name: str

    def begin(self, context: list[int]) -> None:
        """Start a sequence whose tokens so far are `context` (the target has prefilled all but the last)."""

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        """Up to k tokens continuing `context`, sampled with `params` (may be lazy)."""

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        """The round kept `accepted` drafts; `context` now ends with them and the target's next token."""
