"""Recurrent layers of every family made to roll back: mlx-lm's layers that keep an `ArraysCache` (Mamba 2, gated
linear attention, Kimi and Ling delta attention, Gated DeltaNet ...).

Qwen3.5's Gated DeltaNet layers compute the state after each position of a multi-token forward as they go
(`qwen3_5.install`). Any other recurrent layer is made a replaying one: called with several positions while its
cache captures, it runs mlx-lm's own code once and leaves with its cache what it held before and its input; the
arrays after an earlier position are then the same call replayed over the inputs up to it, computed only when a
rollback keeps that position (`caches.RecurrentCache.kept`). A round whose drafts are all accepted replays
nothing; one that rejects some replays each recurrent layer alone (not the rest of the model) over the kept inputs.
"""

from __future__ import annotations

import functools
import inspect

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import nemotron_h
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from ..seams import compat
from ..seams.caches import RecurrentCache, layers_of
from . import qwen3_5


def install(model) -> bool:
    """Make every recurrent layer of `model` keep what a rollback needs (in place); True if it has any."""
    if qwen3_5.install(model):
        return True
    if not any(type(cache) is ArraysCache for cache in layers_of(make_prompt_cache(model))):
        return False
    check_replay()
    for module in mixers(model):
        if not isinstance(module, Replaying):
            compat.swap_class(module, replaying(type(module)))
    return True


def takes_cache(module: nn.Module) -> bool:
    return isinstance(module, Replaying) or called_with_cache(type(module))


@functools.cache
def called_with_cache(cls: type) -> bool:
    return "cache" in inspect.signature(cls.__call__).parameters


def mixers(model) -> list[nn.Module]:
    """The innermost modules that are handed a cache: a layer's attention or recurrence, not the layer holding it."""
    holders = [module for _, module in model.named_modules() if takes_cache(module)]
    return [holder for holder in holders
            if not any(takes_cache(module) for _, module in holder.named_modules() if module is not holder)]


class Replaying:
    """Mixed into an mlx-lm layer class that is handed a cache: unchanged, but for a forward through a capturing
    `RecurrentCache`, which it leaves able to recompute the arrays after each of the forward's positions."""

    def __call__(self, x, *args, **kwargs):
        cache_at, mask_at = PLACES[type(self)]
        cache = args[cache_at] if cache_at < len(args) else kwargs.get("cache")
        if not (isinstance(cache, RecurrentCache) and cache.capture):
            return super().__call__(x, *args, **kwargs)
        mask = args[mask_at] if mask_at is not None and mask_at < len(args) else kwargs.get("mask")
        if mask is not None:  # a left-padded batch of mlx-lm's own: never one of mlx-spec's
            raise compat.broken(f"{type(self).__name__} (a recurrent layer handed a mask, which mlx-spec cannot "
                                "replay)")
        call, before = super().__call__, tuple(cache.cache)

        def replay(m: int) -> tuple:
            held = ArraysCache(len(before))
            held.cache = list(before)
            given, named = with_cache(args, kwargs, cache_at, held)
            call(x[:, :m], *given, **named)
            return tuple(held.cache)

        cache.capture = False  # mlx-lm's layer stores its arrays as it likes: what is kept is recorded here
        try:
            out = call(x, *args, **kwargs)
        finally:
            cache.capture = True
        cache.replayed(x.shape[1], replay)
        return out


def with_cache(args: tuple, kwargs: dict, cache_at: int, cache) -> tuple:
    """(args, kwargs) with `cache` in the cache's place."""
    if cache_at < len(args):
        return (*args[:cache_at], cache, *args[cache_at + 1:]), kwargs
    return args, {**kwargs, "cache": cache}


PLACES: dict[type, tuple[int, int | None]] = {}  # a replaying class -> where its call takes the cache and mask
_CLASSES: dict[type, type] = {}


def replaying(cls: type) -> type:
    """`cls` with `Replaying` mixed in (one class per layer class)."""
    if cls not in _CLASSES:
        params = list(inspect.signature(cls.__call__).parameters)[2:]  # after self and the input
        _CLASSES[cls] = type(f"Replaying{cls.__name__}", (Replaying, cls), {})
        PLACES[_CLASSES[cls]] = params.index("cache"), params.index("mask") if "mask" in params else None
    return _CLASSES[cls]


@functools.cache
def check_replay() -> None:
    """A tiny Mamba 2 layer of mlx-lm's, made replaying inside its block and rolled back by two of four positions,
    holds what mlx-lm's own layer holds after the first two alone: the layer keeps everything it goes on from in
    its cache, and takes it where `replaying` looks for it."""
    args = nemotron_h.ModelArgs.from_dict(dict(
        model_type="nemotron_h", vocab_size=8, hidden_size=16, intermediate_size=16, max_position_embeddings=64,
        num_attention_heads=2, num_key_value_heads=1, attention_bias=False, mamba_num_heads=4, mamba_head_dim=4,
        mamba_proj_bias=False, ssm_state_size=4, conv_kernel=3, n_groups=1, mlp_bias=False, layer_norm_epsilon=1e-5,
        use_bias=False, use_conv_bias=True, hybrid_override_pattern=["M"]))
    block, x = nemotron_h.NemotronHBlock(args, "M"), mx.random.normal((1, 4, 16), key=mx.random.key(0))
    alone = ArraysCache(2)
    block(x[:, :2], None, alone)
    found = mixers(block)
    if found != [block.mixer]:
        raise compat.broken("where a Mamba 2 block hands its cache (to its mixer alone)")
    compat.swap_class(block.mixer, replaying(type(block.mixer)))
    cache = RecurrentCache(2)
    cache.capture = True
    block(x, None, cache)
    cache.rollback(2)
    if not all(mx.allclose(a, b, atol=1e-5) for a, b in zip(cache.cache, alone.cache, strict=True)):
        raise compat.broken("a recurrent layer's call (its state no longer all in its cache, or not taken from it)")
