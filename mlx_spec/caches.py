"""Rollback of every cache type in one place.

A speculative round appends `1 + draft_len` positions to the target's cache and then removes the rejected
ones. mlx-lm's own `trim` is exact for `KVCache` and `QuantizedKVCache`, but a sliding-window
`RotatingKVCache` that has wrapped overwrote the keys it would need, and mlx-lm then trims nothing. Here each
sliding-window cache is made `slack` slots larger than its window (attention still sees exactly the window:
the models pass `window_size` to the mask), so the last `slack` positions can always be undone exactly.
"""

from __future__ import annotations

from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

from .errors import SpecError

ROLLBACK_TYPES = (KVCache, QuantizedKVCache, RotatingKVCache)


def make_caches(model, slack: int, kv_bits: int | None = None, kv_group_size: int = 64) -> list:
    """The model's own cache layout, with room to roll back `slack` positions; `kv_bits` quantizes full KV."""
    caches = []
    for cache in make_prompt_cache(model):
        if type(cache) is RotatingKVCache:
            cache = RotatingKVCache(max_size=cache.max_size + slack, keep=cache.keep)
        elif type(cache) is KVCache and kv_bits:
            cache = cache.to_quantized(group_size=kv_group_size, bits=kv_bits)
        caches.append(cache)
    return caches


def unsupported_cache(caches: list) -> str | None:
    """Name of the first cache type that cannot be rolled back, or None."""
    for cache in caches:
        if not isinstance(cache, ROLLBACK_TYPES):
            return type(cache).__name__
    return None


def rollback(caches: list, n: int, slack: int) -> None:
    """Remove the last `n` positions from every layer's cache, exactly."""
    if n == 0:
        return
    if n > slack:
        raise SpecError(f"cannot roll back {n} positions, at most {slack}: lower the draft length")
    for cache in caches:
        if isinstance(cache, RotatingKVCache):
            _rollback_rotating(cache, n)
        elif isinstance(cache, (KVCache, QuantizedKVCache)):
            if cache.trim(n) != n:
                raise SpecError(f"cache holds {cache.offset} positions, cannot roll back {n}")
        else:
            raise SpecError(f"cannot roll back a {type(cache).__name__} cache; run without a drafter")


def _rollback_rotating(cache: RotatingKVCache, n: int) -> None:
    length = cache.keys.shape[2]
    if cache._idx == length and length > cache.max_size:
        # After a multi-token update the buffer is in temporal order and holds max_size - 1 + S keys:
        # drop the newest n (a view, no copy).
        cache.keys = cache.keys[..., : length - n, :]
        cache.values = cache.values[..., : length - n, :]
        cache._idx = length - n
    else:
        # Ring buffer: step the write index back. The stale slots are older than the window as seen
        # from the next query, so the mask excludes them until they are overwritten.
        rotated = cache.offset > cache._idx
        cache._idx -= n
        if rotated and cache._idx < cache.keep:
            cache._idx += cache.max_size - cache.keep
    cache.offset -= n
