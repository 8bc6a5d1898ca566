"""Rollback of every cache type in one place.

A speculative round appends `1 + draft_len` positions to the target's cache and then removes the rejected
ones. mlx-lm's own `trim` is exact for `KVCache` and `QuantizedKVCache`, but a sliding-window
`RotatingKVCache` that has wrapped overwrote the keys it would need, and mlx-lm then trims nothing. Here each
sliding-window cache is made `slack` slots larger than its window (attention still sees exactly the window:
the models pass `window_size` to the mask), so the last `slack` positions can always be undone exactly.

Full-attention caches are `TreeKVCache` / `QuantizedTreeKVCache`: while `attend` is set, a forward sees the cached
prefix and, among the last positions, only what `attend` allows (a token tree's ancestors); `keep` then
compacts the kept positions of such a block to the front of it. Sliding-window caches are `TreeRotatingKVCache`:
the same for a tree verified in one forward, each node seeing the keys within the window of its own position.
A layer whose cache is a `CacheList` (DeepSeek-V3.2 / GLM-5: the attention's keys and values, the sparse indexer's
keys) counts as its inner caches, each of them one of the above (`layers_of`).
"""

from __future__ import annotations

import contextlib
import functools

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from . import compat
from .compat import positions, set_write_index, write_index
from .errors import SpecError


class TreeMask:
    """Mixin for full-attention caches. `attend` (n, m) bool, set around one forward of n new positions: new
    position i sees, of the last m positions (cached and new), those where attend[i] is True, and every
    position before them. mlx-lm asks the cache for the mask (`create_attention_mask`)."""

    attend: mx.array | None = None
    depths: mx.array | None = None  # (n,) each new position's depth in the tree, while `attend` is set
    beyond: mx.array | None = None  # (n, n) what new position i sees of the new ones even beyond its window

    def make_mask(self, n: int, *args, **kwargs):
        if self.attend is None:
            return super().make_mask(n, *args, **kwargs)
        prefix = self.offset + n - self.attend.shape[1]
        return mx.concatenate([mx.ones((n, prefix), dtype=mx.bool_), self.attend], axis=1)


@contextlib.contextmanager
def tree_forward(caches: list, attend, token_positions: list[int]):
    """Within: a forward over `caches` (TreeMasks) sees what `attend` allows (see TreeMask) and places its
    tokens at `token_positions` (rotary embeddings made positionable by `compat.positioned_ropes`)."""
    mask, placed = mx.array(attend), mx.array(token_positions)
    for cache in layers_of(caches):
        cache.attend, cache.depths = mask, placed - token_positions[0]
    try:
        with positions(placed):
            yield
    finally:
        for cache in layers_of(caches):
            cache.attend = cache.depths = None


@contextlib.contextmanager
def seeing(caches: list, seen):
    """Within: a forward of n new positions over `caches` (TreeMasks) in which position i also sees the new
    positions j where seen[i, j] (n, n), later ones too, whatever its window: an image's tokens, which Gemma 4
    reads all at once."""
    n = seen.shape[0]
    seen = mx.array(seen)
    attend, depths = mx.tril(mx.ones((n, n), dtype=mx.bool_)) | seen, mx.arange(n)
    for cache in layers_of(caches):
        cache.attend, cache.depths, cache.beyond = attend, depths, seen
    try:
        yield
    finally:
        for cache in layers_of(caches):
            cache.attend = cache.depths = cache.beyond = None


def layers_of(caches: list) -> list:
    """The caches, a CacheList's inner caches in its place."""
    return [inner for cache in caches for inner in (cache.caches if isinstance(cache, CacheList) else (cache,))]


class TreeKVCache(TreeMask, KVCache):
    pass


class QuantizedTreeKVCache(TreeMask, QuantizedKVCache):
    pass


class TreeRotatingKVCache(TreeMask, RotatingKVCache):
    """A sliding-window cache that verifies a tree in one forward (`attend` over the new positions only): node i,
    at depth d_i, sees the cached keys within the window of its own position and its ancestors within it. The
    keys a multi-token update attends to are the last min(max_size - 1, offset) cached ones, in order, then the
    new ones (mlx-lm's `_update_concat`), the root of the tree first."""

    def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False):
        if self.attend is None or n == 1:  # one position: a plain step, written in place
            return RotatingKVCache.make_mask(self, n, window_size=window_size, return_array=return_array)
        if self.attend.shape[1] != n:
            raise SpecError("a sliding-window cache verifies a tree in one forward, not level by level")
        window, prefix = window_size or self.max_size, min(self.max_size - 1, self.offset)
        depth = self.depths
        cached = mx.arange(prefix)[None, :] > prefix + depth[:, None] - window
        new = self.attend & (depth[:, None] - depth[None, :] < window)
        return mx.concatenate([cached, new if self.beyond is None else new | self.beyond], axis=1)


class RecurrentCache(ArraysCache):
    """A recurrent layer's cache (mlx-lm's `ArraysCache`: Gated DeltaNet's [conv window, state], or another
    family's arrays) that can be rolled back.

    While `capture` is on it keeps what it holds after every position processed since the last `release`, each
    entry a tuple of its arrays or, for a position inside a multi-token forward of a replaying layer
    (models/recurrence.py), the call that computes them (`kept` makes it once). Single-token steps through
    mlx-lm's Gated DeltaNet are recorded as the layer stores its state, and a capturing one records every position
    of a multi-token forward. Rolling back n positions restores the n-th most recent entry."""

    def __init__(self, size: int = 2):
        super().__init__(size)
        self.capture = False
        self.saved = [(None,) * size]  # saved[0]: the arrays at the last release

    def __setitem__(self, idx, value):
        super().__setitem__(idx, value)
        if idx == 1 and self.capture:  # a Gated DeltaNet single-token step has finished
            self.saved.append(tuple(self.cache))

    def record(self, conv_input: mx.array, states: list[mx.array]) -> None:
        """Store a Gated DeltaNet multi-token forward: conv inputs (B, K-1+S, C) and the state after each of its
        S positions."""
        width = conv_input.shape[1] - len(states)
        self.saved += [(conv_input[:, j + 1:j + 1 + width, :], state) for j, state in enumerate(states)]
        self.cache[0], self.cache[1] = self.saved[-1]

    def replayed(self, n: int, replay) -> None:
        """Store a replaying layer's forward of n positions: replay(m) gives the arrays after its first m."""
        self.saved += [functools.partial(replay, m) for m in range(1, n)] + [tuple(self.cache)]

    def kept(self, i: int) -> tuple:
        """The arrays held after saved position i."""
        if callable(self.saved[i]):
            self.saved[i] = self.saved[i]()
        return self.saved[i]

    def rollback(self, n: int) -> None:
        if n >= len(self.saved):
            raise SpecError(f"cannot roll back {n} positions of a recurrent state that kept {len(self.saved) - 1}")
        self.cache = list(self.kept(-1 - n))
        self.release()

    def release(self) -> None:
        """Forget the kept states; the current one becomes the point to roll back to."""
        self.saved = [tuple(self.cache)]


ROLLBACK_TYPES = (KVCache, QuantizedKVCache, RotatingKVCache, RecurrentCache)


def make_caches(model, slack: int, kv_bits: int | None = None, kv_group_size: int = 64,
                recurrent: bool = False) -> list:
    """The model's own cache layout, with room to roll back `slack` positions; `kv_bits` quantizes full KV;
    `recurrent`: the model's recurrent layers capture per-position states (see models/), so their caches
    become RecurrentCaches."""
    def ours(cache):
        if type(cache) is RotatingKVCache:
            return TreeRotatingKVCache(max_size=cache.max_size + slack, keep=cache.keep)
        if type(cache) is KVCache:
            return QuantizedTreeKVCache(kv_group_size, kv_bits) if kv_bits else TreeKVCache()
        if type(cache) is ArraysCache and recurrent:
            return RecurrentCache(len(cache.cache))
        if type(cache) is CacheList:
            if kv_bits:
                raise SpecError("--kv-bits: the caches of this model's sparse attention (DeepSeek-V3.2 / GLM-5) "
                                "cannot be quantized: drop --kv-bits")
            return CacheList(*map(ours, cache.caches))
        return cache

    return [ours(cache) for cache in make_prompt_cache(model)]


def snapshot(caches: list) -> list:
    """What the caches hold now, apart from them (`restore` puts it back into fresh ones of the same layout):
    nothing is copied, and what they write afterwards leaves it as it is."""
    return [compat.cache_state(cache) for cache in layers_of(caches)]


def restore(caches: list, held: list) -> None:
    """Make fresh caches (`make_caches` of the same model and settings) hold what `snapshot` took."""
    for cache, state in zip(layers_of(caches), held, strict=True):
        compat.set_cache_state(cache, state)
        if isinstance(cache, RecurrentCache):
            cache.release()


def held_positions(caches: list, held: list, n: int, slack: int) -> list:
    """The first `n` positions of a snapshot `held` (of caches like `caches`, fresh ones, which this fills), per
    layer in order: full attention's keys and values (1, H, n, D) (quantized: their parts), a sliding window's of
    its last window + 1 positions (its caches have `slack` slots beyond the window), a recurrent layer's [conv
    window, state]. Only full attention gives fewer positions than the snapshot holds."""
    restore(caches, held)
    layers = []
    for cache in layers_of(caches):
        if isinstance(cache, RecurrentCache):
            layers.append(list(cache.cache))
        elif isinstance(cache, RotatingKVCache):
            layers.append(visible_kv(cache, cache.max_size - slack + 1))
        else:
            layers.append(tree_map(lambda buffer: buffer[..., :n, :], (cache.keys, cache.values)))
    return layers


def snapshot_of(caches: list, layers: list, n: int) -> list:
    """A snapshot (as `snapshot` takes) of caches like `caches` (fresh ones, which this fills) holding `n`
    positions, given per layer as `held_positions` gives them (a sliding window's: its last window + 1 or more)."""
    for cache, layer in zip(layers_of(caches), layers, strict=True):
        if isinstance(cache, RecurrentCache):
            cache.cache = list(layer)
        elif isinstance(cache, RotatingKVCache):  # fewer than it holds: zeros before them, beyond the window
            cache.keys, cache.values = (shifted(part[..., -cache.max_size:, :], min(n, cache.max_size) - part.shape[2])
                                        for part in layer)
            cache.offset = n
            set_write_index(cache, cache.keys.shape[2])
        else:
            (cache.keys, cache.values), cache.offset = layer, n
    return snapshot(caches)


def shifted(buffer: mx.array, pad: int) -> mx.array:
    """`pad` empty columns before `buffer`'s (none for `pad` <= 0)."""
    if pad <= 0:
        return buffer
    return mx.concatenate([mx.zeros((*buffer.shape[:2], pad, buffer.shape[3]), buffer.dtype), buffer], axis=2)


def held_bytes(held) -> int:
    """The bytes of the arrays in `held` (nested lists, tuples and dicts)."""
    return sum(leaf.nbytes for _, leaf in tree_flatten(held) if isinstance(leaf, mx.array))


def unsupported_cache(caches: list) -> str | None:
    """Name of the first cache type that cannot be rolled back, or None."""
    for cache in layers_of(caches):
        if not isinstance(cache, ROLLBACK_TYPES):
            return type(cache).__name__
    return None


def trimmable(caches: list) -> bool:
    """Whether any number of positions can be removed (full KV caches only)."""
    return all(isinstance(cache, (TreeKVCache, QuantizedTreeKVCache)) for cache in layers_of(caches))


def verifies_trees(caches: list, by_levels: bool = False) -> bool:
    """Whether a tree can be verified over these caches in one forward (full and sliding-window KV caches), or,
    `by_levels`, grown over them one level per forward (full KV caches only, not a sparse attention's)."""
    if by_levels:
        return trimmable(caches) and not any(isinstance(cache, CacheList) for cache in caches)
    return all(isinstance(cache, TreeMask) for cache in layers_of(caches))


def keep(caches: list, block: int, kept: list[int]) -> None:
    """Of the last `block` positions, keep those at `kept` (indices into the block, ascending), moved to the
    front of the block in that order; remove the others. Full and sliding-window KV caches only."""
    for cache in layers_of(caches):
        if isinstance(cache, RotatingKVCache):
            _keep_rotating(cache, block, kept)
            continue
        start = cache.offset - block
        if kept != list(range(len(kept))):  # a chain's prefix is already in place
            rows = mx.array([start + i for i in kept])
            for buffers in (cache.keys, cache.values):
                for buffer in buffers if isinstance(buffers, tuple) else (buffers,):  # quantized: data, scales, biases
                    buffer[..., start:start + len(kept), :] = buffer[..., rows, :]
        cache.offset = start + len(kept)


def _keep_rotating(cache: RotatingKVCache, block: int, kept: list[int]) -> None:
    """`keep` on a sliding-window cache: a kept prefix is a rollback; anything else followed a multi-token
    update, which leaves the buffer in temporal order with the block at its end (`_rollback_rotating`)."""
    if kept == list(range(len(kept))):
        if block > len(kept):
            _rollback_rotating(cache, block - len(kept))
        return
    if write_index(cache) != cache.keys.shape[2]:
        raise compat.broken("RotatingKVCache's multi-token update (no longer leaves the keys in temporal order)")
    start = cache.keys.shape[2] - block
    rows = mx.array([start + i for i in kept])
    end = start + len(kept)
    cache.keys = mx.concatenate([cache.keys[..., :start, :], cache.keys[..., rows, :]], axis=2)
    cache.values = mx.concatenate([cache.values[..., :start, :], cache.values[..., rows, :]], axis=2)
    set_write_index(cache, end)
    cache.offset += len(kept) - block


def rollback(caches: list, n: int, slack: int) -> None:
    """Remove the last `n` positions from every layer's cache, exactly (n = 0 releases captured states)."""
    if n > slack:
        raise SpecError(f"cannot roll back {n} positions, at most {slack}: lower the draft length")
    for cache in layers_of(caches):
        if isinstance(cache, RecurrentCache):
            cache.rollback(n)
        elif n == 0:
            continue
        elif isinstance(cache, RotatingKVCache):
            _rollback_rotating(cache, n)
        elif isinstance(cache, (KVCache, QuantizedKVCache)):
            if cache.trim(n) != n:
                raise SpecError(f"cache holds {cache.offset} positions, cannot roll back {n}")
        else:
            raise SpecError(f"cannot roll back a {type(cache).__name__} cache; run without a drafter")


def _rollback_rotating(cache: RotatingKVCache, n: int) -> None:
    length, index = cache.keys.shape[2], write_index(cache)
    if index == length and length > cache.max_size:
        # After a multi-token update the buffer is in temporal order and holds max_size - 1 + S keys:
        # drop the newest n (a view, no copy).
        cache.keys = cache.keys[..., : length - n, :]
        cache.values = cache.values[..., : length - n, :]
        set_write_index(cache, length - n)
    else:
        # Ring buffer: step the write index back. The stale slots are older than the window as seen
        # from the next query, so the mask excludes them until they are overwritten.
        rotated = cache.offset > index
        index -= n
        if rotated and index < cache.keep:
            index += cache.max_size - cache.keep
        set_write_index(cache, index)
    cache.offset -= n


def visible_kv(cache, window: int | None = None) -> tuple[mx.array, mx.array]:
    """(keys, values) of the last `window` cached positions (all when None), oldest first, whatever state a
    sliding-window ring buffer is in after wraps and rollbacks: what another model may attend to.

    `window` must not exceed what the buffer still holds. After any forward (a prefill chunk included) a ring
    of `max_size` slots holds the last min(offset, max_size) positions or more; rolling back positions of a
    multi-token forward (the engine's rounds) leaves at least max_size - 1; only a rollback of n positions
    written one token at a time leaves fewer (max_size - n). The target's sliding caches have MAX_DRAFT_LEN + 1
    slots beyond the model's window, so its window + 1 last positions are always there."""
    if isinstance(cache, QuantizedKVCache):
        raise SpecError("a drafter that reads the target's K/V needs a float cache: run without --kv-bits")
    n = cache.offset if window is None else min(window, cache.offset)
    if isinstance(cache, RotatingKVCache):
        end = write_index(cache)  # the next write slot; the newest key sits just before it
        if end >= n:
            return cache.keys[..., end - n:end, :], cache.values[..., end - n:end, :]
        start = cache.keys.shape[2] - (n - end)  # wrapped: the older part is at the end of the ring
        return (mx.concatenate([cache.keys[..., start:, :], cache.keys[..., :end, :]], axis=2),
                mx.concatenate([cache.values[..., start:, :], cache.values[..., :end, :]], axis=2))
    return cache.keys[..., cache.offset - n:cache.offset, :], cache.values[..., cache.offset - n:cache.offset, :]


@functools.cache
def check_trees() -> None:
    """Token-tree verification's reliance points on mlx-lm (see compat), on tiny inputs: rotary embeddings at
    arbitrary positions, and masks asked of the cache."""
    holder = nn.Module()
    holder.rope = nn.RoPE(8)
    compat.positioned_ropes(holder)
    x = mx.random.normal((1, 2, 3, 8), key=mx.random.key(0))
    with positions(mx.array([5, 6, 6])):
        tree = holder.rope(x, offset=5)
    if not (mx.allclose(tree[:, :, :2], holder.rope(x[:, :, :2], offset=5))
            and mx.allclose(tree[:, :, 2:], holder.rope(x[:, :, 2:], offset=6))):
        raise compat.broken("rotary embeddings (mx.fast.rope no longer takes an offset per batch row)")
    with positions(mx.array([[5, 6, 6], [2, 3, 4]])):
        rows = holder.rope(mx.concatenate([x, x]), offset=0)
    if not (mx.allclose(rows[:1], tree) and mx.allclose(rows[1:], holder.rope(x, offset=2))):
        raise compat.broken("rotary embeddings at each batch row's own positions (mx.fast.rope's offset per row)")
    cache = TreeKVCache()
    cache.attend = mx.array([[True, False], [False, True]])
    mask = create_attention_mask(mx.zeros((1, 2, 4)), cache)
    if not (isinstance(mask, mx.array) and mask.tolist() == [[True, False], [False, True]]):
        raise compat.broken("attention masks (create_attention_mask no longer asks the cache's make_mask)")
