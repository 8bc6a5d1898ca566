"""One attention layer's keys and values in a batch's columns (`ragged.RaggedBatch`), and the buffers' shapes."""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import create_attention_mask

STEP = 256  # columns added when the buffers grow


class RaggedKVCache:
    """One attention layer's keys and values; the layout (columns, positions, masks) is its batch's. With
    `bits`, they are kept quantized as mlx-lm's QuantizedKVCache keeps them ((data, scales, biases), each token's
    groups on their own) and mlx-lm's attention, seeing `bits`, attends over them quantized."""

    def __init__(self, batch, bits: int | None = None, group_size: int = 64,
                 window: int | None = None):
        """window: a sliding window's size (mlx-lm gave the layer a RotatingKVCache that keeps that many): the
        layer then holds only the columns from its batch's `starts[window]` on."""
        self.batch, self.window = batch, window
        self.keys = self.values = None
        if bits:
            self.bits, self.group_size = bits, group_size

    @property
    def first(self) -> int:
        """The column its buffers' first one is (a window's layers: the batch's `starts`; else 0)."""
        return self.batch.starts.get(self.window, 0) if self.window else 0

    @property
    def offset(self) -> mx.array:
        return self.batch.positions  # (B,) the position of each row's first new token

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if hasattr(self, "bits"):
            keys, values = (tuple(mx.quantize(x, group_size=self.group_size, bits=self.bits)) for x in (keys, values))
        first = self.first
        start, width = self.batch.columns - first, self.batch.capacity - first
        end = start + parts_of(keys)[0].shape[2]
        if self.keys is None or parts_of(self.keys)[0].shape[2] < width:
            self.keys, self.values = widened(self.keys, keys, width), widened(self.values, values, width)
        for buffer, new in zip((*parts_of(self.keys), *parts_of(self.values)), (*parts_of(keys), *parts_of(values))):
            buffer[..., start:end, :] = new
        return tree_map(lambda buffer: buffer[..., :end, :], (self.keys, self.values))

    def columns_for(self, positions: int) -> int:
        """About the most columns it holds for a row of `positions` (a window's: twice what the row needs, more
        where other rows' drafts left holes, and room for the next writes)."""
        return min(positions, 2 * (self.window + 1) + STEP) if self.window else positions

    def held(self) -> tuple[mx.array, mx.array]:
        """Its keys and values from its `first` column to the last written one."""
        end = self.batch.columns - self.first
        return self.keys[..., :end, :], self.values[..., :end, :]

    def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False, **kwargs):
        window, first = window_size or self.window, self.first
        if self.batch.lone:
            mask = lone_mask(n, int(self.batch.columns), window, return_array)
            return mask[..., first:] if first else mask
        return self.batch.window_mask(window, first) if window else self.batch.mask

    @property
    def state(self):
        return self.keys, self.values

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else sum(part.nbytes for part in parts_of(self.keys) + parts_of(self.values))


def lone_mask(n: int, held: int, window: int | None, return_array: bool):
    """The mask of `n` inputs of a lone row whose `held` columns are all its own (no hole): what mlx-lm's KVCache
    gives one sequence (none for one input, "causal" for more, an array where a window or the model asks)."""
    return create_attention_mask(n, held, return_array, window)


def parts_of(buffer) -> tuple:
    """A buffer's arrays: one (float) or three (quantized: data, scales, biases)."""
    return buffer if isinstance(buffer, tuple) else (buffer,)


def widened(buffer, like, width: int):
    """`buffer` (None: nothing yet) with columns up to `width`, in `like`'s form."""
    def widen(part: mx.array | None, new: mx.array) -> mx.array:
        shape = (new.shape[0], new.shape[1], width, new.shape[3])
        if part is None:
            return mx.zeros(shape, new.dtype)
        return mx.concatenate([part, mx.zeros((*shape[:2], width - part.shape[2], shape[3]), part.dtype)], axis=2)
    return tree_map(widen, buffer, like) if buffer is not None else tree_map(lambda new: widen(None, new), like)
