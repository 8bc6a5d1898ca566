"""Drafting with a block drafter (models/dflash.py: DFlash, DSpark): k drafts from one drafter forward.

The drafter's context is the target's features at every position it has verified: the prompt's (the target
returns them all) and, after each round, those of the round's last token and accepted drafts. They wait until the
next draft, which appends them to the drafter's cache and runs the block `[last token, MASK ...]` after them in
the same forward. Each position's q is the drafter's own distribution there (DSpark's with its Markov bias from
the token drafted before; DFlash2's over its candidate selector's choices after that token), sampled left to
right, so verification is exact at every temperature.

With a tree width W > 1 a DFlash drafter proposes a DDTree (Algorithm 1 of its paper): the W k prefixes of highest
probability under the block's per-position distributions, taken best-first (a prefix only after its parent),
verified in one target forward as a token tree (its nodes are one-hot candidates: exact at every temperature).
DSpark and DFlash2 drafters draft chains: each position's distribution depends on the token drafted before.
In a batch (`BlockRows`) every row keeps its own context and every drafting row's block runs in one drafter
forward.
"""

from __future__ import annotations

from heapq import heappop, heappush

import mlx.core as mx
import numpy as np

from ..core.sampling import SamplingParams
from ..models.dflash import BlockDrafterModel, block_kind, load_block_drafter
from ..models.dflash import read_config as block_config
from ..runners.checkpoint import check_memory, vocab_size
from ..runners.context_rows import ContextRows
from ..runners.target import MAX_DRAFT_LEN, PREFILL_CHUNK, Step
from ..seams import layout
from ..seams.caches import restore, snapshot, snapshot_of
from ..seams.errors import SpecError
from .protocol import (
    BatchDrafter,
    Draft,
    Drafter,
    Kind,
    Pairing,
    draft_autoregressively,
)


def best_first_tree(logits: mx.array, budget: int) -> Draft:
    """DDTree: the `budget` most probable prefixes under independent per-position distributions softmax(logits)
    (k, V), each after its parent; ties go to the earlier. Nodes in order of depth."""
    top = min(budget, logits.shape[-1])
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    ids = mx.argpartition(-logprobs, top - 1, axis=-1)[:, :top]  # each position's top tokens, then in order
    ids = mx.take_along_axis(ids, mx.argsort(-mx.take_along_axis(logprobs, ids, axis=-1), axis=-1), axis=-1)
    scores = mx.take_along_axis(logprobs, ids, axis=-1).tolist()
    ids = ids.tolist()
    heap, chosen = [(-scores[0][0], 0, (0,), -1)], []  # (-log-probability, order, ranks per depth, parent)
    while heap and len(chosen) < budget:
        score, _, ranks, parent = heappop(heap)
        chosen.append((ranks, parent))
        depth, rank = len(ranks), ranks[-1]
        if rank + 1 < top:  # the next sibling
            heappush(heap, (score + scores[depth - 1][rank] - scores[depth - 1][rank + 1], len(chosen) * 2,
                            ranks[:-1] + (rank + 1,), parent))
        if depth < len(ids):  # the first child
            heappush(heap, (score - scores[depth][0], len(chosen) * 2 + 1, ranks + (0,), len(chosen) - 1))
    order = sorted(range(len(chosen)), key=lambda i: (len(chosen[i][0]), i))
    place = {node: i for i, node in enumerate(order)}
    return Draft(mx.array([ids[len(chosen[n][0]) - 1][chosen[n][0][-1]] for n in order], dtype=mx.int32),
                 parents=[place[chosen[n][1]] if chosen[n][1] >= 0 else -1 for n in order])


def block_inputs(model: BlockDrafterModel, embed, anchors: list[int], k: int) -> mx.array:
    """The embedded blocks (B, n, H) that draft k tokens after each anchor: `[anchor, MASK ...]`."""
    c = model.config
    blocks = mx.array([[anchor] + [c["mask"]] * (k - c["from_anchor"]) for anchor in anchors], dtype=mx.int32)
    return embed(blocks) * c["input_scale"] if c["input_scale"] != 1 else embed(blocks)


def block_logits(model: BlockDrafterModel, head, hidden: mx.array) -> mx.array:
    """The drafter's logits at positions whose final hidden states are `hidden` (..., H)."""
    c = model.config
    logits = head(hidden) * c["output_scale"] if c["output_scale"] != 1 else head(hidden)
    return mx.tanh(logits / c["softcap"]) * c["softcap"] if c["softcap"] else logits


def draft_block(model: BlockDrafterModel, logits: mx.array, hidden: mx.array, context: list[int], k: int,
                params: SamplingParams, key: mx.array, width: int, constrain) -> Draft:
    """A block's draft from its logits and final hidden states at its k draft positions ((k, D), (k, H)): a
    DDTree `width` > 1 wide, or a chain sampled left to right (with DSpark's confidence in each position)."""
    if width > 1:
        return best_first_tree(model.to_target(logits), width * k)
    anchor = mx.array(context[-1:], dtype=mx.int32)
    markov = model.markov_head if "markov_head" in model else None
    selector = model.candidate_selector if "candidate_selector" in model else None
    if selector is not None:
        ids, unary, projected = selector.candidates(logits, hidden)
    row = iter(range(1, k))

    def position_logits(previous: mx.array, i: int) -> mx.array:
        if selector is not None:
            return selector(previous, ids[i], unary[i], projected[i], logits.shape[-1])
        return model.to_target(logits[i:i + 1] + (markov(previous) if markov is not None else 0))

    draft = draft_autoregressively(position_logits(anchor, 0), lambda token: position_logits(token, next(row)),
                                   k, params, context, key, constrain)
    if "confidence_head" in model:  # DSpark: each position's chance of acceptance, for the policy's cut
        previous = mx.concatenate([anchor, draft.tokens[:-1]])
        draft.confidence = model.confidence_head(hidden, markov.markov_w1(previous))
    return draft


class BlockDrafter(Drafter):
    hidden_tail = None  # the context is every position's features

    def __init__(self, model: BlockDrafterModel, target_model):
        """The target must be run with `Target(..., hidden=...)` reading the outputs of the drafter's target
        layers (`features`)."""
        self.model = self.weights = model
        self.name, self.target_model = model.config["kind"], target_model
        self.embed = model.embed_tokens if "embed_tokens" in model else layout.input_embedding(target_model)
        self.head = model.lm_head if "lm_head" in model else layout.output_head(target_model)
        self.caches, self.pending, self.start = model.make_cache(), [], 0  # start: the next feature's position
        self.blocks, self.block_drafts, self.confidence = 0, 0, []  # this generation's, for `report`

    def batched(self, target_batch) -> BlockRows:
        return BlockRows(self)

    def row(self, held: tuple | None) -> BlockDrafter:
        """A drafter of one sequence on the same weights, from a context `hold` gave (None: afresh)."""
        drafter = BlockDrafter(self.model, self.target_model)
        drafter.resume(held)
        return drafter

    def covered(self) -> int:
        """The positions whose features the drafter holds or has waiting."""
        return self.start + sum(h.shape[0] for h in self.pending)

    def resume_at(self, position: int, reused: int) -> None:
        """Features continue from `position`: what the drafter holds stays when it ends there and the target
        reused its cache that far (`reused` positions); otherwise the context starts afresh from there."""
        self._catch_up()
        if not 0 < position == self.start <= reused:
            self.caches = self.model.make_cache()
        self.start = position

    def hold(self) -> tuple:
        """Its context for the sequence the target's cache holds (`prompt_cache`)."""
        return snapshot(self.caches), list(self.pending), self.start

    def resume(self, held: tuple | None) -> None:
        """Take back a context `hold` gave; None: start afresh where the target's cache ends."""
        self.caches, self.pending, self.start = self.model.make_cache(), [], 0
        if held is not None:
            restore(self.caches, held[0])
            self.pending, self.start = list(held[1]), held[2]

    def absorb(self, start: int, hidden: mx.array) -> None:
        """The features of a prefill chunk from position `start` join the context as the target runs it."""
        if start != self.covered():  # not where the features it holds end: the context starts afresh here
            self.caches, self.pending, self.start = self.model.make_cache(), [], start
        self.pending.append(hidden)
        self._catch_up()
        mx.eval([c.state for c in self.caches])

    def begin(self, context: list[int], prompt_step: Step) -> None:
        """The prompt's features join the context now, in pieces, unless `absorb` took them during the prefill."""
        self.blocks, self.block_drafts, self.confidence = 0, 0, []
        if not prompt_step.absorbed:
            rows = 0 if prompt_step.hidden is None else prompt_step.hidden.shape[0]
            self.resume_at(len(context) - 1 - rows, prompt_step.start)
            self.pending += [prompt_step.hidden] if rows else []
        self._catch_up()

    def _catch_up(self) -> None:
        """Append the waiting features to the drafter's cache, PREFILL_CHUNK positions a forward."""
        features = mx.concatenate(self.pending) if self.pending else None
        self.pending = []
        for piece in range(0, 0 if features is None else features.shape[0], PREFILL_CHUNK):
            chunk = features[piece:piece + PREFILL_CHUNK]
            self.model.extend(chunk[None], self.caches, self.start)
            self.start += chunk.shape[0]
            if features.shape[0] > PREFILL_CHUNK:
                mx.eval([c.state for c in self.caches])

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        self._catch_up()
        if k == 0 or not self.caches[0].offset:
            return Draft.empty()
        self.blocks, self.block_drafts = self.blocks + 1, self.block_drafts + k
        blocks = block_inputs(self.model, self.embed, [context[-1]], k)
        hidden = self.model(blocks, self.caches, self.start)[0, 0 if self.model.config["from_anchor"] else 1:]
        draft = draft_block(self.model, block_logits(self.model, self.head, hidden), hidden, context, k, params, key,
                            self.width, self.constrain)
        if draft.confidence is not None:
            self.confidence.append(draft.confidence)
        return draft

    def report(self) -> str:
        """This generation's blocks: how many, how long of the most the drafter drafts, and DSpark's mean estimate
        of each position's acceptance (to read beside the measured one)."""
        if not self.blocks:
            return ""
        text = (f"{self.blocks} blocks of {self.block_drafts / self.blocks:.1f} drafts (at most "
                f"{self.model.config['drafts']}) from one drafter forward each")
        if self.confidence:
            rows = [c.tolist() for c in self.confidence]
            means = [sum(r[i] for r in rows if len(r) > i) / sum(len(r) > i for r in rows)
                     for i in range(max(map(len, rows)))]
            text += f"; estimated acceptance per position [{' '.join(f'{m:.0%}' for m in means)}]"
        return text

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        self.pending.append(step.hidden)  # the round's last token and accepted drafts


class BlockRows(BatchDrafter):
    """A block drafter's batch: every drafting row's block in one drafter forward, each over its own context,
    the contexts side by side in one buffer per layer (`ContextRows`). A joining row's prompt features are read
    by a drafter of its own, as alone (resuming what the prompt cache held), and its context then moves in."""

    resumes = True

    def __init__(self, drafter: BlockDrafter):
        self.drafter, self.name, self.width = drafter, drafter.name, drafter.width
        self.context = ContextRows()
        self.starts: list[int] = []  # per row: the position of its next feature
        self.pending: list[list[mx.array]] = []  # per row: features waiting to join its context

    def absorber(self, held: tuple | None) -> BlockDrafter:
        return self.drafter.row(held)

    def join(self, context: list[int], hidden=None, ready: bool = True, held=None) -> None:
        row = self.drafter.row(held)
        rows = 0 if hidden is None else hidden.shape[0]
        row.begin(context, Step(None, hidden, start=len(context) - 1 - rows))
        c, length = self.drafter.model.config, row.caches[0].offset
        empty = mx.zeros((1, c["kv_heads"], 0, c["head_dim"]), dtype=self.drafter.model.norm.weight.dtype)
        self.context.add_row([(cache.keys[..., :length, :], cache.values[..., :length, :]) if length else
                              (empty, empty) for cache in row.caches], np.arange(row.start - length, row.start))
        self.starts.append(row.start)
        self.pending.append([])

    def select(self, rows: list[int]) -> None:
        self.context.select(rows)
        self.starts, self.pending = [self.starts[i] for i in rows], [self.pending[i] for i in rows]

    def accept(self, contexts: list[list[int]], accepted: list[int], hidden=None, tree_logits=None) -> None:
        for waiting, row, count in zip(self.pending, hidden, accepted):
            waiting.append(row[:count + 1])
        if max(sum(h.shape[0] for h in waiting) for waiting in self.pending) >= PREFILL_CHUNK:
            self._catch_up()  # rounds without drafts: their features go in before they pile up

    def _catch_up(self) -> None:
        """Every row's waiting features join its context, in one forward of the drafter's projections."""
        counts = [sum(h.shape[0] for h in waiting) for waiting in self.pending]
        longest = max(counts, default=0)
        if not longest:
            return
        like = next(h for waiting in self.pending for h in waiting)
        features = mx.stack([mx.concatenate([*waiting, mx.zeros((longest - count, like.shape[-1]), like.dtype)])
                             for waiting, count in zip(self.pending, counts)])
        positions = np.array([[start + j if j < count else -1 for j in range(longest)]
                              for start, count in zip(self.starts, counts)])
        self.context.append(self.drafter.model.context_kv(features, mx.array(self.starts)), positions)
        self.starts = [start + count for start, count in zip(self.starts, counts)]
        self.pending = [[] for _ in self.pending]

    def propose(self, contexts: list[list[int]], lengths: list[int], params: list[SamplingParams],
                keys: list[mx.array]) -> list[Draft]:
        self._catch_up()
        drafts = [Draft.empty() for _ in contexts]
        drafting = [i for i, k in enumerate(lengths) if k and self.context.holds(i)]
        if not drafting:
            return drafts
        model, skip = self.drafter.model, 0 if self.drafter.model.config["from_anchor"] else 1
        sizes = [lengths[i] + skip for i in drafting]  # each row's block
        blocks = block_inputs(model, self.drafter.embed, [contexts[i][-1] for i in drafting],
                              max(lengths[i] for i in drafting))
        context, positions = self.context.rows(drafting)
        hidden = model.over_rows(blocks, context, positions, mx.array([self.starts[i] for i in drafting]),
                                 mx.array(sizes))
        logits = block_logits(model, self.drafter.head, hidden)  # every row's in one product
        for j, (i, size) in enumerate(zip(drafting, sizes)):
            drafts[i] = draft_block(model, logits[j, skip:size], hidden[j, skip:size], contexts[i], lengths[i],
                                    params[i], keys[i], self.width, self.constraints and self.constraints[i])
        return drafts

    def row_state(self, row: int, context: list[int]) -> tuple:
        """Row `row`'s context as `BlockDrafter.hold` gives it."""
        layers, positions = self.context.row(row)
        caches = self.drafter.model.make_cache()
        return (snapshot_of(caches, [list(layer) for layer in layers], len(positions)), list(self.pending[row]),
                self.starts[row])

    def set_width(self, width: int) -> None:
        self.width = width


def features(pairing: Pairing) -> list[int]:
    """The target's hidden states a block drafter reads (the outputs of its target layers, as `hidden_reader`
    indices), after checking that it was trained for this target."""
    path, target = pairing.draft_path, pairing.target
    block = block_config(pairing.draft_config, path)
    text = target.config.get("text_config", target.config)
    layers, hidden, vocab = text["num_hidden_layers"], text["hidden_size"], vocab_size(target.config)
    ids = block["target_layer_ids"]
    trained = (block["hidden_size"], block["target_layers"] or layers, block["vocab_size"])  # speculators': no count
    if trained != (hidden, layers, vocab) or max(ids) >= layers:
        counted = f"{block['target_layers']} target layers" if block["target_layers"] else f"layer ids up to {max(ids)}"
        raise SpecError(f"the {block['kind']} drafter {path} (hidden size {block['hidden_size']}, "
                        f"{counted}, vocabulary {block['vocab_size']}) was not trained "
                        f"for {target.path} (hidden size {hidden}, {layers} layers, vocabulary {vocab}): use the "
                        "drafter published for this target (see models.toml)")
    if not 0 <= block["mask"] < vocab:
        raise SpecError(f"the {block['kind']} drafter {path}: its mask token {block['mask']} is outside the "
                        f"vocabulary of {vocab}: re-download the drafter")
    return [i + 1 for i in ids]


def build(pairing: Pairing, runner) -> BlockDrafter:
    check_memory(pairing.draft_path, None, what="block drafter")
    return BlockDrafter(load_block_drafter(pairing.draft_path, pairing.draft_config), pairing.target.model)


def tree_problem(pairing: Pairing, drafter: BlockDrafter) -> str | None:
    if drafter.name in ("dspark", "dflash2"):
        return f"{pairing.draft_path.name} is a {drafter.name} drafter: each draft depends on the one before"
    return None


KINDS = [Kind("block", build, recognises=lambda pairing: bool(block_kind(pairing.draft_config)), reads=features,
              max_draft_len=lambda pairing: min(block_config(pairing.draft_config, pairing.draft_path)["drafts"],
                                                MAX_DRAFT_LEN),
              tree_problem=tree_problem)]
