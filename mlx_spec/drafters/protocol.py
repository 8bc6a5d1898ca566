"""The drafter protocol and what drafters share (the table of their kinds is `kinds`). Each drafter lives
in its own module."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import mlx.core as mx
import numpy as np

from ..core.draft import Draft
from ..core.sampling import SamplingParams, distributions, greedy_tokens, sample
from ..runners.checkpoint import LoadedTarget
from ..runners.target import Step, Target


def shape(drafter, width: int) -> str:
    """What a drafter proposes: "chain", "tree of width W", or a chain and why not a tree (its `no_tree`)."""
    if isinstance(getattr(drafter, "shape", None), str):
        return drafter.shape
    if getattr(drafter, "no_tree", None):
        return f"chain (no tree: {drafter.no_tree})"
    return f"tree of width {width}" if width > 1 else "chain"


class Drafter(Protocol):
    """Drafters that hold weights or caches of their own also expose them as `weights` (a module) and
    `caches` (a list), for the memory report; one with figures of its own says them in `report()` (a line for
    the statistics) and one with a shape of its own names it in `shape`. One that drafts for a batch has
    `batched(target_batch)`, which returns the batch's drafter: `join(context, hidden, ready)`, `select(rows)`,
    `propose(contexts, lengths, params, keys)` and `accept(contexts, accepted, hidden)` (as `RowDrafters`). One
    that reads the target's hidden states over the prompt's last positions only says how many in `hidden_tail`;
    one that reads all of them may take them chunk by chunk while the target prefills, in `absorb(first
    position, states)` (its `begin` then gets none). One whose chains can follow the generation's grammar has a
    `constrain` attribute, which the engine sets for a constrained generation (else None): `constrain(logits,
    drafts so far) -> the logits masked by what the grammar allows next` (`draft_autoregressively` applies it).
    One that keeps a state of its own per sequence gives it to the prompt cache with `hold()` and takes it back
    with `resume(held)` (None: start afresh); a batch's drafter that takes it back too has `row_state(row,
    context)` (a row's, as `hold` gives it) and `join(..., held=)` (prompt_cache.py)."""

    name: str

    def begin(self, context: list[int], prompt_step: Step) -> None:
        """Start a sequence whose tokens so far are `context`; the target has prefilled all but the last, and
        `prompt_step.hidden` holds its hidden states at the last positions it ran when the target was loaded to
        return them (all of them, or the drafter's `hidden_tail`)."""

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        """Up to k tokens continuing `context`, sampled with `params` (may be lazy)."""

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        """The round kept `accepted` drafts; `context` now ends with them and the target's next token."""


@dataclass
class Pairing:
    """What loading knows when it picks, checks and builds a drafter for a target: the target, the drafter's
    checkpoint (--draft-model or --mtp-path, resolved, with its config) and the options that concern drafters."""

    target: LoadedTarget
    draft_model: str | None = None  # --draft-model as given (None: none used), and its folder and config
    draft_path: Path | None = None
    draft_config: dict | None = None
    mtp_path: str | None = None  # --mtp-path as given (None: none used), and its folder and config
    head_path: Path | None = None
    head_config: dict | None = None
    kv_bits: int | None = None
    kv_group_size: int = 64
    mtp_hidden: str = "post"
    suffix_cache: Path | None = None


def nothing(pairing: Pairing) -> None:
    return None


@dataclass(frozen=True)
class Kind:
    """A kind of drafter, as its module declares it (`KINDS`) and `loading.make_engine` uses it: whether it serves
    a pairing (`recognises`), what it checks against the target before anything loads (`check`: a SpecError
    naming both), the target's hidden states it reads (`reads`: None, "post" or "pre" the final norm, or the
    outputs of chosen layers), the most drafts a round it makes (`max_draft_len`; None: the drafter name's
    default), how it is built over the target's runner (`build`), and why the drafter built cannot draft token
    trees (`tree_problem`; None: it can). `chains_only`: why --tree-width is refused outright (None: it is not)."""

    name: str
    build: Callable[[Pairing, Target], Drafter]
    recognises: Callable[[Pairing], bool] = lambda pairing: True
    check: Callable[[Pairing], None] = nothing
    reads: Callable[[Pairing], str | list[int] | None] = nothing
    max_draft_len: Callable[[Pairing], int | None] = nothing
    tree_problem: Callable[[Pairing, Drafter], str | None] = lambda pairing, drafter: None
    chains_only: str | None = None


class RowDrafters:
    """Drafting for a batch (`BatchedDecoder`) by one drafter per row, each proposing on its own."""

    def __init__(self, name: str, make: Callable[[], Drafter]):
        self.name, self.make, self.rows = name, make, []

    def join(self, context: list[int], hidden=None, ready: bool = True) -> None:
        """A row at the end of the batch, whose tokens so far are `context` (`hidden`: the target's states over
        all but its last token, for drafters that read them; not `ready`: drafting does not pay at this batch size
        yet, so a drafter may put off its work on the prompt until the row first drafts)."""
        self.rows.append(self.make())
        self.rows[-1].begin(context, Step(None, hidden))

    def select(self, rows: list[int]) -> None:
        self.rows = [self.rows[i] for i in rows]

    @property
    def outlook(self) -> list[float] | None:
        """A lone row's drafter's outlook (`NgramDrafter.outlook`; None: it makes none, or rows share a round)."""
        return getattr(self.rows[0], "outlook", None) if len(self.rows) == 1 else None

    def propose(self, contexts: list[list[int]], lengths: list[int], params: list[SamplingParams],
                keys: list[mx.array]) -> list[Draft]:
        return [drafter.propose(context, k, p, key) if k else Draft.empty()
                for drafter, context, k, p, key in zip(self.rows, contexts, lengths, params, keys)]

    def accept(self, contexts: list[list[int]], accepted: list[int], hidden=None) -> None:
        """`hidden` (B, n, H): the target's states over the round's inputs, for drafters that read them."""
        for row, (drafter, context, count) in enumerate(zip(self.rows, contexts, accepted)):
            drafter.accept(context, count, Step(None, None if hidden is None else hidden[row, :count + 1]))


class LastHiddenRows:
    """For drafters that draft a batch from each row's last verified hidden state (Medusa heads, Gemma 4
    assistants): those states, kept as the decoder hands them over."""

    def __init__(self):
        self.last_hidden: list[mx.array | None] = []  # per row: (1, H), or None before its first verified position

    def join(self, context: list[int], hidden: mx.array | None, ready: bool = True) -> None:
        self.last_hidden.append(hidden[-1:] if hidden is not None and hidden.shape[0] else None)

    def select(self, rows: list[int]) -> None:
        self.last_hidden = [self.last_hidden[i] for i in rows]

    def accept(self, contexts: list[list[int]], accepted: list[int], hidden: mx.array) -> None:
        """Each row's hidden state at its last kept input (the one that scored the target's next token)."""
        self.last_hidden = [hidden[row, count:count + 1] for row, count in enumerate(accepted)]

    def stacked(self) -> mx.array:
        """(B, H): every row's state, zeros for a row that has none yet (it drafts nothing)."""
        like = next(h for h in self.last_hidden if h is not None)
        return mx.concatenate([h if h is not None else mx.zeros_like(like) for h in self.last_hidden])


def draft_autoregressively(first_logits: mx.array, next_logits: Callable[[mx.array], mx.array], k: int,
                           params: SamplingParams, context: list[int], key: mx.array,
                           constrain: Callable[[mx.array, list[int]], mx.array] | None = None) -> Draft:
    """k tokens from a model that drafts one at a time: `first_logits` (1, V) scores the first, and
    `next_logits(token)` feeds a drafted token and scores the one after it. Lazy: no host synchronisation, but
    with `constrain` (the Drafter's), which masks each step's logits by the drafts before it (read to the host)."""
    tokens, dists, logits, drafted_ids = [], [], first_logits, []
    for i, step_key in enumerate(mx.random.split(key, k)):
        if constrain is not None:
            logits = constrain(logits, drafted_ids)
        drafted = mx.concatenate(tokens) if tokens else None
        if params.greedy:  # deterministic draft: q is one-hot, so none is kept
            tokens.append(greedy_tokens(logits, params, context, drafted, start=i))
        else:
            dists.append(distributions(logits, params, context, drafted, start=i))
            tokens.append(sample(dists[-1], step_key))
        mx.async_eval(tokens[-1])  # start computing while the next step's graph is built
        if constrain is not None:
            drafted_ids.append(tokens[-1].item())
        if i < k - 1:
            logits = next_logits(tokens[-1])
    return Draft(mx.concatenate(tokens).astype(mx.int32), mx.concatenate(dists) if dists else None)


def draft_batch(logits: mx.array, next_logits: Callable[[mx.array], mx.array], contexts: list[list[int]],
                lengths: list[int], params: list[SamplingParams], keys: list[mx.array]) -> list[Draft]:
    """Row i's chain of lengths[i] tokens from a model that drafts one step for a whole batch at a time, each row
    as `draft_autoregressively` drafts alone (its own sampling settings and keys): `logits` (B, V) scores every
    row's first draft, `next_logits(column)` feeds each row's newest token (B,) (0 for a row that is done) and
    scores the next. Lazy."""
    longest = max(lengths)
    tokens, dists = [[] for _ in contexts], [[] for _ in contexts]
    step_keys = [mx.random.split(key, k) if k else None for key, k in zip(keys, lengths)]
    for j in range(longest):
        column = []
        for row, (context, k, p) in enumerate(zip(contexts, lengths, params)):
            if j < k:
                drafted = mx.concatenate(tokens[row]) if tokens[row] else None
                if p.greedy:  # deterministic draft: q is one-hot, so none is kept
                    tokens[row].append(greedy_tokens(logits[row:row + 1], p, context, drafted, start=j))
                else:
                    dists[row].append(distributions(logits[row:row + 1], p, context, drafted, start=j))
                    tokens[row].append(sample(dists[row][-1], step_keys[row][j]))
            column.append(tokens[row][-1] if j < k else mx.zeros((1,), dtype=mx.int32))
        if j < longest - 1:
            logits = next_logits(mx.concatenate(column).astype(mx.int32))
    return [Draft(mx.concatenate(t).astype(mx.int32), mx.concatenate(d) if d else None) if t else Draft.empty()
            for t, d in zip(tokens, dists)]


def grow_tree(logits: mx.array, depth: int, width: int, score: Callable) -> tuple[Draft, dict[int, int]]:
    """A dynamic token tree after EAGLE-2: `depth` levels of `width` nodes. Each node of a level offers its
    `width` most probable children; the level keeps the `width` best by cumulative draft log-probability, the
    drafter's own greedy chain always among them (so the tree holds every path the chain would).

    `logits` (1, V) scores the first level. `score(nodes, tokens, parents, attend, level)` feeds a level's nodes
    (`tokens`/`parents`: the tree so far) to the drafter, each attending, among all nodes fed so far, to its own
    lineage (`attend` (len(nodes), fed)), and returns their logits. Returns the tree and the order in which its
    nodes were fed (node -> row; the last level is never fed)."""
    tokens, parents, scores, lineage = [], [], [], {-1: []}  # lineage: a node's ancestors and itself
    frontier, chain, fed = [-1], -1, {}  # -1: the context's last token; chain: the node on the greedy chain
    for level in range(depth):
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        top = mx.argpartition(-logprobs, width - 1, axis=-1)[:, :width]
        top_scores = mx.take_along_axis(logprobs, top, axis=-1).tolist()
        candidates = [(parent, token, (scores[parent] if parent >= 0 else 0.0) + value)
                      for parent, row, row_scores in zip(frontier, top.tolist(), top_scores)
                      for token, value in zip(row, row_scores)]
        ranked = sorted(candidates, key=lambda c: -c[2])
        greedy = next(c for c in ranked if c[0] == chain)
        chain, frontier = len(tokens), []
        for parent, token, value in [greedy, *[c for c in ranked if c is not greedy][: width - 1]]:
            frontier.append(len(tokens))
            lineage[len(tokens)] = lineage[parent] + [len(tokens)]
            tokens.append(token)
            parents.append(parent)
            scores.append(value)
        if level == depth - 1:
            break
        for node in frontier:
            fed[node] = len(fed)
        attend = np.zeros((len(frontier), len(fed)), dtype=bool)
        for i, node in enumerate(frontier):
            attend[i, [fed[a] for a in lineage[node]]] = True
        logits = score(frontier, tokens, parents, attend, level)
    return Draft(mx.array(tokens, dtype=mx.int32), parents=parents), fed
