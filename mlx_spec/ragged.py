"""The KV caches of a batch of sequences that each keep their own length: what batched speculation runs on.

All rows of a batch are written at the same columns, one forward at a time, but each row has its own positions
(`offsets`: its rotary embeddings place its tokens where decoding it alone would) and its own valid columns: a
round gives every row `1 + max draft length` columns, and the columns of a row's rejected drafts (and of the
padding after a shorter draft) are masked out for good, while columns that every row rejected are written over
by the next forward. Holes are squeezed out when the buffers would otherwise grow (`compact`); rows leave
(`select`) and join (`join`, after their prompt ran in a batch of their own) between forwards. Full-attention
KV caches only (`RaggedBatch.problem` says why a model's cannot).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache

STEP = 256  # columns added when the buffers grow


class RaggedKVCache:
    """One attention layer's keys and values; the layout (columns, positions, masks) is its batch's."""

    def __init__(self, batch: "RaggedBatch"):
        self.batch = batch
        self.keys = self.values = None

    @property
    def offset(self) -> mx.array:
        return self.batch.positions  # (B,) the position of each row's first new token

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        start, end = self.batch.columns, self.batch.columns + keys.shape[2]
        if self.keys is None or self.keys.shape[2] < self.batch.capacity:
            self.keys, self.values = (_widen(self.keys, keys, self.batch.capacity),
                                      _widen(self.values, values, self.batch.capacity))
        self.keys[..., start:end, :] = keys
        self.values[..., start:end, :] = values
        return self.keys[..., :end, :], self.values[..., :end, :]

    def make_mask(self, n: int, *args, **kwargs) -> mx.array:
        return self.batch.mask

    @property
    def state(self):
        return self.keys, self.values

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


def _widen(buffer: mx.array | None, like: mx.array, width: int) -> mx.array:
    shape = (like.shape[0], like.shape[1], width, like.shape[3])
    if buffer is None:
        return mx.zeros(shape, like.dtype)
    extra = mx.zeros((*shape[:2], width - buffer.shape[2], shape[3]), buffer.dtype)
    return mx.concatenate([buffer, extra], axis=2)


class RaggedBatch:
    """A batch of rows over one model's layers: after `mark`, `forward`s run (B, n) blocks of inputs, then
    `keep` says how many of each row's inputs stay in the cache."""

    def __init__(self, model, rows: int = 0):
        """An empty cache for `rows` rows."""
        self.model = model
        self.caches = [RaggedKVCache(self) for _ in make_prompt_cache(model)]
        self.columns = 0  # columns written (valid or not)
        self.capacity = 0  # columns the buffers hold
        self.valid = np.zeros((rows, 0), dtype=bool)  # (B, columns): a row holds its valid columns' positions
        self.positions = self.mask = None  # set around a forward
        self.marked = None  # the columns written when the round began (`mark`)

    @property
    def offsets(self) -> np.ndarray:
        """(B,) the positions each row holds."""
        return self.valid.sum(axis=1)

    @classmethod
    def prefilled(cls, model, tokens: list[int], chunk: int = 512) -> "RaggedBatch":
        """A batch of one row holding `tokens` (a prompt, before it joins a batch)."""
        batch = cls(model, rows=1)
        while not batch.extend(tokens, chunk):
            pass
        return batch

    def extend(self, tokens: list[int], chunk: int = 512) -> bool:
        """Run the next `chunk` of `tokens` that this one-row batch does not hold yet; whether it now holds them
        all (a prompt prefilled a chunk at a time)."""
        done = int(self.offsets[0])
        if done < len(tokens):
            part = tokens[done:done + chunk]
            self.forward(mx.array([part], dtype=mx.int32), [len(part)])
            mx.eval([c.state for c in self.caches])
        return done + chunk >= len(tokens)

    @staticmethod
    def problem(model) -> str | None:
        """Why this model's caches cannot be batched here (None when they can)."""
        kinds = {type(c).__name__ for c in make_prompt_cache(model) if type(c) is not KVCache}
        return f"its {', '.join(sorted(kinds))} caches are not batched yet" if kinds else None

    @property
    def size(self) -> int:
        return self.valid.shape[0]

    def mark(self) -> None:
        """Start a round: `keep` then says what stays of every forward since."""
        self.marked = self.columns

    def forward(self, tokens: mx.array, lengths: list[int]) -> mx.array:
        """Run `tokens` (B, n) after what each row holds: row i's first `lengths[i]` inputs are real, the rest
        padding (never seen by real inputs, masked out after). Returns logits (B, n, V); lazy."""
        b, n = tokens.shape
        if self.columns + n > self.capacity:
            self._make_room(n)
        mask = np.zeros((b, 1, n, self.columns + n), dtype=bool)
        mask[:, 0, :, :self.columns] = self.valid[:, None, :self.columns]
        mask[:, 0, :, self.columns:] = np.tril(np.ones((n, n), dtype=bool))
        self.mask, self.positions = mx.array(mask), mx.array(self.offsets.astype(np.int32))
        try:
            logits = self.model(tokens, cache=self.caches)
        finally:
            self.mask = self.positions = None
        grown = np.zeros((b, self.columns + n), dtype=bool)
        grown[:, :self.columns] = self.valid[:, :self.columns]
        grown[:, self.columns:] = np.arange(n)[None, :] < np.array(lengths)[:, None]
        self.valid, self.columns = grown, self.columns + n
        return logits

    def keep(self, kept: list[int]) -> None:
        """Of the real inputs each row ran since `mark`, row i keeps its first kept[i]; the columns every row
        dropped are written over next."""
        end = self.marked
        for row, count in enumerate(kept):
            new = np.flatnonzero(self.valid[row, self.marked:]) + self.marked
            self.valid[row, new[count:]] = False
            end = max(end, new[count - 1] + 1 if count else end)
        self.columns, self.marked = end, None
        self.valid = self.valid[:, :end]

    def select(self, rows: list[int]) -> None:
        """Keep only `rows` (indices), in that order: finished sequences leave."""
        index = mx.array(rows, dtype=mx.int32)
        for cache in self.caches:
            if cache.keys is not None:
                cache.keys, cache.values = cache.keys[index], cache.values[index]
        self.valid = self.valid[rows]
        if not rows:
            self.columns = 0
            self.valid = np.zeros((0, 0), dtype=bool)

    def join(self, other: "RaggedBatch") -> None:
        """Append `other`'s rows (a prompt prefilled on its own), right-aligned with this batch's columns."""
        width = max(self.columns, other.columns)
        sides = [(self, width - self.columns), (other, width - other.columns)]
        for mine, theirs in zip(self.caches, other.caches):
            like = mine.keys if mine.keys is not None else theirs.keys
            if like is None:
                continue  # nothing cached yet on either side (one-token prompts)
            stacked = []
            for which in ("keys", "values"):
                parts = []
                for (batch, pad), cache in zip(sides, (mine, theirs)):
                    buffer = getattr(cache, which)
                    if buffer is None:
                        buffer = mx.zeros((batch.size, like.shape[1], 0, like.shape[3]), like.dtype)
                    parts.append(_shift(buffer[..., :batch.columns, :], pad))
                stacked.append(mx.concatenate(parts, axis=0))
            mine.keys, mine.values = stacked
        self.valid = np.concatenate([np.pad(batch.valid[:, :batch.columns], ((0, 0), (pad, 0))) for batch, pad in sides])
        self.columns = self.capacity = width

    def _make_room(self, n: int) -> None:
        """Room for n more columns: squeeze out the holes when that frees a quarter of the columns, else grow."""
        counts = self.valid.sum(axis=1)
        unmarked = self.marked is None or self.marked == self.columns  # nothing of a round written yet
        if unmarked and self.size and self.columns - counts.max() >= max(n, self.columns // 4):
            self.compact()
            if self.marked is not None:
                self.marked = self.columns
        if self.columns + n > self.capacity:
            self.capacity = self.columns + n + STEP  # the caches widen their buffers at the next write

    def compact(self) -> None:
        """Move each row's valid columns to the end of the shortest width that holds them all, in order."""
        counts = self.valid.sum(axis=1)
        width = int(counts.max())
        index = np.zeros((self.size, width), dtype=np.int32)
        valid = np.zeros((self.size, width), dtype=bool)
        for row, count in enumerate(counts):
            index[row, width - count:] = np.flatnonzero(self.valid[row])
            valid[row, width - count:] = True
        gather = mx.array(index)[:, None, :, None]
        for cache in self.caches:
            if cache.keys is not None:
                cache.keys = mx.take_along_axis(cache.keys, gather, axis=2)
                cache.values = mx.take_along_axis(cache.values, gather, axis=2)
        self.valid, self.columns, self.capacity = valid, width, width


def _shift(buffer: mx.array, pad: int) -> mx.array:
    """`pad` empty columns before `buffer`'s."""
    if not pad:
        return buffer
    return mx.concatenate([mx.zeros((*buffer.shape[:2], pad, buffer.shape[3]), buffer.dtype), buffer], axis=2)
