"""A language model together with its cache: the target, and also a separate draft model."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .caches import RecurrentCache, make_caches, rollback, unsupported_cache
from .models import qwen3_5

MAX_DRAFT_LEN = 32
PREFILL_CHUNK = 512


@dataclass
class Step:
    """What one forward pass over consecutive positions produced."""

    logits: mx.array  # (n, V): row j scores the token after input j


class Target:
    """`forward` appends positions to the cache; `rollback(n)` removes the last n, whatever the cache types."""

    def __init__(self, model, kv_bits: int | None = None, kv_group_size: int = 64):
        self.model = model
        self.kv_bits, self.kv_group_size = kv_bits, kv_group_size
        self.recurrent = qwen3_5.install(model)
        self.reset()

    def reset(self) -> None:
        self.cache = make_caches(self.model, MAX_DRAFT_LEN + 1, self.kv_bits, self.kv_group_size, self.recurrent)
        self.recurrent_caches = [c for c in self.cache if isinstance(c, RecurrentCache)]
        self.offset = 0  # positions in the cache

    def rollback_problem(self) -> str | None:
        """Why this model's cache cannot be rolled back (None when it can)."""
        name = unsupported_cache(self.cache)
        return name and f"its {name} cache cannot be rolled back yet"

    def forward(self, tokens) -> Step:
        """Run `tokens` (list or 1-D array) through the model after the cached positions; lazy."""
        tokens = mx.array(tokens, dtype=mx.int32) if isinstance(tokens, list) else tokens
        self.offset += tokens.shape[0]
        return Step(self.model(tokens[None], cache=self.cache)[0])

    def prefill(self, tokens: list[int]) -> None:
        """Process a prompt in chunks, evaluating the cache as it goes; nothing is kept for rollback."""
        for cache in self.recurrent_caches:
            cache.capture = False
        for start in range(0, len(tokens), PREFILL_CHUNK):
            self.forward(tokens[start:start + PREFILL_CHUNK])
            mx.eval([c.state for c in self.cache])
        for cache in self.recurrent_caches:
            cache.release()
            cache.capture = True

    def rollback(self, n: int) -> None:
        """Remove the last n positions (n may be 0: that releases what was kept for a rollback)."""
        rollback(self.cache, n, MAX_DRAFT_LEN + 1)
        self.offset -= n
