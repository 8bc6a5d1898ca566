"""Suffix decoding (SuffixDecoding, arXiv 2411.04975): drafts from everything the model has read and written
before, in this request and in earlier ones, for agents and repeated work. Free: no model, an index in memory.

The index holds token sequences: every request's prompt and output (a request that extends the previous one,
the next turn of a chat, extends its sequence instead of adding one), the oldest dropped past a budget of
tokens. Each round it finds the longest suffix of the context, up to MAX_MATCH tokens, that occurred before
(looked up by its last KEY tokens, then compared backwards), and counts what followed its occurrences (the
latest OCCURRENCES of them): a trie whose node probabilities are those frequencies, count(child) /
count(parent). It drafts the most probable continuations, best first by cumulative probability and no node
below MIN_PROBABILITY, as a chain (the most frequent path) or a token tree; the draft may grow to about the
match length (`max(1, match)` tokens), so a long match drafts far and a one-token one barely. Drafts are
deterministic, so verification is exact at every temperature; the adaptive policy still turns drafting off
where it loses.

One index serves the whole process (`shared_index`): every request of a server or a batch, every turn of a chat,
every drafter an engine switches to. With a cache file (`--suffix-cache FILE`) it is loaded from there first and
saved there when the process exits: written atomically, and a damaged file is a one-line warning and a fresh
index."""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import zipfile
from collections import Counter, OrderedDict
from heapq import heappop, heappush
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..core.sampling import SamplingParams
from ..runners.target import Step
from .protocol import Draft, Drafter, Kind, RowDrafters

KEY = 3  # the lookup keys: the last 1 .. KEY tokens
MAX_MATCH = 32  # the longest suffix matched
OCCURRENCES = 64  # per key, the latest occurrences kept
MIN_PROBABILITY = 0.1  # a drafted node's least cumulative probability
BUDGET = 1 << 18  # tokens kept by default (the oldest sequences dropped past it)
MAGIC = "mlx-spec suffix cache 1"
MASK = (1 << 32) - 1


class SuffixIndex:
    """Token sequences and, for each of their n-grams of 1 .. KEY tokens, where the latest occurrences end."""

    def __init__(self, budget: int = BUDGET):
        self.budget, self.size, self.next_id = budget, 0, 0
        self.sequences: OrderedDict[int, list[int]] = OrderedDict()  # oldest first
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> sequence << 32 | end, newest first

    def add(self, tokens: list[int]) -> int:
        """A new sequence holding `tokens`; its id."""
        sid, self.next_id = self.next_id, self.next_id + 1
        self.sequences[sid] = []
        self.extend(sid, tokens)
        return sid

    def extend(self, sid: int, tokens: list[int]) -> None:
        """Append `tokens` to sequence `sid`, indexing the n-grams that end within them."""
        sequence = self.sequences[sid]
        for token in tokens:
            sequence.append(token)
            end = len(sequence)
            for n in range(1, min(KEY, end) + 1):
                found = self.ends.setdefault(tuple(sequence[end - n:end]), [])
                found.insert(0, sid << 32 | end)  # an int: a third of a tuple's memory
                del found[OCCURRENCES:]
        self.size += len(tokens)

    def evict(self, keep: set[int] = frozenset()) -> None:
        """Drop the oldest sequences (but those in `keep`) while the index holds more than its budget."""
        for sid in list(self.sequences):
            if self.size <= self.budget:
                return
            if sid in keep:
                continue
            sequence = self.sequences.pop(sid)
            self.size -= len(sequence)
            for end in range(1, len(sequence) + 1):
                for n in range(1, min(KEY, end) + 1):
                    key = tuple(sequence[end - n:end])
                    if (found := self.ends.get(key)) is not None:
                        found[:] = [entry for entry in found if entry >> 32 != sid]
                        if not found:
                            del self.ends[key]

    def occurrences(self, context: list[int]) -> tuple[int, list[tuple[int, int]]]:
        """(the longest match, the ends of the occurrences of that suffix of `context` that a token follows):
        those of the longest key found, each compared backwards up to MAX_MATCH tokens."""
        for n in range(min(KEY, len(context)), 0, -1):
            found = [(entry >> 32, entry & MASK) for entry in self.ends.get(tuple(context[-n:]), ())]
            found = [(sid, end) for sid, end in found if end < len(self.sequences[sid])]
            if found:
                break
        else:
            return 0, []
        lengths = [matched(self.sequences[sid], end, context) for sid, end in found]
        best = max(lengths)
        return best, [entry for entry, length in zip(found, lengths) if length == best]

    def save(self, path: Path) -> None:
        """Write every sequence to `path` atomically (a temporary file beside it, then a rename)."""
        lengths = np.array([len(s) for s in self.sequences.values()], dtype=np.int64)
        tokens = np.array([t for s in self.sequences.values() for t in s], dtype=np.int64)
        fd, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, magic=np.array(MAGIC), lengths=lengths, tokens=tokens)
            os.replace(staged, path)
        except BaseException:
            Path(staged).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path, budget: int = BUDGET) -> "SuffixIndex":
        """The index saved in `path`: a fresh one when there is none yet, or (with a one-line warning) when it
        cannot be read."""
        index = cls(budget)
        if not path.exists():
            return index
        try:
            with np.load(path, allow_pickle=False) as data:
                if str(data["magic"]) != MAGIC:
                    raise ValueError("not an mlx-spec suffix cache")
                lengths, tokens = data["lengths"], data["tokens"]
                if lengths.sum() != tokens.size or (lengths < 0).any():
                    raise ValueError("its lengths do not add up")
            for piece in np.split(tokens, np.cumsum(lengths)[:-1]) if lengths.size else []:
                index.add(piece.tolist())
            index.evict()
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            print(f"[WARN] the suffix cache {path} cannot be read ({e}): starting a fresh one, which replaces it",
                  file=sys.stderr)
            return cls(budget)
        return index


def matched(sequence: list[int], end: int, context: list[int]) -> int:
    """How many tokens before `end` in `sequence` equal the end of `context`, up to MAX_MATCH."""
    n = 0
    while n < min(MAX_MATCH, end, len(context)) and sequence[end - 1 - n] == context[-1 - n]:
        n += 1
    return n


def continuations(index: SuffixIndex, found: list[tuple[int, int]], depth: int) -> list[list[int]]:
    return [index.sequences[sid][end:end + depth] for sid, end in found]


def best_paths(paths: list[list[int]], budget: int, width: int) -> list[list[int]]:
    """The trie of `paths` weighted by how often each prefix occurs: up to `budget` nodes, best first by
    cumulative probability (count / all), none below MIN_PROBABILITY, at most `width` children a node; the
    chosen nodes as root-to-leaf paths, most probable first."""
    counts = Counter(tuple(path[:d]) for path in paths for d in range(1, len(path) + 1))
    children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for prefix in counts:
        children.setdefault(prefix[:-1], []).append(prefix)
    total = len(paths)
    heap, chosen = [(-1.0, ())], []
    while heap and len(chosen) <= budget:
        probability, prefix = heappop(heap)
        if prefix:
            chosen.append(prefix)
        ranked = sorted(children.get(prefix, []), key=lambda p: (-counts[p], p))[:width]
        for child in ranked:
            if counts[child] / total >= MIN_PROBABILITY:
                heappush(heap, (-counts[child] / total, child))
    chosen = chosen[:budget]
    leaves = [p for p in chosen if not any(c in chosen for c in children.get(p, []))]
    return [list(p) for p in sorted(leaves, key=lambda p: (-counts[p], p))]


INDEXES: dict[Path | None, SuffixIndex] = {}


def shared_index(cache_file: Path | None = None) -> SuffixIndex:
    """The process's index for `cache_file` (None: in memory only): loaded once, saved when the process exits."""
    if cache_file not in INDEXES:
        INDEXES[cache_file] = SuffixIndex.load(cache_file) if cache_file else SuffixIndex()
        if cache_file:
            atexit.register(save_at_exit, INDEXES[cache_file], cache_file)
    return INDEXES[cache_file]


def save_at_exit(index: SuffixIndex, path: Path) -> None:
    try:
        index.save(path)
    except OSError as e:
        print(f"[WARN] the suffix cache could not be saved to {path} ({e.strerror or e}): this run's outputs are "
              "not kept", file=sys.stderr)


class SuffixDrafter(Drafter):
    name = "suffix"

    def __init__(self, index: SuffixIndex, width: int = 1):
        """index: shared with other drafters (`shared_index`: a batch's rows, other requests); width > 1: token
        trees of up to `width` children a node."""
        self.index, self.width, self.sid = index, width, None

    def batched(self, target_batch) -> RowDrafters:
        """Drafting for a batch: each row a sequence of its own in the shared index, chains or trees."""
        return RowDrafters(self.name, lambda: SuffixDrafter(self.index, self.width))

    def begin(self, context: list[int], prompt_step: Step) -> None:
        """The request's sequence: the previous one when `context` extends it (the next turn of a chat), else a
        new one; the oldest others are dropped past the budget."""
        previous = self.index.sequences.get(self.sid) if self.sid is not None else None
        if previous is not None and context[:len(previous)] == previous:
            self.index.extend(self.sid, context[len(previous):])
        else:
            self.sid = self.index.add(context)
        self.index.evict(keep={self.sid})

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        """Up to k tokens (no more than the match is long): the most frequent continuation, or a tree."""
        sequence = self.index.sequences.get(self.sid)
        if sequence is None or len(sequence) != len(context):  # a context this drafter did not follow
            self.begin(context, Step(None))
        match, found = self.index.occurrences(context)
        depth = min(k, max(1, match))
        if not found or not depth:
            return Draft.empty()
        paths = best_paths(continuations(self.index, found, depth), depth * self.width, self.width)
        if self.width == 1:
            return Draft(mx.array(paths[0] if paths else [], dtype=mx.int32))
        return Draft.from_paths(paths)

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        """The round's accepted drafts and the target's token join the request's sequence."""
        if (sequence := self.index.sequences.get(self.sid)) is not None:
            self.index.extend(self.sid, context[len(sequence):])

    def report(self) -> str:
        return f"suffix index: {len(self.index.sequences)} sequences, {self.index.size} tokens"


KINDS = [Kind("suffix", build=lambda pairing, runner: SuffixDrafter(shared_index(pairing.suffix_cache)))]
