"""A batch's context for a drafter that attends to the target's features (a block drafter): each layer's keys and
values of every row, rows side by side in one buffer per layer, with holes.

Slot j of row i holds the position `positions[i, j]`, or is a hole (-1) that no query sees. Every row appends
together, one slice update per layer a round; a row that keeps fewer positions in a round than another leaves
holes. A joining row is aligned to the right, the rows already there padded on the left when it is longer. Holes
are squeezed out when they fill half of the buffer.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

STEP = 256  # the buffer grows by this many slots


class ContextRows:
    def __init__(self):
        self.keys: list[mx.array] = []  # per layer: (B, KV heads, capacity, D), the first `used` slots in use
        self.values: list[mx.array] = []
        self.positions = np.zeros((0, 0), dtype=np.int32)  # (B, used)

    @property
    def used(self) -> int:
        return self.positions.shape[1]

    def holds(self, row: int) -> bool:
        """Whether row `row` has any context."""
        return bool((self.positions[row] >= 0).any())

    def append(self, layers: list[tuple[mx.array, mx.array]], positions: np.ndarray) -> None:
        """Each layer's (keys, values) (B, KV heads, s, D) at `positions` (B, s; -1: a hole), after every row's."""
        s = positions.shape[1]
        if self.used + s > self.keys[0].shape[2]:
            self._make_room(s)
        used = self.used
        for i, (keys, values) in enumerate(layers):
            self.keys[i][..., used:used + s, :] = keys
            self.values[i][..., used:used + s, :] = values
        self.positions = np.concatenate([self.positions, positions.astype(np.int32)], axis=1)

    def add_row(self, layers: list[tuple[mx.array, mx.array]], positions: np.ndarray) -> None:
        """A row joins at the end: each layer's (keys, values) (1, KV heads, L, D) at `positions` (L,)."""
        length, used = len(positions), self.used
        width = max(length, used)

        def padded(part: mx.array, before: int) -> mx.array:
            return mx.pad(part, [(0, 0), (0, 0), (before, 0), (0, 0)]) if before else part

        if not self.positions.shape[0]:
            self.keys, self.values = [padded(k, width - length) for k, _ in layers], \
                [padded(v, width - length) for _, v in layers]
        else:
            self.keys = [mx.concatenate([padded(old[..., :used, :], width - used), padded(k, width - length)])
                         for old, (k, _) in zip(self.keys, layers)]
            self.values = [mx.concatenate([padded(old[..., :used, :], width - used), padded(v, width - length)])
                           for old, (_, v) in zip(self.values, layers)]
        holes = np.full((self.positions.shape[0], width - used), -1, dtype=np.int32)
        row = np.concatenate([np.full(width - length, -1), positions]).astype(np.int32)
        self.positions = np.concatenate([np.concatenate([holes, self.positions], axis=1), row[None]])

    def select(self, rows: list[int]) -> None:
        """Keep the rows at `rows` (indices), in that order; the slots none of them uses go."""
        if not rows:
            self.__init__()
            return
        self.positions = self.positions[rows]
        valid = (self.positions >= 0).any(axis=0)
        first = int(valid.argmax()) if valid.any() else self.used
        index = mx.array(rows)
        self.keys = [k[index][..., first:, :] for k in self.keys]
        self.values = [v[index][..., first:, :] for v in self.values]
        self.positions = self.positions[:, first:]

    def rows(self, rows: list[int]) -> tuple[list[tuple[mx.array, mx.array]], mx.array]:
        """The context of the rows at `rows`: each layer's (keys, values) (R, KV heads, used, D), and positions."""
        used = self.used
        if rows == list(range(self.positions.shape[0])):
            return ([(k[..., :used, :], v[..., :used, :]) for k, v in zip(self.keys, self.values)],
                    mx.array(self.positions))
        index = mx.array(rows)
        return ([(k[index][..., :used, :], v[index][..., :used, :]) for k, v in zip(self.keys, self.values)],
                mx.array(self.positions[rows]))

    def row(self, row: int) -> tuple[list[tuple[mx.array, mx.array]], np.ndarray]:
        """Row `row`'s context without its holes: each layer's (keys, values) (1, KV heads, L, D), and positions."""
        slots = np.flatnonzero(self.positions[row] >= 0)
        index = mx.array(slots)
        return ([(mx.take(k[row:row + 1], index, axis=2), mx.take(v[row:row + 1], index, axis=2))
                 for k, v in zip(self.keys, self.values)], self.positions[row, slots])

    def _make_room(self, s: int) -> None:
        """Room for `s` more slots: the holes squeezed out where they fill half the buffer, else a larger one."""
        valid = self.positions >= 0
        longest = int(valid.sum(axis=1).max())
        used = self.used
        if longest <= used // 2:  # each row's slots in order, aligned right
            order = np.argsort(~valid, axis=1, kind="stable")[:, :longest]  # its valid slots first, in order
            counts = valid.sum(axis=1)
            gather = np.zeros((valid.shape[0], longest), dtype=np.int32)
            positions = np.full_like(gather, -1)
            for i, count in enumerate(counts):
                gather[i, longest - count:] = order[i, :count]
                positions[i, longest - count:] = self.positions[i, order[i, :count]]
            index = mx.array(gather)[:, None, :, None]
            self.keys = [mx.take_along_axis(k, index, axis=2) for k in self.keys]
            self.values = [mx.take_along_axis(v, index, axis=2) for v in self.values]
            self.positions, used = positions, longest
        capacity = -(-(used + s) // STEP) * STEP

        def grown(part: mx.array) -> mx.array:
            return mx.pad(part[..., :used, :], [(0, 0), (0, 0), (0, capacity - used), (0, 0)])

        self.keys, self.values = [grown(k) for k in self.keys], [grown(v) for v in self.values]
