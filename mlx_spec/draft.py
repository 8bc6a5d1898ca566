"""The value a drafter hands to the verifier."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


@dataclass
class Draft:
    """Proposed continuation: `tokens` (k,) and the distributions `q` (k, V) they were drawn from
    (None for deterministic drafters, whose q is one-hot)."""

    tokens: mx.array
    q: mx.array | None = None

    @classmethod
    def empty(cls) -> "Draft":
        return cls(mx.zeros((0,), dtype=mx.int32))
