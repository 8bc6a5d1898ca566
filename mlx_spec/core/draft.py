"""The value a drafter hands to the verifier: a chain of tokens, or a token tree."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np


@dataclass
class Draft:
    """Proposed continuation: `tokens` (k,) and the distributions `q` (k, V) they were drawn from (None for
    deterministic drafters, whose q is one-hot).

    A tree also has `parents`: node i continues node parents[i] (< i; -1: the round's last token), nodes in
    order of depth. Siblings are tried in order; a tree is verified with one-hot q. A chain is the tree
    parents = [-1, 0, 1, ...] and keeps `parents` None. A tree may hold nodes that are run through the target
    only for what it predicts there, never accepted (lookahead's branch): `candidates` marks the others."""

    tokens: mx.array
    q: mx.array | None = None
    parents: list[int] | None = None
    candidates: list[bool] | None = None  # per node, whether it may be accepted (None: every node)
    depth: int | None = None  # the draft length the round counts as (None: the tree's depth)
    ends: list[int] | None = None  # `from_paths`: the node each path ends at (-1: an empty path)
    confidence: mx.array | None = None  # a chain's: the drafter's estimate of each position's acceptance (k,)

    @classmethod
    def empty(cls) -> "Draft":
        return cls(mx.zeros((0,), dtype=mx.int32))

    def first(self, k: int) -> "Draft":
        """A chain's first k drafts."""
        return Draft(self.tokens[:k], None if self.q is None else self.q[:k],
                     confidence=None if self.confidence is None else self.confidence[:k])

    def then(self, tokens: list[int]) -> "Draft":
        """A chain with deterministic drafts `tokens` (one-hot q) after it."""
        if not tokens:
            return self
        extra = mx.array(tokens, dtype=mx.int32)
        q = self.q if self.q is None else mx.concatenate(
            [self.q, (mx.arange(self.q.shape[-1])[None] == extra[:, None]).astype(self.q.dtype)])
        return Draft(mx.concatenate([self.tokens, extra]), q)

    @classmethod
    def from_paths(cls, paths: list[list[int]], tree: bool = False) -> "Draft":
        """The tree (a trie) holding each of `paths`, shared prefixes merged, siblings in order of first
        appearance; a chain when the paths are prefixes of one another, unless `tree`."""
        node_of: dict[tuple[int, ...], int] = {(): -1}
        tokens, parents = [], []
        for depth in range(max((len(path) for path in paths), default=0)):  # level by level: in order of depth
            for path in paths:
                prefix = tuple(path[:depth + 1])
                if len(prefix) == depth + 1 and prefix not in node_of:
                    node_of[prefix] = len(tokens)
                    tokens.append(prefix[-1])
                    parents.append(node_of[prefix[:-1]])
        ends = [node_of[tuple(path)] for path in paths]
        chain = parents == list(range(-1, len(parents) - 1))
        return cls(mx.array(tokens, dtype=mx.int32), parents=None if chain and not tree else parents, ends=ends)

    def depths(self) -> list[int]:
        """Depth of each node, the first draft position being depth 1."""
        depth: list[int] = []
        for parent in self.parents:
            depth.append(1 + (depth[parent] if parent >= 0 else 0))
        return depth

    def attention(self) -> np.ndarray:
        """(k + 1, k + 1) bool over [last, *nodes]: each sees itself and its ancestors."""
        k = len(self.parents)
        sees = np.eye(k + 1, dtype=bool)
        sees[:, 0] = True
        for i, parent in enumerate(self.parents):
            sees[i + 1] |= sees[parent + 1]
        return sees

    def prefixes(self) -> list[list[int]]:
        """The tokens each verified row of a tree comes after: [] for the root, then each node's path."""
        tokens = self.tokens.tolist()
        return [[]] + [[tokens[a] for a in self.ancestors(node)] for node in range(len(tokens))]

    def ancestors(self, node: int) -> list[int]:
        """The nodes from depth 1 down to `node` (inclusive)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]
