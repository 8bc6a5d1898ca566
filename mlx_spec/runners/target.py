"""A language model together with its cache: the target, and also a separate draft model."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import numpy as np

from ..models import recurrence
from ..seams import compat, layout
from ..seams.caches import (
    RecurrentCache,
    check_trees,
    held_positions,
    keep,
    layers_of,
    make_caches,
    restore,
    rollback,
    seeing,
    snapshot,
    snapshot_of,
    tree_forward,
    trimmable,
    unsupported_cache,
    verifies_trees,
)
from ..seams.errors import SpecError
from .prompt_cache import reach
from .vision import Images

MAX_DRAFT_LEN = 32
PREFILL_CHUNK = 512


@dataclass
class Step:
    """What one forward pass over consecutive positions produced."""

    logits: mx.array | None  # (n, V): row j scores the token after input j (None after a prefill)
    hidden: mx.array | None = None  # (n, H): the final hidden state at each input, when a drafter needs it
    start: int = 0  # the position of the first input (a prefill that reused a cached prefix starts later)
    tree_logits: mx.array | None = None  # after `rows`: the logits at every input (a tree's every node)
    absorbed: int = 0  # after a prefill: the positions whose hidden states it handed to `absorb` instead

    def first(self, n: int) -> "Step":
        return Step(None if self.logits is None else self.logits[:n], None if self.hidden is None else self.hidden[:n],
                    self.start, self.tree_logits)

    def rows(self, indices: list[int]) -> "Step":
        """The inputs at `indices` (a tree's accepted path)."""
        index = mx.array(indices)
        return Step(None if self.logits is None else self.logits[index],
                    None if self.hidden is None else self.hidden[index], self.start, self.logits)


def _tapped_norm_call(self, x):
    out = type(self).__bases__[0].__call__(self, x)
    object.__setattr__(self, "tapped", (x, out))  # a plain attribute: nn.Module would make arrays parameters
    return out


def _tapped_layer_call(self, x, *args, **kwargs):
    object.__setattr__(self, "tapped", x)
    return type(self).__bases__[0].__call__(self, x, *args, **kwargs)


def tap(module, call) -> None:
    """Make `module` remember what `call` stores in its `tapped` attribute each time it runs."""
    if not hasattr(type(module), "tapped"):
        compat.swap_class(module, type(f"Tapped{type(module).__name__}", (type(module),),
                                       {"__call__": call, "tapped": None}))


def hidden_reader(model, hidden: str | list[int]):
    """A function returning, after a forward, the hidden states a drafter reads (B, n, H'): "post" / "pre" the
    final norm's output / input, or a list of indices i into the states between layers (Hugging Face's
    `hidden_states`): the input of layer i, the last layer's output for i = the layer count; concatenated."""
    if isinstance(hidden, str):
        norm = layout.final_norm(model)
        tap(norm, _tapped_norm_call)
        return lambda: norm.tapped[1 if hidden == "post" else 0]
    layers, reads = layout.decoder_layers(model), []
    for i in hidden:
        if i == len(layers):
            norm = layout.final_norm(model)
            tap(norm, _tapped_norm_call)
            reads.append(lambda norm=norm: norm.tapped[0])
        else:
            tap(layers[i], _tapped_layer_call)
            reads.append(lambda layer=layers[i]: layer.tapped)
    return lambda: mx.concatenate([read() for read in reads], axis=-1)


def hidden_from(start: int, end: int, tail: int | None) -> int:
    """Where a prefill of positions start..end - 1 reads hidden states from, for the last `tail` (None: all)."""
    return start if tail is None else max(start, end - tail)


class Interrupted(Exception):
    """A prefill stopped between chunks (`Target.prefill`'s `interrupted`)."""


def next_piece(start: int, end: int, tail: int) -> int:
    """Where the prefill piece from `start` ends: PREFILL_CHUNK positions, the hidden-state tail from `tail`
    run apart (the rest runs without the layers only hidden states need: mlx evaluates what the cache needs)."""
    return min(start + PREFILL_CHUNK, tail if start < tail else end)


class Target:
    """`forward` appends positions to the cache; `rollback(n)` removes the last n, whatever the cache types."""

    def __init__(self, model, kv_bits: int | None = None, kv_group_size: int = 64,
                 hidden: str | list[int] | None = None):
        """hidden: what every Step returns as its hidden states (see `hidden_reader`); None: nothing."""
        compat.check()
        self.model = model
        self.kv_bits, self.kv_group_size = kv_bits, kv_group_size
        self.recurrent = recurrence.install(model)
        self.read_hidden = hidden_reader(model, hidden) if hidden else None
        # a prefill returns them for its last `hidden_tail` positions only (None: all), what the drafter reads
        # (its `hidden_tail`): the final norm's make the last layer run in full where they are read
        self.hidden_tail: int | None = None
        self.tree_ready = False  # tree_problem() found none
        self.ranks_trim: bool | None = None  # on distributed ranks: whether every rank's cache can be cut back
        self.reset()

    def reset(self) -> None:
        self.cache = self.blank_caches()
        self.recurrent_caches = [c for c in self.cache if isinstance(c, RecurrentCache)]
        self.offset = 0  # positions in the cache

    def blank_caches(self) -> list:
        return make_caches(self.model, MAX_DRAFT_LEN + 1, self.kv_bits, self.kv_group_size, self.recurrent)

    def held_positions(self, held: list, n: int) -> list:
        """The first n positions of a snapshot, per layer (`caches.held_positions`): what a batch row takes."""
        return held_positions(self.blank_caches(), held, n, MAX_DRAFT_LEN + 1)

    def snapshot_of(self, layers: list, n: int) -> list:
        """A snapshot holding n positions given per layer (`caches.snapshot_of`): what a batch row leaves."""
        return snapshot_of(self.blank_caches(), layers, n)

    def rollback_problem(self) -> str | None:
        """Why this model's cache cannot be rolled back (None when it can)."""
        name = unsupported_cache(self.cache)
        return name and f"its {name} cache cannot be rolled back yet"

    def tree_problem(self, by_levels: bool = False) -> str | None:
        """Why this model cannot verify a token tree in one forward, or, `by_levels`, grow one a level per
        forward (a draft model's trees), said after the model's name ("has ..."); None when it can."""
        if not verifies_trees(self.cache, by_levels):
            if verifies_trees(self.cache):
                return ("has sliding-window or sparse-attention layers, which verify a tree in one forward but cannot "
                        "grow one level by level")
            return "has recurrent layers, which keep one sequence, not the branches of a tree"
        check_trees()
        if compat.positioned_ropes(self.model) != len(layers_of(self.cache)):
            return "has attention layers without a rotary embedding of their own that mlx-spec can place"
        self.tree_ready = True
        return None

    def forward(self, tokens, attend: np.ndarray | None = None, positions: list[int] | None = None,
                embeddings: mx.array | None = None, seen: np.ndarray | None = None) -> Step:
        """Run `tokens` (list or 1-D array) through the model after the cached positions; lazy. `embeddings`
        (n, H): the tokens' input embeddings, given (a prompt's images); `seen` (n, n): which of them each token
        also sees, later ones too (an image read whole: `caches.seeing`).

        A tree (`tree_problem()` None): `attend` (n, m) says which of the last m positions (cached and new)
        each new token sees, besides everything before them; `positions` (n,) are its tokens' positions."""
        tokens = mx.array(tokens, dtype=mx.int32) if isinstance(tokens, list) else tokens
        self.offset += tokens.shape[0]
        if embeddings is not None:
            with seeing(self.cache, seen) if seen is not None else contextlib.nullcontext():
                logits = self.model(tokens[None], cache=self.cache, input_embeddings=embeddings[None])[0]
        elif attend is None:
            logits = self.model(tokens[None], cache=self.cache)[0]
        else:
            if not self.tree_ready and (problem := self.tree_problem()):
                raise SpecError(f"this model cannot verify a token tree: {problem}")
            with tree_forward(self.cache, attend, positions):
                logits = self.model(tokens[None], cache=self.cache)[0]
        return Step(logits, self.read_hidden()[0] if self.read_hidden else None)

    def reusable(self, cached: list[int], tokens: list[int]) -> int:
        """How many leading cached positions (`cached`: what the cache holds, or less when unknown) can stay for
        a prefill of `tokens` (`prompt_cache.reach`), leaving at least one token to run."""
        return reach(cached, self.offset, tokens, self.cuttable, len(tokens) - 1)

    @property
    def trims(self) -> bool:
        """Whether the cache can be cut back to any prefix (full KV only), on every rank where the target is
        sharded (`ranks_trim`, which the ranks agree on)."""
        return trimmable(self.cache) if self.ranks_trim is None else self.ranks_trim

    @property
    def cuttable(self) -> bool:
        """Whether the cache can be cut back to any prefix (`trims`), and not for drafters that read hidden
        states (they would lack those of the cut positions)."""
        return self.trims and self.read_hidden is None

    def snapshot(self) -> list:
        """What the cache holds now (`caches.snapshot`), for `restore`."""
        return snapshot(self.cache)

    def restore(self, held: list, offset: int) -> None:
        """Make the cache hold what `snapshot` took when it held `offset` positions."""
        self.reset()
        restore(self.cache, held)
        self.offset = offset

    def prefill(self, tokens: list[int], cached: list[int] = (), hidden: bool = True,
                interrupted: Callable[[], bool] = lambda: False,
                absorb: Callable[[int, mx.array], None] | None = None, images: Images | None = None,
                keys: list | None = None) -> Step:
        """Process a prompt in chunks, evaluating the cache as it goes; nothing is kept for rollback. The prefix
        it shares with `cached` (what the cache holds now) is reused when the cache allows. Returns the hidden
        states of the last positions it ran (`hidden_tail` of them, or all) when they were asked for and `hidden`,
        no logits; with `absorb` each chunk's go to `absorb(first position, states)` as it runs instead, so a
        long prompt's are never all held at once. `interrupted()` is asked between chunks: when true, the cache
        is emptied and `Interrupted` raised. `images`: the prompt's (runners/vision.py), whose positions it
        prefills at their embeddings and multimodal positions; `keys`: what `tokens` are known by when compared with
        `cached` (`vision.prompt_keys`; None: the tokens)."""
        keep = self.reusable(cached, tokens if keys is None else keys)
        if keep:
            rollback(self.cache, self.offset - keep, self.offset)
            self.offset = keep
        else:
            self.reset()
        for cache in self.recurrent_caches:
            cache.capture = False
        read, states, start, absorbed = self.read_hidden is not None and hidden, [], keep, 0
        tail = hidden_from(keep, len(tokens), self.hidden_tail if read else 0)
        while start < len(tokens):
            if interrupted():
                self.reset()
                raise Interrupted
            end = next_piece(start, len(tokens), tail)
            if images is None:
                step = self.forward(tokens[start:end])
            else:
                end = images.piece_end(start, end)
                step = self.forward_images(tokens, start, end, images)
            states += [step.hidden[max(tail - start, 0):]] if read and end > tail else []
            mx.eval([c.state for c in layers_of(self.cache)], states[-1:])
            if absorb and states:
                absorbed += states[-1].shape[0]
                absorb(max(start, tail), states.pop())
            start = end
        for cache in self.recurrent_caches:
            cache.release()
            cache.capture = True
        return Step(None, mx.concatenate(states) if states else None, keep, absorbed=absorbed)

    def forward_images(self, tokens: list[int], start: int, end: int, images: Images) -> Step:
        """`forward` over prompt positions start..end - 1 of a prompt with images, as the model reads them (see
        runners/vision.py): image tokens at their embeddings, each position at its rotary position."""
        piece = mx.array(tokens[start:end], dtype=mx.int32)
        with images.placed(self.model, piece, start) as (ids, embeddings):
            return self.forward(ids, embeddings=embeddings, seen=images.seen(start, end))

    def keep(self, block: int, kept: list[int]) -> None:
        """Of the last `block` positions keep those at `kept` (ascending indices into the block), in order:
        a tree's accepted path."""
        keep(self.cache, block, kept)
        self.offset += len(kept) - block

    def rollback(self, n: int) -> None:
        """Remove the last n positions (n may be 0: that releases what was kept for a rollback)."""
        rollback(self.cache, n, MAX_DRAFT_LEN + 1)
        self.offset -= n


class OneRow:
    """A round loop's runner for one sequence (`decode.rounds`), over a Target: what `RaggedBatch` is for many
    rows, with the target's own cache layout and nothing ragged (no padding, no mask but a tree's)."""

    def __init__(self, target: Target):
        self.target, self.fed = target, 0  # fed: the inputs of the last forward

    def mark(self) -> None:
        """A round starts: `keep` says what stays of its forward."""

    def forward(self, tokens: mx.array, lengths: list[int], trees: list | None = None) -> mx.array:
        """Run `tokens` (1, n) (a chain, or trees[0] = (attend, depths): a token tree); logits (1, n, V), lazy.
        What recurrent layers kept for a rollback of the forward before goes: that one's verdict is in."""
        for cache in self.target.recurrent_caches:
            cache.release()
        self.fed = tokens.shape[1]
        tree = trees[0] if trees else None
        if tree is None:
            return self.target.forward(tokens[0]).logits[None]
        attend, depths = tree
        return self.target.forward(tokens[0], attend, [self.target.offset + depth for depth in depths]).logits[None]

    def keep(self, kept: list[int | list[int]]) -> None:
        """Of the last forward's inputs keep the first kept[0], or (a tree's path) those listed in kept[0]."""
        if isinstance(kept[0], list):
            self.target.keep(self.fed, kept[0])
        else:
            self.target.rollback(self.fed - kept[0])
