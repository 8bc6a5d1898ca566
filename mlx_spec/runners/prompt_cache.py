"""The prompt cache across conversations: sequences a target ran, kept within a memory budget.

A target's cache holds one sequence, the live one; a prompt that extends it runs only its new tokens. With a
`PromptCache`, a prompt that a stored sequence serves better (a longer prefix the cache can reuse) gets that
one: the live sequence is stored and the stored one restored. Nothing is copied to store or restore (a snapshot
holds the cache's arrays; MLX copies a buffer something else still reads before it writes into it), so a cache
copies its buffers once, at its first write after either. (A batch row's positions are gathered out of the
batch's columns to store, a lone row's taken as they are, and laid into a batch of its own to restore: at most
one copy of that row's cache each.) A live
sequence about to be cut back to a shorter prefix is stored first. Targets whose cache cannot be cut back at all
(recurrent or sliding-window layers) also store each prompt's state once it is prefilled: a conversation's next
turn extends its prompt, though not always the answer as it was generated (a chat template may render it
otherwise).

A drafter with a per-sequence state of its own (a draft model's cache, an MTP layer's or EAGLE-3 head's rows, a
block drafter's context) stores it with the sequence (`hold()`) and takes it back (`resume(held)`) when that
sequence is restored whole; otherwise `resume(None)` makes it start afresh where the target's cache ends. The
least recently used sequences go when the stored ones would take more than the budget.

On distributed ranks every rank keeps the same sequences, each its own slice of them: every decision is taken from
what all ranks agree on (the tokens, whether every rank's cache can be cut back, `Target.trims`, and each entry's
bytes as the largest rank counts them, `PromptCache.agree`).

Rows of a batch (`RowPrefixes`) start from the stored sequence, or the live one, that serves their prompt best,
and store what they hold when they finish (and, for targets that cannot be cut back, their prompt once it is
prefilled). A batch drafter that keeps each row's state (a draft model's cache, a block drafter's context:
`BatchDrafter.row_state`) stores it with the row, and a row served the sequence whole takes it back; other
drafters start from the hidden states the rest of the prompt's prefill gives them, so a row whose drafter reads
every position's (an EAGLE-3 head's) runs its whole prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..seams.caches import held_bytes


@dataclass
class Stored:
    tokens: list[int]  # the positions the target's cache held
    target: list  # its `Target.snapshot()`
    drafter: object  # the drafter whose state `held` is, or None
    held: object  # that drafter's `hold()`
    nbytes: int = 0


class PromptCache:
    """Stored sequences, least recently used first, taking at most `budget` bytes (the live sequence aside).
    Engines on the same target weights may share one (`Engine.with_drafter`): a drafter only takes back a state
    it stored itself."""

    def __init__(self, budget: int):
        self.budget, self.stored = budget, []
        self.agree: Callable[[int], int] | None = None  # an entry's bytes -> the bytes every rank counts it as
        # (distributed ranks, `Lockstep`: the largest rank's, so that all evict the same; None: its own)

    @property
    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self.stored)

    def take(self, target, drafter, tokens: list[int]) -> Stored:
        """What `target`'s cache holds now, the positions of `tokens`, and `drafter`'s state (None: none)."""
        held = drafter.hold() if drafter else None
        return stored(tokens, target.snapshot(), drafter if held is not None else None, held)

    def store(self, entry: Stored, cuttable: bool) -> None:
        """Keep `entry` as the most recently used, dropping the least recently used beyond the budget; `cuttable`:
        the target's cache can be cut back, so a stored prefix of `entry` serves nothing it does not."""
        if self.agree:
            entry.nbytes = self.agree(entry.nbytes)
        self.stored = [old for old in self.stored if old.tokens != entry.tokens
                       and not (cuttable and entry.tokens[:len(old.tokens)] == old.tokens)]
        self.stored.append(entry)
        while self.stored and self.nbytes > self.budget:
            self.stored.pop(0)

    def serving(self, live: list[int], held: int, tokens: list[int], cut: bool,
                limit: int) -> tuple[Stored | None, int]:
        """What serves a prefill of `tokens` best: (a stored sequence, or None: the live one, `live`, of which
        the target's cache holds `held` positions; how many leading positions it serves, `reach`'s), the most
        recently used of equals, the live one first."""
        best, most = None, reach(live, held, tokens, cut, limit)
        for entry in reversed(self.stored):
            if (n := reach(entry.tokens, len(entry.tokens), tokens, cut, limit)) > most:
                best, most = entry, n
        if best is not None:
            self.stored.remove(best)
            self.stored.append(best)
        return best, most

    def switch(self, target, drafter, live: list[int], tokens: list[int]) -> list[int]:
        """Before a prefill of `tokens`: what `target`'s cache will hold (`live`, or a stored sequence that serves
        `tokens` better, restored, with `drafter`'s state as the module says)."""
        best, n = self.serving(live, target.offset, tokens, target.cuttable, len(tokens) - 1)
        live = live[:target.offset]
        if best is None:
            if n < len(live):  # about to be cut back
                self.store(self.take(target, drafter, live), target.cuttable)
            return live
        current = self.take(target, drafter, live) if live else None
        target.restore(best.target, len(best.tokens))
        if drafter:
            drafter.resume(best.held if best.drafter is drafter and n == len(best.tokens) else None)
        if current:
            self.store(current, target.cuttable)
        return best.tokens


def stored(tokens: list[int], target: list, drafter=None, held=None) -> Stored:
    return Stored(list(tokens), target, drafter, held, held_bytes([target, held]))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def reach(known: list[int], held: int, tokens: list[int], cut: bool, limit: int) -> int:
    """How many leading positions of a cache holding `held` positions, the first of them `known`, serve a prefill
    of `tokens`, at most `limit`: their common prefix where the cache can be cut back (`cut`), else all it holds
    or none."""
    n = max(0, min(common_prefix(known[:held], tokens), limit))
    return n if cut or n == held else 0


class RowPrefixes:
    """The prompt cache as a batch's rows use it (`BatchedDecoder`), for an engine's target and its live
    sequence (the tokens its cache holds)."""

    def __init__(self, cache: PromptCache, target, live: list[int], drafter=None):
        """drafter: the engine's, whose state a stored sequence may hold (a batch's draft model takes it back)."""
        self.cache, self.target, self.drafter = cache, target, drafter
        self.live, self.held = live[:target.offset], target.offset

    def find(self, tokens: list[int], tail: int | None) -> tuple[list, int, object] | None:
        """For a row about to prefill `tokens`: (the positions a stored or the live sequence holds of them, per
        layer as `RaggedBatch.holding` takes them, how many, the drafter's state stored with them or None),
        leaving at least one token and the last `tail` (whose hidden states the row's drafter reads; None: all of
        them) to run; None: none serve."""
        if tail is None:
            return None
        best, n = self.cache.serving(self.live, self.held, tokens, self.target.trims, len(tokens) - max(tail, 1))
        if not n:
            return None
        if best is None:  # the live sequence, and the engine's drafter's state, which follows it
            held = self.drafter.hold() if self.drafter else None
            return self.target.held_positions(self.target.snapshot(), n), n, held
        held = best.held if best.drafter is self.drafter else None
        return self.target.held_positions(best.target, n), n, held

    def store(self, tokens: list[int], layers: list, held=None) -> None:
        """Keep what a row holds, the positions of `tokens`, given per layer (`RaggedBatch.row_positions`), and
        what its drafter holds (`held`, in the form the engine's drafter's `hold` gives; None: nothing)."""
        self.cache.store(stored(tokens, self.target.snapshot_of(layers, len(tokens)), held and self.drafter, held),
                         self.target.cuttable)
