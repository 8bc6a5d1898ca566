"""The drafter protocol and what drafters share (the table of their kinds is `kinds`). Each drafter lives
in its own module."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mlx.core as mx
import numpy as np

from ..core.draft import Draft
from ..core.sampling import SamplingParams, distributions, greedy_tokens, sample
from ..runners.checkpoint import LoadedTarget
from ..runners.target import Step, Target


def shape(drafter: Drafter | None, width: int) -> str:
    """What a drafter proposes: "chain", "tree of width W", or a chain and why not a tree (its `no_tree`)."""
    if drafter is None:
        return "chain"
    if drafter.shape is not None:
        return drafter.shape
    if drafter.no_tree:
        return f"chain (no tree: {drafter.no_tree})"
    return f"tree of width {width}" if width > 1 else "chain"


class Drafter:
    """A drafter of one sequence: `begin`, `propose` and `accept`, which every drafter implements, and what a
    drafter may do besides, declared here with the default of one that does not (its callers never probe)."""

    name: str = ""
    width: int = 1  # > 1: it proposes token trees this wide (loading sets it, or `no_tree`: why not)
    no_tree: str | None = None
    shape: str | None = None  # a shape of its own to show instead of "chain" / "tree of width W"
    hidden_tail: int | None = None  # it reads the target's hidden states at the prompt's last positions only
    # (None: at all of them, where the target is loaded to return them)
    absorb: Callable[[int, mx.array], None] | None = None  # (first position, states): it takes the prompt's
    # hidden states chunk by chunk while the target prefills (its `begin` then gets none)
    constrain: Callable[[mx.array, list[int]], mx.array] | None = None  # set by the engine for a constrained
    # generation: (logits, drafts so far) -> the logits masked by what the grammar allows next
    go_on: Callable[[list[list[float] | None]], bool] | None = None  # set by the round loop where its policy
    # stops chains by the drafter's confidence (`BatchDrafter.stop_by`), for drafters that draft a token at a time
    outlook: list[float] | None = None  # its estimate of each draft of its next chain passing (n-gram)
    trees: bool = False  # it drafts token trees whatever its width (lookahead's)
    weights = None  # a module of weights of its own, and caches of its own, for the memory report
    caches: list | None = None

    def begin(self, context: list[int], prompt_step: Step) -> None:
        """Start a sequence whose tokens so far are `context`; the target has prefilled all but the last, and
        `prompt_step.hidden` holds its hidden states at the last positions it ran when the target was loaded to
        return them (all of them, or the drafter's `hidden_tail`)."""
        raise NotImplementedError

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        """Up to k tokens continuing `context`, sampled with `params` (may be lazy)."""
        raise NotImplementedError

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        """The round kept `accepted` drafts; `context` now ends with them and the target's next token."""
        raise NotImplementedError

    def batched(self, target_batch) -> BatchDrafter:
        """The drafter of a batch's rows, given the target's RaggedBatch (`RowDrafters`: one of its own per row)."""
        raise NotImplementedError

    def report(self) -> str:
        """A line of figures of its own for the statistics ("": none)."""
        return ""

    def estimates(self) -> object | None:
        """What it learnt of its drafts, for the next run to `start_from` (None: nothing)."""
        return None

    def start_from(self, estimates: object | None) -> None:
        """Go on from what an earlier run's `estimates` gave."""

    def hold(self) -> object | None:
        """Its state for the sequence it drafts, for the prompt cache to keep (None: none of its own)."""
        return None

    def resume(self, held: object | None) -> None:
        """Take back a state `hold` gave (None: start afresh)."""


class BatchDrafter:
    """A drafter of a batch's rows (`Drafter.batched`), in the batch's order: rows `join` at the end (`hidden`:
    the target's states over all but a row's last token, for drafters that read them; not `ready`: drafting does
    not pay at this batch size yet, so a drafter may put off its work on the prompt until the row first drafts;
    `held`: what the prompt cache kept of the drafter's state, as `row_state` gave it) and leave (`select`)."""

    name: str = ""
    resumes: bool = False  # a joining row takes back its context from `held` (read from the prompt's hidden
    # states otherwise: a row served a cached prefix then runs the positions its drafter reads)

    @property
    def outlook(self) -> list[float] | None:
        """A lone row's drafter's outlook (`Drafter.outlook`; None: none, or rows share a round)."""
        return None

    def join(self, context: list[int], hidden: mx.array | None = None, ready: bool = True,
             held: object | None = None) -> None:
        raise NotImplementedError

    def select(self, rows: list[int]) -> None:
        raise NotImplementedError

    def propose(self, contexts: list[list[int]], lengths: list[int], params: list[SamplingParams],
                keys: list[mx.array]) -> list[Draft]:
        raise NotImplementedError

    def accept(self, contexts: list[list[int]], accepted: list[int], hidden: mx.array | None = None,
               tree_logits: list[mx.array | None] | None = None) -> None:
        """`hidden` (B, n, H): the target's states at the inputs each row kept, in order, for drafters that read
        them; `tree_logits`: per row, the target's logits at every node of its token tree (None: a chain)."""
        raise NotImplementedError

    def row_state(self, row: int, context: list[int]) -> object | None:
        """Row `row`'s drafter state, as `Drafter.hold` gives it (None: none kept)."""
        return None

    def absorber(self, held: object | None) -> Drafter | None:
        """A drafter of one joining row, from `held` (as `join` takes it), whose `absorb` takes the features of its
        prompt's prefill piece by piece as they run, so that a long prompt's are never all held; the row then
        joins with its `hold()`. None: this drafter takes a prompt's states at `join`."""
        return None

    constraints: list | None = None  # per row: its grammar's mask of logits by the drafts before (`constrain`)

    def constrain(self, grammars: list) -> None:
        """Each row's grammar (None: none), for drafters that mask their drafts by it while drafting."""
        self.constraints = ([grammar_mask(grammar) for grammar in grammars]
                            if any(grammar is not None for grammar in grammars) else None)

    def set_width(self, width: int) -> None:
        """The next rounds' token trees are `width` wide (1: chains), at most the width the drafter was loaded
        with."""

    go_on: Callable[[list[list[float] | None]], bool] | None = None  # `stop_by`'s

    def stop_by(self, go_on: Callable[[list[list[float] | None]], bool] | None) -> None:
        """The round's rule for stopping chains where the drafter is unsure (None: each drafts as long as asked),
        for drafters that draft one token at a time: asked after each step, given per row its probability of
        each of its drafts so far (None for a row that drafts no more), whether every row still drafting drafts
        one more (`DraftPolicy.go_on`, for the rows it chose the length of)."""
        self.go_on = go_on


def grammar_mask(grammar) -> Callable[[mx.array, list[int]], mx.array] | None:
    """A `Drafter.constrain` for `grammar` (None: none): logits masked by what it allows after the drafts."""
    return None if grammar is None else lambda logits, drafts: grammar.masked_tree(logits, [drafts])


class OneDrafter(BatchDrafter):
    """A drafter of one sequence as the drafter of a round loop's one row (`Engine.stream`): the engine begins
    it on the prompt itself; what it is given it passes on as alone."""

    def __init__(self, drafter: Drafter):
        self.drafter, self.name = drafter, drafter.name

    @property
    def outlook(self) -> list[float] | None:
        return self.drafter.outlook

    def propose(self, contexts: list[list[int]], lengths: list[int], params: list[SamplingParams],
                keys: list[mx.array]) -> list[Draft]:
        return [self.drafter.propose(contexts[0], lengths[0], params[0], keys[0]) if lengths[0] else Draft.empty()]

    def accept(self, contexts: list[list[int]], accepted: list[int], hidden=None, tree_logits=None) -> None:
        count = accepted[0]
        self.drafter.accept(contexts[0], count, Step(None, None if hidden is None else hidden[0, :count + 1],
                                                     tree_logits=tree_logits and tree_logits[0]))

    def constrain(self, grammars: list) -> None:
        self.drafter.constrain = grammar_mask(grammars[0])

    def set_width(self, width: int) -> None:
        self.drafter.width = width

    def stop_by(self, go_on: Callable[[list[list[float] | None]], bool] | None) -> None:
        self.drafter.go_on = go_on


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
    mtp_hidden: str | None = None  # None: as the drafter's reference implementation reads it
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


class RowDrafters(BatchDrafter):
    """Drafting for a batch (`BatchedDecoder`) by one drafter per row, each proposing on its own."""

    def __init__(self, name: str, make: Callable[[], Drafter]):
        self.name, self.make, self.rows = name, make, []

    def join(self, context: list[int], hidden=None, ready: bool = True, held=None) -> None:
        self.rows.append(self.make())
        self.rows[-1].begin(context, Step(None, hidden))

    def select(self, rows: list[int]) -> None:
        self.rows = [self.rows[i] for i in rows]

    @property
    def outlook(self) -> list[float] | None:
        """A lone row's drafter's outlook (`NgramDrafter.outlook`; None: it makes none, or rows share a round)."""
        return self.rows[0].outlook if len(self.rows) == 1 else None

    def propose(self, contexts: list[list[int]], lengths: list[int], params: list[SamplingParams],
                keys: list[mx.array]) -> list[Draft]:
        return [drafter.propose(context, k, p, key) if k else Draft.empty()
                for drafter, context, k, p, key in zip(self.rows, contexts, lengths, params, keys)]

    def accept(self, contexts: list[list[int]], accepted: list[int], hidden=None, tree_logits=None) -> None:
        for row, (drafter, context, count) in enumerate(zip(self.rows, contexts, accepted)):
            drafter.accept(context, count, Step(None, None if hidden is None else hidden[row, :count + 1],
                                                tree_logits=tree_logits and tree_logits[row]))

    def constrain(self, grammars: list) -> None:
        for drafter, grammar in zip(self.rows, grammars):
            drafter.constrain = grammar_mask(grammar)

    def set_width(self, width: int) -> None:
        for drafter in self.rows:
            drafter.width = width

    def stop_by(self, go_on: Callable[[list[list[float] | None]], bool] | None) -> None:
        """A lone row's rule; rows that draft one after another share no step to stop together at, and each
        drafts as long as asked."""
        for drafter in self.rows:
            drafter.go_on = go_on if len(self.rows) == 1 else None


class LastHiddenRows(BatchDrafter):
    """For drafters that draft a batch from each row's last verified hidden state (Medusa heads, Gemma 4
    assistants): those states, kept as the decoder hands them over."""

    def __init__(self):
        self.last_hidden: list[mx.array | None] = []  # per row: (1, H), or None before its first verified position

    def join(self, context: list[int], hidden: mx.array | None, ready: bool = True, held=None) -> None:
        self.last_hidden.append(hidden[-1:] if hidden is not None and hidden.shape[0] else None)

    def select(self, rows: list[int]) -> None:
        self.last_hidden = [self.last_hidden[i] for i in rows]

    def accept(self, contexts: list[list[int]], accepted: list[int], hidden: mx.array, tree_logits=None) -> None:
        """Each row's hidden state at its last kept input (the one that scored the target's next token)."""
        self.last_hidden = [hidden[row, count:count + 1] for row, count in enumerate(accepted)]

    def stacked(self) -> mx.array:
        """(B, H): every row's state, zeros for a row that has none yet (it drafts nothing)."""
        like = next(h for h in self.last_hidden if h is not None)
        return mx.concatenate([h if h is not None else mx.zeros_like(like) for h in self.last_hidden])


def draft_autoregressively(first_logits: mx.array, next_logits: Callable[[mx.array], mx.array], k: int,
                           params: SamplingParams, context: list[int], key: mx.array,
                           constrain: Callable[[mx.array, list[int]], mx.array] | None = None,
                           go_on: Callable[[list[list[float] | None]], bool] | None = None) -> Draft:
    """Up to k tokens from a model that drafts one at a time: `first_logits` (1, V) scores the first, and
    `next_logits(token)` feeds a drafted token and scores the one after it. Lazy: no host synchronisation, but
    with `constrain` (the Drafter's), which masks each step's logits by the drafts before it (read to the host),
    and with `go_on` (the Drafter's), asked after each draft, given the drafter's probability of each draft so far
    (read to the host), whether to draft another."""
    tokens, dists, logits, drafted_ids, confidence = [], [], first_logits, [], []
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
        if go_on is not None and i < k - 1:
            chances = dists[-1] if dists else mx.softmax(logits.astype(mx.float32), axis=-1)
            confidence.append(chances[0, tokens[-1][0]].item())
            if not go_on([confidence]):
                break
        if i < k - 1:
            logits = next_logits(tokens[-1])
    return Draft(mx.concatenate(tokens).astype(mx.int32), mx.concatenate(dists) if dists else None)


def draft_batch(logits: mx.array, next_logits: Callable[[mx.array], mx.array], contexts: list[list[int]],
                lengths: list[int], params: list[SamplingParams], keys: list[mx.array],
                constraints: list | None = None,
                go_on: Callable[[list[list[float] | None]], bool] | None = None) -> list[Draft]:
    """Row i's chain of up to lengths[i] tokens from a model that drafts one step for a whole batch at a time,
    each row as `draft_autoregressively` drafts alone (its own sampling settings and keys, its grammar's mask from
    `constraints`: `BatchDrafter.constraints`): `logits` (B, V) scores every row's first draft,
    `next_logits(column)` feeds each row's newest token (B,) (0 for a row that is done) and scores the next. The
    rows still drafting stop together where `go_on` says (`BatchDrafter.stop_by`). Lazy, but for rows under a
    grammar, whose drafts are read to the host step by step, and with `go_on`. A chain's length is its Draft's;
    the steps fed are the longest's, less one."""
    lengths, confidence = list(lengths), [[] for _ in contexts]
    longest = max(lengths)
    tokens, dists, drafted_ids = [[] for _ in contexts], [[] for _ in contexts], [[] for _ in contexts]
    step_keys = [mx.random.split(key, k) if k else None for key, k in zip(keys, lengths)]
    masks = constraints or [None] * len(contexts)
    for j in range(longest):
        column, chances = [], {}  # chances: each row still drafting's probability of its newest draft (lazy)
        for row, (context, k, p, mask) in enumerate(zip(contexts, lengths, params, masks)):
            if j < k:
                drafted = mx.concatenate(tokens[row]) if tokens[row] else None
                scores = logits[row:row + 1] if mask is None else mask(logits[row:row + 1], drafted_ids[row])
                if p.greedy:  # deterministic draft: q is one-hot, so none is kept
                    tokens[row].append(greedy_tokens(scores, p, context, drafted, start=j))
                else:
                    dists[row].append(distributions(scores, p, context, drafted, start=j))
                    tokens[row].append(sample(dists[row][-1], step_keys[row][j]))
                if mask is not None:
                    drafted_ids[row].append(tokens[row][-1].item())
                if go_on is not None and j < k - 1:
                    probabilities = dists[row][-1] if dists[row] else mx.softmax(scores.astype(mx.float32), axis=-1)
                    chances[row] = probabilities[0, tokens[row][-1][0]]
            column.append(tokens[row][-1] if j < k else mx.zeros((1,), dtype=mx.int32))
        mx.async_eval(column)  # start computing while the next step's graph is built
        if chances:  # read to the host once a step, for every row together
            for row, chance in zip(chances, mx.stack(list(chances.values())).tolist()):
                confidence[row].append(chance)
            if not go_on([confidence[row] if row in chances else None for row in range(len(contexts))]):
                lengths = [j + 1 if row in chances else k for row, k in enumerate(lengths)]
        if j >= max(lengths) - 1:
            break
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
