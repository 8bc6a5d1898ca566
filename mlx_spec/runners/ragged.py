"""The KV caches of a batch of sequences that each keep their own length: what batched speculation runs on.

All rows of a batch are written at the same columns, one forward at a time, but each row has its own positions
(`offsets`: its rotary embeddings place its tokens where decoding it alone would) and its own valid columns: a
round gives every row `1 + max draft length` columns, and the columns of a row's rejected drafts (and of the
padding after a shorter draft) are masked out for good, while columns that every row rejected are written over
by the next forward. Holes are squeezed out when the buffers would otherwise grow, and when one row is left
(`compact`): a lone row without holes runs under mlx-lm's own masks for one sequence (`lone_mask`). Rows leave
(`select`) and join (`join`, after their prompt ran in a batch of their own) between forwards.

Sliding-window layers hold only the columns from their window's `starts` on: once they hold twice what their rows
still need (each row's last window + 1 positions), they drop the columns before that (`_slide`), so a long
context costs them a window, not its length. The mask they ask for (`window_size`, else their own) hides, per
row, what lies beyond the window of each query's own position.

Recurrent layers (Qwen3.5 / 3.6's Gated DeltaNet, Mamba 2, linear attention: models/recurrence.py) keep one
recurrent state per row (`caches.RecurrentCache`): while a round is marked they keep the state after every input,
each row knows which kept state follows each of its real inputs, and `keep` gives each row the state after its last
kept input. Padding runs through the recurrence only after a row's real inputs; before the next forward of the round
each row is set back to the state after its last real input. Other cache types: `RaggedBatch.problem` says why they
cannot be batched.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten
from mlx_lm.models import gemma3_text, llama
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from ..models import recurrence
from ..seams import compat
from ..seams.caches import RecurrentCache, check_trees, layers_of, shifted
from .ragged_kv import STEP, RaggedKVCache, parts_of
from .target import hidden_from, next_piece
from .vision import Images


class RaggedBatch:
    """A batch of rows over one model's layers: after `mark`, `forward`s run (B, n) blocks of inputs, then
    `keep` says how many of each row's inputs stay in the cache."""

    def __init__(self, model, rows: int = 0, kv_bits: int | None = None, kv_group_size: int = 64):
        """An empty cache for `rows` rows; `kv_bits`: full-attention keys and values quantized (as `--kv-bits`
        quantizes them alone; sliding-window layers stay float)."""
        self.model = model
        recurrence.install(model)  # recurrent layers that can be rolled back (no-op for other models)
        def ours(cache):
            if isinstance(cache, ArraysCache):
                return RecurrentCache(len(cache.cache))
            if isinstance(cache, CacheList):  # a sparse attention's keys and values, its indexer's keys
                return CacheList(*(RaggedKVCache(self) for _ in cache.caches))
            if type(cache) is RotatingKVCache and not cache.keep:
                return RaggedKVCache(self, window=cache.max_size)
            return RaggedKVCache(self, kv_bits if type(cache) is KVCache else None, kv_group_size)

        self.caches = [ours(cache) for cache in make_prompt_cache(model)]  # as the model takes them
        self.layers = layers_of(self.caches)  # each holding its own keys and values, or states
        self.windows = sorted({c.window for c in self.layers if isinstance(c, RaggedKVCache) and c.window})
        self.starts: dict[int, int] = {}  # per sliding window: the first column its layers hold (else 0)
        self.recurrent = [c for c in self.layers if isinstance(c, RecurrentCache)]
        self.states = None  # while a round is marked, per row: the recurrent state (saved index) after each input
        self.columns = 0  # columns written (valid or not)
        self.capacity = 0  # columns the buffers hold
        self.valid = np.zeros((rows, 0), dtype=bool)  # (B, columns): a row holds its valid columns' positions
        self.positions = self.mask = self.seen = None  # set around a forward
        self.lone = False  # during a forward: one row, all its columns its own, a chain (no mask of ours: `lone_mask`)
        self.depths = None  # during a forward: (B, n) each input's position past the last its row holds
        self.hidden: list[mx.array] = []  # what `extend` read of the hidden states, when asked
        self.marked = None  # the columns written when the round began (`mark`)

    @property
    def offsets(self) -> np.ndarray:
        """(B,) the positions each row holds."""
        return self.valid.sum(axis=1)

    @classmethod
    def prefilled(cls, model, prompts: list[list[int]], **kv) -> "RaggedBatch":
        """A batch of one row per prompt, holding it (prompts before they join a batch): all rows run together, a
        piece (`next_piece`) at a time, each row's padding after its prompt (a hole), so several rows
        only where no layer is recurrent (padding would run through its state). `kv`: as the constructor's."""
        batch = cls(model, rows=len(prompts), **kv)
        assert len(prompts) == 1 or not batch.recurrent, "a recurrent layer's rows are prefilled one at a time"
        longest, start = max(map(len, prompts)), 0
        while start < longest:
            end = next_piece(start, longest, longest)
            pieces = [prompt[start:end] for prompt in prompts]
            tokens = np.zeros((len(prompts), end - start), dtype=np.int32)
            for row, piece in enumerate(pieces):
                tokens[row, :len(piece)] = piece
            batch.forward(mx.array(tokens), [len(piece) for piece in pieces])
            mx.eval([c.state for c in batch.layers])
            start = end
        return batch

    @classmethod
    def holding(cls, model, layers: list, n: int, **kv) -> "RaggedBatch":
        """A one-row batch holding `n` positions given per layer as `row_positions` gives them (a sliding window's
        layer may give only its last ones: it holds those). `kv`: as the constructor's."""
        batch = cls(model, rows=1, **kv)
        for cache, layer in zip(batch.layers, layers, strict=True):
            if isinstance(cache, RecurrentCache):
                cache.cache = list(layer)
                cache.release()
            elif cache.window:
                given = n - parts_of(layer[0])[0].shape[2]
                batch.starts[cache.window] = min(batch.starts.get(cache.window, given), given)
        for cache, layer in zip(batch.layers, layers):  # a window's layers from their common first column
            if isinstance(cache, RaggedKVCache):
                cache.keys, cache.values = tree_map(lambda part: shifted(part, n - cache.first - part.shape[2]),
                                                    tuple(layer))
        batch.valid, batch.columns, batch.capacity = np.ones((1, n), dtype=bool), n, n
        return batch

    def row_positions(self, row: int) -> list:
        """What row `row` holds, per layer: an attention layer's keys and values (1, H, n, D) at its n positions
        (quantized: their parts; a sliding window's: those it holds, its last ones), a recurrent layer's [conv
        window, state]. A lone row without holes gives views of the buffers (a prompt cache keeps them as they are,
        as `Target.snapshot` keeps a cache's); other rows' are gathered (a copy)."""
        def held(cache: RaggedKVCache):
            valid = self.valid[row, cache.first:self.columns]
            if self.size == 1 and valid.all():  # a lone row without holes: its columns as they are, not copied
                return tree_map(lambda buffer: buffer[..., :len(valid), :], (cache.keys, cache.values))
            columns = mx.array(np.flatnonzero(valid))
            return tree_map(lambda buffer: mx.take(buffer[row:row + 1], columns, axis=2), (cache.keys, cache.values))
        return [[part[row:row + 1] for part in cache.cache] if isinstance(cache, RecurrentCache) else held(cache)
                for cache in self.layers]

    def extend(self, tokens: list[int], read_hidden=None, hidden_tail: int | None = None,
               images: Images | None = None, absorb: Callable[[int, mx.array], None] | None = None) -> bool:
        """Run the next piece (`target.next_piece`) of `tokens` that this one-row batch does not hold yet; whether
        it now holds them all (a prompt prefilled a piece at a time). `read_hidden` (see `target.hidden_reader`):
        the hidden states of the last `hidden_tail` tokens (None: all) are appended to `hidden`, (n, H) a piece,
        or with `absorb` go to `absorb(first position, states)` as each piece runs (never all held at once).
        `images`: the prompt's (runners/vision.py), at their embeddings and positions, as `Target.prefill` runs
        them."""
        done = int(self.offsets[0])
        tail = hidden_from(0, len(tokens), hidden_tail if read_hidden else 0)
        end = next_piece(done, len(tokens), tail)
        if done < len(tokens):
            if images is None:
                self.forward(mx.array(tokens[done:end], dtype=mx.int32)[None], [end - done])
            else:
                end = images.piece_end(done, end)
                piece = mx.array(tokens[done:end], dtype=mx.int32)
                with images.placed(self.model, piece, done) as (ids, embeddings):
                    seen = images.seen(done, end)
                    self.forward(ids[None], [end - done], embeddings=embeddings[None],
                                 seen=None if seen is None else seen[None])
            self.hidden += [read_hidden()[0][max(tail - done, 0):]] if read_hidden and end > tail else []
            mx.eval([c.state for c in self.layers], self.hidden[-1:])
            if absorb and self.hidden:
                absorb(max(done, tail), self.hidden.pop())
        return end >= len(tokens)

    @staticmethod
    def problem(model) -> str | None:
        """Why this model's caches cannot be batched here (None when they can)."""
        kinds = {type(c).__name__ for c in layers_of(make_prompt_cache(model))
                 if type(c) not in (KVCache, RotatingKVCache, ArraysCache)}  # recurrent layers: `recurrence`
        return f"its {', '.join(sorted(kinds))} caches are not batched yet" if kinds else None

    @staticmethod
    def tree_problem(model) -> str | None:
        """Why this model's batch rows cannot verify token trees, said after the model's name ("has ..."); None
        when they can (its rotary embeddings then take each row's own positions)."""
        caches = layers_of(make_prompt_cache(model))
        if any(isinstance(c, ArraysCache) for c in caches):
            return "has recurrent layers, which keep one sequence, not the branches of a tree"
        check_trees()
        if compat.positioned_ropes(model) != len(caches):
            return "has attention layers without a rotary embedding of their own that mlx-spec can place"
        return None

    @property
    def size(self) -> int:
        return self.valid.shape[0]

    def mark(self) -> None:
        """Start a round: `keep` then says what stays of every forward since."""
        self.marked = self.columns
        for cache in self.recurrent:
            cache.release()
            cache.capture = True
        self.states = [[0] for _ in range(self.size)] if self.recurrent else None

    def forward(self, tokens: mx.array, lengths: list[int], trees: list | None = None,
                embeddings: mx.array | None = None, seen: np.ndarray | None = None) -> mx.array:
        """Run `tokens` (B, n) after what each row holds (or inputs (B, n, D) of a model that takes vectors): row
        i's first `lengths[i]` inputs are real, the rest padding (never seen by real inputs, masked out after).
        `trees`: per row None (a chain) or (attend, depths): its inputs are a token tree, each seeing what
        `attend` (lengths[i], lengths[i]) says among them, at its position's `depths` past the last it holds
        (`tree_problem` None). `embeddings` (B, n, H): the tokens' input embeddings, given (a prompt's images);
        `seen` (B, n, n): which inputs each also sees, later ones too, whatever its window (an image read whole).
        Returns the model's output, logits (B, n, V); lazy."""
        b, n = tokens.shape[:2]
        if self.states is not None:
            self._resume_recurrent()
        if self.windows and (self.marked is None or self.marked == self.columns):  # nothing of a round written
            self._slide()
        if self.columns + n > self.capacity:
            self._make_room(n)
        self.depths = np.tile(np.arange(n), (b, 1))  # of each input past its row's last held position
        trees = trees if trees and any(tree is not None for tree in trees) else None
        self.lone = b == 1 and trees is None and seen is None and bool(self.valid[0, :self.columns].all())
        if not self.lone:
            mask = np.zeros((b, 1, n, self.columns + n), dtype=bool)
            mask[:, 0, :, :self.columns] = self.valid[:, None, :self.columns]
            mask[:, 0, :, self.columns:] = np.tril(np.ones((n, n), dtype=bool))
            for row, tree in enumerate(trees or []):
                if tree is not None:
                    attend, depths = tree
                    mask[row, 0, :len(depths), self.columns:self.columns + len(depths)] = attend
                    self.depths[row, :len(depths)] = depths
            if seen is not None:
                mask[:, 0, :, self.columns:] |= seen
            self.mask = mx.array(mask)
        self.positions = mx.array(self.offsets.astype(np.int32))
        self._windows, self.seen = {}, seen
        placed = compat.positions(mx.array(self.offsets[:, None] + self.depths, dtype=mx.int32)) if trees \
            else contextlib.nullcontext()
        try:
            with placed:
                logits = self.model(tokens, cache=self.caches, **({} if embeddings is None else
                                                                  {"input_embeddings": embeddings}))
        finally:
            self.mask = self.positions = self._windows = self.seen = None
            self.lone = False
        if self.states is not None:
            base = len(self.recurrent[0].saved) - 1 - n
            for row, length in enumerate(lengths):
                self.states[row] += range(base + 1, base + 1 + length)
        grown = np.zeros((b, self.columns + n), dtype=bool)
        grown[:, :self.columns] = self.valid[:, :self.columns]
        grown[:, self.columns:] = np.arange(n)[None, :] < np.array(lengths)[:, None]
        self.valid, self.columns = grown, self.columns + n
        return logits

    def column_positions(self) -> np.ndarray:
        """(B, columns): the position of each row's entry in each column (meaningful where it is valid)."""
        return np.cumsum(self.valid[:, :self.columns], axis=1) - 1

    def window_mask(self, window: int, first: int = 0) -> mx.array:
        """The forward's mask for a sliding-window layer holding the columns from `first` on: also hidden, per
        row, the columns at or beyond `window` positions before each query's own."""
        if (window, first) not in self._windows:
            n, held = self.mask.shape[2], self.columns - first
            positions = self.column_positions()[:, first:]
            queries = self.offsets[:, None] + self.depths  # (B, n)
            recent = np.ones((self.size, n, held + n), dtype=bool)
            recent[:, :, :held] = queries[:, :, None] - positions[:, None, :] < window
            recent[:, :, held:] = self.depths[:, :, None] - self.depths[:, None, :] < window
            if self.seen is not None:
                recent[:, :, held:] |= self.seen
            self._windows[window, first] = self.mask[..., first:] & mx.array(recent[:, None])
        return self._windows[window, first]

    def _slide(self) -> None:
        """Sliding-window layers holding twice what their rows' next queries may see (each row's last window + 1
        positions) leave the columns before that behind."""
        for window in self.windows:
            first, keep = self.starts.get(window, 0), window + 1
            if self.columns - first <= 2 * keep or not self.size:
                continue
            valid = self.valid[:, first:self.columns]
            needed = valid & (np.cumsum(valid, axis=1) > valid.sum(axis=1)[:, None] - keep)
            drop = int(np.where(needed.any(axis=1), needed.argmax(axis=1), valid.shape[1]).min())
            for cache in self.layers:
                if isinstance(cache, RaggedKVCache) and cache.window == window and cache.keys is not None:
                    cache.keys, cache.values = tree_map(lambda buffer: buffer[..., drop:, :],
                                                        (cache.keys, cache.values))
            self.starts[window] = first + drop

    def keep(self, kept: list[int | list[int]]) -> None:
        """Of the real inputs each row ran since `mark`, row i keeps its first kept[i], or (a tree's) the inputs
        listed in kept[i], in order; the columns every row dropped are written over next. Recurrent layers
        (chains only) take each row's state after its last kept input."""
        if self.states is not None:
            self._set_recurrent([states[count] for states, count in zip(self.states, kept)])
            for cache in self.recurrent:
                cache.release()
                cache.capture = False
            self.states = None
        end = self.marked
        for row, count in enumerate(kept):
            new = np.flatnonzero(self.valid[row, self.marked:]) + self.marked
            if isinstance(count, list):  # a tree's path (its root first): its other inputs go
                self.valid[row, np.setdiff1d(new, new[count])] = False
                end = max(end, new[count[-1]] + 1)
            else:
                self.valid[row, new[count:]] = False
                end = max(end, new[count - 1] + 1 if count else end)
        self.columns, self.marked = end, None
        self.valid = self.valid[:, :end]

    def _set_recurrent(self, saved: list[int]) -> None:
        """Give row i of every recurrent layer the arrays it kept at saved[i]."""
        for cache in self.recurrent:
            kept = [cache.kept(index) for index in saved]
            if len(set(saved)) == 1:
                cache.cache = list(kept[0])
            else:
                cache.cache = [None if parts[0] is None else mx.concatenate([part[row:row + 1] for row, part
                                                                             in enumerate(parts)])
                               for parts in zip(*kept)]

    def _resume_recurrent(self) -> None:
        """Before a forward within a round: a row padded by the last forward goes back to its state after its last
        real input (kept as a state of its own, so that the saved states stay in step with the inputs)."""
        newest = len(self.recurrent[0].saved) - 1
        if all(states[-1] == newest for states in self.states):
            return
        self._set_recurrent([states[-1] for states in self.states])
        for cache in self.recurrent:
            cache.saved.append(tuple(cache.cache))

    def forget(self, row: int) -> None:
        """Row `row` holds nothing from now on: its columns become holes (attention layers only)."""
        assert not self.recurrent, "a recurrent state cannot forget"
        self.valid[row] = False

    def select(self, rows: list[int]) -> None:
        """Keep only `rows` (indices), in that order: finished sequences leave."""
        index = mx.array(rows, dtype=mx.int32)
        for cache in self.layers:
            if isinstance(cache, RecurrentCache):
                cache.filter(index)
                cache.release()
            elif cache.keys is not None:
                cache.keys, cache.values = tree_map(lambda buffer: buffer[index], (cache.keys, cache.values))
        self.valid = self.valid[rows]
        if not rows:  # empty: rows that join start it afresh
            self.columns, self.starts = 0, {}
            self.valid = np.zeros((0, 0), dtype=bool)
        elif len(rows) == 1 and not self.valid[0, :self.columns].all():
            self.compact()  # a row left alone runs without a mask of ours (`lone`)

    def join(self, other: "RaggedBatch") -> None:
        """Append `other`'s rows (a prompt prefilled on its own), right-aligned with this batch's columns."""
        width = max(self.columns, other.columns)
        sides = [(self, width - self.columns), (other, width - other.columns)]
        starts = {}  # per window: the first column either side's rows need
        for mine, theirs in zip(self.layers, other.layers):
            if isinstance(mine, RecurrentCache):
                mine.cache = [_stack_rows(a, self.size, b, other.size) for a, b in zip(mine.cache, theirs.cache)]
                mine.release()
                continue
            if mine.keys is None and theirs.keys is None:
                continue  # nothing cached yet on either side (one-token prompts)
            first = min([cache.first + pad for (batch, pad), cache in zip(sides, (mine, theirs)) if batch.size],
                        default=0)
            stacked = []
            for which in ("keys", "values"):  # of their own widths (MLA's differ)
                parts, like = [], getattr(mine if mine.keys is not None else theirs, which)
                for (batch, pad), cache in zip(sides, (mine, theirs)):
                    buffer = getattr(cache, which)
                    if buffer is None:
                        buffer = tree_map(lambda part: mx.zeros((batch.size, part.shape[1], 0, part.shape[3]),
                                                                part.dtype), like)
                    held, lead = batch.columns - cache.first, cache.first + pad - first
                    parts.append(tree_map(lambda part: shifted(part[..., :held, :], lead), buffer))
                stacked.append(tree_map(lambda a, b: mx.concatenate([a, b], axis=0), *parts))
            mine.keys, mine.values = stacked
            if mine.window:
                starts[mine.window] = first
        self.starts = starts
        self.valid = np.concatenate([np.pad(batch.valid[:, :batch.columns], ((0, 0), (pad, 0)))
                                     for batch, pad in sides])
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
        starts = {window: max(0, width - window - 1) for window in self.windows}  # each row's last window + 1
        gathers = {}  # by the first column a layer holds after and before
        for cache in self.layers:
            if isinstance(cache, RaggedKVCache) and cache.keys is not None:
                first = starts.get(cache.window, 0)
                if (first, cache.first) not in gathers:
                    kept = np.maximum(index[:, first:] - cache.first, 0)
                    gathers[first, cache.first] = mx.array(kept)[:, None, :, None]
                gather = gathers[first, cache.first]
                cache.keys, cache.values = tree_map(lambda buffer: mx.take_along_axis(buffer, gather, axis=2),
                                                    (cache.keys, cache.values))
        self.valid, self.columns, self.capacity, self.starts = valid, width, width, starts


def _stack_rows(mine: mx.array | None, rows: int, theirs: mx.array | None, their_rows: int) -> mx.array | None:
    """Two batches' recurrent arrays, one above the other; a side that has run nothing yet holds zeros (the
    state a Gated DeltaNet layer starts from)."""
    if mine is None and theirs is None:
        return None
    like = mine if mine is not None else theirs
    mine = mine if mine is not None else mx.zeros((rows, *like.shape[1:]), like.dtype)
    theirs = theirs if theirs is not None else mx.zeros((their_rows, *like.shape[1:]), like.dtype)
    return mx.concatenate([mine, theirs])


@functools.cache
def check_batches() -> None:
    """Two rows of different lengths in one RaggedBatch, their prompts prefilled apart or together (padded), and a
    row alone, score their next tokens as the model alone does: a tiny Llama, and a tiny Gemma 3 whose sliding
    window (2) is shorter than the rows."""
    tiny = dict(num_hidden_layers=1, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                rms_norm_eps=1e-6, vocab_size=8)
    if not _rows_match(_drawn(llama.Model(compat.decoder_args("llama", dict(hidden_size=16, **tiny))))):
        raise compat.broken("batched attention (rotary embeddings with one offset per row, or masks from "
                            "cache.make_mask)")
    if not _rows_match(_drawn(llama.Model(compat.decoder_args("llama", dict(hidden_size=64, **tiny)))), kv_bits=8):
        raise compat.broken("quantized attention in batches (a cache with `bits` attended to as a QuantizedKVCache)")
    gemma = _drawn(gemma3_text.Model(gemma3_text.ModelArgs.from_dict(dict(
        model_type="gemma3_text", hidden_size=16, num_hidden_layers=2, intermediate_size=32, num_attention_heads=2,
        head_dim=8, vocab_size=8, query_pre_attn_scalar=8, sliding_window=2, sliding_window_pattern=2))))
    if not _rows_match(gemma):
        raise compat.broken("sliding-window attention in batches (the window no longer passed to cache.make_mask)")


def _drawn(model, seed: int = 0):
    """`model` with its matrices drawn from `seed` rather than MLX's global stream (which the caller's draws move):
    the same tiny model, and the same rounding, at every first use."""
    matrices = [(name, p) for name, p in tree_flatten(model.parameters()) if p.ndim == 2]
    keys = mx.random.split(mx.random.key(seed), len(matrices))
    model.update(tree_unflatten([(name, mx.random.uniform(-1, 1, p.shape, key=key) / p.shape[-1] ** 0.5)
                                 for (name, p), key in zip(matrices, keys)]))
    return model


def _rows_match(model, kv_bits: int | None = None) -> bool:
    kv = {"kv_bits": kv_bits, "kv_group_size": 32}
    rows = [[1, 2, 3, 4, 5], [6, 7]]
    for together in (False, True):  # prompts prefilled one at a time, then together (padded)
        batch = RaggedBatch(model, **kv)
        for prompts in [[tokens[:-1] for tokens in rows]] if together else [[tokens[:-1]] for tokens in rows]:
            batch.join(RaggedBatch.prefilled(model, prompts, **kv))
        batch.mark()
        logits = batch.forward(mx.array([[5, 0], [7, 1]]), [1, 2])
        for row, (tokens, column) in enumerate(zip([[1, 2, 3, 4, 5], [6, 7, 1]], (0, 1))):
            cache = [QuantizedKVCache(32, kv_bits) for _ in model.layers] if kv_bits else make_prompt_cache(model)
            alone = model(mx.array([tokens]), cache=cache)[0, -1]
            if not mx.allclose(logits[row, column], alone, atol=1e-4):
                return False
    lone = RaggedBatch.prefilled(model, [rows[0]], **kv)  # a lone row: mlx-lm's own masks (`lone_mask`)
    lone.mark()
    cache = [QuantizedKVCache(32, kv_bits) for _ in model.layers] if kv_bits else make_prompt_cache(model)
    return mx.allclose(lone.forward(mx.array([[1, 6]]), [2])[0],
                       model(mx.array([rows[0] + [1, 6]]), cache=cache)[0, -2:], atol=1e-4).item()
